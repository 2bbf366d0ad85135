//! NumPy broadcasting: the shape rule, the strided walk every broadcasting kernel shares,
//! `broadcast_to` and its adjoint `sum_to_shape`.
//!
//! Shapes are aligned at their last dim; a dim of size 1 (or a missing leading dim) stretches to
//! the other operand's size. Internally an operand is walked with stride 0 along the dims it is
//! broadcast over.

use crate::error::TensorError;
use crate::kernels::check;
use crate::kernels::float::{with_float, Float};
use crate::kernels::reduce::sum_slice;
use crate::kernels::wide::widest;
use crate::tensor::Tensor;

/// The broadcast of two shapes, or [`TensorError::NotBroadcastable`] naming `op`.
pub fn broadcast_shape(
    op: &'static str,
    lhs: &[usize],
    rhs: &[usize],
) -> Result<Vec<usize>, TensorError> {
    let ndim = lhs.len().max(rhs.len());
    let mut out = vec![0; ndim];
    for (d, size) in out.iter_mut().enumerate() {
        let l = aligned_dim(lhs, ndim, d);
        let r = aligned_dim(rhs, ndim, d);
        *size = match (l, r) {
            (l, r) if l == r => l,
            (1, r) => r,
            (l, 1) => l,
            _ => {
                return Err(TensorError::NotBroadcastable {
                    op,
                    lhs: lhs.to_vec(),
                    rhs: rhs.to_vec(),
                })
            }
        };
    }
    Ok(out)
}

/// Size of `shape`'s dim that lines up with dim `d` of an `ndim`-dim shape (1 if missing).
fn aligned_dim(shape: &[usize], ndim: usize, d: usize) -> usize {
    let missing = ndim - shape.len();
    if d < missing {
        1
    } else {
        shape[d - missing]
    }
}

/// The strides (in elements) with which a contiguous tensor of `shape` is read when broadcast to
/// `out_shape`: 0 along stretched or missing dims. `shape` must broadcast to `out_shape`.
pub(crate) fn broadcast_strides(shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let ndim = out_shape.len();
    let mut strides = vec![0; ndim];
    let mut stride = 1;
    for d in (0..ndim).rev() {
        let size = aligned_dim(shape, ndim, d);
        if size != 1 || out_shape[d] == 1 {
            strides[d] = stride;
        }
        stride *= size;
    }
    strides
}

/// Row-major contiguous strides of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    layout::row_major_strides(shape)
}

/// Walks `shape` row by row for `N` operands with their own strides.
///
/// Dims of size 1 are dropped and neighbouring dims that every operand walks contiguously are
/// merged, so rows are as long as the strides allow. `row(offsets, len, inner_strides)` is called
/// once per row with each operand's offset of the row's first element.
pub(crate) fn for_each_row<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
    mut row: impl FnMut([usize; N], usize, [usize; N]),
) {
    if shape.contains(&0) {
        return;
    }
    // Keep the dims of size > 1, then merge d into d+1 when every operand allows it.
    let mut dims: Vec<(usize, [usize; N])> = Vec::with_capacity(shape.len());
    for (d, &size) in shape.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let dim_strides: [usize; N] = std::array::from_fn(|i| strides[i][d]);
        if let Some((prev_size, prev_strides)) = dims.last_mut() {
            let mergeable = (0..N).all(|i| prev_strides[i] == dim_strides[i] * size);
            if mergeable {
                *prev_size *= size;
                *prev_strides = dim_strides;
                continue;
            }
        }
        dims.push((size, dim_strides));
    }
    let Some(&(len, inner)) = dims.last() else {
        row([0; N], 1, [1; N]);
        return;
    };
    let outer = &dims[..dims.len() - 1];
    let mut counter = vec![0usize; outer.len()];
    let mut offsets = [0usize; N];
    loop {
        row(offsets, len, inner);
        // Advance the odometer over the outer dims.
        let mut d = outer.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            let (size, dim_strides) = outer[d];
            counter[d] += 1;
            for i in 0..N {
                offsets[i] += dim_strides[i];
            }
            if counter[d] < size {
                break;
            }
            counter[d] = 0;
            for i in 0..N {
                offsets[i] -= dim_strides[i] * size;
            }
        }
    }
}

/// Writes `x` (of `x_shape`) broadcast to `out_shape` into `out`.
pub fn broadcast_to_into<T: Float>(
    x: &[T],
    x_shape: &[usize],
    out_shape: &[usize],
    out: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "broadcast_to";
    check::buffer_len(OP, "x", x_shape.iter().product(), x.len())?;
    check::buffer_len(OP, "out", out_shape.iter().product(), out.len())?;
    check_broadcasts_to(OP, x_shape, out_shape)?;
    let x_strides = broadcast_strides(x_shape, out_shape);
    let out_strides = contiguous_strides(out_shape);
    for_each_row(
        out_shape,
        [&out_strides, &x_strides],
        |[o, i], len, [_, x_step]| {
            let dst = &mut out[o..o + len];
            if x_step == 0 {
                dst.fill(x[i]);
            } else {
                dst.copy_from_slice(&x[i..i + len]);
            }
        },
    );
    Ok(())
}

/// Sums `grad` (of `grad_shape`) over the dims along which `out_shape` was broadcast to it, writing
/// a tensor of `out_shape` into `out`: the adjoint of [`broadcast_to_into`], used to return the
/// gradient of a broadcasting op to its input.
pub fn sum_to_shape_into<T: Float>(
    grad: &[T],
    grad_shape: &[usize],
    out_shape: &[usize],
    out: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "sum_to_shape";
    check::buffer_len(OP, "grad", grad_shape.iter().product(), grad.len())?;
    check::buffer_len(OP, "out", out_shape.iter().product(), out.len())?;
    check_broadcasts_to(OP, out_shape, grad_shape)?;
    if let Some(cols) = leading_rows_sum(grad_shape, out_shape) {
        sum_rows_into(grad, cols, out);
        return Ok(());
    }
    out.fill(T::ZERO);
    let out_strides = broadcast_strides(out_shape, grad_shape);
    let grad_strides = contiguous_strides(grad_shape);
    for_each_row(
        grad_shape,
        [&grad_strides, &out_strides],
        |[g, o], len, [_, out_step]| {
            let src = &grad[g..g + len];
            if out_step == 0 {
                out[o] += sum_slice(src);
            } else {
                for (acc, &v) in out[o..o + len].iter_mut().zip(src) {
                    *acc += v;
                }
            }
        },
    );
    Ok(())
}

/// The row length when summing `grad_shape` to `out_shape` adds whole rows: `out_shape`
/// without its leading 1s is `grad_shape`'s trailing dims, `grad` being rows of that many
/// elements (a bias gradient: `[B, S, n]` to `[n]`). `None` otherwise, or for rows of one
/// element (summed by [`sum_slice`]'s order instead).
fn leading_rows_sum(grad_shape: &[usize], out_shape: &[usize]) -> Option<usize> {
    let kept = &out_shape[out_shape.iter().take_while(|&&d| d == 1).count()..];
    let trailing = grad_shape.len().checked_sub(kept.len())?;
    let cols: usize = kept.iter().product();
    (grad_shape[trailing..] == *kept && !kept.is_empty() && kept[kept.len() - 1] > 1)
        .then_some(cols)
}

/// `out[c] = Σ_r grad[r·cols + c]`, the rows added in order to zeros (one add each, as
/// [`sum_to_shape_into`]'s walk adds them), the columns shared out among the allowed threads
/// in whole cache lines, so the bits do not depend on the thread count.
fn sum_rows_into<T: Float>(grad: &[T], cols: usize, out: &mut [T]) {
    if cols == 0 {
        return;
    }
    let rows = grad.len() / cols;
    let threads = if grad.len() >= super::threads::MIN_PARALLEL_ELEMENTS {
        super::threads::threads()
    } else {
        1
    };
    // Sixteen f32 (64 bytes) per line; f64 columns keep the same count.
    let chunk = cols.div_ceil(threads.max(1)).next_multiple_of(16);
    if chunk >= cols {
        sum_rows_part(grad, (rows, cols), 0, out);
        return;
    }
    let parts: Vec<&mut [T]> = out.chunks_mut(chunk).collect();
    super::threads::for_each_part(parts, |i, part| {
        sum_rows_part(grad, (rows, cols), i * chunk, part)
    });
}

widest! {
    /// Columns `first..first + out.len()` of [`sum_rows_into`], on the widest vector unit the
    /// CPU has.
    fn sum_rows_part<T>(grad: &[T], shape: (usize, usize), first: usize, out: &mut [T]) => sum_rows_part_loop
}

/// [`sum_rows_part`]'s loop.
#[inline(always)]
fn sum_rows_part_loop<T: Float>(
    grad: &[T],
    (rows, cols): (usize, usize),
    first: usize,
    out: &mut [T],
) {
    out.fill(T::ZERO);
    for r in 0..rows {
        let row = &grad[r * cols + first..r * cols + first + out.len()];
        for (acc, &v) in out.iter_mut().zip(row) {
            *acc += v;
        }
    }
}

/// `Ok` when `shape` broadcasts to exactly `target` (no dim of `target` stretches).
pub(crate) fn check_broadcasts_to(
    op: &'static str,
    shape: &[usize],
    target: &[usize],
) -> Result<(), TensorError> {
    match broadcast_shape(op, shape, target) {
        Ok(b) if b == target => Ok(()),
        _ => Err(TensorError::NotBroadcastable {
            op,
            lhs: shape.to_vec(),
            rhs: target.to_vec(),
        }),
    }
}

/// `x` broadcast to `shape` (a new contiguous tensor of `x`'s dtype).
pub fn broadcast_to(x: &Tensor, shape: &[usize]) -> Result<Tensor, TensorError> {
    const OP: &str = "broadcast_to";
    with_float!(OP, x.dtype(), |T| {
        let xs = T::read(OP, x)?;
        let mut out = vec![T::ZERO; shape.iter().product()];
        broadcast_to_into::<T>(&xs, x.shape(), shape, &mut out)?;
        Ok(T::write(shape, out, x.dtype()))
    })
}

/// `grad` summed down to `shape`: the gradient of an input of `shape` that was broadcast to
/// `grad`'s shape. `shape` must broadcast to `grad.shape()`.
pub fn sum_to_shape(grad: &Tensor, shape: &[usize]) -> Result<Tensor, TensorError> {
    const OP: &str = "sum_to_shape";
    with_float!(OP, grad.dtype(), |T| {
        let gs = T::read(OP, grad)?;
        let mut out = vec![T::ZERO; shape.iter().product()];
        sum_to_shape_into::<T>(&gs, grad.shape(), shape, &mut out)?;
        Ok(T::write(shape, out, grad.dtype()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sums over leading rows (a bias gradient) add the rows in order to zeros, one add each,
    /// on any thread count and vector unit: bitwise the naive loop.
    #[test]
    fn leading_row_sums_are_the_rows_added_in_order_on_any_thread_count() {
        let cases: [(&[usize], &[usize]); 4] = [
            (&[7, 129, 67], &[67]),
            (&[16, 128, 768], &[768]),
            (&[3, 5, 300], &[1, 5, 300]),
            (&[4, 40, 2], &[40, 2]),
        ];
        for (grad_shape, out_shape) in cases {
            let n: usize = grad_shape.iter().product();
            let cols: usize = out_shape.iter().product();
            assert_eq!(leading_rows_sum(grad_shape, out_shape), Some(cols));
            let grad: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
                .collect();
            let mut naive = vec![0f32; cols];
            for row in grad.chunks_exact(cols) {
                for (a, &v) in naive.iter_mut().zip(row) {
                    *a += v;
                }
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for threads in [1, 2, 3] {
                crate::kernels::threads::set_threads(threads);
                let mut out = vec![f32::NAN; cols];
                sum_to_shape_into(&grad, grad_shape, out_shape, &mut out).unwrap();
                crate::kernels::threads::set_threads(1);
                assert_eq!(bits(&out), bits(&naive), "{grad_shape:?} on {threads}");
            }
            let mut portable = vec![0f32; cols];
            sum_rows_part_loop(&grad, (n / cols, cols), 0, &mut portable);
            assert_eq!(bits(&portable), bits(&naive));
        }
        // Not whole rows: a broadcast inner dim, or rows of one element.
        assert_eq!(leading_rows_sum(&[4, 5, 6], &[5, 1]), None);
        assert_eq!(leading_rows_sum(&[4, 1], &[1]), None);
        assert_eq!(leading_rows_sum(&[4, 5], &[1, 1]), None);
        assert_eq!(leading_rows_sum(&[5], &[4, 5]), None);
    }

    #[test]
    fn shape_rule() {
        assert_eq!(
            broadcast_shape("t", &[2, 1, 3], &[4, 1]).unwrap(),
            vec![2, 4, 3]
        );
        assert_eq!(broadcast_shape("t", &[], &[5]).unwrap(), vec![5]);
        assert!(matches!(
            broadcast_shape("t", &[2, 3], &[4]),
            Err(TensorError::NotBroadcastable { .. })
        ));
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
    }

    #[test]
    fn rows_are_merged() {
        let mut rows = Vec::new();
        let s = contiguous_strides(&[2, 3, 4]);
        for_each_row(&[2, 3, 4], [&s], |[o], len, _| rows.push((o, len)));
        assert_eq!(rows, vec![(0, 24)]);
    }
}
