//! The one error type of the benchmark harnesses.

use std::path::PathBuf;

/// What can stop a benchmark: an error of the crate it measures, or of the harness itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A layout that cannot be built or bound.
    #[error(transparent)]
    Layout(#[from] layout::LayoutError),
    /// A tensor operation that failed.
    #[error(transparent)]
    Tensor(#[from] tensor::TensorError),
    /// A collective that failed, or a rank thread that panicked.
    #[error(transparent)]
    Comm(#[from] comm::CommError),
    /// A reshard that cannot be planned.
    #[error(transparent)]
    Reshard(#[from] reshard::ReshardError),
    /// A reshard plan that failed to run.
    #[error(transparent)]
    ReshardExec(#[from] reshard_exec::ExecError),
    /// A graph that cannot be built.
    #[error(transparent)]
    Graph(#[from] graph::GraphError),
    /// A checkpoint operation that failed.
    #[error(transparent)]
    Ckpt(#[from] ckpt::CkptError),
    /// A program that cannot be compiled.
    #[error(transparent)]
    Parallel(#[from] parallel::ParallelError),
    /// A built-in model that cannot be built.
    #[error(transparent)]
    Models(#[from] models::ModelsError),
    /// A program that failed to run on a rank, or an optimizer that cannot be built.
    #[error(transparent)]
    Exec(#[from] exec::ExecError),
    /// A training run or config that failed.
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    /// A parameter-server job that failed.
    #[error(transparent)]
    Ps(#[from] ps::PsError),
    /// A process-contract variable that breaks its rule.
    #[error(transparent)]
    Env(#[from] runtime::launch_env::EnvError),
    /// A file, directory or child process that failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A file or directory operation that failed, with what was being done.
    #[error("{what}")]
    IoAt {
        /// What was being done (`creating /tmp/x`).
        what: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// A layout of the benchmark that does not fit the requested shape.
    #[error("invalid layout for this shape")]
    LayoutForShape(#[source] layout::LayoutError),
    /// `ckpt-convert --dir` names something that exists: the benchmark removes its directory,
    /// so it only works in one it creates.
    #[error(
        "--dir {}: exists; the benchmark only works in a directory it creates (and removes), so give a path that does not exist",
        .0.display()
    )]
    DirExists(PathBuf),
    /// A path a benchmark writes into the config it runs that is not UTF-8 (a TOML string
    /// holds UTF-8 only): the flag or setting, and the path.
    #[error("{what} {}: not UTF-8, which a config file cannot hold", .path.display())]
    NonUtf8Path {
        /// The flag or setting (`--data`, `output.dir`).
        what: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// No unused directory name was found under the temp dir.
    #[error("no fresh directory name under {}", .0.display())]
    NoFreshDir(PathBuf),
    /// A baseline command (`sync`, `cp -r`) that exited with a failure.
    #[error("{0} failed")]
    ToolFailed(&'static str),
    /// The separately measured `tessera ckpt convert` failed; its stderr.
    #[error("the measured conversion failed: {0}")]
    MeasuredConversion(String),
    /// A rank thread that panicked (its rank).
    #[error("rank {rank}")]
    Rank {
        /// The rank.
        rank: usize,
        /// The panic, as the communicator reports it.
        #[source]
        source: comm::CommError,
    },
    /// Collectives over MPI asked of a build without the `mpi` feature.
    #[error("this tessera was built without MPI; rebuild with `--features mpi`")]
    NoMpi,
    /// The measured device profile breaks a rule of device profiles.
    #[error("the measured profile is not usable: {0}")]
    ProfileUnusable(search::ProfileError),
    /// A parameter-server role that found no role in its environment.
    #[error("no role")]
    NoRole,
    /// A parameter-server role thread that panicked.
    #[error("a role thread panicked")]
    RoleThreadPanicked,
    /// A parameter-server job whose worker 0 sent no report.
    #[error("worker 0 did not report")]
    NoWorkerReport,
    /// A started process without the pipe asked for (`stdout`, `stderr`).
    #[error("no {0}")]
    NoPipe(&'static str),
    /// A process started after the recovery job's output was closed.
    #[error("the job's output is closed")]
    OutputClosed,
    /// A job whose launcher's output ended before the line awaited: what was awaited, and the
    /// last lines it printed.
    #[error(
        "the job ended before printing \"{waiting_for}\"; its last lines:\n{}",
        .last_lines.join("\n")
    )]
    JobEnded {
        /// The text of the line awaited.
        waiting_for: String,
        /// The last lines the launcher printed (at most a few).
        last_lines: Vec<String>,
    },
    /// A recovery job that printed nothing awaited for two minutes.
    #[error("the recovery run stalled")]
    RecoveryStalled,
    /// The caller asked the benchmark to stop ([`crate::Progress::stop`]): its report has
    /// nowhere to go. What it created was removed and what it started was stopped.
    #[error("the benchmark stopped: its report has nowhere to go")]
    Stopped,
    /// Processes of a recovery job (not killed by the benchmark) that failed.
    #[error("the recovery run failed: {}", .0.join("; "))]
    RecoveryFailed(Vec<String>),
}

/// `path` as a TOML string, quoted and escaped (a path holding `"` or `\` stays one string),
/// for the configs the benchmarks write; [`BenchError::NonUtf8Path`] naming `what` when it is
/// not UTF-8.
pub(crate) fn toml_path(what: &'static str, path: &std::path::Path) -> Result<String, BenchError> {
    let text = path.to_str().ok_or_else(|| BenchError::NonUtf8Path {
        what,
        path: path.to_path_buf(),
    })?;
    Ok(toml::Value::String(text.to_string()).to_string())
}

impl BenchError {
    /// An [`BenchError::IoAt`] for `what`.
    pub(crate) fn io_at(what: impl Into<String>, source: std::io::Error) -> BenchError {
        BenchError::IoAt {
            what: what.into(),
            source,
        }
    }
}
