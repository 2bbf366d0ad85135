//! The working memory of one rank's ring attention call: the blocks it holds while the ring
//! runs, beside the step's own operands and results.
//!
//! `exec::ring` allocates exactly these buffers once per call (and reports what it allocated);
//! the memory prediction ([`crate::memory::predict`]) counts them as communication memory for
//! the step's duration. Messages in flight are not counted, as for reshards. In elements of the
//! operands' type, with `W` a block of queries (`slices · rows · head_dim`), `K` the largest
//! block of keys any member holds, `N` a block of one-wide rows (`slices · rows`) and `S` the
//! whole sequence:
//! - forward: the placed queries (whose slot then stages the output), the held keys and
//!   values, the online-softmax state per query chunk (`W + 2N`) and the staged `lse`:
//!   `2W + 2K + 3N`;
//! - backward: the placed queries, output gradients and query gradients, the held keys,
//!   values and their gradient accumulators, `lse`, `delta` and the placed `delta`:
//!   `3W + 4K + 3N`;
//! - deterministic mode (the operands gathered whole, one staging block `K`): forward the whole
//!   keys and values, `2·S + K`; backward the whole queries, keys, values, output gradients
//!   and the three gradients one device's kernel writes for them (`7·S`), the whole `lse` and
//!   `delta` (`2·S / head_dim`), this rank's `delta` and the staging block: `7S + 2S/d + N + K`.
//!
//! Half-precision (`bf16`, `f16`) operands are attended in `f32`, as one device's kernel
//! attends them: the blocks above are `f32` ([`ring_element_bytes`]), and the call also holds
//! an `f32` copy of every half operand and result of the step (`exec::ring`'s `half` module).

use crate::lower::{KernelStep, Program};
use crate::ring::{ring_of_step, Ring};
use graph::Op;
use tensor::DType;

/// How one ring attention call runs, for its working memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingCall {
    /// Batch × heads slices of every operand.
    pub slices: usize,
    /// Elements of a row.
    pub head_dim: usize,
    /// The forward pass (else the backward).
    pub forward: bool,
    /// Deterministic mode: the operands gathered whole.
    pub canonical: bool,
}

impl RingCall {
    /// Elements of the buffers this rank's call holds (see the module's doc).
    pub fn workspace_elements(&self, ring: &Ring) -> usize {
        let (s, d) = (self.slices, self.head_dim);
        let rows = ring.lengths[ring.position];
        let (w, n) = (s * rows * d, s * rows);
        let k = s * ring.lengths.iter().copied().max().unwrap_or(0) * d;
        let whole = s * ring.lengths.iter().sum::<usize>();
        match (self.forward, self.canonical) {
            (true, false) => 2 * w + 2 * k + 3 * n,
            (false, false) => 3 * w + 4 * k + 3 * n,
            (true, true) => 2 * whole * d + k,
            (false, true) => 7 * whole * d + 2 * whole + n + k,
        }
    }
}

/// Bytes an element of a ring's blocks takes for operands of `dtype`: half-precision operands
/// travel and are attended in `f32`.
pub fn ring_element_bytes(dtype: DType) -> usize {
    if dtype.is_half() {
        DType::F32.size_in_bytes()
    } else {
        dtype.size_in_bytes()
    }
}

/// Bytes of the `f32` copies `rank`'s call of ring step `k` makes of the step's half-precision
/// operands and results.
fn widened_bytes(program: &Program, k: &KernelStep, rank: usize) -> usize {
    k.inputs
        .iter()
        .chain(&k.outputs)
        .map(|&b| &program.buffers[b])
        .filter(|b| b.dtype.is_half())
        .map(|b| b.local_shape(rank).iter().product::<usize>() * DType::F32.size_in_bytes())
        .sum()
}

/// Bytes of the working buffers `rank` holds while it runs kernel step `k` of `program`, when
/// the step is ring attention and `rank` takes part.
pub fn ring_workspace_bytes(program: &Program, k: &KernelStep, rank: usize) -> Option<usize> {
    let ring = ring_of_step(program, k, rank)?;
    let q = &program.buffers[k.inputs[0]];
    Some(
        ring_call(program, k, &q.local_shape(rank))?.workspace_elements(&ring)
            * ring_element_bytes(q.dtype)
            + widened_bytes(program, k, rank),
    )
}

/// The most bytes of working buffers any rank holds while it runs kernel step `k` of
/// `program`, when the step is ring attention (what `--explain` prints). Every ring has the
/// same members' lengths (the sequence's split), so one ring's lengths and each rank's own
/// block give every rank's bytes without building every rank's ring.
pub fn ring_workspace_bytes_max(program: &Program, k: &KernelStep) -> Option<usize> {
    let q = &program.buffers[*k.inputs.first()?];
    let layout = q.layout.layout();
    let mesh = layout.mesh();
    let ring = ring_of_step(program, k, mesh.device_of_slot(0))?;
    let seq = layout.shape().len().checked_sub(2)?;
    (0..mesh.n_slots())
        .filter_map(|slot| {
            let rank = mesh.device_of_slot(slot);
            let call = ring_call(program, k, &q.local_shape(rank))?;
            let at = Ring {
                position: layout.block_index(slot)[seq],
                ..ring.clone()
            };
            Some(
                call.workspace_elements(&at) * ring_element_bytes(q.dtype)
                    + widened_bytes(program, k, rank),
            )
        })
        .max()
}

/// The call of ring step `k` on a rank whose queries' block is `q_shape`
/// (`[..., seq, head_dim]`).
fn ring_call(program: &Program, k: &KernelStep, q_shape: &[usize]) -> Option<RingCall> {
    let (&head_dim, rest) = q_shape.split_last()?;
    Some(RingCall {
        slices: rest.split_last().map_or(1, |(_, b)| b.iter().product()),
        head_dim,
        forward: matches!(k.op, Op::FlashAttention { .. }),
        canonical: program.placed.config.deterministic,
    })
}
