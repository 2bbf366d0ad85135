//! `tessera strategy …`: show a strategy file (`build_searched_strategy`), merge per-stage
//! pipeline files (`merge_pipeline_strategys`), read a group-info file's restore list
//! (`restore_group_info_list`).

use std::path::PathBuf;

use anyhow::Context;
use ckpt::{GroupInfo, Strategy, StrategyFlavour};
use clap::{Args, Subcommand};
use runtime::PathKind;
use serde_json::{json, Value};

use crate::stdout::write_stdout;

/// Arguments of `tessera strategy`.
#[derive(Debug, Args)]
pub struct StrategyArgs {
    #[command(subcommand)]
    command: StrategyCommand,
}

#[derive(Debug, Subcommand)]
enum StrategyCommand {
    /// Show every parameter's layout (MindSpore's build_searched_strategy with --json).
    Show(ShowArgs),
    /// Merge one strategy file per pipeline stage into one file (names become "<stage>-<name>").
    MergeStages(MergeStagesArgs),
    /// The ranks that can restore this rank's checkpoint, from a group-info file.
    RestoreRanks(RestoreRanksArgs),
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// A strategy file: MindSpore protobuf or JSON, or Tessera JSON.
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct MergeStagesArgs {
    /// Directory of per-stage strategy files (all *.ckpt, or all *.json).
    dir: PathBuf,
    /// The merged file (protobuf, or JSON if it ends in .json).
    out: PathBuf,
    /// Replace the output if it exists.
    #[arg(long)]
    force: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RestoreRanksArgs {
    /// A group-info file (ParallelGroupMap).
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera strategy …`.
pub fn run(args: &StrategyArgs) -> anyhow::Result<()> {
    match &args.command {
        StrategyCommand::Show(a) => {
            runtime::check_input_path(
                "strategy file",
                &a.file,
                PathKind::File,
                "a file (a strategy file: MindSpore protobuf or JSON, or Tessera JSON)",
            )?;
            let s = Strategy::load(&a.file).context("cannot read the strategy")?;
            check_strategy(&s)?;
            show_strategy(&s, a.json)
        }
        StrategyCommand::MergeStages(a) => merge_stages(a),
        StrategyCommand::RestoreRanks(a) => {
            runtime::check_input_path(
                "group-info file",
                &a.file,
                PathKind::File,
                "a file (a group-info file, as output.group_info_file has a run write it)",
            )?;
            let ranks = ckpt::restore_group_info_list(&a.file)?;
            if a.json {
                write_stdout(&format!("{}\n", serde_json::to_string(&ranks)?))
            } else {
                write_stdout(&format!("{ranks:?}\n"))
            }
        }
    }
}

/// Checks what `strategy show` prints: every parameter's layout binds to its recorded shape
/// (one map entry per dim, each dim divisible by its split, the optimizer shard dividing its
/// replicas; a file without shapes is checked at the smallest shape its splits divide) and
/// every operator's split factors are at least 1. The reader checks each field alone; a file
/// whose fields disagree would otherwise be shown as if it were valid.
fn check_strategy(s: &Strategy) -> anyhow::Result<()> {
    s.resolve_scale_free()
        .context("the strategy is not valid")?;
    for op in &s.ops {
        let outputs = op.outputs.iter().flatten().map(|t| ("out_strategy", t));
        for (i, (what, tuple)) in op
            .inputs
            .iter()
            .map(|t| ("in_strategy", t))
            .chain(outputs)
            .enumerate()
        {
            if let Some(d) = tuple.iter().position(|&f| f == 0) {
                let n_in = op.inputs.len();
                let k = if i < n_in { i } else { i - n_in };
                anyhow::bail!(
                    "{}: operator {:?}: {what} tuple {k} {tuple:?} has split factor 0 at dim {d}; every split factor is at least 1",
                    s.path.display(),
                    op.name
                );
            }
        }
    }
    Ok(())
}

/// Prints a strategy: with `json`, MindSpore's `build_searched_strategy` dict for MindSpore
/// files and the layouts for Tessera files; otherwise one line per parameter and stage.
pub fn show_strategy(s: &Strategy, json: bool) -> anyhow::Result<()> {
    if json {
        let text = match (ckpt::MsStrategyFile::of_strategy(s)?, s.flavour) {
            (Some(ms), _) => ms.searched_strategy_json(),
            (None, _) => {
                let params: Vec<Value> = s
                    .params
                    .iter()
                    .map(|p| {
                        json!({
                            "name": p.name,
                            "shape": p.shape,
                            "dtype": p.dtype.map(|d| d.name()),
                            "placements": p.placements.iter().map(placement_json).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                let ops: Vec<Value> = s
                    .ops
                    .iter()
                    .map(|op| {
                        json!({
                            "name": op.name,
                            "stage": op.stage,
                            "in_strategy": op.inputs,
                            "out_strategy": op.outputs,
                        })
                    })
                    .collect();
                serde_json::to_string_pretty(
                    &json!({"flavour": s.flavour.to_string(), "tensors": params, "ops": ops}),
                )?
            }
        };
        return write_stdout(&format!("{text}\n"));
    }
    let mut out = format!(
        "{} ({}, {} parameters, {} pipeline stage(s))\n",
        s.path.display(),
        s.flavour,
        s.params.len(),
        s.n_stages()
    );
    for p in &s.params {
        for pl in &p.placements {
            let mesh = pl.layout.mesh();
            let ranks = mesh.rank_list();
            out.push_str(&format!(
                "  {:<28} stage {} ranks {}..{}  dev {:?}  map {}  {}{}\n",
                p.name,
                pl.stage,
                ranks.first().copied().unwrap_or(0),
                ranks.last().map_or(0, |r| r + 1),
                mesh.device_matrix(),
                pl.layout
                    .ms_tensor_map()
                    .map(|m| format!("{m:?}"))
                    .unwrap_or_default(),
                if pl.opt_shard > 1 {
                    format!("opt-shard {}  ", pl.opt_shard)
                } else {
                    String::new()
                },
                match (&p.shape, p.dtype) {
                    (Some(s), Some(d)) => format!("{s:?} {d}"),
                    (Some(s), None) => format!("{s:?}"),
                    _ => String::new(),
                }
            ));
        }
    }
    if !s.ops.is_empty() {
        out.push_str(&format!("{} op strategies\n", s.ops.len()));
    }
    for op in &s.ops {
        out.push_str(&format!(
            "  {:<28} stage {}  in {}",
            op.name,
            op.stage,
            parallel::format_strategy(&op.inputs)
        ));
        if let Some(outputs) = &op.outputs {
            out.push_str(&format!("  out {}", parallel::format_strategy(outputs)));
        }
        out.push('\n');
    }
    if s.flavour == StrategyFlavour::MsProtobuf {
        out.push_str("(MindSpore protobuf strategies do not record global shapes)\n");
    }
    write_stdout(&out)
}

/// One placement as JSON. Its ranks are `"rank_range": [start, count]` when consecutive, as a
/// Tessera strategy file writes them ([`ckpt::rank_range`]), otherwise `"rank_list"`: every
/// rank of every placement made the output of a strategy over 8 192 ranks huge.
fn placement_json(pl: &ckpt::StagePlacement) -> Value {
    let mesh = pl.layout.mesh();
    let (ranks_key, ranks) = match ckpt::rank_range(mesh.rank_list()) {
        Some((start, count)) => ("rank_range", json!([start, count])),
        None => ("rank_list", json!(mesh.rank_list())),
    };
    let mut v = json!({
        "stage": pl.stage,
        "device_matrix": mesh.device_matrix(),
        "axes": mesh.alias_names(),
        "tensor_map": pl.layout.ms_tensor_map().ok(),
        "optimizer_shard": pl.opt_shard,
    });
    v[ranks_key] = ranks;
    v
}

/// Prints a group-info file.
pub fn show_group_info(g: &GroupInfo, json: bool) -> anyhow::Result<()> {
    if json {
        let v = json!({
            "groups": g.groups.iter().map(|i| json!({"name": i.group_name, "ranks": i.ranks})).collect::<Vec<_>>(),
            "ckpt_restore_rank_list": g.restore_rank_list,
        });
        return write_stdout(&format!("{}\n", serde_json::to_string_pretty(&v)?));
    }
    let mut out = String::from("group-info file\n");
    for i in &g.groups {
        out.push_str(&format!("  group {:<24} {:?}\n", i.group_name, i.ranks));
    }
    match &g.restore_rank_list {
        Some(r) => out.push_str(&format!("  ckpt_restore_rank_list {r:?}\n")),
        None => out.push_str("  (no ckpt_restore_rank_list)\n"),
    }
    write_stdout(&out)
}

fn merge_stages(a: &MergeStagesArgs) -> anyhow::Result<()> {
    runtime::check_input_path(
        "per-stage strategy directory",
        &a.dir,
        PathKind::Directory,
        "a directory (of one strategy file per pipeline stage, all *.ckpt or all *.json)",
    )?;
    runtime::check_output_path(
        "merged strategy file",
        &a.out,
        PathKind::File,
        "a file to write (the merged strategy)",
    )?;
    let r = ckpt::merge_pipeline_strategies(&a.dir, &a.out, a.force)
        .context("merging per-stage strategies failed")?;
    if a.json {
        let v = json!({
            "path": r.path.display().to_string(),
            "merged": r.merged.iter().map(|(p, s)| json!({"file": p.display().to_string(), "stage": s})).collect::<Vec<_>>(),
            "skipped": r.skipped.iter().map(|(p, why)| json!({"file": p.display().to_string(), "reason": why})).collect::<Vec<_>>(),
        });
        return write_stdout(&format!("{}\n", serde_json::to_string_pretty(&v)?));
    }
    let mut out = String::new();
    for (p, s) in &r.merged {
        out.push_str(&format!("stage {s}: {}\n", p.display()));
    }
    for (p, why) in &r.skipped {
        out.push_str(&format!("skipped {}: {why}\n", p.display()));
    }
    out.push_str(&format!("wrote {}\n", r.path.display()));
    write_stdout(&out)
}
