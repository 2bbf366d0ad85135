//! Reductions: sum, mean and max over one axis (with or without keeping it) or over every element.
//!
//! Inner loops keep [`LANES`] independent accumulators, so the compiler can keep them in vector
//! registers and the add latency is hidden; the order of additions therefore differs from a plain
//! left-to-right sum (results agree to rounding).

use crate::error::TensorError;
use crate::kernels::check;
use crate::kernels::float::{with_float, Float};
use crate::tensor::Tensor;

/// Independent accumulators in the inner reduction loops (two AVX-512 registers of f32).
pub const LANES: usize = 16;

/// What a reduction computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// The sum (0 over no element).
    Sum,
    /// The arithmetic mean (NaN over no element).
    Mean,
    /// The maximum (an error over no element). NaNs are skipped unless every element is NaN.
    Max,
}

impl Reduction {
    fn name(self) -> &'static str {
        match self {
            Reduction::Sum => "sum",
            Reduction::Mean => "mean",
            Reduction::Max => "max",
        }
    }
}

/// The sum of `x`, with [`LANES`] accumulators.
#[inline(always)]
pub fn sum_slice<T: Float>(x: &[T]) -> T {
    sum_map_slice(x, |v| v)
}

/// The sum of `f(v)` over `x`, with [`LANES`] accumulators. These slice reductions are always
/// inlined, so that inside a `widest!` loop (the attention's row dots, LayerNorm's rows) they
/// run on that loop's vector unit rather than as a call compiled for the baseline CPU.
#[inline(always)]
pub fn sum_map_slice<T: Float>(x: &[T], f: impl Fn(T) -> T) -> T {
    let mut acc = [T::ZERO; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += f(v);
        }
    }
    let mut total = fold_lanes(acc, |a, b| a + b);
    for &v in tail {
        total += f(v);
    }
    total
}

/// The maximum of `x` (`-inf` for an empty slice), with [`LANES`] accumulators.
#[inline(always)]
pub fn max_slice<T: Float>(x: &[T]) -> T {
    let mut acc = [T::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = a.max(v);
        }
    }
    let mut best = fold_lanes(acc, T::max);
    for &v in tail {
        best = best.max(v);
    }
    best
}

/// The dot product of `x` and `y` (equal lengths), with [`LANES`] accumulators.
#[inline(always)]
pub fn dot_slice<T: Float>(x: &[T], y: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let x_chunks = x.chunks_exact(LANES);
    let y_chunks = y.chunks_exact(LANES);
    let (x_tail, y_tail) = (x_chunks.remainder(), y_chunks.remainder());
    for (xc, yc) in x_chunks.zip(y_chunks) {
        for i in 0..LANES {
            acc[i] += xc[i] * yc[i];
        }
    }
    let mut total = fold_lanes(acc, |a, b| a + b);
    for (&a, &b) in x_tail.iter().zip(y_tail) {
        total += a * b;
    }
    total
}

/// Pairwise fold of the accumulator lanes.
#[inline(always)]
pub(crate) fn fold_lanes<T: Float>(mut acc: [T; LANES], f: impl Fn(T, T) -> T) -> T {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] = f(acc[i], acc[i + width]);
        }
    }
    acc[0]
}

/// Reduces `x` (of `shape`) over `axis` into `out`, which has `shape` without `axis` (or with it
/// set to 1: the element count is the same).
pub fn reduce_axis_into<T: Float>(
    reduction: Reduction,
    x: &[T],
    shape: &[usize],
    axis: usize,
    out: &mut [T],
) -> Result<(), TensorError> {
    let op = reduction.name();
    check::axis(op, axis, shape.len())?;
    check::buffer_len(op, "x", shape.iter().product(), x.len())?;
    let n_outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let n_inner: usize = shape[axis + 1..].iter().product();
    check::buffer_len(op, "out", n_outer * n_inner, out.len())?;
    if reduction == Reduction::Max && len == 0 && !out.is_empty() {
        return Err(TensorError::InvalidArgument {
            op,
            reason: format!("axis {axis} of shape {shape:?} is empty"),
        });
    }
    if n_inner == 1 {
        // The reduced axis is contiguous: one multi-accumulator loop per output element.
        for (dst, row) in out.iter_mut().zip(x.chunks_exact(len.max(1))) {
            *dst = match reduction {
                Reduction::Max => max_slice(row),
                _ => sum_slice(row),
            };
        }
        if len == 0 {
            out.fill(T::ZERO);
        }
    } else {
        // Reduce whole rows of `n_inner` elements: the inner vector is the set of accumulators.
        for (o, dst) in out.chunks_exact_mut(n_inner).enumerate() {
            let base = o * len * n_inner;
            match reduction {
                Reduction::Max => dst.fill(T::NEG_INFINITY),
                _ => dst.fill(T::ZERO),
            }
            for l in 0..len {
                let row = &x[base + l * n_inner..base + (l + 1) * n_inner];
                match reduction {
                    Reduction::Max => {
                        for (d, &v) in dst.iter_mut().zip(row) {
                            *d = d.max(v);
                        }
                    }
                    _ => {
                        for (d, &v) in dst.iter_mut().zip(row) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
    if reduction == Reduction::Mean {
        let scale = T::ONE / T::from_usize(len);
        for d in out.iter_mut() {
            *d *= scale;
        }
    }
    Ok(())
}

/// The gradient of [`reduce_axis_into`]: writes `dx` (of `shape`) from `dy` (the reduced shape).
/// Sum spreads `dy` along the axis, mean spreads `dy / len`, max routes `dy` to the first
/// maximum of each reduced line (`x` is read only for max).
pub fn reduce_axis_grad_into<T: Float>(
    reduction: Reduction,
    x: &[T],
    shape: &[usize],
    axis: usize,
    dy: &[T],
    dx: &mut [T],
) -> Result<(), TensorError> {
    let op = reduction.name();
    check::axis(op, axis, shape.len())?;
    check::buffer_len(op, "x", shape.iter().product(), x.len())?;
    check::buffer_len(op, "dx", x.len(), dx.len())?;
    let n_outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let n_inner: usize = shape[axis + 1..].iter().product();
    check::buffer_len(op, "dy", n_outer * n_inner, dy.len())?;
    let scale = match reduction {
        Reduction::Mean => T::ONE / T::from_usize(len),
        _ => T::ONE,
    };
    for o in 0..n_outer {
        for i in 0..n_inner {
            let g = dy[o * n_inner + i] * scale;
            let at = |l: usize| (o * len + l) * n_inner + i;
            match reduction {
                Reduction::Max => {
                    let mut best = 0;
                    for l in 1..len {
                        if x[at(l)] > x[at(best)] {
                            best = l;
                        }
                    }
                    for l in 0..len {
                        dx[at(l)] = if l == best { g } else { T::ZERO };
                    }
                }
                _ => (0..len).for_each(|l| dx[at(l)] = g),
            }
        }
    }
    Ok(())
}

/// Reduces every element of `x`.
pub fn reduce_all_slice<T: Float>(reduction: Reduction, x: &[T]) -> Result<T, TensorError> {
    match reduction {
        Reduction::Sum => Ok(sum_slice(x)),
        Reduction::Mean => Ok(sum_slice(x) / T::from_usize(x.len())),
        Reduction::Max if x.is_empty() => Err(TensorError::InvalidArgument {
            op: "max",
            reason: "max of no element".to_string(),
        }),
        Reduction::Max => Ok(max_slice(x)),
    }
}

/// Reduces `x` over `axis`; the result keeps the axis with size 1 when `keepdims`.
pub fn reduce_axis(
    reduction: Reduction,
    x: &Tensor,
    axis: usize,
    keepdims: bool,
) -> Result<Tensor, TensorError> {
    let op = reduction.name();
    check::axis(op, axis, x.ndim())?;
    let mut shape = x.shape().to_vec();
    if keepdims {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    with_float!(op, x.dtype(), |T| {
        let xs = T::read(op, x)?;
        let mut out = vec![T::ZERO; shape.iter().product()];
        reduce_axis_into::<T>(reduction, &xs, x.shape(), axis, &mut out)?;
        Ok(T::write(&shape, out, x.dtype()))
    })
}

/// The gradient of [`reduce_axis`] wrt `x`, from `dy` of the reduced shape (with or without the
/// kept axis). See [`reduce_axis_grad_into`].
pub fn reduce_axis_grad(
    reduction: Reduction,
    x: &Tensor,
    axis: usize,
    dy: &Tensor,
) -> Result<Tensor, TensorError> {
    let op = reduction.name();
    check::axis(op, axis, x.ndim())?;
    check::same_dtype(op, x, dy)?;
    let mut kept = x.shape().to_vec();
    kept[axis] = 1;
    let mut dropped = x.shape().to_vec();
    dropped.remove(axis);
    if dy.shape() != kept.as_slice() && dy.shape() != dropped.as_slice() {
        return Err(TensorError::ShapeMismatch {
            op,
            lhs: dropped,
            rhs: dy.shape().to_vec(),
        });
    }
    with_float!(op, x.dtype(), |T| {
        let xs = T::read(op, x)?;
        let gs = T::read(op, dy)?;
        let mut dx = vec![T::ZERO; xs.len()];
        reduce_axis_grad_into::<T>(reduction, &xs, x.shape(), axis, &gs, &mut dx)?;
        Ok(T::write(x.shape(), dx, x.dtype()))
    })
}

/// Reduces every element of `x` to a 0-dim tensor of `x`'s dtype.
pub fn reduce_all(reduction: Reduction, x: &Tensor) -> Result<Tensor, TensorError> {
    let op = reduction.name();
    with_float!(op, x.dtype(), |T| {
        let xs = T::read(op, x)?;
        let value = reduce_all_slice::<T>(reduction, &xs)?;
        Ok(T::write(&[], vec![value], x.dtype()))
    })
}

/// Sum over `axis`.
pub fn sum(x: &Tensor, axis: usize, keepdims: bool) -> Result<Tensor, TensorError> {
    reduce_axis(Reduction::Sum, x, axis, keepdims)
}

/// Mean over `axis`.
pub fn mean(x: &Tensor, axis: usize, keepdims: bool) -> Result<Tensor, TensorError> {
    reduce_axis(Reduction::Mean, x, axis, keepdims)
}

/// Maximum over `axis` (an error if the axis is empty).
pub fn max(x: &Tensor, axis: usize, keepdims: bool) -> Result<Tensor, TensorError> {
    reduce_axis(Reduction::Max, x, axis, keepdims)
}

/// Sum of every element, as a 0-dim tensor.
pub fn sum_all(x: &Tensor) -> Result<Tensor, TensorError> {
    reduce_all(Reduction::Sum, x)
}

/// Mean of every element, as a 0-dim tensor.
pub fn mean_all(x: &Tensor) -> Result<Tensor, TensorError> {
    reduce_all(Reduction::Mean, x)
}

/// Maximum of every element, as a 0-dim tensor (an error for an empty tensor).
pub fn max_all(x: &Tensor) -> Result<Tensor, TensorError> {
    reduce_all(Reduction::Max, x)
}
