//! The one error type of the exec crate.

/// Everything that can go wrong executing a program or updating parameters. `runtime` wraps it
/// (`RuntimeError::Exec`) with the same messages; a `Config` error becomes runtime's own
/// `Config`, naming the same key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// A setting the execution cannot honour (named key, rule broken): an optimizer
    /// hyperparameter, a loss scale, a pipeline option.
    #[error("config {key}: {reason}")]
    Config {
        /// The key, `section.key`.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// Feeding a tensor that does not match what the program expects, or asking for a
    /// parameter, gradient or buffer the program does not have.
    #[error("{what}: expected {expected}, got {got}")]
    Mismatch {
        /// What was fed or asked for.
        what: String,
        /// What the program expects.
        expected: String,
        /// What it got.
        got: String,
    },
    /// A graph error (evaluating an op).
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
    /// A layout or mesh was invalid (a box asked of a rank the mesh lacks).
    #[error(transparent)]
    Layout(#[from] layout::LayoutError),
}

impl ExecError {
    /// The communication failure behind this error, directly or through a reshard: how a
    /// launcher tells a rank that failed from one that only saw a peer fail.
    pub fn comm_error(&self) -> Option<&comm::CommError> {
        match self {
            ExecError::Comm(e) | ExecError::Reshard(reshard_exec::ExecError::Comm(e)) => Some(e),
            _ => None,
        }
    }
}
