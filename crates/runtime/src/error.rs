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
    /// A rank cannot take part in writing a checkpoint set: rank 0 could not open it, another
    /// rank failed to write its part, or rank 0's shared staging path is implausible.
    #[error("rank {rank}: {reason}")]
    CheckpointSet {
        /// The rank the failure is told of (rank 0 for a set it could not open), or the rank
        /// reporting it.
        rank: usize,
        /// What went wrong, and what became of the set.
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
    /// The parallel pass rejected the configuration.
    #[error(transparent)]
    Parallel(#[from] parallel::ParallelError),
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

impl From<models::ModelsError> for RuntimeError {
    /// A model's setting error is a config error naming its key.
    fn from(e: models::ModelsError) -> RuntimeError {
        match e {
            models::ModelsError::Config { key, reason } => RuntimeError::Config { key, reason },
            models::ModelsError::Graph(g) => RuntimeError::Graph(g),
        }
    }
}
