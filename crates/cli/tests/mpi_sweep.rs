//! The GPT sweep's random configurations as one job across processes (built only with
//! `--features mpi`): the cases `crates/runtime/tests/config_sweep.rs` trains on threads,
//! drawn by the same generator (the `sweep` crate), each of 2 to [`MAX_RANKS`] devices run
//! under `tessera launch --nproc N` (one process per rank on the MPI backend) with a checkpoint
//! saved at the end. Every step's metrics line (loss, gradient norm, dropped expert choices,
//! learning rate), the validation loss and every element of every saved parameter
//! (`tessera ckpt diff`, across the two layouts) must be the one-device reference's bit for
//! bit. A configuration the job refuses must be refused on threads too, naming a config key; a
//! configuration that trains on threads and fails across processes, a hang or a different bit
//! fails the sweep.
//!
//! `TESSERA_MPI_SWEEP_CASES` (default [`DEFAULT_CASES`]) and `TESSERA_MPI_SWEEP_SEED`
//! (default [`DEFAULT_SEED`]) set the number of cases and the seed of a longer run;
//! `TESSERA_MPI_SWEEP_ONLY=3,17` runs only those case indices of the seed;
//! `TESSERA_MPI_SWEEP_MAX_RANKS` (default [`MAX_RANKS`]) admits larger cases. A failure prints
//! the seed, the case index and both configurations as TOML.

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use sweep::{draw_gpt_case, Config, GptCase, STEPS};

use crate::mpi_launch::{launch, launched};
use crate::util::{repo_root, s, tessera_command, wait_or_kill, Scratch};

/// The default seed (not the in-process sweep's: these cases are new ones).
const DEFAULT_SEED: u64 = 20_261_207;
/// The default number of cases run (about a minute on 2 cores).
const DEFAULT_CASES: usize = 6;
/// The most processes a case starts by default (the sweep's cases reach 16 devices; on a
/// 2-core machine more processes only slow it down); `TESSERA_MPI_SWEEP_MAX_RANKS` sets it.
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

/// The case indices to run: `TESSERA_MPI_SWEEP_ONLY`'s, else the first `cases` indices of
/// `seed` whose cases run on 2 to [`MAX_RANKS`] (or `TESSERA_MPI_SWEEP_MAX_RANKS`) processes.
fn case_indices(seed: u64, cases: usize, text: &Path) -> Vec<usize> {
    let max_ranks = env_number("TESSERA_MPI_SWEEP_MAX_RANKS", MAX_RANKS);
    if let Ok(only) = std::env::var("TESSERA_MPI_SWEEP_ONLY") {
        return only
            .split(',')
            .map(|i| {
                i.trim()
                    .parse()
                    .expect("TESSERA_MPI_SWEEP_ONLY: case indices")
            })
            .collect();
    }
    (0..)
        .filter(|&i| {
            let ranks = ranks(&draw_gpt_case(seed, i, text, Path::new("/unused")));
            (2..=max_ranks).contains(&ranks)
        })
        .take(cases)
        .collect()
}

/// The processes a case's parallel configuration runs as.
fn ranks(case: &GptCase) -> usize {
    case.parallel.usize("parallel.devices").unwrap_or(1)
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

/// Runs `case` in `dir`: the parallel configuration across processes, then (if refused) on
/// threads, else its one-device reference, and compares them.
fn run_case(case: &GptCase, dir: &Path) -> Verdict {
    let parallel = write_config(dir, "parallel", &saving(&case.parallel));
    let reference = write_config(dir, "reference", &saving(&case.reference));
    let (parallel_log, reference_log) = (dir.join("parallel.jsonl"), dir.join("reference.jsonl"));
    let nproc = ranks(case).to_string();
    let mut command = vec![crate::util::tessera_path().to_string()];
    command.extend(train_args(&parallel, &parallel_log));
    let logs = dir.join("logs");
    let job = launched(&mut launch(
        &["--nproc", &nproc, "--log-dir", s(&logs)],
        &command.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    if !job.status.success() {
        let threads = train_on_threads(&parallel, &dir.join("threads.jsonl"));
        let said = text(&threads);
        return if threads.status.success() {
            Verdict::Failed(format!(
                "trains on threads but fails across {nproc} processes:\n{}",
                text(&job)
            ))
        } else if ["parallel.", "model.", "train.", "data."]
            .iter()
            .any(|key| said.contains(key))
        {
            Verdict::Refused
        } else {
            Verdict::Failed(format!("refused without naming a config key: {said}"))
        };
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
    let out_dir = |c: &Config| c.0["output.dir"].trim_matches('"').to_string();
    let diff = tessera_command()
        .args(["ckpt", "diff"])
        .arg(out_dir(&case.reference))
        .arg(out_dir(&case.parallel))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&diff.stdout);
    if !diff.status.success() || !said.contains(" 0 different") {
        return Verdict::Failed(format!(
            "the saved parameters are not one device's:\n{said}{}",
            String::from_utf8_lossy(&diff.stderr)
        ));
    }
    Verdict::Same
}

/// The sweep: every drawn configuration that fits on [`MAX_RANKS`] processes gives one
/// device's bits as one job across processes, or is refused on threads too.
#[test]
fn mpi_random_configurations_across_processes_are_bitwise_one_device() {
    let seed = env_number("TESSERA_MPI_SWEEP_SEED", DEFAULT_SEED);
    let cases = env_number("TESSERA_MPI_SWEEP_CASES", DEFAULT_CASES);
    let text_path = repo_root().join("data/kjv/kjv.txt.gz");
    let scratch = Scratch::new("mpi-sweep");
    let (mut same, mut refused, mut failures) = (0, 0, Vec::new());
    for index in case_indices(seed, cases, &text_path) {
        let dir = scratch.0.join(format!("case-{index}"));
        std::fs::create_dir_all(&dir).unwrap();
        let case = draw_gpt_case(seed, index, &text_path, &dir);
        let label = format!("case {index} ({} on {} ranks)", case.family, ranks(&case));
        let verdict = run_case(&case, &dir);
        eprintln!(
            "mpi sweep: {label}: {}",
            match &verdict {
                Verdict::Same => "one device's bits",
                Verdict::Refused => "refused, naming a key",
                Verdict::Failed(_) => "FAILED",
            }
        );
        match verdict {
            Verdict::Same => same += 1,
            Verdict::Refused => refused += 1,
            Verdict::Failed(why) => failures.push(format!(
                "{label} of seed {seed}: {why}\n--- parallel config ---\n{}--- one-device \
                 reference ---\n{}",
                case.parallel.toml(),
                case.reference.toml()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        same > refused,
        "most cases must train: {same} trained, {refused} refused"
    );
}
