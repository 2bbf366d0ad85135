//! [`eval_op`]: the one dispatch from an [`Op`] to `tensor::kernels`, writing into
//! caller-allocated outputs.

use tensor::kernels::{self, BinaryOp, Float, GeluForm, GemmShape, RowBlock, UnaryOp};
use tensor::{DType, Element, Storage, Tensor};

use crate::error::GraphError;
use crate::exec::attention::{
    flash_attention_eval, flash_attention_grad_eval, packed_attention_eval,
    packed_attention_grad_eval,
};
use crate::exec::dropout::dropout_into;
use crate::exec::moe_route::{route_into, RouteOutputs, RouteShape};
use crate::exec::one_hot::{one_hot_into, Columns};
use crate::exec::operands::{
    dim_of_each, last_dim, last_dim_or_zero, min_rank, mismatch, read, replace_checked,
    with_shape_and_elements, write, write_scalar,
};
use crate::exec::pieces::{
    concat_into, split_into, strided_slice_grad_into, strided_slice_into, AxisPieces, Strided,
};
use crate::exec::reduce_max::reduce_max_into;
use crate::exec::select::{masked_fill_into, triu_into, where_into};
use crate::infer::{matrix_dims, reduced_shape};
use crate::op::Op;

/// Where the block an op computes lies in the global tensor, for ops whose result depends on
/// global positions ([`Op::Dropout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement<'a> {
    /// Offset of the local block in the global tensor, per dim.
    pub offset: &'a [usize],
    /// The global tensor's shape.
    pub global_shape: &'a [usize],
}

/// Where one input's block lies in its global tensor (see [`EvalCtx::input_blocks`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputBlock {
    /// Offset of the block in the global tensor, per dim.
    pub offset: Vec<usize>,
    /// The global tensor's shape.
    pub global_shape: Vec<usize>,
}

/// What [`eval_op`] needs besides the op and its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalCtx<'a> {
    /// The node's name, for error messages.
    pub node: &'a str,
    /// The training step: dropout draws a fresh mask per step (and the same mask for the
    /// forward and backward nodes of one step).
    pub step: u64,
    /// Where the output block lies in the global tensor (element-wise ops such as dropout: the
    /// input block too). `None`: the tensors are the whole global tensors.
    pub placement: Option<Placement<'a>>,
    /// Per input, where its block lies in its global tensor, for ops that depend on which part
    /// of an input they are given (a vocabulary-parallel [`Op::Embedding`]: the table's rows).
    /// Empty: every input is its whole global tensor.
    pub input_blocks: &'a [InputBlock],
    /// Deterministic mode: ops that sum over a dim sum in the canonical order, in at most this
    /// many canonical blocks per summed dim (`tensor::kernels::det`). `None`: the fastest order.
    pub deterministic: Option<usize>,
}

impl EvalCtx<'_> {
    /// The rows of a table of `rows` local rows: input `input`'s block of dim 0 (the whole
    /// table when the inputs are whole).
    fn input_rows(&self, input: usize, rows: usize) -> RowBlock {
        match self.input_blocks.get(input) {
            Some(b) => RowBlock {
                first: b.offset.first().copied().unwrap_or(0),
                vocab: b.global_shape.first().copied().unwrap_or(rows),
            },
            None => RowBlock::whole(rows),
        }
    }

    /// The first column of the output's block of its last dim (0 when the output is whole).
    fn output_first_column(&self) -> usize {
        self.placement
            .and_then(|p| p.offset.last().copied())
            .unwrap_or(0)
    }

    /// The rows of the output's block of dim 0 (of `rows` local rows).
    pub(super) fn output_rows(&self, rows: usize) -> RowBlock {
        match self.placement {
            Some(p) => RowBlock {
                first: p.offset.first().copied().unwrap_or(0),
                vocab: p.global_shape.first().copied().unwrap_or(rows),
            },
            None => RowBlock::whole(rows),
        }
    }
}

/// Evaluates `op` on `inputs`, writing `outputs`, which the caller allocated with the shapes and
/// dtypes shape inference gives for the inputs' (local) shapes.
///
/// The kernels compute in f32 or f64 (the dtype of the first output). Shapes are read from the
/// tensors, so the same call serves whole tensors and per-rank shards; the only global facts an
/// op uses are its attributes (`batch_divisor`, `vocab_size`) and `ctx.placement` (dropout).
/// Nothing is allocated except by `BatchMatMul` (no slice-level batched kernel yet),
/// `ReduceSum` over some but not all axes without `keep_dims` (a small shape vector), and
/// `FlashAttention`, `PackedAttention` and their gradients (a tile of scores per thread and a
/// vector per row; the packed ones also a slice's rows, gathered).
pub fn eval_op(
    op: &Op,
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    if inputs.len() != op.n_inputs() {
        return Err(GraphError::InputCount {
            node: ctx.node.to_string(),
            op: op.kind(),
            expected: op.n_inputs(),
            got: inputs.len(),
        });
    }
    if outputs.len() != op.n_outputs() {
        return Err(GraphError::OutputCount {
            node: ctx.node.to_string(),
            op: op.kind(),
            expected: op.n_outputs(),
            got: outputs.len(),
        });
    }
    if matches!(op, Op::Flatten { .. } | Op::Reshape { .. }) {
        // A reshape moves bytes: every dtype (integer labels included).
        return reshape_into(inputs[0], &mut outputs[0], ctx);
    }
    if let Op::Cast { .. } = op {
        // Any float dtype in and out: not one compute type.
        return cast_into(inputs[0], &mut outputs[0], ctx);
    }
    match outputs[0].dtype() {
        DType::F32 => eval_typed::<f32>(op, inputs, outputs, ctx),
        DType::F64 => eval_typed::<f64>(op, inputs, outputs, ctx),
        DType::BF16 | DType::F16 => eval_half(op, inputs, outputs, ctx),
        dtype => Err(GraphError::UnsupportedDType {
            node: ctx.node.to_string(),
            op: op.kind(),
            dtype,
        }),
    }
}

/// A half-precision (bf16 or f16) op: computed in f32 — the half inputs widened, the f32
/// kernel run, its outputs rounded to nearest into the half outputs. On CPUs without half
/// arithmetic this is the fastest way (see docs/PERFORMANCE.md); what half precision saves
/// here is memory, not time.
fn eval_half(
    op: &Op,
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let is_half = DType::is_half;
    let widened: Vec<std::borrow::Cow<'_, Tensor>> = inputs
        .iter()
        .map(|t| match is_half(t.dtype()) {
            true => std::borrow::Cow::Owned(t.to_dtype(DType::F32)),
            false => std::borrow::Cow::Borrowed(*t),
        })
        .collect();
    let wide_inputs: Vec<&Tensor> = widened.iter().map(|t| t.as_ref()).collect();
    let mut wide_outputs: Vec<Tensor> = outputs
        .iter_mut()
        .map(|t| match is_half(t.dtype()) {
            true => Tensor::zeros(DType::F32, t.shape()),
            false => std::mem::replace(t, Tensor::zeros(t.dtype(), &[0])),
        })
        .collect();
    let result = eval_typed::<f32>(op, &wide_inputs, &mut wide_outputs, ctx);
    for (out, wide) in outputs.iter_mut().zip(wide_outputs) {
        *out = match is_half(out.dtype()) {
            true => wide.to_dtype(out.dtype()),
            false => wide,
        };
    }
    result
}

/// The elements of `x` in `out`, a tensor of the same dtype and element count.
fn reshape_into(x: &Tensor, out: &mut Tensor, ctx: &EvalCtx<'_>) -> Result<(), GraphError> {
    if x.dtype() != out.dtype() || x.n_elements() != out.n_elements() {
        return Err(mismatch(ctx, "output 0", x.shape(), x.dtype(), out));
    }
    out.as_bytes_mut().copy_from_slice(x.as_bytes());
    Ok(())
}

fn gelu_form(approximate: bool) -> GeluForm {
    if approximate {
        GeluForm::Tanh
    } else {
        GeluForm::Erf
    }
}

/// The unary kernel and its gradient kernel behind a forward or backward elementwise op.
pub(super) fn unary_kernel(op: &Op) -> Option<UnaryOp> {
    Some(match op {
        Op::Neg => UnaryOp::Neg,
        Op::Exp => UnaryOp::Exp,
        Op::Log => UnaryOp::Log,
        Op::Sqrt => UnaryOp::Sqrt,
        Op::Relu | Op::ReluGrad => UnaryOp::Relu,
        Op::Tanh | Op::TanhGrad => UnaryOp::Tanh,
        Op::Sigmoid | Op::SigmoidGrad => UnaryOp::Sigmoid,
        Op::Gelu { approximate } | Op::GeluGrad { approximate } => {
            UnaryOp::Gelu(gelu_form(*approximate))
        }
        _ => return None,
    })
}

/// The binary kernel behind an arithmetic op.
pub(super) fn binary_kernel(op: &Op) -> Option<BinaryOp> {
    Some(match op {
        Op::Add => BinaryOp::Add,
        Op::Sub => BinaryOp::Sub,
        Op::Mul => BinaryOp::Mul,
        Op::Div => BinaryOp::Div,
        _ => return None,
    })
}

/// `scale` such that the kernel's mean over the `rows` local rows becomes a sum divided by the
/// global `batch_divisor`.
fn batch_rescale<T: Float>(rows: usize, batch_divisor: usize) -> T {
    T::from_usize(rows) / T::from_usize(batch_divisor)
}

fn eval_typed<T: Float + Element>(
    op: &Op,
    inputs: &[&Tensor],
    outputs: &mut [Tensor],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let kernel = || GraphError::kernel(ctx.node);
    if let Some(max_blocks) = ctx.deterministic {
        if let Some(result) =
            super::deterministic::eval_deterministic::<T>(op, inputs, outputs, ctx, max_blocks)
        {
            return result;
        }
    }
    if let Some(unary) = unary_kernel(op) {
        return if op.is_backward() {
            let (saved, dy) = (read::<T>(inputs[0], ctx)?, read::<T>(inputs[1], ctx)?);
            kernels::unary_grad_into(unary, saved, dy, write::<T>(&mut outputs[0], ctx)?)
                .map_err(kernel())
        } else {
            kernels::unary_into(
                unary,
                read::<T>(inputs[0], ctx)?,
                write::<T>(&mut outputs[0], ctx)?,
            )
            .map_err(kernel())
        };
    }
    if let Some(binary) = binary_kernel(op) {
        let (a, b) = (inputs[0], inputs[1]);
        let out = write::<T>(&mut outputs[0], ctx)?;
        return kernels::binary_into(
            binary,
            read(a, ctx)?,
            a.shape(),
            read(b, ctx)?,
            b.shape(),
            out,
        )
        .map_err(kernel());
    }
    match op {
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => {
            let (a, b) = (inputs[0], inputs[1]);
            min_rank(a, 2, "a", ctx)?;
            min_rank(b, 2, "b", ctx)?;
            let (m, k) = matrix_dims(a.shape(), *transpose_a);
            let (_, n) = matrix_dims(b.shape(), *transpose_b);
            let shape = GemmShape {
                m,
                n,
                k,
                trans_a: *transpose_a,
                trans_b: *transpose_b,
            };
            let (a, b) = (read::<T>(a, ctx)?, read::<T>(b, ctx)?);
            kernels::gemm(shape, T::ONE, a, b, T::ZERO, write(&mut outputs[0], ctx)?)
                .map_err(kernel())
        }
        Op::BatchMatMul {
            transpose_a,
            transpose_b,
        } => {
            let (a, b) = (inputs[0], inputs[1]);
            let out_shape = outputs[0].shape().to_vec();
            kernels::batch_matmul_into(
                (read::<T>(a, ctx)?, a.shape()),
                (read::<T>(b, ctx)?, b.shape()),
                (*transpose_a, *transpose_b),
                (write(&mut outputs[0], ctx)?, &out_shape),
            )
            .map_err(kernel())
        }
        Op::BatchMatMulSum {
            transpose_a,
            transpose_b,
        } => {
            let (a, b) = (inputs[0], inputs[1]);
            min_rank(a, 3, "a", ctx)?;
            min_rank(b, 3, "b", ctx)?;
            let (ra, rb) = (a.ndim(), b.ndim());
            let shape = GemmShape {
                m: if *transpose_a {
                    a.shape()[ra - 1]
                } else {
                    a.shape()[ra - 2]
                },
                k: if *transpose_a {
                    a.shape()[ra - 2]
                } else {
                    a.shape()[ra - 1]
                },
                n: if *transpose_b {
                    b.shape()[rb - 2]
                } else {
                    b.shape()[rb - 1]
                },
                trans_a: *transpose_a,
                trans_b: *transpose_b,
            };
            let batch: usize = a.shape()[..ra - 2].iter().product();
            kernels::batch_gemm_sum(
                shape,
                batch,
                read::<T>(a, ctx)?,
                read::<T>(b, ctx)?,
                write(&mut outputs[0], ctx)?,
            )
            .map_err(kernel())
        }
        Op::BiasAdd => {
            let (x, bias) = (read::<T>(inputs[0], ctx)?, read::<T>(inputs[1], ctx)?);
            kernels::bias_add_into(x, bias, write(&mut outputs[0], ctx)?).map_err(kernel())
        }
        Op::Softmax | Op::LogSoftmax | Op::ScaledSoftmax { .. } => {
            let x = inputs[0];
            min_rank(x, 1, "x", ctx)?;
            let (cols, xs) = (last_dim(x), read::<T>(x, ctx)?);
            let out = write(&mut outputs[0], ctx)?;
            match op {
                Op::Softmax => kernels::softmax_into(xs, cols, out),
                Op::ScaledSoftmax { scale } => {
                    kernels::scaled_softmax_into(xs, T::from_f64(*scale), cols, out)
                }
                _ => kernels::log_softmax_into(xs, cols, out),
            }
            .map_err(kernel())
        }
        Op::SoftmaxGrad | Op::LogSoftmaxGrad | Op::ScaledSoftmaxGrad { .. } => {
            let y = inputs[0];
            min_rank(y, 1, "y", ctx)?;
            let (cols, ys, dy) = (last_dim(y), read::<T>(y, ctx)?, read::<T>(inputs[1], ctx)?);
            let dx = write(&mut outputs[0], ctx)?;
            match op {
                Op::SoftmaxGrad => kernels::softmax_grad_into(ys, dy, cols, dx),
                Op::ScaledSoftmaxGrad { scale } => {
                    kernels::scaled_softmax_grad_into(ys, dy, T::from_f64(*scale), cols, dx)
                }
                _ => kernels::log_softmax_grad_into(ys, dy, cols, dx),
            }
            .map_err(kernel())
        }
        Op::FlashAttention { causal, scale } => {
            flash_attention_eval::<T>((*causal, *scale), inputs, outputs, ctx)
        }
        Op::FlashAttentionGrad { causal, scale } => {
            flash_attention_grad_eval::<T>((*causal, *scale), inputs, outputs, ctx)
        }
        Op::PackedAttention { causal, scale } => {
            packed_attention_eval::<T>((*causal, *scale), inputs, outputs, ctx)
        }
        Op::PackedAttentionGrad { causal, scale } => {
            packed_attention_grad_eval::<T>((*causal, *scale), inputs, outputs, ctx)
        }
        Op::LayerNorm { epsilon } => {
            let [y, mean, rstd] = outputs else {
                unreachable!("eval_op checked the output count")
            };
            let params = kernels::LayerNormParams {
                gamma: read::<T>(inputs[1], ctx)?,
                beta: read::<T>(inputs[2], ctx)?,
                epsilon: T::from_f64(*epsilon),
            };
            kernels::layer_norm_into(
                read::<T>(inputs[0], ctx)?,
                params,
                write(y, ctx)?,
                write(mean, ctx)?,
                write(rstd, ctx)?,
            )
            .map_err(kernel())
        }
        Op::LayerNormGrad => {
            let [dx, dgamma, dbeta] = outputs else {
                unreachable!("eval_op checked the output count")
            };
            let saved = kernels::LayerNormSaved {
                x: read::<T>(inputs[0], ctx)?,
                mean: read::<T>(inputs[2], ctx)?,
                rstd: read::<T>(inputs[3], ctx)?,
                gamma: read::<T>(inputs[4], ctx)?,
            };
            let buffers = kernels::LayerNormGradBuffers {
                dx: write(dx, ctx)?,
                dgamma: write(dgamma, ctx)?,
                dbeta: write(dbeta, ctx)?,
            };
            kernels::layer_norm_grad_into(saved, read::<T>(inputs[1], ctx)?, buffers)
                .map_err(kernel())
        }
        Op::Flatten { .. } | Op::Reshape { .. } | Op::StopGradient => {
            reshape_into(inputs[0], &mut outputs[0], ctx)
        }
        Op::Print { label } => {
            crate::print::print_value(label, inputs[0]);
            reshape_into(inputs[0], &mut outputs[0], ctx)
        }
        Op::Transpose { perm } => {
            let x = inputs[0];
            kernels::permute_into(
                read::<T>(x, ctx)?,
                x.shape(),
                perm,
                write(&mut outputs[0], ctx)?,
            )
            .map_err(kernel())
        }
        Op::BroadcastTo { .. } => {
            let x = inputs[0];
            let xs = read::<T>(x, ctx)?;
            with_shape_and_elements::<T, _>(&mut outputs[0], ctx, |out_shape, out| {
                kernels::broadcast_to_into(xs, x.shape(), out_shape, out).map_err(kernel())
            })
        }
        Op::SumToShape { .. } | Op::BiasAddGrad => {
            sum_into::<T>(inputs[0], &mut outputs[0], None, ctx)
        }
        Op::ReduceSum { axes, keep_dims } => {
            let (x, out) = (inputs[0], &mut outputs[0]);
            if axes.is_empty() || axes.len() == x.ndim() {
                let total = kernels::sum_slice(read::<T>(x, ctx)?);
                return write_scalar(out, total, ctx);
            }
            let kept = (!keep_dims).then(|| reduced_shape(x.shape(), axes, true));
            sum_into::<T>(x, out, kept.as_deref(), ctx)
        }
        Op::ReduceMax { axes, .. } => {
            let x = inputs[0];
            let xs = read::<T>(x, ctx)?;
            let out = write::<T>(&mut outputs[0], ctx)?;
            reduce_max_into(xs, x.shape(), axes, out).map_err(kernel())
        }
        Op::MoeRoute { top_k, capacity } => {
            let probs = inputs[0];
            min_rank(probs, 3, "probs", ctx)?;
            let dims = probs.shape();
            let shape = RouteShape {
                groups: dims[0],
                tokens: dims[1],
                experts: dims[2],
                top_k: *top_k,
                capacity: *capacity,
            };
            let probs = read::<T>(probs, ctx)?;
            let [dispatch, chosen, first] = outputs else {
                unreachable!("eval_op checked the output count")
            };
            let out = RouteOutputs {
                dispatch: write::<T>(dispatch, ctx)?,
                chosen: write::<T>(chosen, ctx)?,
                first: write::<T>(first, ctx)?,
            };
            route_into(probs, shape, out).map_err(kernel())
        }
        Op::OneHot { depth, .. } => {
            let columns = Columns {
                first: ctx.output_first_column(),
                local: last_dim_or_zero(&outputs[0]),
                depth: *depth,
            };
            let out = write::<T>(&mut outputs[0], ctx)?;
            with_ids!(inputs[0], ctx, op, |labels| one_hot_into(
                labels, columns, out
            )
            .map_err(kernel()))
        }
        Op::Embedding => {
            let (table, out) = (inputs[0], &mut outputs[0]);
            min_rank(table, 2, "table", ctx)?;
            let (rows, dim) = (table.shape()[0], table.shape()[1]);
            let block = ctx.input_rows(0, rows);
            let (table, out) = (read::<T>(table, ctx)?, write::<T>(out, ctx)?);
            with_ids!(inputs[1], ctx, op, |ids| kernels::gather_block_rows_into(
                table, block, dim, ids, out
            )
            .map_err(kernel()))
        }
        Op::EmbeddingGrad => {
            let (dy, out) = (inputs[2], &mut outputs[0]);
            min_rank(out, 2, "table gradient", ctx)?;
            let (rows, dim) = (out.shape()[0], out.shape()[1]);
            let block = ctx.output_rows(rows);
            let (dys, out) = (read::<T>(dy, ctx)?, write::<T>(out, ctx)?);
            kernels::fill(out, T::ZERO);
            with_ids!(inputs[1], ctx, op, |ids| kernels::scatter_add_block_rows(
                out, block, dim, ids, dys
            )
            .map_err(kernel()))
        }
        Op::Dropout { keep_prob, seed } => {
            let xs = read::<T>(inputs[0], ctx)?;
            with_shape_and_elements::<T, _>(&mut outputs[0], ctx, |shape, out| {
                dropout_into(xs, out, shape, *keep_prob, *seed, ctx)
            })
        }
        Op::SparseSoftmaxCrossEntropy { batch_divisor } => {
            let logits = inputs[0];
            min_rank(logits, 2, "logits", ctx)?;
            let (rows, classes) = (logits.shape()[0], logits.shape()[1]);
            let xs = read::<T>(logits, ctx)?;
            let mean = with_ids!(inputs[1], ctx, op, |labels| {
                kernels::sparse_softmax_cross_entropy_slice(xs, classes, labels).map_err(kernel())
            })?;
            write_scalar(
                &mut outputs[0],
                mean * batch_rescale::<T>(rows, *batch_divisor),
                ctx,
            )
        }
        Op::SparseSoftmaxCrossEntropyGrad { batch_divisor } => {
            let logits = inputs[0];
            min_rank(logits, 2, "logits", ctx)?;
            let (rows, classes) = (logits.shape()[0], logits.shape()[1]);
            let dloss = match read::<T>(inputs[2], ctx)? {
                [value] => *value,
                _ => {
                    return Err(mismatch(
                        ctx,
                        "input dloss",
                        &[],
                        <T as Element>::DTYPE,
                        inputs[2],
                    ))
                }
            };
            // The kernel divides by the local row count; rescale to the global divisor.
            let scale = dloss * batch_rescale::<T>(rows, *batch_divisor);
            let (xs, dx) = (read::<T>(logits, ctx)?, write::<T>(&mut outputs[0], ctx)?);
            with_ids!(inputs[1], ctx, op, |labels| {
                kernels::sparse_softmax_cross_entropy_grad_into(xs, classes, labels, scale, dx)
                    .map_err(kernel())
            })
        }
        Op::Fill { value, .. } => {
            kernels::fill(write::<T>(&mut outputs[0], ctx)?, T::from_f64(*value));
            Ok(())
        }
        Op::Triu { diagonal, .. } => {
            with_shape_and_elements::<T, _>(&mut outputs[0], ctx, |shape, out| {
                triu_into(out, shape, *diagonal, ctx)
            })
        }
        Op::MaskedFill { value } => {
            let x = inputs[0];
            let (xs, out) = (read::<T>(x, ctx)?, write::<T>(&mut outputs[0], ctx)?);
            masked_fill_into(xs, x.shape(), inputs[1], T::from_f64(*value), out, ctx)
        }
        Op::Concat { axis, .. } => {
            min_rank(&outputs[0], axis + 1, "output", ctx)?;
            let sizes = dim_of_each(inputs.iter().copied(), *axis);
            let pieces: Vec<&[T]> = inputs
                .iter()
                .map(|t| read::<T>(t, ctx))
                .collect::<Result<_, _>>()?;
            let layout = AxisPieces::new(outputs[0].shape(), *axis, &sizes);
            concat_into(&pieces, layout, write(&mut outputs[0], ctx)?, ctx)
        }
        Op::Split { axis, .. } => {
            let x = inputs[0];
            min_rank(x, axis + 1, "x", ctx)?;
            let sizes = dim_of_each(outputs.iter(), *axis);
            let layout = AxisPieces::new(x.shape(), *axis, &sizes);
            let mut outs: Vec<&mut [T]> = outputs
                .iter_mut()
                .map(|t| write::<T>(t, ctx))
                .collect::<Result<_, _>>()?;
            split_into(read::<T>(x, ctx)?, layout, &mut outs, ctx)
        }
        Op::StridedSlice { begin, strides, .. } => {
            let x = inputs[0];
            let xs = read::<T>(x, ctx)?;
            with_shape_and_elements::<T, _>(&mut outputs[0], ctx, |shape, out| {
                let slice = Strided {
                    begin,
                    strides,
                    shape,
                };
                strided_slice_into(xs, x.shape(), slice, out, ctx)
            })
        }
        Op::StridedSliceGrad { begin, strides, .. } => {
            let dy = inputs[0];
            let dys = read::<T>(dy, ctx)?;
            with_shape_and_elements::<T, _>(&mut outputs[0], ctx, |shape, dx| {
                let slice = Strided {
                    begin,
                    strides,
                    shape: dy.shape(),
                };
                strided_slice_grad_into(dys, slice, shape, dx, ctx)
            })
        }
        Op::Where => {
            let (x, y) = (inputs[1], inputs[2]);
            let (xs, ys) = (read::<T>(x, ctx)?, read::<T>(y, ctx)?);
            let out = write::<T>(&mut outputs[0], ctx)?;
            where_into(inputs[0], xs, ys, x.shape(), out, ctx)
        }
        Op::Cast { .. } => unreachable!("casts are dispatched in eval_op"),
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Div
        | Op::Neg
        | Op::Exp
        | Op::Log
        | Op::Sqrt
        | Op::Relu
        | Op::Gelu { .. }
        | Op::Tanh
        | Op::Sigmoid
        | Op::ReluGrad
        | Op::GeluGrad { .. }
        | Op::TanhGrad
        | Op::SigmoidGrad => unreachable!("elementwise ops are dispatched above"),
    }
}

/// `x` summed down to `out`'s shape (or to `as_shape`, which has `out`'s element count).
fn sum_into<T: Float + Element>(
    x: &Tensor,
    out: &mut Tensor,
    as_shape: Option<&[usize]>,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let xs = read::<T>(x, ctx)?;
    with_shape_and_elements::<T, _>(out, ctx, |out_shape, out| {
        let target = as_shape.unwrap_or(out_shape);
        kernels::sum_to_shape_into(xs, x.shape(), target, out).map_err(GraphError::kernel(ctx.node))
    })
}

/// `out` = `x` converted to `out`'s dtype, rounding to nearest (the tensor crate's conversion).
fn cast_into(x: &Tensor, out: &mut Tensor, ctx: &EvalCtx<'_>) -> Result<(), GraphError> {
    if !x.dtype().is_float() || !out.dtype().is_float() {
        return Err(GraphError::UnsupportedDType {
            node: ctx.node.to_string(),
            op: "Cast",
            dtype: if x.dtype().is_float() {
                out.dtype()
            } else {
                x.dtype()
            },
        });
    }
    // FIXME(kernels): no slice-level conversion yet, so this allocates its result.
    replace_checked(out, x.to_dtype(out.dtype()), ctx)
}
