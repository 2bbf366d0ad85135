//! Loading: MindSpore's `load_segmented_checkpoints` and Tessera's convert-on-load for the
//! training runtime.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use layout::TensorLayout;
use tensor::Tensor;

use super::convert::unsharded_source;
use super::engine::execute::write_items;
use super::engine::gather::fill_chunk;
use super::engine::options::{data_bytes, WriteOptions, DEFAULT_CHUNK_BYTES};
use super::engine::plan::{plan_gathers, OutItem};
use crate::error::{io_err, CkptError, Result};
use crate::format::crypto::Decryption;
use crate::format::Format;
use crate::io::durability::Durability;
use crate::model::{ResolvedParam, StoredTensor};
use crate::progress::Progress;
use crate::source::{CheckpointFile, SourceSet};

/// One tensor of a segmented checkpoint and the file it comes from.
#[derive(Debug, Clone)]
pub struct SegmentedEntry {
    /// The file holding the winning copy.
    pub file: Arc<CheckpointFile>,
    /// The tensor.
    pub tensor: StoredTensor,
}

/// MindSpore's `load_segmented_checkpoints`: the union of every `*.ckpt` (and `*.safetensors`)
/// file in `dir`, files taken in name order, a later file's tensor replacing an earlier one's.
/// Returns the entries in first-seen order.
pub fn load_segmented_checkpoints(dir: &Path) -> Result<Vec<SegmentedEntry>> {
    load_segmented_checkpoints_with(dir, None)
}

/// [`load_segmented_checkpoints`], reading encrypted `.ckpt` files with `dec` (MindSpore's
/// `dec_key` / `dec_mode`; with a key every file must be an encrypted `.ckpt`).
pub fn load_segmented_checkpoints_with(
    dir: &Path,
    dec: Option<&Decryption>,
) -> Result<Vec<SegmentedEntry>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(dir, "list directory"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && Format::from_path(p).is_some())
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(CkptError::NoFiles {
            path: dir.to_path_buf(),
            what: ".ckpt or .safetensors file",
        });
    }
    let mut entries: Vec<SegmentedEntry> = Vec::new();
    // Name → index into `entries`: a linear search per tensor would make a file of many
    // tensors (a header is cheap to write) take quadratic time.
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for path in paths {
        let file = Arc::new(CheckpointFile::open_with(&path, dec)?);
        for t in file.tensors() {
            let entry = SegmentedEntry {
                file: file.clone(),
                tensor: t.clone(),
            };
            match index.get(&t.name) {
                Some(&i) => entries[i] = entry,
                None => {
                    index.insert(t.name.clone(), entries.len());
                    entries.push(entry);
                }
            }
        }
    }
    Ok(entries)
}

/// Writes the union of a segmented checkpoint into one file (format from `dest`'s extension),
/// atomically, fsynced or not as `durability` says. `progress` can stop it before the file is
/// renamed into place ([`Progress::stop_requested`]).
pub fn write_segmented(
    entries: &[SegmentedEntry],
    dest: &Path,
    force: bool,
    durability: Durability,
    progress: &dyn Progress,
) -> Result<PathBuf> {
    let format = Format::from_path(dest).ok_or_else(|| CkptError::UnknownExtension {
        path: dest.to_path_buf(),
        what: "the output name",
    })?;
    let items: Vec<OutItem<'_>> = entries
        .iter()
        .map(|e| OutItem::whole(&e.file, &e.tensor))
        .collect();
    let dir = dest.parent().unwrap_or(Path::new("."));
    let sources = SourceSet::empty(dir);
    progress.start("merging segments", data_bytes(&items));
    let write = WriteOptions {
        format,
        force,
        crc: false,
        chunk_bytes: DEFAULT_CHUNK_BYTES,
        progress,
        durability,
        committer: None,
        rename: None,
    };
    let meta = [("format".to_string(), "ms".to_string())];
    let stats = write_items(&sources, dest, items, &meta, &write)?;
    progress.finish();
    Ok(stats.path)
}

/// How the checkpoint a load reads was saved: which piece of which tensor each rank file holds.
#[derive(Debug, Clone, Copy)]
pub enum SourceStrategy<'a> {
    /// Under the strategy file at this path (any flavour: Tessera's JSON, MindSpore's JSON or
    /// protobuf `.ckpt`).
    File(&'a Path),
    /// Unsharded (merged): rank 0's file holds every tensor whole and the set holds no other
    /// rank, as `tessera ckpt convert` writes it without a destination strategy and as
    /// MindSpore's merged checkpoints are. A set holding other ranks is refused
    /// ([`CkptError::UnshardedSource`]): without its strategy rank 0's shards are not the
    /// tensors.
    Unsharded,
}

/// Convert-on-load for the training runtime: the tensors `rank` holds under `targets` (each a
/// parameter name and the layout the rank will hold it in), read from the checkpoint in
/// `ckpt_dir/rank_<r>/` saved under `src_strategy` (any flavour). Only the source files the
/// rank needs are opened, and only the bytes it needs are read. Every tensor is in memory at
/// once: [`for_each_rank_tensor`] hands them over one at a time instead.
pub fn load_rank_tensors(
    ckpt_dir: &Path,
    src_strategy: &Path,
    rank: usize,
    targets: &[(&str, &TensorLayout)],
) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::with_capacity(targets.len());
    let source = SourceStrategy::File(src_strategy);
    for_each_rank_tensor::<CkptError>(ckpt_dir, source, rank, targets, |name, tensor| {
        out.push((name.to_string(), tensor));
        Ok(())
    })?;
    Ok(out)
}

/// [`load_rank_tensors`] from a checkpoint saved as `source` says (under a strategy file, or
/// unsharded), each tensor handed to `take` as soon as it is read, so that no more than one of
/// them (and the read buffer) is in memory at a time. All names and layouts are checked before
/// the first tensor is read: a target's global shape must be the one the checkpoint holds (for
/// an unsharded checkpoint, the shape of the whole tensor in rank 0's file). An error from
/// `take` stops the load and is returned (`E` is `take`'s error type, which a checkpoint error
/// converts into).
pub fn for_each_rank_tensor<E: From<CkptError>>(
    ckpt_dir: &Path,
    source: SourceStrategy<'_>,
    rank: usize,
    targets: &[(&str, &TensorLayout)],
    mut take: impl FnMut(&str, Tensor) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let sources = SourceSet::rank_dirs(ckpt_dir)?;
    let (src, absent) = match source {
        SourceStrategy::File(path) => {
            let strategy = sources.load_strategy(path)?;
            sources.resolve_source(&strategy)?
        }
        SourceStrategy::Unsharded => (unsharded_source(&sources, ckpt_dir)?, Vec::new()),
    };
    // Where the tensors' names and shapes come from, for messages.
    let listed_in = match source {
        SourceStrategy::File(path) => path.to_path_buf(),
        SourceStrategy::Unsharded => sources
            .rank_files()
            .and_then(|r| r.files.get(&0).cloned())
            .unwrap_or_else(|| ckpt_dir.join("rank_0")),
    };
    let mut boxes: Vec<(&ResolvedParam, layout::SliceBox)> = Vec::with_capacity(targets.len());
    for (name, target) in targets {
        if absent.iter().any(|a| a == name) {
            return Err(E::from(CkptError::TensorMissing {
                path: ckpt_dir.to_path_buf(),
                tensor: name.to_string(),
                rule: format!(
                    "asked for, and {} lists it, but no rank file of the checkpoint holds it",
                    listed_in.display()
                ),
            }));
        }
        let p = match (src.param(name), source) {
            (Some(p), _) => p,
            (None, SourceStrategy::File(_)) => {
                return Err(E::from(CkptError::StrategyParam {
                    path: listed_in,
                    tensor: name.to_string(),
                    rule: format!(
                        "asked for, but the strategy of the checkpoint in {} lists no such parameter (it holds another model)",
                        ckpt_dir.display()
                    ),
                }))
            }
            (None, SourceStrategy::Unsharded) => {
                return Err(E::from(CkptError::TensorMissing {
                    path: listed_in,
                    tensor: name.to_string(),
                    rule: "asked for, and the checkpoint is read as unsharded (no strategy file: \
                           every tensor whole in rank 0's file)"
                        .to_string(),
                }))
            }
        };
        if target.shape() != p.shape.as_slice() {
            let merged = match source {
                SourceStrategy::File(_) => String::new(),
                SourceStrategy::Unsharded => format!(
                    " (in {}); without a strategy file the checkpoint is read as merged, every tensor whole in rank 0's file, and this one is not: give the strategy it was saved under",
                    listed_in.display()
                ),
            };
            return Err(E::from(CkptError::GlobalShape {
                tensor: name.to_string(),
                reason: format!(
                    "the target layout is for shape {:?} but the checkpoint holds {:?}{merged}",
                    target.shape(),
                    p.shape
                ),
            }));
        }
        let region = target.rank_box(rank).map_err(|source| CkptError::Layout {
            path: ckpt_dir.to_path_buf(),
            tensor: name.to_string(),
            source,
        })?;
        boxes.push((p, region));
    }
    let plan = plan_gathers(&sources, boxes)?;
    let mut scratch = Vec::new();
    for item in &plan.items {
        let dtype = item.meta.dtype().expect("gathered items have a dtype");
        let mut tensor = Tensor::zeros(dtype, &item.meta.shape);
        let whole = layout::SliceBox::full(&item.meta.shape);
        fill_chunk(&sources, item, &whole, tensor.as_bytes_mut(), &mut scratch)?;
        take(&item.meta.name, tensor)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layout of `shape` over 2 ranks, rows split in two.
    fn rows_over_two(shape: &[usize]) -> TensorLayout {
        layout::Layout::from_ms_flat(&[2], &[0, -1], None)
            .unwrap()
            .bind(shape)
            .unwrap()
    }

    /// Loads `name` under `target` for `rank` from the set `dir`, read as unsharded.
    fn load_unsharded(
        dir: &Path,
        name: &str,
        target: &TensorLayout,
        rank: usize,
    ) -> Result<Tensor> {
        let mut out = None;
        for_each_rank_tensor::<CkptError>(
            dir,
            SourceStrategy::Unsharded,
            rank,
            &[(name, target)],
            |_, t| {
                out = Some(t);
                Ok(())
            },
        )?;
        Ok(out.expect("the tensor asked for"))
    }

    /// An unsharded set (rank 0 alone, every tensor whole) is read with no strategy: each rank
    /// takes its piece of the whole tensor. A target of another shape is refused naming the
    /// tensor, as is a name rank 0's file lacks, and a set holding another rank is refused (its
    /// rank 0 holds shards).
    #[test]
    fn an_unsharded_set_is_sliced_for_each_rank() {
        let dir = tempfile::tempdir().unwrap();
        let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let whole = Tensor::from_vec(&[4, 3], values.clone()).unwrap();
        std::fs::create_dir_all(dir.path().join("rank_0")).unwrap();
        let file = dir.path().join("rank_0/checkpoint_0.safetensors");
        crate::save_safetensors(&file, &[("w", &whole)], false).unwrap();
        let target = rows_over_two(&[4, 3]);
        for rank in 0..2 {
            let piece = load_unsharded(dir.path(), "w", &target, rank).unwrap();
            assert_eq!(piece.shape(), &[2, 3]);
            assert_eq!(
                piece.as_slice::<f32>().unwrap(),
                &values[rank * 6..rank * 6 + 6]
            );
        }
        let err = load_unsharded(dir.path(), "w", &rows_over_two(&[8, 3]), 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"w\"") && err.contains("merged"), "{err}");
        let err = load_unsharded(dir.path(), "v", &target, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"v\"") && err.contains("unsharded"), "{err}");
        std::fs::create_dir_all(dir.path().join("rank_1")).unwrap();
        crate::save_safetensors(
            &dir.path().join("rank_1/checkpoint_1.safetensors"),
            &[("w", &whole)],
            false,
        )
        .unwrap();
        let err = load_unsharded(dir.path(), "w", &target, 0).unwrap_err();
        assert!(
            matches!(err, CkptError::UnshardedSource { ref ranks } if ranks == &[0, 1]),
            "{err}"
        );
    }
}
