//! Deterministic mode's dispatch: the ops that sum over a dim a strategy may split, computed in
//! the canonical order of `tensor::kernels::det` with blocks fixed by the dim's *global*
//! length, so every split that aligns with the blocks gives one device's bits.

use tensor::kernels::{self, det, Float, GemmShape};
use tensor::{Element, Storage, Tensor};

use super::eval::EvalCtx;
use super::operands::{min_rank, mismatch, read, write, write_scalar};
use crate::error::GraphError;
use crate::infer::matrix_dims;
use crate::op::Op;

/// The global shape of input `i` (its local shape when the inputs are whole).
fn global_shape<'a>(ctx: &'a EvalCtx<'_>, i: usize, local: &'a [usize]) -> &'a [usize] {
    match ctx.input_blocks.get(i) {
        Some(b) if b.global_shape.len() == local.len() => &b.global_shape,
        _ => local,
    }
}

/// The canonical block length of a summed space of `global` elements.
pub(super) fn block_len(global: usize, max_blocks: usize) -> usize {
    (global / det::canonical_blocks(global, max_blocks)).max(1)
}

/// Evaluates `op` in canonical order when it is one of the summing ops; `None` for every other
/// op (their results do not depend on how the tensors are split).
pub(super) fn eval_deterministic<T: Float + Element>(
    op: &Op,
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    ctx: &EvalCtx<'_>,
    max_blocks: usize,
) -> Option<Result<(), GraphError>> {
    let kernel = || GraphError::kernel(ctx.node);
    let result = match op {
        Op::MatMul { .. } | Op::BatchMatMul { .. } => {
            return product_with_bias::<T>(op, inputs, None, &mut outputs[0], ctx, max_blocks)
        }
        Op::BatchMatMulSum {
            transpose_a,
            transpose_b,
        } => batch_matmul_sum::<T>(
            inputs,
            &mut outputs[0],
            ctx,
            max_blocks,
            *transpose_a,
            *transpose_b,
        ),
        Op::ReduceSum { axes, .. } => {
            let x = inputs[0];
            let axes: Vec<usize> = if axes.is_empty() {
                (0..x.ndim()).collect()
            } else {
                let mut a = axes.clone();
                a.sort_unstable();
                a
            };
            sum_axes::<T>(x, &axes, &mut outputs[0], ctx, max_blocks)
        }
        Op::SumToShape { .. } | Op::BiasAddGrad => {
            let x = inputs[0];
            let target = outputs[0].shape().to_vec();
            let lead = x.ndim().saturating_sub(target.len());
            let axes: Vec<usize> = (0..x.ndim())
                .filter(|&d| d < lead || (target[d - lead] == 1 && x.shape()[d] != 1))
                .collect();
            sum_axes::<T>(x, &axes, &mut outputs[0], ctx, max_blocks)
        }
        Op::LayerNormGrad => layer_norm_grad::<T>(inputs, outputs, ctx, max_blocks),
        Op::SparseSoftmaxCrossEntropy { batch_divisor } => (|| {
            let logits = inputs[0];
            min_rank(logits, 2, "logits", ctx)?;
            let classes = logits.shape()[1];
            let rows_g = global_shape(ctx, 0, logits.shape())[0];
            let scale = T::ONE / T::from_usize(*batch_divisor);
            let xs = read::<T>(logits, ctx)?;
            let sum = with_ids!(inputs[1], ctx, op, |labels| det::det_cross_entropy_sum(
                xs,
                classes,
                labels,
                scale,
                block_len(rows_g, max_blocks)
            )
            .map_err(kernel()))?;
            write_scalar(&mut outputs[0], sum, ctx)
        })(),
        Op::EmbeddingGrad => (|| {
            let (ids, dy, out) = (inputs[1], inputs[2], &mut outputs[0]);
            min_rank(out, 2, "table gradient", ctx)?;
            let (rows, dim) = (out.shape()[0], out.shape()[1]);
            let block = ctx.output_rows(rows);
            let positions_g: usize = global_shape(ctx, 1, ids.shape()).iter().product();
            let (dys, out) = (read::<T>(dy, ctx)?, write::<T>(out, ctx)?);
            with_ids!(ids, ctx, op, |idx| det::det_scatter_add_block_rows(
                out,
                block,
                dim,
                idx,
                dys,
                block_len(positions_g, max_blocks)
            )
            .map_err(kernel()))
        })(),
        _ => return None,
    };
    Some(result)
}

/// `x` summed over `axes` (ascending) into `out`.
fn sum_axes<T: Float + Element>(
    x: &Tensor,
    axes: &[usize],
    out: &mut Tensor,
    ctx: &EvalCtx<'_>,
    max_blocks: usize,
) -> Result<(), GraphError> {
    let global = global_shape(ctx, 0, x.shape());
    let summed_g: usize = axes.iter().map(|&d| global[d]).product();
    det::det_sum_axes(
        read::<T>(x, ctx)?,
        x.shape(),
        axes,
        block_len(summed_g, max_blocks),
        write::<T>(out, ctx)?,
    )
    .map_err(GraphError::kernel(ctx.node))
}

/// Row-major copies of operand `x`'s matrices (`[..batch, r, c]`, transposed when `trans`) as
/// `[batch, rows, cols]` of the used (untransposed) orientation.
fn matrices<T: Float>(x: &[T], batch: usize, r: usize, c: usize, trans: bool) -> Vec<T> {
    if !trans {
        return x.to_vec();
    }
    let mut out = vec![T::ZERO; x.len()];
    for b in 0..batch {
        let (src, dst) = (
            &x[b * r * c..(b + 1) * r * c],
            &mut out[b * r * c..(b + 1) * r * c],
        );
        for i in 0..r {
            for j in 0..c {
                dst[j * r + i] = src[i * c + j];
            }
        }
    }
    out
}

/// The operands of a (batched) product and its dims: `op(A)` is `[.., m, k]`, `op(B)` is
/// `[.., k, n]`, and `kg` is `k` in the global tensor.
struct ProductDims<'t> {
    a: &'t Tensor,
    b: &'t Tensor,
    m: usize,
    k: usize,
    n: usize,
    kg: usize,
}

/// [`ProductDims`] of `inputs`, each of at least `rank` dims.
fn product_dims<'t>(
    inputs: &[&'t Tensor],
    ctx: &EvalCtx<'_>,
    rank: usize,
    (ta, tb): (bool, bool),
) -> Result<ProductDims<'t>, GraphError> {
    let (a, b) = (inputs[0], inputs[1]);
    min_rank(a, rank, "a", ctx)?;
    min_rank(b, rank, "b", ctx)?;
    let (m, k) = matrix_dims(a.shape(), ta);
    let (_, n) = matrix_dims(b.shape(), tb);
    let (_, kg) = matrix_dims(global_shape(ctx, 0, a.shape()), ta);
    Ok(ProductDims { a, b, m, k, n, kg })
}

/// `MatMul` or `BatchMatMul` in canonical order, with `bias` (a 1-D tensor as long as the
/// output's last dim) added to every row of the output when given: the bits of the product
/// followed by a separate `BiasAdd` ([`det::det_gemm_bias`] adds it to each tile as it is
/// stored). `None` for every other op.
pub(super) fn product_with_bias<T: Float + Element>(
    op: &Op,
    inputs: &[&Tensor],
    bias: Option<&Tensor>,
    output: &mut Tensor,
    ctx: &EvalCtx<'_>,
    max_blocks: usize,
) -> Option<Result<(), GraphError>> {
    let result = match op {
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => (|| {
            let ProductDims { a, b, m, k, n, kg } =
                product_dims(inputs, ctx, 2, (*transpose_a, *transpose_b))?;
            let shape = GemmShape {
                m,
                n,
                k,
                trans_a: *transpose_a,
                trans_b: *transpose_b,
            };
            let bias = bias.map(|t| read::<T>(t, ctx)).transpose()?;
            det::det_gemm_bias(
                shape,
                read::<T>(a, ctx)?,
                read::<T>(b, ctx)?,
                bias,
                write(output, ctx)?,
                block_len(kg, max_blocks),
            )
            .map_err(GraphError::kernel(ctx.node))
        })(),
        Op::BatchMatMul {
            transpose_a,
            transpose_b,
        } => batch_matmul::<T>(
            inputs,
            bias,
            output,
            ctx,
            max_blocks,
            *transpose_a,
            *transpose_b,
        ),
        _ => return None,
    };
    Some(result)
}

/// A batched product: every batch element through the canonical-order gemm. Batch dims
/// broadcast as NumPy's do (a missing or size-1 dim repeats).
fn batch_matmul<T: Float + Element>(
    inputs: &[&Tensor],
    bias: Option<&Tensor>,
    out: &mut Tensor,
    ctx: &EvalCtx<'_>,
    max_blocks: usize,
    ta: bool,
    tb: bool,
) -> Result<(), GraphError> {
    let ProductDims { a, b, m, k, n, kg } = product_dims(inputs, ctx, 2, (ta, tb))?;
    let (ra, rb) = (a.ndim(), b.ndim());
    let out_shape = out.shape().to_vec();
    let batch_shape = &out_shape[..out_shape.len() - 2];
    let n_batch: usize = batch_shape.iter().product();
    let index_of = |shape: &[usize], flat: usize| -> usize {
        // The batch element of an operand with batch dims `shape` (right-aligned) at `flat`.
        let mut rem = flat;
        let mut idx = 0;
        let mut stride = 1;
        for (d, &size) in batch_shape.iter().enumerate().rev() {
            let coord = rem % size;
            rem /= size;
            let od = d as isize - (batch_shape.len() as isize - shape.len() as isize);
            if od >= 0 {
                let s = shape[od as usize];
                idx += if s == 1 { 0 } else { coord } * stride;
                stride *= s;
            }
        }
        idx
    };
    let (a_batch, b_batch) = (&a.shape()[..ra - 2], &b.shape()[..rb - 2]);
    let xa = read::<T>(a, ctx)?;
    let xb = read::<T>(b, ctx)?;
    let bias = bias.map(|t| read::<T>(t, ctx)).transpose()?;
    let (sa, sb) = (m * k, k * n);
    let bl = block_len(kg, max_blocks);
    let shape = GemmShape {
        m,
        n,
        k,
        trans_a: ta,
        trans_b: tb,
    };
    let c = write::<T>(out, ctx)?;
    let (na, nb): (usize, usize) = (a_batch.iter().product(), b_batch.iter().product());
    if nb == 1 && na == n_batch && !ta {
        // A weight shared by every batch element: one tall product (each element's sum is the
        // same, the rows only stack).
        let tall = GemmShape {
            m: n_batch * m,
            ..shape
        };
        return det::det_gemm_bias(tall, xa, xb, bias, c, bl).map_err(GraphError::kernel(ctx.node));
    }
    for i in 0..n_batch {
        let (ia, ib) = (index_of(a_batch, i), index_of(b_batch, i));
        det::det_gemm_bias(
            shape,
            &xa[ia * sa..(ia + 1) * sa],
            &xb[ib * sb..(ib + 1) * sb],
            bias,
            &mut c[i * m * n..(i + 1) * m * n],
            bl,
        )
        .map_err(GraphError::kernel(ctx.node))?;
    }
    Ok(())
}

/// `Σ_i op(A_i)·op(B_i)`: one product whose reduction runs over (batch, k) row-major.
fn batch_matmul_sum<T: Float + Element>(
    inputs: &[&Tensor],
    out: &mut Tensor,
    ctx: &EvalCtx<'_>,
    max_blocks: usize,
    ta: bool,
    tb: bool,
) -> Result<(), GraphError> {
    let ProductDims { a, b, m, k, n, kg } = product_dims(inputs, ctx, 3, (ta, tb))?;
    let (ra, rb) = (a.ndim(), b.ndim());
    let batch: usize = a.shape()[..ra - 2].iter().product();
    let b_batch: usize = b.shape()[..rb - 2].iter().product();
    if b_batch != batch {
        return Err(mismatch(ctx, "b", a.shape(), <T as Element>::DTYPE, b));
    }
    let batch_g: usize = global_shape(ctx, 0, a.shape())[..ra - 2].iter().product();
    let bl = block_len(batch_g * kg, max_blocks);
    if ta && !tb {
        // A weight's gradient: both operands already hold (batch, k) as their rows.
        let folded = GemmShape {
            trans_a: true,
            ..GemmShape::new(m, n, batch * k)
        };
        return det::det_gemm(
            folded,
            read::<T>(a, ctx)?,
            read::<T>(b, ctx)?,
            write::<T>(out, ctx)?,
            bl,
        )
        .map_err(GraphError::kernel(ctx.node));
    }
    // A as [m, batch·k] and B as [batch·k, n], row-major.
    let am = matrices(
        read::<T>(a, ctx)?,
        batch,
        if ta { k } else { m },
        if ta { m } else { k },
        ta,
    );
    let mut a_f = vec![T::ZERO; m * batch * k];
    for bi in 0..batch {
        for i in 0..m {
            a_f[i * batch * k + bi * k..i * batch * k + (bi + 1) * k]
                .copy_from_slice(&am[bi * m * k + i * k..bi * m * k + (i + 1) * k]);
        }
    }
    let b_f = matrices(
        read::<T>(b, ctx)?,
        batch,
        if tb { n } else { k },
        if tb { k } else { n },
        tb,
    );
    det::det_gemm(
        GemmShape::new(m, n, batch * k),
        &a_f,
        &b_f,
        write::<T>(out, ctx)?,
        bl,
    )
    .map_err(GraphError::kernel(ctx.node))
}

/// LayerNorm's gradient: `dx` row by row as usual; `dgamma` and `dbeta` summed over the rows
/// in canonical order.
fn layer_norm_grad<T: Float + Element>(
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    ctx: &EvalCtx<'_>,
    max_blocks: usize,
) -> Result<(), GraphError> {
    let [dx, dgamma, dbeta] = outputs else {
        unreachable!("eval_op checked the output count")
    };
    let (x, dy, mean, rstd, gamma) = (inputs[0], inputs[1], inputs[2], inputs[3], inputs[4]);
    let cols = gamma.n_elements();
    let rows_g = global_shape(ctx, 0, x.shape()).iter().product::<usize>() / cols.max(1);
    let saved = kernels::LayerNormSaved {
        x: read::<T>(x, ctx)?,
        mean: read::<T>(mean, ctx)?,
        rstd: read::<T>(rstd, ctx)?,
        gamma: read::<T>(gamma, ctx)?,
    };
    let buffers = kernels::LayerNormGradBuffers {
        dx: write(dx, ctx)?,
        dgamma: write(dgamma, ctx)?,
        dbeta: write(dbeta, ctx)?,
    };
    det::det_layer_norm_grad_into(
        saved,
        read::<T>(dy, ctx)?,
        buffers,
        block_len(rows_g, max_blocks),
    )
    .map_err(GraphError::kernel(ctx.node))
}
