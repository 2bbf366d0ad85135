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
    /// A plan with more transfers than the caller allows (see [`crate::plan_from_within`]):
    /// refused after counting its transfers, before any is planned.
    #[error(
        "the plan has {n_transfers} transfers (between {src_devices} source and {dst_devices} \
         destination devices), more than the bound of {max_transfers}: a plan may have at most \
         {max_transfers} transfers"
    )]
    TooManyTransfers {
        /// The number of transfers the plan would have (local copies included).
        n_transfers: usize,
        /// The bound it exceeds.
        max_transfers: usize,
        /// Physical devices of the source mesh.
        src_devices: usize,
        /// Physical devices of the destination mesh.
        dst_devices: usize,
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
