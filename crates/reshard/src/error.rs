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
    /// A tensor so large that the plan's byte figures (per rank, in total, the lower bound)
    /// could pass `usize::MAX` and wrap: its bytes times twice the two meshes' slots must fit.
    #[error(
        "cannot plan a tensor of shape {shape:?} in {dtype}: its plan's byte figures over {slots} \
         source and destination slots could exceed {max} bytes (the tensor's bytes times twice \
         the slots must fit)",
        max = usize::MAX
    )]
    TooLarge {
        /// The global shape.
        shape: Vec<usize>,
        /// The element type's name.
        dtype: String,
        /// Source and destination slots together.
        slots: usize,
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
