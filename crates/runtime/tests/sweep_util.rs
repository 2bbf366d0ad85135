//! What the seeded random sweeps (`config_sweep`, `resume_sweep`) share: their generator, a
//! configuration as dotted keys, a run's outcome as bits, opening and training a drawn
//! configuration, and a case run on its own thread under a deadline.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use runtime::{LaunchOptions, Session, TrainConfig};

/// The collective timeout of every run: a deadlock fails the case instead of hanging.
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a whole case may take before it counts as hung.
pub const CASE_DEADLINE: Duration = Duration::from_secs(300);
/// The prefixes of the config keys a refusal must name one of.
const KEY_PREFIXES: [&str; 4] = ["parallel.", "model.", "train.", "data."];

/// SplitMix64: a small, self-contained generator whose sequence is fixed by its seed.
pub struct Rng(u64);

impl Rng {
    /// The generator of case `index` under `seed`.
    pub fn for_case(seed: u64, index: u64) -> Rng {
        let mut rng = Rng(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03));
        rng.next();
        rng
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    /// A uniform element of `xs` (not empty).
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.range(0, xs.len() - 1)]
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// A configuration as dotted keys (`parallel.hsdp.threshold`) and their TOML values.
#[derive(Clone, Default)]
pub struct Config(pub BTreeMap<String, String>);

impl Config {
    /// Sets `key` to the TOML value `value`.
    pub fn set(&mut self, key: &str, value: impl ToString) {
        self.0.insert(key.to_string(), value.to_string());
    }

    /// Sets `key` to the string `value`.
    pub fn set_str(&mut self, key: &str, value: &str) {
        self.set(key, format!("\"{value}\""));
    }

    /// `key`'s value as a count, when set.
    pub fn usize(&self, key: &str) -> Option<usize> {
        self.0.get(key).map(|v| v.parse().expect("a count"))
    }

    /// This config with every key of `other` added (or replaced).
    pub fn with(&self, other: &Config) -> Config {
        let mut all = self.clone();
        all.0
            .extend(other.0.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }

    /// The TOML text: one table per key prefix.
    pub fn toml(&self) -> String {
        let mut tables: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
        for (key, value) in &self.0 {
            let (table, name) = key.rsplit_once('.').expect("a dotted key");
            tables.entry(table).or_default().push((name, value));
        }
        let mut text = String::new();
        for (table, keys) in tables {
            writeln!(text, "[{table}]").unwrap();
            for (name, value) in keys {
                writeln!(text, "{name} = {value}").unwrap();
            }
        }
        text
    }
}

/// The divisors of `n`.
pub fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|&d| n.is_multiple_of(d)).collect()
}

/// Draws an `[parallel.hsdp]` level with threshold 0 and a shard size (`-1`, or a divisor of
/// `devices` above 1) into `c`.
pub fn draw_hsdp(rng: &mut Rng, c: &mut Config, devices: usize) {
    let level = rng.pick(&["level1", "level2", "level3", "zero1", "zero2"]);
    let sizes: Vec<i64> = std::iter::once(-1)
        .chain(
            divisors(devices)
                .into_iter()
                .filter(|&d| d > 1)
                .map(|d| d as i64),
        )
        .collect();
    c.set_str("parallel.hsdp.optimizer_level", level);
    c.set("parallel.hsdp.threshold", 0);
    c.set("parallel.hsdp.shard_size", rng.pick(&sizes));
}

/// Draws recomputation, of the blocks or of the GeLUs (even odds), into `c`.
pub fn draw_recompute(rng: &mut Rng, c: &mut Config) {
    if rng.chance(0.5) {
        c.set("parallel.recompute.cells", "[\"blocks.*\"]");
    } else {
        c.set("parallel.recompute.ops", "[\"GeLU\"]");
    }
}

/// Draws a weight decay for an AdamW `optimizer`, a learning-rate schedule (`cosine` decaying
/// over `cosine_decay_steps` when given, else over the run) and, in most cases, a gradient
/// clipping norm (or a bound no step reaches, so the norm is logged) into `c`.
pub fn draw_schedule(
    rng: &mut Rng,
    c: &mut Config,
    optimizer: &str,
    cosine_decay_steps: Option<usize>,
) {
    if optimizer.ends_with("adamw") && rng.chance(0.5) {
        c.set("train.weight_decay", "0.1");
    }
    match rng.pick(&[
        "constant",
        "cosine",
        "warmup_lr",
        "polynomial_decay_lr",
        "exponential_decay_lr",
        "piecewise_constant_lr",
        "cosine_decay_lr",
    ]) {
        "constant" => {}
        "cosine" => {
            c.set_str("train.lr_schedule", "cosine");
            c.set("train.warmup_steps", 1);
            if let Some(steps) = cosine_decay_steps {
                c.set("train.decay_steps", steps);
            }
            c.set("train.min_lr", "0.0001");
        }
        "warmup_lr" => {
            c.set_str("train.lr_schedule", "warmup_lr");
            c.set("train.warmup_epoch", 3);
        }
        "polynomial_decay_lr" => {
            c.set_str("train.lr_schedule", "polynomial_decay_lr");
            c.set("train.decay_epoch", 3);
            c.set("train.min_lr", "0.0001");
        }
        "exponential_decay_lr" => {
            c.set_str("train.lr_schedule", "exponential_decay_lr");
            c.set("train.decay_epoch", 2);
            c.set("train.decay_rate", "0.5");
        }
        "piecewise_constant_lr" => {
            c.set_str("train.lr_schedule", "piecewise_constant_lr");
            c.set("train.milestone", "[2, 5]");
            c.set("train.learning_rates", "[0.01, 0.001]");
        }
        schedule => {
            c.set_str("train.lr_schedule", schedule);
            c.set("train.decay_epoch", 3);
            c.set("train.min_lr", "0.0001");
        }
    }
    // A gradient norm to compare in most cases: clipping, or a bound no step reaches.
    if rng.chance(0.75) {
        c.set("train.max_grad_norm", rng.pick(&["0.1", "1.0", "1e6"]));
    }
}

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
