//! Automatic parallel for a run: the device profile, the search over the model's forward ops
//! (or the strategies of an operator strategy file), and the plan report `tessera plan` prints.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ckpt::OpStrategyRecord;
use exec::OptimizerKind;
use graph::models::{seed_mlp, Model};
use models::{GptConfig, GptParallel};
use parallel::search::{
    batch_splits, evaluate_strategies, profiles, search, DeviceProfile, PlanCost, SearchMode,
    SearchRequest, SearchResult,
};
use parallel::{OpStrategy, ParallelConfig, ParallelMode};

use crate::auto_pipeline::{plan_loaded_stages, search_pipelined, PipelinePlan, Planner};
use crate::config::{ModelName, ProfileChoice, TrainConfig};
use crate::data::IdxDataset;
use crate::error::RuntimeError;
use crate::lm::TextData;

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
    /// The search's wall time, ms (0 when the strategies were loaded or configured).
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
    /// The pipeline the search chose (`parallel.auto_pipeline`); `cost` is then its busiest
    /// stage's per step and `bubble_fraction` that stage's idle share.
    pub pipeline: Option<PipelinePlan>,
}

/// The layouts a loaded operator strategy file gives one op.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedLayouts {
    /// One layout per input, when the in_strategy is layout-valued.
    pub inputs: Option<Vec<layout::Layout>>,
    /// One layout per output, when the out_strategy is layout-valued.
    pub outputs: Option<Vec<layout::Layout>>,
}

impl PlanReport {
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

    /// The strategies as operator strategy records.
    pub fn records(&self) -> Vec<OpStrategyRecord> {
        self.strategies
            .iter()
            .map(|(name, inputs)| {
                let layouts = self.layouts.get(name);
                let out_layouts = layouts.and_then(|l| l.outputs.clone());
                OpStrategyRecord {
                    name: name.clone(),
                    stage: self
                        .pipeline
                        .as_ref()
                        .and_then(|p| p.stage_of_op.get(name).copied())
                        .unwrap_or(0),
                    inputs: inputs.clone(),
                    outputs: out_layouts
                        .as_ref()
                        .map(|o| o.iter().map(layout::Layout::split_factors).collect()),
                    in_layouts: layouts.and_then(|l| l.inputs.clone()),
                    out_layouts,
                }
            })
            .collect()
    }
}

/// The device profile `choice` names.
pub fn load_profile(choice: &ProfileChoice) -> Result<DeviceProfile, RuntimeError> {
    match choice {
        ProfileChoice::BuiltIn(name) => {
            profiles::built_in(name).ok_or_else(|| RuntimeError::Config {
                key: "parallel.device_profile".to_string(),
                reason: format!(
                    "unknown profile {name:?} (built in: {})",
                    profiles::BUILT_IN.join(", ")
                ),
            })
        }
        ProfileChoice::File(path) if !path.exists() => Err(RuntimeError::Config {
            key: "parallel.device_profile".to_string(),
            reason: format!(
                "{} is neither a built-in profile ({}) nor an existing profile file",
                path.display(),
                profiles::BUILT_IN.join(", ")
            ),
        }),
        ProfileChoice::File(path) => crate::device_profile::read(path),
    }
}

/// Optimizer state per parameter element, in parameter copies.
fn optimizer_states(config: &TrainConfig) -> usize {
    match config.optimizer_config().kind {
        OptimizerKind::Sgd => 0,
        OptimizerKind::Momentum { .. } => 1,
        _ => 2,
    }
}

/// The model a config trains, built from its data's shapes (the data is opened, not read
/// whole), with the GPT's shape when it is one.
pub fn build_model(config: &TrainConfig) -> Result<(Model, Option<GptConfig>), RuntimeError> {
    if config.model().name == ModelName::Gpt {
        let (_, gpt, model) = open_gpt(config)?;
        return Ok((model, Some(gpt)));
    }
    let data = config.data();
    let (train, _) = IdxDataset::open_train_and_test(&data.dir, data.pixel_max, data.normalize)?;
    let model = seed_mlp(
        data.batch_size,
        &train.image_shape(),
        config.model().hidden,
        config.model().classes,
    )?;
    Ok((model, None))
}

/// The GPT of `[model]` on the text of `[data]`: the text, the GPT's shape and the model.
pub(crate) fn open_gpt(config: &TrainConfig) -> Result<(TextData, GptConfig, Model), RuntimeError> {
    let keys = config
        .data()
        .text
        .as_ref()
        .ok_or_else(|| RuntimeError::Config {
            key: "data.format".to_string(),
            reason: "the GPT trains on text: set data.format = \"text\" or \"tokens\"".to_string(),
        })?;
    let text = TextData::open(config, keys)?;
    let gpt = text.gpt_config(config)?;
    let model = models::gpt(&gpt, config.train().precision.dtype())?;
    Ok((text, gpt, model))
}

/// The GPT's Megatron strategies for every split of the devices, every vocabulary and
/// sequence choice: candidates the search adds to those of the op rules.
fn gpt_hints(
    gpt: &GptConfig,
    model: &Model,
    devices: usize,
) -> BTreeMap<String, Vec<Vec<Vec<usize>>>> {
    let mut hints: BTreeMap<String, Vec<Vec<Vec<usize>>>> = BTreeMap::new();
    for mp in batch_splits(devices) {
        for vocab_emb_dp in [true, false] {
            for seq in [false, true] {
                let Ok(split) = GptParallel::resolve(devices, None, mp, vocab_emb_dp, seq) else {
                    continue;
                };
                if split.check(gpt).is_err() {
                    continue;
                }
                let Ok(strategies) = split.strategies(&model.graph) else {
                    continue;
                };
                for (name, s) in strategies {
                    let list = hints.entry(name).or_default();
                    if !list.contains(&s.inputs) {
                        list.push(s.inputs);
                    }
                }
            }
        }
    }
    hints
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
}

/// The search of `mode` for `model` under `config`; ops with a `[parallel.shard]` entry keep it.
pub(crate) fn run_search(
    config: &TrainConfig,
    model: &Model,
    gpt: Option<&GptConfig>,
    parallel: &ParallelConfig,
    mode: SearchMode,
    profile: &DeviceProfile,
    scope: &SearchScope,
) -> Result<SearchResult, RuntimeError> {
    let devices = scope.devices;
    let fixed = parallel::resolve_op_patterns(&model.graph, &parallel.strategies)?
        .into_iter()
        .filter(|(name, _)| scope.only.as_ref().is_none_or(|o| o.contains(name)))
        .map(|(name, s)| (name, s.inputs))
        .collect();
    let hints = gpt.map_or_else(BTreeMap::new, |g| gpt_hints(g, model, devices));
    let request = SearchRequest {
        mode,
        profile,
        devices,
        memory_budget: Some(scope.budget),
        optimizer_states: optimizer_states(config),
        fixed,
        hints,
        time_budget: Some(Duration::from_secs_f64(config.search().search_time_budget)),
        only: scope.only.clone(),
    };
    Ok(search(&model.graph, &request)?)
}

/// Reads the strategies of `parallel.load_operator_strategy_file`, checking every op exists.
fn load_strategies(path: &Path, model: &Model) -> Result<Vec<OpStrategyRecord>, RuntimeError> {
    let records = ckpt::read_operator_strategy_file(path)?;
    if let Some(r) = records
        .iter()
        .find(|r| model.graph.node_by_name(&r.name).is_none())
    {
        return Err(RuntimeError::Config {
            key: "parallel.load_operator_strategy_file".to_string(),
            reason: format!(
                "{} has a strategy for op {:?}, which the model does not have",
                path.display(),
                r.name
            ),
        });
    }
    Ok(records)
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

/// Plans `config`'s run without starting ranks: with a search mode, searches (or loads
/// `parallel.load_operator_strategy_file`); otherwise costs the configured strategies.
pub fn plan(config: &TrainConfig) -> Result<PlanReport, RuntimeError> {
    let (model, gpt) = build_model(config)?;
    plan_model(config, &model, gpt.as_ref())
}

/// [`plan`] for a model already built.
pub fn plan_model(
    config: &TrainConfig,
    model: &Model,
    gpt: Option<&GptConfig>,
) -> Result<PlanReport, RuntimeError> {
    let parallel = config.parallel_config();
    // Every rank of the run shares a profile's `compute_slots` (its cores) when it has them.
    let profile =
        load_profile(&config.search().device_profile)?.for_ranks(parallel.effective_devices());
    let (devices, bubble_fraction) = stage_devices(&parallel);
    let budget = config
        .search()
        .max_device_memory
        .unwrap_or(profile.memory_bytes);
    let request = SearchRequest {
        mode: SearchMode::DynamicProgramming,
        profile: &profile,
        devices,
        memory_budget: Some(budget),
        optimizer_states: optimizer_states(config),
        fixed: BTreeMap::new(),
        hints: BTreeMap::new(),
        time_budget: None,
        only: None,
    };
    let costed = |mode: String,
                  strategies: BTreeMap<String, Vec<Vec<usize>>>,
                  from,
                  layouts: BTreeMap<String, LoadedLayouts>| {
        let cost = evaluate_strategies(&model.graph, &request, &strategies)?;
        let strategies = model
            .graph
            .nodes()
            .iter()
            .filter(|n| n.role == graph::NodeRole::Forward && !n.inputs.is_empty())
            .filter_map(|n| strategies.get(&n.name).map(|s| (n.name.clone(), s.clone())))
            .collect();
        Ok::<PlanReport, RuntimeError>(PlanReport {
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
            pipeline: None,
        })
    };
    let mode = match parallel.mode {
        ParallelMode::Auto(mode) => mode,
        other => {
            let configured = configured_strategies(config, model, gpt, parallel.clone())?;
            return costed(other.name().to_string(), configured, None, BTreeMap::new());
        }
    };
    if let Some(path) = &config.search().load_operator_strategy_file {
        let records = load_strategies(path, model)?;
        let layouts = records
            .iter()
            .filter(|r| r.in_layouts.is_some() || r.out_layouts.is_some())
            .map(|r| {
                let loaded = LoadedLayouts {
                    inputs: r.in_layouts.clone(),
                    outputs: r.out_layouts.clone(),
                };
                (r.name.clone(), loaded)
            })
            .collect();
        if records.iter().any(|r| r.stage > 0) {
            // A pipelined plan: its stages from the entries' `stage`, costed per stage.
            let stage_of_op: BTreeMap<String, usize> =
                records.iter().map(|r| (r.name.clone(), r.stage)).collect();
            let mut with_loaded = parallel.clone();
            for r in records {
                with_loaded
                    .strategies
                    .insert(r.name, OpStrategy::from_tuples(r.inputs, None));
            }
            let mut report = plan_pipelined(
                config,
                model,
                gpt,
                &with_loaded,
                mode,
                profile,
                budget,
                Instant::now(),
                Some((&stage_of_op, path)),
            )?;
            report.search_ms = 0.0;
            report.gap = None;
            report.loaded_from = Some(path.clone());
            return Ok(report);
        }
        let loaded = records.into_iter().map(|r| (r.name, r.inputs)).collect();
        return costed(mode.name().to_string(), loaded, Some(path.clone()), layouts);
    }
    if !config.search().auto_pipeline {
        // The run places the inputs by the dataset strategy first: a plan it would refuse is
        // refused here too, not costed.
        parallel::check_dataset_strategy(&model.graph, &parallel, devices)?;
    }
    let start = Instant::now();
    if config.search().auto_pipeline {
        return plan_pipelined(
            config, model, gpt, &parallel, mode, profile, budget, start, None,
        );
    }
    let scope = SearchScope {
        devices,
        budget,
        only: None,
    };
    let result = run_search(config, model, gpt, &parallel, mode, &profile, &scope)?;
    Ok(PlanReport {
        mode: mode.name().to_string(),
        devices,
        profile,
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
        pipeline: None,
    })
}

/// [`plan_model`] with `parallel.auto_pipeline`: the stage count searched too; or the
/// pipeline of `loaded` strategies whose file names their stages (stage per op, the file).
#[allow(clippy::too_many_arguments)]
fn plan_pipelined(
    config: &TrainConfig,
    model: &Model,
    gpt: Option<&GptConfig>,
    parallel: &ParallelConfig,
    mode: SearchMode,
    profile: DeviceProfile,
    budget: u64,
    start: Instant,
    loaded: Option<(&BTreeMap<String, usize>, &Path)>,
) -> Result<PlanReport, RuntimeError> {
    let devices = parallel.effective_devices();
    let planner = Planner {
        config,
        model,
        gpt,
        parallel,
        mode,
        profile: &profile,
        devices,
        budget,
    };
    let found = match loaded {
        Some((stage_of_op, file)) => plan_loaded_stages(&planner, stage_of_op, file)?,
        None => search_pipelined(&planner)?,
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
        devices: devices / plan.config.stages,
        profile,
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
        pipeline: Some(plan),
    })
}

/// The strategies a non-search mode gives every forward op (a GPT's from its MindFormers keys,
/// `[parallel.shard]`, the data-parallel default for the rest).
fn configured_strategies(
    config: &TrainConfig,
    model: &Model,
    gpt: Option<&GptConfig>,
    parallel: ParallelConfig,
) -> Result<BTreeMap<String, Vec<Vec<usize>>>, RuntimeError> {
    let devices = parallel.effective_devices();
    let parallel = match gpt {
        Some(g) => crate::lm::gpt_parallel_config(config, g, model, parallel)?,
        None => parallel,
    };
    let mut out: BTreeMap<String, Vec<Vec<usize>>> = match parallel.mode {
        ParallelMode::SemiAuto => {
            parallel::resolve_op_patterns(&model.graph, &parallel.strategies)?
                .into_iter()
                .map(|(n, s)| (n, s.inputs))
                .collect()
        }
        _ => BTreeMap::new(),
    };
    for node in model.graph.nodes() {
        if node.role != graph::NodeRole::Forward || node.inputs.is_empty() {
            continue;
        }
        out.entry(node.name.clone()).or_insert_with(|| {
            let ctx = parallel::rules::OpContext::of(&model.graph, node);
            match parallel.mode {
                ParallelMode::StandAlone => parallel::rules::strategy::unsplit_strategy(&ctx),
                _ => parallel::rules::strategy::default_strategy(&ctx, devices),
            }
        });
    }
    Ok(out)
}

/// For a run in a search mode: the strategies of every forward op, searched (or loaded from
/// `parallel.load_operator_strategy_file`), written to `parallel.save_operator_strategy_file`
/// when set, and put into `parallel` (which is placed as `semi_auto` then).
pub(crate) fn apply_search(
    config: &TrainConfig,
    model: &Model,
    gpt: Option<&GptConfig>,
    parallel: &mut ParallelConfig,
) -> Result<(), RuntimeError> {
    if !matches!(parallel.mode, ParallelMode::Auto(_)) {
        return Ok(());
    }
    let report = plan_model(config, model, gpt)?;
    if let Some(path) = &config.search().save_operator_strategy_file {
        ckpt::write_operator_strategy_file(path, &report.records())?;
    }
    if let Some(plan) = &report.pipeline {
        if plan.config.stages > 1 && !plan.batch_cut {
            return Err(RuntimeError::Config {
                key: "parallel.auto_pipeline".to_string(),
                reason: format!(
                    "the search chose {} pipeline stages; training them needs the batch cut into micro-batches before the model is built: add [parallel.pipeline] with stages = 1 and micro_batches = {} (tessera plan shows the plan without it)",
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
    for (name, inputs) in report.strategies {
        let layouts = report.layouts.get(&name).cloned();
        let (ins, outs) = layouts.map_or((None, None), |l| (l.inputs, l.outputs));
        let strategy = match ins {
            Some(layouts) => OpStrategy::from_layouts(layouts, None),
            None => OpStrategy::from_tuples(inputs, None),
        };
        let strategy = match outs {
            Some(layouts) => strategy.with_out_layouts(layouts),
            None => strategy,
        };
        parallel.strategies.insert(name, strategy);
    }
    Ok(())
}
