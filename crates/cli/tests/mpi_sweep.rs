//! The random sweeps' configurations as jobs across processes (built only with `--features
//! mpi`), drawn by the generator the in-process sweeps use (the `sweep` crate); every job of 2
//! to [`MAX_RANKS`] ranks runs under `tessera launch --nproc N` (one process per rank on the
//! MPI backend):
//!
//! - the GPT sweep's cases (`crates/runtime/tests/config_sweep.rs`), each saving a checkpoint
//!   at the end;
//! - the resume sweep's (`resume_sweep.rs`): layout A's job saves, layout B's job (another
//!   layout and process count) resumes it, converted on load by every process.
//!
//! Every step's metrics line (loss, gradient norm, dropped expert choices, learning rate), the
//! validation loss and every element of every saved parameter (`tessera ckpt diff`, across the
//! two layouts) must be the one-device reference's bit for bit. A configuration the job
//! refuses must be refused on threads too, naming a config key; one that trains on threads and
//! fails across processes, a hang or a different bit fails the sweep.
//!
//! `TESSERA_MPI_SWEEP_CASES` (default [`DEFAULT_CASES`]), `TESSERA_MPI_SWEEP_SEED` (default
//! [`DEFAULT_SEED`]), `TESSERA_MPI_SWEEP_ONLY=3,17` (only those case indices) and
//! `TESSERA_MPI_SWEEP_MAX_RANKS` (default [`MAX_RANKS`]) set a longer run; the resume sweep
//! reads `TESSERA_MPI_RESUME_SWEEP_…`. A failure prints the seed, the case index and the
//! configurations as TOML.

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use sweep::{draw_gpt_case, draw_resume_case, Config, GptCase, ResumeCase, STEPS};

use crate::mpi_launch::{launch, launched};
use crate::util::{repo_root, s, tessera_command, wait_or_kill, Scratch};

/// The default seed (not the in-process sweep's: these cases are new ones).
const DEFAULT_SEED: u64 = 20_261_207;
/// The default number of cases run (about a minute on 2 cores).
const DEFAULT_CASES: usize = 6;
/// The most processes a job starts by default (the sweeps' cases reach 16 devices; on a
/// 2-core machine more processes only slow it down).
const MAX_RANKS: usize = 4;
/// Each run's collective timeout, in seconds: a deadlock ends the run instead of hanging.
const COLLECTIVE_TIMEOUT: &str = "60";

/// An environment variable's number, or `default`.
fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
        .unwrap_or(default)
}

/// The processes a configuration runs as.
fn ranks(config: &Config) -> usize {
    config.usize("parallel.devices").unwrap_or(1)
}

/// `config` with a checkpoint saved at the end of the run.
fn saving(config: &Config) -> Config {
    let mut c = config.clone();
    c.set("output.save_checkpoint", true);
    c
}

/// Writes `config` as `dir/<name>.toml` and returns its path.
fn write_config(dir: &Path, name: &str, config: &Config) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config.toml()).unwrap();
    path
}

/// `tessera train CONFIG --log-json LOG --timeout …` as arguments.
fn train_args(config: &Path, log: &Path) -> Vec<String> {
    [
        "train",
        s(config),
        "--log-json",
        s(log),
        "--timeout",
        COLLECTIVE_TIMEOUT,
    ]
    .map(String::from)
    .to_vec()
}

/// Runs `tessera train` on the local backend (threads), to its end.
fn train_on_threads(config: &Path, log: &Path) -> Output {
    let mut command = tessera_command();
    command
        .args(train_args(config, log))
        .current_dir(repo_root());
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting tessera train");
    wait_or_kill(child, std::time::Duration::from_secs(300)).expect("tessera train hung")
}

/// The metrics lines a run logged, as JSON objects without their timing (`ms`) and without
/// the memory report (per rank, and a layout's own).
fn metrics(log: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(log).map_err(|e| format!("{}: {e}", log.display()))?;
    Ok(text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("one JSON object per line"))
        .filter(|v| v.get("memory").is_none())
        .map(|mut v| {
            v.as_object_mut().map(|o| o.remove("ms"));
            v
        })
        .collect())
}

/// How a case ended.
enum Verdict {
    /// Trained, and bitwise the reference.
    Same,
    /// Refused across processes and on threads, naming a key.
    Refused,
    /// Anything else, and why.
    Failed(String),
}

/// Both outputs' text.
fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `config` as one job of `nproc` processes under `tessera launch`, logging to `log`.
fn train_across(config: &Path, log: &Path, nproc: usize) -> Output {
    let mut command = vec![crate::util::tessera_path().to_string()];
    command.extend(train_args(config, log));
    let logs = log.with_extension("logs");
    launched(&mut launch(
        &["--nproc", &nproc.to_string(), "--log-dir", s(&logs)],
        &command.iter().map(String::as_str).collect::<Vec<_>>(),
    ))
}

/// The verdict on a job that failed across processes: `config` (written to `path`) run on
/// threads must be refused too, naming a config key.
fn refused_on_threads(job: &Output, path: &Path, config: &Config, nproc: usize) -> Verdict {
    let mut alone = config.clone();
    let dir = path.with_extension("threads");
    alone.set_str("output.dir", s(&dir));
    let path = write_config(path.parent().unwrap(), "threads", &alone);
    let threads = train_on_threads(&path, &dir.with_extension("jsonl"));
    let said = text(&threads);
    if threads.status.success() {
        Verdict::Failed(format!(
            "trains on threads but fails across {nproc} processes:\n{}",
            text(job)
        ))
    } else if ["parallel.", "model.", "train.", "data."]
        .iter()
        .any(|key| said.contains(key))
    {
        Verdict::Refused
    } else {
        Verdict::Failed(format!("refused without naming a config key: {said}"))
    }
}

/// Whether the checkpoints in `a` and `b` hold the same bits (`tessera ckpt diff`).
fn same_checkpoints(a: &str, b: &str) -> Result<(), String> {
    let diff = tessera_command()
        .args(["ckpt", "diff", a, b])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&diff.stdout);
    match diff.status.success() && said.contains(" 0 different") {
        true => Ok(()),
        false => Err(format!(
            "the saved parameters are not one device's:\n{said}{}",
            String::from_utf8_lossy(&diff.stderr)
        )),
    }
}

/// `config`'s `output.dir`.
fn out_dir(config: &Config) -> String {
    config.0["output.dir"].trim_matches('"').to_string()
}

/// Runs `case` in `dir`: the parallel configuration across processes, then (if refused) on
/// threads, else its one-device reference, and compares them.
fn run_case(case: &GptCase, dir: &Path) -> Verdict {
    let parallel = write_config(dir, "parallel", &saving(&case.parallel));
    let reference = write_config(dir, "reference", &saving(&case.reference));
    let (parallel_log, reference_log) = (dir.join("parallel.jsonl"), dir.join("reference.jsonl"));
    let job = train_across(&parallel, &parallel_log, ranks(&case.parallel));
    if !job.status.success() {
        return refused_on_threads(&job, &parallel, &case.parallel, ranks(&case.parallel));
    }
    let one = train_on_threads(&reference, &reference_log);
    if !one.status.success() {
        return Verdict::Failed(format!(
            "trains across processes but its one-device reference fails:\n{}",
            text(&one)
        ));
    }
    match (metrics(&parallel_log), metrics(&reference_log)) {
        (Ok(got), _) if got.iter().filter(|v| v.get("step").is_some()).count() != STEPS => {
            return Verdict::Failed(format!("not {STEPS} steps logged: {got:?}"))
        }
        (Ok(got), Ok(want)) if got != want => {
            return Verdict::Failed(format!(
                "not one device's bits:\n  processes: {got:?}\n  reference: {want:?}"
            ))
        }
        (Ok(_), Ok(_)) => {}
        (Err(e), _) | (_, Err(e)) => return Verdict::Failed(e),
    }
    match same_checkpoints(&out_dir(&case.reference), &out_dir(&case.parallel)) {
        Ok(()) => Verdict::Same,
        Err(e) => Verdict::Failed(e),
    }
}

/// The step lines of a metrics log in order, and its last validation line.
fn steps_and_eval(lines: Vec<Value>) -> (Vec<Value>, Option<Value>) {
    let eval = lines
        .iter()
        .rfind(|v| v.get("eval_loss").is_some())
        .cloned();
    let steps = lines.into_iter().filter(|v| v.get("step").is_some());
    (steps.collect(), eval)
}

/// Runs resume `case` in `dir`: layout A across processes, B resuming A's checkpoint across
/// processes, and the one-device reference on threads for both runs' steps.
fn run_resume_case(case: &ResumeCase, dir: &Path) -> Verdict {
    let (a, b) = (
        write_config(dir, "a", &case.a),
        write_config(dir, "b", &case.b),
    );
    let reference = write_config(dir, "reference", &case.reference);
    let logs = ["a", "b", "reference"].map(|name| dir.join(format!("{name}.jsonl")));
    let job = train_across(&a, &logs[0], ranks(&case.a));
    if !job.status.success() {
        return refused_on_threads(&job, &a, &case.a, ranks(&case.a));
    }
    let job = train_across(&b, &logs[1], ranks(&case.b));
    if !job.status.success() {
        // B's layout on its own, or the resume itself, is what failed.
        let mut alone = case.b.clone();
        alone.0.remove("output.resume_from");
        return match refused_on_threads(&job, &b, &alone, ranks(&case.b)) {
            Verdict::Refused => Verdict::Refused,
            _ => Verdict::Failed(format!(
                "B trains on threads alone but resuming A fails across {} processes:\n{}",
                ranks(&case.b),
                text(&job)
            )),
        };
    }
    let one = train_on_threads(&reference, &logs[2]);
    if !one.status.success() {
        return Verdict::Failed(format!(
            "both layouts train but the one-device reference fails:\n{}",
            text(&one)
        ));
    }
    let [a_lines, b_lines, want] = match logs.each_ref().map(|l| metrics(l)) {
        [Ok(a), Ok(b), Ok(r)] => [a, b, r].map(steps_and_eval),
        [Err(e), _, _] | [_, Err(e), _] | [_, _, Err(e)] => return Verdict::Failed(e),
    };
    // A's steps are the reference's first ones; B's continue from the step it resumed.
    let total = case.steps.0 + case.steps.1;
    if want.0.len() != total {
        return Verdict::Failed(format!(
            "the reference logged {} steps, not {total}",
            want.0.len()
        ));
    }
    for (run, got, from) in [("A", &a_lines.0, 0), ("B", &b_lines.0, case.steps.0)] {
        let expected = &want.0[from..from + got.len().min(total - from)];
        let steps = if run == "A" {
            case.a_steps
        } else {
            case.steps.1
        };
        if got.len() != steps || got.as_slice() != expected {
            return Verdict::Failed(format!(
                "{run}'s {steps} steps are not one device's bits:\n  {run}: {got:?}\n  \
                 reference: {expected:?}"
            ));
        }
    }
    if b_lines.1 != want.1 {
        return Verdict::Failed(format!(
            "B's validation {:?} is not the reference's {:?}",
            b_lines.1, want.1
        ));
    }
    match same_checkpoints(&out_dir(&case.reference), &out_dir(&case.b)) {
        Ok(()) => Verdict::Same,
        Err(e) => Verdict::Failed(e),
    }
}

/// A drawn case as the sweep driver sees it.
trait Case: Sized {
    /// Draws case `index` of `seed` training on `text`, its outputs in `out`.
    fn draw(seed: u64, index: usize, text: &Path, out: &Path) -> Self;
    /// The most processes any of its jobs starts.
    fn ranks(&self) -> usize;
    /// Its family and device counts, for the log.
    fn label(&self) -> String;
    /// Its configurations as TOML, for a failure's report.
    fn configs(&self) -> String;
    /// Runs it in `dir`.
    fn run(&self, dir: &Path) -> Verdict;
}

impl Case for GptCase {
    fn draw(seed: u64, index: usize, text: &Path, out: &Path) -> Self {
        draw_gpt_case(seed, index, text, out)
    }
    fn ranks(&self) -> usize {
        ranks(&self.parallel)
    }
    fn label(&self) -> String {
        format!("{} on {} ranks", self.family, self.ranks())
    }
    fn configs(&self) -> String {
        format!(
            "--- parallel config ---\n{}--- one-device reference ---\n{}",
            self.parallel.toml(),
            self.reference.toml()
        )
    }
    fn run(&self, dir: &Path) -> Verdict {
        run_case(self, dir)
    }
}

impl Case for ResumeCase {
    fn draw(seed: u64, index: usize, text: &Path, out: &Path) -> Self {
        draw_resume_case(seed, index, text, out)
    }
    fn ranks(&self) -> usize {
        ranks(&self.a).max(ranks(&self.b))
    }
    fn label(&self) -> String {
        self.family.clone()
    }
    fn configs(&self) -> String {
        format!(
            "--- layout A ({} steps, B resumes step {}) ---\n{}--- layout B (resumed from A) \
             ---\n{}--- one-device reference ---\n{}",
            self.a_steps,
            self.steps.0,
            self.a.toml(),
            self.b.toml(),
            self.reference.toml()
        )
    }
    fn run(&self, dir: &Path) -> Verdict {
        run_resume_case(self, dir)
    }
}

/// Runs the sweep `name` of cases `C`: `TESSERA_<VARS>_CASES`, `_SEED`, `_ONLY` and
/// `_MAX_RANKS` as the module's header says; every case must train to one device's bits or be
/// refused on threads too, and most must train.
fn run_sweep<C: Case>(name: &str, vars: &str, default_seed: u64) {
    let var = |suffix: &str| format!("TESSERA_{vars}_{suffix}");
    let seed = env_number(&var("SEED"), default_seed);
    let cases = env_number(&var("CASES"), DEFAULT_CASES);
    let max_ranks = env_number(&var("MAX_RANKS"), MAX_RANKS);
    let text_path = repo_root().join("data/kjv/kjv.txt.gz");
    let indices: Vec<usize> = match std::env::var(var("ONLY")) {
        Ok(only) => only
            .split(',')
            .map(|i| i.trim().parse().expect("case indices"))
            .collect(),
        Err(_) => (0..)
            .filter(|&i| {
                let ranks = C::draw(seed, i, &text_path, Path::new("/unused")).ranks();
                (2..=max_ranks).contains(&ranks)
            })
            .take(cases)
            .collect(),
    };
    let scratch = Scratch::new(&name.replace(' ', "-"));
    let (mut same, mut refused, mut failures) = (0, 0, Vec::new());
    for index in indices {
        let dir = scratch.0.join(format!("case-{index}"));
        std::fs::create_dir_all(&dir).unwrap();
        let case = C::draw(seed, index, &text_path, &dir);
        let label = format!("case {index} ({})", case.label());
        let verdict = case.run(&dir);
        let said = match &verdict {
            Verdict::Same => "one device's bits",
            Verdict::Refused => "refused, naming a key",
            Verdict::Failed(_) => "FAILED",
        };
        eprintln!("{name}: {label}: {said}");
        match verdict {
            Verdict::Same => same += 1,
            Verdict::Refused => refused += 1,
            Verdict::Failed(why) => {
                failures.push(format!("{label} of seed {seed}: {why}\n{}", case.configs()))
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        same > refused,
        "most cases must train: {same} trained, {refused} refused"
    );
}

/// The sweep: every drawn configuration of 2 to [`MAX_RANKS`] devices gives one device's bits
/// as one job across processes, or is refused on threads too.
#[test]
fn mpi_random_configurations_across_processes_are_bitwise_one_device() {
    run_sweep::<GptCase>("mpi sweep", "MPI_SWEEP", DEFAULT_SEED);
}

/// The resume sweep across processes: A's job saves, B's job (another layout, another process
/// count) resumes it, and both give the steps of one device trained without a stop.
#[test]
fn mpi_resuming_on_another_random_layout_across_processes_is_bitwise_one_device() {
    run_sweep::<ResumeCase>("mpi resume sweep", "MPI_RESUME_SWEEP", DEFAULT_SEED + 1);
}
