//! Ring attention (context parallel, `parallel.context_parallel_algo = "ring"`): a
//! `FlashAttention` (or its gradient) whose sequence dim is split over a ring of ranks.
//!
//! Every member holds one block of the queries and one block of the keys and values (the same
//! positions). Forward: the key/value blocks travel around the ring — each member sends the
//! block it holds to the next member, attends its queries to that block (an
//! [`tensor::kernels::AttentionState`] accumulates the blocks with the online softmax, the
//! causal mask given by global positions), and receives the next block from the previous
//! member; after `n − 1` passes every query block has seen every key block, and no member
//! ever holds more than two blocks. The send is posted before the computation, so the pass
//! overlaps it. Backward: the blocks travel the same way with their `dk`/`dv` accumulators;
//! each member adds its queries' contribution to the block it holds, and `dq` stays home.
//! After `n` passes every accumulator is back with its block's owner.
//!
//! The members of a ring are the ranks holding the same batch/heads block in the same replica,
//! ordered by their sequence block ([`Ring::of`]). Blocks are attended in arrival order
//! (own block first), so the result equals one device's to rounding, not bitwise.

use std::cell::Cell;
use std::time::{Duration, Instant};

use comm::{Communicator, Tag, MAX_TAG};
use layout::TensorLayout;
use tensor::kernels::{
    attention_backward_block, attention_delta_into, AttentionDims, AttentionGradBuffers,
    AttentionParams, AttentionState, BlockGradInputs, Float,
};
use tensor::{DType, Element, Tensor};

use crate::error::ExecError;

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

    fn next(&self) -> usize {
        self.members[(self.position + 1) % self.n()]
    }

    fn prev(&self) -> usize {
        self.members[(self.position + self.n() - 1) % self.n()]
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

/// The attention call's sizes and mask for this rank's queries against member `j`'s block.
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

    fn dims(&self, ring: &Ring, j: usize) -> AttentionDims {
        AttentionDims {
            slices: self.slices,
            q_len: ring.lengths[ring.position],
            kv_len: ring.lengths[j],
            head_dim: self.head_dim,
        }
    }

    fn params<T: Float>(&self, ring: &Ring, j: usize) -> AttentionParams<T> {
        AttentionParams {
            causal: self.causal,
            scale: T::from_f64(self.scale),
            q_offset: ring.offsets[ring.position],
            k_offset: ring.offsets[j],
        }
    }

    /// Elements of member `j`'s key (or value) block.
    fn block_len(&self, ring: &Ring, j: usize) -> usize {
        self.slices * ring.lengths[j] * self.head_dim
    }

    /// Whether any of this rank's queries sees a key of member `j`'s block.
    fn sees(&self, ring: &Ring, j: usize) -> bool {
        !self.causal || ring.offsets[j] < ring.offsets[ring.position] + ring.lengths[ring.position]
    }
}

fn unsupported(dtype: DType) -> ExecError {
    ExecError::Mismatch {
        what: "ring attention's operands".to_string(),
        expected: "f32 or f64 (mixed precision computes attention in f32)".to_string(),
        got: format!("{dtype:?}"),
    }
}

/// This rank's two neighbours on the ring, the step's message tag, and the time spent waiting
/// for blocks.
struct Link<'a> {
    comm: &'a dyn Communicator,
    next: usize,
    prev: usize,
    tag: Tag,
    waited: Cell<Duration>,
}

impl<'a> Link<'a> {
    fn of(comm: &'a dyn Communicator, ring: &Ring, tag: Tag) -> Link<'a> {
        Link {
            comm,
            next: ring.next(),
            prev: ring.prev(),
            tag,
            waited: Cell::new(Duration::ZERO),
        }
    }

    /// Sends each of `blocks` to the next member (posted, not waited for), one message each.
    fn pass_on<T: Element>(&self, blocks: &[&[T]]) -> Result<(), ExecError> {
        for block in blocks {
            self.comm
                .send_bytes(self.next, self.tag, bytemuck::cast_slice(block))?;
        }
        Ok(())
    }

    /// Receives the next message from the previous member: `count` elements of `T`.
    fn receive<T: Element>(&self, count: usize) -> Result<Vec<T>, ExecError> {
        let started = Instant::now();
        let bytes = self.comm.recv_bytes(self.prev, self.tag)?;
        self.waited.set(self.waited.get() + started.elapsed());
        let expected = count * std::mem::size_of::<T>();
        if bytes.len() != expected {
            return Err(ExecError::Mismatch {
                what: format!("a ring attention message from rank {}", self.prev),
                expected: format!("{expected} bytes"),
                got: format!("{} bytes", bytes.len()),
            });
        }
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}

/// Ring attention's forward: `out` and `lse` of this rank's queries over every member's keys;
/// the time spent waiting for blocks.
pub(crate) fn forward(
    comm: &dyn Communicator,
    ring: &Ring,
    tag: Tag,
    (causal, scale): (bool, f64),
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (out, lse): (&mut Tensor, &mut Tensor),
) -> Result<Duration, ExecError> {
    match q.dtype() {
        DType::F32 => forward_typed::<f32>(comm, ring, tag, (causal, scale), (q, k, v), (out, lse)),
        DType::F64 => forward_typed::<f64>(comm, ring, tag, (causal, scale), (q, k, v), (out, lse)),
        other => Err(unsupported(other)),
    }
}

fn forward_typed<T: Element + Float>(
    comm: &dyn Communicator,
    ring: &Ring,
    tag: Tag,
    (causal, scale): (bool, f64),
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (out, lse): (&mut Tensor, &mut Tensor),
) -> Result<Duration, ExecError> {
    let call = Call::of(q, causal, scale)?;
    let q_rows = q.as_slice::<T>()?;
    let mut state =
        AttentionState::<T>::new(call.slices, ring.lengths[ring.position], call.head_dim)?;
    let mut held: (Vec<T>, Vec<T>) = (k.as_slice::<T>()?.to_vec(), v.as_slice::<T>()?.to_vec());
    let link = Link::of(comm, ring, tag);
    let n = ring.n();
    for t in 0..n {
        let j = ring.held_after(t);
        if t + 1 < n {
            link.pass_on(&[&held.0, &held.1])?;
        }
        if call.sees(ring, j) {
            let kv = (q_rows, held.0.as_slice(), held.1.as_slice());
            state.accumulate(kv, ring.lengths[j], call.params::<T>(ring, j))?;
        }
        if t + 1 < n {
            let count = call.block_len(ring, ring.held_after(t + 1));
            held = (link.receive::<T>(count)?, link.receive::<T>(count)?);
        }
    }
    state.finish_into(out.as_slice_mut::<T>()?, lse.as_slice_mut::<T>()?)?;
    Ok(link.waited.get())
}

/// Ring attention's backward: `dq`, `dk`, `dv` of this rank's blocks from the forward's
/// `out`, `lse` and the output's gradient `dout`; the time spent waiting for blocks.
pub(crate) fn backward(
    comm: &dyn Communicator,
    ring: &Ring,
    tag: Tag,
    (causal, scale): (bool, f64),
    inputs: [&Tensor; 6],
    grads: [&mut Tensor; 3],
) -> Result<Duration, ExecError> {
    match inputs[0].dtype() {
        DType::F32 => backward_typed::<f32>(comm, ring, tag, (causal, scale), inputs, grads),
        DType::F64 => backward_typed::<f64>(comm, ring, tag, (causal, scale), inputs, grads),
        other => Err(unsupported(other)),
    }
}

fn backward_typed<T: Element + Float>(
    comm: &dyn Communicator,
    ring: &Ring,
    tag: Tag,
    (causal, scale): (bool, f64),
    [q, k, v, out, lse, dout]: [&Tensor; 6],
    [dq, dk, dv]: [&mut Tensor; 3],
) -> Result<Duration, ExecError> {
    let call = Call::of(q, causal, scale)?;
    let (q_rows, lse_rows, dout_rows) = (
        q.as_slice::<T>()?,
        lse.as_slice::<T>()?,
        dout.as_slice::<T>()?,
    );
    let mut delta = vec![T::ZERO; lse_rows.len()];
    attention_delta_into(out.as_slice::<T>()?, dout_rows, call.head_dim, &mut delta)?;
    let dq = dq.as_slice_mut::<T>()?;
    dq.fill(T::ZERO);
    // The block held, its keys and values, and its accumulated key and value gradients.
    let own = k.n_elements();
    let mut held = (
        k.as_slice::<T>()?.to_vec(),
        v.as_slice::<T>()?.to_vec(),
        vec![T::ZERO; own],
        vec![T::ZERO; own],
    );
    let link = Link::of(comm, ring, tag);
    let n = ring.n();
    for t in 0..n {
        let j = ring.held_after(t);
        if t + 1 < n {
            // The keys and values go on at once; their gradients after this member's part.
            link.pass_on(&[&held.0, &held.1])?;
        }
        if call.sees(ring, j) {
            let len = held.0.len();
            let (mut dk_part, mut dv_part) = (vec![T::ZERO; len], vec![T::ZERO; len]);
            let input = BlockGradInputs {
                q: q_rows,
                k: &held.0,
                v: &held.1,
                dout: dout_rows,
                lse: lse_rows,
                delta: &delta,
            };
            let grads = AttentionGradBuffers {
                dq: &mut dq[..],
                dk: &mut dk_part,
                dv: &mut dv_part,
            };
            attention_backward_block(input, call.dims(ring, j), call.params::<T>(ring, j), grads)?;
            add_into(&mut held.2, &dk_part);
            add_into(&mut held.3, &dv_part);
        }
        link.pass_on(&[&held.2, &held.3])?;
        let count = call.block_len(ring, ring.held_after(t + 1));
        if t + 1 < n {
            let (k_next, v_next) = (link.receive::<T>(count)?, link.receive::<T>(count)?);
            held = (
                k_next,
                v_next,
                link.receive::<T>(count)?,
                link.receive::<T>(count)?,
            );
        } else {
            // After n passes the accumulators of this rank's own block are back.
            dk.as_slice_mut::<T>()?
                .copy_from_slice(&link.receive::<T>(count)?);
            dv.as_slice_mut::<T>()?
                .copy_from_slice(&link.receive::<T>(count)?);
        }
    }
    Ok(link.waited.get())
}

fn add_into<T: Float>(acc: &mut [T], part: &[T]) {
    for (a, &p) in acc.iter_mut().zip(part) {
        *a += p;
    }
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
