//! One op under one strategy, costed: its compute and communication time, its memory by
//! category, and the split factors of its operands that redistribution costs are computed from.

use graph::{Graph, Node, Op, ValueKind};
use parallel::ring::RingBlock;
use parallel::rules::strategy::PipelineStage;
use parallel::rules::{infer, strategy, OpContext};

use crate::cost::DeviceProfile;
use crate::error::SearchError;
use crate::footprint::MemoryEstimate;
use crate::held::HeldValues;

/// How a tensor is split: a factor per dim, and the number of partial sums it is pending over.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Split {
    /// Split factor per dim.
    pub factors: Vec<usize>,
    /// Devices whose values are summed to give the tensor (1: none pending).
    pub partial: usize,
}

/// An op under one strategy, with its costs.
#[derive(Debug, Clone)]
pub struct Evaluated {
    /// The strategy tuples (one per input; MindSpore's `in_strategy`).
    pub strategy: Vec<Vec<usize>>,
    /// How each input must be split.
    pub inputs: Vec<Split>,
    /// How each output is produced.
    pub outputs: Vec<Split>,
    /// Seconds of compute, forward and backward.
    pub compute: f64,
    /// Seconds of communication inside the op: gradient all-reduces of parameters and the
    /// pending sums of input gradients.
    pub comm: f64,
    /// Bytes each device receives for that communication.
    pub comm_bytes: f64,
    /// What the op holds on each device.
    pub memory: MemoryEstimate,
    /// Devices computing distinct parts (the product of its device matrix without repeats).
    pub devices_used: usize,
}

impl Evaluated {
    /// Compute plus communication.
    pub fn time(&self) -> f64 {
        self.compute + self.comm
    }
}

/// What the evaluation needs besides the op.
#[derive(Debug, Clone)]
pub struct EvalSettings<'a> {
    /// The device profile.
    pub profile: &'a DeviceProfile,
    /// Devices of the stage.
    pub devices: usize,
    /// Optimizer state per trainable parameter element, in parameter copies (Adam: 2).
    pub optimizer_states: usize,
    /// The values a step holds until its backward reads them: an op's activations count only
    /// those of its outputs. `None` counts every output as held.
    pub held: Option<&'a HeldValues>,
}

/// Whether `op` is a matrix product or made of them (compute-bound): the fused attention is.
fn is_matmul(op: &Op) -> bool {
    matches!(
        op,
        Op::MatMul { .. }
            | Op::BatchMatMul { .. }
            | Op::FlashAttention { .. }
            | Op::PackedAttention { .. }
    )
}

/// FLOPs of one forward product: 2 × output elements × the reduction length; for the fused
/// attention its two products (`q·kᵀ`, `p·v`), half of them under a causal mask.
fn matmul_flops(ctx: &OpContext<'_>) -> f64 {
    if let Op::FlashAttention { causal, .. } = ctx.op {
        let (q, k) = (ctx.input_shapes[0], ctx.input_shapes[1]);
        let q_elements: f64 = q.iter().map(|&d| d as f64).product();
        let products = 4.0 * q_elements * k[k.len() - 2] as f64;
        return if *causal { products / 2.0 } else { products };
    }
    if let Op::PackedAttention { causal, .. } = ctx.op {
        // `out [..., S, N, d]` has q's elements; every query sees the `S` keys.
        let qkv = ctx.input_shapes[0];
        let q_elements: f64 = ctx.output_shapes[0].iter().map(|&d| d as f64).product();
        let products = 4.0 * q_elements * qkv[qkv.len() - 3] as f64;
        return if *causal { products / 2.0 } else { products };
    }
    let (a, transpose_a) = match ctx.op {
        Op::MatMul { transpose_a, .. } | Op::BatchMatMul { transpose_a, .. } => {
            (ctx.input_shapes[0], *transpose_a)
        }
        _ => return 0.0,
    };
    let r = a.len();
    let k = if transpose_a { a[r - 2] } else { a[r - 1] };
    let out: f64 = ctx.output_shapes[0].iter().map(|&d| d as f64).product();
    2.0 * out * k as f64
}

/// Elements of `shape` split by `factors`.
fn local_elements(shape: &[usize], factors: &[usize]) -> f64 {
    shape
        .iter()
        .zip(factors.iter().chain(std::iter::repeat(&1)))
        .map(|(&d, &f)| d as f64 / f.max(1) as f64)
        .product()
}

/// `node` of `graph` under `strategy`, costed, or why the strategy is not valid.
pub fn evaluate(
    graph: &Graph,
    node: &Node,
    strategy: &[Vec<usize>],
    settings: &EvalSettings<'_>,
) -> Result<Evaluated, SearchError> {
    evaluate_on_stage(graph, node, strategy, settings, None)
}

/// [`evaluate`] for an op of pipeline stage `stage` (`None` when the run is not pipelined),
/// whose `settings.devices` are that stage's: a strategy that does not fit them is refused
/// naming the stage and where its device count comes from
/// ([`strategy::input_layouts_on_stage`]).
pub fn evaluate_on_stage(
    graph: &Graph,
    node: &Node,
    strategy: &[Vec<usize>],
    settings: &EvalSettings<'_>,
    stage: Option<PipelineStage>,
) -> Result<Evaluated, SearchError> {
    let ctx = OpContext::of(graph, node);
    let devices = settings.devices;
    let placement = strategy::input_layouts_on_stage(&ctx, strategy, devices, stage)?;
    let stage = strategy::device_mesh(devices);
    let bound = placement
        .inputs
        .iter()
        .zip(&ctx.input_shapes)
        .map(|(l, shape)| l.bind(shape).map_err(|e| ctx.layout_error(e)))
        .collect::<Result<Vec<_>, _>>()?;
    let outs = infer::output_layouts(&ctx, &bound, &stage)?;
    let inputs: Vec<Split> = bound
        .iter()
        .map(|l| Split {
            factors: l.split_factors(),
            partial: 1,
        })
        .collect();
    let outputs: Vec<Split> = outs
        .iter()
        .map(|o| Split {
            factors: o.layout().split_factors(),
            partial: o.partial_count().max(1),
        })
        .collect();
    let devices_used = outputs
        .first()
        .map_or(1, |o| o.factors.iter().product::<usize>() * o.partial)
        .max(1);
    let profile = settings.profile;
    let elem = |v: graph::ValueId| graph.values()[v.0].dtype.size_in_bytes() as f64;
    // Forward once, backward twice (the gradients of both operands).
    let compute = if is_matmul(&node.op) {
        3.0 * profile.matmul_time(matmul_flops(&ctx) / devices_used as f64)
    } else {
        let mut bytes = 0.0;
        for (k, &v) in node.inputs.iter().enumerate() {
            bytes += local_elements(ctx.input_shapes[k], &inputs[k].factors) * elem(v);
        }
        for (k, &v) in node.outputs.iter().enumerate() {
            bytes += local_elements(ctx.output_shapes[k], &outputs[k].factors) * elem(v);
        }
        3.0 * profile.memory_time(bytes)
    };
    let mut comm = 0.0;
    let mut comm_bytes = 0.0;
    let mut memory = MemoryEstimate::default();
    for (k, &v) in node.inputs.iter().enumerate() {
        let value = &graph.values()[v.0];
        let split: usize = inputs[k].factors.iter().product::<usize>().max(1);
        let local = local_elements(&value.shape, &inputs[k].factors) * elem(v);
        // A parameter or input read by several ops (a tied embedding table) is held once: its
        // memory is counted at its first use only.
        let first_use = graph
            .consumers(v)
            .first()
            .is_none_or(|u| u.input == k && graph.nodes()[u.node.0].name == node.name);
        let group = match &value.kind {
            ValueKind::Parameter { trainable, .. } => {
                if first_use {
                    memory.parameters += local;
                }
                if !*trainable {
                    continue;
                }
                if !first_use {
                    // The contributions of every use await the same sum when the uses split the
                    // parameter alike: they are added, then summed once (`parallel::assign`),
                    // costed here at the first use as its memory is.
                    continue;
                }
                memory.gradients += local;
                memory.optimizer += local * settings.optimizer_states as f64;
                // FIXME: the lowering sums a gradient only over the ranks that computed distinct
                // parts of it (`devices_used / split`); ranks that repeat an op's work hold the
                // same gradient. Costing that moves the searches' choices (auto-pipeline, the
                // recursive search's 10 % bound, `shard`'s out_strategy) and is left for a
                // change of its own; the cost here is MindSpore's mirror all-reduce.
                devices / split
            }
            ValueKind::Input => {
                // Fed data is held for the whole step.
                if first_use && settings.held.is_some() {
                    memory.activations += local;
                }
                continue;
            }
            ValueKind::Intermediate if !value.dtype.is_float() => continue,
            ValueKind::Intermediate => {
                if settings.held.is_some_and(|h| h.gradient_written_at_peak(v)) {
                    memory.activations += local;
                }
                if settings.held.is_some_and(|h| !h.has_gradient(v)) {
                    // No gradient flows into this input (it is computed from the data alone):
                    // the backward leaves it out, and with it its pending sum.
                    continue;
                }
                devices_used / split
            }
        };
        if group > 1 {
            comm += profile.all_reduce(local, group);
            comm_bytes += 2.0 * local * (group - 1) as f64 / group as f64;
            if matches!(value.kind, ValueKind::Parameter { .. }) {
                // The backward writes the gradient whole before its sum: a buffer of its own.
                memory.activations += local;
            }
        }
    }
    if let Some((time, bytes)) = ring_cost(profile, &ctx, &inputs, || elem(node.inputs[1])) {
        comm += time;
        comm_bytes += bytes;
    }
    for (k, &v) in node.outputs.iter().enumerate() {
        if settings.held.is_none_or(|h| h.is_held(v)) {
            memory.activations +=
                local_elements(ctx.output_shapes[k], &outputs[k].factors) * elem(v);
        }
    }
    Ok(Evaluated {
        strategy: strategy.to_vec(),
        inputs,
        outputs,
        compute,
        comm,
        comm_bytes,
        memory,
        devices_used,
    })
}

/// Seconds and bytes per device of ring attention's passes, forward and backward, when `ctx`
/// is a `FlashAttention` whose keys (`inputs[1]`, `key_elem_bytes()` bytes an element) have their sequence
/// dim split: the blocks `exec::ring` passes from member to member ([`RingBlock::traffic`]),
/// each pass one message to the next member, and the zigzag placement's moves. Counted whole:
/// the passes overlap the attention's computation when the compute takes longer, which this
/// cost does not credit.
fn ring_cost(
    profile: &DeviceProfile,
    ctx: &OpContext<'_>,
    inputs: &[Split],
    key_elem_bytes: impl FnOnce() -> f64,
) -> Option<(f64, f64)> {
    let Op::FlashAttention { causal, .. } = ctx.op else {
        return None;
    };
    let (shape, factors) = (ctx.input_shapes.get(1)?, &inputs.get(1)?.factors);
    let block = RingBlock::of(shape, factors, key_elem_bytes() as usize)?;
    let members = block.members;
    let link = profile.link(members);
    let (mut time, mut bytes) = (0.0, 0.0);
    for forward in [true, false] {
        let t = block.traffic(1, *causal, forward, false);
        let moved = t.bytes_per_rank as f64 + t.zigzag_bytes_per_ring as f64 / members as f64;
        let messages = t.passes as f64
            + if t.zigzag_bytes_per_ring > 0 {
                2.0
            } else {
                0.0
            };
        time += messages * link.alpha + moved / link.bandwidth;
        bytes += moved;
    }
    Some((time, bytes))
}

/// Seconds and bytes per device to bring a tensor of `shape` (`elem` bytes an element) from
/// `from` to `to`, forward, plus its gradient back from `to` to `from` (without pending sums).
pub fn redistribution(
    profile: &DeviceProfile,
    shape: &[usize],
    elem: f64,
    from: &Split,
    to: &[usize],
    with_gradient: bool,
) -> (f64, f64) {
    let (mut time, mut bytes) = move_cost(profile, shape, elem, from, to);
    if with_gradient {
        let back = Split {
            factors: to.to_vec(),
            partial: 1,
        };
        let (t, b) = move_cost(profile, shape, elem, &back, &from.factors);
        time += t;
        bytes += b;
    }
    (time, bytes)
}

/// One direction of [`redistribution`].
fn move_cost(
    profile: &DeviceProfile,
    shape: &[usize],
    elem: f64,
    from: &Split,
    to: &[usize],
) -> (f64, f64) {
    let full: f64 = shape.iter().map(|&d| d as f64).product::<f64>() * elem;
    let mut time = 0.0;
    let mut bytes = 0.0;
    let mut src: Vec<usize> = from.factors.clone();
    src.resize(shape.len(), 1);
    let dst: Vec<usize> = (0..shape.len())
        .map(|d| to.get(d).copied().unwrap_or(1).max(1))
        .collect();
    if from.partial > 1 {
        let p = from.partial;
        let local = full / src.iter().product::<usize>().max(1) as f64;
        let scatter = (0..shape.len()).find(|&d| {
            dst[d] >= src[d] * p
                && dst[d].is_multiple_of(src[d] * p)
                && shape[d].is_multiple_of(src[d] * p)
        });
        let fraction = (p - 1) as f64 / p as f64;
        match scatter {
            Some(d) => {
                time += profile.all_gather(local, p);
                bytes += local * fraction;
                src[d] *= p;
            }
            None => {
                time += profile.all_reduce(local, p);
                bytes += 2.0 * local * fraction;
            }
        }
    }
    let dst_local = full / dst.iter().product::<usize>().max(1) as f64;
    let held: f64 = src
        .iter()
        .zip(&dst)
        .map(|(&s, &t)| t as f64 / s.max(t) as f64)
        .product();
    let missing = dst_local * (1.0 - held);
    if missing > 0.5 {
        let pieces: usize = src.iter().zip(&dst).map(|(&s, &t)| s.max(t) / t).product();
        let gather_only = src.iter().zip(&dst).all(|(&s, &t)| s >= t);
        time += if gather_only {
            profile.all_gather(dst_local, pieces)
        } else {
            profile.all_to_all(missing, pieces)
        };
        bytes += missing;
    }
    (time, bytes)
}

#[cfg(test)]
mod tests {
    use graph::GraphBuilder;
    use tensor::DType;

    use super::*;

    /// A causal fused attention over q, k, v `[2, 4, 64, 8]` (batch, heads, sequence, head dim).
    fn attention() -> graph::Graph {
        let mut b = GraphBuilder::new();
        let shape = [2, 4, 64, 8];
        let q = b.input("q", &shape, DType::F32).unwrap();
        let k = b.input("k", &shape, DType::F32).unwrap();
        let v = b.input("v", &shape, DType::F32).unwrap();
        b.flash_attention("flash", (q, k, v), true, 0.35).unwrap();
        b.finish()
    }

    /// A parameter read by two products (a tied table) is held once: its parameter, gradient
    /// and optimizer bytes are counted at its first use and not at the second.
    #[test]
    fn a_parameter_read_twice_is_counted_once() {
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[8, 16], DType::F32).unwrap();
        let w = b
            .parameter("w", &[16, 16], graph::Initializer::Zeros)
            .unwrap();
        let h = b.matmul("first", x, w).unwrap();
        b.matmul("second", h, w).unwrap();
        let graph = b.finish();
        let profile = crate::profiles::built_in("h100-nvlink-ib").unwrap();
        let settings = EvalSettings {
            profile: &profile,
            devices: 1,
            optimizer_states: 2,
            held: None,
        };
        let memory = |i: usize| {
            let node = &graph.nodes()[i];
            evaluate(&graph, node, &[vec![1, 1], vec![1, 1]], &settings)
                .unwrap()
                .memory
        };
        let bytes = 16.0 * 16.0 * 4.0;
        let (first, second) = (memory(0), memory(1));
        assert_eq!((first.parameters, first.gradients), (bytes, bytes));
        assert_eq!(first.optimizer, 2.0 * bytes);
        assert_eq!(
            (second.parameters, second.gradients, second.optimizer),
            (0.0, 0.0, 0.0)
        );
    }

    #[test]
    fn a_split_sequence_costs_the_ring_s_passes_and_a_split_head_nothing() {
        let graph = attention();
        let node = &graph.nodes()[0];
        let profile = crate::profiles::built_in("h100-nvlink-ib").unwrap();
        let settings = EvalSettings {
            profile: &profile,
            devices: 4,
            optimizer_states: 2,
            held: None,
        };
        let cost = |s: [usize; 4]| evaluate(&graph, node, &vec![s.to_vec(); 3], &settings).unwrap();
        // Heads over 4 ranks: every rank attends its heads whole; nothing moves.
        assert_eq!(cost([1, 4, 1, 1]).comm_bytes, 0.0);
        // The sequence over a ring of 4: a key block is 2·4·16·8 f32 = 4096 B. Forward: keys
        // and values passed 3 times (24 KiB); backward: 3 times, and their gradients 4 times
        // (56 KiB); the zigzag placement moves 6 of the 8 half-block chunks (all but chunks 0
        // and 5, which their owners hold), each of 8 slices × 8 rows: forward q, k, v, out
        // (8 wide) and lse (1 wide), backward q, k, v, dout, dq, dk, dv and lse, delta — per
        // ring, shared by its 4 ranks.
        let block = 4096.0;
        let passes = 2.0 * block * 3.0 + 2.0 * block * 7.0;
        let chunk_rows = 8.0 * 8.0;
        let zigzag = 6.0 * chunk_rows * ((4.0 * 8.0 + 1.0) + (7.0 * 8.0 + 2.0)) * 4.0 / 4.0;
        let ring = cost([1, 1, 4, 1]);
        assert_eq!(ring.comm_bytes, passes + zigzag);
        assert!(ring.comm > 0.0);
        // The same compute either way.
        assert_eq!(ring.compute, cost([1, 4, 1, 1]).compute);
    }
}
