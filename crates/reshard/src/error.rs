//! The one error type of the reshard crate.

use layout::LayoutError;

/// Everything that can go wrong planning or executing a reshard.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ReshardError {
    /// Source and destination describe tensors of different global shapes.
    #[error(
        "cannot reshard: the source layout is for shape {src:?} but the destination for {dst:?}"
    )]
    ShapeMismatch {
        /// Source global shape.
        src: Vec<usize>,
        /// Destination global shape.
        dst: Vec<usize>,
    },
    /// A pending-sum axis that also splits a dim.
    #[error("axis {axis} splits a dim of {layout}, so it cannot also hold a pending sum")]
    PartialAxisSplits {
        /// The axis.
        axis: String,
        /// The layout, formatted.
        layout: String,
    },
    /// The slices given to a run do not match the plan's source layout on this rank.
    #[error("reshard: {reason}")]
    LocalMismatch {
        /// What does not match.
        reason: String,
    },
    /// A plan the executor cannot run.
    #[error("reshard: not supported: {what}")]
    Unsupported {
        /// What.
        what: String,
    },
    /// An invalid layout.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A communication failure (a peer failed, a timeout, …).
    #[error(transparent)]
    Comm(#[from] comm::CommError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] tensor::TensorError),
}
