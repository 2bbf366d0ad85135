//! `tessera plan`: a dry run that searches (or costs) a run's strategies without starting ranks,
//! prints the plan and writes the operator strategy file `tessera train` then uses.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use runtime::{PlanReport, ProfileChoice, TrainConfig};

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
    let report = runtime::plan(&config)?;
    let configured_stages = config
        .parallel_config()
        .pipeline
        .as_ref()
        .map_or(1, |p| p.stages.max(1));
    let file = config
        .search()
        .save_operator_strategy_file
        .clone()
        .unwrap_or_else(|| config.output().dir.join("operator_strategy.json"));
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("{}: cannot create the directory: {e}", dir.display()))?;
    }
    ckpt::write_operator_strategy_file(&file, &runtime::operator_strategy_records(&report))?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&report, &file, configured_stages))?
        );
    } else {
        let auto_pipeline = config.search().auto_pipeline;
        print!(
            "{}",
            describe(&report, &file, configured_stages, auto_pipeline)
        );
    }
    Ok(())
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

fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
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
    file: &std::path::Path,
    configured_stages: usize,
    auto_pipeline: bool,
) -> String {
    let mut out = String::new();
    let m = &r.cost.memory;
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
        bytes(r.memory_budget as f64)
    ));
    match (&r.loaded_from, r.search_ms > 0.0) {
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
    out.push_str(&format!(
        "memory per device: parameters {}, gradients {}, optimizer {}, activations {} (the forward outputs the backward reads, and each gradient written whole before its sum, all counted as held at once; `tessera train --explain` predicts the step's peak, each buffer freed after its last use); total {}\n",
        bytes(m.parameters),
        bytes(m.gradients),
        bytes(m.optimizer),
        bytes(m.activations),
        bytes(m.total())
    ));
    // A search keeps to the budget; strategies loaded or configured are costed whatever
    // memory they need.
    if m.total() > r.memory_budget as f64 {
        out.push_str(&format!(
            "note: {} needs {} per device, more than the {} of memory per device: the run may not fit (raise parallel.max_device_memory, or use more devices or pipeline stages)\n",
            if r.pipeline.as_ref().is_some_and(|p| p.config.stages > 1) {
                "the fullest pipeline stage"
            } else {
                "the plan"
            },
            bytes(m.total()),
            bytes(r.memory_budget as f64)
        ));
    }
    out.push_str(&format!(
        "communication per step: {} per device, {} in all\n",
        bytes(r.cost.comm_bytes),
        bytes(total_comm_bytes(r))
    ));
    if let Some(p) = &r.pipeline {
        out.push_str(&describe_pipeline(p, r.devices * p.config.stages));
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

/// The chosen pipeline: per stage its layers, ranks, time per step and memory.
fn describe_pipeline(p: &runtime::PipelinePlan, devices: usize) -> String {
    let mut out = format!(
        "pipeline: {} stage(s) × {} micro-batches ({}), bubble {:.3} ms, makespan {:.3} ms\n",
        p.config.stages,
        p.config.micro_batches,
        p.config.scheduler.name(),
        p.bubble * 1e3,
        p.makespan * 1e3
    );
    for (stage, cost) in p.stage_costs.iter().enumerate() {
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
            bytes(cost.memory.total())
        ));
    }
    out
}

/// The pipeline planned stage by stage (`null` when none was: no stages configured or chosen).
fn pipeline_json(r: &PlanReport) -> serde_json::Value {
    let Some(p) = &r.pipeline else {
        return serde_json::Value::Null;
    };
    let devices = r.devices * p.config.stages;
    serde_json::json!({
        "stages": p.config.stages,
        "micro_batches": p.config.micro_batches,
        "scheduler": p.config.scheduler.name(),
        "stage_of_layer": p.layers.iter().map(|(l, s)| (l.clone(), serde_json::json!(s)))
            .collect::<serde_json::Map<String, serde_json::Value>>(),
        "stage_ranks": (0..p.config.stages).map(|s| {
            let r = p.ranks(s, devices);
            serde_json::json!([r.start, r.end])
        }).collect::<Vec<_>>(),
        "stage_step_ms": p.stage_costs.iter().map(|c| c.time() * 1e3).collect::<Vec<_>>(),
        "stage_memory_bytes": p.stage_costs.iter().map(|c| c.memory.total()).collect::<Vec<_>>(),
        "makespan_ms": p.makespan * 1e3,
        "bubble_ms": p.bubble * 1e3,
    })
}

/// The plan as JSON. `configured_stages` is `parallel.pipeline.stages` (1 without it).
fn to_json(r: &PlanReport, file: &std::path::Path, configured_stages: usize) -> serde_json::Value {
    let m = &r.cost.memory;
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
        "peak_memory_bytes": m.total(),
        "memory_budget_bytes": r.memory_budget,
        "memory": {
            "parameters": m.parameters,
            "gradients": m.gradients,
            "optimizer": m.optimizer,
            "activations": m.activations,
        },
        "gap": r.gap,
        "n_ops": r.n_ops,
        "n_classes": r.n_classes,
        "operator_strategy_file": file.display().to_string(),
        "pipeline": pipeline_json(r),
        "ops": r.strategies.iter().map(|(name, s)| serde_json::json!({
            "name": name,
            "in_strategy": s,
        })).collect::<Vec<_>>(),
    })
}
