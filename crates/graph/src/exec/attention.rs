//! [`crate::Op::FlashAttention`] and its gradient on (local) tensors: the sizes from the shapes,
//! and the causal mask's global positions from where the blocks lie.

use tensor::kernels::{self, AttentionDims, AttentionParams, Float, RowSums};
use tensor::{Element, Tensor};

use crate::error::GraphError;
use crate::exec::eval::EvalCtx;
use crate::exec::operands::{checked_placement, min_rank, read, write};

/// The sizes of attention of `q [..., Sq, d]` over `k [..., Sk, d]` (shapes checked by
/// inference; the ranks checked here so that indexing is safe).
fn dims(q: &Tensor, k: &Tensor, ctx: &EvalCtx<'_>) -> Result<AttentionDims, GraphError> {
    min_rank(q, 2, "q", ctx)?;
    min_rank(k, 2, "k", ctx)?;
    let (qs, ks) = (q.shape(), k.shape());
    let r = qs.len();
    Ok(AttentionDims {
        slices: qs[..r - 2].iter().product(),
        q_len: qs[r - 2],
        kv_len: ks[ks.len() - 2],
        head_dim: qs[r - 1],
    })
}

/// The mask and scale, with the global positions of the first query row (the output's block,
/// which has `q`'s shape) and of the first key row (input 1's block); 0 for whole tensors.
fn params<T: Float>(
    causal: bool,
    scale: f64,
    q_shape: &[usize],
    ctx: &EvalCtx<'_>,
) -> Result<AttentionParams<T>, GraphError> {
    let seq_dim = q_shape.len() - 2;
    let q_offset = checked_placement(ctx, q_shape)?.map_or(0, |p| p.offset[seq_dim]);
    let k_offset = ctx
        .input_blocks
        .get(1)
        .and_then(|b| b.offset.get(seq_dim).copied())
        .unwrap_or(0);
    Ok(AttentionParams {
        causal,
        scale: T::from_f64(scale),
        q_offset,
        k_offset,
    })
}

/// `FlashAttention(q, k, v)` → `out`, `lse`.
pub(crate) fn flash_attention_eval<T: Float + Element>(
    (causal, scale): (bool, f64),
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let [q, k, v] = inputs else {
        unreachable!("eval_op checked the input count")
    };
    let [out, lse] = outputs else {
        unreachable!("eval_op checked the output count")
    };
    let dims = dims(q, k, ctx)?;
    let params = params::<T>(causal, scale, q.shape(), ctx)?;
    let qkv = (read::<T>(q, ctx)?, read::<T>(k, ctx)?, read::<T>(v, ctx)?);
    kernels::flash_attention_into(qkv, dims, params, write(out, ctx)?, write(lse, ctx)?)
        .map_err(GraphError::kernel(ctx.node))
}

/// `FlashAttentionGrad(q, k, v, out, lse, dout)` → `dq`, `dk`, `dv`.
pub(crate) fn flash_attention_grad_eval<T: Float + Element>(
    (causal, scale): (bool, f64),
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let [q, k, v, out, lse, dout] = inputs else {
        unreachable!("eval_op checked the input count")
    };
    let [dq, dk, dv] = outputs else {
        unreachable!("eval_op checked the output count")
    };
    let dims = dims(q, k, ctx)?;
    let params = params::<T>(causal, scale, q.shape(), ctx)?;
    let input = kernels::AttentionGradInputs {
        q: read::<T>(q, ctx)?,
        k: read::<T>(k, ctx)?,
        v: read::<T>(v, ctx)?,
        out: read::<T>(out, ctx)?,
        lse: read::<T>(lse, ctx)?,
        dout: read::<T>(dout, ctx)?,
    };
    let grads = kernels::AttentionGradBuffers {
        dq: write(dq, ctx)?,
        dk: write(dk, ctx)?,
        dv: write(dv, ctx)?,
    };
    kernels::flash_attention_grad_into(input, dims, params, grads)
        .map_err(GraphError::kernel(ctx.node))
}

/// The sizes of packed attention over `qkv [..., S, N, 3·d]` (shapes checked by inference,
/// the rank here so that indexing is safe).
fn packed_dims(qkv: &Tensor, ctx: &EvalCtx<'_>) -> Result<kernels::PackedDims, GraphError> {
    min_rank(qkv, 3, "qkv", ctx)?;
    let s = qkv.shape();
    let r = s.len();
    Ok(kernels::PackedDims {
        batch: s[..r - 3].iter().product(),
        seq: s[r - 3],
        heads: s[r - 2],
        head_dim: s[r - 1] / 3,
    })
}

/// `PackedAttention(qkv)` → `out`, `lse`. The sequence dim is whole (the sharding rules keep
/// it so), so the mask's positions start at 0.
pub(crate) fn packed_attention_eval<T: Float + Element>(
    (causal, scale): (bool, f64),
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let [qkv] = inputs else {
        unreachable!("eval_op checked the input count")
    };
    let [out, lse] = outputs else {
        unreachable!("eval_op checked the output count")
    };
    let dims = packed_dims(qkv, ctx)?;
    let params = AttentionParams::new(causal, T::from_f64(scale));
    kernels::packed_attention_into(
        read::<T>(qkv, ctx)?,
        dims,
        params,
        write(out, ctx)?,
        write(lse, ctx)?,
    )
    .map_err(GraphError::kernel(ctx.node))
}

/// `PackedAttentionGrad(qkv, out, lse, dout)` → `dqkv`.
pub(crate) fn packed_attention_grad_eval<T: Float + Element>(
    causal_scale: (bool, f64),
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    packed_attention_grad_summing::<T>(causal_scale, inputs, outputs, ctx, None)
}

/// [`packed_attention_grad_eval`], with `sums` (if given) taking `dqkv`'s rows as they are
/// finished (one thread: [`kernels::packed_attention_grad_summing_rows`]).
pub(crate) fn packed_attention_grad_summing<T: Float + Element>(
    (causal, scale): (bool, f64),
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    ctx: &EvalCtx<'_>,
    sums: Option<&mut RowSums<T>>,
) -> Result<(), GraphError> {
    let [qkv, out, lse, dout] = inputs else {
        unreachable!("eval_op checked the input count")
    };
    let [dqkv] = outputs else {
        unreachable!("eval_op checked the output count")
    };
    let dims = packed_dims(qkv, ctx)?;
    let params = AttentionParams::new(causal, T::from_f64(scale));
    let (qkv, out, lse, dout) = (
        read::<T>(qkv, ctx)?,
        read::<T>(out, ctx)?,
        read::<T>(lse, ctx)?,
        read::<T>(dout, ctx)?,
    );
    let dqkv = write(dqkv, ctx)?;
    match sums {
        None => kernels::packed_attention_grad_into(qkv, out, lse, dout, dims, params, dqkv),
        Some(sums) => kernels::packed_attention_grad_summing_rows(
            (qkv, out, lse, dout),
            dims,
            params,
            dqkv,
            sums,
        ),
    }
    .map_err(GraphError::kernel(ctx.node))
}
