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
//! Tensor-level in-place updates work on f32 and f64 tensors only: optimizer state is kept in a
//! compute type, never in f16/bf16 storage. The one exception is mixed precision's gradient
//! accumulation, [`accumulate_scaled_mixed_from`]: half-precision gradients added into an f32
//! (or, when asked, a half-precision) accumulator, every addition computed in f32.

use half::{bf16, f16};

use crate::dtype::DType;
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
    run_end(OP, x, offset, len)?;
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

/// [`accumulate_scaled_mixed_from`] over the whole of `x`, which has `acc`'s shape.
pub fn accumulate_scaled_mixed(
    acc: &mut Tensor,
    alpha: f64,
    x: &Tensor,
) -> Result<(), TensorError> {
    check::same_shape("accumulate_scaled_mixed", acc, x)?;
    accumulate_scaled_mixed_from(acc, alpha, x, 0)
}

/// `acc += alpha·x[offset .. offset + acc.len()]` in place, over the row-major elements, with
/// `acc` and `x` each f32, bf16 or f16 (mixed precision's gradient accumulation): every element
/// is `acc + alpha·x` computed in f32 — a half value widened exactly, `alpha` rounded to f32
/// once — and stored in `acc`'s dtype, rounded to nearest (ties to even) after every addition
/// when `acc` is half precision. With one dtype, f32 or f64, this is
/// [`accumulate_scaled_from`] (the same bits: an f32 `acc` and f32 `x` take the same loop
/// either way). The run must lie inside `x`.
pub fn accumulate_scaled_mixed_from(
    acc: &mut Tensor,
    alpha: f64,
    x: &Tensor,
    offset: usize,
) -> Result<(), TensorError> {
    const OP: &str = "accumulate_scaled_mixed";
    if acc.dtype() == x.dtype() && matches!(acc.dtype(), DType::F32 | DType::F64) {
        return accumulate_scaled_from(acc, alpha, x, offset);
    }
    for t in [&*acc, x] {
        if !matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16) {
            return Err(TensorError::UnsupportedDType {
                op: OP,
                got: t.dtype(),
            });
        }
    }
    let end = run_end(OP, x, offset, acc.n_elements())?;
    let alpha = alpha as f32;
    match x.dtype() {
        DType::BF16 => add_widened(OP, acc, alpha, &x.as_slice::<bf16>()?[offset..end], |v| {
            v.to_f32()
        }),
        DType::F16 => add_widened(OP, acc, alpha, &x.as_slice::<f16>()?[offset..end], |v| {
            v.to_f32()
        }),
        _ => add_widened(OP, acc, alpha, &x.as_slice::<f32>()?[offset..end], |v| v),
    }
}

/// The end of the run of `len` elements of `x` from `offset`, checked to lie inside `x`.
fn run_end(op: &'static str, x: &Tensor, offset: usize, len: usize) -> Result<usize, TensorError> {
    offset
        .checked_add(len)
        .filter(|&end| end <= x.n_elements())
        .ok_or_else(|| TensorError::ElementCount {
            op,
            shape: x.shape().to_vec(),
            expected: offset.saturating_add(len),
            got: x.n_elements(),
        })
}

/// `acc[i] = acc[i] + alpha·widen(xs[i])` in f32, stored in `acc`'s dtype (f32, bf16 or f16).
fn add_widened<S: Copy>(
    op: &'static str,
    acc: &mut Tensor,
    alpha: f32,
    xs: &[S],
    widen: impl Fn(S) -> f32,
) -> Result<(), TensorError> {
    match acc.dtype() {
        DType::F32 => {
            for (d, &v) in acc.as_slice_mut::<f32>()?.iter_mut().zip(xs) {
                *d += alpha * widen(v);
            }
        }
        DType::BF16 => {
            for (d, &v) in acc.as_slice_mut::<bf16>()?.iter_mut().zip(xs) {
                *d = bf16::from_f32(d.to_f32() + alpha * widen(v));
            }
        }
        DType::F16 => {
            for (d, &v) in acc.as_slice_mut::<f16>()?.iter_mut().zip(xs) {
                *d = f16::from_f32(d.to_f32() + alpha * widen(v));
            }
        }
        got => return Err(TensorError::UnsupportedDType { op, got }),
    }
    Ok(())
}
