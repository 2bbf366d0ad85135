//! Reverse-mode autodiff: appends the backward graph to the forward graph, as ordinary nodes.
//!
//! [`grad`] walks the forward nodes in reverse topological order. Each value's gradient is the
//! sum (with `Add` nodes, role [`NodeRole::Accumulate`]) of the contributions its consumers'
//! backward rules produced; each node's rule (see [`rule`]) turns the gradients of its outputs
//! into contributions for its inputs, as nodes with role [`NodeRole::Backward`] recording the
//! forward node and input they differentiate. Only what the requested parameters need is built:
//! no gradient flows into inputs, integer values or values that do not depend on a parameter.
//!
//! Backward nodes are named after their forward node: `layer2.matmul.grad0` is the gradient of
//! input 0 of `layer2.matmul`, `layer2.div.grad1.mul` an intermediate step of a rule,
//! `layer2.relu.grad_sum1` an accumulation, `loss.grad_seed` the seed `dloss/dloss = 1`.

use std::collections::HashMap;

use crate::builder::GraphBuilder;
use crate::error::GraphError;
use crate::infer::infer;
use crate::ir::{GradOf, Graph, NodeId, NodeRole, Value, ValueId, ValueKind};
use crate::op::Op;

/// A forward graph extended with its backward graph.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingGraph {
    /// Forward and backward nodes together (the forward part keeps its ids). Its outputs are the
    /// loss followed by the gradients, in parameter order.
    pub graph: Graph,
    /// The loss value.
    pub loss: ValueId,
    /// `(parameter, gradient)` pairs, in the order the parameters were requested.
    pub grads: Vec<(ValueId, ValueId)>,
}

impl TrainingGraph {
    /// The gradient value of `param`.
    pub fn grad_of(&self, param: ValueId) -> Option<ValueId> {
        self.grads
            .iter()
            .find(|(p, _)| *p == param)
            .map(|&(_, g)| g)
    }
}

/// Differentiates the scalar `loss` of `forward` with respect to `params` (parameters; use
/// [`Graph::trainable_parameters`] for all trainable ones).
///
/// A parameter the loss does not depend on gets a zero gradient (a `Fill` node), so optimizers
/// can treat every parameter alike.
pub fn grad(
    forward: &Graph,
    loss: ValueId,
    params: &[ValueId],
) -> Result<TrainingGraph, GraphError> {
    let loss_value = forward.value(loss)?;
    if !loss_value.shape.is_empty() || !loss_value.dtype.is_float() {
        return Err(GraphError::NotDifferentiable {
            value: loss_value.name.clone(),
            reason: format!(
                "is not a loss: it must be a floating-point scalar (shape []), got {:?} of {}",
                loss_value.shape, loss_value.dtype
            ),
        });
    }
    for &p in params {
        let value = forward.value(p)?;
        if !matches!(value.kind, ValueKind::Parameter { .. }) || !value.dtype.is_float() {
            return Err(GraphError::NotDifferentiable {
                value: value.name.clone(),
                reason: format!(
                    "cannot be differentiated: it is {} of {}, not a floating-point parameter",
                    value.kind.name(),
                    value.dtype
                ),
            });
        }
    }
    let needs_grad = depends_on(forward, params);
    let mut builder = GraphBuilder::extend(forward.clone());
    builder.clear_outputs();
    let mut pending: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
    let seed = builder.add_node(
        format!("{}.grad_seed", loss_value.name),
        Op::Fill {
            shape: Vec::new(),
            dtype: loss_value.dtype,
            value: 1.0,
        },
        &[],
        NodeRole::Seed { value: loss },
    )?[0];
    pending.insert(loss, vec![seed]);

    let n_forward = forward.nodes().len();
    for node_id in (0..n_forward).rev().map(NodeId) {
        let node = &forward.nodes()[node_id.0];
        let wants: Vec<bool> = node.inputs.iter().map(|v| needs_grad[v.0]).collect();
        if !wants.contains(&true) {
            continue;
        }
        let mut dys = Vec::with_capacity(node.outputs.len());
        for &out in &node.outputs {
            dys.push(accumulate(&mut builder, forward, &mut pending, out)?);
        }
        if dys.iter().all(Option::is_none) {
            continue;
        }
        let contributions = {
            let mut ctx = RuleCtx {
                builder: &mut builder,
                forward,
                node: node_id,
                wants: &wants,
                dys: &dys,
            };
            rule(&mut ctx)?
        };
        for (input, g) in contributions {
            pending
                .entry(forward.nodes()[node_id.0].inputs[input])
                .or_default()
                .push(g);
        }
    }

    let mut grads: Vec<(ValueId, ValueId)> = Vec::with_capacity(params.len());
    for &p in params {
        if let Some(&(_, g)) = grads.iter().find(|(q, _)| *q == p) {
            grads.push((p, g)); // a parameter listed twice
            continue;
        }
        let g = match accumulate(&mut builder, forward, &mut pending, p)? {
            Some(g) => g,
            None => {
                let value = forward.value(p)?;
                builder.add_node(
                    format!("{}.grad_zero", value.name),
                    Op::Fill {
                        shape: value.shape.clone(),
                        dtype: value.dtype,
                        value: 0.0,
                    },
                    &[],
                    NodeRole::Seed { value: p },
                )?[0]
            }
        };
        grads.push((p, g));
    }
    builder.output(loss)?;
    for &(_, g) in &grads {
        builder.output(g)?;
    }
    Ok(TrainingGraph {
        graph: builder.finish(),
        loss,
        grads,
    })
}

/// For every value of `graph`: whether it is a floating-point value depending on one of
/// `params`, i.e. whether [`grad`] of those parameters gives it a gradient (the outputs of
/// `StopGradient`, `Print` and a MoE router's masks are constants to it).
pub fn depends_on(graph: &Graph, params: &[ValueId]) -> Vec<bool> {
    let mut depends = vec![false; graph.values().len()];
    for p in params {
        depends[p.0] = true;
    }
    for node in graph.nodes() {
        // StopGradient's (and Print's, and a MoE router's masks) output is a constant to
        // autodiff.
        if matches!(
            node.op,
            Op::StopGradient | Op::Print { .. } | Op::MoeRoute { .. }
        ) {
            continue;
        }
        if node.inputs.iter().any(|v| depends[v.0]) {
            for out in &node.outputs {
                depends[out.0] = graph.values()[out.0].dtype.is_float();
            }
        }
    }
    depends
}

/// The gradient of `value`: the sum of its pending contributions (one `Add` per extra
/// contribution), or `None` if nothing flowed into it.
fn accumulate(
    builder: &mut GraphBuilder,
    forward: &Graph,
    pending: &mut HashMap<ValueId, Vec<ValueId>>,
    value: ValueId,
) -> Result<Option<ValueId>, GraphError> {
    let Some(parts) = pending.remove(&value) else {
        return Ok(None);
    };
    let name = &forward.value(value)?.name;
    let mut total = parts[0];
    for (k, &part) in parts.iter().enumerate().skip(1) {
        total = builder.add_node(
            format!("{name}.grad_sum{k}"),
            Op::Add,
            &[total, part],
            NodeRole::Accumulate { value },
        )?[0];
    }
    Ok(Some(total))
}

/// What a backward rule sees: the forward node, which inputs want a gradient, and the gradients
/// of its outputs.
struct RuleCtx<'a> {
    builder: &'a mut GraphBuilder,
    forward: &'a Graph,
    node: NodeId,
    wants: &'a [bool],
    dys: &'a [Option<ValueId>],
}

impl RuleCtx<'_> {
    fn input(&self, i: usize) -> ValueId {
        self.forward.nodes()[self.node.0].inputs[i]
    }

    fn output(&self, i: usize) -> ValueId {
        self.forward.nodes()[self.node.0].outputs[i]
    }

    fn shape(&self, v: ValueId) -> Vec<usize> {
        self.forward.values()[v.0].shape.clone()
    }

    /// The gradient of output 0 (the only differentiable output of every op).
    fn dy(&self) -> Result<ValueId, GraphError> {
        let node = &self.forward.nodes()[self.node.0];
        if let Some((k, _)) = self
            .dys
            .iter()
            .enumerate()
            .skip(1)
            .find(|(_, d)| d.is_some())
        {
            return Err(GraphError::NotDifferentiable {
                value: self.forward.values()[node.outputs[k].0].name.clone(),
                reason: format!(
                    "is output {k} of {}, which has no gradient rule",
                    node.op.kind()
                ),
            });
        }
        Ok(self.dys[0].expect("grad only runs rules for nodes with an output gradient"))
    }

    /// Adds backward node `{forward}.{suffix}`; output `k` differentiates input `wrt[k]`.
    fn emit(
        &mut self,
        suffix: &str,
        op: Op,
        inputs: &[ValueId],
        wrt: Vec<Option<usize>>,
    ) -> Result<Vec<ValueId>, GraphError> {
        let name = format!("{}.{suffix}", self.forward.nodes()[self.node.0].name);
        let role = NodeRole::Backward(GradOf {
            forward: self.node,
            wrt,
        });
        self.builder.add_node(name, op, inputs, role)
    }

    /// A single-output backward node giving the gradient of input `i`.
    fn grad(&mut self, i: usize, op: Op, inputs: &[ValueId]) -> Result<ValueId, GraphError> {
        Ok(self.emit(&format!("grad{i}"), op, inputs, vec![Some(i)])?[0])
    }

    /// A single-output intermediate step of the rule for input `i`.
    fn step(
        &mut self,
        i: usize,
        step: &str,
        op: Op,
        inputs: &[ValueId],
    ) -> Result<ValueId, GraphError> {
        Ok(self.emit(&format!("grad{i}.{step}"), op, inputs, vec![None])?[0])
    }

    /// `g` (of the broadcast output shape) summed down to input `i`'s shape: `g` itself when the
    /// shapes agree, else a `SumToShape` node.
    fn sum_to_input(&mut self, i: usize, g: ValueId) -> Result<ValueId, GraphError> {
        let shape = self.shape(self.input(i));
        if self.builder.shape(g)? == shape.as_slice() {
            return Ok(g);
        }
        self.grad(i, Op::SumToShape { shape }, &[g])
    }

    /// The gradient of input `i` computed by `op` on `inputs`: the node itself when its result
    /// has the input's shape, else an intermediate summed down over the broadcast dims.
    fn grad_summed(&mut self, i: usize, op: Op, inputs: &[ValueId]) -> Result<ValueId, GraphError> {
        let target = self.shape(self.input(i));
        let result_shape = {
            let graph = self.builder.graph();
            let values: Vec<&Value> = inputs.iter().map(|v| &graph.values()[v.0]).collect();
            let name = &self.forward.nodes()[self.node.0].name;
            infer(name, &op, &values)?.swap_remove(0).0
        };
        if result_shape == target {
            return self.grad(i, op, inputs);
        }
        let full = self.step(i, "full", op, inputs)?;
        self.sum_to_input(i, full)
    }
}

/// The backward rule of the forward node in `ctx`: `(input index, gradient contribution)` for
/// every input that wants a gradient.
///
/// | forward | input gradients |
/// |---|---|
/// | `MatMul(a, b)` | `MatMul(dy, b, false, !tb)` / `MatMul(a, dy, !ta, false)` etc. with the transposes folded into flags, never a transposed copy |
/// | `BatchMatMul` | the same with `BatchMatMul`, then `SumToShape` over broadcast batch dims; for a 2-D `b` shared by a batched `a`, `BatchMatMulSum` (the batch summed inside one product) |
/// | `Add`, `Sub` | `dy`, `±dy`, each `SumToShape`d to its input |
/// | `Mul` | `dy·b`, `dy·a`, summed to shape |
/// | `Div` | `dy/b`, `-(dy·y)/b`, summed to shape |
/// | `Neg` | `-dy` |
/// | `BiasAdd` | `dy`, `BiasAddGrad(dy)` |
/// | `ReLU`, `Tanh`, `Sigmoid`, `GeLU` | `ReluGrad(y, dy)`, `TanhGrad(y, dy)`, `SigmoidGrad(y, dy)`, `GeluGrad(x, dy)` |
/// | `Softmax`, `LogSoftmax` | `SoftmaxGrad(y, dy)`, `LogSoftmaxGrad(y, dy)` |
/// | `ScaledSoftmax` | `ScaledSoftmaxGrad(y, dy)` |
/// | `FlashAttention(q, k, v)` | `FlashAttentionGrad(q, k, v, out, lse, dout)` → `dq, dk, dv` (none for `lse`) |
/// | `PackedAttention(qkv)` | `PackedAttentionGrad(qkv, out, lse, dout)` → `dqkv` (none for `lse`) |
/// | `Concat(x…)` | `Split(dy)` into the inputs' sizes |
/// | `Split(x)` | `Concat` of the outputs' gradients (zeros for an output without one) |
/// | `StridedSlice(x)` | `StridedSliceGrad(dy)`: `dy` scattered into zeros of `x`'s shape |
/// | `Cast(x)` | `Cast(dy)` back to `x`'s dtype |
/// | `MaskedFill(x, mask)` | `MaskedFill{0}(dy, mask)` for `x`; none for the mask |
/// | `Where(cond, x, y)` | `dy_y = MaskedFill{0}(dy, cond)`, `dx = dy - dy_y`; none for `cond` |
/// | `LayerNorm` | `LayerNormGrad(x, dy, mean, rstd, gamma)` → `dx, dgamma, dbeta` |
/// | `Flatten`, `Reshape` | `Reshape(dy)` to the input shape |
/// | `Transpose(perm)` | `Transpose(dy, perm⁻¹)` |
/// | `BroadcastTo` / `SumToShape` | `SumToShape` / `BroadcastTo` to the input shape |
/// | `ReduceSum` | `Reshape` to the kept-dims shape (if dropped), then `BroadcastTo` |
/// | `Embedding` | `EmbeddingGrad(table, ids, dy)` (scatter-add) for the table |
/// | `Dropout` | `Dropout(dy)` with the same seed (the same mask) |
/// | `Exp`, `Log`, `Sqrt` | `Mul(dy, y)`, `Div(dy, x)`, `Div(dy, Add(y, y))` |
/// | `StopGradient` | none (its output does not depend on anything) |
/// | `MoeRoute` | none (its masks are piecewise constant: constants to autodiff) |
/// | `ReduceMax`, `OneHot` | none: an error if a gradient reaches them (see [`Op::ReduceMax`]) |
/// | `SparseSoftmaxCrossEntropy` | `SparseSoftmaxCrossEntropyGrad(logits, labels, dloss)` |
fn rule(ctx: &mut RuleCtx<'_>) -> Result<Vec<(usize, ValueId)>, GraphError> {
    let op = ctx.forward.nodes()[ctx.node.0].op.clone();
    if let Op::Split { axis, sizes } = &op {
        return split_rule(ctx, *axis, sizes.len());
    }
    let dy = ctx.dy()?;
    let wants = ctx.wants.to_vec();
    let mut out = Vec::new();
    match op {
        Op::MatMul {
            transpose_a: ta,
            transpose_b: tb,
        }
        | Op::BatchMatMul {
            transpose_a: ta,
            transpose_b: tb,
        } => {
            let batched = matches!(op, Op::BatchMatMul { .. });
            let product = |transpose_a, transpose_b| {
                if batched {
                    Op::BatchMatMul {
                        transpose_a,
                        transpose_b,
                    }
                } else {
                    Op::MatMul {
                        transpose_a,
                        transpose_b,
                    }
                }
            };
            let (a, b) = (ctx.input(0), ctx.input(1));
            // y = op(a)·op(b). Stored a: da = dy·op(b)ᵀ, or its transpose when a is stored
            // transposed; likewise for b.
            let grad_a = match ta {
                false => (product(false, !tb), [dy, b]),
                true => (product(tb, true), [b, dy]),
            };
            let grad_b = match tb {
                false => (product(!ta, false), [a, dy]),
                true => (product(true, ta), [dy, a]),
            };
            // A weight shared by every batch element (2-D b, batched a): its gradient sums the
            // batch's products in one op, never a batched result summed afterwards.
            let shared_b = batched && ctx.shape(b).len() == 2 && ctx.shape(a).len() > 2;
            let grad_b = match grad_b {
                (
                    Op::BatchMatMul {
                        transpose_a,
                        transpose_b,
                    },
                    inputs,
                ) if shared_b => (
                    Op::BatchMatMulSum {
                        transpose_a,
                        transpose_b,
                    },
                    inputs,
                ),
                other => other,
            };
            for (i, (op, inputs)) in [grad_a, grad_b].into_iter().enumerate() {
                if wants[i] {
                    out.push((i, ctx.grad_summed(i, op, &inputs)?));
                }
            }
        }
        Op::Add | Op::Sub => {
            if wants[0] {
                out.push((0, ctx.sum_to_input(0, dy)?));
            }
            if wants[1] {
                let g = if op == Op::Add {
                    ctx.sum_to_input(1, dy)?
                } else {
                    ctx.grad_summed(1, Op::Neg, &[dy])?
                };
                out.push((1, g));
            }
        }
        Op::Mul => {
            let (a, b) = (ctx.input(0), ctx.input(1));
            if wants[0] {
                out.push((0, ctx.grad_summed(0, Op::Mul, &[dy, b])?));
            }
            if wants[1] {
                out.push((1, ctx.grad_summed(1, Op::Mul, &[dy, a])?));
            }
        }
        Op::Div => {
            let (b, y) = (ctx.input(1), ctx.output(0));
            if wants[0] {
                out.push((0, ctx.grad_summed(0, Op::Div, &[dy, b])?));
            }
            if wants[1] {
                // d(a/b)/db = -a/b² = -y/b.
                let dy_y = ctx.step(1, "mul", Op::Mul, &[dy, y])?;
                let ratio = ctx.step(1, "div", Op::Div, &[dy_y, b])?;
                out.push((1, ctx.grad_summed(1, Op::Neg, &[ratio])?));
            }
        }
        Op::Neg => out.push((0, ctx.grad(0, Op::Neg, &[dy])?)),
        Op::BiasAdd => {
            if wants[0] {
                out.push((0, dy));
            }
            if wants[1] {
                out.push((1, ctx.grad(1, Op::BiasAddGrad, &[dy])?));
            }
        }
        Op::Relu => out.push((0, ctx.grad(0, Op::ReluGrad, &[ctx.output(0), dy])?)),
        Op::Tanh => out.push((0, ctx.grad(0, Op::TanhGrad, &[ctx.output(0), dy])?)),
        Op::Sigmoid => out.push((0, ctx.grad(0, Op::SigmoidGrad, &[ctx.output(0), dy])?)),
        Op::Gelu { approximate } => {
            let x = ctx.input(0);
            out.push((0, ctx.grad(0, Op::GeluGrad { approximate }, &[x, dy])?));
        }
        Op::Softmax => out.push((0, ctx.grad(0, Op::SoftmaxGrad, &[ctx.output(0), dy])?)),
        Op::LogSoftmax => out.push((0, ctx.grad(0, Op::LogSoftmaxGrad, &[ctx.output(0), dy])?)),
        Op::ScaledSoftmax { scale } => {
            let op = Op::ScaledSoftmaxGrad { scale };
            out.push((0, ctx.grad(0, op, &[ctx.output(0), dy])?));
        }
        Op::FlashAttention { causal, scale } => {
            let (q, k, v) = (ctx.input(0), ctx.input(1), ctx.input(2));
            let inputs = [q, k, v, ctx.output(0), ctx.output(1), dy];
            let op = Op::FlashAttentionGrad { causal, scale };
            let grads = ctx.emit("grad", op, &inputs, vec![Some(0), Some(1), Some(2)])?;
            out.extend((0..3).filter(|&i| wants[i]).map(|i| (i, grads[i])));
        }
        Op::PackedAttention { causal, scale } => {
            let inputs = [ctx.input(0), ctx.output(0), ctx.output(1), dy];
            let op = Op::PackedAttentionGrad { causal, scale };
            out.push((0, ctx.grad(0, op, &inputs)?));
        }
        Op::Where if wants[1] || wants[2] => {
            // dy where cond is 0 goes to y; the rest, dy - that (exact: dy - 0 or dy - dy),
            // to x. The condition gets no gradient.
            let cond = ctx.input(0);
            let to_y = Op::MaskedFill { value: 0.0 };
            let dy_y = if wants[2] {
                ctx.grad(2, to_y, &[dy, cond])?
            } else {
                ctx.step(1, "to_y", to_y, &[dy, cond])?
            };
            if wants[1] {
                out.push((1, ctx.grad(1, Op::Sub, &[dy, dy_y])?));
            }
            out.push((2, dy_y));
        }
        Op::Concat { axis, n } => {
            let sizes = (0..n).map(|i| ctx.shape(ctx.input(i))[axis]).collect();
            let grads = ctx.emit(
                "grad",
                Op::Split { axis, sizes },
                &[dy],
                (0..n).map(Some).collect(),
            )?;
            out.extend((0..n).filter(|&i| wants[i]).map(|i| (i, grads[i])));
        }
        Op::StridedSlice {
            begin,
            end,
            strides,
        } => {
            let op = Op::StridedSliceGrad {
                input_shape: ctx.shape(ctx.input(0)),
                begin,
                end,
                strides,
            };
            out.push((0, ctx.grad(0, op, &[dy])?));
        }
        Op::Cast { .. } => {
            let dtype = ctx.forward.values()[ctx.input(0).0].dtype;
            out.push((0, ctx.grad(0, Op::Cast { dtype }, &[dy])?));
        }
        Op::MaskedFill { .. } if wants[0] => {
            // The filled positions do not depend on x; the mask gets no gradient.
            let op = Op::MaskedFill { value: 0.0 };
            out.push((0, ctx.grad(0, op, &[dy, ctx.input(1)])?));
        }
        Op::LayerNorm { .. } => {
            let inputs = [ctx.input(0), dy, ctx.output(1), ctx.output(2), ctx.input(1)];
            let grads = ctx.emit(
                "grad",
                Op::LayerNormGrad,
                &inputs,
                vec![Some(0), Some(1), Some(2)],
            )?;
            out.extend((0..3).filter(|&i| wants[i]).map(|i| (i, grads[i])));
        }
        Op::Flatten { .. } | Op::Reshape { .. } => {
            let shape = ctx.shape(ctx.input(0));
            out.push((0, ctx.grad(0, Op::Reshape { shape }, &[dy])?));
        }
        Op::Transpose { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            out.push((0, ctx.grad(0, Op::Transpose { perm: inverse }, &[dy])?));
        }
        Op::BroadcastTo { .. } => out.push((0, ctx.sum_to_input(0, dy)?)),
        Op::SumToShape { .. } => {
            let shape = ctx.shape(ctx.input(0));
            out.push((0, ctx.grad(0, Op::BroadcastTo { shape }, &[dy])?));
        }
        Op::ReduceSum { axes, keep_dims } => {
            let shape = ctx.shape(ctx.input(0));
            let kept = crate::infer::reduced_shape(&shape, &axes, true);
            let g = if keep_dims || ctx.builder.shape(dy)? == kept.as_slice() {
                dy
            } else {
                ctx.step(0, "reshape", Op::Reshape { shape: kept }, &[dy])?
            };
            out.push((0, ctx.grad(0, Op::BroadcastTo { shape }, &[g])?));
        }
        Op::Embedding => {
            let (table, ids) = (ctx.input(0), ctx.input(1));
            out.push((0, ctx.grad(0, Op::EmbeddingGrad, &[table, ids, dy])?));
        }
        Op::Dropout { keep_prob, seed } => {
            out.push((0, ctx.grad(0, Op::Dropout { keep_prob, seed }, &[dy])?));
        }
        Op::Exp => out.push((0, ctx.grad(0, Op::Mul, &[dy, ctx.output(0)])?)),
        Op::Log => out.push((0, ctx.grad(0, Op::Div, &[dy, ctx.input(0)])?)),
        Op::Sqrt => {
            // d√x/dx = 1 / (2√x); `y + y` is `2y` exactly.
            let y = ctx.output(0);
            let twice = ctx.step(0, "twice", Op::Add, &[y, y])?;
            out.push((0, ctx.grad(0, Op::Div, &[dy, twice])?));
        }
        Op::StopGradient | Op::Print { .. } | Op::MoeRoute { .. } => {}
        Op::ReduceMax { .. } => {
            let node = &ctx.forward.nodes()[ctx.node.0];
            return Err(GraphError::NotDifferentiable {
                value: node.name.clone(),
                reason: "is a ReduceMax node, which has no gradient rule: use its result under \
                         StopGradient (as the shift of a log-sum-exp)"
                    .to_string(),
            });
        }
        Op::SparseSoftmaxCrossEntropy { batch_divisor } => {
            let (logits, labels) = (ctx.input(0), ctx.input(1));
            let op = Op::SparseSoftmaxCrossEntropyGrad { batch_divisor };
            out.push((0, ctx.grad(0, op, &[logits, labels, dy])?));
        }
        Op::Split { .. } => unreachable!("Split's rule runs above"),
        // Only the condition or mask (a float one) wants a gradient, and gets none.
        Op::Where | Op::MaskedFill { .. } => {}
        Op::Fill { .. }
        | Op::Triu { .. }
        | Op::ScaledSoftmaxGrad { .. }
        | Op::FlashAttentionGrad { .. }
        | Op::PackedAttentionGrad { .. }
        | Op::StridedSliceGrad { .. }
        | Op::BatchMatMulSum { .. }
        | Op::OneHot { .. }
        | Op::ReluGrad
        | Op::GeluGrad { .. }
        | Op::TanhGrad
        | Op::SigmoidGrad
        | Op::SoftmaxGrad
        | Op::LogSoftmaxGrad
        | Op::LayerNormGrad
        | Op::EmbeddingGrad
        | Op::BiasAddGrad
        | Op::SparseSoftmaxCrossEntropyGrad { .. } => {
            let node = &ctx.forward.nodes()[ctx.node.0];
            return Err(GraphError::NotDifferentiable {
                value: node.name.clone(),
                reason: format!("is a {} node, which has no gradient rule", op.kind()),
            });
        }
    }
    // Rules for ops with integer inputs never produce their gradient; keep only wanted ones.
    out.retain(|(i, _)| wants[*i]);
    Ok(out)
}

/// [`Op::Split`]'s rule: the outputs' gradients joined (a zero constant for an output nothing
/// flowed into); with one piece, its gradient itself.
fn split_rule(
    ctx: &mut RuleCtx<'_>,
    axis: usize,
    n: usize,
) -> Result<Vec<(usize, ValueId)>, GraphError> {
    let mut parts = Vec::with_capacity(n);
    for k in 0..n {
        let part = match ctx.dys[k] {
            Some(dy) => dy,
            None => {
                let out = &ctx.forward.values()[ctx.output(k).0];
                let zeros = Op::Fill {
                    shape: out.shape.clone(),
                    dtype: out.dtype,
                    value: 0.0,
                };
                ctx.step(0, &format!("zeros{k}"), zeros, &[])?
            }
        };
        parts.push(part);
    }
    let dx = match parts.as_slice() {
        [single] => *single,
        _ => ctx.grad(0, Op::Concat { axis, n }, &parts)?,
    };
    Ok(vec![(0, dx)])
}
