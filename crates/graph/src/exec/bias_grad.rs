//! An elementwise op and the `BiasAddGrad` over its output as one pass
//! ([`eval_with_bias_grad`], [`eval_in_place_with_bias_grad`]): the executor's fusion for an
//! activation's gradient or a residual's sum whose output the next step sums into a bias's
//! gradient. Each row of the op's output is added to the bias gradient while it is in L1,
//! instead of read back from memory by a second pass.

use tensor::kernels::{self, Float, RowOrder, RowSums};
use tensor::{DType, Element, Tensor};

use super::attention::packed_attention_grad_summing;
use super::deterministic::block_len;
use super::eval::{binary_kernel, unary_kernel, EvalCtx};
use super::operands::{read, write};
use crate::error::GraphError;
use crate::op::Op;

/// Runs `$body` with `$T` bound to `f32` or `f64` as `$dtype` says; `None` for another dtype.
macro_rules! per_float {
    ($dtype:expr, |$T:ident| $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            _ => None,
        }
    };
}

/// `output` ← `op` of `inputs` (an activation's gradient, `GeluGrad`, `ReluGrad`, …, or
/// `PackedAttentionGrad`) and `bias_grad` ← `BiasAddGrad` of `output` (seen as rows of
/// `bias_grad`'s length, as a reshape between them would) with `bias_ctx`, the `BiasAddGrad`
/// node's context, in one pass: the bits of [`eval_op`] of the two, in either mode. `Ok(false)`
/// where one pass cannot give them (another dtype, a gradient that is not 1-D over the
/// output's trailing dims, more than one thread allowed, rows that are not whole canonical
/// blocks in deterministic mode): then nothing was run, and the caller runs the two apart.
pub fn eval_with_bias_grad(
    op: &Op,
    inputs: &[&Tensor],
    output: &mut Tensor,
    (bias_grad, bias_ctx): (&mut Tensor, &EvalCtx<'_>),
    ctx: &EvalCtx<'_>,
) -> Result<bool, GraphError> {
    let dtype = output.dtype();
    let like_output = |shape: bool| {
        inputs
            .iter()
            .all(|t| t.dtype() == dtype && (!shape || t.shape() == output.shape()))
    };
    let fused = match *op {
        Op::PackedAttentionGrad { causal, scale } if inputs.len() == 4 && like_output(false) => {
            per_float!(dtype, |T| summing_rows::<T>(
                output,
                bias_grad,
                bias_ctx,
                |out, sums| {
                    let outs = std::slice::from_mut(out);
                    packed_attention_grad_summing((causal, scale), inputs, outs, ctx, Some(sums))
                }
            ))
        }
        _ => match unary_kernel(op) {
            Some(unary) if op.is_backward() && inputs.len() == 2 && like_output(true) => {
                per_float!(dtype, |T| summing_rows::<T>(
                    output,
                    bias_grad,
                    bias_ctx,
                    |out, sums| {
                        let (saved, dy) = (read(inputs[0], ctx)?, read(inputs[1], ctx)?);
                        kernels::unary_grad_summing_rows(unary, saved, dy, write(out, ctx)?, sums)
                            .map_err(GraphError::kernel(ctx.node))
                    }
                ))
            }
            _ => None,
        },
    };
    fused.map_or(Ok(false), |ran| ran.map(|()| true))
}

/// [`super::eval_in_place`] of `op` (`Add`, `Sub`, `Mul`, `Div`) over input `acc_input`
/// (`acc`, now the output; `other` the remaining input) and `bias_grad` ← `BiasAddGrad` of the
/// result with `bias_ctx`, in one pass: the bits of the two. `Ok(false)` where one pass cannot
/// give them (see [`eval_with_bias_grad`]): then nothing was run.
pub fn eval_in_place_with_bias_grad(
    op: &Op,
    acc_input: usize,
    acc: &mut Tensor,
    other: &Tensor,
    (bias_grad, bias_ctx): (&mut Tensor, &EvalCtx<'_>),
    ctx: &EvalCtx<'_>,
) -> Result<bool, GraphError> {
    let binary = binary_kernel(op).filter(|_| op.computes_in_place_over(acc_input));
    let fits = other.dtype() == acc.dtype() && other.shape() == acc.shape();
    let fused = match binary {
        Some(binary) if fits => per_float!(acc.dtype(), |T| summing_rows::<T>(
            acc,
            bias_grad,
            bias_ctx,
            |acc, sums| {
                let other = read(other, ctx)?;
                let acc = write(acc, ctx)?;
                kernels::binary_in_place_summing_rows(binary, acc, other, acc_input == 0, sums)
                    .map_err(GraphError::kernel(ctx.node))
            }
        )),
        _ => None,
    };
    fused.map_or(Ok(false), |ran| ran.map(|()| true))
}

/// Runs `produce(output, sums)` with the sums of `output`'s rows in the order `BiasAddGrad`
/// takes in `bias_ctx`'s mode, then writes them to `bias_grad`; `None` (nothing run) where one
/// pass cannot give the separate ops' bits or errors: another dtype or shape of gradient, more
/// than one thread allowed, rows that are not whole canonical blocks.
fn summing_rows<T: Float + Element>(
    output: &mut Tensor,
    bias_grad: &mut Tensor,
    bias_ctx: &EvalCtx<'_>,
    produce: impl FnOnce(&mut Tensor, &mut RowSums<T>) -> Result<(), GraphError>,
) -> Option<Result<(), GraphError>> {
    // The gradient's columns: the output's trailing dims (its rows, or a reshape's).
    let &[cols] = bias_grad.shape() else {
        return None;
    };
    let trailing =
        (0..=output.ndim()).any(|d| output.shape()[d..].iter().product::<usize>() == cols);
    let fits = bias_grad.dtype() == output.dtype()
        && cols > 0
        && trailing
        && kernels::threads::threads() < 2;
    if !fits {
        return None;
    }
    let rows = output.n_elements() / cols;
    let order = match bias_ctx.deterministic {
        None => RowOrder::Sequential,
        Some(max_blocks) => {
            // `BiasAddGrad`'s canonical blocks: those of its input's global rows (all dims but
            // the last, which may be split: a model-parallel bias).
            let global_rows = match bias_ctx.input_blocks.first() {
                Some(b) => match b.global_shape.split_last() {
                    Some((_, lead)) => lead.iter().product::<usize>(),
                    None => rows,
                },
                None => rows,
            };
            RowOrder::Canonical {
                block_len: block_len(global_rows, max_blocks),
            }
        }
    };
    let mut sums = RowSums::new("bias_add_grad", (rows, cols), order).ok()?;
    Some((|| {
        produce(output, &mut sums)?;
        sums.finish("bias_add_grad", write::<T>(bias_grad, bias_ctx)?)
            .map_err(GraphError::kernel(bias_ctx.node))
    })())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::eval::{eval_op, InputBlock};
    use crate::exec::in_place::eval_in_place;

    /// `BiasAddGrad` of `dy` into `bias_grad` as the executor runs it alone.
    fn bias_grad_apart(
        dy: &Tensor,
        bias_grad: &mut Tensor,
        bias_ctx: &EvalCtx<'_>,
    ) -> Result<(), GraphError> {
        eval_op(
            &Op::BiasAddGrad,
            &[dy],
            std::slice::from_mut(bias_grad),
            bias_ctx,
        )
    }

    fn ctx<'a>(node: &'a str, blocks: &'a [InputBlock], det: Option<usize>) -> EvalCtx<'a> {
        EvalCtx {
            node,
            step: 0,
            placement: None,
            input_blocks: blocks,
            deterministic: det,
        }
    }

    fn tensor(shape: &[usize], seed: usize) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| (((i + seed) * 7919) % 1013) as f32 / 97.0 - 5.2)
            .collect();
        Tensor::from_vec(shape, v).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// An activation's gradient and a residual's sum in place, each with the bias gradient
    /// over its output: the bits of the two ops apart, in the ordinary mode and in
    /// deterministic mode, over a whole tensor and over one rank's rows of a longer one.
    #[test]
    fn one_pass_gives_the_two_ops_bits() {
        let shape = [4, 16, 24];
        let (x, dy) = (tensor(&shape, 0), tensor(&shape, 5));
        // A data-parallel rank's half of 128 rows: its 64 rows are 8 of the 16 canonical
        // blocks of 8.
        let half = [InputBlock {
            offset: vec![4, 0, 0],
            global_shape: vec![8, 16, 24],
        }];
        // A model-parallel rank's half of the columns (the bias split too): every row here.
        let columns = [InputBlock {
            offset: vec![0, 0, 24],
            global_shape: vec![4, 16, 48],
        }];
        for (det, blocks) in [
            (None, &[][..]),
            (Some(16), &[][..]),
            (Some(16), &half[..]),
            (Some(4), &half[..]),
            (Some(16), &columns[..]),
            (Some(2), &columns[..]),
        ] {
            let (c, bc) = (ctx("gelu.grad", &[], det), ctx("bias.grad", blocks, det));
            let op = Op::GeluGrad { approximate: true };
            let mut want = Tensor::zeros(DType::F32, &shape);
            eval_op(&op, &[&x, &dy], std::slice::from_mut(&mut want), &c).unwrap();
            let mut want_db = Tensor::zeros(DType::F32, &[24]);
            bias_grad_apart(&want, &mut want_db, &bc).unwrap();
            let mut got = Tensor::zeros(DType::F32, &shape);
            let mut got_db = Tensor::zeros(DType::F32, &[24]);
            let fused = eval_with_bias_grad(&op, &[&x, &dy], &mut got, (&mut got_db, &bc), &c);
            assert!(fused.unwrap(), "{det:?} {blocks:?}: one pass");
            assert_eq!(bits(&got), bits(&want), "{det:?} {blocks:?}: dx");
            assert_eq!(
                bits(&got_db),
                bits(&want_db),
                "{det:?} {blocks:?}: bias grad"
            );

            for acc_input in [0, 1] {
                let mut want = x.clone();
                eval_in_place(&Op::Add, acc_input, &mut want, &dy, &c).unwrap();
                let mut want_db = Tensor::zeros(DType::F32, &[24]);
                bias_grad_apart(&want, &mut want_db, &bc).unwrap();
                let mut got = x.clone();
                let mut got_db = Tensor::zeros(DType::F32, &[24]);
                let fused = eval_in_place_with_bias_grad(
                    &Op::Add,
                    acc_input,
                    &mut got,
                    &dy,
                    (&mut got_db, &bc),
                    &c,
                );
                assert!(fused.unwrap(), "{det:?} {blocks:?}: one pass");
                assert_eq!(bits(&got), bits(&want), "{det:?} {blocks:?}: sum");
                assert_eq!(
                    bits(&got_db),
                    bits(&want_db),
                    "{det:?} {blocks:?}: its bias grad"
                );
            }
        }
    }

    /// Where one pass does not fit (a gradient that is not the rows' length, a forward op)
    /// nothing runs and the caller is told so.
    #[test]
    fn a_misfit_runs_nothing() {
        let shape = [3, 5];
        let (x, dy) = (tensor(&shape, 0), tensor(&shape, 1));
        let c = ctx("gelu.grad", &[], None);
        let bc = ctx("bias.grad", &[], None);
        let grad = Op::GeluGrad { approximate: false };
        let mut got = Tensor::zeros(DType::F32, &shape);
        let mut wrong = Tensor::zeros(DType::F32, &[4]);
        let ran = eval_with_bias_grad(&grad, &[&x, &dy], &mut got, (&mut wrong, &bc), &c);
        assert!(!ran.unwrap());
        let mut right = Tensor::zeros(DType::F32, &[5]);
        let forward = Op::Gelu { approximate: false };
        let ran = eval_with_bias_grad(&forward, &[&x], &mut got, (&mut right, &bc), &c);
        assert!(!ran.unwrap());
        assert!(bits(&got).iter().all(|&b| b == 0) && bits(&right).iter().all(|&b| b == 0));
    }
}
