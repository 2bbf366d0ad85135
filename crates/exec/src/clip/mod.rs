//! Gradient clipping by global norm (`train.max_grad_norm`, MindSpore's
//! `ops.clip_by_global_norm`): once per optimizer step, after the gradients are reduced over
//! the ranks (and accumulated over the step's micro-batches, and summed over a shared
//! parameter's pipeline copies) and before the update, every gradient is multiplied by
//! `max_grad_norm / max(global_norm, max_grad_norm)`, where `global_norm` is the L2 norm of the
//! whole model's gradient.
//!
//! The norm counts every element of the model's gradient exactly once, whatever the layout:
//! each rank adds the squares of the optimizer piece it updates (its slice, or under `hsdp`
//! its piece of the slice) only when it is the first rank of that piece's replica group, so
//! data-parallel replicas and the copies of a piece outside its shard group are not counted
//! again; pipeline stages each count their own parameters, and a parameter shared by stages
//! is counted at its owner only (its copies hold the same summed gradient). The squares are
//! summed exactly ([`square_sum`]) and the ranks' sums exchanged and added as integers, so
//! the norm does not depend on how the elements are split or in which order they are added:
//! in deterministic mode, where the gradients are one device's bit for bit, so is the norm,
//! and so is the clipped update.
//!
//! Under mixed precision the norm is that of the unscaled f32 gradient the optimizer applies,
//! taken after the overflow check: a step skipped for overflow is neither clipped nor given
//! a norm. A norm that is not finite (an f32 run whose gradient overflowed) leaves the
//! gradients as they are. A norm at or below `max_grad_norm` leaves them bitwise unchanged.

mod square_sum;

use crate::{Accumulation, RankExecutor};
use comm::Communicator;
use parallel::Program;
use tensor::{DType, Tensor};

use crate::error::ExecError;

pub use square_sum::{SquareSum, ENCODED_BYTES as SQUARE_SUM_BYTES};

/// `train.max_grad_norm`: a finite norm > 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MaxGradNorm(f64);

/// A `MaxGradNorm` is finite, so equality is reflexive.
impl Eq for MaxGradNorm {}

impl MaxGradNorm {
    /// `value` as a clipping norm, when it is finite and > 0.
    pub fn new(value: f64) -> Option<MaxGradNorm> {
        (value.is_finite() && value > 0.0).then_some(MaxGradNorm(value))
    }

    /// The norm.
    pub fn get(self) -> f64 {
        self.0
    }

    /// The factor the gradients are multiplied by when their global norm is `norm`
    /// (MindSpore's `clip_norm / max(global_norm, clip_norm)`), or `None` when they are left
    /// as they are: the norm is at most `max_grad_norm` (the factor would be 1) or not finite.
    pub fn factor(self, norm: f64) -> Option<f64> {
        (norm.is_finite() && norm > self.0).then(|| self.0 / norm)
    }

    /// Clips the gradients the optimizer reads from `exec` — the program's gradient buffers,
    /// or with accumulation the step's mean gradients in `accumulated` — in place, and
    /// returns the global norm before clipping. Every rank of `world` calls it at the same
    /// step.
    pub(crate) fn clip_in_place(
        self,
        exec: &mut RankExecutor,
        mut accumulated: Option<&mut Accumulation>,
        trainable: &[usize],
        world: &dyn Communicator,
    ) -> Result<f64, ExecError> {
        let mut local = SquareSum::default();
        for (k, &i) in trainable.iter().enumerate() {
            if !counts_piece(exec.program(), i, exec.rank()) {
                continue;
            }
            let piece = exec.optimizer_piece(i);
            match accumulated.as_deref() {
                Some(acc) => local.add_elements(
                    acc.buffer(k),
                    acc.piece_offset(k, piece.grad_offset),
                    piece.len(),
                )?,
                None => {
                    if let Some(grad) = exec.grad(i) {
                        local.add_elements(grad, piece.grad_offset, piece.len())?;
                    }
                }
            }
        }
        let norm = global_norm(world, &local)?;
        if let Some(factor) = self.factor(norm) {
            for (k, &i) in trainable.iter().enumerate() {
                let grad = match accumulated.as_deref_mut() {
                    Some(acc) => Some(acc.buffer_mut(k)),
                    None => exec.grad_mut(i),
                };
                if let Some(grad) = grad {
                    scale(grad, factor)?;
                }
            }
        }
        Ok(norm)
    }

    /// Clips the program's gradient buffers of the trainable parameters `trainable` (indices
    /// into `exec`'s program's parameters) in place, as a training step does without
    /// accumulation; returns the global norm before clipping. Every rank of `world` calls it
    /// at the same step (benchmarks and custom loops over a [`RankExecutor`]).
    pub fn clip_gradients(
        self,
        exec: &mut RankExecutor,
        trainable: &[usize],
        world: &dyn Communicator,
    ) -> Result<f64, ExecError> {
        self.clip_in_place(exec, None, trainable, world)
    }

    /// Clips a gradient held whole by one process, as slices (a parameter-server worker's
    /// gradient: its dense tensors and its embedding rows), in place; returns the norm before
    /// clipping. The squares are summed exactly, as across ranks.
    pub fn clip_slices(self, parts: &mut [&mut [f32]]) -> f64 {
        let mut sum = SquareSum::default();
        for part in parts.iter() {
            sum.add_f32(part);
        }
        self.clip_slices_by(&sum, parts)
    }

    /// Clips `parts` in place by the global norm whose exact square sum, `total`, was summed
    /// elsewhere (a sync parameter-server step: every server's part of it); returns the norm.
    pub fn clip_slices_by(self, total: &SquareSum, parts: &mut [&mut [f32]]) -> f64 {
        let norm = total.to_f64().sqrt();
        if let Some(factor) = self.factor(norm) {
            for part in parts.iter_mut() {
                scale_f32(part, factor);
            }
        }
        norm
    }

    /// Clips `pieces` (by trainable parameter `trainable[k]`, its whole optimizer piece, as
    /// mixed precision's unscaled f32 gradients are) in place; returns the global norm before
    /// clipping. Every rank of `world` calls it at the same step.
    pub(crate) fn clip_pieces(
        self,
        exec: &RankExecutor,
        pieces: &mut [Tensor],
        trainable: &[usize],
        world: &dyn Communicator,
    ) -> Result<f64, ExecError> {
        let mut local = SquareSum::default();
        for (piece, &i) in pieces.iter().zip(trainable) {
            if counts_piece(exec.program(), i, exec.rank()) {
                local.add_elements(piece, 0, piece.n_elements())?;
            }
        }
        let norm = global_norm(world, &local)?;
        if let Some(factor) = self.factor(norm) {
            for piece in pieces.iter_mut() {
                scale(piece, factor)?;
            }
        }
        Ok(norm)
    }
}

/// Whether `rank` counts its optimizer piece of parameter `i` in the global norm: the piece
/// is of an owner (not a pipeline stage's copy of a shared parameter) and `rank` is the first
/// of the ranks holding the same piece.
pub(crate) fn counts_piece(program: &Program, i: usize, rank: usize) -> bool {
    let p = &program.params[i];
    if parallel::pipeline::shared_copy_of(&p.name).is_some() {
        return false;
    }
    let layout = p.optimizer_shard().map_or(&p.layout, |shard| &shard.layout);
    layout
        .replica_ranks(rank)
        .and_then(|holders| holders.first().copied())
        == Some(rank)
}

/// The L2 norm of the gradient whose squares each rank of `world` summed into `local`: the
/// ranks' exact sums gathered and added (as integers, so in any order), rounded once.
pub(crate) fn global_norm(world: &dyn Communicator, local: &SquareSum) -> Result<f64, ExecError> {
    let mine = local.to_bytes();
    let mut all = vec![0u8; mine.len() * world.size()];
    world.all_gather_bytes(&mine, &mut all)?;
    let mut total = SquareSum::default();
    for rank_bytes in all.chunks_exact(square_sum::ENCODED_BYTES) {
        total.merge(&SquareSum::from_bytes(rank_bytes));
    }
    Ok(total.to_f64().sqrt())
}

/// Multiplies every element of `t` by `factor` (rounded once to `t`'s type).
fn scale(t: &mut Tensor, factor: f64) -> Result<(), ExecError> {
    match t.dtype() {
        DType::F32 => scale_f32(t.as_slice_mut::<f32>()?, factor),
        DType::F64 => t
            .as_slice_mut::<f64>()?
            .iter_mut()
            .for_each(|x| *x *= factor),
        other => {
            return Err(ExecError::Mismatch {
                what: "a gradient to clip (train.max_grad_norm)".to_string(),
                expected: "f32 or f64 (half-precision gradients are clipped as f32)".to_string(),
                got: other.to_string(),
            })
        }
    }
    Ok(())
}

/// Multiplies every element of `xs` by `factor` rounded once to f32.
fn scale_f32(xs: &mut [f32], factor: f64) {
    let f = factor as f32;
    xs.iter_mut().for_each(|x| *x *= f);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_factor_is_mindspores_and_one_is_no_factor() {
        let max = MaxGradNorm::new(2.0).unwrap();
        assert_eq!(max.factor(8.0), Some(0.25));
        assert_eq!(max.factor(2.0), None);
        assert_eq!(max.factor(0.5), None);
        assert_eq!(max.factor(f64::INFINITY), None);
        assert_eq!(max.factor(f64::NAN), None);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(MaxGradNorm::new(bad), None);
        }
    }
}
