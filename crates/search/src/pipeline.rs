//! `parallel.auto_pipeline`: the search also chooses the pipeline — the stage count, the layers
//! of every stage and the strategies within each stage's devices.
//!
//! For every stage count P (the powers of two that divide the devices, up to the number of
//! layers; P = 1 is the plain search):
//! 1. the whole model is searched on `devices / P` devices (the memory of all P stages
//!    together), which costs every layer: its ops' shares of the step time and their memory;
//! 2. the layers are cut into P contiguous stages minimising the slowest stage's time, with
//!    each stage's memory under the budget: its parameters, gradients and optimizer state, and
//!    the activations of as many micro-batches as the schedule holds on it at once, and only
//!    where the run accepts the `stage_config` naming every layer ([`CutRules`]: no cut between
//!    two calls of one cell, a trainable parameter on every stage but the last);
//! 3. each stage's ops are searched again on their own on the stage's `devices / P` devices,
//!    under what the budget leaves for them;
//! 4. the schedule (`[parallel.pipeline]`'s scheduler and micro-batches, or 1F1B with 4·P) is
//!    simulated with every stage's predicted forward and backward time per micro-batch; the
//!    step is its makespan, the bubble what the busiest stage idles.
//!
//! The P with the least predicted step wins. Stages are costed on the model of one micro-batch:
//! the model as built when `[parallel.pipeline]` already cut the batch, otherwise the model
//! the caller rebuilds with `batch / micro_batches` ([`crate::PlanModel::with_batch_size`]; a P
//! whose micro-batches do not divide the batch is skipped). The gradient all-reduces are counted with every micro-batch (an
//! overestimate; with `[parallel.pipeline]` P = 1 is costed the same way, as M accumulated
//! micro-steps). Sending a
//! micro-batch's activations to the next stage costs the latency and bandwidth of the link
//! between stages, for the largest boundary's bytes split over the stage's devices.
//!
//! Stages configured by `[parallel.pipeline]` (several stages, without `auto_pipeline`) are
//! planned by steps 3 and 4 alone ([`plan_configured_stages`]): every op on the stage
//! [`node_stages`] gives it (`stage_config`, or the even cut by parameter counts), as the run
//! places it, the activations each stage leaves room for estimated as in step 1.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use graph::Graph;
use parallel::pipeline::{
    layer_of, node_stages, simulate, stage_ranks, staged_layer_of, Durations, PipelineConfig,
    Scheduler, MAX_STAGES,
};
use parallel::rules::strategy::PipelineStage;
use parallel::{ParallelConfig, ParallelError, SearchMode};

use crate::cost::DeviceProfile;
use crate::error::SearchError;
use crate::footprint::MemoryEstimate;
use crate::plan::{PlanModel, SearchScope};
use crate::problem::PlanCost;
use crate::solve::{search_with, with_default_strategies, SearchRequest, SearchResult};

/// The memory budget of the search that only costs the layers: 1 PiB.
const UNLIMITED: u64 = 1 << 50;

/// The pipeline a search chose.
#[derive(Debug, Clone)]
pub struct PipelinePlan {
    /// The pipeline: stages, micro-batches, scheduler and a `stage_config` naming every layer
    /// (for stages configured by `[parallel.pipeline]`, that configuration as given).
    pub config: PipelineConfig,
    /// The layers in model order with their stage.
    pub layers: Vec<(String, usize)>,
    /// The stage of every searched op, by name.
    pub stage_of_op: BTreeMap<String, usize>,
    /// Per stage, its predicted cost per step (every micro-batch) and its memory per device
    /// (with the activations of the micro-batches it holds at once).
    pub stage_costs: Vec<PlanCost>,
    /// Seconds per step: the schedule's makespan.
    pub makespan: f64,
    /// Seconds the busiest stage idles per step.
    pub bubble: f64,
    /// Whether `[parallel.pipeline]` already cut the batch into the micro-batches (the model is
    /// one micro-batch), as training the plan needs.
    pub batch_cut: bool,
}

impl PipelinePlan {
    /// The ranks of stage `stage` among `devices`.
    pub fn ranks(&self, stage: usize, devices: usize) -> std::ops::Range<usize> {
        stage_ranks(stage, self.config.stages, devices).unwrap_or(0..0)
    }

    /// The stage whose cost per step is the largest (the schedule's bottleneck).
    pub fn busiest(&self) -> usize {
        (0..self.stage_costs.len())
            .max_by(|&a, &b| {
                self.stage_costs[a]
                    .time()
                    .total_cmp(&self.stage_costs[b].time())
            })
            .unwrap_or(0)
    }
}

/// What a search with `auto_pipeline` found: the strategies of every op and the pipeline.
#[derive(Debug, Clone)]
pub(crate) struct PipelinedSearch {
    /// Every forward op's strategy, in graph order.
    pub strategies: Vec<(String, Vec<Vec<usize>>)>,
    /// The chosen pipeline (`stages = 1` when no pipeline beats the plain search).
    pub plan: PipelinePlan,
    /// The plain search's result when P = 1 won.
    pub flat: Option<SearchResult>,
}

/// One layer's share of a whole-model plan.
#[derive(Debug, Clone, Copy, Default)]
struct LayerCost {
    /// Seconds per graph batch.
    time: f64,
    /// Parameters, gradients and optimizer state, bytes per device.
    fixed: f64,
    /// Activations of one graph batch, bytes per device.
    activations: f64,
}

/// Layers in model order, each with the names of its forward ops.
type Layers = Vec<(String, Vec<String>)>;

/// The layers of `graph` in order, with the forward ops (those searched) of each.
fn model_layers(graph: &Graph) -> Vec<(String, Vec<String>)> {
    layers_by(graph, |_, name| layer_of(name).to_string())
}

/// The forward ops (those searched) of `graph` grouped by `layer(node id, node name)`, the
/// groups in the order of their first op.
fn layers_by(graph: &Graph, layer: impl Fn(usize, &str) -> String) -> Vec<(String, Vec<String>)> {
    let mut layers: Vec<(String, Vec<String>)> = Vec::new();
    for (id, node) in graph.nodes().iter().enumerate() {
        if node.role != graph::NodeRole::Forward || node.inputs.is_empty() {
            continue;
        }
        let layer = layer(id, &node.name);
        match layers.last_mut() {
            Some((name, ops)) if *name == layer => ops.push(node.name.clone()),
            _ => match layers.iter_mut().find(|(name, _)| *name == layer) {
                Some((_, ops)) => ops.push(node.name.clone()),
                None => layers.push((layer, vec![node.name.clone()])),
            },
        }
    }
    layers
}

/// The schedule settings: `[parallel.pipeline]`'s micro-batches and scheduler, else 1F1B with
/// 4·P micro-batches; and whether the batch was cut already.
fn schedule_for(parallel: &ParallelConfig, stages: usize) -> (usize, Scheduler, bool) {
    match &parallel.pipeline {
        Some(p) => (p.micro_batches, p.scheduler, true),
        None => (4 * stages, Scheduler::OneFOneB, false),
    }
}

/// Where the run accepts a stage to begin, per layer in model order (what [`node_stages`]
/// refuses of a `stage_config` naming every layer).
#[derive(Debug, Clone)]
struct CutRules {
    /// Whether a stage may begin at the layer: no earlier layer (cell) is called again after
    /// the layer's first op. A cut there would run the cell's later call, which may read this
    /// stage's output, on the earlier stage its key names
    /// ([`parallel::pipeline::PipelineError::CellSplitBetweenStages`]).
    can_start: Vec<bool>,
    /// Whether the layer reads a trainable parameter: every stage but the last must hold one
    /// ([`parallel::pipeline::PipelineError::StageWithoutParameters`] otherwise, when a later
    /// stage holds one).
    trains: Vec<bool>,
}

impl CutRules {
    /// The rules of `layers` (each with its forward ops) of `graph`.
    fn of(graph: &Graph, layers: &[(String, Vec<String>)]) -> CutRules {
        let ids = |ops: &[String]| -> Vec<usize> {
            ops.iter()
                .filter_map(|o| graph.node_by_name(o))
                .map(|id| id.0)
                .collect()
        };
        let spans: Vec<(usize, usize)> = layers
            .iter()
            .map(|(_, ops)| {
                let ids = ids(ops);
                let first = ids.iter().copied().min().unwrap_or(0);
                (first, ids.iter().copied().max().unwrap_or(first))
            })
            .collect();
        let can_start = (0..layers.len())
            .map(|i| spans[..i].iter().all(|&(_, last)| last < spans[i].0))
            .collect();
        let trains = layers
            .iter()
            .map(|(_, ops)| {
                ids(ops).into_iter().any(|id| {
                    graph.nodes()[id].inputs.iter().any(|v| {
                        matches!(
                            graph.values()[v.0].kind,
                            graph::ValueKind::Parameter {
                                trainable: true,
                                ..
                            }
                        )
                    })
                })
            })
            .collect();
        CutRules { can_start, trains }
    }
}

/// Contiguous cut of `layers` into `stages` groups minimising the largest group time, each
/// group's memory (`fixed + activations × held[stage]`) at most `budget`, every group beginning
/// where `rules` let a stage begin and every group but the last holding a trainable parameter;
/// `None` when no cut fits. Returns the first layer of every stage.
fn cut(layers: &[LayerCost], rules: &CutRules, held: &[f64], budget: f64) -> Option<Vec<usize>> {
    let n = layers.len();
    // trained[j]: the layers of 0..j that read a trainable parameter.
    let mut trained = vec![0usize; n + 1];
    for i in 0..n {
        trained[i + 1] = trained[i] + usize::from(rules.trains.get(i).copied().unwrap_or(true));
    }
    let stages = held.len();
    let mut prefix = vec![LayerCost::default(); n + 1];
    for (i, l) in layers.iter().enumerate() {
        prefix[i + 1] = LayerCost {
            time: prefix[i].time + l.time,
            fixed: prefix[i].fixed + l.fixed,
            activations: prefix[i].activations + l.activations,
        };
    }
    let span = |i: usize, j: usize| LayerCost {
        time: prefix[j].time - prefix[i].time,
        fixed: prefix[j].fixed - prefix[i].fixed,
        activations: prefix[j].activations - prefix[i].activations,
    };
    // best[s][j]: the least slowest-stage time of layers 0..j cut into s + 1 stages.
    let mut best = vec![vec![f64::INFINITY; n + 1]; stages];
    let mut from = vec![vec![0usize; n + 1]; stages];
    for s in 0..stages {
        for j in (s + 1)..=n {
            let lo = if s == 0 { 0 } else { s };
            let hi = if s == 0 { 0 } else { j - 1 };
            for i in lo..=hi {
                let before = if s == 0 { 0.0 } else { best[s - 1][i] };
                if !before.is_finite() {
                    continue;
                }
                let starts_here = s == 0 || rules.can_start.get(i).copied().unwrap_or(true);
                if !starts_here || (s + 1 < stages && trained[j] == trained[i]) {
                    continue;
                }
                let group = span(i, j);
                if group.fixed + group.activations * held[s] > budget {
                    continue;
                }
                let t = before.max(group.time);
                if t < best[s][j] {
                    best[s][j] = t;
                    from[s][j] = i;
                }
            }
        }
    }
    if !best[stages - 1][n].is_finite() {
        return None;
    }
    let mut starts = vec![0; stages];
    let mut j = n;
    for s in (0..stages).rev() {
        starts[s] = from[s][j];
        j = starts[s];
    }
    Some(starts)
}

/// Scales a plan cost's time and traffic by `factor` (micro-batches per graph batch).
fn scaled(cost: &PlanCost, factor: f64, memory: MemoryEstimate) -> PlanCost {
    PlanCost {
        compute: cost.compute * factor,
        comm: cost.comm * factor,
        comm_bytes: cost.comm_bytes * factor,
        memory,
    }
}

/// What every search of one plan shares.
#[derive(Clone, Copy)]
pub(crate) struct Planner<'a> {
    /// The model (the one micro-batch's, once rebuilt for the stages).
    pub model: &'a dyn PlanModel,
    /// The parallel settings (its `strategies` stay fixed).
    pub parallel: &'a ParallelConfig,
    /// The search algorithm.
    pub mode: SearchMode,
    /// The device profile.
    pub profile: &'a DeviceProfile,
    /// All devices.
    pub devices: usize,
    /// Memory per device, bytes.
    pub budget: u64,
    /// Optimizer state per parameter element, in parameter copies.
    pub optimizer_states: usize,
    /// How long dynamic programming may search.
    pub time_budget: Duration,
    /// Whether the strategies are only costed, not searched (a mode that does not search):
    /// every op of a scope keeps its strategy of `parallel.strategies` (the data-parallel
    /// default on the scope's devices without one), and no memory budget refuses the plan.
    pub costs_only: bool,
}

impl Planner<'_> {
    /// The search over `scope`; ops with a `[parallel.shard]` entry keep it.
    pub(crate) fn search(&self, scope: &SearchScope) -> Result<SearchResult, SearchError> {
        let graph = self.model.graph();
        let fixed = parallel::resolve_op_patterns(graph, &self.parallel.strategies)?
            .into_iter()
            .filter(|(name, _)| scope.only.as_ref().is_none_or(|o| o.contains(name)))
            .map(|(name, s)| (name, s.inputs))
            .collect();
        let (fixed, budget) = match self.costs_only {
            true => (
                with_default_strategies(graph, fixed, scope.devices, scope.only.as_ref()),
                UNLIMITED,
            ),
            false => (fixed, scope.budget),
        };
        let request = SearchRequest {
            mode: self.mode,
            profile: self.profile,
            devices: scope.devices,
            memory_budget: Some(budget),
            optimizer_states: self.optimizer_states,
            fixed,
            hints: self.model.hints(scope.devices),
            time_budget: Some(self.time_budget),
            only: scope.only.clone(),
        };
        // In deterministic mode the searched ops keep to the canonical blocks (the costed
        // strategies are the run's own: its refusal names them).
        let deterministic = (self.parallel.deterministic && !self.costs_only)
            .then_some(self.parallel.deterministic_blocks);
        let references = match self.costs_only {
            true => Vec::new(),
            false => self.model.reference_plans(scope.devices),
        };
        search_with(graph, &request, deterministic, scope.stage, &references)
    }
}

/// What is tried for one stage count.
struct Attempt {
    strategies: Vec<(String, Vec<Vec<usize>>)>,
    plan: PipelinePlan,
}

/// The search with `parallel.auto_pipeline`: every stage count tried, the fastest kept.
pub(crate) fn search_pipelined(planner: &Planner<'_>) -> Result<PipelinedSearch, SearchError> {
    let (model, parallel, devices, budget) = (
        planner.model,
        planner.parallel,
        planner.devices,
        planner.budget,
    );
    if parallel.pipeline.as_ref().is_some_and(|p| p.interleave) {
        return Err(SearchError::Config {
            key: "parallel.auto_pipeline".to_string(),
            reason: "the search chooses non-interleaved pipelines: set [parallel.pipeline] \
                     scheduler to gpipe, 1f1b or zero_bubble"
                .to_string(),
        });
    }
    let layers = model_layers(model.graph());
    let whole = SearchScope {
        devices,
        budget,
        only: None,
        stage: None,
    };
    // Every stage count is checked as the run places it: the dataset strategy splits the
    // inputs over the stage's devices first, and a count it cannot serve is not a candidate.
    let flat = parallel::check_dataset_strategy(model.graph(), parallel, devices)
        .map_err(SearchError::from)
        .and_then(|()| planner.search(&whole));
    let mut best: Option<(f64, PipelinedSearch)> = None;
    // Why each stage count has no plan, for the error when none has.
    let mut misses: Vec<(usize, String)> = Vec::new();
    let mut flat_error = None;
    match flat {
        Ok(result) => {
            let (m, scheduler, batch_cut) = schedule_for(parallel, 1);
            // Without [parallel.pipeline] one stage runs the whole batch at once.
            let m = if batch_cut { m } else { 1 };
            let factor = if batch_cut { m as f64 } else { 1.0 };
            let step = result.cost.time() * factor;
            let plan = PipelinePlan {
                config: PipelineConfig::new(1, m, scheduler),
                layers: layers.iter().map(|(l, _)| (l.clone(), 0)).collect(),
                stage_of_op: BTreeMap::new(),
                stage_costs: vec![scaled(&result.cost, factor, result.cost.memory)],
                makespan: step,
                bubble: 0.0,
                batch_cut,
            };
            best = Some((
                step,
                PipelinedSearch {
                    strategies: result.strategies.clone(),
                    plan,
                    flat: Some(result),
                },
            ));
        }
        Err(e) if e.is_profile_fault() => return Err(e),
        Err(e) => {
            misses.push((1, e.to_string()));
            flat_error = Some(e);
        }
    }
    let mut stages = 2;
    while stages <= layers.len().min(MAX_STAGES) && devices % stages == 0 {
        match try_stages(planner, &layers, stages)? {
            Err(miss) => misses.push((stages, miss)),
            Ok(attempt) => {
                let step = attempt.plan.makespan;
                if best.as_ref().is_none_or(|(t, _)| step < *t) {
                    best = Some((
                        step,
                        PipelinedSearch {
                            strategies: attempt.strategies,
                            plan: attempt.plan,
                            flat: None,
                        },
                    ));
                }
            }
        }
        stages *= 2;
    }
    match (best, flat_error) {
        (Some((_, found)), _) => Ok(found),
        // Only one stage was tried (no other count divides the devices or the layers): its
        // error as it is.
        (None, Some(e)) if misses.len() == 1 => Err(e),
        (None, _) => Err(config_error(format!(
            "no stage count of the {devices} device(s) gives a plan that fits: {}",
            misses
                .iter()
                .map(|(stages, why)| format!("{stages} stage(s): {why}"))
                .collect::<Vec<_>>()
                .join("; ")
        ))),
    }
}

/// A stage count's schedule: the pipeline, its schedule and the micro-batches each stage
/// holds at once.
struct StagePlanShape {
    pipeline: PipelineConfig,
    schedule: parallel::pipeline::Schedule,
    held: Vec<f64>,
    batch_cut: bool,
}

/// The schedule of `stages` stages, or `None` when the scheduler cannot make it.
fn shape(parallel: &ParallelConfig, stages: usize) -> Result<Option<StagePlanShape>, SearchError> {
    let (micro_batches, scheduler, batch_cut) = schedule_for(parallel, stages);
    shape_of(
        PipelineConfig::new(stages, micro_batches, scheduler),
        batch_cut,
    )
}

/// The schedule of `pipeline`, or `None` when the scheduler cannot make it.
fn shape_of(
    pipeline: PipelineConfig,
    batch_cut: bool,
) -> Result<Option<StagePlanShape>, SearchError> {
    let Ok(schedule) = parallel::pipeline::Schedule::generate(&pipeline) else {
        return Ok(None);
    };
    let order = simulate(&schedule, &Durations::uniform(1.0, 1.0, 1.0))
        .map_err(|e| config_error(e.to_string()))?;
    let held: Vec<f64> = order
        .peak_activations
        .iter()
        .map(|&k| k.max(1) as f64)
        .collect();
    Ok(Some(StagePlanShape {
        pipeline,
        schedule,
        held,
        batch_cut,
    }))
}

/// The best plan with `stages` stages, or why there is none (the inner error, worded for the
/// list of stage counts tried).
fn try_stages(
    planner: &Planner<'_>,
    layers: &[(String, Vec<String>)],
    stages: usize,
) -> Result<Result<Attempt, String>, SearchError> {
    let Some(shape) = shape(planner.parallel, stages)? else {
        let (micro_batches, scheduler, _) = schedule_for(planner.parallel, stages);
        return Ok(Err(format!(
            "the {} scheduler cannot run {stages} stages of {micro_batches} micro-batches",
            scheduler.name()
        )));
    };
    // The stages run one micro-batch at a time: cost them on the model of one micro-batch
    // (built here when `[parallel.pipeline]` did not cut the batch already).
    let micro = if shape.batch_cut {
        None
    } else {
        let batch = planner.model.batch_size();
        let m = shape.pipeline.micro_batches;
        if !batch.is_multiple_of(m) {
            return Ok(Err(format!(
                "the batch of {batch} does not split into {m} micro-batches"
            )));
        }
        Some(planner.model.with_batch_size(batch / m)?)
    };
    let planner = match &micro {
        Some(model) => &Planner {
            model: model.as_ref(),
            ..*planner
        },
        None => planner,
    };
    let (sub, budget) = (planner.devices / stages, planner.budget);
    // A micro-batch the dataset strategy cannot split over a stage's devices: the run would
    // refuse this stage count.
    if let Err(e) = parallel::check_dataset_strategy(planner.model.graph(), planner.parallel, sub) {
        return Ok(Err(e.to_string()));
    }
    let costs = match layer_costs(planner, layers, sub) {
        Ok(costs) => costs,
        Err(e) if e.is_profile_fault() => return Err(e),
        Err(e) => return Ok(Err(e.to_string())),
    };
    // 2. Cut the layers into stages.
    let rules = CutRules::of(planner.model.graph(), layers);
    let Some(starts) = cut(&costs, &rules, &shape.held, budget as f64) else {
        if cut(&costs, &rules, &shape.held, f64::INFINITY).is_none() {
            return Ok(Err(format!(
                "no cut of the {} layers into {stages} stages gives every stage but the last a \
                 trainable parameter without cutting between two calls of one cell",
                layers.len()
            )));
        }
        return Ok(Err(format!(
            "no cut of the {} layers into {stages} stages fits {budget} bytes per device",
            layers.len()
        )));
    };
    let stage_of_layer: Vec<usize> = (0..layers.len())
        .map(|i| starts.iter().rposition(|&s| s <= i).unwrap_or(0))
        .collect();
    let activations: Vec<f64> = costs.iter().map(|c| c.activations).collect();
    let staged = match staged(planner, &shape, layers, &stage_of_layer, &activations)? {
        Err(StageMiss::Search(e)) if e.is_profile_fault() => return Err(e),
        other => other,
    };
    Ok(staged.map_err(|miss| match miss {
        StageMiss::Search(e) => e.to_string(),
        StageMiss::Memory { stage, needed } => format!(
            "stage {stage} needs about {} bytes per device",
            needed.ceil() as u64
        ),
    }))
}

/// Step 1 of the module doc: every layer costed from the whole model searched on `sub`
/// devices (its times from the fastest plan, its memory the least any plan needs: the stage
/// searches keep to the budget); the search's error when it fails.
fn layer_costs(
    planner: &Planner<'_>,
    layers: &[(String, Vec<String>)],
    sub: usize,
) -> Result<Vec<LayerCost>, SearchError> {
    let whole = SearchScope {
        devices: sub,
        budget: UNLIMITED,
        only: None,
        stage: None,
    };
    let pre = planner.search(&whole)?;
    let share: BTreeMap<&str, (f64, MemoryEstimate)> = pre
        .strategies
        .iter()
        .zip(pre.op_shares.iter().zip(&pre.op_least_memory))
        .map(|((name, _), ((t, _), m))| (name.as_str(), (*t, *m)))
        .collect();
    let costs = layers
        .iter()
        .map(|(_, ops)| {
            let mut c = LayerCost::default();
            for (t, m) in ops.iter().filter_map(|o| share.get(o.as_str())) {
                c.time += t;
                c.fixed += m.parameters + m.gradients + m.optimizer;
                c.activations += m.activations;
            }
            c
        })
        .collect();
    Ok(costs)
}

/// Why a cut's stage was not planned.
enum StageMiss {
    /// No plan of the stage fits the memory: it needs about `needed` bytes per device.
    Memory {
        /// The stage.
        stage: usize,
        /// Bytes per device its least plan needs, with the micro-batches it holds at once.
        needed: f64,
    },
    /// The stage's search failed otherwise.
    Search(SearchError),
}

/// Steps 3 and 4 of the module doc for a given cut (`stage_of_layer`, with the activations
/// per layer the stage searches leave room for): the inner error names the first stage that
/// was not planned.
fn staged(
    planner: &Planner<'_>,
    shape: &StagePlanShape,
    layers: &[(String, Vec<String>)],
    stage_of_layer: &[usize],
    layer_activations: &[f64],
) -> Result<Result<Attempt, StageMiss>, SearchError> {
    let (model, budget) = (planner.model, planner.budget);
    let stages = shape.pipeline.stages;
    let sub = planner.devices / stages;
    let held = &shape.held;
    let micro_batches = shape.pipeline.micro_batches;
    // A strategy that does not fit a stage's devices names the stage, when the stages are
    // `[parallel.pipeline]`'s (the wording says where their devices come from).
    let configured = planner
        .parallel
        .pipeline
        .as_ref()
        .is_some_and(|p| p.stages == stages && stages > 1);
    // 3. Search every stage on its own devices.
    let mut strategies: BTreeMap<String, Vec<Vec<usize>>> = BTreeMap::new();
    let mut stage_of_op = BTreeMap::new();
    let mut stage_costs = Vec::with_capacity(stages);
    let mut per_micro = Vec::with_capacity(stages);
    for (stage, &held_here) in held.iter().enumerate() {
        let only: BTreeSet<String> = layers
            .iter()
            .zip(stage_of_layer)
            .filter(|(_, &s)| s == stage)
            .flat_map(|((_, ops), _)| ops.iter().cloned())
            .collect();
        let estimated_activations: f64 = layer_activations
            .iter()
            .zip(stage_of_layer)
            .filter(|(_, &s)| s == stage)
            .map(|(a, _)| a)
            .sum();
        // The search counts the activations of one graph batch; the stage holds `held_here`
        // of them (more with micro-batches in flight, less when the batch is cut after).
        let extra = estimated_activations * (held_here - 1.0);
        let scope = SearchScope {
            devices: sub,
            budget: (budget as f64 - extra).clamp(1.0, UNLIMITED as f64) as u64,
            only: Some(only.clone()),
            stage: configured.then_some(PipelineStage {
                stage,
                stages,
                devices: planner.devices,
            }),
        };
        let found = match planner.search(&scope) {
            Ok(found) => found,
            Err(SearchError::MemoryExceeded { needed, .. }) => {
                return Ok(Err(StageMiss::Memory {
                    stage,
                    needed: needed as f64 + extra.max(0.0),
                }))
            }
            Err(e) => return Ok(Err(StageMiss::Search(e))),
        };
        let mut memory = found.cost.memory;
        memory.activations *= held_here;
        // Costed strategies are reported whatever their memory, not refused.
        if memory.total() > budget as f64 && !planner.costs_only {
            return Ok(Err(StageMiss::Memory {
                stage,
                needed: memory.total(),
            }));
        }
        for (name, s) in found.strategies {
            stage_of_op.insert(name.clone(), stage);
            strategies.insert(name, s);
        }
        per_micro.push(found.cost.time());
        stage_costs.push(scaled(&found.cost, micro_batches as f64, memory));
    }
    // 4. The schedule with the stages' predicted times (an action runs one of a stage's
    //    model chunks).
    let chunks = shape.pipeline.chunks().max(1) as f64;
    let third: Vec<f64> = per_micro.iter().map(|t| t / 3.0 / chunks).collect();
    let link = planner.profile.link(planner.devices);
    let boundary = boundary_bytes(model.graph(), &stage_of_op) / sub as f64;
    let durations = Durations::per_stage(third.clone(), third.clone(), third)
        .with_latency(link.alpha + boundary / link.bandwidth);
    let report = simulate(&shape.schedule, &durations).map_err(|e| config_error(e.to_string()))?;
    let busiest = report.busy.iter().copied().fold(0.0, f64::max);
    let mut config_out = shape.pipeline.clone();
    config_out.stage_config = layers
        .iter()
        .zip(stage_of_layer)
        .map(|((l, _), &s)| (l.clone(), s))
        .collect();
    let ordered = model
        .graph()
        .nodes()
        .iter()
        .filter_map(|n| strategies.get(&n.name).map(|s| (n.name.clone(), s.clone())))
        .collect();
    Ok(Ok(Attempt {
        strategies: ordered,
        plan: PipelinePlan {
            config: config_out,
            layers: layers
                .iter()
                .map(|(l, _)| l.clone())
                .zip(stage_of_layer.iter().copied())
                .collect(),
            stage_of_op,
            stage_costs,
            makespan: report.makespan,
            bubble: (report.makespan - busiest).max(0.0),
            batch_cut: shape.batch_cut,
        },
    }))
}

/// The pipeline of strategies loaded from an operator strategy file whose entries name their
/// stages (`planner.parallel.strategies` holds the loaded strategies), costed as a searched
/// one is.
///
/// Under `configured` (`[parallel.pipeline]` stages the run places itself: several, without
/// `parallel.auto_pipeline`) with a `stage_config`, or whose cut by parameter counts places every
/// op where the file does, every entry must name the stage the run places its op on
/// ([`node_stages`], so `stage_config` keys below a layer and calls raised to a later stage
/// included), else the file is refused naming the op and both stages; the pipeline is kept as
/// configured and every op costed on its stage. Otherwise each layer ([`layer_of`]) runs on
/// the stage of its ops, which must be one and must not decrease along the model.
pub(crate) fn plan_loaded_stages(
    planner: &Planner<'_>,
    stage_of_op: &BTreeMap<String, usize>,
    file: &std::path::Path,
    configured: Option<&PipelineConfig>,
) -> Result<PipelinedSearch, SearchError> {
    let key = "parallel.load_operator_strategy_file";
    let bad = |reason: String| SearchError::Config {
        key: key.to_string(),
        reason: format!("{}: {reason}", file.display()),
    };
    // Configured stages without `stage_config` (the count only, the layers cut by parameters)
    // that place the ops elsewhere than the file: the file's pipeline is placed, as a plan of
    // `parallel.auto_pipeline` loaded under its stage count is.
    let configured = match configured {
        Some(pipeline)
            if pipeline.stage_config.is_empty()
                && check_placed_as_loaded(planner, pipeline, stage_of_op).is_err() =>
        {
            None
        }
        other => other,
    };
    let (shape, stages, layers, stage_of_layer) = match configured {
        Some(pipeline) => {
            planner.parallel.validate_pipeline()?;
            check_placed_as_loaded(planner, pipeline, stage_of_op).map_err(bad)?;
            let (layers, stage_of_layer) = configured_layers(planner, pipeline)?;
            let shape = shape_of(pipeline.clone(), true)?;
            (shape, pipeline.stages, layers, stage_of_layer)
        }
        None => {
            let layers = model_layers(planner.model.graph());
            let stage_of_layer = loaded_layer_stages(&layers, stage_of_op).map_err(bad)?;
            let stages = stage_of_op.values().copied().max().unwrap_or(0) + 1;
            if !planner.devices.is_multiple_of(stages) {
                return Err(bad(format!(
                    "its {stages} stages do not divide the {} devices",
                    planner.devices
                )));
            }
            (
                shape(planner.parallel, stages)?,
                stages,
                layers,
                stage_of_layer,
            )
        }
    };
    let shape = shape.ok_or_else(|| bad(format!("the scheduler cannot run {stages} stages")))?;
    let zeros = vec![0.0; layers.len()];
    let attempt =
        staged(planner, &shape, &layers, &stage_of_layer, &zeros)?.map_err(|miss| match miss {
            StageMiss::Search(e) => e,
            StageMiss::Memory { .. } => bad(format!(
                "a stage exceeds {} bytes of memory per device",
                planner.budget
            )),
        })?;
    let mut plan = attempt.plan;
    if let Some(pipeline) = configured {
        plan.config = pipeline.clone();
    }
    Ok(PipelinedSearch {
        strategies: attempt.strategies,
        plan,
        flat: None,
    })
}

/// The stage of every layer of `layers` (by [`layer_of`]) from a loaded file's `stage_of_op`,
/// without a configured pipeline: the one stage its ops name, the stages not decreasing along
/// the model; or why not.
fn loaded_layer_stages(
    layers: &Layers,
    stage_of_op: &BTreeMap<String, usize>,
) -> Result<Vec<usize>, String> {
    let mut stage_of_layer: Vec<usize> = Vec::with_capacity(layers.len());
    for (layer, ops) in layers {
        let named: Vec<(&String, usize)> = ops
            .iter()
            .filter_map(|o| stage_of_op.get(o).map(|&s| (o, s)))
            .collect();
        let Some(&(first_op, first)) = named.first() else {
            return Err(format!("no op of layer {layer:?} has a stage"));
        };
        if let Some(&(other_op, other)) = named.iter().find(|(_, s)| *s != first) {
            return Err(format!(
                "the ops of layer {layer:?} name several stages ({first_op:?} stage {first}, \
                 {other_op:?} stage {other}); without [parallel.pipeline] stages each layer \
                 runs on one stage: configure the pipeline the file was saved with (its stages \
                 and the stage_config naming the cells of {layer:?})"
            ));
        }
        if let Some(&before) = stage_of_layer.last().filter(|&&b| first < b) {
            return Err(format!(
                "the stages must not decrease along the model (layer {layer:?} is on stage \
                 {first}, after a layer on stage {before})"
            ));
        }
        stage_of_layer.push(first);
    }
    Ok(stage_of_layer)
}

/// The layers of the model as the run places `pipeline` ([`node_stages`]: `stage_config`, or
/// the even cut by parameter counts), each with its stage: a cell a `stage_config` key names
/// below one of [`layer_of`]'s layers is a layer of its own ([`staged_layer_of`]), and the ops
/// of a cell the run raises to a later stage (a call reading that stage's output) a layer apart,
/// so that every op is costed on the stage it runs on.
fn configured_layers(
    planner: &Planner<'_>,
    pipeline: &PipelineConfig,
) -> Result<(Layers, Vec<usize>), SearchError> {
    let graph = planner.model.graph();
    let placed = node_stages(graph, pipeline).map_err(|e| ParallelError::Setting {
        setting: "pipeline",
        reason: e.to_string(),
    })?;
    let keys = &pipeline.stage_config;
    // Grouped by cell and stage (a NUL, which no node name holds, between them), then named by
    // the cell alone, as the plan reports its layers.
    let mut layers = layers_by(graph, |id, name| {
        format!("{}\0{}", staged_layer_of(name, keys), placed.nodes[id])
    });
    for (name, _) in &mut layers {
        name.truncate(name.rfind('\0').unwrap_or(name.len()));
    }
    let stages = layers
        .iter()
        .map(|(_, ops)| {
            ops.first()
                .and_then(|op| graph.node_by_name(op))
                .map_or(0, |id| placed.nodes[id.0])
        })
        .collect();
    Ok((layers, stages))
}

/// Checks that the run places every op of `stage_of_op` (a loaded strategy file's stages) on
/// the stage the file gives it under `pipeline` ([`node_stages`]); the first op in graph order
/// that it does not, named with both stages, otherwise.
fn check_placed_as_loaded(
    planner: &Planner<'_>,
    pipeline: &PipelineConfig,
    stage_of_op: &BTreeMap<String, usize>,
) -> Result<(), String> {
    let graph = planner.model.graph();
    let placed = node_stages(graph, pipeline)
        .map_err(|e| format!("the configured [parallel.pipeline] places no op: {e}"))?;
    let moved = graph
        .nodes()
        .iter()
        .zip(&placed.nodes)
        .find_map(|(node, &run)| {
            stage_of_op
                .get(&node.name)
                .filter(|&&file| file != run)
                .map(|&file| (&node.name, file, run))
        });
    match moved {
        None => Ok(()),
        Some((op, file, run)) => Err(format!(
            "op {op:?} is on stage {file} in the file, but the configured [parallel.pipeline] \
             ({} stages, its stage_config) places it on stage {run}: load the file under the \
             pipeline it was saved with",
            pipeline.stages,
        )),
    }
}

/// The pipeline `[parallel.pipeline]` configures (several stages, without
/// `parallel.auto_pipeline`; the model is one micro-batch's): every op on the stage the run
/// places it on ([`node_stages`]), each stage's ops searched on the stage's own devices under
/// the budget less the activations of the micro-batches it holds at once, and the schedule
/// simulated with the stages' predicted times. The configured pipeline is kept as given. With
/// [`Planner::costs_only`] each stage's configured strategies are costed instead of searched,
/// whatever memory they need.
pub(crate) fn plan_configured_stages(
    planner: &Planner<'_>,
) -> Result<PipelinedSearch, SearchError> {
    let pipeline = match planner.parallel.pipeline.as_ref() {
        Some(p) if p.stages > 1 => p.clone(),
        _ => {
            return Err(SearchError::Config {
                key: "parallel.pipeline".to_string(),
                reason: "no pipeline stages are configured".to_string(),
            })
        }
    };
    planner.parallel.validate_pipeline()?;
    let (layers, stage_of_layer) = configured_layers(planner, &pipeline)?;
    let stages = pipeline.stages;
    let shape = shape_of(pipeline.clone(), true)?.ok_or_else(|| SearchError::Config {
        key: "parallel.pipeline".to_string(),
        reason: format!(
            "the scheduler {} cannot run {stages} stages of {} micro-batches",
            pipeline.scheduler.name(),
            pipeline.micro_batches
        ),
    })?;
    let sub = planner.devices / stages;
    // The activations a stage's micro-batches in flight take: as the least plan needs.
    let activations: Vec<f64> = match layer_costs(planner, &layers, sub) {
        Ok(costs) => costs.iter().map(|c| c.activations).collect(),
        Err(_) => vec![0.0; layers.len()],
    };
    let attempt = match staged(planner, &shape, &layers, &stage_of_layer, &activations)? {
        Ok(attempt) => attempt,
        Err(StageMiss::Search(e)) => return Err(e),
        Err(StageMiss::Memory { stage, needed }) => {
            return Err(SearchError::Config {
                key: "parallel.max_device_memory".to_string(),
                reason: format!(
                    "no strategy of pipeline stage {stage} (of {stages}, on {sub} device(s)) fits in {} bytes of device memory ({}): with the {} micro-batch(es) it holds at once it needs about {} bytes per device; raise parallel.max_device_memory to at least that, or use more devices or stages",
                    planner.budget,
                    planner.profile.name,
                    shape.held[stage],
                    needed.ceil() as u64
                ),
            })
        }
    };
    let mut plan = attempt.plan;
    plan.config = pipeline;
    Ok(PipelinedSearch {
        strategies: attempt.strategies,
        plan,
        flat: None,
    })
}

/// Bytes of the graph's batch crossing the busiest stage boundary: every value an op of one
/// stage produces and an op of a later stage reads, summed per boundary it crosses.
fn boundary_bytes(graph: &Graph, stage_of_op: &BTreeMap<String, usize>) -> f64 {
    let stages = stage_of_op.values().copied().max().unwrap_or(0) + 1;
    let mut crossing = vec![0.0f64; stages];
    let mut counted = BTreeSet::new();
    for node in graph.nodes() {
        let Some(&to) = stage_of_op.get(&node.name) else {
            continue;
        };
        for &v in &node.inputs {
            let value = &graph.values()[v.0];
            let Some((producer, _)) = value.producer else {
                continue;
            };
            let from = stage_of_op.get(&graph.nodes()[producer.0].name).copied();
            let Some(from) = from.filter(|&f| f < to) else {
                continue;
            };
            if !counted.insert((v.0, to)) {
                continue;
            }
            let bytes = value.n_elements() as f64 * value.dtype.size_in_bytes() as f64;
            for slot in &mut crossing[from..to] {
                *slot += bytes;
            }
        }
    }
    crossing.into_iter().fold(0.0, f64::max)
}

/// An error of `parallel.auto_pipeline`.
fn config_error(reason: String) -> SearchError {
    SearchError::Config {
        key: "parallel.auto_pipeline".to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(time: f64, fixed: f64, activations: f64) -> LayerCost {
        LayerCost {
            time,
            fixed,
            activations,
        }
    }

    /// Rules letting a stage begin anywhere, every layer holding parameters.
    fn free(n: usize) -> CutRules {
        CutRules {
            can_start: vec![true; n],
            trains: vec![true; n],
        }
    }

    #[test]
    fn the_cut_minimises_the_slowest_stage() {
        let layers = [1.0, 1.0, 1.0, 3.0].map(|t| layer(t, 0.0, 0.0));
        // [1, 1, 1 | 3]: the slowest stage takes 3, any other cut more.
        assert_eq!(cut(&layers, &free(4), &[1.0, 1.0], 100.0), Some(vec![0, 3]));
        assert_eq!(
            cut(&layers, &free(4), &[1.0; 4], 100.0),
            Some(vec![0, 1, 2, 3])
        );
    }

    /// A stage never begins where a cell called again later would be cut from its later call,
    /// and every stage but the last holds a trainable parameter: the best cut the run accepts.
    #[test]
    fn the_cut_keeps_a_cells_calls_together_and_parameters_on_every_stage() {
        let layers = [1.0, 1.0, 1.0, 3.0].map(|t| layer(t, 0.0, 0.0));
        let mut rules = free(4);
        rules.can_start[3] = false;
        assert_eq!(cut(&layers, &rules, &[1.0, 1.0], 100.0), Some(vec![0, 2]));
        let mut rules = free(4);
        rules.trains = vec![true, true, false, true];
        // [1, 1 | 1 | 3] would leave stage 1 without parameters.
        assert_eq!(cut(&layers, &rules, &[1.0; 3], 100.0), Some(vec![0, 1, 3]));
        rules.trains = vec![false; 4];
        assert_eq!(cut(&layers, &rules, &[1.0, 1.0], 100.0), None);
    }

    #[test]
    fn the_cut_keeps_every_stage_in_memory_or_fails() {
        // Time alone would cut [1, 1 | 1, 1]; stage 0 holds 3 micro-batches of activations,
        // so it can only take one layer under 40 bytes.
        let layers = [layer(1.0, 10.0, 10.0); 4];
        assert_eq!(cut(&layers, &free(4), &[1.0, 1.0], 100.0), Some(vec![0, 2]));
        assert_eq!(cut(&layers, &free(4), &[3.0, 1.0], 40.0), None);
        assert_eq!(cut(&layers, &free(4), &[3.0, 1.0], 60.0), Some(vec![0, 1]));
    }
}
