//! Ops computed over one of their inputs ([`crate::Op::computes_in_place_over`]): the executor
//! moves a dying input's buffer to the output and [`eval_in_place`] writes the result there,
//! with [`crate::eval_op`]'s bits and no second buffer.

use tensor::kernels::{self, BinaryOp, Float};
use tensor::{DType, Element, Tensor};

use super::eval::EvalCtx;
use super::operands::{read, write};
use crate::error::GraphError;
use crate::op::Op;

/// `acc` (input `acc_input` of `op`, now its output) ← `op` of it and `other` (the remaining
/// input). `f32` and `f64` only; an error names the node for any other op, input or dtype.
pub fn eval_in_place(
    op: &Op,
    acc_input: usize,
    acc: &mut Tensor,
    other: &Tensor,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    if !op.computes_in_place_over(acc_input) {
        return Err(refused(ctx, op, format!("input {acc_input} in place")));
    }
    match acc.dtype() {
        DType::F32 => in_place_typed::<f32>(op, acc_input, acc, other, ctx),
        DType::F64 => in_place_typed::<f64>(op, acc_input, acc, other, ctx),
        dtype => Err(GraphError::UnsupportedDType {
            node: ctx.node.to_string(),
            op: op.kind(),
            dtype,
        }),
    }
}

fn in_place_typed<T: Float + Element>(
    op: &Op,
    acc_input: usize,
    acc: &mut Tensor,
    other: &Tensor,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let binary = match op {
        Op::BiasAdd => {
            let bias = read::<T>(other, ctx)?;
            return kernels::bias_add_in_place(write::<T>(acc, ctx)?, bias)
                .map_err(GraphError::kernel(ctx.node));
        }
        Op::Add => BinaryOp::Add,
        Op::Sub => BinaryOp::Sub,
        Op::Mul => BinaryOp::Mul,
        Op::Div => BinaryOp::Div,
        _ => unreachable!("computes_in_place_over admitted the op"),
    };
    if acc.shape() != other.shape() {
        return Err(refused(
            ctx,
            op,
            format!(
                "operands of shapes {:?} and {:?}",
                acc.shape(),
                other.shape()
            ),
        ));
    }
    let other = read::<T>(other, ctx)?;
    kernels::binary_in_place(binary, write::<T>(acc, ctx)?, other, acc_input == 0)
        .map_err(GraphError::kernel(ctx.node))
}

/// The error for an in-place evaluation `op` cannot do.
fn refused(ctx: &EvalCtx<'_>, op: &Op, what: String) -> GraphError {
    GraphError::Kernel {
        node: ctx.node.to_string(),
        source: Box::new(tensor::TensorError::InvalidArgument {
            op: op.kind(),
            reason: format!("cannot compute {what}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval_op;

    fn ctx() -> EvalCtx<'static> {
        EvalCtx {
            node: "n",
            step: 0,
            placement: None,
            input_blocks: &[],
            deterministic: None,
        }
    }

    /// Every in-place op over either admitted input gives `eval_op`'s bits, awkward values
    /// included; inputs it may not overwrite, and mismatched shapes, are refused.
    #[test]
    fn in_place_gives_eval_op_s_bits() {
        let values = |seed: u32| -> Vec<f32> {
            (0..24u32)
                .map(|i| match (i * 7 + seed) % 11 {
                    0 => f32::NAN,
                    1 => -0.0,
                    2 => f32::INFINITY,
                    v => (v as f32 - 5.3) / 3.7,
                })
                .collect()
        };
        let a = Tensor::from_vec(&[4, 6], values(1)).unwrap();
        let b = Tensor::from_vec(&[4, 6], values(5)).unwrap();
        let bias = Tensor::from_vec(&[6], values(3)[..6].to_vec()).unwrap();
        let bits = |t: &Tensor| t.as_bytes().to_vec();
        let cases: Vec<(Op, &Tensor)> = vec![
            (Op::BiasAdd, &bias),
            (Op::Add, &b),
            (Op::Sub, &b),
            (Op::Mul, &b),
            (Op::Div, &b),
        ];
        for (op, other) in cases {
            for acc_input in [0, 1] {
                let inputs: [&Tensor; 2] = match acc_input {
                    0 => [&a, other],
                    _ => [other, &a],
                };
                let mut acc = a.clone();
                let result = eval_in_place(&op, acc_input, &mut acc, other, &ctx());
                if !op.computes_in_place_over(acc_input) {
                    assert!(result.is_err(), "{op:?} over input {acc_input}");
                    continue;
                }
                result.unwrap();
                let mut want = [Tensor::zeros(DType::F32, &[4, 6])];
                eval_op(&op, &inputs, &mut want, &ctx()).unwrap();
                assert_eq!(bits(&acc), bits(&want[0]), "{op:?} over input {acc_input}");
            }
        }
        let mut acc = a.clone();
        let short = Tensor::from_vec(&[6], values(2)[..6].to_vec()).unwrap();
        assert!(eval_in_place(&Op::Add, 0, &mut acc, &short, &ctx()).is_err());
        assert!(eval_in_place(&Op::Relu, 0, &mut acc, &b, &ctx()).is_err());
    }
}
