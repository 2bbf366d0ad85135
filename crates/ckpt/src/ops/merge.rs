//! Merging all ranks into full tensors: MindSpore's `unified_safetensors`.
//!
//! Output: `part<i>.safetensors` (parameters assigned largest first to the lightest part, about
//! `max_part_bytes` each), `param_name_map.json` and, for tensors outside the strategy found in
//! rank 0's file, `hyper_param.safetensors`.

use std::path::{Path, PathBuf};

use layout::SliceBox;

use super::engine::execute::write_items;
use super::engine::options::{data_bytes, WriteOptions, DEFAULT_CHUNK_BYTES};
use super::engine::plan::{plan_gathers, OutItem};
use crate::error::{CkptError, Result};
use crate::format::unified_index::{self, HYPER_PARAM_FILE, PARAM_NAME_MAP};
use crate::format::Format;
use crate::io::atomic_write::{remove_stale_temporaries, write_file_with, Committer, CreatedDirs};
use crate::io::durability::Durability;
use crate::model::ResolvedParam;
use crate::progress::{stop_point, NoProgress, Progress};
use crate::set::{writer::check_apart, SetWriter, SET_MARKER};
use crate::source::SourceSet;

/// MindSpore's default part size: 3 GiB.
pub const DEFAULT_PART_BYTES: u64 = 3 << 30;

/// What `choice_func` decides for one parameter of a merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamChoice {
    /// Merge it under its own name (`True`).
    Keep,
    /// Leave it out (`False`).
    Drop,
    /// Merge it under this name, in the part file and the index (a `str`).
    Rename(String),
}

/// A parameter filter: MindSpore's `choice_func(name)`.
pub type ChoiceFn<'a> = &'a (dyn Fn(&str) -> Result<ParamChoice> + Sync);

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
    /// Progress sink; it can stop the merge before its commit
    /// ([`Progress::stop_requested`], [`CkptError::Stopped`]).
    pub progress: &'a dyn Progress,
    /// Only the safetensors files whose names end in `<file_suffix>.safetensors` are sources
    /// (MindSpore's `file_suffix`; see [`crate::RankFiles::discover_with_suffix`]).
    pub file_suffix: Option<&'a str>,
    /// Decides, per parameter, to keep, drop or rename it (MindSpore's `choice_func`).
    pub choice: Option<ChoiceFn<'a>>,
    /// `(k, total)`: write only the `k`-th (1-based) of `total` contiguous runs of part files
    /// (MindSpore's `split_dst_file`); the index and the hyper-parameter file only when
    /// `k == 1`. The parts are planned the same way in every run, so `total` runs with
    /// `k = 1..=total` into one directory write every part once.
    pub split: Option<(usize, usize)>,
    /// Flush every part, the index, the set marker and the directories to disk before the
    /// merge returns (default). Off, the output is still written atomically (a failed or
    /// killed process leaves the old set or the new one), but a power loss or OS crash soon
    /// after may lose it.
    pub fsync: bool,
}

impl MergeOptions<'_> {
    /// The durability [`MergeOptions::fsync`] asks for.
    pub fn durability(&self) -> Durability {
        Durability::from_fsync(self.fsync)
    }
}

impl Default for MergeOptions<'_> {
    fn default() -> Self {
        MergeOptions {
            max_part_bytes: DEFAULT_PART_BYTES,
            dedup: false,
            force: false,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            progress: &NoProgress,
            file_suffix: None,
            choice: None,
            split: None,
            fsync: true,
        }
    }
}

impl std::fmt::Debug for MergeOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MergeOptions")
            .field("max_part_bytes", &self.max_part_bytes)
            .field("dedup", &self.dedup)
            .field("force", &self.force)
            .field("file_suffix", &self.file_suffix)
            .field("choice", &self.choice.map(|_| "<fn>"))
            .field("split", &self.split)
            .field("fsync", &self.fsync)
            .finish()
    }
}

/// The part files run `k` of `total` writes, out of `n_parts`: MindSpore's split of
/// `split_dst_file` (the first `n_parts % total` runs take one part more).
pub fn split_range(n_parts: usize, k: usize, total: usize) -> std::ops::Range<usize> {
    let avg = n_parts / total;
    let rem = n_parts % total;
    let start = avg * (k - 1) + (k - 1).min(rem);
    let end = start + avg + usize::from(k <= rem);
    start..end
}

fn check_split(split: Option<(usize, usize)>) -> Result<()> {
    match split {
        Some((k, total)) if total == 0 || k == 0 || k > total => Err(CkptError::InvalidOption {
            option: "split_dst_file",
            rule: format!("({k}, {total}) is invalid: it must be (k, total) with 1 <= k <= total"),
        }),
        _ => Ok(()),
    }
}

/// What a merge wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeReport {
    /// Each part file and the parameters in it.
    pub parts: Vec<(PathBuf, Vec<String>)>,
    /// `param_name_map.json` (`None` for a split run other than the first, which writes none).
    pub index: Option<PathBuf>,
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
///
/// Without `opts.split` the output is one checkpoint set (committed at once, see
/// [`crate::SetWriter`]) holding also the source set's layout-independent side files
/// (`model.json`, `train_state.json`, when its marker lists them). With `opts.split` several
/// runs fill one directory, so each file is written atomically on its own and the directory
/// carries no set marker (and no side file).
pub fn unified_safetensors(
    src_dir: &Path,
    strategy: &Path,
    dst_dir: &Path,
    opts: &MergeOptions<'_>,
) -> Result<MergeReport> {
    check_split(opts.split)?;
    let sources = SourceSet::rank_dirs_with_suffix(src_dir, opts.file_suffix)?;
    let strategy = sources.load_strategy(strategy)?;
    let (src, unknown) = sources.resolve_source(&strategy)?;
    let mut report = MergeReport {
        skipped: unknown
            .into_iter()
            .map(|n| (n, "in the strategy but in no source file".to_string()))
            .collect(),
        ..MergeReport::default()
    };
    // Output name of every kept parameter.
    let mut params: Vec<&ResolvedParam> = Vec::new();
    let mut out_names: Vec<String> = Vec::new();
    for p in src.params() {
        if p.name.starts_with("accu_grads") {
            report
                .skipped
                .push((p.name.clone(), "gradient accumulation buffer".to_string()));
            continue;
        }
        let out = match opts.choice.map(|f| f(&p.name)).transpose()? {
            None | Some(ParamChoice::Keep) => p.name.clone(),
            Some(ParamChoice::Drop) => {
                report
                    .skipped
                    .push((p.name.clone(), "dropped by choice_func".to_string()));
                continue;
            }
            Some(ParamChoice::Rename(n)) => n,
        };
        if let Some(i) = out_names.iter().position(|o| *o == out) {
            return Err(CkptError::DuplicateOutputName {
                first: params[i].name.clone(),
                second: p.name.clone(),
                name: out,
            });
        }
        params.push(p);
        out_names.push(out);
    }
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
    let (mine, first_run) = match opts.split {
        Some((k, total)) => (split_range(n_parts, k, total), k == 1),
        None => (0..n_parts, true),
    };
    // Tensors outside the strategy, from rank 0's file (written by the first run only).
    let mut hyper_items = Vec::new();
    if first_run {
        if let Some(file) = sources.extras_file(0)? {
            for t in file.tensors() {
                if strategy.param(&t.name).is_none() {
                    hyper_items.push(OutItem::whole(&file, t));
                }
            }
        }
    }
    let renames: std::collections::BTreeMap<String, String> = params
        .iter()
        .zip(&out_names)
        .filter(|(p, o)| p.name != **o)
        .map(|(p, o)| (p.name.clone(), o.clone()))
        .collect();
    // The source set's layout-independent side files (`model.json`, `train_state.json`),
    // read before anything is written and carried into the merged set, so that slicing it for
    // a strategy (`ckpt load`) hands them on to a resumed run. A split merge writes a plain
    // directory, which no reader would take them from: it carries none.
    let carried = match opts.split {
        None => sources.carried_files()?,
        Some(_) => Vec::new(),
    };
    let out = Out::begin(dst_dir, src_dir, opts)?;
    if let Out::Set(set) = &out {
        let names: Vec<&str> = carried.iter().map(|(n, _)| n.as_str()).collect();
        set.refuse_foreign(&names)?;
    }
    let part_name = |i: usize| PathBuf::from(format!("part{i}.safetensors"));
    if let Out::Plain(dir, _) = &out {
        // A split run killed mid-file (SIGKILL, power loss) left its temporary file: removed,
        // so a re-run leaves no hidden half-written part behind (a live run's file is locked).
        let mut names: Vec<String> = (0..n_parts)
            .map(|i| format!("part{i}.safetensors"))
            .collect();
        names.extend([PARAM_NAME_MAP.to_string(), HYPER_PARAM_FILE.to_string()]);
        for stale in remove_stale_temporaries(dir, &names)? {
            report.warnings.push(format!(
                "removed {}, the unfinished file of a merge that was killed",
                stale.display()
            ));
        }
    }
    let committer = Committer::new();
    let write = WriteOptions {
        format: Format::Safetensors,
        force: opts.force,
        crc: false,
        chunk_bytes: opts.chunk_bytes,
        progress: opts.progress,
        durability: opts.durability(),
        committer: Some(&committer),
        rename: (!renames.is_empty()).then_some(&renames),
    };
    let mut metadata = vec![("format".to_string(), "ms".to_string())];
    metadata.extend(out.metadata_entry());
    if opts.dedup {
        // MindSpore marks merged output from deduplicated sources this way.
        metadata.push(("remove_redundancy".to_string(), "False".to_string()));
    }
    let mine_bytes: u64 = parts[mine.clone()].iter().map(|p| data_bytes(p)).sum();
    opts.progress
        .start("merging", mine_bytes + data_bytes(&hyper_items));
    // Index in MindSpore's order: largest parameter first.
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]));
    let weight_map: Vec<(String, String)> = order
        .iter()
        .map(|&i| {
            (
                out_names[i].clone(),
                format!("part{}.safetensors", part_of[i]),
            )
        })
        .collect();
    for (i, items) in parts.into_iter().enumerate() {
        if !mine.contains(&i) {
            continue;
        }
        let names = items
            .iter()
            .map(|it| renames.get(&it.meta.name).unwrap_or(&it.meta.name).clone())
            .collect();
        write_items(
            &sources,
            &out.staged(&part_name(i)),
            items,
            &metadata,
            &write,
        )?;
        report.parts.push((out.final_path(&part_name(i)), names));
    }
    if !hyper_items.is_empty() {
        let mut meta = vec![("format".to_string(), "ms".to_string())];
        meta.extend(out.metadata_entry());
        let rel = Path::new(HYPER_PARAM_FILE);
        let plain = WriteOptions {
            rename: None,
            ..write
        };
        write_items(&sources, &out.staged(rel), hyper_items, &meta, &plain)?;
        report.hyper = Some(out.final_path(rel));
    }
    // The index goes last, once every part is on disk.
    committer.finish()?;
    // The last poll: a stop asked for by now drops the staged set (or, for a split run, writes
    // no index).
    stop_point(opts.progress)?;
    if first_run {
        let index = unified_index::to_text(report.total_size, &weight_map);
        let rel = Path::new(PARAM_NAME_MAP);
        write_file_with(
            &out.staged(rel),
            index.as_bytes(),
            opts.force || out.is_set(),
            opts.durability(),
        )?;
        report.index = Some(out.final_path(rel));
        for (name, bytes) in &carried {
            write_file_with(
                &out.staged(Path::new(name)),
                bytes,
                opts.force || out.is_set(),
                opts.durability(),
            )?;
        }
    }
    out.commit()?;
    opts.progress.finish();
    Ok(report)
}

/// Where a merge writes: a checkpoint set, or (for a split run) the plain directory, with the
/// directories the run created for it (removed if the run fails before writing into them).
enum Out {
    Set(SetWriter),
    Plain(PathBuf, CreatedDirs),
}

impl Out {
    fn begin(dst_dir: &Path, src_dir: &Path, opts: &MergeOptions<'_>) -> Result<Out> {
        if opts.split.is_none() {
            return SetWriter::begin_apart(
                dst_dir,
                &[src_dir],
                "ckpt merge",
                opts.force,
                opts.durability(),
            )
            .map(Out::Set);
        }
        check_apart(dst_dir, &[src_dir])?;
        let marker = dst_dir.join(SET_MARKER);
        if marker.exists() {
            return Err(CkptError::UnsafeDestination {
                path: dst_dir.to_path_buf(),
                rule: "the directory holds a committed checkpoint set; a split merge (split_dst_file) writes its parts into a plain directory, so give an empty or new one".to_string(),
            });
        }
        let created = CreatedDirs::create(dst_dir)?;
        Ok(Out::Plain(dst_dir.to_path_buf(), created))
    }

    fn is_set(&self) -> bool {
        matches!(self, Out::Set(_))
    }

    fn staged(&self, rel: &Path) -> PathBuf {
        match self {
            Out::Set(s) => s.staged(rel),
            Out::Plain(d, _) => d.join(rel),
        }
    }

    fn final_path(&self, rel: &Path) -> PathBuf {
        match self {
            Out::Set(s) => s.final_path(rel),
            Out::Plain(d, _) => d.join(rel),
        }
    }

    fn metadata_entry(&self) -> Option<(String, String)> {
        match self {
            Out::Set(s) => Some(s.metadata_entry()),
            Out::Plain(..) => None,
        }
    }

    fn commit(self) -> Result<()> {
        match self {
            Out::Set(s) => s.commit().map(|_| ()),
            Out::Plain(_, created) => {
                created.keep();
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_ranges_as_mindspore() {
        // 5 parts over 2 runs: 0..3 and 3..5; over 3 runs: 0..2, 2..4, 4..5.
        assert_eq!(split_range(5, 1, 2), 0..3);
        assert_eq!(split_range(5, 2, 2), 3..5);
        assert_eq!(split_range(5, 3, 3), 4..5);
        // More runs than parts: the last runs write nothing.
        assert_eq!(split_range(2, 3, 3), 2..2);
        let all: Vec<usize> = (1..=4).flat_map(|k| split_range(7, k, 4)).collect();
        assert_eq!(all, (0..7).collect::<Vec<_>>());
        assert!(check_split(Some((0, 2))).is_err());
        assert!(check_split(Some((3, 2))).is_err());
        assert!(check_split(Some((1, 0))).is_err());
        assert!(check_split(Some((2, 2))).is_ok());
    }

    #[test]
    fn largest_first_into_lightest() {
        assert_eq!(assign_parts(&[5, 9, 4, 3], 2), vec![1, 0, 1, 0]);
        assert_eq!(assign_parts(&[1, 1, 1], 1), vec![0, 0, 0]);
    }
}
