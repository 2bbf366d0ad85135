//! Deterministic mode's ring step: the operands gathered whole in sequence order, then one
//! device's kernel called on them, so every sum runs in one device's order.

use tensor::kernels::{
    attention_backward_block, attention_delta_into, flash_attention_into, AttentionDims,
    AttentionGradBuffers, AttentionParams, BlockGradInputs, Float,
};
use tensor::{Element, Tensor};

use super::link::Link;
use super::placement::{Chunk, Rows};
use super::{held_block, Call, Ring};
use crate::error::ExecError;

/// Deterministic mode: every member's block of an operand (`rows`-shaped), passed around the
/// ring `n − 1` times through `staging` (room for the largest block) and assembled in sequence
/// order: `[slices, Σ lengths, width]`.
fn gather_blocks<T: Element>(
    link: &Link<'_>,
    rows: Rows,
    own: &[T],
    staging: &mut [T],
) -> Result<Vec<T>, ExecError> {
    let ring = link.ring;
    let (n, total) = (ring.n(), ring.lengths.iter().sum::<usize>());
    let block = |j: usize| 0..rows.slices * ring.lengths[j] * rows.width;
    let mut whole = link.alloc::<T>(rows.slices * total * rows.width);
    staging[..own.len()].copy_from_slice(own);
    for t in 0..n {
        link.pass.set(t);
        let j = ring.held_after(t);
        let held = block(j);
        if t + 1 < n {
            link.pass_on(staging, std::slice::from_ref(&held))?;
        }
        rows.put(
            &mut whole,
            total,
            ring.offsets[j] - ring.offsets[0],
            &staging[held],
        );
        if t + 1 < n {
            let next = block(ring.held_after(t + 1));
            link.receive(staging, std::slice::from_ref(&next))?;
        }
    }
    Ok(whole)
}

/// The attention dims and mask of this rank's queries against the whole sequence's keys
/// (`keys_whole`), or the whole sequence's queries against this rank's keys.
fn canonical_call<T: Float>(
    call: &Call,
    ring: &Ring,
    keys_whole: bool,
) -> (AttentionDims, AttentionParams<T>) {
    let total = ring.lengths.iter().sum::<usize>();
    let (own, base) = (
        Chunk {
            offset: ring.offsets[ring.position],
            len: ring.lengths[ring.position],
        },
        Chunk {
            offset: ring.offsets[0],
            len: total,
        },
    );
    let (q, kv) = if keys_whole { (own, base) } else { (base, own) };
    (call.dims(q, kv), call.params(q, kv))
}

/// Deterministic mode's forward: the keys and values gathered whole, then this rank's queries
/// attended over them in one call of one device's kernel, so every row adds the same tiles in
/// the same order as on one device.
pub(super) fn forward_canonical<T: Element + Float>(
    link: &Link<'_>,
    call: &Call,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (out, lse): (&mut Tensor, &mut Tensor),
) -> Result<(), ExecError> {
    let (wide, _) = call.rows();
    let mut staging = held_block::<T>(link, call);
    let keys = gather_blocks(link, wide, k.as_slice::<T>()?, &mut staging)?;
    let values = gather_blocks(link, wide, v.as_slice::<T>()?, &mut staging)?;
    let (dims, params) = canonical_call::<T>(call, link.ring, true);
    link.attend(|| {
        flash_attention_into(
            (q.as_slice::<T>()?, &keys, &values),
            dims,
            params,
            out.as_slice_mut::<T>()?,
            lse.as_slice_mut::<T>()?,
        )
        .map_err(ExecError::from)
    })
}

/// Deterministic mode's backward: every operand gathered whole; `dq` from this rank's queries
/// against every key, and `dk`, `dv` from every query against this rank's keys, each in one call
/// of one device's kernel (so each sum runs over the same tiles in the same order as on one
/// device; the other gradients of each call are not needed).
pub(super) fn backward_canonical<T: Element + Float>(
    link: &Link<'_>,
    call: &Call,
    [q, k, v, out, lse, dout]: [&Tensor; 6],
    [dq, dk, dv]: [&mut Tensor; 3],
) -> Result<(), ExecError> {
    let (wide, narrow) = call.rows();
    let (q_own, dout_own, lse_own) = (
        q.as_slice::<T>()?,
        dout.as_slice::<T>()?,
        lse.as_slice::<T>()?,
    );
    let (k_own, v_own) = (k.as_slice::<T>()?, v.as_slice::<T>()?);
    let mut delta = link.alloc::<T>(lse_own.len());
    attention_delta_into(out.as_slice::<T>()?, dout_own, call.head_dim, &mut delta)?;
    let mut staging = held_block::<T>(link, call);
    let mut gather = |rows: Rows, own: &[T]| gather_blocks(link, rows, own, &mut staging);
    let (keys, values) = (gather(wide, k_own)?, gather(wide, v_own)?);
    let (queries, douts) = (gather(wide, q_own)?, gather(wide, dout_own)?);
    let (lses, deltas) = (gather(narrow, lse_own)?, gather(narrow, &delta)?);
    link.attend(|| -> Result<(), ExecError> {
        let (dims, params) = canonical_call::<T>(call, link.ring, true);
        let dq = dq.as_slice_mut::<T>()?;
        dq.fill(T::ZERO);
        let (mut dk_unused, mut dv_unused) =
            (link.alloc::<T>(keys.len()), link.alloc::<T>(keys.len()));
        let input = BlockGradInputs {
            q: q_own,
            k: &keys,
            v: &values,
            dout: dout_own,
            lse: lse_own,
            delta: &delta,
        };
        let grads = AttentionGradBuffers {
            dq,
            dk: &mut dk_unused,
            dv: &mut dv_unused,
        };
        attention_backward_block(input, dims, params, grads)?;
        let (dims, params) = canonical_call::<T>(call, link.ring, false);
        let mut dq_unused = link.alloc::<T>(queries.len());
        let input = BlockGradInputs {
            q: &queries,
            k: k_own,
            v: v_own,
            dout: &douts,
            lse: &lses,
            delta: &deltas,
        };
        let grads = AttentionGradBuffers {
            dq: &mut dq_unused,
            dk: dk.as_slice_mut::<T>()?,
            dv: dv.as_slice_mut::<T>()?,
        };
        attention_backward_block(input, dims, params, grads)?;
        Ok(())
    })
}
