//! A product and the bias add over its output as one kernel ([`eval_product_with_bias`]): the
//! executor's fused epilogue for a `MatMul`/`BatchMatMul` whose output only a `BiasAdd` reads.

use tensor::kernels::{self, Float, GemmShape};
use tensor::{DType, Element, Tensor};

use super::eval::{eval_op, EvalCtx};
use super::in_place::eval_in_place;
use super::operands::{read, write};
use crate::error::GraphError;
use crate::op::Op;

/// `output` ← `op` (a `MatMul` or `BatchMatMul`) of `inputs`, then `bias` added to every row:
/// the bits of [`eval_op`] of the product followed by [`eval_in_place`] of `BiasAdd` over its
/// output. In the ordinary mode, for `f32` and `f64` and a 1-D bias as long as the output's
/// last dim, the bias goes to the product's kernel ([`kernels::batch_matmul_bias_into`]),
/// which adds it to each tile as it is stored where its route allows; otherwise the two ops
/// run one after the other, with their own checks and errors.
pub fn eval_product_with_bias(
    op: &Op,
    inputs: &[&Tensor],
    bias: &Tensor,
    output: &mut Tensor,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let fits = inputs.len() == 2
        && ctx.deterministic.is_none()
        && bias.dtype() == output.dtype()
        && inputs
            .iter()
            .all(|t| t.dtype() == output.dtype() && t.ndim() >= 2)
        && bias.shape()
            == output
                .shape()
                .last()
                .map(std::slice::from_ref)
                .unwrap_or(&[]);
    match (op, output.dtype()) {
        (Op::MatMul { .. } | Op::BatchMatMul { .. }, DType::F32) if fits => {
            fused::<f32>(op, inputs, bias, output, ctx)
        }
        (Op::MatMul { .. } | Op::BatchMatMul { .. }, DType::F64) if fits => {
            fused::<f64>(op, inputs, bias, output, ctx)
        }
        _ => {
            eval_op(op, inputs, std::slice::from_mut(output), ctx)?;
            eval_in_place(&Op::BiasAdd, 0, output, bias, ctx)
        }
    }
}

/// [`eval_product_with_bias`]'s fused form on checked dtypes and ranks.
fn fused<T: Float + Element>(
    op: &Op,
    inputs: &[&Tensor],
    bias: &Tensor,
    output: &mut Tensor,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let (a, b) = (inputs[0], inputs[1]);
    let (trans_a, trans_b) = match op {
        Op::MatMul {
            transpose_a,
            transpose_b,
        }
        | Op::BatchMatMul {
            transpose_a,
            transpose_b,
        } => (*transpose_a, *transpose_b),
        _ => unreachable!("the caller matched a product"),
    };
    if matches!(op, Op::MatMul { .. }) && (a.ndim() != 2 || b.ndim() != 2) {
        // `MatMul`'s own error for operands that are not matrices.
        eval_op(op, inputs, std::slice::from_mut(output), ctx)?;
        return eval_in_place(&Op::BiasAdd, 0, output, bias, ctx);
    }
    let out_shape = output.shape().to_vec();
    let bias = read::<T>(bias, ctx)?;
    let (xa, xb) = (read::<T>(a, ctx)?, read::<T>(b, ctx)?);
    let out = write::<T>(output, ctx)?;
    let result = match op {
        Op::MatMul { .. } => {
            let shape = GemmShape {
                m: out_shape[0],
                n: out_shape[1],
                k: if trans_a { a.shape()[0] } else { a.shape()[1] },
                trans_a,
                trans_b,
            };
            kernels::gemm_bias(shape, xa, xb, bias, out)
        }
        _ => kernels::batch_matmul_bias_into(
            (xa, a.shape()),
            (xb, b.shape()),
            (trans_a, trans_b),
            Some(bias),
            (out, &out_shape),
        ),
    };
    result.map_err(GraphError::kernel(ctx.node))
}
