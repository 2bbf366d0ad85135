//! Reading and writing an op's operands for [`super::eval::eval_op`] and its kernels: typed
//! views named by the node, rank and shape checks, the placement check, the mismatch error.

use layout::SliceBox;
use tensor::{DType, Element, Storage, Tensor};

use super::eval::{EvalCtx, Placement};
use crate::error::GraphError;
use crate::rng::region_fits;

/// `ctx.placement`, checked to hold a block of `shape` inside the global tensor.
pub(super) fn checked_placement<'a>(
    ctx: &EvalCtx<'a>,
    shape: &[usize],
) -> Result<Option<Placement<'a>>, GraphError> {
    match ctx.placement {
        Some(p) if !region_fits(p.offset, shape, p.global_shape) => {
            Err(GraphError::RegionOutOfRange {
                context: ctx.node.to_string(),
                region: Box::new(SliceBox {
                    offset: p.offset.into(),
                    shape: shape.into(),
                }),
                shape: p.global_shape.to_vec(),
            })
        }
        placement => Ok(placement),
    }
}

/// Writes `value` into `out`, a tensor of one element.
pub(super) fn write_scalar<T: Element>(
    out: &mut Tensor,
    value: T,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    match write::<T>(out, ctx)? {
        [single] => {
            *single = value;
            Ok(())
        }
        _ => Err(mismatch(ctx, "output 0", &[], <T as Element>::DTYPE, out)),
    }
}

/// The elements of `t` as `T`, or a kernel error naming the node.
pub(super) fn read<'t, T: Element>(
    t: &'t Tensor,
    ctx: &EvalCtx<'_>,
) -> Result<&'t [T], GraphError> {
    t.as_slice::<T>().map_err(GraphError::kernel(ctx.node))
}

/// The elements of `t` as `T`, writable.
pub(super) fn write<'t, T: Element>(
    t: &'t mut Tensor,
    ctx: &EvalCtx<'_>,
) -> Result<&'t mut [T], GraphError> {
    t.as_slice_mut::<T>().map_err(GraphError::kernel(ctx.node))
}

/// `Ok` when `t` has at least `ndim` dims (so indexing its shape is safe).
pub(super) fn min_rank(
    t: &Tensor,
    ndim: usize,
    operand: &str,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    if t.ndim() >= ndim {
        Ok(())
    } else {
        Err(GraphError::Kernel {
            node: ctx.node.to_string(),
            source: Box::new(tensor::TensorError::InvalidArgument {
                op: "eval_op",
                reason: format!(
                    "operand `{operand}` needs at least {ndim} dims, got shape {:?}",
                    t.shape()
                ),
            }),
        })
    }
}

/// Dim `axis` of every tensor (0 where a tensor has no such dim; the kernel's length checks
/// then name the mismatch).
pub(super) fn dim_of_each<'t>(
    tensors: impl Iterator<Item = &'t Tensor>,
    axis: usize,
) -> Vec<usize> {
    tensors
        .map(|t| t.shape().get(axis).copied().unwrap_or(0))
        .collect()
}

/// The last dim of `t`, 0 for a scalar.
pub(super) fn last_dim_or_zero(t: &Tensor) -> usize {
    t.shape().last().copied().unwrap_or(0)
}

/// The last dim of `t` (callers checked its rank).
pub(super) fn last_dim(t: &Tensor) -> usize {
    t.shape()[t.ndim() - 1]
}

/// Runs `f` on `out`'s shape and its elements as `T` at once (the tensor API lends one or the
/// other): the storage is moved out for the call and back, which allocates nothing.
pub(super) fn with_shape_and_elements<T: Element, R>(
    out: &mut Tensor,
    ctx: &EvalCtx<'_>,
    f: impl FnOnce(&[usize], &mut [T]) -> Result<R, GraphError>,
) -> Result<R, GraphError> {
    let mut storage = std::mem::replace(out.storage_mut(), Storage::U8(Vec::new()));
    let result = match T::view_mut(&mut storage) {
        Some(elements) => f(out.shape(), elements),
        None => Err(GraphError::Kernel {
            node: ctx.node.to_string(),
            source: Box::new(tensor::TensorError::DTypeMismatch {
                op: "eval_op",
                expected: T::DTYPE,
                got: storage.dtype(),
            }),
        }),
    };
    *out.storage_mut() = storage;
    result
}

/// Stores an allocated kernel result in `out`, which must have its shape and dtype.
pub(super) fn replace_checked(
    out: &mut Tensor,
    result: Tensor,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    if result.shape() != out.shape() || result.dtype() != out.dtype() {
        return Err(mismatch(
            ctx,
            "output 0",
            result.shape(),
            result.dtype(),
            out,
        ));
    }
    *out = result;
    Ok(())
}

pub(super) fn mismatch(
    ctx: &EvalCtx<'_>,
    operand: &str,
    expected_shape: &[usize],
    expected_dtype: DType,
    got: &Tensor,
) -> GraphError {
    GraphError::TensorMismatch {
        context: format!("{} {operand}", ctx.node),
        expected_shape: expected_shape.to_vec(),
        expected_dtype,
        got_shape: got.shape().to_vec(),
        got_dtype: got.dtype(),
    }
}
