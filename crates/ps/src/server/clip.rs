//! Sync clipping by the global norm (`train.max_grad_norm` with `ps.sync = true`).
//!
//! Each server holds only its parameters' part of a step's mean gradient, so no process has
//! the whole gradient. A server that has a step's mean sums the squares of its part exactly
//! ([`SquareSum`]) and waits with the step unapplied; the workers gather every server's part
//! (`PullReply.norm_step`, `norm_part`), add them (integer addition: the same total whatever
//! the order) and hand the total back (`PullRequest.norm`); the server then clips its part by
//! `max_grad_norm / max(norm, max_grad_norm)` — MindSpore's factor, the one data parallel
//! applies — and applies the step. Every worker computes the same total, so the first to
//! arrive commits the step and the later ones are checked against it.

use runtime::{MaxGradNorm, SquareSum};
use tensor::Tensor;

use super::State;
use crate::error::PsError;
use crate::proto::StepSquareSum;
use crate::sparse::Rows;

/// Steps whose global square sums a server keeps after applying them (to tell late workers
/// the norm, and to check theirs).
const KEPT_NORMS: usize = 64;

/// One sync step's mean over its workers, ready to apply.
pub(super) struct StepMean {
    pub(super) step: u64,
    pub(super) loss: f32,
    /// Whether a replayed push was among the step's.
    pub(super) replay: bool,
    pub(super) learning_rate: f64,
    pub(super) grads: Vec<Tensor>,
    /// One per server-resident table.
    pub(super) sparse: Vec<Rows>,
}

/// A step waiting for its global norm: its mean and the exact square sum of this server's
/// part.
pub(super) struct AwaitingNorm {
    pub(super) mean: StepMean,
    pub(super) part: SquareSum,
}

impl AwaitingNorm {
    /// `mean` with the square sum of its dense gradients and table rows.
    pub(super) fn new(mean: StepMean) -> Result<AwaitingNorm, PsError> {
        let mut part = SquareSum::default();
        for g in &mean.grads {
            let values = g.as_f32().map_err(|e| {
                PsError::tensor(format!("the mean gradient of step {}", mean.step), e)
            })?;
            part.add_f32(values);
        }
        for rows in &mean.sparse {
            part.add_f32(&rows.values);
        }
        Ok(AwaitingNorm { mean, part })
    }
}

impl State {
    /// Takes a worker's global square sum `norm`: applies the step waiting for it (clipped),
    /// then any later step whose pushes are all in. A sum for a step already applied must be
    /// the one it was applied with. Returns whether a step was applied.
    pub(super) fn commit_norm(&mut self, norm: &StepSquareSum) -> Result<bool, PsError> {
        let what = || {
            format!(
                "the global square sum of step {} (PullRequest.norm)",
                norm.step
            )
        };
        let total = SquareSum::decode(&norm.square_sum).ok_or_else(|| {
            PsError::message(
                what(),
                format!(
                    "{} bytes, expected an encoded square sum of {} bytes",
                    norm.square_sum.len(),
                    runtime::SQUARE_SUM_BYTES
                ),
            )
        })?;
        let Some(clip) = self.clip else {
            return Err(PsError::message(
                what(),
                "this job does not clip (train.max_grad_norm is not set)",
            ));
        };
        if self.awaiting.as_ref().map(|a| a.mean.step) != Some(norm.step) {
            if let Some(applied) = self.applied_norms.get(&norm.step) {
                if *applied != norm.square_sum {
                    return Err(PsError::message(
                        what(),
                        "differs from the sum the step was applied with: the workers disagree on the global norm",
                    ));
                }
            }
            return Ok(false);
        }
        let Some(AwaitingNorm { mut mean, part }) = self.awaiting.take() else {
            return Ok(false);
        };
        if !covers(&total, &part) {
            let back = AwaitingNorm { mean, part };
            self.awaiting = Some(back);
            return Err(PsError::message(
                what(),
                "is smaller than this server's own part of it",
            ));
        }
        clip_mean(clip, &total, &mut mean)?;
        self.applied_norms
            .insert(norm.step, norm.square_sum.clone());
        while self.applied_norms.len() > KEPT_NORMS {
            self.applied_norms.pop_first();
        }
        self.finish_step(mean)?;
        self.complete_steps()?;
        Ok(true)
    }

    /// The step this server waits for the global norm of, and its part of the square sum.
    pub(super) fn awaiting_norm(&self) -> Option<(u64, Vec<u8>)> {
        self.awaiting
            .as_ref()
            .map(|a| (a.mean.step, a.part.to_bytes()))
    }
}

/// Whether the total is at least the part (a sanity check on a worker's sum: the total adds
/// every server's non-negative part).
fn covers(total: &SquareSum, part: &SquareSum) -> bool {
    let (t, p) = (total.to_f64(), part.to_f64());
    t.is_nan() || t >= p
}

/// Clips `mean`'s gradients and rows by the global norm `sqrt(total)`, as data parallel's
/// clipping does (one factor, rounded once to f32); a norm at or below the limit (or not
/// finite) leaves them as they are.
fn clip_mean(clip: MaxGradNorm, total: &SquareSum, mean: &mut StepMean) -> Result<(), PsError> {
    let step = mean.step;
    let mut parts = Vec::with_capacity(mean.grads.len() + mean.sparse.len());
    for g in &mut mean.grads {
        parts.push(g.as_f32_mut().map_err(|e| {
            PsError::tensor(format!("clipping the mean gradient of step {step}"), e)
        })?);
    }
    for rows in &mut mean.sparse {
        parts.push(rows.values.as_mut_slice());
    }
    clip.clip_slices_by(total, &mut parts);
    Ok(())
}
