//! Operations on source files named one by one rather than found under `rank_<N>/`: MindSpore's
//! `convert_checkpoint_by_rank` (a `{rank: file}` map in, one named file out) and reading one
//! destination rank's tensors into memory (`load_distributed_checkpoint` returning arrays).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use layout::SliceBox;
use tensor::Tensor;

use super::convert::{
    order_like, resolve_conversion, unified_target, ConvertOptions, RankReport, ResolvedConversion,
};
use super::engine::execute::write_items;
use super::engine::gather::fill_chunk;
use super::engine::options::data_bytes;
use super::engine::plan::{plan_rank, Extras, ItemSource, RankPlan};
use crate::error::{CkptError, Result};
use crate::format::crypto::Decryption;
use crate::format::Format;
use crate::model::{ResolvedStrategy, Strategy};
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
/// (an unsharded source), exactly one file, given as rank 0.
fn source_files(
    files: &BTreeMap<usize, PathBuf>,
    src_strategy: Option<&Path>,
) -> Result<RankFiles> {
    if src_strategy.is_none() && files.keys().ne([0usize].iter()) {
        return Err(CkptError::UnshardedSource {
            ranks: files.keys().copied().collect(),
        });
    }
    rank_files(files)
}

/// MindSpore's `convert_checkpoint_by_rank`: writes destination `rank`'s file to exactly
/// `dst_file` (format from its extension), reading the source files of `files` (rank → file;
/// only the ranks the rank needs must be present). Parameters outside the source strategy come
/// from the file of source rank `rank % n_src`. Without a source strategy the source is
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
    let files = source_files(files, src_strategy)?;
    let root = files.root.clone();
    let sources = SourceSet::of_rank_files(files).with_decryption(opts.decryption.cloned());
    let dst_loaded = dst_strategy.map(Strategy::load).transpose()?;
    let ResolvedConversion { src, dst, .. } = resolve_conversion(
        &sources,
        &root,
        src_strategy,
        dst_loaded.as_ref(),
        opts.allow_missing,
    )?;
    check_rank(&dst, rank)?;
    let home = rank % src.n_ranks().max(1);
    let extras = Extras {
        src_only_params: dst_strategy.is_some(),
        home_rank: Some(home),
    };
    let mut plan = plan_rank(&sources, &src, &dst, rank, extras)?;
    if format == Format::Ckpt {
        order_like(&mut plan.items, sources.extras_file(home)?.as_deref());
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
/// (MindSpore's `dec_key` / `dec_mode`).
pub fn load_rank_from_files_with(
    files: &BTreeMap<usize, PathBuf>,
    src_strategy: Option<&Path>,
    dst_strategy: Option<&Strategy>,
    rank: usize,
    dec: Option<&Decryption>,
) -> Result<Vec<(String, Tensor)>> {
    let files = source_files(files, src_strategy)?;
    let root = files.root.clone();
    let sources = SourceSet::of_rank_files(files).with_decryption(dec.cloned());
    let ResolvedConversion { src, dst, .. } =
        resolve_conversion(&sources, &root, src_strategy, dst_strategy, true)?;
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
    let extras = Extras {
        src_only_params: true,
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
