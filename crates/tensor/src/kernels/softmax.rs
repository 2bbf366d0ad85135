//! Softmax and log-softmax over the last axis, numerically stable (the row maximum is subtracted
//! before exponentiating), and their backward passes.
//!
//! A tensor of shape `[..., c]` is a stack of rows of `c` classes; every row is normalised on its
//! own. Backward passes take the forward *output*.

use crate::error::TensorError;
use crate::kernels::check;
use crate::kernels::float::{with_float, Float};
use crate::kernels::reduce::{dot_slice, max_slice, sum_map_slice, sum_slice};
use crate::kernels::wide::widest;
use crate::tensor::Tensor;

/// Checks a row-wise kernel's buffers: `x` and `out` hold whole rows of `cols` elements.
fn check_rows(
    op: &'static str,
    x_len: usize,
    cols: usize,
    out_len: usize,
) -> Result<(), TensorError> {
    if cols == 0 {
        check::buffer_len(op, "x", 0, x_len)?;
    } else {
        check::buffer_len(op, "x", x_len - x_len % cols, x_len)?;
    }
    check::buffer_len(op, "out", x_len, out_len)
}

/// Writes the softmax of one row: `out = exp(x - max) / Σ exp(x - max)`.
#[inline(always)]
pub(crate) fn softmax_row<T: Float>(x: &[T], out: &mut [T]) {
    scaled_softmax_row(x, T::ONE, out);
}

/// Writes the softmax of one row scaled by `scale > 0`:
/// `out = exp(scale·(x - max)) / Σ exp(scale·(x - max))`.
#[inline(always)]
fn scaled_softmax_row<T: Float>(x: &[T], scale: T, out: &mut [T]) {
    let max = max_slice(x);
    for (o, &v) in out.iter_mut().zip(x) {
        *o = ((v - max) * scale).exp_vectorizable();
    }
    let scale = T::ONE / sum_slice(out);
    for o in out.iter_mut() {
        *o *= scale;
    }
}

/// `ln Σ exp(x)` of one row, computed as `max + ln Σ exp(x - max)` so it cannot overflow; the
/// exponentials (and the logarithm, as the `Log` op's) by arithmetic alone, so the row's loop
/// vectorises.
#[inline(always)]
pub fn log_sum_exp<T: Float>(x: &[T]) -> T {
    let max = max_slice(x);
    max + sum_map_slice(x, |v| (v - max).exp_vectorizable()).ln_vectorizable()
}

widest! {
    /// [`log_sum_exp`] on the widest vector unit the CPU has (the same bits).
    pub(crate) fn log_sum_exp_widest<T>(x: &[T]) -> T => log_sum_exp
}

/// Writes the log-softmax of one row: `out = x - logsumexp(x)`.
#[inline]
pub(crate) fn log_softmax_row<T: Float>(x: &[T], out: &mut [T]) {
    let shift = log_sum_exp_widest(x);
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v - shift;
    }
}

/// Softmax of each row of `cols` elements of `x` into `out`.
pub fn softmax_into<T: Float>(x: &[T], cols: usize, out: &mut [T]) -> Result<(), TensorError> {
    scaled_softmax_into(x, T::ONE, cols, out)
}

/// `softmax(scale · row)` of each row of `cols` elements of `x` into `out`; `scale` must be
/// finite and positive (attention's `1/√d`).
pub fn scaled_softmax_into<T: Float>(
    x: &[T],
    scale: T,
    cols: usize,
    out: &mut [T],
) -> Result<(), TensorError> {
    check_rows("softmax", x.len(), cols, out.len())?;
    check_scale("softmax", scale)?;
    if cols > 0 {
        super::threads::for_each_rows(out, cols, |start, part| {
            scaled_softmax_share(&x[start..start + part.len()], scale, cols, part)
        });
    }
    Ok(())
}

widest! {
    /// One thread's rows of [`scaled_softmax_into`], on the widest vector unit the CPU has: the
    /// exponentials vectorise; the sums stay sequential (a float sum is never reordered), so
    /// the bits are the portable loop's.
    fn scaled_softmax_share<T>(x: &[T], scale: T, cols: usize, out: &mut [T]) => scaled_softmax_rows
}

/// [`scaled_softmax_row`] over every row of `cols` (> 0) elements.
#[inline(always)]
fn scaled_softmax_rows<T: Float>(x: &[T], scale: T, cols: usize, out: &mut [T]) {
    for (o, row) in out.chunks_exact_mut(cols).zip(x.chunks_exact(cols)) {
        scaled_softmax_row(row, scale, o);
    }
}

/// `Ok` when a softmax scale is finite and positive.
pub(crate) fn check_scale<T: Float>(op: &'static str, scale: T) -> Result<(), TensorError> {
    if scale.to_f64().is_finite() && scale > T::ZERO {
        Ok(())
    } else {
        Err(TensorError::InvalidArgument {
            op,
            reason: format!("the scale must be finite and positive, got {scale:?}"),
        })
    }
}

/// Log-softmax of each row of `cols` elements of `x` into `out`.
pub fn log_softmax_into<T: Float>(x: &[T], cols: usize, out: &mut [T]) -> Result<(), TensorError> {
    check_rows("log_softmax", x.len(), cols, out.len())?;
    if cols > 0 {
        for (o, row) in out.chunks_exact_mut(cols).zip(x.chunks_exact(cols)) {
            log_softmax_row(row, o);
        }
    }
    Ok(())
}

/// Backward of softmax per row: `dx = y ⊙ (dy - Σ dy⊙y)`, from the forward output `y`.
pub fn softmax_grad_into<T: Float>(
    y: &[T],
    dy: &[T],
    cols: usize,
    dx: &mut [T],
) -> Result<(), TensorError> {
    scaled_softmax_grad_into(y, dy, T::ONE, cols, dx)
}

/// Backward of [`scaled_softmax_into`] per row: `dx = scale · y ⊙ (dy - Σ dy⊙y)`, from the
/// forward output `y`.
pub fn scaled_softmax_grad_into<T: Float>(
    y: &[T],
    dy: &[T],
    scale: T,
    cols: usize,
    dx: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "softmax_grad";
    check_rows(OP, y.len(), cols, dx.len())?;
    check::buffer_len(OP, "dy", y.len(), dy.len())?;
    check_scale(OP, scale)?;
    if cols > 0 {
        super::threads::for_each_rows(dx, cols, |start, part| {
            let end = start + part.len();
            for ((d, yr), gr) in part
                .chunks_exact_mut(cols)
                .zip(y[start..end].chunks_exact(cols))
                .zip(dy[start..end].chunks_exact(cols))
            {
                let inner = dot_slice(yr, gr);
                for ((o, &p), &g) in d.iter_mut().zip(yr).zip(gr) {
                    *o = scale * p * (g - inner);
                }
            }
        });
    }
    Ok(())
}

/// Backward of log-softmax per row: `dx = dy - exp(y)·Σ dy`, from the forward output `y`.
pub fn log_softmax_grad_into<T: Float>(
    y: &[T],
    dy: &[T],
    cols: usize,
    dx: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "log_softmax_grad";
    check_rows(OP, y.len(), cols, dx.len())?;
    check::buffer_len(OP, "dy", y.len(), dy.len())?;
    if cols > 0 {
        for ((d, yr), gr) in dx
            .chunks_exact_mut(cols)
            .zip(y.chunks_exact(cols))
            .zip(dy.chunks_exact(cols))
        {
            let total = sum_slice(gr);
            for ((o, &l), &g) in d.iter_mut().zip(yr).zip(gr) {
                *o = g - l.exp_vectorizable() * total;
            }
        }
    }
    Ok(())
}

/// Which of the two normalisations a Tensor-level call computes.
#[derive(Clone, Copy)]
enum Kind {
    Softmax,
    LogSoftmax,
}

fn forward(op: &'static str, kind: Kind, x: &Tensor) -> Result<Tensor, TensorError> {
    check::min_rank(op, x, 1)?;
    let (_, cols) = check::rows_and_last(x.shape());
    with_float!(op, x.dtype(), |T| {
        let xs = T::read(op, x)?;
        let mut out = vec![T::ZERO; xs.len()];
        match kind {
            Kind::Softmax => softmax_into::<T>(&xs, cols, &mut out)?,
            Kind::LogSoftmax => log_softmax_into::<T>(&xs, cols, &mut out)?,
        }
        Ok(T::write(x.shape(), out, x.dtype()))
    })
}

fn backward(op: &'static str, kind: Kind, y: &Tensor, dy: &Tensor) -> Result<Tensor, TensorError> {
    check::min_rank(op, y, 1)?;
    check::same_dtype(op, y, dy)?;
    check::same_shape(op, y, dy)?;
    let (_, cols) = check::rows_and_last(y.shape());
    with_float!(op, y.dtype(), |T| {
        let ys = T::read(op, y)?;
        let gs = T::read(op, dy)?;
        let mut dx = vec![T::ZERO; ys.len()];
        match kind {
            Kind::Softmax => softmax_grad_into::<T>(&ys, &gs, cols, &mut dx)?,
            Kind::LogSoftmax => log_softmax_grad_into::<T>(&ys, &gs, cols, &mut dx)?,
        }
        Ok(T::write(y.shape(), dx, y.dtype()))
    })
}

/// Softmax over the last axis.
pub fn softmax(x: &Tensor) -> Result<Tensor, TensorError> {
    forward("softmax", Kind::Softmax, x)
}

/// Log-softmax over the last axis.
pub fn log_softmax(x: &Tensor) -> Result<Tensor, TensorError> {
    forward("log_softmax", Kind::LogSoftmax, x)
}

/// The gradient of [`softmax`] from its output `y` and `dy`.
pub fn softmax_grad(y: &Tensor, dy: &Tensor) -> Result<Tensor, TensorError> {
    backward("softmax_grad", Kind::Softmax, y, dy)
}

/// The gradient of [`log_softmax`] from its output `y` and `dy`.
pub fn log_softmax_grad(y: &Tensor, dy: &Tensor) -> Result<Tensor, TensorError> {
    backward("log_softmax_grad", Kind::LogSoftmax, y, dy)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatched softmax (AVX-512 or AVX2 where the CPU has it) gives the portable rows' bits,
    /// masked (-inf, -1e9) entries included, and masked entries come out exactly 0.
    #[test]
    fn dispatched_softmax_gives_the_portable_bits() {
        let cols = 37;
        let mut x: Vec<f32> = (0..cols * 9)
            .map(|i| ((i * 53) % 97) as f32 / 9.0 - 5.0)
            .collect();
        x[3] = f32::NEG_INFINITY;
        x[cols + 5] = -1e9;
        let mut got = vec![0f32; x.len()];
        let mut want = vec![0f32; x.len()];
        scaled_softmax_into(&x, 0.125, cols, &mut got).unwrap();
        scaled_softmax_rows(&x, 0.125, cols, &mut want);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
        assert_eq!((got[3], got[cols + 5]), (0.0, 0.0));
        for row in got.chunks_exact(cols) {
            let total: f32 = row.iter().sum();
            assert!((total - 1.0).abs() < 1e-6, "{total}");
        }
    }
}
