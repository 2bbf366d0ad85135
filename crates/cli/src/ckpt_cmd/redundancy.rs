//! `tessera ckpt dedup` and `redundancy`: a strategy's replica groups, and a checkpoint saved
//! with one copy per group.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::json;

use super::flags::{
    check_dest_dir, check_input_dir, check_input_file, WriteFlags, CHECKPOINT_DIR, STRATEGY_FILE,
};
use super::output::{path_str, print, Bar};
use crate::stdout::write_stdout;

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

/// Runs `tessera ckpt redundancy`. Only the output asked for is built, and the JSON is
/// written straight from the map (the same text as a `serde_json::Value` of it would print):
/// a strategy of hundreds of thousands of parameters is not held a third time as a JSON tree.
pub(super) fn redundancy(a: &RedundancyArgs) -> anyhow::Result<()> {
    check_input_file("--strategy", &a.strategy, STRATEGY_FILE)?;
    let map = ckpt::redundancy_of_file(&a.strategy)?;
    let owners = ckpt::remove_param_redundancy(&map);
    if a.json {
        let mut s = serde_json::to_string_pretty(&RedundancyJson {
            map: &map,
            owners: &owners,
        })?;
        s.push('\n');
        return write_stdout(&s);
    }
    let mut text = String::from("replica groups:\n");
    for (name, g) in &map {
        text.push_str(&format!("  {name:<32} {g:?}\n"));
    }
    text.push_str("owners (one copy per replica group):\n");
    for (rank, names) in &owners {
        let names: Vec<&String> = names.iter().collect();
        text.push_str(&format!("  rank {rank}: {names:?}\n"));
    }
    write_stdout(&text)
}

/// `tessera ckpt redundancy --json`'s object: `{"get_parameter_redundancy": {name: groups},
/// "remove_param_redundancy": {rank: names}}`, keys in the order a `serde_json::Map` keeps
/// (sorted as strings: rank "10" before rank "2").
struct RedundancyJson<'a> {
    map: &'a ckpt::RedundancyMap,
    owners: &'a BTreeMap<usize, BTreeSet<String>>,
}

/// The replica groups of each parameter: the map is sorted by name and its names are unique
/// (one resolved strategy's), the order a `serde_json::Map` keeps.
struct GroupsJson<'a>(&'a ckpt::RedundancyMap);

/// Rank (as a string, the keys sorted as strings) → the parameters it owns.
struct OwnersJson<'a>(Vec<(String, &'a BTreeSet<String>)>);

impl Serialize for RedundancyJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut ranks: Vec<(String, &BTreeSet<String>)> = self
            .owners
            .iter()
            .map(|(rank, names)| (rank.to_string(), names))
            .collect();
        ranks.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut top = serializer.serialize_map(Some(2))?;
        top.serialize_entry("get_parameter_redundancy", &GroupsJson(self.map))?;
        top.serialize_entry("remove_param_redundancy", &OwnersJson(ranks))?;
        top.end()
    }
}

impl Serialize for GroupsJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(name, groups)| (name, &**groups)))
    }
}

impl Serialize for OwnersJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(rank, names)| (rank, names)))
    }
}
