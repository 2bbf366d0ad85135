//! Argument checks shared by the kernels: each returns the typed error that names the operation.

use crate::error::TensorError;
use crate::tensor::Tensor;

/// `Ok` when a caller-provided buffer has `expected` elements.
#[inline]
pub(crate) fn buffer_len(
    op: &'static str,
    buffer: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), TensorError> {
    if expected == got {
        Ok(())
    } else {
        Err(TensorError::BufferLength {
            op,
            buffer,
            expected,
            got,
        })
    }
}

/// `Ok` when two tensors have one dtype.
pub(crate) fn same_dtype(op: &'static str, lhs: &Tensor, rhs: &Tensor) -> Result<(), TensorError> {
    if lhs.dtype() == rhs.dtype() {
        Ok(())
    } else {
        Err(TensorError::DTypeMismatch {
            op,
            expected: lhs.dtype(),
            got: rhs.dtype(),
        })
    }
}

/// `Ok` when two tensors have one shape.
pub(crate) fn same_shape(op: &'static str, lhs: &Tensor, rhs: &Tensor) -> Result<(), TensorError> {
    if lhs.shape() == rhs.shape() {
        Ok(())
    } else {
        Err(TensorError::ShapeMismatch {
            op,
            lhs: lhs.shape().to_vec(),
            rhs: rhs.shape().to_vec(),
        })
    }
}

/// `Ok` when `tensor` has at least `min_ndim` dims.
pub(crate) fn min_rank(
    op: &'static str,
    tensor: &Tensor,
    min_ndim: usize,
) -> Result<(), TensorError> {
    if tensor.ndim() >= min_ndim {
        Ok(())
    } else {
        Err(TensorError::InvalidArgument {
            op,
            reason: format!(
                "needs a tensor of rank >= {min_ndim}, got shape {:?}",
                tensor.shape()
            ),
        })
    }
}

/// `Ok` when `axis < ndim`.
pub(crate) fn axis(op: &'static str, axis: usize, ndim: usize) -> Result<(), TensorError> {
    if axis < ndim {
        Ok(())
    } else {
        Err(TensorError::DimOutOfRange {
            op,
            dim: axis,
            ndim,
        })
    }
}

/// Splits `shape` around the last axis: (product of the leading dims, size of the last dim).
/// A 0-dim tensor is one row of one element.
pub(crate) fn rows_and_last(shape: &[usize]) -> (usize, usize) {
    match shape.split_last() {
        Some((&last, lead)) => (lead.iter().product(), last),
        None => (1, 1),
    }
}
