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
use std::fmt::Write as _;
use std::sync::Arc;

use graph::{Graph, Initializer, NodeId, NodeRole, Op, ValueId, ValueKind};
use layout::TensorLayout;
use reshard::{DistLayout, ReshardPlan};
use tensor::DType;

use crate::assign::{NodePlacement, PlacedGraph, StrategySource};
use crate::config::{OptimizerLevel, ParallelMode};
use crate::error::{format_strategy, ParallelError};
use crate::hsdp::{OptimizerShard, ShardDecision};

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
    /// program): in the parameter's layout, except under `hsdp` level 2 where it is in the
    /// shard layout.
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
}

/// After the optimizer has updated this rank's piece of a parameter in place (in the
/// parameter's buffer, `hsdp` levels 1 and 2), the pieces are all-gathered into the whole
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
    /// (`hsdp` levels 1 and 2), in parameter order.
    pub weight_gathers: Vec<WeightGather>,
}

/// What to lower: the graph's gradient outputs and the values wanted after a step.
#[derive(Debug, Clone, Default)]
pub struct LowerRequest {
    /// Trainable parameters and their gradient values (empty for a forward-only program).
    pub grads: Vec<(ValueId, ValueId)>,
    /// Values wanted after a step, each gathered to every rank (replicated).
    pub replicated_outputs: Vec<ValueId>,
}

struct Lowering<'a> {
    placed: &'a PlacedGraph,
    buffers: Vec<BufferSpec>,
    steps: Vec<Step>,
    /// Available copies of each value: layout and buffer; the first is where it was produced.
    versions: HashMap<ValueId, Vec<usize>>,
    /// Plans already made, by source, destination and dtype: the blocks of a deep model move
    /// alike, so each distinct move is planned once (planning is linear in the ranks).
    plans: HashMap<(DistLayout, TensorLayout, DType), Arc<ReshardPlan>>,
}

impl Lowering<'_> {
    fn graph(&self) -> &Graph {
        &self.placed.graph
    }

    fn new_buffer(&mut self, value: ValueId, layout: DistLayout, suffix: &str) -> usize {
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
        let id = self.buffers.len() - 1;
        self.versions.entry(value).or_default().push(id);
        id
    }

    /// A buffer holding `value` in `need` (no pending sums), resharding if no copy has it yet.
    fn need(
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
        let to = self.new_buffer(value, need.clone().into(), &need.layout().describe_map());
        self.steps.push(Step::Reshard(ReshardStep {
            value,
            reason: reason(),
            plan,
            from,
            to,
        }));
        Ok(to)
    }
}

/// The op with its shape attributes rewritten to the local output shape.
fn local_op(op: &Op, local_out: &[usize]) -> Op {
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
        let mut in_bufs = Vec::with_capacity(node.inputs.len());
        for (i, (&v, need)) in node.inputs.iter().zip(&place.inputs).enumerate() {
            let b = lw.need(v, need, || {
                format!(
                    "{} needs input {i} ({}) as {}",
                    node.name,
                    graph.values()[v.0].name,
                    need.layout().describe_map()
                )
            })?;
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
            Some(shard) if shard.level >= OptimizerLevel::Level2 => {
                let layout = shard.layout.clone();
                lw.need(g, &layout, || {
                    format!(
                        "hsdp {}: the gradient of {name} goes to its optimizer shard {} (summing the contributions of the ranks that share it)",
                        shard.level.name(),
                        layout.layout().describe_map()
                    )
                })?
            }
            _ => {
                let layout = slot.layout.clone();
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
        if shard.level == OptimizerLevel::Level3 || p.grad_buffer.is_none() {
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
    Ok(Program {
        placed: placed.clone(),
        buffers: lw.buffers,
        steps: lw.steps,
        inputs,
        params,
        outputs,
        grad_scale,
        weight_gathers,
    })
}

/// MindSpore's gradient scaling when `gradients_mean` or `loss_repeated_mean` is off: Tessera's
/// gradients are those of the global mean loss; MindSpore without `gradients_mean` sums the
/// replicas' mean-loss gradients (one per batch shard), and without `loss_repeated_mean` skips
/// dividing by the devices the loss is repeated on.
fn grad_scale(placed: &PlacedGraph, request: &LowerRequest) -> f64 {
    if request.grads.is_empty() || placed.config.mode == ParallelMode::StandAlone {
        return 1.0;
    }
    let graph = &placed.graph;
    let loss_node = graph.nodes().iter().enumerate().find(|(_, n)| {
        matches!(n.op, Op::SparseSoftmaxCrossEntropy { .. }) && n.role == NodeRole::Forward
    });
    let Some((id, _)) = loss_node else {
        return 1.0;
    };
    let loss = &placed.nodes[id].outputs[0];
    let shards = loss.partial_count() as f64;
    let repeated = (placed.stage.n_devices() as f64) / shards;
    let mut scale = 1.0;
    if !placed.config.gradients_mean {
        scale *= shards;
    }
    if !placed.config.loss_repeated_mean {
        scale *= repeated;
    }
    scale
}

impl Program {
    /// Number of devices.
    pub fn devices(&self) -> usize {
        self.placed.stage.n_devices()
    }

    /// Bytes every step moves over the network, summed over reshards.
    pub fn bytes_per_step(&self) -> usize {
        let steps: usize = self
            .steps
            .iter()
            .map(|s| match s {
                Step::Reshard(r) => r.plan.bytes_total(),
                Step::Kernel(_) => 0,
            })
            .sum();
        steps
            + self
                .weight_gathers
                .iter()
                .map(|g| g.plan.bytes_total())
                .sum::<usize>()
    }

    /// The pipeline section of [`Program::explain`]: each stage's ranks and layers, and the
    /// bytes sent between stages per step.
    fn explain_stages(&self, p: &crate::pipeline::PipelineConfig, out: &mut String) {
        let Ok(stages) = crate::pipeline::node_stages(&self.placed.graph, p) else {
            return;
        };
        let per_stage = self.devices() / p.stages.max(1);
        let _ = writeln!(
            out,
            "\npipeline: {} stages of {per_stage} ranks, {} micro-batch(es) per step, scheduler {}",
            p.stages,
            p.micro_batches,
            p.scheduler.name()
        );
        // A backward costs about two forwards; zero bubble runs it as two halves.
        let durations = match p.scheduler {
            crate::pipeline::Scheduler::ZeroBubble => {
                crate::pipeline::Durations::uniform(1.0, 1.0, 1.0)
            }
            _ => crate::pipeline::Durations::uniform(1.0, 2.0, 0.0),
        };
        if let Ok(report) = crate::pipeline::Schedule::generate(p)
            .and_then(|schedule| crate::pipeline::simulate(&schedule, &durations))
        {
            let _ = writeln!(
                out,
                "  predicted bubble {:.1} % (equal stages; a backward twice a forward); micro-batches held at once, per stage: {:?}",
                report.bubble_fraction * 100.0,
                report.peak_retained
            );
        }
        for s in 0..p.stages {
            let layers: Vec<&str> = stages
                .layers
                .iter()
                .filter(|(_, st)| *st == s)
                .map(|(name, _)| name.as_str())
                .collect();
            let _ = writeln!(
                out,
                "  stage {s}: ranks {}..{}: {}",
                s * per_stage,
                (s + 1) * per_stage,
                layers.join(", ")
            );
        }
        let crossing: usize = self
            .steps
            .iter()
            .filter_map(|step| match step {
                Step::Reshard(r) => {
                    let (from, to) = (r.plan.src().layout().mesh(), r.plan.dst().mesh());
                    let first = |m: &layout::Mesh| m.rank_list().first().copied().unwrap_or(0);
                    let whole = |m: &layout::Mesh| m.n_slots() == self.devices();
                    (!whole(from) && !whole(to) && first(from) != first(to))
                        .then(|| r.plan.bytes_total())
                }
                Step::Kernel(_) => None,
            })
            .sum();
        let _ = writeln!(
            out,
            "  between stages: {crossing} bytes per step (point-to-point)"
        );
    }

    /// Every op's strategy and every inserted communication with its reason and bytes per step.
    pub fn explain(&self) -> String {
        self.explain_with(None)
    }

    /// [`Program::explain`] for a run in deterministic mode (`Some(max canonical blocks)`): the
    /// header says so and every pending sum is marked as the deterministic collective it runs as.
    pub fn explain_with(&self, deterministic: Option<usize>) -> String {
        let graph = &self.placed.graph;
        let mut out = String::new();
        if let Some(blocks) = deterministic {
            let _ = writeln!(
                out,
                "deterministic mode: every summed dim in at most {blocks} canonical blocks; pending \
                 sums added in the canonical tree over ranks"
            );
        }
        let _ = writeln!(
            out,
            "mode {} on {} device(s); {} steps, {} reshards, {} bytes moved per training step",
            self.placed.config.mode.name(),
            self.devices(),
            self.steps.len(),
            self.steps
                .iter()
                .filter(|s| matches!(s, Step::Reshard(_)))
                .count(),
            self.bytes_per_step()
        );
        if let Some(p) = self
            .placed
            .config
            .pipeline
            .as_ref()
            .filter(|p| p.stages > 1)
        {
            self.explain_stages(p, &mut out);
        }
        let _ = writeln!(out, "\nparameters:");
        for p in &self.params {
            // The layout the parameter's consumers need (under level 3 its buffer holds less).
            let layout = p
                .optimizer_shard()
                .map_or(&p.layout, |shard| &shard.strategy_layout);
            let slice = match layout.row_split() {
                Some(rows) => format!("rows {rows:?} × {:?}", &layout.slice_shape()[1..]),
                None => format!("{:?}", layout.slice_shape()),
            };
            let _ = writeln!(
                out,
                "  {:<20} {:?} as {} over {} (slice {slice}, {} copies)",
                p.name,
                layout.shape(),
                layout.layout().describe_map(),
                layout.mesh(),
                layout.replica_count()
            );
            match &p.hsdp {
                Some(ShardDecision::Sharded(shard)) => {
                    let what = match shard.level {
                        OptimizerLevel::Level1 => {
                            "optimizer state and update in pieces, weights gathered after the update"
                        }
                        OptimizerLevel::Level2 => {
                            "gradient, optimizer state and update in pieces, weights gathered after the update"
                        }
                        OptimizerLevel::Level3 => {
                            "weight, gradient, optimizer state and update in pieces, weight gathered before use"
                        }
                    };
                    let _ = writeln!(
                        out,
                        "  {:<20} hsdp {}: optimizer shard {} (slice {:?}), dim 0 over groups of {} ranks (step {}): {what}",
                        "",
                        shard.level.name(),
                        shard.layout.layout().describe_map(),
                        shard.layout.slice_shape(),
                        shard.size,
                        shard.step
                    );
                }
                Some(ShardDecision::Unsharded(why)) => {
                    let _ = writeln!(out, "  {:<20} hsdp: not sharded: {why}", "");
                }
                None => {}
            }
        }
        let _ = writeln!(out, "\nsteps:");
        for step in &self.steps {
            match step {
                Step::Kernel(k) => {
                    let node = &graph.nodes()[k.node.0];
                    let place = &self.placed.nodes[k.node.0];
                    let _ = writeln!(
                        out,
                        "  {}",
                        describe_node(node.name.as_str(), &node.op, place)
                    );
                }
                Step::Reshard(r) => {
                    let plan = &r.plan;
                    let what = describe_plan_with(plan, deterministic.is_some());
                    let _ = writeln!(
                        out,
                        "    -> reshard {}: {} ({} B/step): {}",
                        graph.values()[r.value.0].name,
                        what,
                        plan.bytes_total(),
                        r.reason
                    );
                }
            }
        }
        if !self.weight_gathers.is_empty() {
            let _ = writeln!(out, "\nafter the optimizer update:");
            for g in &self.weight_gathers {
                let _ = writeln!(
                    out,
                    "    -> gather {}: {} ({} B/step): hsdp: the updated pieces become the whole weight",
                    self.params[g.param].name,
                    describe_plan(&g.plan),
                    g.plan.bytes_total()
                );
            }
        }
        out
    }
}

fn describe_node(name: &str, op: &Op, place: &NodePlacement) -> String {
    let source = match &place.source {
        StrategySource::User => "user".to_string(),
        StrategySource::Default => "default".to_string(),
        StrategySource::Backward(f) => format!("backward of node {}", f.0),
        StrategySource::Gradient => "gradient".to_string(),
    };
    let strategy = place
        .strategy
        .as_ref()
        .map(|s| format!(" strategy {}", format_strategy(s)))
        .unwrap_or_default();
    let outputs: Vec<String> = place
        .outputs
        .iter()
        .map(|o| {
            let mut s = o.layout().layout().describe_map();
            if o.is_partial() {
                let axes: Vec<&str> = o
                    .partial_axes()
                    .iter()
                    .map(|&a| o.layout().mesh().axis_name(a))
                    .collect();
                s.push_str(&format!(
                    " pending {} over {}",
                    o.pending_op().name(),
                    axes.join("+")
                ));
            }
            s
        })
        .collect();
    format!(
        "{name} ({}){strategy} [{source}] on {}: -> {}",
        op.kind(),
        place.mesh(),
        outputs.join(", ")
    )
}

/// The collective resolving a pending value: `all-reduce`, `reduce-scatter along dim 1`; sums are
/// the common case and go unnamed, other reductions say which they are (`all-reduce (max)`).
pub(crate) fn describe_reduce(step: &reshard::ReduceStep) -> String {
    let op = match step.op {
        reshard::PendingOp::Sum => String::new(),
        other => format!(" ({})", other.name()),
    };
    match step.kind {
        reshard::ReduceKind::AllReduce => format!("all-reduce{op}"),
        reshard::ReduceKind::ReduceScatter { dim } => {
            format!("reduce-scatter{op} along dim {dim}")
        }
    }
}

/// A short description of what a plan does: its collectives.
pub fn describe_plan(plan: &ReshardPlan) -> String {
    describe_plan_with(plan, false)
}

/// [`describe_plan`]; with `deterministic`, a pending sum is marked as the deterministic
/// collective it runs as.
pub fn describe_plan_with(plan: &ReshardPlan, deterministic: bool) -> String {
    let mut parts = Vec::new();
    if let Some(step) = plan.reduce() {
        let n = step.slot_groups.first().map_or(0, Vec::len);
        let marker = if deterministic && step.op == reshard::PendingOp::Sum {
            "deterministic "
        } else {
            ""
        };
        parts.push(format!(
            "{marker}{} over groups of {n}",
            describe_reduce(step)
        ));
    }
    let exchanges = reshard::lower_kinds(plan);
    let mut kinds: Vec<String> = exchanges
        .iter()
        .map(|e| format!("{} over {} ranks", e.kind, e.ranks.len()))
        .collect();
    kinds.dedup();
    parts.extend(kinds);
    if plan.bytes_local() > 0 && parts.is_empty() {
        parts.push("local slice".to_string());
    }
    if parts.is_empty() {
        parts.push("nothing to move".to_string());
    }
    parts.join(", then ")
}
