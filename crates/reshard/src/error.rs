//! The one error type of the reshard crate.

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
}
