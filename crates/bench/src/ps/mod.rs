//! `tessera bench ps`: parameter-server training of the seed MLP (digits, hidden 128, global
//! batch 32), or a small GPT, in steps/s — sync and async, 1, 2 and 4 workers, 1 and 2 servers — next to
//! data-parallel all-reduce training on the local backend in the same run, and the time a
//! sync job takes to go on after a worker is killed. With [`PsRequest::recovery_trials`] it
//! measures instead, over that many fresh jobs each, the time to recover from a killed worker
//! (kill → the survivors' next completed step) and from a killed server (kill → the restarted
//! server serving again → the next completed step), with the median and the spread.
//!
//! The roles run as threads of this process over real gRPC on 127.0.0.1 (the recovery runs
//! start real processes of the `tessera` binary); everything shares this machine's cores.

use std::fmt;
use std::path::{Path, PathBuf};

use runtime::{LaunchOptions, Session, TrainConfig};

use crate::error::toml_path;
use crate::{BenchError, Pieces, Progress};

mod recovery;

pub use recovery::{RecoveryLine, Spread};

/// The model of the steps/s table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsModel {
    /// The seed MLP on the digits.
    SeedMlp,
    /// A small GPT on the text.
    Gpt,
}

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsRequest {
    /// Steps per run.
    pub steps: u64,
    /// The digits directory.
    pub data: PathBuf,
    /// `ps.dead_after_ms` of the recovery runs.
    pub dead_after_ms: u64,
    /// `Some(trials)`: only measure recovery, a killed worker and a killed, restarted server,
    /// in `trials` fresh jobs each.
    pub recovery_trials: Option<usize>,
    /// The model of every run.
    pub model: PsModel,
    /// The text the GPT trains on.
    pub text: PathBuf,
    /// The `tessera` binary the recovery runs start as the job's processes.
    pub tessera: PathBuf,
}

/// The small GPT of [`PsModel::Gpt`].
const GPT_DESCRIPTION: &str =
    "GPT (KJV bytes, 2 blocks, 4 heads, width 64, 32 tokens, global batch 16, momentum)";

/// The `[model]` and `[data]` sections of the request's model.
fn model_sections(request: &PsRequest) -> Result<String, BenchError> {
    Ok(match request.model {
        PsModel::Gpt => format!(
            "[model]\nname = \"gpt\"\nlayers = 2\nheads = 4\nhidden = 64\nseq_len = 32\nffn_hidden = 256\n\
             [data]\nformat = \"text\"\npath = {}\nbatch_size = 16\nsteps_per_epoch = 100000\n",
            toml_path("--text", &request.text)?
        ),
        PsModel::SeedMlp => format!(
            "[model]\nname = \"seed_mlp\"\nhidden = 128\nclasses = 10\n\
             [data]\nformat = \"idx\"\ndir = {}\nbatch_size = 32\nshuffle = true\n",
            toml_path("--data", &request.data)?
        ),
    })
}

/// The config of the request's model: `[parallel]` body `parallel`, `[ps]` body `ps` (empty:
/// no section).
fn config_text(
    request: &PsRequest,
    out: &Path,
    parallel: &str,
    ps: &str,
    steps: u64,
    print: u64,
) -> Result<String, BenchError> {
    let ps = match ps.is_empty() {
        true => String::new(),
        false => format!("[ps]\n{ps}\n"),
    };
    Ok(format!(
        "{}[parallel]\n{parallel}\n{ps}\
         [train]\nepochs = 100\nmax_steps = {steps}\noptimizer = \"momentum\"\nlearning_rate = 0.02\n\
         momentum = 0.9\nseed = 3\neval = false\nper_print_times = {print}\n\
         [output]\ndir = {}\n",
        model_sections(request)?,
        toml_path("output.dir", out)?
    ))
}

fn parse(text: &str) -> Result<TrainConfig, BenchError> {
    Ok(TrainConfig::parse(text, None, &[], Path::new("."))?)
}

/// Steps/s of data-parallel training on `devices` ranks.
fn data_parallel(request: &PsRequest, dir: &Path, devices: usize) -> Result<f64, BenchError> {
    let parallel = format!("mode = \"data_parallel\"\ndevices = {devices}");
    let config = parse(&config_text(
        request,
        &dir.join("dp"),
        &parallel,
        "",
        request.steps,
        0,
    )?)?;
    let session = Session::new(&config)?;
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    let report = runtime::train_local(&session, &options)?;
    let ms: f64 = report.step_ms().iter().sum();
    Ok(report.step_ms().len() as f64 / (ms / 1e3).max(1e-9))
}

/// Steps/s of a parameter-server job (worker 0's step loop).
fn parameter_server(
    request: &PsRequest,
    dir: &Path,
    sync: bool,
    servers: usize,
    workers: usize,
) -> Result<f64, BenchError> {
    let ps = format!("servers = {servers}\nworkers = {workers}\nsync = {sync}\nstaleness = 2");
    let text = config_text(
        request,
        &dir.join("ps"),
        "mode = \"parameter_server\"",
        &ps,
        request.steps,
        0,
    )?;
    let config = parse(&text)?;
    let report = run_threads(&config, servers, workers)?;
    Ok(report.steps_run as f64 / report.step_seconds.max(1e-9))
}

/// Runs a parameter-server job of `config` with every role a thread of this process (real
/// gRPC over loopback); worker 0's report.
pub(crate) fn run_threads(
    config: &TrainConfig,
    servers: usize,
    workers: usize,
) -> Result<ps::WorkerReport, BenchError> {
    let addr = format!("127.0.0.1:{}", ps::launch::free_local_port()?);
    let secret = ps::auth::JobSecret::generate()?;
    let handles: Vec<_> = (0..1 + servers + workers)
        .map(|rank| {
            let config = config.clone();
            let vars = ps::launch::role_env(rank, servers, workers, &addr, &secret);
            std::thread::spawn(move || -> Result<Option<ps::WorkerReport>, BenchError> {
                let env = ps::RoleEnv::from_lookup(|n| {
                    vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
                })?
                .ok_or(BenchError::NoRole)?;
                Ok(ps::run_role(&config, &env, None)?)
            })
        })
        .collect();
    let mut report = None;
    for h in handles {
        let r = h.join().map_err(|_| BenchError::RoleThreadPanicked)??;
        if let Some(r) = r.filter(|r| r.worker_id == 0) {
            report = Some(r);
        }
    }
    report.ok_or(BenchError::NoWorkerReport)
}

/// A piece of the steps/s report, in the order it is measured.
#[derive(Debug, Clone, PartialEq)]
pub enum PsLine {
    /// What is measured, and the columns.
    Header {
        /// The model's description.
        model: &'static str,
        /// Steps per run.
        steps: u64,
    },
    /// One run's steps/s.
    Rate {
        /// The run (`PS sync, 2 w × 1 s`).
        run: String,
        /// Steps per second.
        steps_per_s: f64,
    },
    /// The sync job with a killed worker.
    KilledWorker {
        /// `ps.dead_after_ms`.
        dead_after_ms: u64,
        /// Seconds from the kill until the scheduler declared the worker dead.
        dead: f64,
        /// Seconds from the kill until worker 0 finished its next step.
        resumed: f64,
    },
}

impl fmt::Display for PsLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PsLine::Header { model, steps } => {
                writeln!(
                    f,
                    "{model}, {steps} steps per run; steps/s of worker 0's loop (PS) or the mean step (DP)"
                )?;
                writeln!(f, "{:<28} {:>9}", "run", "steps/s")
            }
            PsLine::Rate { run, steps_per_s } => writeln!(f, "{run:<28} {steps_per_s:>9.1}"),
            PsLine::KilledWorker {
                dead_after_ms,
                dead,
                resumed,
            } => writeln!(
                f,
                "killed worker (sync, 3 workers, dead_after_ms = {dead_after_ms}): declared dead after {dead:.2} s; worker 0 finished its next step {resumed:.2} s after the kill"
            ),
        }
    }
}

/// What `tessera bench ps` measured.
#[derive(Debug, Clone, PartialEq)]
pub enum PsReport {
    /// Steps/s of every run and the killed worker's job.
    Rates(Pieces<PsLine>),
    /// Recovery times.
    Recovery(Pieces<RecoveryLine>),
}

impl fmt::Display for PsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PsReport::Rates(lines) => lines.fmt(f),
            PsReport::Recovery(lines) => lines.fmt(f),
        }
    }
}

/// Runs `tessera bench ps` in a fresh directory under the system temp dir, removed at the end.
pub fn ps(request: &PsRequest, progress: &mut dyn Progress) -> Result<PsReport, BenchError> {
    let dir = std::env::temp_dir().join(format!("tessera-bench-ps-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    if let Some(trials) = request.recovery_trials {
        let outcome = recovery::run_recovery(request, trials, &dir, progress);
        let _ = std::fs::remove_dir_all(&dir);
        return outcome.map(PsReport::Recovery);
    }
    let outcome = rates(request, &dir, progress);
    let _ = std::fs::remove_dir_all(&dir);
    outcome.map(PsReport::Rates)
}

/// The steps/s table and the killed worker's recovery, run in `dir`.
fn rates(
    request: &PsRequest,
    dir: &Path,
    progress: &mut dyn Progress,
) -> Result<Pieces<PsLine>, BenchError> {
    let mut lines = Pieces::default();
    let mut push = |line: PsLine| lines.show(progress, line);
    push(PsLine::Header {
        model: match request.model {
            PsModel::Gpt => GPT_DESCRIPTION,
            PsModel::SeedMlp => "seed MLP (digits, hidden 128, global batch 32, momentum)",
        },
        steps: request.steps,
    })?;
    for devices in [1, 2, 4] {
        let steps_per_s = data_parallel(request, dir, devices)?;
        push(PsLine::Rate {
            run: format!("all-reduce DP, {devices} rank(s)"),
            steps_per_s,
        })?;
    }
    for sync in [true, false] {
        for servers in [1, 2] {
            for workers in [1, 2, 4] {
                let steps_per_s = parameter_server(request, dir, sync, servers, workers)?;
                let mode = if sync { "sync" } else { "async" };
                push(PsLine::Rate {
                    run: format!("PS {mode}, {workers} w × {servers} s"),
                    steps_per_s,
                })?;
            }
        }
    }
    let (dead, resumed) = recovery::worker_recovery(request, dir)?;
    push(PsLine::KilledWorker {
        dead_after_ms: request.dead_after_ms,
        dead,
        resumed,
    })?;
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paths holding a quote or a backslash reach the config the benchmark writes as the same
    /// paths (they were pasted between quotes, which broke the TOML or changed the path), and
    /// a path that is not UTF-8 is refused naming its flag.
    #[test]
    fn paths_reach_the_written_config_unchanged() {
        let request = |data: PathBuf| PsRequest {
            steps: 1,
            data,
            dead_after_ms: 1000,
            recovery_trials: None,
            model: PsModel::SeedMlp,
            text: PathBuf::from("unused"),
            tessera: PathBuf::from("tessera"),
        };
        let data = PathBuf::from(r#"/tmp/digits "quoted" \back\slash"#);
        let out = PathBuf::from(r#"/tmp/out\"x"#);
        let text = config_text(
            &request(data.clone()),
            &out,
            "mode = \"data_parallel\"",
            "",
            1,
            0,
        )
        .unwrap();
        let config = parse(&text).unwrap();
        assert_eq!(config.data().dir, data);
        assert_eq!(config.output().dir, out);
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            let odd = PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/\xff"));
            let refused = config_text(&request(odd), &out, "", "", 1, 0).unwrap_err();
            assert!(matches!(
                refused,
                BenchError::NonUtf8Path { what: "--data", .. }
            ));
            assert!(refused.to_string().starts_with("--data "), "{refused}");
        }
    }
}
