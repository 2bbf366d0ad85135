//! What the seeded random sweeps (`config_sweep`, `resume_sweep`) share: their generator and
//! configurations as dotted keys (from the `sweep` crate), a run's outcome as bits, opening and training a drawn
//! configuration, and a case run on its own thread under a deadline.

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use runtime::{LaunchOptions, Session, TrainConfig};
use sweep::Config;

/// The collective timeout of every run: a deadlock fails the case instead of hanging.
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a whole case may take before it counts as hung.
pub const CASE_DEADLINE: Duration = Duration::from_secs(300);
/// The prefixes of the config keys a refusal must name one of.
const KEY_PREFIXES: [&str; 4] = ["parallel.", "model.", "train.", "data."];

/// What a run gave, as bits: rank 0's loss, gradient norm and dropped expert choices of every
/// step, its validation losses and its global step.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub losses: Vec<u32>,
    pub grad_norms: Vec<Option<u64>>,
    pub moe_dropped: Vec<u64>,
    pub eval_losses: Vec<u64>,
    pub global_step: u64,
}

impl Outcome {
    /// The values, as numbers.
    pub fn describe(&self) -> String {
        let f64s = |xs: &[u64]| xs.iter().map(|x| f64::from_bits(*x)).collect::<Vec<_>>();
        format!(
            "losses {:?}, grad norms {:?}, dropped expert choices {:?}, validation losses {:?}, \
             global step {}",
            self.losses
                .iter()
                .map(|x| f32::from_bits(*x))
                .collect::<Vec<_>>(),
            self.grad_norms
                .iter()
                .map(|x| x.map(f64::from_bits))
                .collect::<Vec<_>>(),
            f64s(&self.moe_dropped),
            f64s(&self.eval_losses),
            self.global_step,
        )
    }
}

/// A run that did not train.
pub enum Stop {
    /// Refused: parsing, the session, or an error of the launch naming a key.
    Refused(String),
    /// Failed: a timeout, a panic, an error naming no key, ranks that disagree.
    Failed(String),
}

/// Parses and opens `config` (a refusal if either fails).
pub fn open(config: &Config) -> Result<Session, Stop> {
    let text = config.toml();
    let parsed = TrainConfig::parse(&text, None, &[], Path::new("/"))
        .map_err(|e| Stop::Refused(format!("{e:#}")))?;
    Session::new(&parsed).map_err(|e| Stop::Refused(format!("{e:#}")))
}

/// Trains `session` on the local backend with a short collective timeout, expecting `steps`
/// steps on every rank, all logging rank 0's losses.
pub fn train(session: &Session, steps: usize) -> Result<Outcome, Stop> {
    let options = LaunchOptions {
        print_loss: false,
        timeout: COLLECTIVE_TIMEOUT,
        ..LaunchOptions::default()
    };
    let report = runtime::train_local(session, &options).map_err(|e| {
        let text = format!("{e:#}");
        // The launch's checks (before any rank starts) name a key; a timeout, a panic or an
        // error naming no key is a failure.
        if text.contains("timed out") || text.contains("panick") || !names_a_key(&text) {
            Stop::Failed(text)
        } else {
            Stop::Refused(text)
        }
    })?;
    let first = &report.ranks[0];
    for (rank, r) in report.ranks.iter().enumerate() {
        if r.losses
            .iter()
            .map(|x| x.to_bits())
            .ne(first.losses.iter().map(|x| x.to_bits()))
        {
            return Err(Stop::Failed(format!(
                "rank {rank} logged losses {:?}, rank 0 {:?}",
                r.losses, first.losses
            )));
        }
    }
    if first.losses.len() != steps {
        return Err(Stop::Failed(format!(
            "{} steps run, not {steps}",
            first.losses.len()
        )));
    }
    Ok(Outcome {
        losses: first.losses.iter().map(|x| x.to_bits()).collect(),
        grad_norms: first
            .grad_norms
            .iter()
            .map(|n| n.map(f64::to_bits))
            .collect(),
        moe_dropped: first.moe_dropped.iter().map(|x| x.to_bits()).collect(),
        eval_losses: first.eval_losses.iter().map(|x| x.to_bits()).collect(),
        global_step: first.global_step,
    })
}

/// Whether `error` names a `parallel.`, `model.`, `train.` or `data.` key.
pub fn names_a_key(error: &str) -> bool {
    KEY_PREFIXES.iter().any(|p| error.contains(p))
}

/// How a case ended.
pub enum Verdict {
    /// Trained, and bitwise the reference.
    Same,
    /// Refused, naming a key: the error.
    Refused(String),
    /// Anything else: what went wrong.
    Failed(String),
}

/// A drawn case of a sweep.
pub trait SweepCase: Send + Sync + 'static {
    /// One line naming the case's family (and size) for the log.
    fn label(&self) -> String;
    /// Every configuration of the case as TOML, each under a heading, for a failure's report.
    fn configs(&self) -> String;
    /// Runs the case.
    fn run(&self) -> Verdict;
}

/// Runs a sweep: `TESSERA_<env>_CASES` cases (default `default_cases`) of seed
/// `TESSERA_<env>_SEED` (default `default_seed`), or the indices `TESSERA_<env>_ONLY` lists,
/// each drawn by `draw(seed, index, its output directory)` and run on its own thread under
/// [`CASE_DEADLINE`]. Fails listing every failed case (its seed, index and configurations),
/// and when fewer than a third of the cases trained (a sweep of refusals tests nothing).
pub fn run_sweep<C: SweepCase>(
    name: &str,
    env: &str,
    (default_seed, default_cases): (u64, usize),
    draw: fn(u64, usize, &Path) -> C,
) {
    let (seed_var, cases_var, only_var) = (
        format!("TESSERA_{env}_SEED"),
        format!("TESSERA_{env}_CASES"),
        format!("TESSERA_{env}_ONLY"),
    );
    let seed = env_number(&seed_var, default_seed);
    let cases = env_number(&cases_var, default_cases);
    let only: Option<Vec<usize>> = std::env::var(&only_var).ok().map(|v| {
        v.split(',')
            .map(|i| {
                i.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{only_var}={v:?}: case indices"))
            })
            .collect()
    });
    let indices: Vec<usize> = only.unwrap_or_else(|| (0..cases).collect());
    eprintln!(
        "{name}: seed {seed} ({seed_var}), {} cases ({cases_var})",
        indices.len()
    );
    let tmp = tempfile::tempdir().unwrap();
    let (mut same, mut refused, mut failures) = (0, 0, Vec::new());
    for &i in &indices {
        let out = tmp.path().join(i.to_string());
        let case = Arc::new(draw(seed, i, &out));
        let start = Instant::now();
        let verdict = run_guarded(case.clone(), &format!("{name} case"));
        let took = start.elapsed().as_secs_f64();
        let line = format!("[{i}] {}, {took:.1} s", case.label());
        match verdict {
            Verdict::Same => {
                same += 1;
                eprintln!("{line}: bitwise one device");
            }
            Verdict::Refused(e) => {
                refused += 1;
                let first = e.lines().next().unwrap_or_default();
                eprintln!("{line}: refused: {first}");
            }
            Verdict::Failed(e) => {
                eprintln!("{line}: FAILED: {e}");
                failures.push(format!(
                    "case {i} of seed {seed} ({seed_var}={seed} {only_var}={i}): {e}\n{}",
                    case.configs()
                ));
            }
        }
        // Each case's runs and merges stay small, but not a hundred of them.
        let _ = std::fs::remove_dir_all(&out);
    }
    eprintln!(
        "{name}: seed {seed}: {same} bitwise one device, {refused} refused naming a key, {} failed",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n\n{}",
        failures.len(),
        indices.len(),
        failures.join("\n\n")
    );
    // A sweep whose every case is refused would test nothing.
    assert!(
        indices.len() < 6 || same * 3 >= indices.len(),
        "only {same} of {} cases trained (seed {seed})",
        indices.len()
    );
}

/// Runs `case` on a thread named `name`: a panic or a case over [`CASE_DEADLINE`] is a
/// failure (a hung thread is left behind; the test fails).
fn run_guarded<C: SweepCase>(case: Arc<C>, name: &str) -> Verdict {
    let (send, receive) = mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .stack_size(16 << 20)
        .spawn(move || {
            let verdict = case.run();
            let _ = send.send(verdict);
        })
        .expect("a case thread");
    match receive.recv_timeout(CASE_DEADLINE) {
        Ok(verdict) => verdict,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            Verdict::Failed(format!("hung: no result after {CASE_DEADLINE:?}"))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Verdict::Failed("panicked (the message is above)".to_string())
        }
    }
}

/// The number in the environment variable `name`, or `default` when it is not set.
fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}
