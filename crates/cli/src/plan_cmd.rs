//! `tessera plan`: a dry run that searches (or costs) a run's strategies without starting ranks,
//! prints the plan and writes the operator strategy file `tessera train` then uses.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use runtime::{human_bytes, PlanReport, ProfileChoice, TrainConfig};

use crate::stdout::{outln, write_stdout};

/// Arguments of `tessera plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The training configuration (TOML; see docs/CONFIG.md). `parallel.mode` picks the search
    /// (`sharding_propagation`, `recursive_programming`, `dynamic_programming`); any other mode
    /// costs the configured strategies.
    config: PathBuf,
    /// Override `parallel.devices`.
    #[arg(long)]
    devices: Option<usize>,
    /// The device profile: a built-in name (h100-nvlink-ib, ascend910b-hccs-roce) or a profile
    /// TOML file (`tessera bench profile` writes cpu-local.toml). Overrides
    /// `parallel.device_profile`.
    #[arg(long, value_name = "NAME|FILE")]
    profile: Option<String>,
    /// Override one key, `section.key=value`; repeatable.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    sets: Vec<String>,
    /// Print the plan as one JSON object.
    #[arg(long)]
    json: bool,
    /// Report the search's own memory estimate instead of the peak `tessera train --explain`
    /// predicts: the run's programs are not compiled, which at thousands of devices takes
    /// seconds, but the estimate misses what the compiled step adds (pipeline micro-batches in
    /// flight, the backward's values, redistributions) and can be several times too low; a
    /// searched plan is then checked against the budget by the estimate only.
    #[arg(long)]
    estimate_memory: bool,
}

/// Runs `tessera plan`.
pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    crate::train_cmd::check_config_file(&args.config)?;
    let mut config = TrainConfig::load_on(&args.config, &args.sets, args.devices)?;
    if let Some(p) = &args.profile {
        let base = std::env::current_dir()?;
        let choice = ProfileChoice::parse(p, &base);
        // Read now, so that a bad profile is reported against the flag, not the config key.
        runtime::load_profile_as(&choice, "--profile")?;
        let mut search = config.search().clone();
        search.device_profile = choice;
        config = config.with_search(search);
    }
    for warning in config.warnings() {
        eprintln!("warning: {warning}");
    }
    let configured_stages = config
        .parallel_config()
        .pipeline
        .as_ref()
        .map_or(1, |p| p.stages.max(1));
    let (report, memory) = plan_with_memory(&config, args.estimate_memory, configured_stages)?;
    // What the compiled program caps or skips beyond what the configuration's warnings said,
    // as `tessera train` prints it.
    if let PlanMemory::Predicted { warnings, .. } = &memory {
        for warning in warnings {
            eprintln!("warning: {warning}");
        }
    }
    memory.check_budget(&report)?;
    let file = config
        .search()
        .save_operator_strategy_file
        .clone()
        .unwrap_or_else(|| config.output().dir.join("operator_strategy.json"));
    // Creates the missing directories, and removes them again when the write fails.
    ckpt::write_operator_strategy_file(&file, &runtime::operator_strategy_records(&report))?;
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&to_json(&report, &memory, &file, configured_stages))?
        )?;
    } else {
        let auto_pipeline = config.search().auto_pipeline;
        write_stdout(&describe(
            &report,
            &memory,
            &file,
            configured_stages,
            auto_pipeline,
        ))?;
    }
    Ok(())
}

/// A plan's memory per device as its run will hold it.
///
/// The search ranks strategies by a cheap estimate ([`search::MemoryEstimate`]: what each op
/// holds, summed as if all were held at once) that misses what the compiled step adds: the
/// micro-batches a pipeline stage holds in flight, the backward's own values, the
/// redistributions' destinations, the micro-batch sums. The plan reports instead the
/// prediction `tessera train --explain` makes ([`parallel::memory`]): the run's session built
/// for the same configuration (so the same plan) and its training program walked rank by rank.
enum PlanMemory {
    /// Predicted: per pipeline stage (one without stages), its fullest rank and that rank's
    /// figures; with the warnings of the session predicted ([`runtime::TrainSession::warnings`]).
    Predicted {
        stages: Vec<(usize, parallel::memory::MemoryReport)>,
        warnings: Vec<String>,
    },
    /// Not predicted (why): the search's estimate stands in.
    Estimated(String),
}

impl PlanMemory {
    /// The memory of `session`'s run, which places `report` (`stages` pipeline stages).
    fn of(session: &runtime::Session, report: &PlanReport, stages: usize) -> PlanMemory {
        match predict_session(session, report, stages) {
            Ok((stages, warnings)) => PlanMemory::Predicted { stages, warnings },
            Err(why) => PlanMemory::Estimated(why),
        }
    }

    /// The fullest rank and its figures, when predicted.
    fn fullest(&self) -> Option<(usize, parallel::memory::MemoryReport)> {
        match self {
            PlanMemory::Predicted { stages, .. } => stages
                .iter()
                .copied()
                .max_by_key(|(rank, m)| (m.peak, std::cmp::Reverse(*rank))),
            PlanMemory::Estimated(_) => None,
        }
    }

    /// Bytes per device of the fullest rank (of the fullest stage).
    fn peak(&self, report: &PlanReport) -> f64 {
        self.fullest()
            .map_or(report.cost.memory.total(), |(_, m)| m.peak as f64)
    }

    /// Bytes per device of each pipeline stage's fullest rank.
    fn stage_peaks(&self, p: &runtime::PipelinePlan) -> Vec<f64> {
        match self {
            PlanMemory::Predicted { stages, .. } => {
                stages.iter().map(|(_, m)| m.peak as f64).collect()
            }
            PlanMemory::Estimated(_) => p.stage_costs.iter().map(|c| c.memory.total()).collect(),
        }
    }

    /// A searched plan (the search keeps to the budget) whose predicted peak exceeds
    /// `parallel.max_device_memory` (or the profile's memory) is refused: the search's estimate
    /// fit, the run would not. Strategies loaded or configured are only costed: a note says it.
    fn check_budget(&self, report: &PlanReport) -> anyhow::Result<()> {
        let Some((rank, m)) = self.fullest() else {
            return Ok(());
        };
        let searched = report.was_searched();
        if !searched || m.peak as u64 <= report.memory_budget {
            return Ok(());
        }
        // The words `tessera train` refuses the same plan with.
        Err(runtime::TrainSession::over_memory_budget(
            m.peak,
            rank,
            report.memory_budget,
            report.cost.memory.total(),
        )
        .into())
    }
}

/// The figures of [`PlanMemory::Predicted`]: per stage its fullest rank and that rank's
/// figures, and the session's warnings.
type Predicted = (Vec<(usize, parallel::memory::MemoryReport)>, Vec<String>);

/// The plan of `config` (`configured_stages`: its `[parallel.pipeline]` stages) and its
/// memory per device.
///
/// The memory is predicted as `tessera train --explain` predicts it, from the run's session
/// built for planning (its training program only), unless `estimate` (`--estimate-memory`)
/// or the run is not predicted here: parameter server, or pipeline stages chosen by
/// `parallel.auto_pipeline` (or loaded from `parallel.load_operator_strategy_file`) without
/// `[parallel.pipeline]` cutting the batch, which the run asks for. A run that cannot be built
/// otherwise is an error, the one `tessera train` refuses the configuration with: a plan is
/// not printed for a run that would not start.
///
/// In a search mode the session searches while it is built, and its plan is the one printed
/// ([`runtime::TrainSession::searched_plan`]): the search runs once.
fn plan_with_memory(
    config: &TrainConfig,
    estimate: bool,
    configured_stages: usize,
) -> anyhow::Result<(PlanReport, PlanMemory)> {
    if estimate {
        let why = "--estimate-memory: the run's programs not compiled".to_string();
        return Ok((runtime::plan(config)?, PlanMemory::Estimated(why)));
    }
    if config.ps().is_some() {
        let why = "parallel.mode = \"parameter_server\" runs the ps crate's programs, which `tessera train --explain` does not predict";
        return Ok((
            runtime::plan(config)?,
            PlanMemory::Estimated(why.to_string()),
        ));
    }
    let searches = matches!(
        config.parallel_config().mode,
        parallel::ParallelMode::Auto(_)
    );
    if !searches {
        // The configured strategies, costed; then the run's session, which places them.
        let report = runtime::plan(config)?;
        let session = runtime::Session::for_planning(config)?;
        let stages = plan_stages(&report, configured_stages);
        let memory = PlanMemory::of(&session, &report, stages);
        return Ok((report, memory));
    }
    // The run's session without its evaluation program, which the prediction does not read.
    match runtime::Session::for_planning(config) {
        Ok(session) => {
            let report = session.searched_plan().cloned().ok_or_else(|| {
                anyhow::anyhow!("the session of a search mode holds no searched plan")
            })?;
            let stages = plan_stages(&report, configured_stages);
            let memory = PlanMemory::of(&session, &report, stages);
            Ok((report, memory))
        }
        // The plan's stages may need `[parallel.pipeline]` to cut the batch before the run can
        // be built (the run asks for it): the plan shows them with the search's defaults
        // (docs/CONFIG.md, `parallel.auto_pipeline`).
        Err(e) if may_place_stages(config) => {
            let report = runtime::plan(config)?;
            if !stages_without_cut_batch(&report) {
                return Err(e.into());
            }
            let memory = PlanMemory::Estimated(format!("the run cannot be built: {e}"));
            Ok((report, memory))
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether a search-mode `config` can plan pipeline stages without `[parallel.pipeline]`:
/// with `parallel.auto_pipeline`, or from `parallel.load_operator_strategy_file`'s stages.
fn may_place_stages(config: &TrainConfig) -> bool {
    config.parallel_config().pipeline.is_none()
        && (config.search().auto_pipeline || config.search().load_operator_strategy_file.is_some())
}

/// Whether `report` has pipeline stages (chosen by `parallel.auto_pipeline`, or loaded from
/// `parallel.load_operator_strategy_file`) while no `[parallel.pipeline]` cut the batch into
/// micro-batches: the run then asks for that section before it builds anything.
fn stages_without_cut_batch(report: &PlanReport) -> bool {
    report
        .pipeline
        .as_ref()
        .is_some_and(|p| p.config.stages > 1 && !p.batch_cut)
}

/// Per pipeline stage of `report` (`stages` of them), the rank whose predicted peak is the
/// highest and its figures, predicted from the run's `session` as `tessera train --explain`
/// predicts them, and the session's warnings; an error (why not) when it places other
/// strategies, ranks or stages than `report` plans.
fn predict_session(
    session: &runtime::Session,
    report: &PlanReport,
    stages: usize,
) -> Result<Predicted, String> {
    let placed: BTreeMap<String, Vec<Vec<usize>>> = session
        .op_strategies()
        .into_iter()
        .map(|r| (r.name, r.inputs))
        .collect();
    if let Some((name, planned)) = report
        .strategies
        .iter()
        .find(|(name, s)| placed.get(name).is_some_and(|p| p != s))
    {
        return Err(format!(
            "the run places op {name} as {}, not as planned {}",
            tuple(&placed[name]),
            tuple(planned)
        ));
    }
    let devices = session.devices();
    if devices != report.devices * stages {
        return Err(format!(
            "the run has {devices} ranks, the plan {} ({stages} stage(s) of {})",
            report.devices * stages,
            report.devices
        ));
    }
    // Each stage's fullest rank and its figures, the session's own prediction (what
    // `tessera train --explain` prints), with the analysis common to the ranks done once.
    let fullest = session
        .predict_memory_per_stage()
        .map_err(|e| format!("the run's memory cannot be predicted: {e}"))?;
    if fullest.len() != stages {
        return Err(format!(
            "the run has {} pipeline stage(s), the plan {stages}",
            fullest.len()
        ));
    }
    Ok((fullest, session.warnings()))
}

/// `blocks.7.attn.qkv.matmul` → (`blocks.*.attn.qkv.matmul`, 7): ops of repeated layers grouped.
fn layer_pattern(name: &str) -> (String, Option<usize>) {
    let parts: Vec<&str> = name.split('.').collect();
    match parts.iter().position(|p| p.parse::<usize>().is_ok()) {
        Some(i) => {
            let index = parts[i].parse().ok();
            let mut pattern: Vec<&str> = parts.clone();
            pattern[i] = "*";
            (pattern.join("."), index)
        }
        None => (name.to_string(), None),
    }
}

/// `[0, 1, 2, 5]` → `0-2,5`.
fn ranges(indices: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let start = indices[i];
        let mut end = start;
        while i + 1 < indices.len() && indices[i + 1] == end + 1 {
            i += 1;
            end = indices[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

fn tuple(s: &[Vec<usize>]) -> String {
    let inner: Vec<String> = s
        .iter()
        .map(|t| {
            let f: Vec<String> = t.iter().map(usize::to_string).collect();
            format!("({})", f.join(", "))
        })
        .collect();
    format!("({})", inner.join(", "))
}

/// The pipeline stages of a plan: the chosen pipeline's, else the configured
/// `[parallel.pipeline]` stages (`configured`).
fn plan_stages(r: &PlanReport, configured: usize) -> usize {
    r.pipeline
        .as_ref()
        .map_or(configured, |p| p.config.stages)
        .max(1)
}

/// The plan as text. `configured_stages` is `parallel.pipeline.stages` (1 without it);
/// `auto_pipeline` whether the search chose the stages (otherwise they are the configured ones).
fn describe(
    r: &PlanReport,
    memory: &PlanMemory,
    file: &std::path::Path,
    configured_stages: usize,
    auto_pipeline: bool,
) -> String {
    let mut out = String::new();
    let stages = plan_stages(r, configured_stages);
    // `r.devices` is one stage's: the run's devices are the stages' together.
    let devices = if stages > 1 {
        format!(
            "{} device(s) ({} pipeline stages of {})",
            r.devices * stages,
            stages,
            r.devices
        )
    } else {
        format!("{} device(s)", r.devices)
    };
    out.push_str(&format!(
        "plan: {} on {devices}, profile {} ({} per device)\n",
        r.mode,
        r.profile.name,
        human_bytes(r.memory_budget as f64)
    ));
    match (&r.loaded_from, r.was_searched()) {
        (Some(path), _) => out.push_str(&format!("strategies loaded from {}\n", path.display())),
        (None, true) => match r.pipeline.as_ref().filter(|p| p.config.stages > 1) {
            Some(p) => out.push_str(&format!(
                "search: {:.1} ms over {} ops in {} stage searches; {}\n",
                r.search_ms,
                r.n_ops,
                p.config.stages,
                if auto_pipeline {
                    "the stages cut by balanced layer times (no optimality bound)"
                } else {
                    "the stages as [parallel.pipeline] places them"
                }
            )),
            None => out.push_str(&format!(
                "search: {:.1} ms over {} ops ({} distinct); {}\n",
                r.search_ms,
                r.n_ops,
                r.n_classes,
                match r.gap {
                    None => "optimal under the cost model".to_string(),
                    Some(g) => format!("optimality gap at most {:.1} %", g * 100.0),
                }
            )),
        },
        (None, false) => out.push_str("strategies as configured (no search)\n"),
    }
    if r.splits_nothing() {
        out.push_str(&format!(
            "note: no op is split over the {} devices (no splittable dim divides by {}): every device repeats the whole step, which one device would compute as fast\n",
            r.devices, r.devices
        ));
    }
    out.push_str(&format!(
        "predicted step: {:.3} ms = compute {:.3} + communication {:.3} + bubble {:.3}\n",
        r.step_ms(),
        r.cost.compute * 1e3,
        r.cost.comm * 1e3,
        r.bubble_seconds() * 1e3
    ));
    out.push_str(&describe_memory(r, memory));
    // A search keeps to the budget; strategies loaded or configured are costed whatever
    // memory they need.
    let peak = memory.peak(r);
    if peak > r.memory_budget as f64 {
        out.push_str(&format!(
            "note: {} needs {} per device, more than the {} of memory per device: the run may not fit (raise parallel.max_device_memory, or use more devices or pipeline stages)\n",
            if r.pipeline.as_ref().is_some_and(|p| p.config.stages > 1) {
                "the fullest pipeline stage"
            } else {
                "the plan"
            },
            human_bytes(peak),
            human_bytes(r.memory_budget as f64)
        ));
    }
    out.push_str(&format!(
        "communication per step: {} per device, {} in all\n",
        human_bytes(r.cost.comm_bytes),
        human_bytes(total_comm_bytes(r))
    ));
    if let Some(p) = &r.pipeline {
        out.push_str(&describe_pipeline(
            p,
            r.devices * p.config.stages,
            &memory.stage_peaks(p),
        ));
    }
    out.push_str("strategies (in_strategy per op; repeated layers grouped):\n");
    let mut groups: Vec<(String, String, Vec<usize>)> = Vec::new();
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (name, s) in &r.strategies {
        let (pattern, layer) = layer_pattern(name);
        let key = (pattern.clone(), tuple(s));
        let i = *index.entry(key.clone()).or_insert_with(|| {
            groups.push((key.0, key.1, Vec::new()));
            groups.len() - 1
        });
        groups[i].2.extend(layer);
    }
    for (pattern, strategy, layers) in groups {
        let which = if layers.is_empty() {
            pattern
        } else {
            pattern.replacen('*', &format!("{{{}}}", ranges(&layers)), 1)
        };
        out.push_str(&format!("  {which:<48} {strategy}\n"));
    }
    out.push_str(&format!("operator strategy file: {}\n", file.display()));
    out
}

/// Bytes received per step by all devices: of every stage when pipelined (the report's cost is
/// then the busiest stage's).
fn total_comm_bytes(r: &PlanReport) -> f64 {
    match &r.pipeline {
        Some(p) => p
            .stage_costs
            .iter()
            .map(|c| c.comm_bytes * r.devices as f64)
            .sum(),
        None => r.cost.comm_bytes * r.devices as f64,
    }
}

/// The memory line of the plan's text.
fn describe_memory(r: &PlanReport, memory: &PlanMemory) -> String {
    let e = &r.cost.memory;
    match memory.fullest() {
        Some((rank, m)) => format!(
            "memory per device: peak {} on rank {rank}, the fullest (predicted as `tessera train --explain` predicts it: the compiled step's buffers, each freed after its last use, with the micro-batches a pipeline stage holds at once); by category, each at its own peak: parameters {}, gradients {}, optimizer {}, activations {}, communication {}; the search ranked strategies by its own estimate, {}\n",
            human_bytes(m.peak as f64),
            human_bytes(m.peaks.parameters as f64),
            human_bytes(m.peaks.gradients as f64),
            human_bytes(m.peaks.optimizer as f64),
            human_bytes(m.peaks.activations as f64),
            human_bytes(m.peaks.communication as f64),
            human_bytes(e.total())
        ),
        None => {
            let why = match memory {
                PlanMemory::Estimated(why) => why.as_str(),
                PlanMemory::Predicted { .. } => "no rank predicted",
            };
            format!(
                "memory per device (the search's estimate, not the run's predicted peak: {why}): parameters {}, gradients {}, optimizer {}, activations {} (the forward outputs the backward reads, and each gradient written whole before its sum, all counted as held at once; micro-batches in flight and the backward's other values not counted); total {}\n",
                human_bytes(e.parameters),
                human_bytes(e.gradients),
                human_bytes(e.optimizer),
                human_bytes(e.activations),
                human_bytes(e.total())
            )
        }
    }
}

/// The chosen pipeline: per stage its layers, ranks, time per step and memory (`peaks`: each
/// stage's bytes per device).
fn describe_pipeline(p: &runtime::PipelinePlan, devices: usize, peaks: &[f64]) -> String {
    let mut out = format!(
        "pipeline: {} stage(s) × {} micro-batches ({}), bubble {:.3} ms, makespan {:.3} ms\n",
        p.config.stages,
        p.config.micro_batches,
        p.config.scheduler.name(),
        p.bubble * 1e3,
        p.makespan * 1e3
    );
    for ((stage, cost), peak) in p.stage_costs.iter().enumerate().zip(peaks) {
        let layers = parallel::pipeline::layers_of_stage(&p.layers, stage);
        let ranks = p.ranks(stage, devices);
        out.push_str(&format!(
            "  stage {stage}: ranks {}-{}, {} layer(s) {}..{}, {:.3} ms per step, {} per device\n",
            ranks.start,
            ranks.end.saturating_sub(1),
            layers.len(),
            layers.first().unwrap_or(&"-"),
            layers.last().unwrap_or(&"-"),
            cost.time() * 1e3,
            human_bytes(*peak)
        ));
    }
    out
}

/// The pipeline planned stage by stage (`null` when none was: no stages configured or chosen).
fn pipeline_json(r: &PlanReport, memory: &PlanMemory) -> serde_json::Value {
    let Some(p) = &r.pipeline else {
        return serde_json::Value::Null;
    };
    let devices = r.devices * p.config.stages;
    // A cell with a call raised to a later stage (one reading that stage's output) runs on both
    // stages: `stage_of_layer` gives the first, `stage_layers` lists it under each.
    let mut stage_of_layer = serde_json::Map::new();
    for (layer, stage) in &p.layers {
        stage_of_layer
            .entry(layer.clone())
            .or_insert_with(|| serde_json::json!(stage));
    }
    serde_json::json!({
        "stages": p.config.stages,
        "micro_batches": p.config.micro_batches,
        "scheduler": p.config.scheduler.name(),
        "stage_of_layer": stage_of_layer,
        "stage_layers": (0..p.config.stages)
            .map(|s| parallel::pipeline::layers_of_stage(&p.layers, s))
            .collect::<Vec<_>>(),
        "stage_ranks": (0..p.config.stages).map(|s| {
            let r = p.ranks(s, devices);
            serde_json::json!([r.start, r.end])
        }).collect::<Vec<_>>(),
        "stage_step_ms": p.stage_costs.iter().map(|c| c.time() * 1e3).collect::<Vec<_>>(),
        "stage_memory_bytes": memory.stage_peaks(p),
        "makespan_ms": p.makespan * 1e3,
        "bubble_ms": p.bubble * 1e3,
    })
}

/// The plan as JSON. `configured_stages` is `parallel.pipeline.stages` (1 without it).
fn to_json(
    r: &PlanReport,
    memory: &PlanMemory,
    file: &std::path::Path,
    configured_stages: usize,
) -> serde_json::Value {
    let e = &r.cost.memory;
    let fullest = memory.fullest();
    let categories = match fullest {
        Some((_, m)) => serde_json::json!({
            "parameters": m.peaks.parameters,
            "gradients": m.peaks.gradients,
            "optimizer": m.peaks.optimizer,
            "activations": m.peaks.activations,
            "communication": m.peaks.communication,
        }),
        None => serde_json::json!({
            "parameters": e.parameters,
            "gradients": e.gradients,
            "optimizer": e.optimizer,
            "activations": e.activations,
            "communication": null,
        }),
    };
    let stages = plan_stages(r, configured_stages);
    serde_json::json!({
        "mode": r.mode,
        "devices": r.devices,
        "total_devices": r.devices * stages,
        "stages": stages,
        "splits_nothing": r.splits_nothing(),
        "profile": r.profile.name,
        "search_ms": r.search_ms,
        "predicted_step_ms": r.step_ms(),
        "compute_ms": r.cost.compute * 1e3,
        "comm_ms": r.cost.comm * 1e3,
        "bubble_ms": r.bubble_seconds() * 1e3,
        "comm_bytes_per_step": total_comm_bytes(r),
        "comm_bytes_per_device": r.cost.comm_bytes,
        "peak_memory_bytes": memory.peak(r),
        "memory_budget_bytes": r.memory_budget,
        "memory": categories,
        "memory_predicted": fullest.is_some(),
        "memory_rank": fullest.map(|(rank, _)| rank),
        "memory_not_predicted": match memory {
            PlanMemory::Estimated(why) => Some(why.as_str()),
            PlanMemory::Predicted { .. } => None,
        },
        "search_memory_estimate": {
            "parameters": e.parameters,
            "gradients": e.gradients,
            "optimizer": e.optimizer,
            "activations": e.activations,
            "total": e.total(),
        },
        "gap": r.gap,
        "n_ops": r.n_ops,
        "n_classes": r.n_classes,
        "operator_strategy_file": file.display().to_string(),
        "pipeline": pipeline_json(r, memory),
        "ops": r.strategies.iter().map(|(name, s)| serde_json::json!({
            "name": name,
            "in_strategy": s,
        })).collect::<Vec<_>>(),
    })
}
