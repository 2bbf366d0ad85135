//! Automatic parallel for a run: the training configuration translated into a
//! [`search::PlanRequest`] (the device profile, the model and its GPT hints, the strategies of
//! an operator strategy file or of a mode that does not search), the plan `search::plan` makes,
//! and the operator strategy records `tessera plan` and a run save.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ckpt::OpStrategyRecord;
use graph::models::{seed_mlp, Model};
use graph::Graph;
use models::{GptConfig, GptParallel, GptParallelKeys};
use parallel::{ParallelConfig, ParallelMode};
use search::{
    batch_splits, profiles, DeviceProfile, Hints, LoadedLayouts, LoadedOp, LoadedStrategies,
    PlanModel, PlanReport, PlanRequest, SearchError, Strategies,
};

use crate::config::{ModelName, ProfileChoice, TrainConfig};
use crate::data::IdxDataset;
use crate::error::RuntimeError;
use crate::lm::TextData;
use crate::session::SearchedPlan;

/// The operator strategy records of `report` (what `parallel.save_operator_strategy_file`
/// and `tessera plan` write): every op's strategy, its stage, its loaded layouts and its loaded
/// out_strategy.
pub fn operator_strategy_records(report: &PlanReport) -> Vec<OpStrategyRecord> {
    report
        .strategies
        .iter()
        .map(|(name, inputs)| {
            let layouts = report.layouts.get(name);
            let out_layouts = layouts.and_then(|l| l.outputs.clone());
            OpStrategyRecord {
                name: name.clone(),
                stage: report.stage_of(name),
                inputs: inputs.clone(),
                outputs: match &out_layouts {
                    Some(o) => Some(o.iter().map(layout::Layout::split_factors).collect()),
                    None => report.out_strategies.get(name).cloned(),
                },
                in_layouts: layouts.and_then(|l| l.inputs.clone()),
                out_layouts,
            }
        })
        .collect()
}

/// The device profile `choice` names (the value of `parallel.device_profile`).
pub fn load_profile(choice: &ProfileChoice) -> Result<DeviceProfile, RuntimeError> {
    load_profile_as(choice, "parallel.device_profile")
}

/// [`load_profile`] of the profile `setting` chose (the config key, or a flag such as `tessera
/// plan --profile`): every error names `setting`, and the file when there is one.
pub fn load_profile_as(
    choice: &ProfileChoice,
    setting: &str,
) -> Result<DeviceProfile, RuntimeError> {
    let bad = |reason: String| RuntimeError::Config {
        key: setting.to_string(),
        reason,
    };
    match choice {
        ProfileChoice::BuiltIn(name) => profiles::built_in(name).ok_or_else(|| {
            bad(format!(
                "unknown profile {name:?} (built in: {})",
                profiles::BUILT_IN.join(", ")
            ))
        }),
        ProfileChoice::File(path) if path.as_os_str().is_empty() => {
            Err(bad(crate::config::empty_profile()))
        }
        ProfileChoice::File(path) if !path.exists() => Err(bad(format!(
            "{} is neither a built-in profile ({}) nor an existing profile file",
            path.display(),
            profiles::BUILT_IN.join(", ")
        ))),
        ProfileChoice::File(path) if path.is_dir() => Err(bad(format!(
            "{} is a directory, not a profile file (a TOML file, as `tessera bench profile --out` writes)",
            path.display()
        ))),
        ProfileChoice::File(path) => {
            search::device_profile::read(path).map_err(|e| bad(e.to_string()))
        }
    }
}

/// Optimizer state per parameter element, in parameter copies (three for AMSGrad Adam).
fn optimizer_states(config: &TrainConfig) -> usize {
    config.optimizer_config().kind.state_names().len()
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

/// The GPT a search mode also searches: `gpt` with the packed attention (`PackedAttention`,
/// reading the QKV projection's layout in place, without the cut and the transposes around
/// `FlashAttention`), where the configuration keeps the sequence whole. A search mode builds
/// `gpt` with `FlashAttention`, whose sequence split (ring attention) is among its candidates;
/// on the packed graph the plans that keep the sequence whole cost less. `None` when `gpt` is
/// not built that way (no search mode, the unfused attention, or a ring configured).
pub(crate) fn packed_alternative(
    config: &TrainConfig,
    gpt: &GptConfig,
) -> Result<Option<(GptConfig, Model)>, RuntimeError> {
    let split = config.gpt_parallel();
    let searched = matches!(config.parallel_config().mode, ParallelMode::Auto(_));
    if !searched
        || gpt.packed_attention
        || !gpt.builds_fused_attention()
        || !split
            .context_parallel_algo
            .keeps_the_sequence_whole(split.context_parallel)
    {
        return Ok(None);
    }
    let packed = GptConfig {
        packed_attention: true,
        ..gpt.clone()
    };
    let model = models::gpt(&packed, config.train().precision.dtype())?;
    Ok(Some((packed, model)))
}

/// The GPT's Megatron strategies for every split of the devices over model and context
/// parallel, every vocabulary and sequence choice, and (with MoE blocks) every expert-parallel
/// split of the data-parallel ranks: candidates the search adds to those of the op rules.
/// (Context parallel's attention core enters as its split tuples.)
fn gpt_hints(gpt: &GptConfig, model: &Model, devices: usize) -> Hints {
    let mut hints = Hints::new();
    for plan in gpt_plans(gpt, model, devices) {
        for (name, s) in plan {
            let list = hints.entry(name).or_default();
            if !list.contains(&s) {
                list.push(s);
            }
        }
    }
    hints
}

/// The GPT's Megatron plans on `devices` devices, one per split [`gpt_hints`] takes its
/// candidates from (the strategies a `semi_auto` run of that split gives the ops, by op name):
/// the whole plans a search returns none slower than ([`PlanModel::reference_plans`]).
fn gpt_plans(
    gpt: &GptConfig,
    model: &Model,
    devices: usize,
) -> Vec<BTreeMap<String, Vec<Vec<usize>>>> {
    let mut plans = Vec::new();
    for mp in batch_splits(devices) {
        for cp in batch_splits(devices / mp) {
            for vocab_emb_dp in [true, false] {
                for seq in [false, true] {
                    let keys = GptParallelKeys {
                        model_parallel: mp,
                        context_parallel: cp,
                        vocab_emb_dp,
                        use_seq_parallel: seq,
                        ..GptParallelKeys::default()
                    };
                    plans.extend(gpt_plan(gpt, model, devices, &keys));
                }
            }
        }
        // Expert splits change only the MoE blocks' ops: one pass per split suffices.
        let experts = gpt.moe.as_ref().map_or(1, |moe| moe.experts);
        for ep in batch_splits((devices / mp).min(experts))
            .into_iter()
            .skip(1)
        {
            let keys = GptParallelKeys {
                model_parallel: mp,
                expert_parallel: ep,
                ..GptParallelKeys::default()
            };
            plans.extend(gpt_plan(gpt, model, devices, &keys));
        }
    }
    plans
}

/// The strategies of one resolved GPT split by op name, if the split fits the model.
fn gpt_plan(
    gpt: &GptConfig,
    model: &Model,
    devices: usize,
    keys: &GptParallelKeys,
) -> Option<BTreeMap<String, Vec<Vec<usize>>>> {
    let split = GptParallel::resolve(devices, keys).ok()?;
    split.check(gpt).ok()?;
    let strategies = split.strategies(&model.graph).ok()?;
    Some(
        strategies
            .into_iter()
            .map(|(name, s)| (name, s.inputs))
            .collect(),
    )
}

/// A run's model as the search sees it: the graph, the GPT's Megatron hints, and the config
/// to rebuild it from for one micro-batch.
struct RunModel<'a> {
    config: &'a TrainConfig,
    model: &'a Model,
    gpt: Option<&'a GptConfig>,
}

/// A [`RunModel`] rebuilt for a smaller batch, owning what it is built from.
struct RebuiltModel {
    config: TrainConfig,
    model: Model,
    gpt: Option<GptConfig>,
}

impl RebuiltModel {
    fn run(&self) -> RunModel<'_> {
        RunModel {
            config: &self.config,
            model: &self.model,
            gpt: self.gpt.as_ref(),
        }
    }
}

impl PlanModel for RunModel<'_> {
    fn graph(&self) -> &Graph {
        &self.model.graph
    }

    fn hints(&self, devices: usize) -> Hints {
        self.gpt
            .map_or_else(BTreeMap::new, |g| gpt_hints(g, self.model, devices))
    }

    fn reference_plans(&self, devices: usize) -> Vec<BTreeMap<String, Vec<Vec<usize>>>> {
        self.gpt
            .map_or_else(Vec::new, |g| gpt_plans(g, self.model, devices))
    }

    fn batch_size(&self) -> usize {
        self.config.data().batch_size
    }

    fn with_batch_size(&self, batch_size: usize) -> Result<Box<dyn PlanModel>, SearchError> {
        let rebuild = || {
            let config = self.config.clone().with_batch_size(batch_size)?;
            let (model, gpt) = build_model(&config)?;
            Ok::<_, RuntimeError>(RebuiltModel { config, model, gpt })
        };
        match rebuild() {
            Ok(rebuilt) => Ok(Box::new(rebuilt)),
            Err(e) => Err(SearchError::Model(Box::new(e))),
        }
    }
}

impl PlanModel for RebuiltModel {
    fn graph(&self) -> &Graph {
        &self.model.graph
    }

    fn hints(&self, devices: usize) -> Hints {
        self.run().hints(devices)
    }

    fn reference_plans(&self, devices: usize) -> Vec<BTreeMap<String, Vec<Vec<usize>>>> {
        self.run().reference_plans(devices)
    }

    fn batch_size(&self) -> usize {
        self.run().batch_size()
    }

    fn with_batch_size(&self, batch_size: usize) -> Result<Box<dyn PlanModel>, SearchError> {
        self.run().with_batch_size(batch_size)
    }
}

/// Reads the strategies of `parallel.load_operator_strategy_file` (the search checks every op
/// exists).
fn load_strategies(path: &Path) -> Result<LoadedStrategies, RuntimeError> {
    let ops = ckpt::read_operator_strategy_file(path)?
        .into_iter()
        .map(|r| LoadedOp {
            name: r.name,
            stage: r.stage,
            inputs: r.inputs,
            outputs: r.outputs,
            layouts: LoadedLayouts {
                inputs: r.in_layouts,
                outputs: r.out_layouts,
            },
        })
        .collect();
    Ok(LoadedStrategies {
        file: path.to_path_buf(),
        ops,
    })
}

/// Plans `config`'s run without starting ranks: with a search mode, searches (or loads
/// `parallel.load_operator_strategy_file`); otherwise costs the configured strategies.
pub fn plan(config: &TrainConfig) -> Result<PlanReport, RuntimeError> {
    // Before the model is built, as a training session checks it.
    config.parallel_config().validate_pipeline()?;
    crate::preflight::check_config_paths(config, true)?;
    let (model, gpt) = build_model(config).map_err(|e| config.data().explain_batch_error(e))?;
    let packed = match &gpt {
        Some(gpt) => packed_alternative(config, gpt)?,
        None => None,
    };
    // The graph a training session would choose: see `search_gpt` in `session::build`.
    let built = plan_model(config, &model, gpt.as_ref());
    let packed = packed.map(|(gpt, model)| plan_model(config, &model, Some(&gpt)));
    faster_plan(built, packed, |r: &mut PlanReport| Some(r))
        .map_err(|e| config.data().explain_batch_error(e))
}

/// Of two plans of one configuration on different graphs ([`packed_alternative`]), the one
/// whose report (`report`; `None`: not searched, an infinitely long step) predicts the shorter
/// step: `built` on a tie, or when `packed` is absent or failed; `packed` when `built` failed.
/// The kept report's `search_ms` is both searches' time, the whole search the caller waited
/// for (a failed search's own time is not known).
pub(crate) fn faster_plan<T>(
    built: Result<T, RuntimeError>,
    packed: Option<Result<T, RuntimeError>>,
    report: impl Fn(&mut T) -> Option<&mut PlanReport>,
) -> Result<T, RuntimeError> {
    let Some(Ok(mut packed)) = packed else {
        return built;
    };
    let step_ms = |plan: &mut T| report(plan).map_or(f64::INFINITY, |r| r.step_ms());
    let Ok(mut built) = built else {
        return Ok(packed);
    };
    let (mut kept, mut other) = match step_ms(&mut built) <= step_ms(&mut packed) {
        true => (built, packed),
        false => (packed, built),
    };
    let other_ms = report(&mut other).map_or(0.0, |r| r.search_ms);
    if let Some(r) = report(&mut kept) {
        r.search_ms += other_ms;
    }
    Ok(kept)
}

/// [`plan`] for a model already built.
pub fn plan_model(
    config: &TrainConfig,
    model: &Model,
    gpt: Option<&GptConfig>,
) -> Result<PlanReport, RuntimeError> {
    plan_model_within(config, model, gpt, config.search().max_device_memory)
}

/// [`plan_model`] with the searches kept to `max_device_memory` bytes of their own estimate
/// per device (`parallel.max_device_memory`, or a tighter figure when a plan's predicted peak
/// exceeded it: [`crate::TrainSession`]'s re-search).
fn plan_model_within(
    config: &TrainConfig,
    model: &Model,
    gpt: Option<&GptConfig>,
    max_device_memory: Option<u64>,
) -> Result<PlanReport, RuntimeError> {
    // The run's strategies: `[parallel.shard]`'s, and `parallel.strategy_file`'s for the ops
    // it leaves unset; a search keeps both fixed.
    let parallel = crate::session::parallel_config(config, model)?;
    // Every rank of the run shares a profile's `compute_slots` (its cores) when it has them.
    let profile =
        load_profile(&config.search().device_profile)?.for_ranks(parallel.effective_devices());
    let strategies = match parallel.mode {
        ParallelMode::Auto(_) => match &config.search().load_operator_strategy_file {
            Some(path) => Strategies::Loaded(load_strategies(path)?),
            None => Strategies::Search,
        },
        _ => Strategies::Configured(configured_strategies(config, model, gpt, parallel.clone())?),
    };
    let request = PlanRequest {
        model: &RunModel { config, model, gpt },
        parallel: &parallel,
        profile,
        max_device_memory,
        optimizer_states: optimizer_states(config),
        time_budget: Duration::from_secs_f64(config.search().search_time_budget),
        auto_pipeline: config.search().auto_pipeline,
        strategies,
    };
    let report = search::plan(&request).map_err(|e| worded_as_the_run(config, e))?;
    Ok(per_optimizer_step(config, report))
}

/// `report`'s time and communication per optimizer step, which runs the training program once
/// per micro-step: `train.grad_accumulation_steps` of them, times the micro-batches
/// `parallel.pipeline.micro_batches` and `parallel.micro_batch_interleave` cut the batch into
/// (the config's accumulation count includes those cuts). The search costs the model it is
/// given, one micro-batch once the batch is cut, and a pipeline's schedule (its makespan and
/// stage costs) counts that pipeline's micro-batches itself; the rest is multiplied here.
/// Memory is a micro-step's. Interleaved parts are counted one after the other, as MPI runs
/// them (the local backend's overlap of one part's communication with another's compute is
/// not modelled).
fn per_optimizer_step(config: &TrainConfig, mut report: PlanReport) -> PlanReport {
    let micro_steps = config.train().grad_accumulation_steps.max(1);
    let counted = match &report.pipeline {
        Some(p) if p.batch_cut => p.config.micro_batches.max(1),
        _ => 1,
    };
    let factor = (micro_steps / counted).max(1) as f64;
    if factor == 1.0 {
        return report;
    }
    let scale = |cost: &mut search::PlanCost| {
        cost.compute *= factor;
        cost.comm *= factor;
        cost.comm_bytes *= factor;
    };
    scale(&mut report.cost);
    if let Some(p) = &mut report.pipeline {
        p.stage_costs.iter_mut().for_each(scale);
        p.makespan *= factor;
        p.bubble *= factor;
    }
    report
}

/// A search's error `e` worded as the run's compile words it: a strategy a `[parallel.shard]`
/// key gave names the key (one that does not fit a pipeline stage's devices names the stage
/// and where its device count comes from already, as the search refuses it), so that
/// `tessera plan` (and a search mode's run, which plans first) says what `tessera train` of the
/// same strategy says.
fn worded_as_the_run(config: &TrainConfig, e: SearchError) -> RuntimeError {
    match e {
        SearchError::Parallel(error) => crate::session::name_shard_key(config, error),
        e => e.into(),
    }
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
    // The run places the inputs by the dataset strategy first (over one stage's devices): a
    // plan the run would refuse (a batch the devices do not divide) is refused here too, not
    // costed with the ops' default strategies, which split the batch only as far as it goes.
    let stage_devices = match parallel.pipeline.as_ref().filter(|p| p.stages > 1) {
        Some(p) => devices / p.stages,
        None => devices,
    };
    parallel::check_dataset_strategy(&model.graph, &parallel, stage_devices)?;
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
                _ => parallel::rules::strategy::default_strategy(&ctx, stage_devices),
            }
        });
    }
    Ok(out)
}

/// For a run in a search mode: the strategies of every forward op, searched (or loaded from
/// `parallel.load_operator_strategy_file`), put into `parallel` (which is placed as
/// `semi_auto` then). Returns what the run checks and writes before its ranks start
/// ([`crate::check_before_start`]: the predicted peak of a searched plan against
/// `parallel.max_device_memory`, then `parallel.save_operator_strategy_file`); `None` outside
/// the search modes. `search_budget`: the search's memory budget per device when not
/// `parallel.max_device_memory` (a re-search's tighter one).
pub(crate) fn apply_search(
    config: &TrainConfig,
    (model, gpt): (&Model, Option<&GptConfig>),
    parallel: &mut ParallelConfig,
    search_budget: Option<u64>,
) -> Result<Option<SearchedPlan>, RuntimeError> {
    if !matches!(parallel.mode, ParallelMode::Auto(_)) {
        return Ok(None);
    }
    let budget = search_budget.or(config.search().max_device_memory);
    let mut report = plan_model_within(config, model, gpt, budget)?;
    if let (Some(_), Some(user)) = (search_budget, config.search().max_device_memory) {
        // The plan is held to the user's budget: the tighter one only steered the search.
        report.memory_budget = user;
    }
    let plan = SearchedPlan {
        searched: report.was_searched(),
        estimate: report.cost.memory.total(),
        records: operator_strategy_records(&report),
        report: report.clone(),
    };
    report.apply_to(parallel)?;
    Ok(Some(plan))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report predicting `step_ms` found by a search of `search_ms`.
    fn report(step_ms: f64, search_ms: f64) -> PlanReport {
        PlanReport {
            mode: "dynamic_programming".to_string(),
            devices: 2,
            profile: profiles::built_in("h100-nvlink-ib").unwrap(),
            memory_budget: 1,
            strategies: Vec::new(),
            cost: search::PlanCost {
                compute: step_ms / 1e3,
                comm: 0.0,
                comm_bytes: 0.0,
                memory: search::MemoryEstimate::default(),
            },
            bubble_fraction: 0.0,
            search_ms,
            gap: None,
            n_ops: 0,
            n_classes: 0,
            loaded_from: None,
            layouts: BTreeMap::new(),
            out_strategies: BTreeMap::new(),
            pipeline: None,
        }
    }

    /// The plan kept is the faster graph's, and its `search_ms` the time of both searches (the
    /// whole search the user waited for), whichever graph wins.
    #[test]
    fn the_faster_plan_reports_both_searches_time() {
        fn keep(r: &mut PlanReport) -> Option<&mut PlanReport> {
            Some(r)
        }
        let kept = faster_plan(Ok(report(2.0, 3.0)), Some(Ok(report(1.0, 5.0))), keep).unwrap();
        assert_eq!((kept.step_ms(), kept.search_ms), (1.0, 8.0));
        let kept = faster_plan(Ok(report(1.0, 3.0)), Some(Ok(report(2.0, 5.0))), keep).unwrap();
        assert_eq!((kept.step_ms(), kept.search_ms), (1.0, 8.0));
        // Without a second graph, the one search's time.
        let kept = faster_plan(Ok(report(1.0, 3.0)), None, keep).unwrap();
        assert_eq!(kept.search_ms, 3.0);
    }
}
