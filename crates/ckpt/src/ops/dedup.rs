//! Redundancy: which ranks hold identical copies of each parameter, one owner per copy, and
//! saving a checkpoint without the redundant copies.
//!
//! [`parameter_redundancy`] is MindSpore's `get_parameter_redundancy`, computed from the layout
//! (MindSpore reads only the first `tensor_map` entry, so its answer is wrong for multi-axis
//! layouts); [`remove_param_redundancy`] is MindSpore's owner assignment, which spreads the
//! parameters of each replica group round-robin over its ranks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::engine::execute::write_items;
use super::engine::options::{WriteOptions, DEFAULT_CHUNK_BYTES};
use super::engine::plan::OutItem;
use crate::error::{CkptError, Result};
use crate::io::atomic_write::Committer;
use crate::io::durability::Durability;
use crate::model::{ParamLayout, ResolvedStrategy, Strategy};
use crate::progress::{stop_point, Progress};
use crate::set::{SetWriter, SET_ID_KEY};
use crate::source::SourceSet;

/// Parameter → its replica groups (ranks holding identical data, in MindSpore's order),
/// parameters sorted by name. The group lists are shared: parameters placed alike hold one
/// list between them.
pub type RedundancyMap = Vec<(String, Arc<[Vec<usize>]>)>;

/// The replica groups of one placement, in MindSpore's order: model-parallel groups sorted by
/// their block coordinates read from the last mesh axis to the first, each then strided into
/// its optimizer-shard sub-groups (`ranks[i::k]`).
fn placement_groups(pl: &ParamLayout) -> Vec<Vec<usize>> {
    let mesh = pl.mp.mesh();
    let used = pl.mp.layout().used_axes();
    let mut groups = pl.mp.replica_slot_groups();
    let key = |g: &Vec<usize>| -> Vec<usize> {
        (0..mesh.n_axes())
            .rev()
            .map(|a| {
                if used.contains(&a) {
                    mesh.coord_along(g[0], a)
                } else {
                    0
                }
            })
            .collect()
    };
    groups.sort_by_key(key);
    let k = pl.opt_shard.max(1);
    let mut out = Vec::new();
    for g in groups {
        let ranks: Vec<usize> = g.iter().map(|&s| mesh.device_of_slot(s)).collect();
        for i in 0..k.min(ranks.len()) {
            out.push(ranks.iter().skip(i).step_by(k).copied().collect());
        }
    }
    out
}

/// What [`placement_groups`] reads of a placement: the mesh (its axis sizes, its rank list,
/// interleaving), the tensor map and the optimizer-shard group size — not the shape, which
/// only sizes the boxes. Placements with equal keys have equal replica groups.
#[derive(PartialEq, Eq, Hash)]
struct GroupsKey<'a> {
    /// Index of the rank list's contents among the distinct lists seen ([`SliceIds`]).
    ranks: usize,
    sizes: Vec<usize>,
    interleave: usize,
    dims: &'a [Vec<usize>],
    opt_shard: usize,
}

/// Distinct lists of ranks (rank lists, replica groups), each numbered once in the order first
/// seen. Lists are often shared (meshes intern contiguous rank lists; parameters placed alike
/// share their groups), so a list already seen at the same address is found without reading
/// it; a list at a new address is hashed once, and equal contents get the same number.
#[derive(Default)]
struct SliceIds<'a> {
    by_address: HashMap<(usize, usize), usize>,
    by_contents: HashMap<&'a [usize], usize>,
}

impl<'a> SliceIds<'a> {
    /// The number of `ranks`' contents (the next unused one when they are new).
    fn id(&mut self, ranks: &'a [usize]) -> usize {
        let address = (ranks.as_ptr() as usize, ranks.len());
        if let Some(&id) = self.by_address.get(&address) {
            return id;
        }
        let next = self.by_contents.len();
        let id = *self.by_contents.entry(ranks).or_insert(next);
        self.by_address.insert(address, id);
        id
    }
}

/// MindSpore's `get_parameter_redundancy` for every stage: parameter → replica groups.
///
/// The groups of a placement depend only on its mesh (axis sizes and rank list), tensor map
/// and optimizer shard, not its shape, and a strategy's parameters mostly share those: each
/// distinct placement is worked out once, and parameters placed alike share one list of
/// groups, so the cost is a hash per placement rather than a mesh analysis and a copy of
/// every group.
pub fn parameter_redundancy(strategy: &ResolvedStrategy) -> RedundancyMap {
    let mut lists = SliceIds::default();
    let mut known: HashMap<GroupsKey<'_>, usize> = HashMap::new();
    let mut distinct: Vec<Arc<[Vec<usize>]>> = Vec::new();
    // Parameters of several placements: the concatenation, per sequence of distinct ones.
    let mut joined: HashMap<Vec<usize>, Arc<[Vec<usize>]>> = HashMap::new();
    let mut map: RedundancyMap = Vec::with_capacity(strategy.params().len());
    for p in strategy.params() {
        let mut ids = Vec::with_capacity(p.placements.len());
        for pl in &p.placements {
            let mesh = pl.mp.mesh();
            let key = GroupsKey {
                ranks: lists.id(mesh.rank_list()),
                sizes: mesh.device_matrix(),
                interleave: mesh.interleave_factor(),
                dims: pl.mp.dims(),
                opt_shard: pl.opt_shard,
            };
            ids.push(*known.entry(key).or_insert_with(|| {
                distinct.push(placement_groups(pl).into());
                distinct.len() - 1
            }));
        }
        let groups = match ids.as_slice() {
            [one] => distinct[*one].clone(),
            _ => joined
                .entry(ids)
                .or_insert_with_key(|ids| {
                    ids.iter()
                        .flat_map(|&i| distinct[i].iter().cloned())
                        .collect()
                })
                .clone(),
        };
        map.push((p.name.clone(), groups));
    }
    // Names are unique in a resolved strategy: an unstable sort gives the same order.
    map.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    map
}

/// MindSpore's `remove_param_redundancy`: one owner per replica group. Parameters sharing the
/// same group are dealt out round-robin over its ranks, in name order. Returns rank → owned
/// parameters.
pub fn remove_param_redundancy(map: &RedundancyMap) -> BTreeMap<usize, BTreeSet<String>> {
    // Each distinct group, with the parameters having it in map order (a parameter twice
    // when two of its placements have the group): found by hashing ([`SliceIds`]), not by a
    // scan of the groups seen so far, which made thousands of distinct groups quadratic.
    let mut ids = SliceIds::default();
    let mut by_group: Vec<(&[usize], Vec<&str>)> = Vec::new();
    for (name, groups) in map {
        for g in groups.iter() {
            let i = ids.id(g);
            if i == by_group.len() {
                by_group.push((g, Vec::new()));
            }
            by_group[i].1.push(name.as_str());
        }
    }
    let mut dealt: HashMap<usize, Vec<&str>> = HashMap::new();
    for (group, names) in by_group {
        if group.is_empty() {
            continue;
        }
        for (i, name) in names.into_iter().enumerate() {
            dealt.entry(group[i % group.len()]).or_default().push(name);
        }
    }
    // Each rank's names sorted once and built into their set in bulk, rather than searched
    // for and inserted one by one.
    dealt
        .into_iter()
        .map(|(rank, mut names)| {
            names.sort_unstable();
            names.dedup();
            (rank, names.into_iter().map(str::to_string).collect())
        })
        .collect()
}

/// What [`dedup_checkpoints`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DedupReport {
    /// Each rank, its file, and the parameters it kept.
    pub ranks: Vec<(usize, PathBuf, Vec<String>)>,
    /// Bytes written.
    pub data_bytes: u64,
    /// Bytes the source held.
    pub source_bytes: u64,
    /// Strategy parameters no source file holds (nothing to keep).
    pub skipped: Vec<String>,
}

/// Saves the checkpoint in `src_dir` without redundancy into `dst_dir` (same file names):
/// each replica group's copy is kept by its owner only ([`remove_param_redundancy`]); tensors
/// outside the strategy are kept everywhere. Safetensors output says
/// `remove_redundancy: "True"`. Under [`crate::Durability::OsBuffered`] nothing is fsynced
/// (still written atomically, see [`crate::Durability`]). `progress` can stop it before the
/// commit ([`Progress::stop_requested`]).
pub fn dedup_checkpoints(
    src_dir: &Path,
    strategy: &Path,
    dst_dir: &Path,
    force: bool,
    durability: Durability,
    progress: &dyn Progress,
) -> Result<DedupReport> {
    let sources = SourceSet::rank_dirs(src_dir)?;
    let strategy = sources.load_strategy(strategy)?;
    // Bound to the files, as a conversion's source is: a strategy of another device count or
    // other slice shapes is refused here, before anything is dropped as redundant.
    let (resolved, _) = sources.resolve_source(&strategy)?;
    let owners = remove_param_redundancy(&parameter_redundancy(&resolved));
    let rank_files = sources.rank_files().expect("rank directories").clone();
    let mut stored: BTreeSet<String> = BTreeSet::new();
    for path in rank_files.files.values() {
        stored.extend(sources.open(path)?.tensors().iter().map(|t| t.name.clone()));
    }
    let mut plans = Vec::new();
    let mut report = DedupReport::default();
    for p in &strategy.params {
        if !stored.contains(&p.name) {
            report.skipped.push(p.name.clone());
        }
    }
    for (&rank, path) in &rank_files.files {
        let file = sources.open(path)?;
        let owned = owners.get(&rank);
        let mut items = Vec::new();
        for t in file.tensors() {
            report.source_bytes += t.n_bytes;
            let in_strategy = strategy.param(&t.name).is_some();
            if in_strategy && !owned.is_some_and(|o| o.contains(&t.name)) {
                continue;
            }
            items.push(OutItem::whole(&file, t));
        }
        for name in owned.into_iter().flatten() {
            if file.tensor(name).is_none() && stored.contains(name) {
                return Err(CkptError::TensorMissing {
                    path: path.clone(),
                    tensor: name.clone(),
                    rule: format!("rank {rank} owns it in the redundancy-free assignment"),
                });
            }
        }
        let rel = Path::new(&format!("rank_{rank}")).join(path.file_name().expect("a file"));
        let mut metadata: Vec<(String, String)> = file
            .metadata()
            .iter()
            .filter(|(k, _)| !["remove_redundancy", "crc_num", SET_ID_KEY].contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !metadata.iter().any(|(k, _)| k == "format") {
            metadata.insert(0, ("format".to_string(), "ms".to_string()));
        }
        metadata.push(("remove_redundancy".to_string(), "True".to_string()));
        plans.push((rank, rel, items, metadata));
    }
    let set = SetWriter::begin_apart(dst_dir, &[src_dir], "ckpt dedup", force, durability)?;
    let total: u64 = plans
        .iter()
        .flat_map(|(_, _, items, _)| items.iter().map(|i| i.meta.n_bytes))
        .sum();
    progress.start("deduplicating", total);
    let committer = Committer::new();
    let write = WriteOptions {
        format: rank_files.format,
        force,
        crc: false,
        chunk_bytes: DEFAULT_CHUNK_BYTES,
        progress,
        durability,
        committer: Some(&committer),
        rename: None,
    };
    for (rank, rel, items, mut metadata) in plans {
        metadata.push(set.metadata_entry());
        let names = items.iter().map(|i| i.meta.name.clone()).collect();
        let stats = write_items(&sources, &set.staged(&rel), items, &metadata, &write)?;
        report.data_bytes += stats.data_bytes;
        report.ranks.push((rank, set.final_path(&rel), names));
    }
    committer.finish()?;
    // The last poll: a stop asked for by now drops the staged set.
    stop_point(progress)?;
    set.commit()?;
    progress.finish();
    Ok(report)
}

/// The redundancy map of a strategy file (no checkpoint needed).
pub fn redundancy_of_file(strategy: &Path) -> Result<RedundancyMap> {
    Ok(parameter_redundancy(
        &Strategy::load(strategy)?.resolve_scale_free()?,
    ))
}
