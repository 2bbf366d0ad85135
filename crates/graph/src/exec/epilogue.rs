//! A product and the bias add over its output as one kernel ([`eval_product_with_bias`]): the
//! executor's fused epilogue for a `MatMul`/`BatchMatMul` whose output only a `BiasAdd` reads,
//! in the ordinary mode and in deterministic mode's canonical order alike.

use tensor::kernels::{self, Float, GemmShape};
use tensor::{DType, Element, Tensor};

use super::eval::{eval_op, EvalCtx};
use super::operands::{read, write};
use crate::error::GraphError;
use crate::op::Op;

/// `output` ← `op` (a `MatMul` or `BatchMatMul`) of `inputs`, then `bias` added to every row:
/// the bits of [`eval_op`] of the product followed by `BiasAdd` (in place,
/// [`super::eval_in_place`], or not: the same bits). For `f32` and `f64` and a 1-D bias as long
/// as the output's last dim, the bias goes to the product's kernel, which adds it to each tile
/// as it is stored where its route allows: [`kernels::batch_matmul_bias_into`] and
/// [`kernels::gemm_bias`] in the ordinary mode, the canonical-order product
/// ([`kernels::det::det_gemm_bias`]) in deterministic mode; otherwise the two ops run one after
/// the other, with their own checks and errors.
pub fn eval_product_with_bias(
    op: &Op,
    inputs: &[&Tensor],
    bias: &Tensor,
    output: &mut Tensor,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let transposes = match op {
        Op::MatMul {
            transpose_a,
            transpose_b,
        }
        | Op::BatchMatMul {
            transpose_a,
            transpose_b,
        } => Some((*transpose_a, *transpose_b)),
        _ => None,
    };
    // `MatMul` takes matrices only, `BatchMatMul` at least matrices.
    let ranks_fit = |t: &&Tensor| match op {
        Op::MatMul { .. } => t.ndim() == 2,
        _ => t.ndim() >= 2,
    };
    let fits = inputs.len() == 2
        && bias.dtype() == output.dtype()
        && inputs
            .iter()
            .all(|t| t.dtype() == output.dtype() && ranks_fit(t))
        && bias.shape()
            == output
                .shape()
                .last()
                .map(std::slice::from_ref)
                .unwrap_or(&[]);
    match (transposes, output.dtype()) {
        (Some(trans), DType::F32) if fits => fused::<f32>(op, inputs, trans, bias, output, ctx),
        (Some(trans), DType::F64) if fits => fused::<f64>(op, inputs, trans, bias, output, ctx),
        _ => {
            // The two ops as the executor runs them apart: the product, then the bias add into
            // the output.
            let mut product = Tensor::zeros(output.dtype(), output.shape());
            eval_op(op, inputs, std::slice::from_mut(&mut product), ctx)?;
            eval_op(
                &Op::BiasAdd,
                &[&product, bias],
                std::slice::from_mut(output),
                ctx,
            )
        }
    }
}

/// [`eval_product_with_bias`]'s fused form, on operands whose dtypes and ranks fit.
fn fused<T: Float + Element>(
    op: &Op,
    inputs: &[&Tensor],
    (trans_a, trans_b): (bool, bool),
    bias: &Tensor,
    output: &mut Tensor,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    if let Some(max_blocks) = ctx.deterministic {
        return super::deterministic::product_with_bias::<T>(
            op,
            inputs,
            Some(bias),
            output,
            ctx,
            max_blocks,
        )
        .expect("a MatMul or BatchMatMul");
    }
    let (a, b) = (inputs[0], inputs[1]);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` values of `dtype` in [-1, 1).
    fn values(shape: &[usize], salt: usize, dtype: DType) -> Tensor {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|i| ((i * 37 + salt * 11) % 101) as f64 / 50.5 - 1.0)
            .collect();
        Tensor::from_vec::<f64>(shape, data)
            .unwrap()
            .to_dtype(dtype)
    }

    /// Fused or not (half dtypes), in the ordinary and the deterministic mode, the product with
    /// its bias has the bits of the product then the bias add, for `MatMul` and `BatchMatMul`
    /// with either transpose; in deterministic mode also over 16 canonical blocks of a
    /// reduction long enough to take several passes (the bias after the passes' sums join).
    #[test]
    fn the_product_with_its_bias_is_the_two_ops() {
        let cases: [(_, &[Option<usize>]); 2] = [
            ((300, 70, 65), &[None, Some(4)]),
            ((30, 70, 2048), &[Some(16)]),
        ];
        for ((m, n, k), modes) in cases {
            the_product_with_its_bias_is_the_two_ops_for((m, n, k), modes);
        }
    }

    fn the_product_with_its_bias_is_the_two_ops_for(
        (m, n, k): (usize, usize, usize),
        modes: &[Option<usize>],
    ) {
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            for &deterministic in modes {
                let ctx = EvalCtx {
                    node: "product",
                    step: 0,
                    placement: None,
                    input_blocks: &[],
                    deterministic,
                };
                for (transpose_a, transpose_b) in [(false, false), (false, true), (true, false)] {
                    let a_shape = if transpose_a { [k, m] } else { [m, k] };
                    let b_shape = if transpose_b { [n, k] } else { [k, n] };
                    let ops = [
                        Op::MatMul {
                            transpose_a,
                            transpose_b,
                        },
                        Op::BatchMatMul {
                            transpose_a,
                            transpose_b,
                        },
                    ];
                    let (a, b) = (values(&a_shape, 1, dtype), values(&b_shape, 2, dtype));
                    let bias = values(&[n], 3, dtype);
                    for op in ops {
                        let mut product = Tensor::zeros(dtype, &[m, n]);
                        eval_op(&op, &[&a, &b], std::slice::from_mut(&mut product), &ctx).unwrap();
                        let mut want = Tensor::zeros(dtype, &[m, n]);
                        let bias_add = [&product, &bias];
                        eval_op(
                            &Op::BiasAdd,
                            &bias_add,
                            std::slice::from_mut(&mut want),
                            &ctx,
                        )
                        .unwrap();
                        let mut got = Tensor::zeros(dtype, &[m, n]);
                        eval_product_with_bias(&op, &[&a, &b], &bias, &mut got, &ctx).unwrap();
                        assert_eq!(
                            got.as_bytes(),
                            want.as_bytes(),
                            "{op:?} {dtype:?} {deterministic:?}"
                        );
                    }
                }
            }
        }
    }

    /// A bias of the wrong length gets the bias add's own error, naming the node.
    #[test]
    fn a_bias_of_the_wrong_length_is_the_bias_add_s_error() {
        let ctx = EvalCtx {
            node: "fc1",
            step: 0,
            placement: None,
            input_blocks: &[],
            deterministic: None,
        };
        let op = Op::MatMul {
            transpose_a: false,
            transpose_b: false,
        };
        let (a, b) = (
            values(&[8, 4], 1, DType::F32),
            values(&[4, 6], 2, DType::F32),
        );
        let mut out = Tensor::zeros(DType::F32, &[8, 6]);
        let bias = values(&[5], 3, DType::F32);
        let err = eval_product_with_bias(&op, &[&a, &b], &bias, &mut out, &ctx).unwrap_err();
        assert!(err.to_string().contains("fc1"), "{err}");
    }
}
