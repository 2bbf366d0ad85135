//! The one error type of the reshard executor.

/// Everything that can go wrong executing a reshard: a plan that could not be made, inputs that
/// do not match it, or a failed collective.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// Planning the move failed ([`crate::reshard`] plans before it runs).
    #[error(transparent)]
    Plan(#[from] reshard::ReshardError),
    /// The slices given to a run do not match the plan's layouts on this rank.
    #[error("reshard: {reason}")]
    LocalMismatch {
        /// What does not match.
        reason: String,
    },
    /// A plan or a mode the executor cannot run.
    #[error("reshard: not supported: {what}")]
    Unsupported {
        /// What.
        what: String,
    },
    /// A communication failure (a peer failed, a timeout, …).
    #[error(transparent)]
    Comm(#[from] comm::CommError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] tensor::TensorError),
}
