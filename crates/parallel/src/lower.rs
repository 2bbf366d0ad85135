//! Lowering a placed graph to the program every rank runs.
//!
//! All ranks of a stage run the same sequence of steps on local (per-rank) shapes — SPMD. A
//! kernel step evaluates one node on this rank's blocks; a reshard step moves a value between
//! layouts with a [`reshard::ReshardPlan`], which also resolves pending sums: a matmul's split
//! reduction dim becomes an all-reduce (or a reduce-scatter) where its output is consumed, and a
//! parameter's gradient, pending a sum over the ranks that share the parameter, becomes the
//! gradient all-reduce of data parallelism where it is brought to the parameter's layout.
//! Which rank does what inside a reshard is in the plan; [`Program::for_rank`] shows it.

use std::collections::HashMap;
use std::sync::Arc;

use graph::{Graph, Initializer, NodeId, NodeRole, Op, ValueId, ValueKind};
use layout::TensorLayout;
use reshard::{DistLayout, ReshardPlan};
use tensor::DType;

use crate::assign::PlacedGraph;
use crate::config::ParallelMode;
use crate::error::ParallelError;
use crate::hsdp::{OptimizerShard, ShardDecision};
use crate::recompute::BackwardCopies;

/// A buffer of the program: one value in one layout, on every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferSpec {
    /// The value's name, plus the layout when it is a resharded copy.
    pub name: String,
    /// The value.
    pub value: ValueId,
    /// The local (per-rank) shape; with a manual row split, the largest rank's (see
    /// [`BufferSpec::local_shape`]).
    pub shape: Vec<usize>,
    /// The element type.
    pub dtype: DType,
    /// The layout of the value in this buffer (pending sums included).
    pub layout: DistLayout,
}

impl BufferSpec {
    /// The shape `rank` holds: [`BufferSpec::shape`], except where a manual row split gives
    /// ranks different rows.
    pub fn local_shape(&self, rank: usize) -> Vec<usize> {
        let layout = self.layout.layout();
        match layout.mesh().slot_of_rank(rank) {
            Some(slot) if !layout.is_uniform() => layout.slot_shape(slot),
            _ => self.shape.clone(),
        }
    }
}

/// One node evaluated on this rank's blocks.
#[derive(Debug, Clone)]
pub struct KernelStep {
    /// The node.
    pub node: NodeId,
    /// Its name.
    pub name: String,
    /// The op with local shapes in its attributes.
    pub op: Op,
    /// Input buffers.
    pub inputs: Vec<usize>,
    /// Output buffers.
    pub outputs: Vec<usize>,
    /// A forward op run again in the backward pass (`[parallel.recompute]`), into its own
    /// buffers, just before its outputs' first backward use.
    pub recompute: bool,
}

/// A value moved from one layout to another.
#[derive(Debug, Clone)]
pub struct ReshardStep {
    /// The value.
    pub value: ValueId,
    /// Why the move is needed.
    pub reason: String,
    /// The plan.
    pub plan: Arc<ReshardPlan>,
    /// Source buffer.
    pub from: usize,
    /// Destination buffer.
    pub to: usize,
}

/// A step of the program.
#[derive(Debug, Clone)]
pub enum Step {
    /// Evaluate a node.
    Kernel(KernelStep),
    /// Move a value.
    Reshard(ReshardStep),
}

/// A graph input every rank feeds its block of.
#[derive(Debug, Clone)]
pub struct ProgramInput {
    /// The value.
    pub value: ValueId,
    /// Its name.
    pub name: String,
    /// Its layout (which rows of the batch each rank reads).
    pub layout: TensorLayout,
    /// Its buffer.
    pub buffer: usize,
}

/// A parameter: its shard on every rank, and where its gradient lands.
#[derive(Debug, Clone)]
pub struct ProgramParam {
    /// The value.
    pub value: ValueId,
    /// Its name.
    pub name: String,
    /// Its layout.
    pub layout: TensorLayout,
    /// How its initial values are computed.
    pub init: Initializer,
    /// Whether the optimizer updates it.
    pub trainable: bool,
    /// Its buffer.
    pub buffer: usize,
    /// The buffer holding its gradient after a step (trainable parameters of a training
    /// program): in the parameter's strategy layout, or in its `hsdp` shard layout where
    /// [`OptimizerShard::gradient_sharded`].
    pub grad_buffer: Option<usize>,
    /// What optimizer parallelism decided for it (`None` when `hsdp` is off, on one device,
    /// or for a parameter that is not trainable).
    pub hsdp: Option<ShardDecision>,
}

impl ProgramParam {
    /// Its optimizer shard, when `hsdp` shards it: the optimizer keeps state for, and
    /// updates, only this rank's box of [`OptimizerShard::layout`].
    pub fn optimizer_shard(&self) -> Option<&OptimizerShard> {
        self.hsdp.as_ref().and_then(ShardDecision::shard)
    }

    /// The layout its consumers need: its strategy layout, which under `hsdp` levels 1–3 is
    /// more than its buffer holds ([`OptimizerShard::strategy_layout`]).
    pub fn strategy_layout(&self) -> &TensorLayout {
        self.optimizer_shard()
            .map_or(&self.layout, |shard| &shard.strategy_layout)
    }
}

/// After the optimizer has updated this rank's piece of a parameter in place (in the
/// parameter's buffer, `hsdp` levels `zero1` and `zero2`), the pieces are all-gathered into the whole
/// weights: `plan` moves the parameter from its shard layout to its layout. The runtime takes
/// the source from the rows of the parameter's own buffer.
#[derive(Debug, Clone)]
pub struct WeightGather {
    /// The parameter (an index into [`Program::params`]).
    pub param: usize,
    /// From the shard layout to the parameter's layout.
    pub plan: Arc<ReshardPlan>,
}

/// A value the program makes available after a step, in a chosen layout.
#[derive(Debug, Clone)]
pub struct ProgramOutput {
    /// The value.
    pub value: ValueId,
    /// Its name.
    pub name: String,
    /// The buffer.
    pub buffer: usize,
    /// The layout.
    pub layout: TensorLayout,
}

/// The program every rank runs: buffers, steps, and where inputs, parameters and outputs live.
#[derive(Debug, Clone)]
pub struct Program {
    /// The placed graph it comes from.
    pub placed: PlacedGraph,
    /// Every buffer.
    pub buffers: Vec<BufferSpec>,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Graph inputs.
    pub inputs: Vec<ProgramInput>,
    /// Parameters.
    pub params: Vec<ProgramParam>,
    /// Requested outputs.
    pub outputs: Vec<ProgramOutput>,
    /// Factor applied to every gradient after the step (`gradients_mean = false`,
    /// `loss_repeated_mean = false`; 1 otherwise).
    pub grad_scale: f64,
    /// The gathers of updated weight pieces the runtime runs after the optimizer update
    /// (`hsdp` levels `zero1` and `zero2`), in parameter order.
    pub weight_gathers: Vec<WeightGather>,
    /// The gradient reductions run fused, bucket by bucket (`[parallel.comm_fusion]`); their
    /// steps are not run one by one.
    pub buckets: Vec<crate::fusion::CommBucket>,
    /// The weight gathers run fused, bucket by bucket (`[parallel.comm_fusion] allgather`);
    /// the others run one by one.
    pub gather_buckets: Vec<crate::fusion::GatherBucket>,
    /// Communications in the program, and how many distinct plans they use
    /// (`parallel.comm_reuse`).
    pub plan_reuse: PlanReuse,
    /// Parameters shared by several pipeline stages, each with its per-stage copies
    /// ([`crate::pipeline::split_shared_parameters`]); empty without them.
    pub shared: Vec<crate::pipeline::SharedParameter>,
}

/// How many reshard plans a program's communications share (MindSpore's communication
/// subgraph reuse).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanReuse {
    /// Communications (reshard steps and weight gathers).
    pub total: usize,
    /// Distinct plans among them.
    pub distinct: usize,
}

/// What to lower: the graph's gradient outputs and the values wanted after a step.
#[derive(Debug, Clone, Default)]
pub struct LowerRequest {
    /// Trainable parameters and their gradient values (empty for a forward-only program).
    pub grads: Vec<(ValueId, ValueId)>,
    /// Values wanted after a step, each gathered to every rank (replicated).
    pub replicated_outputs: Vec<ValueId>,
}

/// The state of lowering one placed graph: the buffers and steps so far.
pub(crate) struct Lowering<'a> {
    pub(crate) placed: &'a PlacedGraph,
    pub(crate) buffers: Vec<BufferSpec>,
    pub(crate) steps: Vec<Step>,
    /// Available copies of each value: layout and buffer; the first is where it was produced.
    pub(crate) versions: HashMap<ValueId, Vec<usize>>,
    /// The backward pass's own copies (see [`crate::recompute`]).
    pub(crate) backward: BackwardCopies,
    /// Plans already made, by source, destination and dtype: the blocks of a deep model move
    /// alike, so each distinct move is planned once (planning is linear in the ranks).
    plans: HashMap<(DistLayout, TensorLayout, DType), Arc<ReshardPlan>>,
}

impl Lowering<'_> {
    pub(crate) fn graph(&self) -> &Graph {
        &self.placed.graph
    }

    /// A new buffer for `value` in `layout` that no consumer finds by its layout (a backward
    /// copy).
    pub(crate) fn add_buffer(&mut self, value: ValueId, layout: DistLayout, suffix: &str) -> usize {
        let v = &self.graph().values()[value.0];
        let name = if suffix.is_empty() {
            v.name.clone()
        } else {
            format!("{}@{}", v.name, suffix)
        };
        self.buffers.push(BufferSpec {
            name,
            value,
            shape: layout.layout().slice_shape().to_vec(),
            dtype: v.dtype,
            layout,
        });
        self.buffers.len() - 1
    }

    fn new_buffer(&mut self, value: ValueId, layout: DistLayout, suffix: &str) -> usize {
        let id = self.add_buffer(value, layout, suffix);
        self.versions.entry(value).or_default().push(id);
        id
    }

    /// A buffer holding `value` in `need` (no pending sums), resharding if no copy has it yet.
    pub(crate) fn need(
        &mut self,
        value: ValueId,
        need: &TensorLayout,
        reason: impl FnOnce() -> String,
    ) -> Result<usize, ParallelError> {
        let versions = self.versions.get(&value).cloned().unwrap_or_default();
        for &b in &versions {
            let l = &self.buffers[b].layout;
            if !l.is_partial() && l.layout().same_placement(need) {
                return Ok(b);
            }
        }
        let from = *versions
            .first()
            .expect("a value is produced before it is used");
        let to = self.push_reshard(value, from, need, None, reason())?;
        self.versions.entry(value).or_default().push(to);
        Ok(to)
    }

    /// The buffer `value` was produced in, pending sums included (for a node that reads its
    /// inputs as produced: [`crate::NodePlacement::pending_inputs`]).
    fn as_produced(&self, value: ValueId) -> usize {
        *self
            .versions
            .get(&value)
            .and_then(|v| v.first())
            .expect("a value is produced before it is used")
    }

    /// Appends a reshard of `value` from buffer `from` into a new buffer laid out as `need`
    /// (named with `suffix` after the layout), and returns that buffer; consumers find it by
    /// its layout only once the caller registers it.
    pub(crate) fn push_reshard(
        &mut self,
        value: ValueId,
        from: usize,
        need: &TensorLayout,
        suffix: Option<&str>,
        reason: String,
    ) -> Result<usize, ParallelError> {
        let src = self.buffers[from].layout.clone();
        let dtype = self.buffers[from].dtype;
        let key = (src, need.clone(), dtype);
        let plan = match self.plans.get(&key) {
            Some(plan) => plan.clone(),
            None => {
                let plan = reshard::plan_from(&key.0, need, dtype).map_err(|source| {
                    ParallelError::Reshard {
                        context: format!("moving {}", self.graph().values()[value.0].name),
                        source: Box::new(source),
                    }
                })?;
                let plan = Arc::new(plan);
                self.plans.insert(key, plan.clone());
                plan
            }
        };
        let mut name = need.layout().describe_map();
        if let Some(suffix) = suffix {
            name = format!("{name}@{suffix}");
        }
        let to = self.add_buffer(value, need.clone().into(), &name);
        self.steps.push(Step::Reshard(ReshardStep {
            value,
            reason,
            plan,
            from,
            to,
        }));
        Ok(to)
    }
}

/// The op with its shape attributes rewritten to the local output shape.
pub(crate) fn local_op(op: &Op, local_out: &[usize]) -> Op {
    let mut op = op.clone();
    match &mut op {
        Op::Flatten { shape }
        | Op::Reshape { shape }
        | Op::BroadcastTo { shape }
        | Op::SumToShape { shape }
        | Op::Fill { shape, .. }
        | Op::Triu { shape, .. } => *shape = local_out.to_vec(),
        // Only dims taken whole are split: there `end` is the (local) size.
        Op::StridedSlice {
            begin,
            end,
            strides,
        } => {
            for d in 0..end.len() {
                if begin[d] == 0 && strides[d] == 1 {
                    end[d] = local_out[d];
                }
            }
        }
        Op::StridedSliceGrad {
            input_shape,
            begin,
            end,
            strides,
        } => {
            for d in 0..end.len() {
                if begin[d] == 0 && strides[d] == 1 && end[d] == input_shape[d] {
                    end[d] = local_out[d];
                }
            }
            *input_shape = local_out.to_vec();
        }
        _ => {}
    }
    op
}

/// Lowers `placed` to a program computing `request`.
pub fn lower(placed: &PlacedGraph, request: &LowerRequest) -> Result<Program, ParallelError> {
    let graph = &placed.graph;
    let mut lw = Lowering {
        placed,
        buffers: Vec::new(),
        steps: Vec::new(),
        versions: HashMap::new(),
        backward: BackwardCopies::new(placed)?,
        plans: HashMap::new(),
    };
    let mut inputs = Vec::new();
    for v in graph.inputs() {
        let layout = placed.leaves[v.0].clone().expect("inputs are laid out");
        let buffer = lw.new_buffer(v, layout.clone().into(), "");
        inputs.push(ProgramInput {
            value: v,
            name: graph.values()[v.0].name.clone(),
            layout,
            buffer,
        });
    }
    let mut params = Vec::new();
    for p in graph.parameters() {
        let value = &graph.values()[p.0];
        let layout = placed.leaves[p.0].clone().expect("parameters are laid out");
        let buffer = lw.new_buffer(p, layout.clone().into(), "");
        let (init, trainable) = match &value.kind {
            ValueKind::Parameter { init, trainable } => (init.clone(), *trainable),
            _ => unreachable!("parameters() returns parameters"),
        };
        params.push(ProgramParam {
            value: p,
            name: value.name.clone(),
            layout,
            init,
            trainable,
            buffer,
            grad_buffer: None,
            hsdp: placed.optimizer_shards[p.0].clone(),
        });
    }
    let mut targets: Vec<ValueId> = request.grads.iter().map(|&(_, g)| g).collect();
    targets.extend(&request.replicated_outputs);
    for node_id in graph.nodes_needed_for(&targets) {
        let node = &graph.nodes()[node_id.0];
        let place = &placed.nodes[node_id.0];
        let backward = node.role != NodeRole::Forward;
        let mut in_bufs = Vec::with_capacity(node.inputs.len());
        for (i, (&v, need)) in node.inputs.iter().zip(&place.inputs).enumerate() {
            let reason = || {
                format!(
                    "{} needs input {i} ({}) as {}",
                    node.name,
                    graph.values()[v.0].name,
                    need.layout().describe_map()
                )
            };
            let b = if place.pending_inputs {
                lw.as_produced(v)
            } else if backward && lw.backward.rematerialised(v) {
                lw.need_backward(v, need, false, reason)?
            } else {
                lw.need(v, need, reason)?
            };
            in_bufs.push(b);
        }
        let mut out_bufs = Vec::with_capacity(node.outputs.len());
        for (&v, layout) in node.outputs.iter().zip(&place.outputs) {
            out_bufs.push(lw.new_buffer(v, layout.clone(), ""));
        }
        let local_out = lw.buffers[out_bufs[0]].shape.clone();
        lw.steps.push(Step::Kernel(KernelStep {
            node: node_id,
            name: node.name.clone(),
            op: local_op(&node.op, &local_out),
            inputs: in_bufs,
            outputs: out_bufs.clone(),
            recompute: false,
        }));
        if let Some(out_layouts) = &place.out_layouts {
            for (j, (&v, layout)) in node.outputs.iter().zip(out_layouts).enumerate() {
                let b = lw.need(v, layout, || {
                    format!(
                        "{}'s out_strategy lays output {j} out as {}",
                        node.name,
                        layout.layout().describe_map()
                    )
                })?;
                // The out_strategy copy is what consumers see first.
                let versions = lw.versions.get_mut(&v).expect("just produced");
                versions.retain(|&x| x != b);
                versions.insert(0, b);
            }
        }
    }
    for &(p, g) in &request.grads {
        let slot = params
            .iter_mut()
            .find(|x| x.value == p)
            .expect("gradients are requested for parameters");
        let name = slot.name.clone();
        let b = match slot.optimizer_shard() {
            Some(shard) if shard.gradient_sharded => {
                let layout = shard.layout.clone();
                lw.need(g, &layout, || {
                    format!(
                        "hsdp {}: the gradient of {name} goes to its optimizer shard {} (summing the contributions of the ranks that share it)",
                        shard.level.name(),
                        layout.layout().describe_map()
                    )
                })?
            }
            shard => {
                // The strategy layout: a parameter's own, or the one hsdp shards it from.
                let layout = shard.map_or(&slot.layout, |s| &s.strategy_layout).clone();
                lw.need(g, &layout, || {
                    format!("the gradient of {name} must be laid out like {name} (summing the contributions of the ranks that share it)")
                })?
            }
        };
        slot.grad_buffer = Some(b);
    }
    let mut weight_gathers = Vec::new();
    for (i, p) in params.iter().enumerate() {
        let Some(shard) = p.optimizer_shard() else {
            continue;
        };
        if shard.level.shards_weights() || p.grad_buffer.is_none() {
            continue;
        }
        let dtype = lw.buffers[p.buffer].dtype;
        let plan = reshard::plan(&shard.layout, &p.layout, dtype).map_err(|source| {
            ParallelError::Reshard {
                context: format!("gathering the updated pieces of {}", p.name),
                source: Box::new(source),
            }
        })?;
        weight_gathers.push(WeightGather {
            param: i,
            plan: Arc::new(plan),
        });
    }
    let mut outputs = Vec::new();
    for &v in &request.replicated_outputs {
        let value = &graph.values()[v.0];
        let layout = TensorLayout::replicated(placed.stage.clone(), &value.shape);
        let name = value.name.clone();
        let buffer = lw.need(v, &layout, || {
            format!("{name} is reported whole on every rank")
        })?;
        outputs.push(ProgramOutput {
            value: v,
            name,
            buffer,
            layout,
        });
    }
    let grad_scale = grad_scale(placed, request);
    let mut program = Program {
        placed: placed.clone(),
        buffers: lw.buffers,
        steps: lw.steps,
        inputs,
        params,
        outputs,
        grad_scale,
        weight_gathers,
        buckets: Vec::new(),
        gather_buckets: Vec::new(),
        plan_reuse: PlanReuse::default(),
        shared: Vec::new(),
    };
    program.shared =
        crate::pipeline::shared_parameters(program.params.iter().map(|p| p.name.as_str()), |i| {
            crate::pipeline::stage_of_ranks(program.params[i].layout.mesh())
        });
    share_plans(&mut program, placed.config.comm_reuse);
    if let Some(fusion) = &placed.config.comm_fusion {
        program.buckets = crate::fusion::gradient_buckets(&program, fusion);
        program.gather_buckets = crate::fusion::gather_buckets(&program, fusion);
    }
    Ok(program)
}

/// Gives identical communications (the same plan: kind, groups, shapes) one shared plan, at
/// most `cap` of them (`None`: all), and counts the distinct plans.
fn share_plans(program: &mut Program, cap: Option<usize>) {
    type Key = (DistLayout, TensorLayout, DType);
    let mut seen: HashMap<Key, Arc<ReshardPlan>> = HashMap::new();
    let mut shared = 0;
    let mut total = 0;
    let plans = program
        .steps
        .iter_mut()
        .filter_map(|s| match s {
            Step::Reshard(r) => Some(&mut r.plan),
            Step::Kernel(_) => None,
        })
        .chain(program.weight_gathers.iter_mut().map(|g| &mut g.plan));
    for plan in plans {
        total += 1;
        let key = (plan.src().clone(), plan.dst().clone(), plan.dtype());
        match seen.get(&key) {
            Some(same) if cap.is_none_or(|c| shared < c) => {
                *plan = same.clone();
                shared += 1;
            }
            // Beyond the cap a repeat gets a plan of its own (the lowering shares them all).
            Some(_) => *plan = Arc::new((**plan).clone()),
            None => {
                seen.insert(key, plan.clone());
            }
        }
    }
    program.plan_reuse = PlanReuse {
        total,
        distinct: total - shared,
    };
}

/// MindSpore's gradient scaling when `gradients_mean` or `loss_repeated_mean` is off: Tessera's
/// gradients are those of the global mean loss; MindSpore without `gradients_mean` sums the
/// replicas' mean-loss gradients (one per batch shard), and without `loss_repeated_mean` skips
/// dividing by the devices the loss is repeated on (its stage's devices over its batch
/// shards: with pipeline stages, only the last stage computes the loss). Both follow from the loss the gradients
/// are seeded from, whatever op computes it ([`loss_batch_shards`]).
fn grad_scale(placed: &PlacedGraph, request: &LowerRequest) -> f64 {
    if request.grads.is_empty() || placed.config.mode == ParallelMode::StandAlone {
        return 1.0;
    }
    let Some(shards) = loss_batch_shards(placed) else {
        return 1.0;
    };
    let shards = shards as f64;
    // The loss lives on one stage: it is repeated over that stage's devices, not the job's.
    let stages = placed
        .config
        .pipeline
        .as_ref()
        .map_or(1, |p| p.stages.max(1));
    let repeated = ((placed.stage.n_devices() / stages) as f64) / shards;
    let mut scale = 1.0;
    if !placed.config.gradients_mean {
        scale *= shards;
    }
    if !placed.config.loss_repeated_mean {
        scale *= repeated;
    }
    scale
}

/// The number of parts the loss's rows are split into (its batch shards): the pending sum
/// nearest the loss — the loss itself, or, searching its inputs breadth-first through the
/// forward pass, the first value computed as a sum pending over ranks (the rows' sum of a
/// `SparseSoftmaxCrossEntropy`, the `ReduceSum` over rows of a loss built from primitive ops),
/// or the first reduction over the rows that reads them whole and whose result is divided (a
/// mean such as `MSELoss`'s, a `ReduceSum` to a scalar then a `Div`, or a `Mul` by the
/// reciprocal of a count of the rows: its default strategy gathers the rows first), whose rows'
/// split as they were produced counts. (MindSpore's ranks each divide by their own row count,
/// so their mean gradients add up to the shard count times the global mean's; a sum's add up
/// to the global sum's, scale 1.) 1 when nothing on the way is split; `None` when the graph
/// seeds no loss.
fn loss_batch_shards(placed: &PlacedGraph) -> Option<usize> {
    let graph = &placed.graph;
    let loss = graph.nodes().iter().find_map(|n| match (&n.role, &n.op) {
        (NodeRole::Seed { value }, Op::Fill { value: one, .. }) if *one == 1.0 => Some(*value),
        _ => None,
    })?;
    // Each value with the forward node that reads it on the way from the loss.
    let mut queue = std::collections::VecDeque::from([(loss, None)]);
    let mut seen = std::collections::HashSet::from([loss]);
    while let Some((value, reader)) = queue.pop_front() {
        let Some((node, j)) = graph.values()[value.0].producer else {
            continue;
        };
        if graph.nodes()[node.0].role != NodeRole::Forward {
            continue;
        }
        let count = placed.nodes[node.0].outputs[j].partial_count();
        if count > 1 {
            return Some(count);
        }
        let divided = reader.is_some_and(|r: NodeId| {
            let r = &graph.nodes()[r.0];
            match r.op {
                Op::Div => r.inputs.first() == Some(&value) && divides_by_rows(graph, r, node),
                Op::Mul => multiplies_by_inverse_rows(graph, r, value, node),
                _ => false,
            }
        });
        let rows = if divided {
            gathered_rows_split(placed, node)
        } else {
            1
        };
        if rows > 1 {
            return Some(rows);
        }
        for &input in &graph.nodes()[node.0].inputs {
            if seen.insert(input) {
                queue.push_back((input, Some(node)));
            }
        }
    }
    Some(1)
}

/// Whether `div` (the reader of `reduction`'s output) divides by a count of the rows: a
/// divisor computed in the graph, or a constant whose magnitude is a whole multiple of the
/// reduction input's dim 0 (a mean's element count, a division by the batch size, or by minus
/// it), which each MindSpore rank takes from its own rows. A division by another constant
/// (`Σ (y − t)² / 3`) scales a sum: MindSpore's ranks divide by the same constant, and their
/// gradients add up to the global loss's (scale 1; it was taken for a mean and doubled on 2
/// ranks).
fn divides_by_rows(graph: &graph::Graph, div: &graph::Node, reduction: NodeId) -> bool {
    let Some(divisor) = div.inputs.get(1) else {
        return false;
    };
    let Some((producer, _)) = graph.values()[divisor.0].producer else {
        return true;
    };
    let Op::Fill { value, .. } = &graph.nodes()[producer.0].op else {
        return true;
    };
    // A negative count (`Σ log p / -n`, a negative log-likelihood's mean) counts as well.
    let ratio = value.abs() / reduced_rows(graph, reduction);
    ratio >= 1.0 && ratio.fract() == 0.0
}

/// Whether `mul` (the reader of `reduction`'s output `value`) multiplies it by the reciprocal
/// of a count of the rows: the other factor a constant `c` with `|1 / c|` a whole multiple of
/// the reduction input's dim 0 (`Σ · (1 / x.shape[0])`, `Σ · (-1 / count)`), the mean
/// [`divides_by_rows`] finds for a division, which each MindSpore rank takes from its own rows.
/// (It was taken for a sum, so `gradients_mean = False` on 2 ranks got half MindSpore's
/// gradient.) Another constant (`0.5 · Σ`) scales a sum, and a computed factor is no count.
fn multiplies_by_inverse_rows(
    graph: &graph::Graph,
    mul: &graph::Node,
    value: ValueId,
    reduction: NodeId,
) -> bool {
    let [a, b] = mul.inputs[..] else {
        return false;
    };
    let factor = match (a == value, b == value) {
        (true, false) => b,
        (false, true) => a,
        _ => return false,
    };
    let Some((producer, _)) = graph.values()[factor.0].producer else {
        return false;
    };
    let Op::Fill { value: c, .. } = &graph.nodes()[producer.0].op else {
        return false;
    };
    if !(*c != 0.0 && c.is_finite()) {
        return false;
    }
    // 1 / c is rounded (1/6 is not exact, in f32 still less): a whole multiple within rounding;
    // negative for a negative log-likelihood's mean (`Σ log p · (-1 / n)`).
    let ratio = 1.0 / (c.abs() * reduced_rows(graph, reduction));
    let whole = ratio.round();
    whole >= 1.0 && (ratio - whole).abs() <= 1e-6 * whole
}

/// The dim 0 (rows) of `reduction`'s input, 1 when it has none.
fn reduced_rows(graph: &graph::Graph, reduction: NodeId) -> f64 {
    graph.nodes()[reduction.0]
        .inputs
        .first()
        .and_then(|input| graph.values()[input.0].shape.first().copied())
        .unwrap_or(1) as f64
}

/// For a reduction over dim 0 (the rows), the split of its input's dim 0 as the input was
/// produced (the reduction may read it gathered); 1 for another node or an unsplit input.
fn gathered_rows_split(placed: &PlacedGraph, node: NodeId) -> usize {
    let graph = &placed.graph;
    let n = &graph.nodes()[node.0];
    let over_rows = match &n.op {
        Op::ReduceSum { axes, .. } | Op::ReduceMax { axes, .. } => {
            axes.is_empty() || axes.contains(&0)
        }
        _ => false,
    };
    let Some(&input) = n.inputs.first().filter(|_| over_rows) else {
        return 1;
    };
    let Some((producer, j)) = graph.values()[input.0].producer else {
        return 1;
    };
    placed.nodes[producer.0].outputs[j]
        .layout()
        .split_factors()
        .first()
        .copied()
        .unwrap_or(1)
}

impl Program {
    /// Number of devices.
    pub fn devices(&self) -> usize {
        self.placed.stage.n_devices()
    }

    /// Bytes every step moves over the network, summed over reshards and ring attention's
    /// passes ([`crate::ring`]).
    pub fn bytes_per_step(&self) -> usize {
        let steps: usize = self
            .steps
            .iter()
            .map(|s| match s {
                Step::Reshard(r) => r.plan.bytes_total(),
                Step::Kernel(k) => {
                    crate::ring::ring_traffic(self, k).map_or(0, |t| t.bytes_total())
                }
            })
            .sum();
        steps
            + self
                .weight_gathers
                .iter()
                .map(|g| g.plan.bytes_total())
                .sum::<usize>()
    }
}
