//! The optimizer step of one rank ([`update_parameters`]): every trainable parameter's piece
//! updated with its gradient (the program's, or the accumulated mean), under mixed precision
//! through the f32 masters with the overflow check, after clipping by the global norm.
//!
//! A rule needing whole-parameter norms (Lamb, [`Optimizer::needs_norms`]) gets them as global
//! clipping gets its norm ([`crate::clip`]): each rank adds the exact squares of the pieces it
//! counts (the first rank of each piece's replica group, owners only for a pipeline's shared
//! parameter), the ranks' sums are all-gathered per parameter and added as integers, so every
//! rank holding a piece of a parameter sees the norms of the whole parameter, one device's
//! bit for bit whatever the layout; a pipeline stage's copy of a shared parameter takes its
//! owner's.

use comm::Communicator;
use tensor::Tensor;

use crate::clip::{counts_piece, MaxGradNorm, SquareSum, SQUARE_SUM_BYTES};
use crate::error::ExecError;
use crate::precision::{
    all_finite, any_rank_overflowed, f32_piece, write_piece, LossScaler, MasterWeights,
};
use crate::{Accumulation, Optimizer, RankExecutor};

/// What an optimizer step needs besides the executor and the optimizer.
pub struct UpdateContext<'a> {
    /// The trainable parameters (indices into the program's), in the optimizer's order.
    pub trainable: &'a [usize],
    /// With gradient accumulation, the step's mean gradients (else the program's).
    pub accumulated: Option<&'a mut Accumulation>,
    /// Under mixed precision, the f32 master pieces the optimizer updates.
    pub master: Option<&'a mut MasterWeights>,
    /// The loss scale, when the gradients carry one.
    pub scaler: Option<&'a mut LossScaler>,
    /// Every rank (to agree on skipping a step whose gradients overflowed, and to add up the
    /// global gradient norm).
    pub world: &'a dyn Communicator,
    /// `train.max_grad_norm`: the global norm the gradients are clipped to.
    pub clip: Option<MaxGradNorm>,
}

/// What an optimizer step did.
pub struct StepUpdate {
    /// Whether the parameters were updated (`false`: skipped for overflowing gradients).
    pub applied: bool,
    /// With `train.max_grad_norm`, the global gradient norm before clipping (`None` when
    /// the step was skipped, or without clipping).
    pub grad_norm: Option<f64>,
}

/// Parameter `i`'s (`trainable[k]`) gradient — accumulated, or the program's — and where its
/// optimizer piece starts in it.
fn gradient_of<'e>(
    exec: &'e RankExecutor,
    accumulated: Option<&'e Accumulation>,
    k: usize,
    i: usize,
) -> Option<(&'e Tensor, usize)> {
    let piece = exec.optimizer_piece(i);
    match accumulated {
        Some(acc) => Some((acc.buffer(k), acc.piece_offset(k, piece.grad_offset))),
        None => exec.grad(i).map(|g| (g, piece.grad_offset)),
    }
}

/// The optimizer step: every trainable parameter's piece (its shard, or with `hsdp` the rows
/// of its optimizer shard) updated with its gradient — the program's gradient buffer, or with
/// gradient accumulation the accumulated mean — then the updated pieces gathered into whole
/// weights where `hsdp` keeps weights whole (`zero1` and `zero2`). Under mixed precision the update
/// applies to the f32 master piece, with the gradient widened and unscaled, and the result is
/// rounded into the weights; a step whose gradients overflowed on any rank is skipped.
/// With `train.max_grad_norm` the gradients (unscaled, under mixed precision) are first
/// clipped by their global norm ([`crate::clip`]).
pub fn update_parameters(
    exec: &mut RankExecutor,
    optimizer: &mut Optimizer,
    mut ctx: UpdateContext<'_>,
) -> Result<StepUpdate, ExecError> {
    let Some(master) = ctx.master else {
        let grad_norm = match ctx.clip {
            Some(clip) => {
                let accumulated = ctx.accumulated.as_deref_mut();
                Some(clip.clip_in_place(exec, accumulated, ctx.trainable, ctx.world)?)
            }
            None => None,
        };
        optimizer.begin_step();
        if optimizer.needs_norms() {
            let mut squares = Vec::with_capacity(ctx.trainable.len());
            for (k, &i) in ctx.trainable.iter().enumerate() {
                let piece = exec.optimizer_piece(i);
                let grad = gradient_of(exec, ctx.accumulated.as_deref(), k, i);
                squares.push(match grad {
                    Some((grad, offset)) => Some(optimizer.prepare_piece(
                        k,
                        exec.param(i),
                        piece.param_offset,
                        grad,
                        offset,
                    )?),
                    None => None,
                });
            }
            set_whole_norms(exec, optimizer, &squares, ctx.trainable, ctx.world)?;
        }
        for (k, &i) in ctx.trainable.iter().enumerate() {
            let piece = exec.optimizer_piece(i).clone();
            match ctx.accumulated.as_deref() {
                Some(accumulated) => optimizer.update_piece(
                    k,
                    exec.param_mut(i),
                    piece.param_offset,
                    accumulated.buffer(k),
                    accumulated.piece_offset(k, piece.grad_offset),
                )?,
                None => {
                    if let Some((param, grad)) = exec.param_and_grad(i) {
                        optimizer.update_piece(
                            k,
                            param,
                            piece.param_offset,
                            grad,
                            piece.grad_offset,
                        )?;
                    }
                }
            }
        }
        exec.gather_updated_weights()?;
        return Ok(StepUpdate {
            applied: true,
            grad_norm,
        });
    };
    let unscale = ctx.scaler.as_ref().map_or(1.0, |s| 1.0 / s.scale());
    let mut grads = Vec::with_capacity(ctx.trainable.len());
    for (k, &i) in ctx.trainable.iter().enumerate() {
        let shape = exec.optimizer_piece(i).shape.clone();
        let grad = match gradient_of(exec, ctx.accumulated.as_deref(), k, i) {
            Some((g, offset)) => f32_piece(g, offset, &shape, unscale)?,
            None => Tensor::zeros(tensor::DType::F32, &shape),
        };
        grads.push(grad);
    }
    if let Some(scaler) = ctx.scaler {
        let mine = !grads.iter().all(all_finite);
        let overflow = any_rank_overflowed(ctx.world, mine)?;
        scaler.record(overflow);
        if overflow {
            return Ok(StepUpdate {
                applied: false,
                grad_norm: None,
            });
        }
    }
    let grad_norm = match ctx.clip {
        Some(clip) => Some(clip.clip_pieces(exec, &mut grads, ctx.trainable, ctx.world)?),
        None => None,
    };
    optimizer.begin_step();
    if optimizer.needs_norms() {
        let mut squares = Vec::with_capacity(ctx.trainable.len());
        for (k, grad) in grads.iter().enumerate() {
            squares.push(Some(optimizer.prepare_piece(
                k,
                master.piece(k),
                0,
                grad,
                0,
            )?));
        }
        set_whole_norms(exec, optimizer, &squares, ctx.trainable, ctx.world)?;
    }
    for (k, &i) in ctx.trainable.iter().enumerate() {
        optimizer.update_piece(k, master.piece_mut(k), 0, &grads[k], 0)?;
        let offset = exec.optimizer_piece(i).param_offset;
        write_piece(exec.param_mut(i), offset, master.piece(k))?;
    }
    exec.gather_updated_weights()?;
    Ok(StepUpdate {
        applied: true,
        grad_norm,
    })
}

/// Hands every trainable parameter `trainable[k]` the norms of its whole weight and update
/// ([`Optimizer::set_norms`]), from `squares[k]`, the square sums of this rank's piece
/// (`None`: no gradient, no update). Every rank of `world` calls it at the same step.
///
/// Each rank sends, per parameter of the program, the square sums of the piece it counts
/// (zero for the others); the sums from every rank are added per parameter.
fn set_whole_norms(
    exec: &RankExecutor,
    optimizer: &mut Optimizer,
    squares: &[Option<crate::PieceSquares>],
    trainable: &[usize],
    world: &dyn Communicator,
) -> Result<(), ExecError> {
    let program = exec.program();
    let n = program.params.len();
    // Two sums (weights, update) per parameter of the program: the same length on every rank.
    let record = 2 * SQUARE_SUM_BYTES;
    let mut mine = vec![0u8; n.checked_mul(record).ok_or_else(|| too_many(n))?];
    for (k, &i) in trainable.iter().enumerate() {
        let Some(sums) = &squares[k] else { continue };
        if !counts_piece(program, i, exec.rank()) {
            continue;
        }
        let at = i * record;
        mine[at..at + SQUARE_SUM_BYTES].copy_from_slice(&sums.param.to_bytes());
        mine[at + SQUARE_SUM_BYTES..at + record].copy_from_slice(&sums.update.to_bytes());
    }
    // The parameter whose norms each trainable parameter takes: itself, or for a pipeline
    // stage's copy of a shared parameter, its owner (the copies hold the owner's values).
    let owner_of = |i: usize| -> usize {
        let name = &program.params[i].name;
        parallel::pipeline::shared_copy_of(name)
            .and_then(|(owner, _)| program.params.iter().position(|p| p.name == owner))
            .unwrap_or(i)
    };
    let sources: Vec<usize> = trainable.iter().map(|&i| owner_of(i)).collect();
    let mut totals: std::collections::BTreeMap<usize, (SquareSum, SquareSum)> = sources
        .iter()
        .map(|&i| (i, (SquareSum::default(), SquareSum::default())))
        .collect();
    world.all_gather_visit(&mine, &mut |_, bytes| {
        for (&i, (param, update)) in totals.iter_mut() {
            let at = i * record;
            param.merge(&SquareSum::from_bytes(&bytes[at..at + SQUARE_SUM_BYTES]));
            update.merge(&SquareSum::from_bytes(
                &bytes[at + SQUARE_SUM_BYTES..at + record],
            ));
        }
    })?;
    for (k, &source) in sources.iter().enumerate() {
        if squares[k].is_none() {
            continue;
        }
        let (param, update) = &totals[&source];
        optimizer.set_norms(k, param.to_f64().sqrt(), update.to_f64().sqrt())?;
    }
    Ok(())
}

/// The error for a program with more parameters than a norm exchange can address.
fn too_many(n: usize) -> ExecError {
    ExecError::Mismatch {
        what: "the parameters of a whole-parameter norm exchange (lamb)".to_string(),
        expected: "a count whose exchange fits the address space".to_string(),
        got: n.to_string(),
    }
}
