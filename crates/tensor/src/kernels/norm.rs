//! Layer normalisation over the trailing dims, with learnt scale `gamma` and shift `beta`.
//!
//! `x` of shape `[lead..., norm...]` is a stack of rows of `n = prod(norm)` elements, where `norm`
//! is `gamma`'s shape. Each row is normalised with its own biased variance:
//! `y = (x - mean) · rstd · gamma + beta`, `rstd = 1 / √(var + ε)`. The forward pass returns the
//! per-row `mean` and `rstd` (shape `[lead...]`) for the backward pass.

use crate::error::TensorError;
use crate::kernels::check;
use crate::kernels::float::{with_float, Float};
use crate::kernels::reduce::{fold_lanes, sum_slice, LANES};
use crate::kernels::wide::widest;
use crate::tensor::Tensor;

/// The learnt parameters and epsilon of a layer norm (slice level).
#[derive(Debug, Clone, Copy)]
pub struct LayerNormParams<'a, T> {
    /// Scale, one per normalised element.
    pub gamma: &'a [T],
    /// Shift, one per normalised element.
    pub beta: &'a [T],
    /// Added to the variance.
    pub epsilon: T,
}

/// What the backward pass reads (slice level): the forward input, its statistics and `gamma`.
#[derive(Debug, Clone, Copy)]
pub struct LayerNormSaved<'a, T> {
    /// The forward input.
    pub x: &'a [T],
    /// Per-row mean from the forward pass.
    pub mean: &'a [T],
    /// Per-row reciprocal standard deviation from the forward pass.
    pub rstd: &'a [T],
    /// The scale.
    pub gamma: &'a [T],
}

/// The gradient buffers the backward pass overwrites (slice level).
#[derive(Debug)]
pub struct LayerNormGradBuffers<'a, T> {
    /// Gradient of `x` (`x`'s length).
    pub dx: &'a mut [T],
    /// Gradient of `gamma` (`gamma`'s length).
    pub dgamma: &'a mut [T],
    /// Gradient of `beta` (`gamma`'s length).
    pub dbeta: &'a mut [T],
}

/// The number of rows of `x_len` elements in rows of `cols`.
fn row_count(op: &'static str, x_len: usize, cols: usize) -> Result<usize, TensorError> {
    if cols == 0 {
        return Err(TensorError::InvalidArgument {
            op,
            reason: "normalised size is 0".to_string(),
        });
    }
    check::buffer_len(op, "x", x_len - x_len % cols, x_len)?;
    Ok(x_len / cols)
}

/// Layer norm of `x` viewed as rows of `params.gamma.len()` elements; writes `y`, and the
/// per-row `mean` and `rstd`.
pub fn layer_norm_into<T: Float>(
    x: &[T],
    params: LayerNormParams<'_, T>,
    y: &mut [T],
    mean: &mut [T],
    rstd: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "layer_norm";
    let cols = params.gamma.len();
    let rows = row_count(OP, x.len(), cols)?;
    check::buffer_len(OP, "beta", cols, params.beta.len())?;
    check::buffer_len(OP, "y", x.len(), y.len())?;
    check::buffer_len(OP, "mean", rows, mean.len())?;
    check::buffer_len(OP, "rstd", rows, rstd.len())?;
    if rows == 0 {
        return Ok(());
    }
    // Rows are independent: one part of them per thread of the rank.
    let per = super::threads::rows_per_part(rows, cols);
    if per >= rows {
        // One part: no list of parts (a training step allocates nothing here).
        layer_norm_rows(x, &params, y, mean, rstd);
        return Ok(());
    }
    let parts: Vec<_> = x
        .chunks(per * cols)
        .zip(y.chunks_mut(per * cols))
        .zip(mean.chunks_mut(per).zip(rstd.chunks_mut(per)))
        .collect();
    super::threads::for_each_part(parts, |_, ((x, y), (mean, rstd))| {
        layer_norm_rows(x, &params, y, mean, rstd)
    });
    Ok(())
}

widest! {
    /// [`layer_norm_into`] on whole rows, lengths checked; on the widest vector unit the CPU
    /// has.
    fn layer_norm_rows<T>(
        x: &[T],
        params: &LayerNormParams<'_, T>,
        y: &mut [T],
        mean: &mut [T],
        rstd: &mut [T],
    ) => layer_norm_rows_loop
}

/// [`layer_norm_rows`]' loop.
#[inline(always)]
fn layer_norm_rows_loop<T: Float>(
    x: &[T],
    params: &LayerNormParams<'_, T>,
    y: &mut [T],
    mean: &mut [T],
    rstd: &mut [T],
) {
    let cols = params.gamma.len();
    let inv_cols = T::ONE / T::from_usize(cols);
    for (r, (x_row, y_row)) in x
        .chunks_exact(cols)
        .zip(y.chunks_exact_mut(cols))
        .enumerate()
    {
        let mu = sum_slice(x_row) * inv_cols;
        // Two passes (centre, then square) so a large mean does not swamp the variance.
        for (o, &v) in y_row.iter_mut().zip(x_row) {
            let centred = v - mu;
            *o = centred * centred;
        }
        let inv_std = T::ONE / (sum_slice(y_row) * inv_cols + params.epsilon).sqrt();
        for (((o, &v), &g), &b) in y_row
            .iter_mut()
            .zip(x_row)
            .zip(params.gamma)
            .zip(params.beta)
        {
            *o = (v - mu) * inv_std * g + b;
        }
        mean[r] = mu;
        rstd[r] = inv_std;
    }
}

/// Backward of [`layer_norm_into`]: with `x̂ = (x - mean)·rstd` and `g = dy·gamma`,
/// `dx = rstd · (g - mean(g) - x̂·mean(g·x̂))`, `dgamma = Σ_rows dy·x̂`, `dbeta = Σ_rows dy`.
pub fn layer_norm_grad_into<T: Float>(
    saved: LayerNormSaved<'_, T>,
    dy: &[T],
    grads: LayerNormGradBuffers<'_, T>,
) -> Result<(), TensorError> {
    let rows = check_grad_buffers("layer_norm_grad", &saved, dy, &grads)?;
    grads.dgamma.fill(T::ZERO);
    grads.dbeta.fill(T::ZERO);
    layer_norm_grad_rows(&saved, dy, grads.dx, 0..rows, (grads.dgamma, grads.dbeta));
    Ok(())
}

/// Checks the buffers of a LayerNorm gradient; the row count.
pub(crate) fn check_grad_buffers<T: Float>(
    op: &'static str,
    saved: &LayerNormSaved<'_, T>,
    dy: &[T],
    grads: &LayerNormGradBuffers<'_, T>,
) -> Result<usize, TensorError> {
    let cols = saved.gamma.len();
    let rows = row_count(op, saved.x.len(), cols)?;
    check::buffer_len(op, "dy", saved.x.len(), dy.len())?;
    check::buffer_len(op, "mean", rows, saved.mean.len())?;
    check::buffer_len(op, "rstd", rows, saved.rstd.len())?;
    check::buffer_len(op, "dx", saved.x.len(), grads.dx.len())?;
    check::buffer_len(op, "dgamma", cols, grads.dgamma.len())?;
    check::buffer_len(op, "dbeta", cols, grads.dbeta.len())?;
    Ok(rows)
}

widest! {
    /// Rows `rows` of a LayerNorm gradient: their `dx` (all of `dx`, of which these rows are
    /// written), and `dy·x̂` and `dy` added row after row into `dgamma` and `dbeta`; on the
    /// widest vector unit the CPU has.
    pub(crate) fn layer_norm_grad_rows<T>(
        saved: &LayerNormSaved<'_, T>,
        dy: &[T],
        dx: &mut [T],
        rows: std::ops::Range<usize>,
        param_grads: (&mut [T], &mut [T]),
    ) => layer_norm_grad_rows_loop
}

/// [`layer_norm_grad_rows`]' loop. A row's two sums keep [`LANES`] accumulators (column `c` in
/// lane `c mod LANES`, folded pairwise, then the tail in order), as [`sum_slice`] does, so
/// they vectorise; their order depends only on the row's length.
#[inline(always)]
fn layer_norm_grad_rows_loop<T: Float>(
    saved: &LayerNormSaved<'_, T>,
    dy: &[T],
    dx: &mut [T],
    rows: std::ops::Range<usize>,
    (dgamma, dbeta): (&mut [T], &mut [T]),
) {
    let cols = saved.gamma.len();
    let inv_cols = T::ONE / T::from_usize(cols);
    let whole = cols / LANES * LANES;
    let span = rows.start * cols..rows.end * cols;
    let rows_iter = saved.x[span.clone()]
        .chunks_exact(cols)
        .zip(dy[span.clone()].chunks_exact(cols))
        .zip(dx[span].chunks_exact_mut(cols));
    let (gamma, dgamma, dbeta) = (
        &saved.gamma[..cols],
        &mut dgamma[..cols],
        &mut dbeta[..cols],
    );
    for (r, ((x_row, dy_row), dx_row)) in rows.zip(rows_iter) {
        let (mu, inv_std) = (saved.mean[r], saved.rstd[r]);
        // First pass: the two row means, and the parameter gradients (iterators over equal
        // chunks, so no index is checked in the loop and it vectorises).
        let (mut acc_g, mut acc_g_xhat) = ([T::ZERO; LANES], [T::ZERO; LANES]);
        let lanes = x_row[..whole]
            .chunks_exact(LANES)
            .zip(dy_row[..whole].chunks_exact(LANES))
            .zip(gamma[..whole].chunks_exact(LANES))
            .zip(dgamma[..whole].chunks_exact_mut(LANES))
            .zip(dbeta[..whole].chunks_exact_mut(LANES));
        for ((((x, d), g), dg), db) in lanes {
            for l in 0..LANES {
                let xhat = (x[l] - mu) * inv_std;
                let gl = d[l] * g[l];
                acc_g[l] += gl;
                acc_g_xhat[l] += gl * xhat;
                dg[l] += d[l] * xhat;
                db[l] += d[l];
            }
        }
        let mut sum_g = fold_lanes(acc_g, |a, b| a + b);
        let mut sum_g_xhat = fold_lanes(acc_g_xhat, |a, b| a + b);
        for c in whole..cols {
            let xhat = (x_row[c] - mu) * inv_std;
            let g = dy_row[c] * gamma[c];
            sum_g += g;
            sum_g_xhat += g * xhat;
            dgamma[c] += dy_row[c] * xhat;
            dbeta[c] += dy_row[c];
        }
        let mean_g = sum_g * inv_cols;
        let mean_g_xhat = sum_g_xhat * inv_cols;
        let row = x_row.iter().zip(dy_row).zip(gamma).zip(dx_row.iter_mut());
        for (((&x, &d), &g), out) in row {
            let xhat = (x - mu) * inv_std;
            *out = inv_std * (d * g - mean_g - xhat * mean_g_xhat);
        }
    }
}

/// The forward results of [`layer_norm`].
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNormOutput {
    /// The normalised output, `x`'s shape and dtype.
    pub y: Tensor,
    /// Per-row mean, shape `x.shape()[..x.ndim() - gamma.ndim()]`, in the compute dtype
    /// (f32 for f16/bf16 inputs, so the backward pass keeps full precision).
    pub mean: Tensor,
    /// Per-row `1/√(var + ε)`, shaped and typed like `mean`.
    pub rstd: Tensor,
}

/// The gradients returned by [`layer_norm_grad`].
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNormGrads {
    /// Gradient of `x`.
    pub dx: Tensor,
    /// Gradient of `gamma`.
    pub dgamma: Tensor,
    /// Gradient of `beta`.
    pub dbeta: Tensor,
}

/// The leading (row) shape of `x` when normalising over `norm_shape`, or a shape error.
fn lead_shape<'x>(
    op: &'static str,
    x: &'x Tensor,
    norm_shape: &[usize],
) -> Result<&'x [usize], TensorError> {
    let k = norm_shape.len();
    if k == 0 || x.ndim() < k || &x.shape()[x.ndim() - k..] != norm_shape {
        return Err(TensorError::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: norm_shape.to_vec(),
        });
    }
    Ok(&x.shape()[..x.ndim() - k])
}

/// Layer norm over the trailing `gamma.ndim()` dims of `x`, whose sizes must equal `gamma`'s
/// (and `beta`'s) shape. MindSpore's `LayerNorm(begin_norm_axis = begin_params_axis = -k)`.
pub fn layer_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    epsilon: f64,
) -> Result<LayerNormOutput, TensorError> {
    const OP: &str = "layer_norm";
    check::same_dtype(OP, x, gamma)?;
    check::same_dtype(OP, x, beta)?;
    check::same_shape(OP, gamma, beta)?;
    let lead = lead_shape(OP, x, gamma.shape())?;
    with_float!(OP, x.dtype(), |T| {
        let xs = T::read(OP, x)?;
        let gs = T::read(OP, gamma)?;
        let bs = T::read(OP, beta)?;
        let rows: usize = lead.iter().product();
        let mut y = vec![T::ZERO; xs.len()];
        let mut mean = vec![T::ZERO; rows];
        let mut rstd = vec![T::ZERO; rows];
        let params = LayerNormParams {
            gamma: &gs,
            beta: &bs,
            epsilon: T::from_f64(epsilon),
        };
        layer_norm_into::<T>(&xs, params, &mut y, &mut mean, &mut rstd)?;
        Ok(LayerNormOutput {
            y: T::write(x.shape(), y, x.dtype()),
            mean: T::write(lead, mean, T::DTYPE),
            rstd: T::write(lead, rstd, T::DTYPE),
        })
    })
}

/// The gradients of [`layer_norm`] from its input `x`, upstream `dy`, the saved `mean` and `rstd`,
/// and `gamma`.
pub fn layer_norm_grad(
    x: &Tensor,
    dy: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    gamma: &Tensor,
) -> Result<LayerNormGrads, TensorError> {
    const OP: &str = "layer_norm_grad";
    check::same_dtype(OP, x, dy)?;
    check::same_dtype(OP, x, gamma)?;
    check::same_shape(OP, x, dy)?;
    check::same_shape(OP, mean, rstd)?;
    let lead = lead_shape(OP, x, gamma.shape())?;
    if mean.shape() != lead {
        return Err(TensorError::ShapeMismatch {
            op: OP,
            lhs: lead.to_vec(),
            rhs: mean.shape().to_vec(),
        });
    }
    with_float!(OP, x.dtype(), |T| {
        for stat in [mean, rstd] {
            if stat.dtype() != T::DTYPE && stat.dtype() != x.dtype() {
                return Err(TensorError::DTypeMismatch {
                    op: OP,
                    expected: T::DTYPE,
                    got: stat.dtype(),
                });
            }
        }
        let xs = T::read(OP, x)?;
        let gs = T::read(OP, dy)?;
        let means = T::read(OP, mean)?;
        let rstds = T::read(OP, rstd)?;
        let gammas = T::read(OP, gamma)?;
        let mut dx = vec![T::ZERO; xs.len()];
        let mut dgamma = vec![T::ZERO; gammas.len()];
        let mut dbeta = vec![T::ZERO; gammas.len()];
        let saved = LayerNormSaved {
            x: &xs,
            mean: &means,
            rstd: &rstds,
            gamma: &gammas,
        };
        let buffers = LayerNormGradBuffers {
            dx: &mut dx,
            dgamma: &mut dgamma,
            dbeta: &mut dbeta,
        };
        layer_norm_grad_into::<T>(saved, &gs, buffers)?;
        Ok(LayerNormGrads {
            dx: T::write(x.shape(), dx, x.dtype()),
            dgamma: T::write(gamma.shape(), dgamma, gamma.dtype()),
            dbeta: T::write(gamma.shape(), dbeta, gamma.dtype()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatched forward rows (AVX-512 or AVX2 where the CPU has it) give the portable
    /// loop's bits, on rows of whole lanes and rows with a tail.
    #[test]
    fn the_wide_rows_give_the_portable_bits() {
        for cols in [256, 64, 37, 5] {
            let rows = 6;
            let value = |n: usize, m: usize| -> Vec<f32> {
                (0..n).map(|i| ((i * m) % 97) as f32 / 11.0 - 4.0).collect()
            };
            let (x, gamma, beta) = (value(rows * cols, 7), value(cols, 5), value(cols, 3));
            let params = LayerNormParams {
                gamma: &gamma,
                beta: &beta,
                epsilon: 1e-5,
            };
            let run = |wide: bool| {
                let (mut y, mut mean, mut rstd) =
                    (vec![0f32; rows * cols], vec![0f32; rows], vec![0f32; rows]);
                if wide {
                    layer_norm_rows(&x, &params, &mut y, &mut mean, &mut rstd);
                } else {
                    layer_norm_rows_loop(&x, &params, &mut y, &mut mean, &mut rstd);
                }
                [y, mean, rstd].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            };
            assert_eq!(run(true), run(false), "{cols} columns");
        }
    }

    /// The dispatched rows (AVX-512 or AVX2 where the CPU has it) give the portable loop's bits,
    /// on rows of whole lanes and rows with a tail.
    #[test]
    fn the_wide_gradient_rows_give_the_portable_bits() {
        for cols in [64, 37, 5] {
            let rows = 6;
            let value = |n: usize, m: usize| -> Vec<f32> {
                (0..n).map(|i| ((i * m) % 97) as f32 / 11.0 - 4.0).collect()
            };
            let (x, dy, gamma) = (
                value(rows * cols, 7),
                value(rows * cols, 13),
                value(cols, 5),
            );
            let (mean, rstd) = (
                value(rows, 3),
                value(rows, 17)
                    .iter()
                    .map(|v| v.abs() + 0.5)
                    .collect::<Vec<_>>(),
            );
            let saved = LayerNormSaved {
                x: &x,
                mean: &mean,
                rstd: &rstd,
                gamma: &gamma,
            };
            let run = |wide: bool| {
                let (mut dx, mut dg, mut db) = (
                    vec![0f32; rows * cols],
                    vec![0.5f32; cols],
                    vec![0.25f32; cols],
                );
                if wide {
                    layer_norm_grad_rows(&saved, &dy, &mut dx, 1..rows, (&mut dg, &mut db));
                } else {
                    layer_norm_grad_rows_loop(&saved, &dy, &mut dx, 1..rows, (&mut dg, &mut db));
                }
                [dx, dg, db].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            };
            assert_eq!(run(true), run(false), "{cols} columns");
        }
    }
}
