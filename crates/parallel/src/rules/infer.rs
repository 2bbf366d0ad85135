//! From input layouts to output layouts.
//!
//! Every input is laid out on one mesh (the op's device matrix). An output dim is split by the
//! axes of the input dims it comes from; a dim that is summed away (a matmul's reduction dim, a
//! gradient's batch dim) leaves its axes as *pending-sum* axes of the output: every rank holds a
//! partial sum, resolved by the reshard that feeds the output's consumer.

use graph::Op;
use layout::{Layout, Mesh, TensorLayout};
use reshard::{DistLayout, PendingOp};

use super::{reshape, OpContext};
use crate::error::ParallelError;

/// The name `layout::repeated_calc_mesh` gives the repeated-calculation axis of a device matrix.
const REPEATED_CALC_AXIS: &str = "rep";

/// Builds an output layout from per-dim axes and pending-sum axes on `mesh`.
fn output(
    ctx: &OpContext<'_>,
    mesh: &Mesh,
    dims: Vec<Vec<usize>>,
    partial: Vec<usize>,
    shape: &[usize],
) -> Result<DistLayout, ParallelError> {
    let layout = Layout::from_mesh(mesh.clone(), dims)
        .and_then(|l| l.bind(shape))
        .map_err(|e| ctx.layout_error(e))?;
    let partial: Vec<usize> = partial
        .into_iter()
        .filter(|&a| mesh.axis_size(a) > 1)
        .collect();
    DistLayout::partial(layout, &partial).map_err(|e| ctx.unsupported(e.to_string()))
}

/// `axes` by their mesh names, outermost first (`a+b`), or `None` when empty.
fn axes_name(mesh: &Mesh, axes: &[usize]) -> String {
    if axes.is_empty() {
        return "None".to_string();
    }
    axes.iter()
        .map(|&a| mesh.axis_name(a))
        .collect::<Vec<_>>()
        .join("+")
}

/// The axes of a matrix product's rows, its inputs' reduction dims and its columns, from the
/// inputs' per-dim axes (the last two dims of each, transposes as flagged).
fn matrix_axes(a: &[Vec<usize>], b: &[Vec<usize>], ta: bool, tb: bool) -> [Vec<usize>; 4] {
    let (ra, rb) = (a.len(), b.len());
    let (rows, ka) = if ta {
        (&a[ra - 1], &a[ra - 2])
    } else {
        (&a[ra - 2], &a[ra - 1])
    };
    let (kb, cols) = if tb {
        (&b[rb - 1], &b[rb - 2])
    } else {
        (&b[rb - 2], &b[rb - 1])
    };
    [rows.clone(), ka.clone(), kb.clone(), cols.clone()]
}

/// The layouts of the outputs of `ctx`'s op when its inputs are laid out as `inputs`, all on
/// one mesh. `stage` is the mesh used by ops without inputs.
///
/// An input with a manual (uneven) row split passes it to every output of its shape whose
/// dim 0 is split by the same axes: an element-wise op, a gradient sum or a table's gradient
/// keeps the blocks it was given.
pub fn output_layouts(
    ctx: &OpContext<'_>,
    inputs: &[TensorLayout],
    stage: &Mesh,
) -> Result<Vec<DistLayout>, ParallelError> {
    let outputs = even_output_layouts(ctx, inputs, stage)?;
    let Some(uneven) = inputs.iter().find(|l| !l.is_uniform()) else {
        return Ok(outputs);
    };
    let rows = uneven
        .row_split()
        .expect("a non-uniform layout has a row split");
    outputs
        .into_iter()
        .map(|out| {
            let t = out.layout();
            if t.shape() != uneven.shape() || t.dims().first() != uneven.dims().first() {
                return Ok(out);
            }
            let split = t.with_row_split(rows).map_err(|e| ctx.layout_error(e))?;
            let partial = DistLayout::partial(split, out.sum_order())
                .map_err(|e| ctx.unsupported(e.to_string()))?;
            Ok(partial.with_op(out.pending_op()))
        })
        .collect()
}

/// [`output_layouts`] for inputs in even blocks.
fn even_output_layouts(
    ctx: &OpContext<'_>,
    inputs: &[TensorLayout],
    stage: &Mesh,
) -> Result<Vec<DistLayout>, ParallelError> {
    let mesh = match inputs.first() {
        Some(first) => first.mesh().clone(),
        None => stage.clone(),
    };
    if let Some(other) = inputs.iter().find(|l| l.mesh() != &mesh) {
        return Err(ctx.unsupported(format!(
            "its inputs are laid out on different meshes ({} and {})",
            mesh,
            other.mesh()
        )));
    }
    let dims = |i: usize| inputs[i].dims().to_vec();
    let out_shape = |j: usize| ctx.output_shapes[j];
    let same_as = |i: usize| -> Result<Vec<DistLayout>, ParallelError> {
        Ok(vec![output(ctx, &mesh, dims(i), Vec::new(), out_shape(0))?])
    };
    let require_equal = |a: usize, b: usize| -> Result<(), ParallelError> {
        if inputs[a].dims() != inputs[b].dims() {
            return Err(ctx.unsupported(format!(
                "inputs {a} and {b} must be laid out alike, got {} and {}",
                inputs[a].layout().describe_map(),
                inputs[b].layout().describe_map()
            )));
        }
        Ok(())
    };
    // A unit axis (a one-device mesh keeps one) splits nothing.
    let splits = |axes: &[usize]| axes.iter().any(|&a| mesh.axis_size(a) > 1);
    let dim_unsplit = |i: usize, d: usize, what: &str| -> Result<(), ParallelError> {
        if dims(i).get(d).is_some_and(|axes| splits(axes)) {
            return Err(ctx.unsupported(format!(
                "dim {d} of input {i} is {what} and cannot be split, got {}",
                inputs[i].layout().describe_map()
            )));
        }
        Ok(())
    };
    let last_unsplit = |i: usize, what: &str| -> Result<(), ParallelError> {
        if dims(i).last().is_some_and(|axes| splits(axes)) {
            return Err(ctx.unsupported(format!("{what} (the last dim) cannot be split")));
        }
        Ok(())
    };
    match ctx.op {
        Op::MatMul {
            transpose_a,
            transpose_b,
        }
        | Op::BatchMatMul {
            transpose_a,
            transpose_b,
        } => {
            let (a, b) = (dims(0), dims(1));
            let (ra, rb) = (a.len(), b.len());
            let [rows, ka, kb, cols] = matrix_axes(&a, &b, *transpose_a, *transpose_b);
            let name = |axes: &[usize]| axes_name(&mesh, axes);
            // Where each of the four is among the inputs' dims.
            let (dim_rows, dim_ka) = if *transpose_a {
                (ra - 1, ra - 2)
            } else {
                (ra - 2, ra - 1)
            };
            let (dim_kb, dim_cols) = if *transpose_b {
                (rb - 1, rb - 2)
            } else {
                (rb - 2, rb - 1)
            };
            if ka != kb {
                return Err(ctx.unsupported(format!(
                    "the reduction dims of its inputs are split differently: dim {dim_ka} of \
                     input 0 by {} and dim {dim_kb} of input 1 by {} (they must be split by the \
                     same mesh axes in the same order; inputs laid out as {} and {})",
                    name(&ka),
                    name(&kb),
                    inputs[0].layout().describe_map(),
                    inputs[1].layout().describe_map()
                )));
            }
            if let Some(&axis) = rows.iter().find(|x| cols.contains(x)) {
                return Err(ctx.unsupported(format!(
                    "its output's rows and columns would both be split by mesh axis {}: dim \
                     {dim_rows} of input 0 is split by {} and dim {dim_cols} of input 1 by {} \
                     (an axis may split one dim of the output only; inputs laid out as {} and {})",
                    mesh.axis_name(axis),
                    name(&rows),
                    name(&cols),
                    inputs[0].layout().describe_map(),
                    inputs[1].layout().describe_map()
                )));
            }
            let out = out_shape(0);
            let batch = out.len() - 2;
            let mut out_dims = Vec::with_capacity(out.len());
            for j in 0..batch {
                let from_a = (j + ra >= batch + 2).then(|| a[j + ra - batch - 2].clone());
                let from_b = (j + rb >= batch + 2).then(|| b[j + rb - batch - 2].clone());
                let axes = match (from_a, from_b) {
                    (Some(x), Some(y)) if !x.is_empty() && !y.is_empty() && x != y => {
                        return Err(ctx.unsupported(format!(
                            "batch dim {j} is split differently in its inputs"
                        )))
                    }
                    (Some(x), Some(y)) => {
                        if x.is_empty() {
                            y
                        } else {
                            x
                        }
                    }
                    (Some(x), None) | (None, Some(x)) => x,
                    (None, None) => Vec::new(),
                };
                out_dims.push(axes);
            }
            out_dims.push(rows);
            out_dims.push(cols);
            Ok(vec![output(ctx, &mesh, out_dims, ka, out)?])
        }
        Op::BatchMatMulSum {
            transpose_a,
            transpose_b,
        } => {
            // Σ_batch op(a_i)·op(b_i): the batch dims and the reduction dim are summed away,
            // so their axes (split alike in both inputs) become pending sums.
            let (a, b) = (dims(0), dims(1));
            let (ra, rb) = (a.len(), b.len());
            let [rows, ka, kb, cols] = matrix_axes(&a, &b, *transpose_a, *transpose_b);
            if ka != kb || a[..ra - 2] != b[..rb - 2] {
                return Err(ctx.unsupported(format!(
                    "its inputs' batch and reduction dims must be split alike, got {} and {}",
                    inputs[0].layout().describe_map(),
                    inputs[1].layout().describe_map()
                )));
            }
            let mut partial: Vec<usize> = a[..ra - 2].iter().flatten().copied().collect();
            partial.extend(ka);
            Ok(vec![output(
                ctx,
                &mesh,
                vec![rows, cols],
                partial,
                out_shape(0),
            )?])
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::MaskedFill { .. } | Op::Where => {
            let out = out_shape(0);
            let r = out.len();
            // Per output dim: its axes and the input they were taken from.
            let mut out_dims: Vec<Option<(Vec<usize>, usize)>> = vec![None; r];
            for (i, layout) in inputs.iter().enumerate() {
                let shape = ctx.input_shapes[i];
                let offset = r - shape.len();
                for (d, axes) in layout.dims().iter().enumerate() {
                    let j = d + offset;
                    if shape[d] != out[j] {
                        continue; // broadcast: replicated along j
                    }
                    match &out_dims[j] {
                        Some((existing, k)) if existing != axes => {
                            return Err(ctx.unsupported(format!(
                                "dim {j} is split differently in inputs {k} and {i} ({} and {})",
                                inputs[*k].layout().describe_map(),
                                layout.layout().describe_map()
                            )))
                        }
                        _ => out_dims[j] = Some((axes.clone(), i)),
                    }
                }
            }
            let out_dims = out_dims
                .into_iter()
                .map(|d| d.map(|(axes, _)| axes).unwrap_or_default())
                .collect();
            Ok(vec![output(ctx, &mesh, out_dims, Vec::new(), out)?])
        }
        Op::Neg
        | Op::Relu
        | Op::Gelu { .. }
        | Op::Tanh
        | Op::Sigmoid
        | Op::Exp
        | Op::Log
        | Op::Sqrt
        | Op::StopGradient
        | Op::Print { .. }
        | Op::Dropout { .. }
        | Op::Cast { .. }
        | Op::SparseSoftmaxCrossEntropyGrad { .. } => same_as(0),
        Op::Softmax | Op::LogSoftmax | Op::ScaledSoftmax { .. } => {
            last_unsplit(0, "the softmax axis")?;
            same_as(0)
        }
        Op::ReluGrad | Op::GeluGrad { .. } | Op::TanhGrad | Op::SigmoidGrad => {
            require_equal(0, 1)?;
            same_as(0)
        }
        Op::SoftmaxGrad | Op::LogSoftmaxGrad | Op::ScaledSoftmaxGrad { .. } => {
            last_unsplit(0, "the softmax axis")?;
            require_equal(0, 1)?;
            same_as(0)
        }
        Op::BiasAdd => {
            let x = dims(0);
            if dims(1).first() != x.last() {
                return Err(ctx.unsupported(format!(
                    "the bias must be split like the input's last dim ({} vs {})",
                    inputs[1].layout().describe_map(),
                    inputs[0].layout().describe_map()
                )));
            }
            same_as(0)
        }
        Op::BiasAddGrad => {
            let dy = dims(0);
            let (last, rest) = dy.split_last().expect("BiasAddGrad's input has a last dim");
            let partial = rest.iter().flatten().copied().collect();
            Ok(vec![output(
                ctx,
                &mesh,
                vec![last.clone()],
                partial,
                out_shape(0),
            )?])
        }
        Op::FlashAttention { .. } | Op::FlashAttentionGrad { .. } => {
            // q, k, v (and the gradient's out and dout) laid out alike on batch, heads and
            // sequence; the head dim whole; lse like q's rows.
            let alike: &[usize] = match ctx.op {
                Op::FlashAttention { .. } => &[1, 2],
                _ => &[1, 2, 3, 5],
            };
            for &i in alike {
                require_equal(0, i)?;
            }
            let q = dims(0);
            let r = q.len();
            // A split sequence dim runs as ring attention (`crate::ring`).
            last_unsplit(0, "the head dim of attention")?;
            let rows = q[..r - 1].to_vec();
            if let Op::FlashAttention { .. } = ctx.op {
                return Ok(vec![
                    output(ctx, &mesh, q, Vec::new(), out_shape(0))?,
                    output(ctx, &mesh, rows, Vec::new(), out_shape(1))?,
                ]);
            }
            if dims(4) != rows {
                return Err(ctx.unsupported(format!(
                    "lse must be laid out like q's rows, got {} for q {}",
                    inputs[4].layout().describe_map(),
                    inputs[0].layout().describe_map()
                )));
            }
            (0..3)
                .map(|j| output(ctx, &mesh, q.clone(), Vec::new(), out_shape(j)))
                .collect()
        }
        Op::PackedAttention { .. } | Op::PackedAttentionGrad { .. } => {
            // qkv (and the gradient's out and dout) laid out alike on the leading (batch) and
            // heads dims; the sequence whole (no ring attention on this layout) and the q|k|v
            // dim whole; lse like qkv's rows.
            let qkv = dims(0);
            let r = qkv.len();
            last_unsplit(0, "the q|k|v dim of packed attention")?;
            dim_unsplit(
                0,
                r - 3,
                "the sequence dim of packed attention (context parallel runs FlashAttention)",
            )?;
            let rows = qkv[..r - 1].to_vec();
            if let Op::PackedAttention { .. } = ctx.op {
                return Ok(vec![
                    output(ctx, &mesh, qkv, Vec::new(), out_shape(0))?,
                    output(ctx, &mesh, rows, Vec::new(), out_shape(1))?,
                ]);
            }
            for i in [1, 3] {
                require_equal(0, i)?;
            }
            if dims(2) != rows {
                return Err(ctx.unsupported(format!(
                    "lse must be laid out like qkv's rows, got {} for qkv {}",
                    inputs[2].layout().describe_map(),
                    inputs[0].layout().describe_map()
                )));
            }
            same_as(0)
        }
        Op::LayerNorm { .. } => {
            last_unsplit(0, "the normalised dim")?;
            let x = dims(0);
            let stats: Vec<Vec<usize>> = x[..x.len() - 1].to_vec();
            Ok(vec![
                output(ctx, &mesh, x.clone(), Vec::new(), out_shape(0))?,
                output(ctx, &mesh, stats.clone(), Vec::new(), out_shape(1))?,
                output(ctx, &mesh, stats, Vec::new(), out_shape(2))?,
            ])
        }
        Op::LayerNormGrad => {
            last_unsplit(0, "the normalised dim")?;
            let x = dims(0);
            let partial: Vec<usize> = x.iter().flatten().copied().collect();
            Ok(vec![
                output(ctx, &mesh, x, Vec::new(), out_shape(0))?,
                output(ctx, &mesh, vec![Vec::new()], partial.clone(), out_shape(1))?,
                output(ctx, &mesh, vec![Vec::new()], partial, out_shape(2))?,
            ])
        }
        Op::Flatten { .. } | Op::Reshape { .. } => {
            let x = dims(0);
            let out = out_shape(0);
            let factors: Vec<usize> = x
                .iter()
                .map(|axes| axes.iter().map(|&a| mesh.axis_size(a)).product())
                .collect();
            let kept = reshape::kept_splits(ctx.input_shapes[0], out, &factors).map_err(|e| {
                ctx.unsupported(format!(
                    "{e}; its input is laid out as {}",
                    inputs[0].layout().describe_map()
                ))
            })?;
            let out_dims = kept
                .iter()
                .map(|from| from.map(|d| x[d].clone()).unwrap_or_default())
                .collect();
            Ok(vec![output(ctx, &mesh, out_dims, Vec::new(), out)?])
        }
        Op::Concat { axis, .. } => {
            for i in 1..inputs.len() {
                require_equal(0, i)?;
            }
            dim_unsplit(0, *axis, "the concat axis")?;
            same_as(0)
        }
        Op::Split { axis, .. } => {
            dim_unsplit(0, *axis, "the split axis")?;
            (0..ctx.output_shapes.len())
                .map(|j| output(ctx, &mesh, dims(0), Vec::new(), out_shape(j)))
                .collect()
        }
        // Both keep the layout of the dims they take whole, the only ones that may be split.
        Op::StridedSlice { .. } | Op::StridedSliceGrad { .. } => {
            let (input, output) = (ctx.input_shapes[0], out_shape(0));
            let sliced = (0..input.len()).find(|&d| splits(&dims(0)[d]) && input[d] != output[d]);
            if let Some(d) = sliced {
                return Err(ctx.unsupported(format!(
                    "dim {d} is sliced ({} and {} elements), so it cannot be split, got {}",
                    input[d],
                    output[d],
                    inputs[0].layout().describe_map()
                )));
            }
            same_as(0)
        }
        Op::Transpose { perm } => {
            let x = dims(0);
            let out_dims = perm.iter().map(|&p| x[p].clone()).collect();
            Ok(vec![output(
                ctx,
                &mesh,
                out_dims,
                Vec::new(),
                out_shape(0),
            )?])
        }
        Op::BroadcastTo { shape } => {
            let x = dims(0);
            let in_shape = ctx.input_shapes[0];
            let offset = shape.len() - in_shape.len();
            let out_dims = (0..shape.len())
                .map(|j| {
                    if j < offset || in_shape[j - offset] != shape[j] {
                        Vec::new()
                    } else {
                        x[j - offset].clone()
                    }
                })
                .collect();
            Ok(vec![output(
                ctx,
                &mesh,
                out_dims,
                Vec::new(),
                out_shape(0),
            )?])
        }
        Op::SumToShape { shape } => {
            let x = dims(0);
            let in_shape = ctx.input_shapes[0];
            let offset = in_shape.len() - shape.len();
            let mut partial = Vec::new();
            let mut out_dims = Vec::with_capacity(shape.len());
            for (d, axes) in x.iter().enumerate() {
                if d < offset || shape[d - offset] != in_shape[d] {
                    partial.extend_from_slice(axes);
                    if d >= offset {
                        out_dims.push(Vec::new());
                    }
                } else {
                    out_dims.push(axes.clone());
                }
            }
            Ok(vec![output(ctx, &mesh, out_dims, partial, out_shape(0))?])
        }
        Op::ReduceSum { axes, keep_dims } | Op::ReduceMax { axes, keep_dims } => {
            // A split reduced dim leaves partial sums (maxima) pending over its axes.
            let x = dims(0);
            let reduced = |d: usize| axes.is_empty() || axes.contains(&d);
            let mut partial = Vec::new();
            let mut out_dims = Vec::new();
            for (d, a) in x.iter().enumerate() {
                if reduced(d) {
                    partial.extend_from_slice(a);
                    if *keep_dims {
                        out_dims.push(Vec::new());
                    }
                } else {
                    out_dims.push(a.clone());
                }
            }
            let out = output(ctx, &mesh, out_dims, partial, out_shape(0))?;
            Ok(vec![match ctx.op {
                Op::ReduceMax { .. } => out.with_op(PendingOp::Max),
                _ => out,
            }])
        }
        Op::MoeRoute { .. } => {
            // Groups route independently: every output keeps the groups' split.
            for d in [1, 2] {
                dim_unsplit(0, d, "routed whole (the tokens and the experts of a group)")?;
            }
            let masks = dims(0);
            let mut dispatch = masks.clone();
            dispatch.push(Vec::new());
            Ok(vec![
                output(ctx, &mesh, dispatch, Vec::new(), out_shape(0))?,
                output(ctx, &mesh, masks.clone(), Vec::new(), out_shape(1))?,
                output(ctx, &mesh, masks, Vec::new(), out_shape(2))?,
            ])
        }
        Op::OneHot { .. } => {
            // The class dim is split over the mesh axes the labels are replicated on (the
            // strategy's class factor), but for the repeated-calculation axis: each rank writes
            // its columns.
            let mut out_dims = dims(0);
            let classes = inputs[0]
                .layout()
                .unused_axes()
                .into_iter()
                .filter(|&a| mesh.axis_name(a) != REPEATED_CALC_AXIS)
                .collect();
            out_dims.push(classes);
            Ok(vec![output(
                ctx,
                &mesh,
                out_dims,
                Vec::new(),
                out_shape(0),
            )?])
        }
        Op::Embedding => {
            // Vocabulary parallel: a rank looks up the ids in its block of rows and writes zeros
            // for the others, so the output is pending a sum over the axes splitting the rows.
            let table = dims(0);
            let mut out_dims = dims(1);
            out_dims.push(table[1].clone());
            Ok(vec![output(
                ctx,
                &mesh,
                out_dims,
                table[0].clone(),
                out_shape(0),
            )?])
        }
        Op::EmbeddingGrad => {
            // A rank scatters its ids that fall in its block of rows: the table's layout,
            // pending a sum over the axes splitting the ids.
            let (table, ids, dy) = (dims(0), dims(1), dims(2));
            if dy.last() != table.last() {
                return Err(ctx.unsupported(format!(
                    "dy's last dim must be split like the table's embedding dim ({} vs {})",
                    inputs[2].layout().describe_map(),
                    inputs[0].layout().describe_map()
                )));
            }
            let partial = ids.iter().flatten().copied().collect();
            Ok(vec![output(ctx, &mesh, table, partial, out_shape(0))?])
        }
        Op::SparseSoftmaxCrossEntropy { .. } => {
            last_unsplit(0, "the class dim")?;
            let logits = dims(0);
            if dims(1).first() != logits.first() {
                return Err(ctx.unsupported("the labels must be split like the logits' batch dim"));
            }
            let partial = logits.iter().flatten().copied().collect();
            Ok(vec![output(ctx, &mesh, Vec::new(), partial, out_shape(0))?])
        }
        // Constants are computed whole on every rank; a consumer wanting a split takes its box
        // (a local slice in the reshard before it).
        Op::Fill { .. } | Op::Triu { .. } => Ok(vec![output(
            ctx,
            &mesh,
            vec![Vec::new(); out_shape(0).len()],
            Vec::new(),
            out_shape(0),
        )?]),
        #[allow(unreachable_patterns)]
        other => Err(ctx.unsupported(format!("no sharding rule for {}", other.kind()))),
    }
}
