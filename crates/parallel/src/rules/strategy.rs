//! From strategy tuples to an op's device matrix and input layouts (MindSpore's rules,
//! `SEMANTICS.md` §2).
//!
//! A strategy gives, per input, the number of pieces each dim is cut into. The op's device
//! matrix is built from those factors in a canonical order per op kind (for MatMul
//! `[rows, reduction, cols]`); when it uses fewer devices than there are, a repeated-calculation
//! axis `rep` is appended on the right. Unit axes are then dropped, as MindSpore normalises.

use graph::Op;
use layout::{repeated_calc_mesh, Layout, Mesh};

use super::{reshape, InputPlacement, OpContext};
use crate::error::ParallelError;

/// One pipeline stage of a run with more than one: where an op's strategy is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineStage {
    /// The op's stage (0-based).
    pub stage: usize,
    /// `parallel.pipeline.stages` (more than 1).
    pub stages: usize,
    /// `parallel.devices`: every stage has `devices / stages` of them.
    pub devices: usize,
}

/// The devices an op is placed on: `n`, those of `stage` when the run is pipelined.
#[derive(Debug, Clone, Copy)]
struct On {
    n: usize,
    stage: Option<PipelineStage>,
}

impl On {
    /// "the N devices", or which stage's devices they are and where the count comes from.
    fn describe(self, device_num: usize) -> String {
        describe_devices(device_num, self.stage)
    }
}

/// "the N devices", or, when the op is on pipeline `stage`, which stage's devices they are and
/// where the count comes from (`parallel.devices` / `parallel.pipeline.stages`): how the
/// errors about an op's devices name them.
pub fn describe_devices(device_num: usize, stage: Option<PipelineStage>) -> String {
    match stage {
        Some(p) => format!(
            "the {device_num} devices of pipeline stage {} (parallel.devices {} / \
             parallel.pipeline.stages {})",
            p.stage, p.devices, p.stages
        ),
        None => format!("the {device_num} devices"),
    }
}

/// Builds the op's mesh from `dev_matrix` (named `names`) on `devices` devices, and the input
/// layouts from per-input axis lists; drops unit axes.
fn place(
    ctx: &OpContext<'_>,
    strategy: &[Vec<usize>],
    dev_matrix: &[usize],
    names: &[String],
    devices: On,
    inputs: Vec<Vec<Vec<usize>>>,
) -> Result<InputPlacement, ParallelError> {
    let mesh = repeated_calc_mesh(dev_matrix, names, devices.n).map_err(|e| match e {
        layout::LayoutError::StrategyDeviceMismatch {
            used, device_num, ..
        } => ctx.invalid(
            strategy,
            format!(
                "it uses {used} devices, which does not divide {}",
                devices.describe(device_num)
            ),
        ),
        other => ctx.layout_error(other),
    })?;
    let layouts = inputs
        .into_iter()
        .map(|dims| {
            Layout::from_mesh(mesh.clone(), dims)
                .map(|l| l.normalized())
                .map_err(|e| ctx.layout_error(e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mesh = layouts
        .first()
        .map_or_else(|| mesh.without_unit_axes().0, |l| l.mesh().clone());
    Ok(InputPlacement {
        mesh,
        inputs: layouts,
    })
}

/// Checks that the strategy has one entry per operand of `shapes` (the op's `operand`s: inputs,
/// or for a OneHot its output), one factor per dim, and that every factor divides its dim.
fn check_divides(
    ctx: &OpContext<'_>,
    strategy: &[Vec<usize>],
    shapes: &[&[usize]],
    operand: &str,
) -> Result<(), ParallelError> {
    if strategy.len() != shapes.len() {
        return Err(ctx.invalid(
            strategy,
            format!(
                "it has {} entries but the op has {} {operand}s",
                strategy.len(),
                shapes.len()
            ),
        ));
    }
    for (i, (s, shape)) in strategy.iter().zip(shapes).enumerate() {
        if s.len() != shape.len() {
            return Err(ctx.invalid(
                strategy,
                format!(
                    "{operand} {i} has {} dims ({shape:?}) but its strategy has {} entries",
                    shape.len(),
                    s.len()
                ),
            ));
        }
        for (d, (&f, &size)) in s.iter().zip(shape.iter()).enumerate() {
            if f == 0 || size % f != 0 {
                return Err(ctx.invalid(
                    strategy,
                    format!("dim {d} of {operand} {i} has size {size}, which {f} does not divide"),
                ));
            }
        }
    }
    Ok(())
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// The layouts of every input of `ctx`'s op under `strategy` on `devices` devices.
pub fn input_layouts(
    ctx: &OpContext<'_>,
    strategy: &[Vec<usize>],
    devices: usize,
) -> Result<InputPlacement, ParallelError> {
    layouts_on(
        ctx,
        strategy,
        On {
            n: devices,
            stage: None,
        },
    )
}

/// [`input_layouts`] on the `devices` devices of one pipeline stage (`stage`, `None` when the
/// run is not pipelined): a strategy that does not fit them says which stage's devices they are.
pub fn input_layouts_on_stage(
    ctx: &OpContext<'_>,
    strategy: &[Vec<usize>],
    devices: usize,
    stage: Option<PipelineStage>,
) -> Result<InputPlacement, ParallelError> {
    layouts_on(ctx, strategy, On { n: devices, stage })
}

fn layouts_on(
    ctx: &OpContext<'_>,
    strategy: &[Vec<usize>],
    devices: On,
) -> Result<InputPlacement, ParallelError> {
    if let Op::OneHot { .. } = ctx.op {
        return one_hot(ctx, strategy, devices);
    }
    check_divides(ctx, strategy, &ctx.input_shapes, "input")?;
    let s = strategy;
    match ctx.op {
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => {
            let (a, ka) = if *transpose_a {
                (s[0][1], s[0][0])
            } else {
                (s[0][0], s[0][1])
            };
            let (kb, c) = if *transpose_b {
                (s[1][1], s[1][0])
            } else {
                (s[1][0], s[1][1])
            };
            if ka != kb {
                return Err(ctx.invalid(
                    s,
                    format!(
                        "the split of the first input's reduction dim ({ka}) must equal the \
                         second's ({kb})"
                    ),
                ));
            }
            let (m, k, n) = (vec![0], vec![1], vec![2]);
            let a_dims = if *transpose_a {
                vec![k.clone(), m]
            } else {
                vec![m, k.clone()]
            };
            let b_dims = if *transpose_b { vec![n, k] } else { vec![k, n] };
            place(
                ctx,
                s,
                &[a, ka, c],
                &["m".into(), "k".into(), "n".into()],
                devices,
                vec![a_dims, b_dims],
            )
        }
        Op::BatchMatMul {
            transpose_a,
            transpose_b,
        } => {
            let (ra, rb) = (s[0].len(), s[1].len());
            let batch = ra.max(rb) - 2;
            let mut dev = Vec::with_capacity(batch + 3);
            // Batch dims, right-aligned; a broadcast (size-1) dim must not be split.
            for j in 0..batch {
                let fa = (j + ra >= batch + 2).then(|| s[0][j + ra - batch - 2]);
                let fb = (j + rb >= batch + 2).then(|| s[1][j + rb - batch - 2]);
                let size_a = (j + ra >= batch + 2).then(|| ctx.input_shapes[0][j + ra - batch - 2]);
                let size_b = (j + rb >= batch + 2).then(|| ctx.input_shapes[1][j + rb - batch - 2]);
                let f = match (fa, fb) {
                    (Some(x), Some(y)) if size_a == size_b && x != y => {
                        return Err(ctx.invalid(
                            s,
                            format!(
                                "batch dim {j} is split {x} ways in one input and {y} in the other"
                            ),
                        ))
                    }
                    (Some(x), Some(y)) => x.max(y),
                    (Some(x), None) | (None, Some(x)) => x,
                    (None, None) => 1,
                };
                dev.push(f);
            }
            let (a, ka) = if *transpose_a {
                (s[0][ra - 1], s[0][ra - 2])
            } else {
                (s[0][ra - 2], s[0][ra - 1])
            };
            let (kb, c) = if *transpose_b {
                (s[1][rb - 1], s[1][rb - 2])
            } else {
                (s[1][rb - 2], s[1][rb - 1])
            };
            if ka != kb {
                return Err(ctx.invalid(
                    s,
                    format!("the split of the first input's reduction dim ({ka}) must equal the second's ({kb})"),
                ));
            }
            dev.extend([a, ka, c]);
            let (m, k, n) = (batch, batch + 1, batch + 2);
            let batch_dims = |rank: usize, input: usize| -> Vec<Vec<usize>> {
                (0..rank - 2)
                    .map(|d| {
                        let j = d + batch + 2 - rank;
                        if s[input][d] > 1 {
                            vec![j]
                        } else {
                            Vec::new()
                        }
                    })
                    .collect()
            };
            let mut a_dims = batch_dims(ra, 0);
            a_dims.extend(if *transpose_a {
                [vec![k], vec![m]]
            } else {
                [vec![m], vec![k]]
            });
            let mut b_dims = batch_dims(rb, 1);
            b_dims.extend(if *transpose_b {
                [vec![n], vec![k]]
            } else {
                [vec![k], vec![n]]
            });
            let mut axis_names = names("b", batch);
            axis_names.extend(["m".to_string(), "k".to_string(), "n".to_string()]);
            place(ctx, s, &dev, &axis_names, devices, vec![a_dims, b_dims])
        }
        // A mask or condition follows x's split on the dims it has (broadcast dims stay whole).
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::MaskedFill { .. } | Op::Where => {
            broadcast_binary(ctx, s, devices)
        }
        Op::BiasAdd => {
            let r = s[0].len();
            if s[1][0] != s[0][r - 1] {
                return Err(ctx.invalid(
                    s,
                    format!(
                        "the bias must be split like the last dim of the input ({} ways), not {}",
                        s[0][r - 1],
                        s[1][0]
                    ),
                ));
            }
            let dims: Vec<Vec<usize>> = (0..r).map(|d| vec![d]).collect();
            place(
                ctx,
                s,
                &s[0],
                &names("d", r),
                devices,
                vec![dims, vec![vec![r - 1]]],
            )
        }
        Op::MoeRoute { .. } => {
            // Routing is per group: the tokens of a group and its experts stay whole.
            if s[0][1] != 1 || s[0][2] != 1 {
                return Err(ctx.invalid(
                    s,
                    "only dim 0 (the groups) can be split: a group's tokens share the experts' \
                     capacity, and a token is routed over every expert",
                ));
            }
            elementwise(ctx, s, devices)
        }
        Op::Softmax | Op::LogSoftmax | Op::ScaledSoftmax { .. } => {
            let r = s[0].len();
            if r > 0 && s[0][r - 1] != 1 {
                return Err(ctx.invalid(s, "the last dim (the softmax axis) cannot be split"));
            }
            elementwise(ctx, s, devices)
        }
        Op::Relu
        | Op::Gelu { .. }
        | Op::Tanh
        | Op::Sigmoid
        | Op::Neg
        | Op::Exp
        | Op::Log
        | Op::Sqrt
        | Op::StopGradient
        | Op::Print { .. }
        | Op::Dropout { .. }
        | Op::Cast { .. } => elementwise(ctx, s, devices),
        Op::Transpose { .. } | Op::ReduceSum { .. } | Op::ReduceMax { .. } => {
            elementwise(ctx, s, devices)
        }
        Op::Concat { axis, .. } => {
            if let Some(i) = s.iter().position(|si| si != &s[0]) {
                return Err(ctx.invalid(
                    s,
                    format!("input {i} must be split like input 0 (every input alike)"),
                ));
            }
            axis_unsplit(ctx, s, *axis, "concat")?;
            let r = s[0].len();
            let dims: Vec<Vec<usize>> = (0..r).map(|d| vec![d]).collect();
            let n = s.len();
            place(ctx, s, &s[0], &names("d", r), devices, vec![dims; n])
        }
        Op::Split { axis, .. } => {
            axis_unsplit(ctx, s, *axis, "split")?;
            elementwise(ctx, s, devices)
        }
        Op::StridedSlice { .. } => {
            let (input, output) = (ctx.input_shapes[0], ctx.output_shapes[0]);
            let sliced = (0..input.len()).find(|&d| s[0][d] > 1 && input[d] != output[d]);
            if let Some(d) = sliced {
                return Err(ctx.invalid(
                    s,
                    format!(
                        "dim {d} is sliced ({} of {} elements), so it cannot be split: only a \
                         dim taken whole (begin 0, end its size, stride 1) can",
                        output[d], input[d]
                    ),
                ));
            }
            elementwise(ctx, s, devices)
        }
        Op::FlashAttention { .. } => {
            // q, k and v split alike on their leading (batch, heads) dims and the sequence
            // dim (context parallel: a ring passes the key/value blocks, see
            // `crate::ring`); the head dim whole.
            if let Some(i) = s.iter().position(|si| si != &s[0]) {
                return Err(ctx.invalid(
                    s,
                    format!(
                        "input {i} must be split like q (q, k and v alike, on batch, heads and sequence)"
                    ),
                ));
            }
            let r = s[0].len();
            if s[0][r - 1] != 1 {
                return Err(ctx.invalid(s, format!("the head dim (dim {}) cannot be split", r - 1)));
            }
            let dims: Vec<Vec<usize>> = (0..r).map(|d| vec![d]).collect();
            place(ctx, s, &s[0], &names("d", r), devices, vec![dims; 3])
        }
        Op::PackedAttention { .. } => {
            // qkv split on its leading (batch) and heads dims; the sequence whole (context
            // parallel runs FlashAttention's ring) and the q|k|v dim whole.
            let r = s[0].len();
            if s[0][r - 1] != 1 {
                return Err(
                    ctx.invalid(s, format!("the q|k|v dim (dim {}) cannot be split", r - 1))
                );
            }
            if s[0][r - 3] != 1 {
                return Err(ctx.invalid(
                    s,
                    format!(
                        "the sequence dim (dim {}) of packed attention cannot be split: context \
                         parallel runs FlashAttention",
                        r - 3
                    ),
                ));
            }
            let dims: Vec<Vec<usize>> = (0..r).map(|d| vec![d]).collect();
            place(ctx, s, &s[0], &names("d", r), devices, vec![dims])
        }
        Op::LayerNorm { .. } => {
            let r = s[0].len();
            if s[0][r - 1] != 1 {
                return Err(ctx.invalid(s, "the normalised (last) dim cannot be split"));
            }
            if s[1] != [1] || s[2] != [1] {
                return Err(ctx.invalid(s, "gamma and beta cannot be split"));
            }
            let dims: Vec<Vec<usize>> = (0..r).map(|d| vec![d]).collect();
            place(
                ctx,
                s,
                &s[0],
                &names("d", r),
                devices,
                vec![dims, vec![Vec::new()], vec![Vec::new()]],
            )
        }
        Op::Flatten { .. } | Op::Reshape { .. } => {
            reshape::kept_splits(ctx.input_shapes[0], ctx.output_shapes[0], &s[0])
                .map_err(|e| ctx.invalid(s, e))?;
            elementwise(ctx, s, devices)
        }
        Op::Embedding => {
            // Device matrix `[ids dims..., e, v]`: the table `[vocab, dim]` is split `v` ways
            // on its rows (vocabulary parallel, MindSpore's Gather with its parameter split on
            // axis 0) and `e` ways on its columns; the ids by their own strategy.
            let ri = s[1].len();
            let mut dev = s[1].clone();
            dev.extend([s[0][1], s[0][0]]);
            let table = vec![vec![ri + 1], vec![ri]];
            let ids = (0..ri).map(|d| vec![d]).collect();
            let mut axis_names = names("d", ri);
            axis_names.extend(["e".to_string(), "v".to_string()]);
            place(ctx, s, &dev, &axis_names, devices, vec![table, ids])
        }
        Op::SparseSoftmaxCrossEntropy { .. } => {
            if s[0][1] != 1 {
                return Err(ctx.invalid(s, "the class dim of the logits cannot be split"));
            }
            if s[1][0] != s[0][0] {
                return Err(ctx.invalid(
                    s,
                    format!(
                        "the labels must be split like the logits' batch dim ({} ways), not {}",
                        s[0][0], s[1][0]
                    ),
                ));
            }
            place(
                ctx,
                s,
                &[s[0][0]],
                &["d0".to_string()],
                devices,
                vec![vec![vec![0], Vec::new()], vec![vec![0]]],
            )
        }
        other => Err(ctx.unsupported(format!(
            "a {} op cannot be given a strategy (it is placed from its inputs)",
            other.kind()
        ))),
    }
}

/// `Ok` when dim `axis` of every input is whole (the axis a concat joins or a split cuts).
fn axis_unsplit(
    ctx: &OpContext<'_>,
    s: &[Vec<usize>],
    axis: usize,
    what: &str,
) -> Result<(), ParallelError> {
    match s
        .iter()
        .position(|si| si.get(axis).is_some_and(|&f| f != 1))
    {
        Some(i) => Err(ctx.invalid(
            s,
            format!("dim {axis} of input {i} is the {what} axis and cannot be split"),
        )),
        None => Ok(()),
    }
}

/// OneHot, whose strategy is its output's (as MindSpore's): `[[rows..., classes]]`. The labels
/// are split like the rows; the class axis splits only the output.
fn one_hot(
    ctx: &OpContext<'_>,
    s: &[Vec<usize>],
    devices: On,
) -> Result<InputPlacement, ParallelError> {
    let out = ctx.output_shapes[0];
    check_divides(ctx, s, &[out], "output")?;
    let entry = &s[0];
    let labels = (0..out.len() - 1).map(|d| vec![d]).collect();
    place(ctx, s, entry, &names("d", out.len()), devices, vec![labels])
}

/// Unary and single-input ops: the device matrix is the strategy itself.
fn elementwise(
    ctx: &OpContext<'_>,
    s: &[Vec<usize>],
    devices: On,
) -> Result<InputPlacement, ParallelError> {
    let r = s[0].len();
    let dims: Vec<Vec<usize>> = (0..r).map(|d| vec![d]).collect();
    place(ctx, s, &s[0], &names("d", r), devices, vec![dims])
}

/// Broadcasting binary ops: the device matrix is the output's per-dim split.
fn broadcast_binary(
    ctx: &OpContext<'_>,
    s: &[Vec<usize>],
    devices: On,
) -> Result<InputPlacement, ParallelError> {
    let out = ctx.output_shapes[0];
    let r = out.len();
    let mut dev = vec![1; r];
    for (i, (st, shape)) in s.iter().zip(&ctx.input_shapes).enumerate() {
        let offset = r - shape.len();
        for (d, (&f, &size)) in st.iter().zip(shape.iter()).enumerate() {
            let j = d + offset;
            if size != out[j] {
                if f != 1 {
                    return Err(ctx.invalid(
                        s,
                        format!(
                            "input {i} is broadcast along dim {j}, so it cannot be split there"
                        ),
                    ));
                }
                continue;
            }
            if dev[j] != 1 && f != dev[j] {
                return Err(ctx.invalid(
                    s,
                    format!(
                        "dim {j} is split {} ways in one input and {f} in another",
                        dev[j]
                    ),
                ));
            }
            dev[j] = f;
        }
    }
    let inputs = ctx
        .input_shapes
        .iter()
        .zip(s)
        .map(|(shape, st)| {
            let offset = r - shape.len();
            (0..shape.len())
                .map(|d| {
                    let j = d + offset;
                    if shape[d] == out[j] && st[d] > 1 {
                        vec![j]
                    } else if shape[d] == out[j] && dev[j] > 1 {
                        // Same-size dim left unsplit in this input while the other splits it.
                        vec![usize::MAX]
                    } else {
                        Vec::new()
                    }
                })
                .collect::<Vec<Vec<usize>>>()
        })
        .collect::<Vec<_>>();
    if inputs.iter().flatten().flatten().any(|&a| a == usize::MAX) {
        return Err(ctx.invalid(
            s,
            "inputs of the same size along a dim must be split the same way there",
        ));
    }
    place(ctx, s, &dev, &names("d", r), devices, inputs)
}

/// The strategy that splits nothing (one device): all ones, one entry per input (for a OneHot,
/// whose strategy is its output's, one entry for the output).
pub fn unsplit_strategy(ctx: &OpContext<'_>) -> Vec<Vec<usize>> {
    match ctx.op {
        Op::OneHot { .. } => vec![vec![1; ctx.output_shapes[0].len()]],
        _ => ctx.input_shapes.iter().map(|s| vec![1; s.len()]).collect(),
    }
}

/// MindSpore's default for an op without a user strategy: data parallel, dim 0 of every input
/// whose dim 0 is the batch (the output's dim 0) split over the devices, everything else whole.
/// When the batch does not divide by the device count, it is split by the largest number that
/// divides both (the rest of the devices repeat the calculation).
pub fn default_strategy(ctx: &OpContext<'_>, devices: usize) -> Vec<Vec<usize>> {
    let batch = ctx
        .output_shapes
        .first()
        .and_then(|s| s.first().copied())
        .unwrap_or(1);
    let split = gcd(batch, devices);
    let batch_split = |shape: &[usize], is_batch: bool| -> Vec<usize> {
        let mut st = vec![1; shape.len()];
        if is_batch && !shape.is_empty() {
            st[0] = split;
        }
        st
    };
    match ctx.op {
        Op::MatMul { transpose_a, .. } | Op::BatchMatMul { transpose_a, .. }
            if *transpose_a && ctx.input_shapes[0].len() == 2 =>
        {
            // A transposed A has its rows in dim 1.
            let mut a = vec![1; 2];
            a[1] = split;
            vec![a, vec![1; ctx.input_shapes[1].len()]]
        }
        Op::BatchMatMul { .. }
            if ctx.input_shapes[0].len() > 2
                && ctx.input_shapes[1].len() == ctx.input_shapes[0].len()
                && ctx.input_shapes[1][0] == ctx.input_shapes[0][0] =>
        {
            // Both operands batched alike (attention's products): the batch dim of both.
            vec![
                batch_split(ctx.input_shapes[0], true),
                batch_split(ctx.input_shapes[1], true),
            ]
        }
        Op::MatMul { .. } | Op::BatchMatMul { .. } => vec![
            batch_split(ctx.input_shapes[0], true),
            vec![1; ctx.input_shapes[1].len()],
        ],
        Op::Embedding => vec![vec![1, 1], batch_split(ctx.input_shapes[1], true)],
        Op::OneHot { .. } => vec![batch_split(ctx.output_shapes[0], true)],
        Op::SparseSoftmaxCrossEntropy { .. } => {
            let b = gcd(ctx.input_shapes[0][0], devices);
            vec![vec![b, 1], vec![b]]
        }
        Op::LayerNorm { .. } => vec![
            batch_split(ctx.input_shapes[0], ctx.input_shapes[0].len() > 1),
            vec![1],
            vec![1],
        ],
        // The batch (dim 0) split alike in every input, unless it is the axis joined or cut.
        Op::Concat { axis, .. } | Op::Split { axis, .. } => ctx
            .input_shapes
            .iter()
            .map(|shape| batch_split(shape, *axis != 0 && shape.len() > 1))
            .collect(),
        Op::Softmax | Op::LogSoftmax | Op::ScaledSoftmax { .. } => {
            vec![batch_split(
                ctx.input_shapes[0],
                ctx.input_shapes[0].len() > 1,
            )]
        }
        // q, k and v alike; dim 0 is the batch only above 2 dims (`[S, d]` is one sequence,
        // whose split the rule refuses).
        Op::FlashAttention { .. } => ctx
            .input_shapes
            .iter()
            .map(|shape| batch_split(shape, shape.len() > 2))
            .collect(),
        // qkv `[..., S, N, 3·d]`: dim 0 is the batch above 3 dims.
        Op::PackedAttention { .. } => vec![batch_split(
            ctx.input_shapes[0],
            ctx.input_shapes[0].len() > 3,
        )],
        // A reshape keeps its input's leading split wherever row-major order allows it: with
        // the batch merged into the next dims (the GPT's logits `[B, S, V]` → `[B·S, V]`) or
        // cut apart, `s` contiguous blocks of the input are `s` blocks of the output when `s`
        // divides both leading dims. (Splitting by the output's leading dim alone left such a
        // reshape whole: an all-gather of the logits in every data-parallel step.)
        Op::Flatten { .. } | Op::Reshape { .. } => {
            let (input, output) = (ctx.input_shapes[0], ctx.output_shapes[0]);
            let mut kept = vec![1; input.len()];
            if let (Some(&i0), Some(&o0)) = (input.first(), output.first()) {
                kept[0] = gcd(gcd(i0, o0), devices);
                if reshape::kept_splits(input, output, &kept).is_err() {
                    kept[0] = 1;
                }
            }
            vec![kept]
        }
        _ => {
            let single_input = ctx.input_shapes.len() == 1;
            let r = ctx.output_shapes.first().map_or(0, |s| s.len());
            ctx.input_shapes
                .iter()
                .map(|shape| {
                    // A single-input op (Flatten, Reshape, …) keeps the batch in dim 0 even when
                    // its rank changes; a broadcasting op's lower-rank input is not batched.
                    let same_rank = shape.len() == r || single_input;
                    let is_batch = same_rank && !shape.is_empty() && shape[0] == batch;
                    batch_split(shape, is_batch)
                })
                .collect()
        }
    }
}

/// The greatest common divisor (1 for 0 and 0).
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a.max(1)
    } else {
        gcd(b, a % b)
    }
}

/// A mesh of `devices` ranks in one axis named `dp`, the devices of a stage.
pub fn device_mesh(devices: usize) -> Mesh {
    Mesh::line("dp", devices).expect("a positive device count")
}
