//! The tensor-level wrappers: shapes and dtypes checked, results allocated.

use super::{
    flash_attention_grad_into, flash_attention_into, packed_attention_grad_into,
    packed_attention_into, AttentionDims, AttentionGradBuffers, AttentionGradInputs,
    AttentionParams, PackedDims,
};
use crate::error::TensorError;
use crate::kernels::check;
use crate::kernels::float::{with_float, Float};
use crate::tensor::Tensor;

/// The gradients of [`flash_attention`]'s inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionGrads {
    /// The gradient of `q`.
    pub dq: Tensor,
    /// The gradient of `k`.
    pub dk: Tensor,
    /// The gradient of `v`.
    pub dv: Tensor,
}

/// The dims of `q [..., q_len, d]` against `k`, `v [..., kv_len, d]` (one dtype, equal leading
/// dims and width).
fn attention_dims(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<AttentionDims, TensorError> {
    check::same_dtype(op, q, k)?;
    check::same_dtype(op, q, v)?;
    check::same_shape(op, k, v)?;
    check::min_rank(op, q, 2)?;
    let r = q.ndim();
    let (qs, ks) = (q.shape(), k.shape());
    if ks.len() != r || ks[..r - 2] != qs[..r - 2] || ks[r - 1] != qs[r - 1] {
        return Err(TensorError::ShapeMismatch {
            op,
            lhs: qs.to_vec(),
            rhs: ks.to_vec(),
        });
    }
    Ok(AttentionDims {
        slices: qs[..r - 2].iter().product(),
        q_len: qs[r - 2],
        kv_len: ks[r - 2],
        head_dim: qs[r - 1],
    })
}

/// `softmax(scale · q·kᵀ + mask)·v` over the last two dims of `q [..., q_len, d]` and
/// `k`, `v [..., kv_len, d]`, causal (from position 0) or not: returns `out` (`q`'s shape and
/// dtype) and the log-sum-exp `lse` (`q`'s shape without the last dim, in the compute type).
pub fn flash_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: f64,
) -> Result<(Tensor, Tensor), TensorError> {
    const OP: &str = "flash_attention";
    let dims = attention_dims(OP, q, k, v)?;
    with_float!(OP, q.dtype(), |T| {
        let (qs, ks, vs) = (T::read(OP, q)?, T::read(OP, k)?, T::read(OP, v)?);
        let mut out = vec![T::ZERO; qs.len()];
        let mut lse = vec![T::ZERO; dims.slices * dims.q_len];
        let params = AttentionParams::new(causal, T::from_f64(scale));
        flash_attention_into::<T>((&qs, &ks, &vs), dims, params, &mut out, &mut lse)?;
        Ok((
            T::write(q.shape(), out, q.dtype()),
            T::write(&q.shape()[..q.ndim() - 1], lse, T::DTYPE),
        ))
    })
}

/// The gradients of [`flash_attention`] from its inputs, its `out` and `lse`, and the output's
/// gradient `dout`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_grad(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    out: &Tensor,
    lse: &Tensor,
    dout: &Tensor,
    causal: bool,
    scale: f64,
) -> Result<AttentionGrads, TensorError> {
    const OP: &str = "flash_attention_grad";
    let dims = attention_dims(OP, q, k, v)?;
    check::same_shape(OP, q, out)?;
    check::same_shape(OP, q, dout)?;
    if lse.shape() != &q.shape()[..q.ndim() - 1] {
        return Err(TensorError::ShapeMismatch {
            op: OP,
            lhs: q.shape()[..q.ndim() - 1].to_vec(),
            rhs: lse.shape().to_vec(),
        });
    }
    with_float!(OP, q.dtype(), |T| {
        let (qs, ks, vs) = (T::read(OP, q)?, T::read(OP, k)?, T::read(OP, v)?);
        let (outs, lses, douts) = (T::read(OP, out)?, T::read(OP, lse)?, T::read(OP, dout)?);
        let mut dq = vec![T::ZERO; qs.len()];
        let mut dk = vec![T::ZERO; ks.len()];
        let mut dv = vec![T::ZERO; vs.len()];
        let input = AttentionGradInputs {
            q: &qs,
            k: &ks,
            v: &vs,
            out: &outs,
            lse: &lses,
            dout: &douts,
        };
        let grads = AttentionGradBuffers {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        let params = AttentionParams::new(causal, T::from_f64(scale));
        flash_attention_grad_into::<T>(input, dims, params, grads)?;
        Ok(AttentionGrads {
            dq: T::write(q.shape(), dq, q.dtype()),
            dk: T::write(k.shape(), dk, k.dtype()),
            dv: T::write(v.shape(), dv, v.dtype()),
        })
    })
}

/// The dims of a packed `qkv [batch, seq, heads, 3·head_dim]`.
fn packed_dims(op: &'static str, qkv: &Tensor) -> Result<PackedDims, TensorError> {
    match *qkv.shape() {
        [batch, seq, heads, width] if width % 3 == 0 => Ok(PackedDims {
            batch,
            seq,
            heads,
            head_dim: width / 3,
        }),
        _ => Err(TensorError::InvalidArgument {
            op,
            reason: format!(
                "needs qkv [batch, seq, heads, 3·head_dim], got shape {:?}",
                qkv.shape()
            ),
        }),
    }
}

/// `Ok` when `tensor` has `shape`.
fn expect_shape(op: &'static str, shape: &[usize], tensor: &Tensor) -> Result<(), TensorError> {
    if tensor.shape() == shape {
        Ok(())
    } else {
        Err(TensorError::ShapeMismatch {
            op,
            lhs: shape.to_vec(),
            rhs: tensor.shape().to_vec(),
        })
    }
}

/// Attention over the packed `qkv [batch, seq, heads, 3·head_dim]` of a fused QKV projection
/// (the query, key and value rows of every (batch, position, head) side by side), causal (from
/// position 0) or not: returns `out [batch, seq, heads, head_dim]` (`qkv`'s dtype) and
/// `lse [batch, seq, heads]` (the compute type), the bits of [`flash_attention`] on the
/// transposed operands, transposed back.
pub fn packed_attention(
    qkv: &Tensor,
    causal: bool,
    scale: f64,
) -> Result<(Tensor, Tensor), TensorError> {
    const OP: &str = "packed_attention";
    let dims = packed_dims(OP, qkv)?;
    let rows = [dims.batch, dims.seq, dims.heads];
    with_float!(OP, qkv.dtype(), |T| {
        let packed = T::read(OP, qkv)?;
        let n_rows: usize = rows.iter().product();
        let mut out = vec![T::ZERO; n_rows * dims.head_dim];
        let mut lse = vec![T::ZERO; n_rows];
        let params = AttentionParams::new(causal, T::from_f64(scale));
        packed_attention_into::<T>(&packed, dims, params, &mut out, &mut lse)?;
        let out_shape = [dims.batch, dims.seq, dims.heads, dims.head_dim];
        Ok((
            T::write(&out_shape, out, qkv.dtype()),
            T::write(&rows, lse, T::DTYPE),
        ))
    })
}

/// The gradient of [`packed_attention`]'s `qkv` (its shape and dtype, `dq | dk | dv` side by
/// side) from `qkv`, its `out` and `lse`, and the output's gradient `dout` (`out`'s shape).
pub fn packed_attention_grad(
    qkv: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    dout: &Tensor,
    causal: bool,
    scale: f64,
) -> Result<Tensor, TensorError> {
    const OP: &str = "packed_attention_grad";
    let dims = packed_dims(OP, qkv)?;
    check::same_dtype(OP, qkv, out)?;
    check::same_dtype(OP, qkv, dout)?;
    let out_shape = [dims.batch, dims.seq, dims.heads, dims.head_dim];
    expect_shape(OP, &out_shape, out)?;
    expect_shape(OP, &out_shape, dout)?;
    expect_shape(OP, &out_shape[..3], lse)?;
    with_float!(OP, qkv.dtype(), |T| {
        let packed = T::read(OP, qkv)?;
        let (outs, lses, douts) = (T::read(OP, out)?, T::read(OP, lse)?, T::read(OP, dout)?);
        let mut dqkv = vec![T::ZERO; packed.len()];
        let params = AttentionParams::new(causal, T::from_f64(scale));
        packed_attention_grad_into::<T>(&packed, &outs, &lses, &douts, dims, params, &mut dqkv)?;
        Ok(T::write(qkv.shape(), dqkv, qkv.dtype()))
    })
}
