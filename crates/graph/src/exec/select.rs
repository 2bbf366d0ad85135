//! Kernels that pick elements by a mask or by position: [`crate::Op::Triu`] (a constant whose
//! values are functions of global positions) and [`crate::Op::MaskedFill`] (a mask broadcast to
//! `x`, NumPy rules, of any dtype).

use tensor::kernels::Float;
use tensor::{Storage, Tensor, TensorError};

use crate::error::GraphError;
use crate::exec::eval::EvalCtx;
use crate::exec::operands::checked_placement;
use crate::exec::pieces::walk_strided;

/// `out[.., i, j] = 1` where `j - i >= diagonal`, else 0, for the block of `shape` at
/// `ctx.placement` (the whole tensor when `None`): `i` and `j` are global positions.
pub(crate) fn triu_into<T: Float>(
    out: &mut [T],
    shape: &[usize],
    diagonal: i64,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let ndim = shape.len();
    if ndim < 2 {
        return Err(invalid(
            ctx,
            format!("Triu needs at least 2 dims, got {shape:?}"),
        ));
    }
    let (row0, col0) = match checked_placement(ctx, shape)? {
        Some(p) => (p.offset[ndim - 2], p.offset[ndim - 1]),
        None => (0, 0),
    };
    let (rows, cols) = (shape[ndim - 2], shape[ndim - 1]);
    if cols == 0 || rows == 0 {
        return Ok(());
    }
    for (k, row) in out.chunks_exact_mut(cols).enumerate() {
        let i = (row0 + k % rows) as i64;
        for (c, o) in row.iter_mut().enumerate() {
            let j = (col0 + c) as i64;
            *o = if j - i >= diagonal { T::ONE } else { T::ZERO };
        }
    }
    Ok(())
}

/// `out = x` where the mask (broadcast to `x_shape`) is 0, `value` where it is not.
pub(crate) fn masked_fill_into<T: Float>(
    x: &[T],
    x_shape: &[usize],
    mask: &Tensor,
    value: T,
    out: &mut [T],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    if out.len() != x.len() {
        return Err(invalid(
            ctx,
            format!("x has {} elements but the output {}", x.len(), out.len()),
        ));
    }
    for_each_masked(x_shape, mask, ctx, |k, fill| {
        out[k] = if fill { value } else { x[k] };
    })
}

/// `out = x` where `cond` (broadcast to `shape`) is nonzero, else `y`.
pub(crate) fn where_into<T: Float>(
    cond: &Tensor,
    x: &[T],
    y: &[T],
    shape: &[usize],
    out: &mut [T],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    if x.len() != out.len() || y.len() != out.len() {
        return Err(invalid(
            ctx,
            format!(
                "x, y and the output must have one length, got {}, {} and {}",
                x.len(),
                y.len(),
                out.len()
            ),
        ));
    }
    for_each_masked(shape, cond, ctx, |k, pick_x| {
        out[k] = if pick_x { x[k] } else { y[k] };
    })
}

/// Calls `f(k, nonzero)` for every flat index `k` of a tensor of `shape`, with whether the
/// element of `mask` broadcast to `shape` at `k` is nonzero.
fn for_each_masked(
    shape: &[usize],
    mask: &Tensor,
    ctx: &EvalCtx<'_>,
    mut f: impl FnMut(usize, bool),
) -> Result<(), GraphError> {
    let strides = mask_strides(mask.shape(), shape).ok_or_else(|| {
        invalid(
            ctx,
            format!(
                "the mask's shape {:?} does not broadcast to {shape:?}",
                mask.shape()
            ),
        )
    })?;
    let repeats = repeated_suffix(mask.shape(), shape);
    // Every element type's `Default` is its zero (half's f16/bf16 included).
    macro_rules! walk {
        ($v:expr) => {
            match repeats {
                // The mask is the trailing dims of `shape`, repeated over the leading ones (a
                // causal mask over every batch and head): read it run by run.
                Some(run) if run > 0 => {
                    let bits: Vec<bool> = $v.iter().map(|m| *m != Default::default()).collect();
                    let n: usize = shape.iter().product();
                    for base in (0..n).step_by(run) {
                        for (i, &bit) in bits.iter().enumerate() {
                            f(base + i, bit);
                        }
                    }
                }
                _ => walk_strided(shape, &strides, 0, |k, m| f(k, $v[m] != Default::default())),
            }
        };
    }
    match mask.storage() {
        Storage::F64(v) => walk!(v),
        Storage::F32(v) => walk!(v),
        Storage::F16(v) => walk!(v),
        Storage::BF16(v) => walk!(v),
        Storage::I64(v) => walk!(v),
        Storage::I32(v) => walk!(v),
        Storage::I16(v) => walk!(v),
        Storage::I8(v) => walk!(v),
        Storage::U64(v) => walk!(v),
        Storage::U32(v) => walk!(v),
        Storage::U16(v) => walk!(v),
        Storage::U8(v) | Storage::Bool(v) => walk!(v),
    }
    Ok(())
}

/// The mask's element count when it equals `target`'s trailing dims (after dropping its
/// leading 1s), so that broadcasting repeats it whole over `target`'s leading dims.
fn repeated_suffix(shape: &[usize], target: &[usize]) -> Option<usize> {
    let first = shape.iter().position(|&d| d != 1).unwrap_or(shape.len());
    let core = &shape[first..];
    (core.len() <= target.len() && target[target.len() - core.len()..] == *core)
        .then(|| core.iter().product())
}

/// Strides of a contiguous tensor of `shape` read as broadcast to `target` (0 along stretched or
/// missing dims), or `None` if it does not broadcast to `target`.
fn mask_strides(shape: &[usize], target: &[usize]) -> Option<Vec<usize>> {
    if shape.len() > target.len() {
        return None;
    }
    let missing = target.len() - shape.len();
    let mut strides = vec![0; target.len()];
    let mut stride = 1;
    for d in (missing..target.len()).rev() {
        let size = shape[d - missing];
        if size == target[d] {
            strides[d] = stride;
        } else if size != 1 {
            return None;
        }
        stride *= size;
    }
    Some(strides)
}

fn invalid(ctx: &EvalCtx<'_>, reason: String) -> GraphError {
    GraphError::Kernel {
        node: ctx.node.to_string(),
        source: Box::new(TensorError::InvalidArgument {
            op: "eval_op",
            reason,
        }),
    }
}
