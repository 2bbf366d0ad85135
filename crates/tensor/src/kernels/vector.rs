//! In-place vector updates for gradient accumulation and optimizers (BLAS level 1 and the few
//! fused updates Adam-style optimizers need).
//!
//! The optimizer maths itself belongs to the runtime; these are its primitives. Adam, for example,
//! with `c1 = 1 - β1^t` and `c2 = 1 - β2^t`, is
//! ```text
//! axpby(1 - β1, g, β1, m)                      // m = β1·m + (1-β1)·g
//! square_axpby(1 - β2, g, β2, v)               // v = β2·v + (1-β2)·g²
//! div_sqrt_axpy(-lr·√c2/c1, m, v, ε·√c2, p)    // p -= lr·m̂ / (√v̂ + ε)
//! ```
//!
//! Tensor-level in-place updates work on f32 and f64 tensors only: gradients and optimizer state
//! are kept in a compute type, never in f16/bf16 storage.

use crate::error::TensorError;
use crate::kernels::check;
use crate::kernels::float::{with_float, Float};
use crate::tensor::Tensor;

/// `y += alpha·x`.
pub fn axpy<T: Float>(alpha: T, x: &[T], y: &mut [T]) -> Result<(), TensorError> {
    check::buffer_len("axpy", "y", x.len(), y.len())?;
    for (d, &v) in y.iter_mut().zip(x) {
        *d += alpha * v;
    }
    Ok(())
}

/// `y = alpha·x + beta·y`.
pub fn axpby<T: Float>(alpha: T, x: &[T], beta: T, y: &mut [T]) -> Result<(), TensorError> {
    check::buffer_len("axpby", "y", x.len(), y.len())?;
    for (d, &v) in y.iter_mut().zip(x) {
        *d = alpha * v + beta * *d;
    }
    Ok(())
}

/// `y = alpha·x² + beta·y` (elementwise square; Adam's second moment).
pub fn square_axpby<T: Float>(alpha: T, x: &[T], beta: T, y: &mut [T]) -> Result<(), TensorError> {
    check::buffer_len("square_axpby", "y", x.len(), y.len())?;
    for (d, &v) in y.iter_mut().zip(x) {
        *d = alpha * v * v + beta * *d;
    }
    Ok(())
}

/// `y += alpha · num / (√den + epsilon)` (elementwise; Adam's parameter step).
pub fn div_sqrt_axpy<T: Float>(
    alpha: T,
    num: &[T],
    den: &[T],
    epsilon: T,
    y: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "div_sqrt_axpy";
    check::buffer_len(OP, "den", num.len(), den.len())?;
    check::buffer_len(OP, "y", num.len(), y.len())?;
    for ((d, &a), &b) in y.iter_mut().zip(num).zip(den) {
        *d += alpha * a / (b.sqrt() + epsilon);
    }
    Ok(())
}

/// `x *= alpha`.
pub fn scale_inplace<T: Float>(alpha: T, x: &mut [T]) {
    for v in x.iter_mut() {
        *v *= alpha;
    }
}

/// Every element of `x` set to `value`.
pub fn fill<T: Float>(x: &mut [T], value: T) {
    x.fill(value);
}

/// `alpha·x` as a new tensor of `x`'s dtype. Its gradient is `scale(dy, alpha)`.
pub fn scale(x: &Tensor, alpha: f64) -> Result<Tensor, TensorError> {
    const OP: &str = "scale";
    with_float!(OP, x.dtype(), |T| {
        let mut out = T::read(OP, x)?.into_owned();
        scale_inplace(T::from_f64(alpha), &mut out);
        Ok(T::write(x.shape(), out, x.dtype()))
    })
}

/// `acc += alpha·x` in place (gradient accumulation). Both tensors have one shape and dtype,
/// f32 or f64.
pub fn accumulate_scaled(acc: &mut Tensor, alpha: f64, x: &Tensor) -> Result<(), TensorError> {
    check::same_shape("accumulate_scaled", acc, x)?;
    accumulate_scaled_from(acc, alpha, x, 0)
}

/// `acc += alpha·x[offset .. offset + acc.len()]` in place, over the row-major elements: the
/// accumulation of one run of rows of a gradient (a sharded accumulation buffer). One dtype,
/// f32 or f64; the run must lie inside `x`.
pub fn accumulate_scaled_from(
    acc: &mut Tensor,
    alpha: f64,
    x: &Tensor,
    offset: usize,
) -> Result<(), TensorError> {
    const OP: &str = "accumulate_scaled";
    check::same_dtype(OP, acc, x)?;
    let len = acc.n_elements();
    if offset
        .checked_add(len)
        .is_none_or(|end| end > x.n_elements())
    {
        return Err(TensorError::ElementCount {
            op: OP,
            shape: x.shape().to_vec(),
            expected: offset.saturating_add(len),
            got: x.n_elements(),
        });
    }
    with_float!(OP, x.dtype(), |T| {
        let xs = T::read(OP, x)?;
        let ys = acc
            .as_slice_mut::<T>()
            .map_err(|_| TensorError::DTypeMismatch {
                op: OP,
                expected: T::DTYPE,
                got: x.dtype(),
            })?;
        axpy(T::from_f64(alpha), &xs[offset..offset + len], ys)
    })
}
