//! The piece of each parameter a rank's optimizer updates ([`OptimizerPiece`]), and a rank's
//! slot in a layout's mesh.

use layout::{SliceBox, TensorLayout};
use parallel::Program;

use crate::error::ExecError;

/// The part of a parameter one rank's optimizer updates: with `hsdp`, its box of the
/// optimizer-shard layout, a run of whole rows of the parameter's slice (and of the gradient's,
/// unless the gradient already holds just the piece); otherwise the whole slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptimizerPiece {
    /// The piece's shape (what the optimizer's state has).
    pub shape: Vec<usize>,
    /// Offset, in elements, of its first element in the parameter's buffer.
    pub param_offset: usize,
    /// Offset, in elements, of its first element in the gradient's buffer.
    pub grad_offset: usize,
}

impl OptimizerPiece {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the piece has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Offset, in elements, of `inner`'s first element in the row-major buffer of `outer`, a box
/// that contains it and agrees with it on every dim but 0.
fn row_offset(outer: &SliceBox, inner: &SliceBox) -> usize {
    let row: usize = inner.shape.iter().skip(1).product();
    (inner.offset.first().copied().unwrap_or(0) - outer.offset.first().copied().unwrap_or(0)) * row
}

/// The piece of every parameter of `program` that `rank`'s optimizer updates.
pub(super) fn optimizer_pieces(
    program: &Program,
    rank: usize,
) -> Result<Vec<OptimizerPiece>, ExecError> {
    program
        .params
        .iter()
        .map(|p| {
            // A parameter of another pipeline stage's ranks: nothing here.
            if p.layout.mesh().slot_of_rank(rank).is_none() {
                return Ok(OptimizerPiece {
                    shape: vec![0],
                    param_offset: 0,
                    grad_offset: 0,
                });
            }
            let param_box = p.layout.slot_box(slot_of(&p.layout, rank)?);
            let Some(shard) = p.optimizer_shard() else {
                return Ok(OptimizerPiece {
                    shape: param_box.shape.into_vec(),
                    param_offset: 0,
                    grad_offset: 0,
                });
            };
            let piece = shard.layout.slot_box(slot_of(&shard.layout, rank)?);
            let grad_offset = match p.grad_buffer {
                Some(g) => {
                    let grad = program.buffers[g].layout.layout();
                    row_offset(&grad.slot_box(slot_of(grad, rank)?), &piece)
                }
                None => 0,
            };
            Ok(OptimizerPiece {
                param_offset: row_offset(&param_box, &piece),
                grad_offset,
                shape: piece.shape.into_vec(),
            })
        })
        .collect()
}

/// The slot of `rank` in `layout`'s mesh.
pub(super) fn slot_of(layout: &TensorLayout, rank: usize) -> Result<usize, ExecError> {
    layout
        .mesh()
        .slot_of_rank(rank)
        .ok_or_else(|| ExecError::Mismatch {
            what: format!("rank {rank}"),
            expected: format!("a rank of {}", layout.mesh()),
            got: format!("rank {rank}"),
        })
}
