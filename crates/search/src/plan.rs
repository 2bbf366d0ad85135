//! The crate's one entry: [`plan`] takes a [`PlanRequest`] (a model, its parallel settings, a
//! device profile and where the strategies come from) and returns a [`PlanReport`] (every
//! forward op's strategy, the predicted cost of one step, the pipeline when one was chosen).
//!
//! The caller builds the model and reads the files: the request holds a [`PlanModel`] (the
//! graph, the model's own candidate strategies, and how to rebuild it for one micro-batch) and,
//! for an operator strategy file, its entries already read ([`LoadedStrategies`]), so this crate
//! knows neither the training configuration, the built-in networks nor the file formats.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use graph::Graph;
use parallel::rules::strategy::PipelineStage;
use parallel::{OpStrategy, ParallelConfig, ParallelMode, SearchMode};

use crate::cost::DeviceProfile;
use crate::error::SearchError;
use crate::pipeline::{
    plan_configured_stages, plan_loaded_stages, search_pipelined, PipelinePlan, Planner,
};
use crate::problem::PlanCost;
use crate::solve::{evaluate_strategies, SearchRequest};

/// Candidate strategies by op name: for every op, a list of strategies (one split tuple per
/// input).
pub type Hints = BTreeMap<String, Vec<Vec<Vec<usize>>>>;

/// The network a plan is made for, as its caller builds it.
///
/// The searches read its forward graph; they ask it for the model's own candidates on a
/// device count (a GPT's Megatron layouts); and `parallel.auto_pipeline`, costing stages on
/// one micro-batch, has it rebuilt for a smaller batch.
pub trait PlanModel {
    /// The graph whose forward ops are planned.
    fn graph(&self) -> &Graph;

    /// Extra candidate strategies on `devices` devices, added to those of the op rules.
    fn hints(&self, devices: usize) -> Hints;

    /// Whole plans on `devices` devices a user could write without searching (a GPT's Megatron
    /// splits, as a mode that does not search places them): op name → strategy, the ops a
    /// plan leaves out data parallel. A heuristic search returns none slower than the fastest
    /// of these (nor than data parallel) that fits the memory budget. None by default.
    fn reference_plans(&self, devices: usize) -> Vec<BTreeMap<String, Vec<Vec<usize>>>> {
        let _ = devices;
        Vec::new()
    }

    /// The global batch the graph is built for.
    fn batch_size(&self) -> usize;

    /// The same network built for a global batch of `batch_size` (a divisor of
    /// [`PlanModel::batch_size`]); the caller's own error goes in [`SearchError::Model`].
    fn with_batch_size(&self, batch_size: usize) -> Result<Box<dyn PlanModel>, SearchError>;
}

/// The layouts a loaded operator strategy file gives one op.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedLayouts {
    /// One layout per input, when the in_strategy is layout-valued.
    pub inputs: Option<Vec<layout::Layout>>,
    /// One layout per output, when the out_strategy is layout-valued.
    pub outputs: Option<Vec<layout::Layout>>,
}

/// One op's entry of an operator strategy file.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedOp {
    /// The op's name.
    pub name: String,
    /// Its pipeline stage (0 when the file names none).
    pub stage: usize,
    /// Its input strategy as split factors.
    pub inputs: Vec<Vec<usize>>,
    /// Its output strategy as split factors, when the file gives one (as split tuples, or as
    /// layouts in `layouts.outputs`: then their split factors).
    pub outputs: Option<Vec<Vec<usize>>>,
    /// Its layout-valued strategies, when the entry gives layouts.
    pub layouts: LoadedLayouts,
}

/// The strategies of an operator strategy file (`parallel.load_operator_strategy_file`), read
/// by the caller.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedStrategies {
    /// The file, named in errors and in the report.
    pub file: PathBuf,
    /// Its entries, in the file's order.
    pub ops: Vec<LoadedOp>,
}

/// Where a plan's strategies come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategies {
    /// Searched by the algorithm of `parallel.mode` (a search mode).
    Search,
    /// Loaded from an operator strategy file instead of searched (`parallel.mode` a search
    /// mode); costed, and pipelined when its entries name stages.
    Loaded(LoadedStrategies),
    /// Given for the forward ops by a mode that does not search (the run's configured
    /// strategies); only costed, the ops without one data parallel, and pipelined (each stage
    /// costed on its own devices) when `[parallel.pipeline]` configures several stages.
    Configured(BTreeMap<String, Vec<Vec<usize>>>),
}

/// What a plan is asked.
pub struct PlanRequest<'a> {
    /// The network.
    pub model: &'a dyn PlanModel,
    /// The parallel settings: the mode (the search algorithm), the devices, the strategies of
    /// `[parallel.shard]` (kept fixed), the pipeline and the dataset strategy.
    pub parallel: &'a ParallelConfig,
    /// The device profile, already specialised to the run's ranks
    /// ([`DeviceProfile::for_ranks`]).
    pub profile: DeviceProfile,
    /// Memory per device, bytes (`parallel.max_device_memory`; the profile's when `None`).
    pub max_device_memory: Option<u64>,
    /// Optimizer state per trainable parameter element, in parameter copies (Adam: 2).
    pub optimizer_states: usize,
    /// How long dynamic programming may search (`parallel.search_time_budget`).
    pub time_budget: Duration,
    /// Whether the search also chooses the pipeline (`parallel.auto_pipeline`).
    pub auto_pipeline: bool,
    /// Where the strategies come from.
    pub strategies: Strategies,
}

/// What a plan predicts for one step, and how it was found.
#[derive(Debug, Clone)]
pub struct PlanReport {
    /// The mode planned (`dynamic_programming`, …, or `semi_auto` for a configured plan).
    pub mode: String,
    /// Devices (per pipeline stage when pipelined).
    pub devices: usize,
    /// The device profile.
    pub profile: DeviceProfile,
    /// Memory per device the plan had to fit, bytes.
    pub memory_budget: u64,
    /// Every forward op's strategy, in graph order.
    pub strategies: Vec<(String, Vec<Vec<usize>>)>,
    /// The predicted cost of one step (per stage when pipelined).
    pub cost: PlanCost,
    /// The pipeline's idle fraction (0 without stages).
    pub bubble_fraction: f64,
    /// The search's wall time, ms (0 when the strategies were loaded or configured). The
    /// runtime, which searches a GPT on two graphs (`auto::faster_plan`), reports both
    /// searches' time in the plan it keeps.
    pub search_ms: f64,
    /// The search's optimality gap bound, when not proven optimal. `None` also for a pipeline
    /// of several stages (`pipeline`), whose layer cut is a heuristic without a bound.
    pub gap: Option<f64>,
    /// Ops and distinct op classes searched.
    pub n_ops: usize,
    /// Distinct op classes (ops alike share candidates).
    pub n_classes: usize,
    /// Where the strategies came from when not searched.
    pub loaded_from: Option<PathBuf>,
    /// The layout-valued strategies of a loaded operator strategy file, by op name: the
    /// layouts of its inputs and, when given, of its outputs. `strategies` holds their split
    /// factors.
    pub layouts: BTreeMap<String, LoadedLayouts>,
    /// The out_strategies a loaded operator strategy file gives as split tuples (not layouts:
    /// those are in `layouts`), by op name; placed with the op's strategy and saved back.
    pub out_strategies: BTreeMap<String, Vec<Vec<usize>>>,
    /// The pipeline planned stage by stage: the one the search chose (`parallel.auto_pipeline`),
    /// the one `[parallel.pipeline]` configures (several stages: searched in a search mode,
    /// costed with the configured strategies otherwise), or the
    /// stages of a loaded operator strategy file; `cost` is then its busiest stage's time per
    /// step with its fullest stage's memory, and `bubble_fraction` the busiest stage's idle
    /// share.
    pub pipeline: Option<PipelinePlan>,
}

impl PlanReport {
    /// Whether the strategies were searched (and so kept to the memory budget by the search's
    /// own estimate), not loaded from a file nor costed as configured.
    pub fn was_searched(&self) -> bool {
        self.loaded_from.is_none() && self.search_ms > 0.0
    }

    /// Whether the plan splits no op over its several devices: every device repeats the whole
    /// step (no splittable dim divides by the device count).
    pub fn splits_nothing(&self) -> bool {
        self.devices > 1
            && self
                .strategies
                .iter()
                .flat_map(|(_, tuples)| tuples.iter().flatten())
                .all(|&factor| factor == 1)
    }

    /// Seconds of idle pipeline time per step.
    pub fn bubble_seconds(&self) -> f64 {
        let busy = self.cost.time();
        if self.bubble_fraction >= 1.0 {
            return 0.0;
        }
        busy * self.bubble_fraction / (1.0 - self.bubble_fraction)
    }

    /// Predicted step time in milliseconds: compute, communication and bubble.
    pub fn step_ms(&self) -> f64 {
        (self.cost.time() + self.bubble_seconds()) * 1e3
    }

    /// The pipeline stage of op `name` (0 without a pipeline).
    pub fn stage_of(&self, name: &str) -> usize {
        self.pipeline
            .as_ref()
            .and_then(|p| p.stage_of_op.get(name).copied())
            .unwrap_or(0)
    }

    /// Puts the plan into `parallel`, which is then placed as `semi_auto` places a user's
    /// strategies: every op's strategy (its loaded layouts when it has them) and the chosen
    /// pipeline's stage count and stages. A pipeline of several stages needs the batch cut
    /// into micro-batches before the model is built: without that, an error names what to add.
    pub fn apply_to(self, parallel: &mut ParallelConfig) -> Result<(), SearchError> {
        if let Some(plan) = &self.pipeline {
            if plan.config.stages > 1 && !plan.batch_cut {
                // The stages come from the search, or from a loaded file's entries.
                let (key, chose) = match &self.loaded_from {
                    Some(file) => (
                        "parallel.load_operator_strategy_file",
                        format!("{} places its ops on", file.display()),
                    ),
                    None => ("parallel.auto_pipeline", "the search chose".to_string()),
                };
                return Err(SearchError::Config {
                    key: key.to_string(),
                    reason: format!(
                        "{chose} {} pipeline stages; training them needs the batch cut into micro-batches before the model is built: add [parallel.pipeline] with stages = 1 and micro_batches = {} (tessera plan shows the plan without it)",
                        plan.config.stages, plan.config.micro_batches
                    ),
                });
            }
            // The searched stage count replaces `[parallel.pipeline]`'s (one stage included).
            if plan.config.stages > 1 || parallel.pipeline.is_some() {
                let mut pipeline = parallel
                    .pipeline
                    .clone()
                    .unwrap_or_else(|| plan.config.clone());
                pipeline.stages = plan.config.stages;
                pipeline.stage_config = plan.config.stage_config.clone();
                parallel.pipeline = Some(pipeline);
            }
        }
        for (name, inputs) in self.strategies {
            let layouts = self.layouts.get(&name).cloned();
            let (ins, outs) = layouts.map_or((None, None), |l| (l.inputs, l.outputs));
            let strategy = match ins {
                Some(layouts) => OpStrategy::from_layouts(layouts, None),
                None => OpStrategy::from_tuples(inputs, None),
            };
            let strategy = match (outs, self.out_strategies.get(&name)) {
                (Some(layouts), _) => strategy.with_out_layouts(layouts),
                (None, Some(tuples)) => strategy.with_out_tuples(tuples.clone()),
                (None, None) => strategy,
            };
            parallel.strategies.insert(name, strategy);
        }
        Ok(())
    }
}

/// Where a search runs: its devices, its memory per device and the ops it covers.
#[derive(Debug, Clone)]
pub(crate) struct SearchScope {
    /// Devices (of the stage).
    pub devices: usize,
    /// Memory per device, bytes.
    pub budget: u64,
    /// The forward ops searched (a pipeline stage's), every one when `None`.
    pub only: Option<BTreeSet<String>>,
    /// The pipeline stage of `[parallel.pipeline]` whose ops `only` are (`devices` are its
    /// own), named when one of their strategies does not fit: `None` when the run is not
    /// pipelined or the ops are not one configured stage's.
    pub stage: Option<PipelineStage>,
}

/// Devices per pipeline stage and the schedule's idle fraction.
fn stage_devices(parallel: &ParallelConfig) -> (usize, f64) {
    let devices = parallel.effective_devices();
    match parallel.pipeline.as_ref().filter(|p| p.stages > 1) {
        Some(p) => {
            let durations = parallel::pipeline::Durations::uniform(1.0, 2.0, 0.0);
            let bubble = parallel::pipeline::Schedule::generate(p)
                .and_then(|s| parallel::pipeline::simulate(&s, &durations))
                .map_or(0.0, |r| r.bubble_fraction);
            (devices / p.stages, bubble)
        }
        None => (devices, 0.0),
    }
}

/// Checks that every op of `loaded` exists in `graph`.
fn check_loaded(graph: &Graph, loaded: &LoadedStrategies) -> Result<(), SearchError> {
    match loaded
        .ops
        .iter()
        .find(|r| graph.node_by_name(&r.name).is_none())
    {
        Some(r) => Err(SearchError::Config {
            key: "parallel.load_operator_strategy_file".to_string(),
            reason: format!(
                "{} has a strategy for op {:?}, which the model does not have",
                loaded.file.display(),
                r.name
            ),
        }),
        None => Ok(()),
    }
}

/// Plans a run without starting ranks: searches (in a search mode), or costs the strategies
/// loaded from an operator strategy file or configured by a mode that does not search.
///
/// Every figure of the report is finite: a cost the model computes that is not (a profile out
/// of what it can use) is an error naming the profile and what was costed
/// ([`SearchError::NonFiniteCost`]), never a plan.
pub fn plan(request: &PlanRequest<'_>) -> Result<PlanReport, SearchError> {
    let report = plan_unchecked(request)?;
    let mut figures = vec![
        ("the predicted step time (ms)", report.step_ms()),
        ("the pipeline's idle fraction", report.bubble_fraction),
    ];
    if let Some(p) = &report.pipeline {
        figures.push(("the pipeline's makespan (s)", p.makespan));
        figures.push(("the pipeline's bubble (s)", p.bubble));
        for c in &p.stage_costs {
            figures.push(("a pipeline stage's time (s)", c.time()));
            figures.push(("a pipeline stage's memory", c.memory.total()));
        }
    }
    if let Some((what, value)) = figures.into_iter().find(|(_, v)| !v.is_finite()) {
        return Err(SearchError::NonFiniteCost {
            profile: request.profile.name.clone(),
            what: what.to_string(),
            value,
        });
    }
    Ok(report)
}

/// [`plan`] without the final check that its figures are finite.
fn plan_unchecked(request: &PlanRequest<'_>) -> Result<PlanReport, SearchError> {
    let parallel = request.parallel;
    let graph = request.model.graph();
    let profile = &request.profile;
    let (devices, bubble_fraction) = stage_devices(parallel);
    let budget = request.max_device_memory.unwrap_or(profile.memory_bytes);
    let costing = SearchRequest {
        mode: SearchMode::DynamicProgramming,
        profile,
        devices,
        memory_budget: Some(budget),
        optimizer_states: request.optimizer_states,
        fixed: BTreeMap::new(),
        hints: BTreeMap::new(),
        time_budget: None,
        only: None,
    };
    let costed = |mode: String,
                  strategies: &BTreeMap<String, Vec<Vec<usize>>>,
                  from,
                  layouts: BTreeMap<String, LoadedLayouts>| {
        let cost = evaluate_strategies(graph, &costing, strategies)?;
        let strategies = graph
            .nodes()
            .iter()
            .filter(|n| n.role == graph::NodeRole::Forward && !n.inputs.is_empty())
            .filter_map(|n| strategies.get(&n.name).map(|s| (n.name.clone(), s.clone())))
            .collect();
        Ok::<PlanReport, SearchError>(PlanReport {
            mode,
            devices,
            profile: profile.clone(),
            memory_budget: budget,
            strategies,
            cost,
            bubble_fraction,
            search_ms: 0.0,
            gap: None,
            n_ops: 0,
            n_classes: 0,
            loaded_from: from,
            layouts,
            out_strategies: BTreeMap::new(),
            pipeline: None,
        })
    };
    let mode = match (parallel.mode, &request.strategies) {
        (other, Strategies::Configured(configured)) if configured_stages(parallel) => {
            // The configured stages, each stage's ops costed with their strategies on its own
            // devices (as the run places them), whatever memory they need.
            let mut with_configured = parallel.clone();
            with_configured.strategies = configured
                .iter()
                .map(|(name, s)| (name.clone(), OpStrategy::from_tuples(s.clone(), None)))
                .collect();
            let mut report = plan_pipelined(
                request,
                &with_configured,
                SearchMode::DynamicProgramming,
                budget,
                Instant::now(),
                Staging::Configured,
            )?;
            report.mode = other.name().to_string();
            report.search_ms = 0.0;
            (report.gap, report.n_ops, report.n_classes) = (None, 0, 0);
            return Ok(report);
        }
        (other, Strategies::Configured(configured)) => {
            return costed(other.name().to_string(), configured, None, BTreeMap::new());
        }
        (ParallelMode::Auto(mode), _) => mode,
        (other, _) => {
            return Err(SearchError::Config {
                key: "parallel.mode".to_string(),
                reason: format!(
                    "{:?} does not search: only configured strategies are costed in it",
                    other.name()
                ),
            })
        }
    };
    if let Strategies::Loaded(loaded) = &request.strategies {
        check_loaded(graph, loaded)?;
        let file = &loaded.file;
        let layouts: BTreeMap<String, LoadedLayouts> = loaded
            .ops
            .iter()
            .filter(|r| r.layouts.inputs.is_some() || r.layouts.outputs.is_some())
            .map(|r| (r.name.clone(), r.layouts.clone()))
            .collect();
        let out_strategies: BTreeMap<String, Vec<Vec<usize>>> = loaded
            .ops
            .iter()
            .filter(|r| r.layouts.outputs.is_none())
            .filter_map(|r| Some((r.name.clone(), r.outputs.clone()?)))
            .collect();
        let stage_of_op: BTreeMap<String, usize> = loaded
            .ops
            .iter()
            .map(|r| (r.name.clone(), r.stage))
            .collect();
        // A pipelined plan, costed per stage: its stages from the entries' `stage`; or, for
        // entries without stages under configured stages, the stages the run places them on
        // (the loaded strategies kept, an op without one searched as the run would place it).
        let staging = match loaded.ops.iter().any(|r| r.stage > 0) {
            true => Some(Staging::Loaded(&stage_of_op, file)),
            false => configured_stages(parallel).then_some(Staging::Configured),
        };
        if let Some(staging) = staging {
            let mut with_loaded = parallel.clone();
            for r in &loaded.ops {
                with_loaded.strategies.insert(
                    r.name.clone(),
                    OpStrategy::from_tuples(r.inputs.clone(), r.outputs.clone()),
                );
            }
            let mut report =
                plan_pipelined(request, &with_loaded, mode, budget, Instant::now(), staging)?;
            report.search_ms = 0.0;
            report.gap = None;
            report.loaded_from = Some(file.clone());
            // Placed by its layouts whatever the stages (costed by their split factors).
            report.layouts = layouts;
            report.out_strategies = out_strategies;
            return Ok(report);
        }
        let strategies = loaded
            .ops
            .iter()
            .map(|r| (r.name.clone(), r.inputs.clone()))
            .collect();
        let mut report = costed(
            mode.name().to_string(),
            &strategies,
            Some(file.clone()),
            layouts,
        )?;
        report.out_strategies = out_strategies;
        return Ok(report);
    }
    if !request.auto_pipeline {
        // The run places the inputs by the dataset strategy first: a plan it would refuse is
        // refused here too, not costed.
        parallel::check_dataset_strategy(graph, parallel, devices)?;
    }
    let start = Instant::now();
    if request.auto_pipeline {
        return plan_pipelined(request, parallel, mode, budget, start, Staging::Search);
    }
    if configured_stages(parallel) {
        // The configured stages, each searched on its own devices (as the run places them).
        return plan_pipelined(request, parallel, mode, budget, start, Staging::Configured);
    }
    let scope = SearchScope {
        devices,
        budget,
        only: None,
        stage: None,
    };
    let result = planner(request, parallel, mode, budget).search(&scope)?;
    Ok(PlanReport {
        mode: mode.name().to_string(),
        devices,
        profile: profile.clone(),
        memory_budget: budget,
        strategies: result.strategies,
        cost: result.cost,
        bubble_fraction,
        search_ms: start.elapsed().as_secs_f64() * 1e3,
        gap: result.gap,
        n_ops: result.n_ops,
        n_classes: result.n_classes,
        loaded_from: None,
        layouts: BTreeMap::new(),
        out_strategies: BTreeMap::new(),
        pipeline: None,
    })
}

/// The searches of `request` under `parallel` (its strategies kept fixed) with `mode`.
fn planner<'a>(
    request: &'a PlanRequest<'a>,
    parallel: &'a ParallelConfig,
    mode: SearchMode,
    budget: u64,
) -> Planner<'a> {
    Planner {
        model: request.model,
        parallel,
        mode,
        profile: &request.profile,
        devices: parallel.effective_devices(),
        budget,
        optimizer_states: request.optimizer_states,
        time_budget: request.time_budget,
        costs_only: matches!(request.strategies, Strategies::Configured(_)),
    }
}

/// Whether `[parallel.pipeline]` configures several stages.
fn configured_stages(parallel: &ParallelConfig) -> bool {
    parallel.pipeline.as_ref().is_some_and(|p| p.stages > 1)
}

/// Where the stages of a pipelined plan come from.
enum Staging<'a> {
    /// Searched with the strategies (`parallel.auto_pipeline`).
    Search,
    /// Configured by `[parallel.pipeline]`, as the run places them.
    Configured,
    /// The stage per op of a loaded operator strategy file (the file).
    Loaded(&'a BTreeMap<String, usize>, &'a Path),
}

/// [`plan`] stage by stage: with `parallel.auto_pipeline` the stage count searched too; the
/// stages `[parallel.pipeline]` configures; or the pipeline of loaded strategies whose file
/// names their stages.
fn plan_pipelined(
    request: &PlanRequest<'_>,
    parallel: &ParallelConfig,
    mode: SearchMode,
    budget: u64,
    start: Instant,
    staging: Staging<'_>,
) -> Result<PlanReport, SearchError> {
    let planner = planner(request, parallel, mode, budget);
    let found = match staging {
        Staging::Loaded(stage_of_op, file) => {
            // `[parallel.pipeline]`'s stages place the ops unless the search chooses them
            // (`parallel.auto_pipeline`, which ignores the configured count).
            let configured = parallel
                .pipeline
                .as_ref()
                .filter(|p| p.stages > 1 && !request.auto_pipeline);
            plan_loaded_stages(&planner, stage_of_op, file, configured)?
        }
        Staging::Configured => plan_configured_stages(&planner)?,
        Staging::Search => search_pipelined(&planner)?,
    };
    let plan = found.plan;
    // Time of the busiest stage, memory of the fullest.
    let mut cost = plan.stage_costs[plan.busiest()].clone();
    cost.memory = plan
        .stage_costs
        .iter()
        .map(|c| c.memory)
        .max_by(|a, b| a.total().total_cmp(&b.total()))
        .unwrap_or(cost.memory);
    let bubble_fraction = if plan.makespan > 0.0 {
        plan.bubble / plan.makespan
    } else {
        0.0
    };
    // A pipeline's layer cut is a heuristic: no gap is bounded (the stages show it).
    let (gap, n_ops, n_classes) = found
        .flat
        .as_ref()
        .map_or((None, found.strategies.len(), 0), |r| {
            (r.gap, r.n_ops, r.n_classes)
        });
    Ok(PlanReport {
        mode: mode.name().to_string(),
        devices: planner.devices / plan.config.stages,
        profile: request.profile.clone(),
        memory_budget: budget,
        strategies: found.strategies,
        cost,
        bubble_fraction,
        search_ms: start.elapsed().as_secs_f64() * 1e3,
        gap,
        n_ops,
        n_classes,
        loaded_from: None,
        layouts: BTreeMap::new(),
        out_strategies: BTreeMap::new(),
        pipeline: Some(plan),
    })
}
