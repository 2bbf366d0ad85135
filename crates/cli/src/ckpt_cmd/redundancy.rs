//! `tessera ckpt dedup` and `redundancy`: a strategy's replica groups, and a checkpoint saved
//! with one copy per group.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use super::flags::{
    check_dest_dir, check_input_dir, check_input_file, WriteFlags, CHECKPOINT_DIR, STRATEGY_FILE,
};
use super::output::{path_str, print, Bar};

/// Arguments of `tessera ckpt dedup`.
#[derive(Debug, Args)]
pub(super) struct DedupArgs {
    /// Source checkpoint directory (holding rank_<N>/).
    #[arg(long)]
    src: PathBuf,
    /// The strategy file.
    #[arg(long)]
    strategy: PathBuf,
    /// Destination directory.
    #[arg(long)]
    dst: PathBuf,
    #[command(flatten)]
    write: WriteFlags,
}

/// Arguments of `tessera ckpt redundancy`.
#[derive(Debug, Args)]
pub(super) struct RedundancyArgs {
    /// The strategy file.
    #[arg(long)]
    strategy: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `tessera ckpt dedup`.
pub(super) fn dedup(a: &DedupArgs) -> anyhow::Result<()> {
    check_input_dir("--src", &a.src, CHECKPOINT_DIR)?;
    check_input_file("--strategy", &a.strategy, STRATEGY_FILE)?;
    check_dest_dir("--dst", &a.dst)?;
    let bar = Bar::new(a.write.quiet || a.write.json);
    let r = ckpt::dedup_checkpoints(
        &a.src,
        &a.strategy,
        &a.dst,
        a.write.force,
        a.write.durability(),
        &bar,
    )
    .context("saving without redundancy failed")?;
    let mut text = String::new();
    for (rank, path, names) in &r.ranks {
        text.push_str(&format!(
            "rank {rank}: {} keeps {}\n",
            path.display(),
            names.join(", ")
        ));
    }
    text.push_str(&format!(
        "{} written of {} in the source\n",
        bench::timing::human_bytes(r.data_bytes as usize),
        bench::timing::human_bytes(r.source_bytes as usize)
    ));
    print(
        a.write.json,
        json!({
            "ranks": r.ranks.iter().map(|(rank, p, n)| json!({"rank": rank, "path": path_str(p), "tensors": n})).collect::<Vec<_>>(),
            "bytes_written": r.data_bytes,
            "bytes_source": r.source_bytes,
        }),
        text,
    )
}

/// Runs `tessera ckpt redundancy`.
pub(super) fn redundancy(a: &RedundancyArgs) -> anyhow::Result<()> {
    check_input_file("--strategy", &a.strategy, STRATEGY_FILE)?;
    let map = ckpt::redundancy_of_file(&a.strategy)?;
    let owners = ckpt::remove_param_redundancy(&map);
    let mut text = String::from("replica groups:\n");
    let mut groups = serde_json::Map::new();
    for (name, g) in &map {
        text.push_str(&format!("  {name:<32} {g:?}\n"));
        groups.insert(name.clone(), json!(g));
    }
    text.push_str("owners (one copy per replica group):\n");
    let mut own = serde_json::Map::new();
    for (rank, names) in &owners {
        let names: Vec<&String> = names.iter().collect();
        text.push_str(&format!("  rank {rank}: {names:?}\n"));
        own.insert(rank.to_string(), json!(names));
    }
    print(
        a.json,
        json!({"get_parameter_redundancy": groups, "remove_param_redundancy": own}),
        text,
    )
}
