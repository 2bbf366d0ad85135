//! `tessera ckpt convert`, `ranks` and `load`: per-rank checkpoints for a destination
//! strategy, from sharded sources or a unified checkpoint, and the source ranks each needs.

use std::path::PathBuf;

use anyhow::{bail, Context};
use ckpt::Format;
use clap::Args;
use serde_json::{json, Value};

use super::flags::{
    check_dest_dir, check_input_dir, check_input_file, check_optional_file, DecryptFlags,
    WriteFlags, CHECKPOINT_DIR, STRATEGY_FILE,
};
use super::output::{path_str, print, Bar};

/// Arguments of `tessera ckpt convert`.
#[derive(Debug, Args)]
pub(super) struct ConvertArgs {
    /// Source checkpoint directory (holding rank_<N>/).
    #[arg(long)]
    src: PathBuf,
    /// Source strategy file (MindSpore protobuf or JSON, or Tessera JSON); without it the
    /// source is unsharded (rank_0/ holds every tensor whole) and --dst-strategy is required.
    #[arg(long)]
    src_strategy: Option<PathBuf>,
    /// Destination directory.
    #[arg(long)]
    dst: PathBuf,
    /// Destination strategy file; without it everything is merged into rank 0.
    #[arg(long)]
    dst_strategy: Option<PathBuf>,
    /// Convert only this destination rank (repeatable).
    #[arg(long)]
    rank: Vec<usize>,
    /// Output format (default: the source's).
    #[arg(long)]
    format: Option<Format>,
    /// Output file-name prefix: rank_<r>/<prefix><r>.<ext>.
    #[arg(long, default_value = "checkpoint_")]
    prefix: String,
    /// Append MindSpore's crc_num trailer to .ckpt output.
    #[arg(long)]
    crc: bool,
    /// Convert even if the source or destination strategy lists parameters no source file
    /// holds (reported as skipped); without it that is an error.
    #[arg(long)]
    allow_missing: bool,
    #[command(flatten)]
    decrypt: DecryptFlags,
    #[command(flatten)]
    write: WriteFlags,
}

/// Arguments of `tessera ckpt ranks`.
#[derive(Debug, Args)]
pub(super) struct RanksArgs {
    /// Source strategy file.
    #[arg(long)]
    src_strategy: PathBuf,
    /// Destination strategy file; without it, a merge into rank 0.
    #[arg(long)]
    dst_strategy: Option<PathBuf>,
    /// The destination rank.
    #[arg(long)]
    rank: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Arguments of `tessera ckpt load`.
#[derive(Debug, Args)]
pub(super) struct LoadArgs {
    /// Unified checkpoint directory (param_name_map.json and part files).
    #[arg(long)]
    unified: PathBuf,
    /// Target strategy file.
    #[arg(long)]
    strategy: PathBuf,
    /// Destination directory: rank_<r>/net.<ext>.
    #[arg(long)]
    dst: PathBuf,
    /// Only this destination rank (repeatable).
    #[arg(long)]
    rank: Vec<usize>,
    /// Output format (default: safetensors).
    #[arg(long)]
    format: Option<Format>,
    #[command(flatten)]
    write: WriteFlags,
}

/// A conversion report as JSON: one entry per written rank, and the skipped tensors.
fn convert_report_json(report: &ckpt::ConvertReport) -> Value {
    json!({
        "ranks": report.ranks.iter().map(|r| json!({
            "rank": r.rank,
            "path": path_str(&r.path),
            "source_ranks": r.source_ranks,
            "minimal": if r.exact { "exact" } else { "greedy" },
            "tensors": r.n_tensors,
            "bytes": r.data_bytes,
        })).collect::<Vec<_>>(),
        "skipped": report.skipped.iter().map(|(n, why)| json!({"name": n, "reason": why})).collect::<Vec<_>>(),
    })
}

/// A conversion report as text: one line per written rank, and the skipped tensors.
fn convert_report_text(report: &ckpt::ConvertReport) -> String {
    let mut out = String::new();
    for r in &report.ranks {
        out.push_str(&format!(
            "rank {}: {} ({} tensors, {}) from source ranks {:?} ({})\n",
            r.rank,
            r.path.display(),
            r.n_tensors,
            bench::timing::human_bytes(r.data_bytes as usize),
            r.source_ranks,
            if r.exact { "minimal" } else { "greedy cover" }
        ));
    }
    for (name, why) in &report.skipped {
        out.push_str(&format!("skipped {name:?}: {why}\n"));
    }
    out
}

/// Runs `tessera ckpt convert`.
pub(super) fn convert(a: &ConvertArgs) -> anyhow::Result<()> {
    // The key first (its file checked, then read within a bound), then every path.
    let decryption = a.decrypt.decryption()?;
    check_input_dir("--src", &a.src, CHECKPOINT_DIR)?;
    check_optional_file("--src-strategy", a.src_strategy.as_deref(), STRATEGY_FILE)?;
    check_optional_file("--dst-strategy", a.dst_strategy.as_deref(), STRATEGY_FILE)?;
    check_dest_dir("--dst", &a.dst)?;
    let bar = Bar::new(a.write.quiet || a.write.json);
    let ranks = (!a.rank.is_empty()).then_some(a.rank.as_slice());
    let opts = ckpt::ConvertOptions {
        format: a.format,
        prefix: &a.prefix,
        ranks,
        force: a.write.force,
        crc: a.crc,
        allow_missing: a.allow_missing,
        progress: &bar,
        decryption: decryption.as_ref(),
        fsync: !a.write.no_fsync,
        ..Default::default()
    };
    let report = match (&a.src_strategy, &a.dst_strategy) {
        (Some(src), dst) => ckpt::convert_checkpoints(&a.src, src, &a.dst, dst.as_deref(), &opts),
        (None, Some(dst)) => ckpt::convert_unsharded(&a.src, &a.dst, dst, &opts),
        (None, None) => bail!(
            "give --src-strategy, --dst-strategy or both: without either there is nothing to convert"
        ),
    }
    .context("checkpoint conversion failed")?;
    print(
        a.write.json,
        convert_report_json(&report),
        convert_report_text(&report),
    )
}

/// Runs `tessera ckpt ranks`.
pub(super) fn ranks(a: &RanksArgs) -> anyhow::Result<()> {
    check_input_file("--src-strategy", &a.src_strategy, STRATEGY_FILE)?;
    check_optional_file("--dst-strategy", a.dst_strategy.as_deref(), STRATEGY_FILE)?;
    let src = ckpt::Strategy::load(&a.src_strategy)?;
    let dst = a
        .dst_strategy
        .as_deref()
        .map(ckpt::Strategy::load)
        .transpose()?;
    let cover = ckpt::minimal_rank_list(&src, dst.as_ref(), a.rank)?;
    let how = if cover.exact { "exact" } else { "greedy" };
    print(
        a.json,
        json!({"rank": a.rank, "source_ranks": cover.ranks, "minimal": how}),
        format!(
            "destination rank {} needs source ranks {:?} ({} minimum)\n",
            a.rank, cover.ranks, how
        ),
    )
}

/// Runs `tessera ckpt load`.
pub(super) fn load(a: &LoadArgs) -> anyhow::Result<()> {
    check_input_dir(
        "--unified",
        &a.unified,
        "a directory (a unified checkpoint: param_name_map.json and part files)",
    )?;
    check_input_file("--strategy", &a.strategy, STRATEGY_FILE)?;
    check_dest_dir("--dst", &a.dst)?;
    let bar = Bar::new(a.write.quiet || a.write.json);
    let ranks = (!a.rank.is_empty()).then_some(a.rank.as_slice());
    let opts = ckpt::ConvertOptions {
        format: a.format,
        ranks,
        force: a.write.force,
        progress: &bar,
        fsync: !a.write.no_fsync,
        ..Default::default()
    };
    let report = ckpt::load_distributed_checkpoint(&a.unified, &a.strategy, &a.dst, &opts)
        .context("loading the unified checkpoint failed")?;
    print(
        a.write.json,
        convert_report_json(&report),
        convert_report_text(&report),
    )
}
