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
//! chunks from the previous one; after `n − 1` passes every query has seen every key, and no
//! member ever holds more than two sets of chunks. The sends are posted before the computation,
//! so the pass overlaps it. Backward: the chunks travel the same way with their `dk`/`dv`
//! accumulators; each member adds its queries' contribution to the chunks it holds, and `dq`
//! stays home. After `n` passes every accumulator is back with the member holding its chunk.
//!
//! The members of a ring are the ranks holding the same batch/heads block in the same replica,
//! ordered by their sequence block ([`Ring::of`]). Chunks are attended in arrival order (own
//! first), so the result equals one device's to rounding, not bitwise. In deterministic mode
//! (`RingAttention::canonical`) the passes gather the operands whole instead and each rank
//! calls one device's kernel (its queries against all keys; backward also all queries against
//! its keys), which is bitwise one device's.

mod canonical;
mod link;
mod placement;

use comm::{Communicator, Tag, MAX_TAG};
use layout::TensorLayout;
use tensor::kernels::{
    attention_backward_block_accumulate, attention_delta_into, AttentionDims, AttentionGradBuffers,
    AttentionParams, AttentionState, BlockGradInputs, Float,
};
use tensor::{DType, Element, Tensor};

use crate::error::ExecError;
use canonical::{backward_canonical, forward_canonical};
use link::Link;
pub use link::{RingSpan, RingTiming};
use placement::{from_placement, to_placement, Chunk, Placement, Rows};

/// One rank's ring: the members in sequence order, where their blocks start and how long
/// they are, and this rank's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// Device ranks, by sequence block.
    pub members: Vec<usize>,
    /// Global position of each member's first row.
    pub offsets: Vec<usize>,
    /// Rows of each member's block.
    pub lengths: Vec<usize>,
    /// This rank's index in `members`.
    pub position: usize,
}

impl Ring {
    /// The ring of `rank` for attention operands laid out as `layout` (`[..., seq, head_dim]`),
    /// or `None` when the sequence dim is not split (or `rank` holds no block).
    pub fn of(layout: &TensorLayout, rank: usize) -> Option<Ring> {
        let ndim = layout.shape().len();
        let seq = ndim.checked_sub(2)?;
        if layout.split_factors()[seq] <= 1 {
            return None;
        }
        let mesh = layout.mesh();
        let mine = mesh.slot_of_rank(rank)?;
        let (block, replica) = (layout.block_index(mine), layout.replica_index(mine));
        let mut members: Vec<(usize, usize, usize, usize)> = (0..mesh.n_slots())
            .filter(|&s| layout.replica_index(s) == replica)
            .filter_map(|s| {
                let b = layout.block_index(s);
                let same_rest = (0..ndim).all(|d| d == seq || b[d] == block[d]);
                let slot_box = layout.slot_box(s);
                same_rest.then(|| {
                    (
                        b[seq],
                        mesh.device_of_slot(s),
                        slot_box.offset[seq],
                        slot_box.shape[seq],
                    )
                })
            })
            .collect();
        members.sort();
        let position = members.iter().position(|m| m.0 == block[seq])?;
        Some(Ring {
            members: members.iter().map(|m| m.1).collect(),
            offsets: members.iter().map(|m| m.2).collect(),
            lengths: members.iter().map(|m| m.3).collect(),
            position,
        })
    }

    fn n(&self) -> usize {
        self.members.len()
    }

    /// The member whose block this rank holds after `t` passes.
    fn held_after(&self, t: usize) -> usize {
        (self.position + self.n() - t % self.n()) % self.n()
    }
}

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

    /// FlashAttention-2's `delta` of every query row (see [`attention_delta_into`]).
    fn delta<T: Element + Float>(&self, out: &Tensor, dout: &Tensor) -> Result<Vec<T>, ExecError> {
        let dout = dout.as_slice::<T>()?;
        let mut delta = vec![T::ZERO; dout.len() / self.head_dim.max(1)];
        attention_delta_into(out.as_slice::<T>()?, dout, self.head_dim, &mut delta)?;
        Ok(delta)
    }

    /// Elements of a chunk's keys (or values, or queries).
    fn rows_len(&self, chunk: Chunk) -> usize {
        self.slices * chunk.len * self.head_dim
    }

    /// Whether any query of chunk `q` sees a key of chunk `kv`.
    fn sees(&self, q: Chunk, kv: Chunk) -> bool {
        !self.causal || kv.offset < q.offset + q.len
    }
}

fn unsupported(dtype: DType) -> ExecError {
    ExecError::Mismatch {
        what: "ring attention's operands".to_string(),
        expected: "f32 or f64 (mixed precision computes attention in f32)".to_string(),
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
    match (q.dtype(), how.canonical) {
        (DType::F32, true) => forward_canonical::<f32>(&link, &call, (q, k, v), (out, lse))?,
        (DType::F64, true) => forward_canonical::<f64>(&link, &call, (q, k, v), (out, lse))?,
        (DType::F32, false) => forward_typed::<f32>(&link, &call, (q, k, v), (out, lse))?,
        (DType::F64, false) => forward_typed::<f64>(&link, &call, (q, k, v), (out, lse))?,
        (other, _) => return Err(unsupported(other)),
    }
    Ok(link.into_timing())
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
    let place = |t: &Tensor| to_placement(link, &placement, wide, t.as_slice::<T>()?);
    let (qs, ks, vs) = (place(q)?, place(k)?, place(v)?);
    let mine = placement.chunks(ring, ring.position);
    let mut states = mine
        .iter()
        .map(|c| AttentionState::<T>::new(call.slices, c.len, call.head_dim))
        .collect::<Result<Vec<_>, _>>()?;
    let mut held = (ks, vs);
    let n = ring.n();
    for t in 0..n {
        link.pass.set(t);
        let theirs = placement.chunks(ring, ring.held_after(t));
        if t + 1 < n {
            link.pass_on(&held.0)?;
            link.pass_on(&held.1)?;
        }
        link.attend(|| -> Result<(), ExecError> {
            for (a, &qc) in mine.iter().enumerate() {
                for (b, &kc) in theirs.iter().enumerate() {
                    if call.sees(qc, kc) {
                        let kv = (qs[a].as_slice(), held.0[b].as_slice(), held.1[b].as_slice());
                        states[a].accumulate(kv, kc.len, call.params::<T>(qc, kc))?;
                    }
                }
            }
            Ok(())
        })?;
        if t + 1 < n {
            let next = placement.chunks(ring, ring.held_after(t + 1));
            let counts: Vec<usize> = next.iter().map(|&c| call.rows_len(c)).collect();
            held = (link.receive(&counts)?, link.receive(&counts)?);
        }
    }
    let mut outs = Vec::with_capacity(mine.len());
    let mut lses = Vec::with_capacity(mine.len());
    for (state, c) in states.iter().zip(&mine) {
        let mut o = vec![T::ZERO; call.rows_len(*c)];
        let mut l = vec![T::ZERO; call.slices * c.len];
        state.finish_into(&mut o, &mut l)?;
        outs.push(o);
        lses.push(l);
    }
    from_placement(link, &placement, wide, outs, out.as_slice_mut::<T>()?)?;
    from_placement(link, &placement, narrow, lses, lse.as_slice_mut::<T>()?)?;
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
    match (inputs[0].dtype(), how.canonical) {
        (DType::F32, true) => backward_canonical::<f32>(&link, &call, inputs, grads)?,
        (DType::F64, true) => backward_canonical::<f64>(&link, &call, inputs, grads)?,
        (DType::F32, false) => backward_typed::<f32>(&link, &call, inputs, grads)?,
        (DType::F64, false) => backward_typed::<f64>(&link, &call, inputs, grads)?,
        (other, _) => return Err(unsupported(other)),
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
    let dout_rows = dout.as_slice::<T>()?;
    let delta = call.delta::<T>(out, dout)?;
    let place = |rows: Rows, data: &[T]| to_placement(link, &placement, rows, data);
    let (qs, douts) = (place(wide, q.as_slice::<T>()?)?, place(wide, dout_rows)?);
    let (lses, deltas) = (place(narrow, lse.as_slice::<T>()?)?, place(narrow, &delta)?);
    let (ks, vs) = (
        place(wide, k.as_slice::<T>()?)?,
        place(wide, v.as_slice::<T>()?)?,
    );
    let mine = placement.chunks(ring, ring.position);
    let mut dqs: Vec<Vec<T>> = qs.iter().map(|c| vec![T::ZERO; c.len()]).collect();
    // The blocks held: their keys and values, and their accumulated key and value gradients.
    let zeros = |chunks: &[Vec<T>]| -> Vec<Vec<T>> {
        chunks.iter().map(|c| vec![T::ZERO; c.len()]).collect()
    };
    let mut held = (zeros(&ks), zeros(&vs), ks, vs);
    let n = ring.n();
    for t in 0..n {
        link.pass.set(t);
        let theirs = placement.chunks(ring, ring.held_after(t));
        if t + 1 < n {
            // The keys and values go on at once; their gradients after this member's part.
            link.pass_on(&held.2)?;
            link.pass_on(&held.3)?;
        }
        link.attend(|| -> Result<(), ExecError> {
            for (a, &qc) in mine.iter().enumerate() {
                for (b, &kc) in theirs.iter().enumerate() {
                    if !call.sees(qc, kc) {
                        continue;
                    }
                    let input = BlockGradInputs {
                        q: &qs[a],
                        k: &held.2[b],
                        v: &held.3[b],
                        dout: &douts[a],
                        lse: &lses[a],
                        delta: &deltas[a],
                    };
                    // The held chunk's accumulators take this member's part in place.
                    let grads = AttentionGradBuffers {
                        dq: &mut dqs[a],
                        dk: &mut held.0[b],
                        dv: &mut held.1[b],
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
        link.pass_on(&held.0)?;
        link.pass_on(&held.1)?;
        let next = placement.chunks(ring, ring.held_after(t + 1));
        let counts: Vec<usize> = next.iter().map(|&c| call.rows_len(c)).collect();
        if t + 1 < n {
            let (k_next, v_next) = (link.receive(&counts)?, link.receive(&counts)?);
            held = (
                link.receive(&counts)?,
                link.receive(&counts)?,
                k_next,
                v_next,
            );
        } else {
            // After n passes the accumulators of this rank's own chunks are back.
            held.0 = link.receive(&counts)?;
            held.1 = link.receive(&counts)?;
        }
    }
    from_placement(link, &placement, wide, dqs, dq.as_slice_mut::<T>()?)?;
    from_placement(link, &placement, wide, held.0, dk.as_slice_mut::<T>()?)?;
    from_placement(link, &placement, wide, held.1, dv.as_slice_mut::<T>()?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use layout::Layout;

    #[test]
    fn a_ring_holds_the_ranks_of_one_batch_and_heads_block_in_sequence_order() {
        // [B, H, S, d] over (dp 2, cp 2, mp 2): heads over mp, sequence over cp.
        let base = Layout::new(&[2, 2, 2], &["dp", "cp", "mp"], None).unwrap();
        let layout = base
            .apply(&["dp".into(), "mp".into(), "cp".into(), "None".into()])
            .unwrap()
            .bind(&[4, 8, 16, 4])
            .unwrap();
        // Rank 5 = (dp 1, cp 0, mp 1): its ring partner is rank 7 = (dp 1, cp 1, mp 1).
        let ring = Ring::of(&layout, 5).unwrap();
        assert_eq!(ring.members, vec![5, 7]);
        assert_eq!(ring.offsets, vec![0, 8]);
        assert_eq!(ring.lengths, vec![8, 8]);
        assert_eq!(ring.position, 0);
        assert_eq!(Ring::of(&layout, 7).unwrap().position, 1);
        // Not split on the sequence: no ring.
        let whole = base
            .apply(&["dp".into(), "mp".into(), "None".into(), "None".into()])
            .unwrap()
            .bind(&[4, 8, 16, 4])
            .unwrap();
        assert_eq!(Ring::of(&whole, 5), None);
    }
}
