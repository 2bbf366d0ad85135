//! Deterministic mode's planning rule: every sum over a split dim must be an aligned run of
//! canonical blocks on each rank, so the kernels' subtrees and the collectives' tree over ranks
//! complete the tree one device computes (`tensor::kernels::det`).

use std::collections::HashMap;

use graph::{Graph, NodeId, NodeRole, Op, ValueId};
use layout::TensorLayout;
use tensor::kernels::det::canonical_blocks;

use crate::assign::gradient_target;
use crate::error::ParallelError;
use crate::lower::{Program, Step};
use crate::rules::{self, infer, OpContext};

/// Checks every kernel step of `program` against the canonical blocks (at most `max_blocks`
/// per summed dim): an error names the op, the dim and the rule.
pub fn check_deterministic(program: &Program, max_blocks: usize) -> Result<(), ParallelError> {
    check_blocks_setting(max_blocks)?;
    for step in &program.steps {
        let Step::Kernel(k) = step else { continue };
        let inputs: Vec<&TensorLayout> = k
            .inputs
            .iter()
            .map(|&b| program.buffers[b].layout.layout())
            .collect();
        let out_shape = program.buffers[k.outputs[0]].layout.layout().shape();
        check_kernel(k.name.as_str(), &k.op, &inputs, out_shape, max_blocks)?;
    }
    Ok(())
}

/// Checks one forward op of `training` (node `forward`) under `strategy` (one split tuple per
/// input, as a search candidate gives it) on `devices` devices, and its backward ops laid out
/// as placement lays them out from it in deterministic mode (a summing backward op takes its
/// inputs with every summed dim but the outer one whole), against the canonical blocks (at
/// most `max_blocks` per summed dim): the rule [`check_deterministic`] applies to the program
/// such a strategy compiles to. `training` may be a forward graph (only the op is checked) or
/// one with its backward nodes ([`graph::grad`]). An error names the op, the dim and the rule.
pub fn check_deterministic_strategy(
    training: &Graph,
    forward: NodeId,
    strategy: &[Vec<usize>],
    devices: usize,
    max_blocks: usize,
) -> Result<(), ParallelError> {
    check_blocks_setting(max_blocks)?;
    if devices == 0 {
        return Err(ParallelError::Setting {
            setting: "devices",
            reason: "0 devices: a strategy needs at least 1".to_string(),
        });
    }
    let Some(node) = training.nodes().get(forward.0) else {
        return Err(ParallelError::UnknownOp {
            op: format!("#{}", forward.0),
            known: format!("{} nodes", training.nodes().len()),
        });
    };
    let ctx = OpContext::of(training, node);
    let placement = rules::strategy::input_layouts(&ctx, strategy, devices)?;
    let stage = rules::strategy::device_mesh(devices);
    let inputs = placement
        .inputs
        .iter()
        .zip(&ctx.input_shapes)
        .map(|(l, shape)| l.bind(shape).map_err(|e| ctx.layout_error(e)))
        .collect::<Result<Vec<_>, _>>()?;
    let outputs: Vec<TensorLayout> = infer::output_layouts(&ctx, &inputs, &stage)?
        .iter()
        .map(|o| o.layout().clone())
        .collect();
    let Some(&out_shape) = ctx.output_shapes.first() else {
        return Ok(());
    };
    check_kernel(
        &node.name,
        &node.op,
        &inputs.iter().collect::<Vec<_>>(),
        out_shape,
        max_blocks,
    )?;
    // The backward nodes of the rule, in graph order, each input laid out as `assign`'s
    // `backward_need` lays it out: a forward value (or the gradient of one) as the forward op
    // has it, a value of the rule as the rule's node produced it.
    let as_forward = |u: ValueId, wrt: Option<usize>| -> Option<TensorLayout> {
        if let Some(i) = crate::assign::forward_input_place(&node.inputs, wrt, u) {
            return Some(inputs[i].clone());
        }
        node.outputs
            .iter()
            .position(|&x| x == u)
            .map(|j| outputs[j].clone())
    };
    let mut produced: HashMap<ValueId, TensorLayout> = HashMap::new();
    for b in training.nodes() {
        let wrt = match &b.role {
            NodeRole::Backward(g) if g.forward == forward => g.wrt.first().copied().flatten(),
            _ => continue,
        };
        let bctx = OpContext::of(training, b);
        let mut b_inputs = Vec::with_capacity(b.inputs.len());
        for &v in &b.inputs {
            let value = &training.values()[v.0];
            let by_rule = value.producer.is_some_and(|(p, _)| {
                let p = &training.nodes()[p.0];
                !p.inputs.is_empty()
                    && matches!(&p.role, NodeRole::Backward(g) if g.forward == forward)
            });
            let layout = as_forward(v, wrt)
                .or_else(|| gradient_target(training, v).and_then(|t| as_forward(t, wrt)))
                .or_else(|| {
                    if by_rule {
                        return None;
                    }
                    node.outputs
                        .iter()
                        .position(|&o| training.values()[o.0].shape == value.shape)
                        .map(|j| outputs[j].clone())
                })
                .or_else(|| produced.get(&v).cloned())
                .unwrap_or_else(|| TensorLayout::replicated(stage.clone(), &value.shape));
            b_inputs.push(layout);
        }
        if b.inputs.is_empty() || b.outputs.is_empty() {
            continue;
        }
        let b_inputs = contiguous_sums(&b.op, b_inputs, &bctx.input_shapes, bctx.output_shapes[0])
            .map_err(|e| bctx.layout_error(e))?;
        check_kernel(
            &b.name,
            &b.op,
            &b_inputs.iter().collect::<Vec<_>>(),
            bctx.output_shapes[0],
            max_blocks,
        )?;
        let b_outputs = infer::output_layouts(&bctx, &b_inputs, &stage)?;
        for (&v, o) in b.outputs.iter().zip(&b_outputs) {
            produced.insert(v, o.layout().clone());
        }
    }
    Ok(())
}

/// `parallel.deterministic_blocks` must be a power of two of at least 1.
fn check_blocks_setting(max_blocks: usize) -> Result<(), ParallelError> {
    if max_blocks == 0 || !max_blocks.is_power_of_two() {
        return Err(ParallelError::Setting {
            setting: "deterministic_blocks",
            reason: format!("{max_blocks} is not a power of two of at least 1"),
        });
    }
    Ok(())
}

/// Checks one kernel (op `name`, `op`) reading `inputs` (global shapes and splits) and writing
/// a first output of `out_shape`: its summed dims, and the normalised dims of LayerNorm and
/// softmax.
fn check_kernel(
    name: &str,
    op: &Op,
    inputs: &[&TensorLayout],
    out_shape: &[usize],
    max_blocks: usize,
) -> Result<(), ParallelError> {
    let input = |i: usize| inputs[i];
    let shapes: Vec<&[usize]> = inputs.iter().map(|l| l.shape()).collect();
    if let Some((operand, dims)) = summed_dims(op, &shapes, out_shape) {
        let operand_name = format!("input {operand}");
        check_summed(
            name,
            op.kind(),
            &operand_name,
            input(operand),
            &dims,
            max_blocks,
        )?;
    }
    match op {
        Op::LayerNormGrad | Op::LayerNorm { .. } => {
            let (x, gamma) = match op {
                Op::LayerNorm { .. } => (input(0), input(1)),
                _ => (input(0), input(4)),
            };
            let r = x.shape().len();
            let normalized = r - gamma.shape().len();
            if let Some(d) = (normalized..r).find(|&d| x.split_factors()[d] > 1) {
                return Err(refuse(
                    name,
                    op.kind(),
                    format!(
                        "normalises over dim {d} of x, which its strategy splits; deterministic \
                         mode needs the normalised dims whole"
                    ),
                ));
            }
        }
        Op::Softmax | Op::LogSoftmax | Op::ScaledSoftmax { .. } => {
            let x = input(0);
            let last = x.shape().len() - 1;
            if x.split_factors()[last] > 1 {
                return Err(refuse(
                    name,
                    op.kind(),
                    "normalises over its last dim, which its strategy splits; deterministic \
                     mode needs it whole"
                        .to_string(),
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The operand and the dims (ascending) a summing op adds over, from its inputs' and first
/// output's global shapes; `None` for ops that add over no dim a strategy may split.
pub(crate) fn summed_dims(
    op: &Op,
    input_shapes: &[&[usize]],
    output_shape: &[usize],
) -> Option<(usize, Vec<usize>)> {
    let rank = |i: usize| input_shapes[i].len();
    Some(match op {
        Op::MatMul { transpose_a, .. } | Op::BatchMatMul { transpose_a, .. } => {
            let r = rank(0);
            (0, vec![if *transpose_a { r - 2 } else { r - 1 }])
        }
        Op::BatchMatMulSum { transpose_a, .. } => {
            let r = rank(0);
            let kdim = if *transpose_a { r - 2 } else { r - 1 };
            (0, (0..r - 2).chain([kdim]).collect())
        }
        Op::ReduceSum { axes, .. } => {
            let mut dims: Vec<usize> = if axes.is_empty() {
                (0..rank(0)).collect()
            } else {
                axes.clone()
            };
            dims.sort_unstable();
            (0, dims)
        }
        Op::SumToShape { .. } | Op::BiasAddGrad => {
            let x = input_shapes[0];
            let lead = x.len().saturating_sub(output_shape.len());
            let dims = (0..x.len())
                .filter(|&d| d < lead || (output_shape[d - lead] == 1 && x[d] != 1))
                .collect();
            (0, dims)
        }
        Op::LayerNormGrad => (0, (0..rank(0) - input_shapes[4].len()).collect()),
        Op::SparseSoftmaxCrossEntropy { .. } => (0, vec![0]),
        Op::EmbeddingGrad => (1, (0..rank(1)).collect()),
        _ => return None,
    })
}

/// `inputs` of a summing backward op with every split of a summed dim after the first summed
/// dim of size above 1 removed from every input (those axes then replicate): a rank's part of
/// the sum becomes one contiguous run, at the price of a gather before the op.
pub(crate) fn contiguous_sums(
    op: &Op,
    inputs: Vec<TensorLayout>,
    input_shapes: &[&[usize]],
    output_shape: &[usize],
) -> Result<Vec<TensorLayout>, layout::LayoutError> {
    let Some((operand, dims)) = summed_dims(op, input_shapes, output_shape) else {
        return Ok(inputs);
    };
    let layout = &inputs[operand];
    let shape = layout.shape();
    let Some(&outer) = dims.iter().find(|&&d| shape[d] > 1) else {
        return Ok(inputs);
    };
    let drop: Vec<usize> = dims
        .iter()
        .filter(|&&d| d != outer)
        .flat_map(|&d| layout.dims()[d].iter().copied())
        .collect();
    if drop.is_empty() {
        return Ok(inputs);
    }
    inputs
        .into_iter()
        .map(|l| {
            let kept: Vec<Vec<usize>> = l
                .dims()
                .iter()
                .map(|axes| axes.iter().copied().filter(|a| !drop.contains(a)).collect())
                .collect();
            let rows = l.row_split().map(<[usize]>::to_vec);
            let bound = layout::Layout::from_mesh(l.mesh().clone(), kept)?;
            match rows {
                Some(r) => TensorLayout::with_rows(bound, l.shape(), &r),
                None => bound.bind(l.shape()),
            }
        })
        .collect()
}

fn refuse(op: &str, kind: &'static str, reason: String) -> ParallelError {
    ParallelError::Unsupported {
        op: op.to_string(),
        kind,
        reason: format!("deterministic mode: {reason}"),
    }
}

/// The summed dims `dims` (ascending) of `layout`'s tensor, flattened row-major, must be split
/// along one dim only, with every summed dim before it of size 1, into a power of two of parts
/// dividing the canonical block count.
fn check_summed(
    op: &str,
    kind: &'static str,
    operand: &str,
    layout: &TensorLayout,
    dims: &[usize],
    max_blocks: usize,
) -> Result<(), ParallelError> {
    let shape = layout.shape();
    let factors = layout.split_factors();
    let split: Vec<usize> = dims.iter().copied().filter(|&d| factors[d] > 1).collect();
    let Some(&first) = split.first() else {
        return Ok(());
    };
    if let Some(&later) = split.get(1) {
        return Err(refuse(
            op,
            kind,
            format!(
                "it sums dims {dims:?} of {operand}, and its strategy splits both dim {first} and dim {later}; \
                 one summed dim at most may be split"
            ),
        ));
    }
    if let Some(&before) = dims.iter().find(|&&d| d < first && shape[d] > 1) {
        return Err(refuse(
            op,
            kind,
            format!(
                "it sums dims {dims:?} of {operand}; dim {first} is split but dim {before} before it \
                 (size {}) is whole, so a rank's part is not one contiguous run of canonical blocks",
                shape[before]
            ),
        ));
    }
    let len: usize = dims.iter().map(|&d| shape[d]).product();
    let blocks = canonical_blocks(len, max_blocks);
    let f = factors[first];
    if !f.is_power_of_two() || !blocks.is_multiple_of(f) {
        return Err(refuse(
            op,
            kind,
            format!(
                "it sums dim {first} of {operand} ({len} summed elements in {blocks} canonical blocks \
                 with parallel.deterministic_blocks = {max_blocks}), which its strategy splits {f} ways; \
                 the split must be a power of two dividing the block count"
            ),
        ));
    }
    Ok(())
}
