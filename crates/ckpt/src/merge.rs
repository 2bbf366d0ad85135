//! Merging all ranks into full tensors: MindSpore's `unified_safetensors`.
//!
//! Output: `part<i>.safetensors` (parameters assigned largest first to the lightest part, about
//! `max_part_bytes` each), `param_name_map.json` and, for tensors outside the strategy found in
//! rank 0's file, `hyper_param.safetensors`.

use std::path::{Path, PathBuf};

use layout::SliceBox;

use crate::ckpt_file::Format;
use crate::error::Result;
use crate::execute::{data_bytes, write_items, WriteOptions, DEFAULT_CHUNK_BYTES};
use crate::json::Json;
use crate::plan::{plan_gathers, ItemSource, OutItem};
use crate::progress::{NoProgress, Progress};
use crate::set::SetWriter;
use crate::sources::{SourceSet, HYPER_PARAM_FILE, PARAM_NAME_MAP};
use crate::strategy::Strategy;

/// MindSpore's default part size: 3 GiB.
pub const DEFAULT_PART_BYTES: u64 = 3 << 30;

/// Options of [`unified_safetensors`].
#[derive(Clone, Copy)]
pub struct MergeOptions<'a> {
    /// Target size of one part file.
    pub max_part_bytes: u64,
    /// The sources were saved without redundancy (`remove_redundancy`). Tessera reads each
    /// piece from whichever replica holds it either way; the flag only records the expectation
    /// (warnings when files disagree, and the output metadata MindSpore writes).
    pub dedup: bool,
    /// Replace existing destination files.
    pub force: bool,
    /// Largest chunk of one tensor held in memory.
    pub chunk_bytes: usize,
    /// Progress sink.
    pub progress: &'a dyn Progress,
}

impl Default for MergeOptions<'_> {
    fn default() -> Self {
        MergeOptions {
            max_part_bytes: DEFAULT_PART_BYTES,
            dedup: false,
            force: false,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            progress: &NoProgress,
        }
    }
}

impl std::fmt::Debug for MergeOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MergeOptions")
            .field("max_part_bytes", &self.max_part_bytes)
            .field("dedup", &self.dedup)
            .field("force", &self.force)
            .finish()
    }
}

/// What a merge wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeReport {
    /// Each part file and the parameters in it.
    pub parts: Vec<(PathBuf, Vec<String>)>,
    /// `param_name_map.json`.
    pub index: PathBuf,
    /// `hyper_param.safetensors`, when there were tensors outside the strategy.
    pub hyper: Option<PathBuf>,
    /// Source ranks read.
    pub source_ranks: Vec<usize>,
    /// Bytes of full tensors written (`total_size` in the index).
    pub total_size: u64,
    /// Parameters left out, with the reason.
    pub skipped: Vec<(String, String)>,
    /// Things worth telling the user.
    pub warnings: Vec<String>,
}

/// Largest first, each into the currently lightest bucket (ties: lowest index).
pub(crate) fn assign_parts(sizes: &[u64], n_parts: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]));
    let mut load = vec![0u64; n_parts.max(1)];
    let mut part = vec![0; sizes.len()];
    for i in order {
        let lightest = (0..load.len())
            .min_by_key(|&p| (load[p], p))
            .expect("a part");
        part[i] = lightest;
        load[lightest] += sizes[i];
    }
    part
}

/// MindSpore's `unified_safetensors`: writes every parameter of `strategy` found in the
/// checkpoint under `src_dir` whole into `dst_dir`.
pub fn unified_safetensors(
    src_dir: &Path,
    strategy: &Path,
    dst_dir: &Path,
    opts: &MergeOptions<'_>,
) -> Result<MergeReport> {
    let sources = SourceSet::rank_dirs(src_dir)?;
    let strategy = Strategy::load(strategy)?;
    let (src, unknown) = sources.resolve_source(&strategy)?;
    let mut report = MergeReport {
        skipped: unknown
            .into_iter()
            .map(|n| (n, "in the strategy but in no source file".to_string()))
            .collect(),
        ..MergeReport::default()
    };
    let params: Vec<_> = src
        .params()
        .iter()
        .filter(|p| {
            let skip = p.name.starts_with("accu_grads");
            if skip {
                report
                    .skipped
                    .push((p.name.clone(), "gradient accumulation buffer".to_string()));
            }
            !skip
        })
        .collect();
    let boxes = params
        .iter()
        .map(|p| (*p, SliceBox::full(&p.shape)))
        .collect();
    let plan = plan_gathers(&sources, boxes)?;
    report.source_ranks = plan.cover.ranks.clone();
    for r in &report.source_ranks {
        if let Some(f) = sources.rank_file(*r)? {
            if f.removes_redundancy() != opts.dedup {
                report.warnings.push(format!(
                    "{} says remove_redundancy={}, but the merge was run {} --dedup; every piece was read from a rank that holds it either way",
                    f.path().display(),
                    f.removes_redundancy(),
                    if opts.dedup { "with" } else { "without" }
                ));
            }
        }
    }
    let sizes: Vec<u64> = plan.items.iter().map(|i| i.meta.n_bytes).collect();
    report.total_size = sizes.iter().sum();
    let n_parts = (report.total_size.div_ceil(opts.max_part_bytes.max(1)) as usize)
        .clamp(1, sizes.len().max(1));
    let part_of = assign_parts(&sizes, n_parts);
    let mut parts: Vec<Vec<OutItem<'_>>> = vec![Vec::new(); n_parts];
    for (item, &p) in plan.items.into_iter().zip(&part_of) {
        parts[p].push(item);
    }
    // Tensors outside the strategy, from rank 0's file.
    let mut hyper_items = Vec::new();
    if let Some(file) = sources.extras_file(0)? {
        for t in file.tensors() {
            if strategy.param(&t.name).is_none() {
                hyper_items.push(OutItem {
                    meta: crate::ckpt_file::TensorMeta {
                        name: t.name.clone(),
                        ty: t.ty.clone(),
                        shape: t.shape.clone(),
                        n_bytes: t.n_bytes,
                    },
                    source: ItemSource::Stored {
                        file: file.clone(),
                        region: None,
                    },
                });
            }
        }
    }
    let set = SetWriter::begin_apart(dst_dir, &[src_dir], "ckpt merge", opts.force)?;
    let part_name = |i: usize| PathBuf::from(format!("part{i}.safetensors"));
    let committer = crate::atomic_write::Committer::new();
    let write = WriteOptions {
        format: Format::Safetensors,
        force: opts.force,
        crc: false,
        chunk_bytes: opts.chunk_bytes,
        progress: opts.progress,
        committer: Some(&committer),
    };
    let mut metadata = vec![
        ("format".to_string(), "ms".to_string()),
        set.metadata_entry(),
    ];
    if opts.dedup {
        // MindSpore marks merged output from deduplicated sources this way.
        metadata.push(("remove_redundancy".to_string(), "False".to_string()));
    }
    let total = report.total_size + data_bytes(&hyper_items);
    opts.progress.start("merging", total);
    // Index in MindSpore's order: largest parameter first.
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]));
    let weight_map: Vec<(String, Json)> = order
        .iter()
        .map(|&i| {
            (
                params[i].name.clone(),
                Json::Str(format!("part{}.safetensors", part_of[i])),
            )
        })
        .collect();
    for (i, items) in parts.into_iter().enumerate() {
        let names = items.iter().map(|it| it.meta.name.clone()).collect();
        write_items(
            &sources,
            &set.staged(&part_name(i)),
            items,
            &metadata,
            &write,
        )?;
        report.parts.push((set.final_path(&part_name(i)), names));
    }
    if !hyper_items.is_empty() {
        let meta = [
            ("format".to_string(), "ms".to_string()),
            set.metadata_entry(),
        ];
        let rel = Path::new(HYPER_PARAM_FILE);
        write_items(&sources, &set.staged(rel), hyper_items, &meta, &write)?;
        report.hyper = Some(set.final_path(rel));
    }
    let index = Json::obj([
        (
            "metadata",
            Json::obj([("total_size", Json::UInt(report.total_size))]),
        ),
        ("weight_map", Json::Obj(weight_map)),
    ]);
    // The index goes last, once every part is on disk.
    committer.finish()?;
    let rel = Path::new(PARAM_NAME_MAP);
    crate::atomic_write::write_file(&set.staged(rel), index.to_pretty(4).as_bytes(), false)?;
    report.index = set.final_path(rel);
    set.commit()?;
    opts.progress.finish();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_first_into_lightest() {
        assert_eq!(assign_parts(&[5, 9, 4, 3], 2), vec![1, 0, 1, 0]);
        assert_eq!(assign_parts(&[1, 1, 1], 1), vec![0, 0, 0]);
    }
}
