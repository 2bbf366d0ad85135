//! Ring attention (context parallel, `parallel.context_parallel_algo = "ring"`): a
//! `FlashAttention` (or its gradient) whose sequence dim is split over a ring of ranks.
//!
//! Every member holds one block of the queries and one block of the keys and values (the same
//! positions). Under the causal mask the ring attends in the zigzag placement
//! ([`parallel::ring::Zigzag`]) when the blocks have one even length: the sequence is cut into
//! `2n` chunks and member `i` attends with chunks `i` and `2n − 1 − i` (moved there from their
//! owners before the passes, and the results moved back after), so every member does the same
//! work at every pass; otherwise each member attends with its own block.
//!
//! Forward: the key/value chunks travel around the ring — each member sends the chunks it holds
//! to the next member, attends its query chunks to them (an [`tensor::kernels::AttentionState`]
//! per query chunk accumulates them with the online softmax, the causal mask given by global
//! positions, and pairs the mask hides wholly are skipped), and receives the next member's
//! chunks from the previous one into the same buffers (a chunk is copied into its message when
//! sent); after `n − 1` passes every query has seen every key. The sends are posted before the
//! computation, so the pass overlaps it. Backward: the chunks travel the same way with their
//! `dk`/`dv` accumulators; each member adds its queries' contribution to the chunks it holds,
//! and `dq` stays home. After `n` passes every accumulator is back with the member holding its
//! chunk. A call allocates its working buffers once, counted by its link
//! ([`RingTiming::workspace_bytes`], predicted by [`parallel::ring::RingCall`]).
//!
//! The members of a ring are the ranks holding the same batch/heads block in the same replica,
//! ordered by their sequence block ([`Ring::of`]). Chunks are attended in arrival order (own
//! first), so the result equals one device's to rounding, not bitwise. In deterministic mode
//! (`RingAttention::canonical`) the passes gather the operands whole instead and each rank
//! calls one device's kernel (its queries against all keys; backward also all queries against
//! its keys), which is bitwise one device's.

mod canonical;
mod half;
mod link;
mod placement;

use comm::{Communicator, Tag, MAX_TAG};
pub use parallel::ring::Ring;
use tensor::kernels::{
    attention_backward_block_accumulate, attention_delta_into, AttentionDims, AttentionGradBuffers,
    AttentionParams, AttentionState, BlockGradInputs, Float,
};
use tensor::{DType, Element, Tensor};

use crate::error::ExecError;
use canonical::{backward_canonical, forward_canonical};
use link::Link;
pub use link::{RingSpan, RingTiming};
use placement::{chunk_ranges, from_placement, to_placement, Chunk, Placement, Rows};

/// The message tag of the ring run by step `step`.
pub(crate) fn ring_tag(step: usize) -> Result<Tag, ExecError> {
    Tag::try_from(step)
        .ok()
        .filter(|&t| t <= MAX_TAG)
        .ok_or_else(|| ExecError::Mismatch {
            what: "a ring attention step".to_string(),
            expected: format!("a step index of at most {MAX_TAG} (one message tag per step)"),
            got: step.to_string(),
        })
}

/// The attention call's sizes and mask.
struct Call {
    slices: usize,
    head_dim: usize,
    causal: bool,
    scale: f64,
}

impl Call {
    fn of(q: &Tensor, causal: bool, scale: f64) -> Result<Call, ExecError> {
        let shape = q.shape();
        if shape.len() < 2 {
            return Err(ExecError::Mismatch {
                what: "ring attention's q".to_string(),
                expected: "at least 2 dims ([..., seq, head_dim])".to_string(),
                got: format!("{shape:?}"),
            });
        }
        let r = shape.len();
        Ok(Call {
            slices: shape[..r - 2].iter().product(),
            head_dim: shape[r - 1],
            causal,
            scale,
        })
    }

    fn dims(&self, q: Chunk, kv: Chunk) -> AttentionDims {
        AttentionDims {
            slices: self.slices,
            q_len: q.len,
            kv_len: kv.len,
            head_dim: self.head_dim,
        }
    }

    fn params<T: Float>(&self, q: Chunk, kv: Chunk) -> AttentionParams<T> {
        AttentionParams {
            causal: self.causal,
            scale: T::from_f64(self.scale),
            q_offset: q.offset,
            k_offset: kv.offset,
        }
    }

    /// The operands' row shapes: `head_dim`-wide (q, k, v, out and their gradients) and
    /// one-wide (lse, delta).
    fn rows(&self) -> (Rows, Rows) {
        let wide = Rows {
            slices: self.slices,
            width: self.head_dim,
        };
        (wide, Rows { width: 1, ..wide })
    }

    /// Whether any query of chunk `q` sees a key of chunk `kv`.
    fn sees(&self, q: Chunk, kv: Chunk) -> bool {
        !self.causal || kv.offset < q.offset + q.len
    }
}

fn unsupported(dtype: DType) -> ExecError {
    ExecError::Mismatch {
        what: "ring attention's operands".to_string(),
        expected: "a float type".to_string(),
        got: format!("{dtype:?}"),
    }
}

/// How a ring step attends: its mask and scale, and whether in deterministic mode's canonical
/// order (the operands gathered whole and attended as one device does).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingAttention {
    /// The causal mask.
    pub causal: bool,
    /// The scores' factor.
    pub scale: f64,
    /// Deterministic mode: one device's order.
    pub canonical: bool,
}

/// Ring attention's forward: `out` and `lse` of this rank's queries over every member's keys;
/// the time spent waiting for blocks.
pub(crate) fn forward(
    comm: &dyn Communicator,
    ring: &Ring,
    tag: Tag,
    how: RingAttention,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (out, lse): (&mut Tensor, &mut Tensor),
) -> Result<RingTiming, ExecError> {
    let call = Call::of(q, how.causal, how.scale)?;
    let link = Link::of(comm, ring, tag);
    let attend =
        |[q, k, v]: [&Tensor; 3], [out, lse]: [&mut Tensor; 2]| match (q.dtype(), how.canonical) {
            (DType::F32, true) => forward_canonical::<f32>(&link, &call, (q, k, v), (out, lse)),
            (DType::F64, true) => forward_canonical::<f64>(&link, &call, (q, k, v), (out, lse)),
            (DType::F32, false) => forward_typed::<f32>(&link, &call, (q, k, v), (out, lse)),
            (DType::F64, false) => forward_typed::<f64>(&link, &call, (q, k, v), (out, lse)),
            (other, _) => Err(unsupported(other)),
        };
    if q.dtype().is_half() {
        half::in_f32(&link, [q, k, v], [out, lse], attend)?;
    } else {
        attend([q, k, v], [out, lse])?;
    }
    Ok(link.into_timing())
}

/// A buffer one ring call holds a block of keys (or values, or their gradients) in, or stages
/// every member's block through: room for the largest block of any member.
fn held_block<T: Element>(link: &Link<'_>, call: &Call) -> Vec<T> {
    let rows = link.ring.lengths.iter().copied().max().unwrap_or(0);
    link.alloc(call.slices * rows * call.head_dim)
}

fn forward_typed<T: Element + Float>(
    link: &Link<'_>,
    call: &Call,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (out, lse): (&mut Tensor, &mut Tensor),
) -> Result<(), ExecError> {
    let ring = link.ring;
    let placement = Placement::of(ring, call.causal);
    let (wide, narrow) = call.rows();
    let mine = placement.chunks(ring, ring.position);
    let (q_parts, lse_parts) = (chunk_ranges(wide, &mine), chunk_ranges(narrow, &mine));
    // The placed queries' slot stages the output once the passes are done.
    let mut qs = link.alloc::<T>(q.n_elements());
    to_placement(link, &placement, wide, q.as_slice::<T>()?, &mut qs)?;
    let (mut ks, mut vs) = (held_block::<T>(link, call), held_block::<T>(link, call));
    to_placement(link, &placement, wide, k.as_slice::<T>()?, &mut ks)?;
    to_placement(link, &placement, wide, v.as_slice::<T>()?, &mut vs)?;
    let mut states = mine
        .iter()
        .map(|c| AttentionState::<T>::new(call.slices, c.len, call.head_dim))
        .collect::<Result<Vec<_>, _>>()?;
    states
        .iter()
        .for_each(|s| link.count::<T>(s.held_elements()));
    let mut lses = link.alloc::<T>(lse.n_elements());
    let n = ring.n();
    for t in 0..n {
        link.pass.set(t);
        let theirs = placement.chunks(ring, ring.held_after(t));
        let k_parts = chunk_ranges(wide, &theirs);
        if t + 1 < n {
            link.pass_on(&ks, &k_parts)?;
            link.pass_on(&vs, &k_parts)?;
        }
        link.attend(|| -> Result<(), ExecError> {
            for (a, &qc) in mine.iter().enumerate() {
                for (b, &kc) in theirs.iter().enumerate() {
                    if call.sees(qc, kc) {
                        let (qa, kb) = (q_parts[a].clone(), k_parts[b].clone());
                        let kv = (&qs[qa], &ks[kb.clone()], &vs[kb]);
                        states[a].accumulate(kv, kc.len, call.params::<T>(qc, kc))?;
                    }
                }
            }
            Ok(())
        })?;
        if t + 1 < n {
            let next = chunk_ranges(wide, &placement.chunks(ring, ring.held_after(t + 1)));
            link.receive(&mut ks, &next)?;
            link.receive(&mut vs, &next)?;
        }
    }
    for ((state, qa), la) in states.iter().zip(&q_parts).zip(&lse_parts) {
        state.finish_into(&mut qs[qa.clone()], &mut lses[la.clone()])?;
    }
    from_placement(link, &placement, wide, &mut qs, out.as_slice_mut::<T>()?)?;
    from_placement(
        link,
        &placement,
        narrow,
        &mut lses,
        lse.as_slice_mut::<T>()?,
    )?;
    Ok(())
}

/// Ring attention's backward: `dq`, `dk`, `dv` of this rank's blocks from the forward's
/// `out`, `lse` and the output's gradient `dout`; the time spent waiting for blocks.
pub(crate) fn backward(
    comm: &dyn Communicator,
    ring: &Ring,
    tag: Tag,
    how: RingAttention,
    inputs: [&Tensor; 6],
    grads: [&mut Tensor; 3],
) -> Result<RingTiming, ExecError> {
    let call = Call::of(inputs[0], how.causal, how.scale)?;
    let link = Link::of(comm, ring, tag);
    let attend =
        |inputs: [&Tensor; 6], grads: [&mut Tensor; 3]| match (inputs[0].dtype(), how.canonical) {
            (DType::F32, true) => backward_canonical::<f32>(&link, &call, inputs, grads),
            (DType::F64, true) => backward_canonical::<f64>(&link, &call, inputs, grads),
            (DType::F32, false) => backward_typed::<f32>(&link, &call, inputs, grads),
            (DType::F64, false) => backward_typed::<f64>(&link, &call, inputs, grads),
            (other, _) => Err(unsupported(other)),
        };
    if inputs[0].dtype().is_half() {
        half::in_f32(&link, inputs, grads, attend)?;
    } else {
        attend(inputs, grads)?;
    }
    Ok(link.into_timing())
}

fn backward_typed<T: Element + Float>(
    link: &Link<'_>,
    call: &Call,
    [q, k, v, out, lse, dout]: [&Tensor; 6],
    [dq, dk, dv]: [&mut Tensor; 3],
) -> Result<(), ExecError> {
    let ring = link.ring;
    let placement = Placement::of(ring, call.causal);
    let (wide, narrow) = call.rows();
    let mut delta = link.alloc::<T>(lse.n_elements());
    attention_delta_into(
        out.as_slice::<T>()?,
        dout.as_slice::<T>()?,
        call.head_dim,
        &mut delta,
    )?;
    let mine = placement.chunks(ring, ring.position);
    let (q_parts, row_parts) = (chunk_ranges(wide, &mine), chunk_ranges(narrow, &mine));
    let place = |rows: Rows, data: &[T]| -> Result<Vec<T>, ExecError> {
        let mut slot = link.alloc::<T>(data.len());
        to_placement(link, &placement, rows, data, &mut slot)?;
        Ok(slot)
    };
    let (qs, douts) = (
        place(wide, q.as_slice::<T>()?)?,
        place(wide, dout.as_slice::<T>()?)?,
    );
    let (lses, deltas) = (place(narrow, lse.as_slice::<T>()?)?, place(narrow, &delta)?);
    // The blocks held: their keys and values, and their accumulated key and value gradients.
    let (mut ks, mut vs) = (held_block::<T>(link, call), held_block::<T>(link, call));
    to_placement(link, &placement, wide, k.as_slice::<T>()?, &mut ks)?;
    to_placement(link, &placement, wide, v.as_slice::<T>()?, &mut vs)?;
    let (mut dks, mut dvs) = (held_block::<T>(link, call), held_block::<T>(link, call));
    let mut dqs = link.alloc::<T>(q.n_elements());
    let n = ring.n();
    for t in 0..n {
        link.pass.set(t);
        let theirs = placement.chunks(ring, ring.held_after(t));
        let k_parts = chunk_ranges(wide, &theirs);
        if t + 1 < n {
            // The keys and values go on at once; their gradients after this member's part.
            link.pass_on(&ks, &k_parts)?;
            link.pass_on(&vs, &k_parts)?;
        }
        link.attend(|| -> Result<(), ExecError> {
            for (a, &qc) in mine.iter().enumerate() {
                for (b, &kc) in theirs.iter().enumerate() {
                    if !call.sees(qc, kc) {
                        continue;
                    }
                    let (qa, kb, ra) =
                        (q_parts[a].clone(), k_parts[b].clone(), row_parts[a].clone());
                    let input = BlockGradInputs {
                        q: &qs[qa.clone()],
                        k: &ks[kb.clone()],
                        v: &vs[kb.clone()],
                        dout: &douts[qa.clone()],
                        lse: &lses[ra.clone()],
                        delta: &deltas[ra],
                    };
                    // The held chunk's accumulators take this member's part in place.
                    let grads = AttentionGradBuffers {
                        dq: &mut dqs[qa],
                        dk: &mut dks[kb.clone()],
                        dv: &mut dvs[kb],
                    };
                    attention_backward_block_accumulate(
                        input,
                        call.dims(qc, kc),
                        call.params::<T>(qc, kc),
                        grads,
                    )?;
                }
            }
            Ok(())
        })?;
        link.pass_on(&dks, &k_parts)?;
        link.pass_on(&dvs, &k_parts)?;
        // After n passes the accumulators of this rank's own chunks are back.
        let next = chunk_ranges(wide, &placement.chunks(ring, ring.held_after(t + 1)));
        if t + 1 < n {
            link.receive(&mut ks, &next)?;
            link.receive(&mut vs, &next)?;
        }
        link.receive(&mut dks, &next)?;
        link.receive(&mut dvs, &next)?;
    }
    from_placement(link, &placement, wide, &mut dqs, dq.as_slice_mut::<T>()?)?;
    from_placement(link, &placement, wide, &mut dks, dk.as_slice_mut::<T>()?)?;
    from_placement(link, &placement, wide, &mut dvs, dv.as_slice_mut::<T>()?)?;
    Ok(())
}

#[cfg(test)]
mod tests;
