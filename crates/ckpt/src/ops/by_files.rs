//! Operations on source files named one by one rather than found under `rank_<N>/`: MindSpore's
//! `convert_checkpoint_by_rank` (a `{rank: file}` map in, one named file out) and reading one
//! destination rank's tensors into memory (`load_distributed_checkpoint` returning arrays).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use layout::SliceBox;
use tensor::Tensor;

use super::convert::{
    order_like_mindspore, resolve_conversion, unified_target, ConvertOptions, RankReport,
    ResolvedConversion,
};
use super::engine::execute::write_items;
use super::engine::gather::fill_chunk;
use super::engine::options::data_bytes;
use super::engine::plan::{plan_rank, Extras, ItemSource, RankPlan};
use crate::error::{CkptError, Result};
use crate::format::crypto::Decryption;
use crate::format::Format;
use crate::model::{ResolvedParam, ResolvedStrategy, Strategy};
use crate::source::{RankFiles, SourceSet};

/// Source files given per rank, all of one format.
fn rank_files(files: &BTreeMap<usize, PathBuf>) -> Result<RankFiles> {
    let mut format = None;
    for path in files.values() {
        let f = Format::from_path(path).ok_or_else(|| CkptError::UnknownExtension {
            path: path.clone(),
            what: "a checkpoint file name",
        })?;
        match format {
            Some((first, first_path)) if first != f => {
                return Err(CkptError::MixedFormats {
                    path: path.clone(),
                    detail: format!("{} and {}", Path::display(first_path), path.display()),
                })
            }
            None => format = Some((f, path.as_path())),
            _ => {}
        }
    }
    let Some((format, first)) = format else {
        return Err(CkptError::NoSourceFiles);
    };
    Ok(RankFiles {
        root: first.parent().unwrap_or(Path::new(".")).to_path_buf(),
        format,
        files: files.clone(),
    })
}

/// The source files of a conversion by file: with a source strategy, any ranks; without one
/// (an unsharded source), exactly one file, given as rank 0. `argument` names the caller's
/// argument in errors (MindSpore's `checkpoint_filenames` or `checkpoint_files_map`).
fn source_files(
    files: &BTreeMap<usize, PathBuf>,
    src_strategy: Option<&Strategy>,
    argument: &'static str,
) -> Result<RankFiles> {
    if src_strategy.is_none() && files.len() > 1 {
        return Err(CkptError::RankFileList {
            argument,
            rule: format!(
                "{} (ranks {}), but without a training strategy the source is unsharded: exactly 1 file needed, holding every tensor whole; give the strategy the sharded files were saved under",
                files_given(files.len()),
                rank_summary(&files.keys().copied().collect::<Vec<_>>())
            ),
        });
    }
    if src_strategy.is_none() && files.keys().ne([0usize].iter()) && !files.is_empty() {
        return Err(CkptError::UnshardedSource {
            ranks: files.keys().copied().collect(),
        });
    }
    rank_files(files)
}

/// "1 file given", "6 files given".
fn files_given(n: usize) -> String {
    format!("{n} file{} given", if n == 1 { "" } else { "s" })
}

/// Up to eight ranks in words, then how many more: error messages stay short whatever the
/// device count.
fn rank_summary(ranks: &[usize]) -> String {
    const SHOWN: usize = 8;
    let head: Vec<String> = ranks.iter().take(SHOWN).map(usize::to_string).collect();
    match ranks.len() {
        0 => "none".to_string(),
        n if n <= SHOWN => format!("[{}]", head.join(", ")),
        n => format!("[{}, … and {} more]", head.join(", "), n - SHOWN),
    }
}

/// `strategy`'s devices in words for an error: the count, the ranks, and the pipeline stages
/// they span.
fn devices_in_words(strategy: &Strategy, n: usize) -> String {
    if n == 0 {
        return format!(
            "the training strategy {} places no parameter on any device",
            strategy.path.display()
        );
    }
    let stages = strategy.n_stages();
    let across = if stages > 1 {
        format!(", across its {stages} pipeline stages")
    } else {
        String::new()
    };
    format!(
        "the training strategy {} was saved on {n} devices (ranks 0..={}{across})",
        strategy.path.display(),
        n.saturating_sub(1)
    )
}

/// MindSpore's rule for `checkpoint_filenames`: one file per training device, in rank order,
/// so the ranks given are `0..n` for the `n` devices of `strategy`. Too few files or a gap is
/// an error naming the argument, the count given and the count needed; files past the devices
/// are judged by [`check_past_ranks`] once they can be read.
fn check_every_rank(
    files: &BTreeMap<usize, PathBuf>,
    strategy: &Strategy,
    argument: &'static str,
) -> Result<()> {
    let n = strategy.n_ranks();
    if files.keys().copied().eq(0..n) {
        return Ok(());
    }
    let given: Vec<usize> = files.keys().copied().collect();
    let devices = devices_in_words(strategy, n);
    let rule = if given.iter().copied().eq(0..given.len()) {
        if given.len() > n {
            // Longer: the files past the strategy's ranks are checked by `check_past_ranks`
            // once they can be read.
            return Ok(());
        }
        format!(
            "{} given, but {devices}: exactly {n} needed, one per training rank in rank order",
            files_given(given.len())
        )
    } else {
        let missing: Vec<usize> = (0..n).filter(|r| !files.contains_key(r)).collect();
        let past: Vec<usize> = files.range(n..).map(|(r, _)| *r).collect();
        let mut faults = Vec::new();
        if !missing.is_empty() {
            faults.push(format!("ranks {} have no file", rank_summary(&missing)));
        }
        if missing.is_empty() {
            // Only ranks past the devices: `check_past_ranks` judges them.
            return Ok(());
        }
        if !past.is_empty() {
            faults.push(format!(
                "ranks {} are past its devices",
                rank_summary(&past)
            ));
        }
        format!(
            "{} for ranks {}, but {devices}: exactly {n} needed, one for each rank 0..={}; {}",
            files_given(given.len()),
            rank_summary(&given),
            n.saturating_sub(1),
            faults.join(" and ")
        )
    };
    Err(CkptError::RankFileList { argument, rule })
}

/// Files for ranks past the `n` devices of `strategy` (`checkpoint_filenames` longer than
/// `n`, `checkpoint_files_map` keys from `n` on) are refused when they hold data the strategy
/// does not account for ([`SourceSet::stray_ranks`]): a parameter shard (the files of a
/// checkpoint saved on more devices), or a tensor outside the strategy that the home rank's
/// file lacks. A file holding only what its home rank holds outside the strategy (the step
/// counter of a pipeline stage that saves no parameter, which Tessera's sets hold) is a rank
/// of the training all the same, so it is accepted, as the directory readers accept it.
fn check_past_ranks(
    sources: &SourceSet,
    files: &BTreeMap<usize, PathBuf>,
    strategy: &Strategy,
    argument: &'static str,
) -> Result<()> {
    let n = strategy.n_ranks();
    if files.range(n..).next().is_none() {
        return Ok(());
    }
    let stray = sources.stray_ranks(strategy, n)?;
    let Some((first, reason)) = stray.first() else {
        return Ok(());
    };
    let reason = match files.get(first) {
        Some(path) => reason.replacen(
            &format!("rank_{first}/"),
            &format!("the file of rank {first} ({})", path.display()),
            1,
        ),
        None => reason.clone(),
    };
    let hint = if strategy.n_stages() <= 1 {
        "; if the training ran several pipeline stages, merge their strategy files first (tessera strategy merge-stages) and give the merged file"
    } else {
        ""
    };
    let needed = if argument == "checkpoint_filenames" {
        format!("{n} needed, one per training rank in rank order")
    } else {
        format!("ranks 0..={} only", n.saturating_sub(1))
    };
    Err(CkptError::RankFileList {
        argument,
        rule: format!(
            "{} for ranks {}, but {}: {needed}; ranks {} are past its devices, and {reason}{hint}",
            files_given(files.len()),
            rank_summary(&files.keys().copied().collect::<Vec<_>>()),
            devices_in_words(strategy, n),
            rank_summary(&stray.iter().map(|(r, _)| *r).collect::<Vec<_>>()),
        ),
    })
}

/// One file given for two ranks is refused when the two ranks hold different data under the
/// source strategy `src` (different slices of a parameter, or a parameter one holds and the
/// other not): one of them would be read as the other's shard, a silently wrong result.
/// Replicas (ranks holding the same slices, as in pure data parallelism) may share a file.
/// Paths are compared as the file system resolves them, so `a/../a/x.ckpt` is `a/x.ckpt`.
fn check_shared_files(
    files: &BTreeMap<usize, PathBuf>,
    src: &ResolvedStrategy,
    src_path: &Path,
    argument: &'static str,
) -> Result<()> {
    let mut first_of: HashMap<PathBuf, usize> = HashMap::new();
    for (&rank, path) in files {
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        let Some(&first) = first_of.get(&key) else {
            first_of.insert(key, rank);
            continue;
        };
        let held = |p: &ResolvedParam, r: usize| {
            p.placement_of_rank(r)
                .map(|(pl, slot)| pl.held.slot_box(slot))
        };
        if let Some(p) = src
            .params()
            .iter()
            .find(|p| held(p, first) != held(p, rank))
        {
            return Err(CkptError::RankFileList {
                argument,
                rule: format!(
                    "ranks {first} and {rank} are given the same file {}, but under the training strategy {} they hold different data (parameter {:?}); give each rank its own file",
                    path.display(),
                    src_path.display(),
                    p.name
                ),
            });
        }
    }
    Ok(())
}

/// A source rank the plan needs that the caller's file map lacks, said in the caller's terms
/// (the generic message speaks of `rank_<N>/` folders, which a file map has none of).
fn missing_rank_in<'a>(
    files: &'a BTreeMap<usize, PathBuf>,
    argument: &'static str,
    dst_rank: usize,
) -> impl FnOnce(CkptError) -> CkptError + 'a {
    move |e| match e {
        CkptError::MissingRank { rank, .. } => CkptError::RankFileList {
            argument,
            rule: missing_rank_rule(files, dst_rank, rank),
        },
        other => other,
    }
}

/// The rule of [`missing_rank_in`]'s error.
fn missing_rank_rule(files: &BTreeMap<usize, PathBuf>, dst_rank: usize, rank: usize) -> String {
    let given = rank_summary(&files.keys().copied().collect::<Vec<_>>());
    format!(
        "destination rank {dst_rank} needs source rank {rank}, which has no file (files given for ranks {given}); rank_list_for_convert / tessera ckpt ranks lists the ranks needed"
    )
}

/// MindSpore's `convert_checkpoint_by_rank`: writes destination `rank`'s file to exactly
/// `dst_file` (format from its extension), reading the source files of `files` (rank → file;
/// only the ranks the rank needs must be present; a rank past the source strategy's devices, a
/// needed rank without a file, or one file for two ranks holding different slices is
/// [`CkptError::RankFileList`]). Parameters outside the source strategy come from the file of
/// source rank `rank % n_src`. Without a source strategy the source is
/// unsharded: one file, given as rank 0, holding every tensor whole. The file is written
/// atomically; an existing one is replaced only with `opts.force`. `opts.ranks` and
/// `opts.prefix` are ignored.
pub fn convert_checkpoint_files(
    rank: usize,
    files: &BTreeMap<usize, PathBuf>,
    src_strategy: Option<&Path>,
    dst_file: &Path,
    dst_strategy: Option<&Path>,
    opts: &ConvertOptions<'_>,
) -> Result<RankReport> {
    let format = Format::from_path(dst_file).ok_or_else(|| CkptError::UnknownExtension {
        path: dst_file.to_path_buf(),
        what: "the output name",
    })?;
    if files.values().any(|f| f == dst_file) {
        return Err(CkptError::UnsafeDestination {
            path: dst_file.to_path_buf(),
            rule: "the output file is one of the source files; write it elsewhere".to_string(),
        });
    }
    let argument = "checkpoint_files_map";
    let src_loaded = src_strategy.map(Strategy::load).transpose()?;
    if let Some(src) = &src_loaded {
        src.check_stages()?;
    }
    let given = files;
    let files = source_files(files, src_loaded.as_ref(), argument)?;
    let root = files.root.clone();
    let sources = SourceSet::of_rank_files(files).with_decryption(opts.decryption.cloned());
    if let Some(src) = &src_loaded {
        check_past_ranks(&sources, given, src, argument)?;
    }
    let dst_loaded = dst_strategy.map(Strategy::load).transpose()?;
    let ResolvedConversion { src, dst, .. } = resolve_conversion(
        &sources,
        &root,
        src_loaded.as_ref(),
        dst_loaded.as_ref(),
        opts.allow_missing,
    )?;
    if let Some(path) = src_strategy {
        check_shared_files(given, &src, path, argument)?;
    }
    check_rank(&dst, rank)?;
    let home = rank % src.n_ranks().max(1);
    let extras = Extras {
        src_only_params: dst_strategy.is_some(),
        home_rank: Some(home),
    };
    let mut plan = plan_rank(&sources, &src, &dst, rank, extras)
        .map_err(missing_rank_in(given, argument, rank))?;
    if format == Format::Ckpt {
        let home = sources.extras_file(home)?;
        let cover = plan.cover.ranks.clone();
        order_like_mindspore(
            &mut plan.items,
            &sources,
            &cover,
            home.as_deref(),
            &src,
            &dst,
        )?;
    }
    let write = opts.write_options(format, None);
    opts.progress.start("converting", data_bytes(&plan.items));
    let meta = [("format".to_string(), "ms".to_string())];
    let stats = write_items(&sources, dst_file, plan.items, &meta, &write)?;
    opts.progress.finish();
    Ok(RankReport {
        rank,
        path: stats.path,
        source_ranks: plan.cover.ranks,
        exact: plan.cover.exact,
        n_tensors: stats.n_tensors,
        data_bytes: stats.data_bytes,
    })
}

/// The tensors destination `rank` holds under `dst_strategy`, read from the per-rank source
/// `files` (rank → file) saved under `src_strategy`, in memory: MindSpore's
/// `load_distributed_checkpoint` with `checkpoint_filenames`. Tensors outside the source
/// strategy come whole from source rank `rank % n_src`.
///
/// As MindSpore requires, `files` holds one file for every training device: ranks `0..n` for
/// the `n` devices `src_strategy` places parameters on (a merged pipeline strategy: every
/// stage's ranks). Too few files, a gap, or files past `n` holding data the strategy does not
/// account for (a shard, or a tensor outside the strategy that the home rank's file lacks) is
/// [`CkptError::RankFileList`], naming the counts given and needed. Files past `n` holding
/// only what their home rank holds outside the strategy (the step counter of a pipeline stage
/// that saves no parameter) are accepted.
pub fn load_rank_from_files(
    files: &BTreeMap<usize, PathBuf>,
    src_strategy: &Path,
    dst_strategy: &Path,
    rank: usize,
) -> Result<Vec<(String, Tensor)>> {
    load_rank_from_files_with(
        files,
        Some(src_strategy),
        Some(&Strategy::load(dst_strategy)?),
        rank,
        None,
    )
}

/// [`load_rank_from_files`] for a destination strategy already in memory (for instance one
/// built from MindSpore's layout dict, [`Strategy::from_layout_lists`]) or none (MindSpore's
/// `predict_strategy=None`: every tensor whole, on rank 0), for an unsharded source (no
/// source strategy: one file, given as rank 0), reading encrypted `.ckpt` files with `dec`
/// (MindSpore's `dec_key` / `dec_mode`). `files` follows the rule of [`load_rank_from_files`].
/// A parameter of either strategy that no file holds is [`CkptError::TensorMissing`].
pub fn load_rank_from_files_with(
    files: &BTreeMap<usize, PathBuf>,
    src_strategy: Option<&Path>,
    dst_strategy: Option<&Strategy>,
    rank: usize,
    dec: Option<&Decryption>,
) -> Result<Vec<(String, Tensor)>> {
    load_rank_from_files_allowing(files, src_strategy, dst_strategy, rank, dec, false)
}

/// [`load_rank_from_files_with`] that, with `allow_missing`, leaves out the parameters of
/// either strategy that no file holds instead of refusing (`ckpt convert --allow-missing`).
pub fn load_rank_from_files_allowing(
    files: &BTreeMap<usize, PathBuf>,
    src_strategy: Option<&Path>,
    dst_strategy: Option<&Strategy>,
    rank: usize,
    dec: Option<&Decryption>,
    allow_missing: bool,
) -> Result<Vec<(String, Tensor)>> {
    let argument = "checkpoint_filenames";
    let src_loaded = src_strategy.map(Strategy::load).transpose()?;
    if let Some(src) = &src_loaded {
        src.check_stages()?;
        check_every_rank(files, src, argument)?;
    }
    let given = files;
    let files = source_files(files, src_loaded.as_ref(), argument)?;
    let root = files.root.clone();
    let sources = SourceSet::of_rank_files(files).with_decryption(dec.cloned());
    if let Some(src) = &src_loaded {
        check_past_ranks(&sources, given, src, argument)?;
    }
    let ResolvedConversion { src, dst, .. } = resolve_conversion(
        &sources,
        &root,
        src_loaded.as_ref(),
        dst_strategy,
        allow_missing,
    )?;
    if let Some(path) = src_strategy {
        check_shared_files(given, &src, path, argument)?;
    }
    check_rank(&dst, rank)?;
    let extras = Extras {
        src_only_params: true,
        home_rank: Some(rank % src.n_ranks().max(1)),
    };
    let plan = plan_rank(&sources, &src, &dst, rank, extras)?;
    read_plan(&sources, plan)
}

/// The tensors destination `rank` holds under `strategy`, read in memory from the unified
/// checkpoint in `unified_dir` (see [`crate::unified_safetensors`]); the tensors of its
/// `hyper_param.safetensors` come whole.
pub fn load_rank_from_unified(
    unified_dir: &Path,
    strategy: &Path,
    rank: usize,
) -> Result<Vec<(String, Tensor)>> {
    load_rank_from_unified_with(unified_dir, Some(&Strategy::load(strategy)?), rank)
}

/// [`load_rank_from_unified`] for a strategy already in memory, or none (every tensor whole, on
/// rank 0: MindSpore's `predict_strategy=None`).
pub fn load_rank_from_unified_with(
    unified_dir: &Path,
    strategy: Option<&Strategy>,
    rank: usize,
) -> Result<Vec<(String, Tensor)>> {
    let sources = SourceSet::unified(unified_dir)?;
    let src = sources.unified_strategy()?;
    let (dst, _) = unified_target(&sources, &src, strategy)?;
    check_rank(&dst, rank)?;
    // Only what the strategy lists (and hyper_param.safetensors), as MindSpore loads.
    let extras = Extras {
        src_only_params: false,
        home_rank: Some(0),
    };
    let plan = plan_rank(&sources, &src, &dst, rank, extras)?;
    read_plan(&sources, plan)
}

fn check_rank(dst: &ResolvedStrategy, rank: usize) -> Result<()> {
    let all = dst.ranks();
    if all.contains(&rank) {
        return Ok(());
    }
    Err(CkptError::NotADestinationRank { rank, ranks: all })
}

/// Reads every item of a plan into a tensor.
fn read_plan(sources: &SourceSet, plan: RankPlan<'_>) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::with_capacity(plan.items.len());
    let mut scratch = Vec::new();
    for item in &plan.items {
        let name = &item.meta.name;
        let Some(dtype) = item.meta.dtype() else {
            return Err(CkptError::Unsupported {
                path: sources.root().to_path_buf(),
                tensor: name.clone(),
                reason: format!(
                    "MindSpore type {} has no array dtype",
                    item.meta.ty.mindspore_name()
                ),
            });
        };
        let mut tensor = Tensor::zeros(dtype, &item.meta.shape);
        match &item.source {
            ItemSource::Gather { .. } => {
                let whole = SliceBox::full(&item.meta.shape);
                fill_chunk(sources, item, &whole, tensor.as_bytes_mut(), &mut scratch)?;
            }
            ItemSource::Stored { file, region } => {
                let t = file.tensor(name).ok_or_else(|| CkptError::TensorMissing {
                    path: file.path().to_path_buf(),
                    tensor: name.clone(),
                    rule: "the plan reads it from this file".to_string(),
                })?;
                let region = region.clone().unwrap_or_else(|| SliceBox::full(&t.shape));
                let zero = vec![0; region.ndim()];
                let shape = region.shape.clone();
                file.read_box(
                    t,
                    &region,
                    tensor.as_bytes_mut(),
                    &shape,
                    &zero,
                    &mut scratch,
                )?;
            }
        }
        out.push((name.clone(), tensor));
    }
    Ok(out)
}
