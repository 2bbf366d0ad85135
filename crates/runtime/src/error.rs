//! The one error type of the runtime crate.

use std::path::PathBuf;

/// Everything that can go wrong running a program, reading data or training.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// A bad training configuration (named key, rule broken).
    #[error("config {key}: {reason}")]
    Config {
        /// The key, `section.key`.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A bad training configuration file (the file, the key, the rule broken).
    #[error("{path}: {key}: {reason}")]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// The key, `section.key`.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A NaN or infinite loss: training stops, as MindSpore's `LossMonitor` stops it.
    #[error("epoch {epoch} step {step}: invalid loss {loss}, training stops")]
    InvalidLoss {
        /// The epoch, from 1.
        epoch: usize,
        /// The step within the epoch, from 1.
        step: usize,
        /// The loss.
        loss: f32,
    },
    /// A data file that cannot be read or is malformed.
    #[error("data file {path}: {reason}")]
    Data {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Feeding a tensor that does not match what the program expects.
    #[error("{what}: expected {expected}, got {got}")]
    Mismatch {
        /// What was fed.
        what: String,
        /// What the program expects.
        expected: String,
        /// What it got.
        got: String,
    },
    /// A rank failed; the others stopped. The rank's own error is kept (a peer's "peer failed"
    /// or a timeout only when no rank failed on its own): a match reaches it as `*source`, and
    /// `std::error::Error::source()` gives it boxed (downcast to `Box<RuntimeError>`).
    #[error("rank {rank}: {source}")]
    Rank {
        /// The rank.
        rank: usize,
        /// Its error.
        #[source]
        source: Box<RuntimeError>,
    },
    /// A rank cannot take part in writing a checkpoint set: rank 0 could not open it, or rank
    /// 0's shared staging path is implausible (another rank's failure to write its part is
    /// [`RuntimeError::PeerWriteFailed`]).
    #[error("rank {rank}: {reason}")]
    CheckpointSet {
        /// The rank the failure is told of (rank 0 for a set it could not open), or the rank
        /// reporting it.
        rank: usize,
        /// What went wrong, and what became of the set.
        reason: String,
    },
    /// A rank stops writing a checkpoint set or an elastic snapshot because another rank
    /// failed to write its part: a consequence, never the cause, so the launcher reports the
    /// failing rank's own error (the file and the OS error) instead of this one.
    #[error("rank {rank}: {reason}")]
    PeerWriteFailed {
        /// The rank reporting it.
        rank: usize,
        /// What the other rank failed at, and what became of the set.
        reason: String,
    },
    /// An IO error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file or directory the run needs that is missing or cannot be written, found before
    /// any rank started.
    #[error("{what} {path}: {reason}")]
    Unusable {
        /// What the path is for (`metrics log`).
        what: String,
        /// The path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Executing a program or updating parameters failed (`exec`'s error, its message
    /// unchanged; boxed, so that it does not make every `RuntimeError` larger).
    #[error(transparent)]
    Exec(Box<exec::ExecError>),
    /// The parallel pass rejected the configuration.
    #[error(transparent)]
    Parallel(#[from] parallel::ParallelError),
    /// The search found no plan (no plan fits the memory, a bad device profile).
    #[error(transparent)]
    Search(search::SearchError),
    /// A graph error (building the model, evaluating an op).
    #[error(transparent)]
    Graph(#[from] graph::GraphError),
    /// A reshard failed (planning it, or running it over the communicator).
    #[error(transparent)]
    Reshard(#[from] reshard_exec::ExecError),
    /// A communication failure.
    #[error(transparent)]
    Comm(#[from] comm::CommError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] tensor::TensorError),
    /// A checkpoint operation failed.
    #[error(transparent)]
    Ckpt(#[from] ckpt::CkptError),
    /// A layout or mesh was invalid (an axis name a mesh lacks, a shape a layout cannot split).
    #[error(transparent)]
    Layout(#[from] layout::LayoutError),
}

impl From<exec::ExecError> for RuntimeError {
    /// A setting `exec` rejects (an optimizer hyperparameter, the loss scale) is a config error
    /// naming its key, as the config's own are, so that a file's or a `--set`'s errors name
    /// their source; everything else is wrapped as [`RuntimeError::Exec`].
    fn from(e: exec::ExecError) -> RuntimeError {
        match e {
            exec::ExecError::Config { key, reason } => RuntimeError::Config { key, reason },
            e => RuntimeError::Exec(Box::new(e)),
        }
    }
}

impl From<models::ModelsError> for RuntimeError {
    /// A model's setting error is a config error naming its key.
    fn from(e: models::ModelsError) -> RuntimeError {
        match e {
            models::ModelsError::Config { key, reason } => RuntimeError::Config { key, reason },
            models::ModelsError::Graph(g) => RuntimeError::Graph(g),
        }
    }
}

impl From<search::SearchError> for RuntimeError {
    /// A search's setting error is a config error naming its key (a profile file's: the file
    /// and the key), a rule of the parallel pass a parallel error, and the runtime's own error
    /// (rebuilding the model) itself.
    fn from(e: search::SearchError) -> RuntimeError {
        use search::SearchError as S;
        match e {
            S::Parallel(p) => RuntimeError::Parallel(p),
            S::Config { key, reason } => RuntimeError::Config { key, reason },
            S::ProfileFile { path, key, reason } => RuntimeError::Config {
                key: format!("{} ({key})", path.display()),
                reason,
            },
            S::Io { path, source } => RuntimeError::Io { path, source },
            S::Model(source) => match source.downcast::<RuntimeError>() {
                Ok(own) => *own,
                Err(source) => RuntimeError::Search(S::Model(source)),
            },
            other => RuntimeError::Search(other),
        }
    }
}
