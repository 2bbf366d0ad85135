//! Giving every node of a (training) graph its placement.
//!
//! Forward nodes take the user's strategy (semi-auto) or the data-parallel default; their
//! inputs must have the layouts the strategy implies, and their outputs get the layouts the
//! op's rule infers (possibly pending sums). Backward nodes are placed from the forward node they
//! differentiate: a forward value they read must have the layout the forward node used, a
//! gradient they read the layout of the forward value it is the gradient of, so the backward of
//! an op runs on the same device matrix as the op — as MindSpore derives backward strategies.
//! Accumulations of gradient contributions work in the layout of the value they are the gradient
//! of. Parameters take the layout their first forward consumer needs.

use std::collections::BTreeMap;

use graph::{Graph, Node, NodeId, NodeRole, Op, ValueId, ValueKind};
use layout::{Layout, Mesh, TensorLayout};
use reshard::DistLayout;

use crate::config::{DatasetStrategy, HsdpConfig, OpStrategy, ParallelConfig, ParallelMode};
use crate::deterministic::contiguous_sums;
use crate::error::ParallelError;
use crate::given_layouts::{bind_given, bind_op_layouts, Operands};
use crate::hsdp::{decide, param_bytes, ShardDecision};
use crate::patterns::{resolve_manual_split, resolve_op_patterns};
use crate::pipeline::{node_stages, relocate, relocate_dist, NodeStages};
use crate::rules::{infer, strategy, OpContext};

/// Where a node's strategy comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrategySource {
    /// Set by the user (`[parallel.shard]`).
    User,
    /// The data-parallel default for an unannotated op.
    Default,
    /// Derived from the forward node this backward node differentiates.
    Backward(NodeId),
    /// An accumulation or seed of gradients, in the layout of the value it is the gradient of.
    Gradient,
}

/// The placement of one node.
#[derive(Debug, Clone)]
pub struct NodePlacement {
    /// The strategy tuples (forward nodes) or `None`.
    pub strategy: Option<Vec<Vec<usize>>>,
    /// Where the placement comes from.
    pub source: StrategySource,
    /// The layout each input must have.
    pub inputs: Vec<TensorLayout>,
    /// The layout of each output as the op produces it (possibly pending sums).
    pub outputs: Vec<DistLayout>,
    /// Layouts the outputs must be brought to right after the op (a user `out_strategy`).
    pub out_layouts: Option<Vec<TensorLayout>>,
    /// The node reads its inputs as they are produced, pending sums included ([`inputs`] is
    /// then what they resolve to): an accumulation of gradient contributions that all await
    /// the same sum adds them first and leaves one sum for after it, not one per contribution.
    ///
    /// [`inputs`]: NodePlacement::inputs
    pub pending_inputs: bool,
}

impl NodePlacement {
    /// The op's device matrix.
    pub fn mesh(&self) -> &Mesh {
        self.inputs
            .first()
            .map(TensorLayout::mesh)
            .unwrap_or_else(|| self.outputs[0].layout().mesh())
    }

    /// The layout the consumers of output `j` see first: the `out_strategy` layout when set,
    /// otherwise the op's own output layout.
    pub fn delivered(&self, j: usize) -> DistLayout {
        match &self.out_layouts {
            Some(layouts) => layouts[j].clone().into(),
            None => self.outputs[j].clone(),
        }
    }
}

/// A graph with every node placed and every leaf laid out.
#[derive(Debug, Clone)]
pub struct PlacedGraph {
    /// The graph.
    pub graph: Graph,
    /// The parallel settings.
    pub config: ParallelConfig,
    /// The devices of the stage, one axis `dp`.
    pub stage: Mesh,
    /// One placement per node, by [`NodeId`].
    pub nodes: Vec<NodePlacement>,
    /// The layout of every input and parameter, by [`ValueId`] (`None` for intermediates).
    /// Under `hsdp`'s MindSpore levels a sharded parameter's is its shard layout.
    pub leaves: Vec<Option<TensorLayout>>,
    /// What optimizer parallelism decided for every trainable parameter, by [`ValueId`]
    /// (`None` for other values, and for all when `hsdp` is off or on one device).
    pub optimizer_shards: Vec<Option<ShardDecision>>,
}

impl PlacedGraph {
    /// The layout a value is produced in: a leaf's layout, or its producer's delivered layout.
    pub fn produced(&self, value: ValueId) -> DistLayout {
        match self.graph.values()[value.0].producer {
            Some((node, j)) => self.nodes[node.0].delivered(j),
            None => self.leaves[value.0]
                .clone()
                .expect("every leaf is laid out")
                .into(),
        }
    }

    /// The layout a value lives in once its pending sums are resolved.
    pub fn home(&self, value: ValueId) -> TensorLayout {
        self.produced(value).layout().clone()
    }
}

/// The value `v` is the gradient (or a contribution to the gradient) of, if any.
pub fn gradient_target(graph: &Graph, v: ValueId) -> Option<ValueId> {
    let (node, j) = graph.values()[v.0].producer?;
    let node = &graph.nodes()[node.0];
    match &node.role {
        NodeRole::Forward => None,
        NodeRole::Backward(grad_of) => {
            let forward = &graph.nodes()[grad_of.forward.0];
            grad_of
                .wrt
                .get(j)
                .copied()
                .flatten()
                .map(|i| forward.inputs[i])
        }
        NodeRole::Accumulate { value } | NodeRole::Seed { value } => Some(*value),
    }
}

/// Checks that the dataset strategy of `config` splits every input of `graph` over
/// `devices` (one pipeline stage's devices): what placing the program checks first, for
/// callers that plan without placing (`tessera plan`).
pub fn check_dataset_strategy(
    graph: &Graph,
    config: &ParallelConfig,
    devices: usize,
) -> Result<(), ParallelError> {
    let stage_mesh = strategy::device_mesh(devices);
    for (index, &v) in graph.inputs().iter().enumerate() {
        let value = &graph.values()[v.0];
        input_layout(config, &stage_mesh, &value.shape, index, &value.name)?;
    }
    Ok(())
}

/// The layout of graph input number `index` under the dataset strategy.
fn input_layout(
    config: &ParallelConfig,
    stage: &Mesh,
    shape: &[usize],
    index: usize,
    name: &str,
) -> Result<TensorLayout, ParallelError> {
    let devices = stage.n_devices();
    let setting_error = |reason: String| ParallelError::Setting {
        setting: "dataset_strategy",
        reason,
    };
    let strategy: Vec<usize> = match (&config.dataset_strategy, config.mode) {
        (_, ParallelMode::StandAlone) => vec![1; shape.len()],
        (DatasetStrategy::Layouts(list), _) => {
            let given = list.get(index).ok_or_else(|| {
                setting_error(format!(
                    "it has {} layouts but the graph has more inputs (no layout for {name})",
                    list.len()
                ))
            })?;
            return bind_given(given, shape, (devices, None), &format!("input {name}"))
                .map_err(setting_error);
        }
        (DatasetStrategy::FullBatch, _) => vec![1; shape.len()],
        (DatasetStrategy::DataParallel, _) => {
            let mut s = vec![1; shape.len()];
            if let Some(d0) = s.first_mut() {
                if !shape[0].is_multiple_of(devices) {
                    return Err(setting_error(format!(
                        "data_parallel splits dim 0 of input {name} (shape {shape:?}) over {devices} \
                         devices, but {} is not divisible by {devices}",
                        shape[0]
                    )));
                }
                *d0 = devices;
            }
            s
        }
        (DatasetStrategy::PerInput(list), _) => list.get(index).cloned().ok_or_else(|| {
            setting_error(format!(
                "it has {} entries but the graph has more inputs (no entry for {name})",
                list.len()
            ))
        })?,
    };
    if strategy.len() != shape.len() {
        return Err(setting_error(format!(
            "the strategy {strategy:?} for input {name} has {} entries, its shape {shape:?} has {} dims",
            strategy.len(),
            shape.len()
        )));
    }
    let names: Vec<String> = (0..shape.len()).map(|d| format!("d{d}")).collect();
    let mesh = layout::repeated_calc_mesh(&strategy, &names, devices)
        .map_err(|e| setting_error(format!("input {name}: {e}")))?;
    let dims = (0..shape.len()).map(|d| vec![d]).collect();
    Layout::from_mesh(mesh, dims)
        .map(|l| l.normalized())
        .and_then(|l| l.bind(shape))
        .map_err(|e| setting_error(format!("input {name}: {e}")))
}

/// Places every node of `graph` under `config`.
pub fn place(graph: &Graph, config: &ParallelConfig) -> Result<PlacedGraph, ParallelError> {
    let devices = config.effective_devices();
    if devices == 0 {
        return Err(ParallelError::Setting {
            setting: "devices",
            reason: "at least one device is needed".to_string(),
        });
    }
    // Patterns and cell names in the strategy table become the op names they stand for.
    let resolved;
    let config = match config.mode {
        ParallelMode::SemiAuto | ParallelMode::Auto(_) => {
            resolved = ParallelConfig {
                strategies: resolve_op_patterns(graph, &config.strategies)?,
                manual_split: resolve_manual_split(graph, &config.manual_split)?,
                ..config.clone()
            };
            &resolved
        }
        // One device holds every row; the split is a memory layout, not a result.
        ParallelMode::StandAlone => {
            resolved = ParallelConfig {
                manual_split: BTreeMap::new(),
                ..config.clone()
            };
            &resolved
        }
        mode if !config.manual_split.is_empty() => {
            return Err(ParallelError::Setting {
                setting: "manual_split",
                reason: format!(
                    "splits an embedding table by rows, which needs its strategy to split them: \
                     use semi_auto_parallel (the mode is {})",
                    mode.name()
                ),
            })
        }
        _ => config,
    };
    let stage = strategy::device_mesh(devices);
    // Pipeline stages: every node's strategy applies on its stage's devices, then its layouts
    // move onto that stage's ranks (stage s holds ranks s·n .. (s + 1)·n).
    let stages = pipeline_stages(graph, config, devices)?;
    let per_stage = stages.as_ref().map_or(devices, |(_, n)| *n);
    let offset_of_node = |id: usize| stages.as_ref().map_or(0, |(st, n)| st.nodes[id] * n);
    let offset_of_value = |v: ValueId| stages.as_ref().map_or(0, |(st, n)| st.values[v.0] * n);
    let stage_mesh = strategy::device_mesh(per_stage);
    let mut leaves: Vec<Option<TensorLayout>> = vec![None; graph.values().len()];
    for (index, &v) in graph.inputs().iter().enumerate() {
        let value = &graph.values()[v.0];
        let layout = input_layout(config, &stage_mesh, &value.shape, index, &value.name)?;
        leaves[v.0] = Some(relocated(&layout, offset_of_value(v), &value.name)?);
    }
    let mut placed = PlacedGraph {
        graph: graph.clone(),
        config: config.clone(),
        stage: stage.clone(),
        nodes: Vec::with_capacity(graph.nodes().len()),
        leaves,
        optimizer_shards: vec![None; graph.values().len()],
    };
    // Optimizer parallelism needs replicas: none on one device.
    let hsdp = config.hsdp.as_ref().filter(|_| devices > 1);
    for (id, node) in graph.nodes().iter().enumerate() {
        let ctx = OpContext::of(graph, node);
        let placement = match &node.role {
            NodeRole::Forward => {
                let on_stage = stages.as_ref().map(|(st, _)| strategy::PipelineStage {
                    stage: st.nodes[id],
                    stages: config.pipeline.as_ref().map_or(1, |p| p.stages),
                    devices,
                });
                let p = place_forward(&ctx, node, config, per_stage, on_stage, &placed)?;
                relocate_placement(&ctx, p, offset_of_node(id))?
            }
            NodeRole::Backward(grad_of) => {
                let forward = &graph.nodes()[grad_of.forward.0];
                let fwd_place = &placed.nodes[grad_of.forward.0];
                let wrt = grad_of.wrt.first().copied().flatten();
                let mut inputs: Vec<TensorLayout> = node
                    .inputs
                    .iter()
                    .map(|&v| backward_need(&placed, (forward, fwd_place), wrt, v))
                    .collect();
                if config.deterministic {
                    inputs =
                        contiguous_sums(&node.op, inputs, &ctx.input_shapes, ctx.output_shapes[0])
                            .map_err(|e| ctx.layout_error(e))?;
                }
                let outputs = infer::output_layouts(&ctx, &inputs, &stage)?;
                NodePlacement {
                    strategy: None,
                    source: StrategySource::Backward(grad_of.forward),
                    inputs,
                    outputs,
                    out_layouts: None,
                    pending_inputs: false,
                }
            }
            NodeRole::Accumulate { value } | NodeRole::Seed { value } => {
                // A parameter whose gradient hsdp shards sums its gradient's contributions in
                // its shard layout: each is reduce-scattered, never whole; any other in the
                // layout its consumers need.
                let home = match placed.optimizer_shards[value.0]
                    .as_ref()
                    .and_then(ShardDecision::shard)
                {
                    Some(shard) if shard.gradient_sharded => shard.layout.clone(),
                    Some(shard) => shard.strategy_layout.clone(),
                    None => value_layout(&placed, *value),
                };
                let inputs = vec![home.clone(); node.inputs.len()];
                // Contributions that all await the same sum are added first; the sum waits
                // for the accumulated gradient's reader (deterministic mode sums each
                // contribution in its canonical order, as one device does, before adding).
                let pending = match config.deterministic {
                    true => None,
                    false => common_pending_sum(&placed, &node.inputs),
                };
                let outputs = match &pending {
                    Some(delivered) => vec![delivered.clone()],
                    // A seed: the constant in the layout of the value it is the gradient of.
                    None if inputs.is_empty() => vec![home.into()],
                    None => infer::output_layouts(&ctx, &inputs, &stage)?,
                };
                NodePlacement {
                    strategy: None,
                    source: StrategySource::Gradient,
                    inputs,
                    outputs,
                    out_layouts: None,
                    pending_inputs: pending.is_some(),
                }
            }
        };
        // A parameter takes the layout its first forward consumer needs; hsdp decides its
        // optimizer shard from that layout.
        if node.role == NodeRole::Forward {
            for (&v, need) in node.inputs.iter().zip(&placement.inputs) {
                if matches!(graph.values()[v.0].kind, ValueKind::Parameter { .. })
                    && placed.leaves[v.0].is_none()
                {
                    let need = match shared_owner_layout(graph, &placed, v, per_stage)? {
                        Some(owner) => owner,
                        None => need.clone(),
                    };
                    if let Some(hsdp) = hsdp {
                        placed.optimizer_shards[v.0] = optimizer_shard(graph, hsdp, v, &need);
                    }
                    placed.leaves[v.0] = Some(need);
                }
            }
        }
        placed.nodes.push(placement);
    }
    // Parameters no forward node reads are replicated.
    for &p in &graph.parameters() {
        if placed.leaves[p.0].is_none() {
            let shape = &graph.values()[p.0].shape;
            placed.leaves[p.0] = Some(TensorLayout::replicated(stage.clone(), shape));
        }
    }
    // MindSpore's levels: a sharded parameter's own buffer holds its piece. Every node is
    // placed by now with the strategy layout, so the lowering gathers the weight before its use.
    for p in graph.parameters() {
        if let Some(ShardDecision::Sharded(shard)) = &placed.optimizer_shards[p.0] {
            if shard.level.shards_weights() {
                placed.leaves[p.0] = Some(shard.layout.clone());
            }
        }
    }
    Ok(placed)
}

/// What optimizer parallelism decides for parameter `p` of `graph` laid out as
/// `strategy_layout` (see [`crate::hsdp`]): `None` for a parameter that is not trainable.
fn optimizer_shard(
    graph: &Graph,
    hsdp: &HsdpConfig,
    p: ValueId,
    strategy_layout: &TensorLayout,
) -> Option<ShardDecision> {
    matches!(
        graph.values()[p.0].kind,
        ValueKind::Parameter {
            trainable: true,
            ..
        }
    )
    .then(|| decide(hsdp, strategy_layout, param_bytes(graph, p)))
}

/// The stage of every node and the devices per stage, when `config` asks for more than one
/// pipeline stage.
/// For a copy of a shared parameter (`pipeline::split_shared_parameters`): its owner's layout
/// moved onto the copy's stage, so slot `j` of every copy holds the same box.
fn shared_owner_layout(
    graph: &Graph,
    placed: &PlacedGraph,
    copy: ValueId,
    per_stage: usize,
) -> Result<Option<TensorLayout>, ParallelError> {
    let name = &graph.values()[copy.0].name;
    let Some((owner, stage)) = crate::pipeline::shared_copy_of(name) else {
        return Ok(None);
    };
    let Some(owner_layout) = graph
        .value_by_name(owner)
        .and_then(|o| placed.leaves[o.0].clone())
    else {
        return Err(ParallelError::Setting {
            setting: "pipeline",
            reason: format!(
                "{name} copies the shared parameter {owner}, which no earlier stage has laid out"
            ),
        });
    };
    let from = owner_layout
        .mesh()
        .rank_list()
        .first()
        .copied()
        .unwrap_or(0);
    let from = from - from % per_stage.max(1);
    crate::pipeline::move_between_stages(&owner_layout, from, stage * per_stage)
        .map(Some)
        .map_err(|e| ParallelError::Layout {
            op: name.clone(),
            source: e,
        })
}

fn pipeline_stages(
    graph: &Graph,
    config: &ParallelConfig,
    devices: usize,
) -> Result<Option<(NodeStages, usize)>, ParallelError> {
    let Some(p) = config.pipeline.as_ref().filter(|p| p.stages > 1) else {
        return Ok(None);
    };
    config.validate_pipeline()?;
    let setting = |e: crate::pipeline::PipelineError| ParallelError::Setting {
        setting: "pipeline",
        reason: e.to_string(),
    };
    let stages = node_stages(graph, p).map_err(setting)?;
    Ok(Some((stages, devices / p.stages)))
}

/// `layout` moved `offset` ranks up (onto its stage's ranks).
fn relocated(
    layout: &TensorLayout,
    offset: usize,
    what: &str,
) -> Result<TensorLayout, ParallelError> {
    relocate(layout, offset).map_err(|e| ParallelError::Layout {
        op: what.to_string(),
        source: e,
    })
}

/// A placement computed on a stage's devices, moved onto the stage's ranks.
fn relocate_placement(
    ctx: &OpContext<'_>,
    mut p: NodePlacement,
    offset: usize,
) -> Result<NodePlacement, ParallelError> {
    if offset == 0 {
        return Ok(p);
    }
    let err = |e| ctx.layout_error(e);
    p.inputs = p
        .inputs
        .iter()
        .map(|l| relocate(l, offset).map_err(err))
        .collect::<Result<_, _>>()?;
    // Constants are computed whole on every rank; their consumers take a local slice.
    if !p.inputs.is_empty() {
        p.outputs = p
            .outputs
            .iter()
            .map(|l| relocate_dist(l, offset).map_err(err))
            .collect::<Result<_, _>>()?;
    }
    if let Some(out) = p.out_layouts.take() {
        p.out_layouts = Some(
            out.iter()
                .map(|l| relocate(l, offset).map_err(err))
                .collect::<Result<_, _>>()?,
        );
    }
    Ok(p)
}

/// The layout a value has for its consumers: a parameter not yet laid out is replicated.
fn value_layout(placed: &PlacedGraph, v: ValueId) -> TensorLayout {
    let value = &placed.graph.values()[v.0];
    match value.producer {
        Some(_) => placed.home(v),
        None => placed.leaves[v.0]
            .clone()
            .unwrap_or_else(|| TensorLayout::replicated(placed.stage.clone(), &value.shape)),
    }
}

/// What a backward node of `forward` needs of its input `v`.
///
/// A forward value gets the layout the forward node used. Any other input is, by the chain rule,
/// the gradient of one of the forward node's outputs — directly, or passed through unchanged
/// from a consumer whose gradient is the identity (a `BiasAdd`'s input, an `Add`'s operands), in
/// which case autodiff records it as the consumer's gradient. It gets that output's layout: the
/// output of the same shape (outputs of one op differ in shape). Intermediate values of the rule
/// itself already live on the forward node's device matrix.
fn backward_need(
    placed: &PlacedGraph,
    (forward, fwd_place): (&Node, &NodePlacement),
    wrt: Option<usize>,
    v: ValueId,
) -> TensorLayout {
    let graph = &placed.graph;
    let as_forward = |u: ValueId| -> Option<TensorLayout> {
        if let Some(i) = forward_input_place(&forward.inputs, wrt, u) {
            return Some(fwd_place.inputs[i].clone());
        }
        forward
            .outputs
            .iter()
            .position(|&x| x == u)
            .map(|j| fwd_place.outputs[j].layout().clone())
    };
    // A constant of the rule (zeros for an output without a gradient) is placed like the
    // output of its shape, as a gradient would be; other values of the rule keep their own.
    let produced_by_rule = graph.values()[v.0].producer.is_some_and(|(n, _)| {
        let node = &graph.nodes()[n.0];
        !node.inputs.is_empty()
            && matches!(&node.role, NodeRole::Backward(g) if g.forward == forward_id(graph, forward))
    });
    as_forward(v)
        .or_else(|| gradient_target(graph, v).and_then(as_forward))
        .or_else(|| {
            if produced_by_rule {
                return None;
            }
            let shape = &graph.values()[v.0].shape;
            forward
                .outputs
                .iter()
                .position(|&o| &graph.values()[o.0].shape == shape)
                .map(|j| fwd_place.outputs[j].layout().clone())
        })
        .unwrap_or_else(|| value_layout(placed, v))
}

/// Which of a forward op's `inputs` a backward rule's input `u` is, for the rule giving the
/// gradient of input `wrt`: its place among them, and for a value the op reads twice (`h·hᵀ`,
/// whose places have a layout each) the place that is not `wrt` — the rule for one operand's
/// gradient reads the other operand. `None` when `u` is not an input.
pub(crate) fn forward_input_place(
    inputs: &[ValueId],
    wrt: Option<usize>,
    u: ValueId,
) -> Option<usize> {
    let mut places = inputs.iter().enumerate().filter(|(_, &x)| x == u);
    let first = places.next().map(|(i, _)| i);
    let other = places.map(|(i, _)| i).find(|_| first == wrt);
    other.or(first)
}

/// The id of `node` in `graph` (nodes are stored by id).
fn forward_id(graph: &Graph, node: &Node) -> NodeId {
    graph
        .node_by_name(&node.name)
        .expect("the node belongs to the graph")
}

/// Places a forward node from its strategy, on the `devices` devices of its pipeline stage
/// (`stage`, when the run has more than one).
fn place_forward(
    ctx: &OpContext<'_>,
    node: &Node,
    config: &ParallelConfig,
    devices: usize,
    stage: Option<strategy::PipelineStage>,
    placed: &PlacedGraph,
) -> Result<NodePlacement, ParallelError> {
    if node.inputs.is_empty() {
        if config.mode.uses_strategies() && config.strategies.contains_key(&node.name) {
            return Err(ctx.unsupported(
                "a constant takes no strategy: it is computed whole on every rank, and a \
                 consumer wanting a split takes its block",
            ));
        }
        let outputs = infer::output_layouts(ctx, &[], &placed.stage)?;
        return Ok(NodePlacement {
            strategy: None,
            source: StrategySource::Default,
            inputs: Vec::new(),
            outputs,
            out_layouts: None,
            pending_inputs: false,
        });
    }
    let user = match config.mode {
        ParallelMode::SemiAuto | ParallelMode::Auto(_) => config.strategies.get(&node.name),
        _ => None,
    };
    let (strategy_tuples, source) = match (config.mode, user) {
        (ParallelMode::StandAlone, _) => (strategy::unsplit_strategy(ctx), StrategySource::Default),
        (_, Some(user)) => (user.inputs.clone(), StrategySource::User),
        (_, None) => (
            strategy::default_strategy(ctx, devices),
            StrategySource::Default,
        ),
    };
    let inputs: Vec<TensorLayout> = match user.and_then(|u| u.in_layouts.as_deref()) {
        Some(given) => bind_op_layouts(ctx, given, Operands::Inputs, (devices, stage))?,
        None => strategy::input_layouts_on_stage(ctx, &strategy_tuples, devices, stage)?
            .inputs
            .into_iter()
            .zip(&ctx.input_shapes)
            .map(|(l, shape)| l.bind(shape).map_err(|e| ctx.layout_error(e)))
            .collect::<Result<_, _>>()?,
    };
    let inputs = match config.manual_split.get(&node.name) {
        Some(rows) => with_manual_rows(ctx, inputs, rows)?,
        None => inputs,
    };
    let outputs = infer::output_layouts(ctx, &inputs, &placed.stage)
        .map_err(|e| user_strategy_error(ctx, e, user.is_some(), &strategy_tuples))?;
    let out_layouts = match user {
        Some(OpStrategy {
            out_layouts: Some(given),
            ..
        }) => Some(
            bind_op_layouts(ctx, given, Operands::Outputs, (devices, stage))
                .map_err(|e| out_layout_error(e, &strategy_tuples))?,
        ),
        Some(OpStrategy {
            outputs: Some(out_strategy),
            ..
        }) => Some(out_strategy_layouts(
            ctx,
            &strategy_tuples,
            out_strategy,
            &outputs,
        )?),
        _ => None,
    };
    Ok(NodePlacement {
        strategy: Some(strategy_tuples),
        source,
        inputs,
        outputs,
        out_layouts,
        pending_inputs: false,
    })
}

/// `error`, from inferring the outputs of an op the user gave a strategy (`user`), as the
/// strategy breaking the op's rule: so that the error names the `[parallel.shard]` key that set
/// it, as other strategy errors do. Other errors are returned as they are.
fn user_strategy_error(
    ctx: &OpContext<'_>,
    error: ParallelError,
    user: bool,
    strategy: &[Vec<usize>],
) -> ParallelError {
    match error {
        ParallelError::Unsupported { op, kind, reason } if user => ParallelError::InvalidStrategy {
            op,
            kind,
            strategy: crate::error::format_strategy(strategy),
            rule: reason,
        },
        ParallelError::Layout { op, source } if user => ParallelError::InvalidStrategy {
            op,
            kind: ctx.op.kind(),
            strategy: crate::error::format_strategy(strategy),
            rule: source.to_string(),
        },
        other => other,
    }
}

/// `error`, about the out layouts (`[parallel.out_shard]`) of an op whose in-strategy is
/// `strategy`, as an error about that strategy naming the out_strategy, as a tuple
/// out_strategy's error does: so that it names the key that set the op's strategy.
fn out_layout_error(error: ParallelError, strategy: &[Vec<usize>]) -> ParallelError {
    match error {
        ParallelError::InvalidStrategy {
            op,
            kind,
            strategy: out,
            rule,
        } => ParallelError::InvalidStrategy {
            op,
            kind,
            strategy: crate::error::format_strategy(strategy),
            rule: format!("out_strategy {out}: {rule}"),
        },
        other => other,
    }
}

/// The layout `values` are all produced in when each awaits a sum, the same sum over the same
/// groups of ranks, every rank holding the same box of each: adding them as they are and
/// summing the total once (into whatever layout its reader needs) gives the sum of their sums.
/// `None` otherwise.
fn common_pending_sum(placed: &PlacedGraph, values: &[ValueId]) -> Option<DistLayout> {
    let first = placed.produced(*values.first()?);
    let groups = rank_groups(&first);
    let all = values.iter().all(|&v| {
        let d = placed.produced(v);
        d.is_partial()
            && d.pending_op() == reshard::PendingOp::Sum
            && d.layout().same_placement(first.layout())
            && rank_groups(&d) == groups
    });
    all.then_some(first)
}

/// The groups of ranks whose values a pending sum adds up, each sorted, in sorted order.
fn rank_groups(d: &DistLayout) -> Vec<Vec<usize>> {
    let mesh = d.layout().mesh();
    let mut groups: Vec<Vec<usize>> = d
        .partial_slot_groups()
        .into_iter()
        .map(|slots| {
            let mut ranks: Vec<usize> = slots.into_iter().map(|s| mesh.rank_of_slot(s)).collect();
            ranks.sort_unstable();
            ranks
        })
        .collect();
    groups.sort();
    groups
}

/// An Embedding's input layouts with its table (input 0) cut into blocks of `rows` rows.
fn with_manual_rows(
    ctx: &OpContext<'_>,
    mut inputs: Vec<TensorLayout>,
    rows: &[usize],
) -> Result<Vec<TensorLayout>, ParallelError> {
    let table = &inputs[0];
    inputs[0] = table
        .with_row_split(rows)
        .map_err(|e| ParallelError::Setting {
            setting: "manual_split",
            reason: format!(
                "{}: its strategy splits the table's {} rows into {} block(s) ({}): {e}",
                ctx.name,
                table.shape()[0],
                table.split_factors()[0],
                table.layout().describe_map()
            ),
        })?;
    Ok(inputs)
}

/// The layouts an `out_strategy` asks for: each output dim split by its natural axes, then, when
/// the factor asks for more, by the output's pending-sum axes (a reduce-scatter instead of an
/// all-reduce, MindSpore's `forward_reduce_scatter`).
fn out_strategy_layouts(
    ctx: &OpContext<'_>,
    in_strategy: &[Vec<usize>],
    out_strategy: &[Vec<usize>],
    outputs: &[DistLayout],
) -> Result<Vec<TensorLayout>, ParallelError> {
    if out_strategy.len() != outputs.len() {
        return Err(ctx.invalid(
            in_strategy,
            format!(
                "out_strategy has {} entries but the op has {} outputs",
                out_strategy.len(),
                outputs.len()
            ),
        ));
    }
    let mut layouts = Vec::with_capacity(outputs.len());
    for (j, (factors, out)) in out_strategy.iter().zip(outputs).enumerate() {
        let t = out.layout();
        let mesh = t.mesh();
        if factors.len() != t.shape().len() {
            return Err(ctx.invalid(
                in_strategy,
                format!(
                    "out_strategy {factors:?} for output {j} must have one entry per dim of {:?}",
                    t.shape()
                ),
            ));
        }
        let mut spare: Vec<usize> = out.partial_axes().to_vec();
        let mut dims = t.dims().to_vec();
        for (d, &f) in factors.iter().enumerate() {
            let natural: usize = dims[d].iter().map(|&a| mesh.axis_size(a)).product();
            if f == natural {
                continue;
            }
            let partial: usize = spare.iter().map(|&a| mesh.axis_size(a)).product();
            if !spare.is_empty() && f == natural * partial {
                dims[d].append(&mut spare);
                continue;
            }
            let mut allowed = vec![natural];
            if !spare.is_empty() {
                allowed.push(natural * partial);
            }
            return Err(ctx.invalid(
                in_strategy,
                format!(
                    "out_strategy {factors:?}: dim {d} of output {j} can only be split {allowed:?} ways with this in_strategy"
                ),
            ));
        }
        let layout = Layout::from_mesh(mesh.clone(), dims)
            .and_then(|l| l.bind(t.shape()))
            .map_err(|e| ctx.layout_error(e))?;
        layouts.push(layout);
    }
    Ok(layouts)
}

/// Whether a node is a forward op a user may annotate.
pub fn is_annotatable(node: &Node) -> bool {
    node.role == NodeRole::Forward && !matches!(node.op, Op::Fill { .. } | Op::Triu { .. })
}
