//! The one error type of the reshard planner.

use layout::LayoutError;

/// Everything that can go wrong planning a reshard (executing one fails with
/// `reshard_exec::ExecError`, which wraps this).
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
    /// A plan the planner cannot represent.
    #[error("reshard: not supported: {what}")]
    Unsupported {
        /// What.
        what: String,
    },
    /// An invalid layout.
    #[error(transparent)]
    Layout(#[from] LayoutError),
}
