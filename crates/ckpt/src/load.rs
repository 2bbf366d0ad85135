//! Loading: MindSpore's `load_segmented_checkpoints`, Tessera's convert-on-load for the
//! training runtime, and recognising what kind of file a path holds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use layout::TensorLayout;
use tensor::Tensor;

use crate::ckpt_file::{CheckpointFile, Format, StoredTensor};
use crate::error::{io_err, CkptError, Result};
use crate::execute::{fill_chunk, write_items, WriteOptions, DEFAULT_CHUNK_BYTES};
use crate::group_info::GroupInfo;
use crate::plan::{plan_gathers, OutItem};
use crate::progress::Progress;
use crate::sources::SourceSet;
use crate::strategy::{ResolvedParam, Strategy};

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
    dec: Option<&crate::crypto::Decryption>,
) -> Result<Vec<SegmentedEntry>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(dir, "list directory"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && Format::from_path(p).is_some())
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(CkptError::InvalidRequest(format!(
            "{}: no .ckpt or .safetensors file",
            dir.display()
        )));
    }
    let mut entries: Vec<SegmentedEntry> = Vec::new();
    for path in paths {
        let file = Arc::new(CheckpointFile::open_with(&path, dec)?);
        for t in file.tensors() {
            let entry = SegmentedEntry {
                file: file.clone(),
                tensor: t.clone(),
            };
            match entries.iter_mut().find(|e| e.tensor.name == t.name) {
                Some(existing) => *existing = entry,
                None => entries.push(entry),
            }
        }
    }
    Ok(entries)
}

/// Writes the union of a segmented checkpoint into one file (format from `dest`'s extension),
/// atomically, fsynced or not as `durability` says.
pub fn write_segmented(
    entries: &[SegmentedEntry],
    dest: &Path,
    force: bool,
    durability: crate::Durability,
    progress: &dyn Progress,
) -> Result<PathBuf> {
    let format = Format::from_path(dest).ok_or_else(|| {
        CkptError::InvalidRequest(format!(
            "{}: the output name must end in .ckpt or .safetensors",
            dest.display()
        ))
    })?;
    let items: Vec<OutItem<'_>> = entries
        .iter()
        .map(|e| OutItem::whole(&e.file, &e.tensor))
        .collect();
    let dir = dest.parent().unwrap_or(Path::new("."));
    let sources = SourceSet::empty(dir);
    progress.start("merging segments", crate::execute::data_bytes(&items));
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

/// Convert-on-load for the training runtime: the tensors `rank` holds under `targets` (each a
/// parameter name and the layout the rank will hold it in), read from the checkpoint in
/// `ckpt_dir/rank_<r>/` saved under `src_strategy` (any flavour). Only the source files the
/// rank needs are opened, and only the bytes it needs are read.
pub fn load_rank_tensors(
    ckpt_dir: &Path,
    src_strategy: &Path,
    rank: usize,
    targets: &[(&str, &TensorLayout)],
) -> Result<Vec<(String, Tensor)>> {
    let sources = SourceSet::rank_dirs(ckpt_dir)?;
    let strategy = Strategy::load(src_strategy)?;
    let (src, _) = sources.resolve_source(&strategy)?;
    let mut boxes: Vec<(&ResolvedParam, layout::SliceBox)> = Vec::with_capacity(targets.len());
    for (name, target) in targets {
        let p = src.param(name).ok_or_else(|| CkptError::TensorMissing {
            path: ckpt_dir.to_path_buf(),
            tensor: name.to_string(),
            rule: "it was asked for but the source strategy does not list it".to_string(),
        })?;
        if target.shape() != p.shape.as_slice() {
            return Err(CkptError::GlobalShape {
                tensor: name.to_string(),
                reason: format!(
                    "the target layout is for shape {:?} but the checkpoint holds {:?}",
                    target.shape(),
                    p.shape
                ),
            });
        }
        let region = target.rank_box(rank).map_err(|source| CkptError::Layout {
            path: ckpt_dir.to_path_buf(),
            tensor: name.to_string(),
            source,
        })?;
        boxes.push((p, region));
    }
    let plan = plan_gathers(&sources, boxes)?;
    let mut out = Vec::with_capacity(plan.items.len());
    let mut scratch = Vec::new();
    for item in &plan.items {
        let dtype = item.meta.dtype().expect("gathered items have a dtype");
        let mut tensor = Tensor::zeros(dtype, &item.meta.shape);
        let whole = layout::SliceBox::full(&item.meta.shape);
        fill_chunk(&sources, item, &whole, tensor.as_bytes_mut(), &mut scratch)?;
        out.push((item.meta.name.clone(), tensor));
    }
    Ok(out)
}

/// What a file turned out to be.
#[derive(Debug)]
pub enum InspectedFile {
    /// A checkpoint (safetensors or `.ckpt`).
    Checkpoint(CheckpointFile),
    /// A strategy file (any flavour).
    Strategy(Box<Strategy>),
    /// A MindSpore group-info file.
    GroupInfo(GroupInfo),
}

/// Recognises and reads `path`: a checkpoint, a strategy file or a group-info file. MindSpore
/// names strategy files `.ckpt` too, so a `.ckpt` file that holds no tensor is tried as the
/// other kinds. A file that matches none is an error listing why each was ruled out.
pub fn inspect(path: &Path) -> Result<InspectedFile> {
    inspect_detected(path).map(|(file, _)| file)
}

/// [`inspect`], also saying which format was detected and why.
pub fn inspect_detected(path: &Path) -> Result<(InspectedFile, String)> {
    let as_checkpoint = CheckpointFile::open(path);
    match &as_checkpoint {
        Ok(f) if f.format() == Format::Safetensors => {
            let why = format!(
                "safetensors: an 8-byte header length and a valid JSON header describing {} tensors that tile the data",
                f.tensors().len()
            );
            return as_checkpoint.map(|f| (InspectedFile::Checkpoint(f), why));
        }
        Ok(f) if !f.tensors().is_empty() => {
            let why =
                format!(
                "MindSpore .ckpt: protobuf Checkpoint messages holding {} well-formed tensors{}",
                f.tensors().len(),
                if f.crc().is_some() { " and a matching crc_num trailer" } else { "" }
            );
            return as_checkpoint.map(|f| (InspectedFile::Checkpoint(f), why));
        }
        Err(e) if Format::from_path(path) == Some(Format::Safetensors) => {
            return Err(CkptError::InvalidRequest(format!(
                "{}: named .safetensors but not a valid safetensors file: {e}",
                path.display()
            )));
        }
        _ => {}
    }
    let bytes = std::fs::read(path).map_err(io_err(path, "read"))?;
    let as_strategy = Strategy::from_bytes(path, &bytes);
    if let Ok(s) = &as_strategy {
        if !s.params.is_empty() || !s.ops.is_empty() {
            let why = format!(
                "{:?} strategy file: {} parameter layouts and {} operator strategies",
                s.flavour,
                s.params.len(),
                s.ops.len()
            );
            return as_strategy.map(|s| (InspectedFile::Strategy(Box::new(s)), why));
        }
    }
    let strict = crate::group_info::has_only_group_info_fields(&bytes);
    let as_group = GroupInfo::decode(path, &bytes);
    if let (Ok(()), Ok(g)) = (&strict, &as_group) {
        if g.restore_rank_list.is_some() || !g.groups.is_empty() {
            let why = format!(
                "MindSpore group-info file: protobuf with only ParallelGroupMap fields ({} groups{})",
                g.groups.len(),
                if g.restore_rank_list.is_some() { ", a ckpt_restore_rank_list" } else { "" }
            );
            return Ok((InspectedFile::GroupInfo(g.clone()), why));
        }
    }
    let reason = |r: std::result::Result<(), String>| match r {
        Ok(()) => "valid but empty".to_string(),
        Err(e) => e,
    };
    Err(CkptError::InvalidRequest(format!(
        "{}: matches no format Tessera reads ({} bytes). As a checkpoint: {}. As a strategy file: {}. As a group-info file: {}",
        path.display(),
        bytes.len(),
        reason(as_checkpoint.map(|_| ()).map_err(|e| e.to_string())),
        reason(as_strategy.map(|_| ()).map_err(|e| e.to_string())),
        reason(strict.and(as_group.map(|_| ()).map_err(|e| e.to_string()))),
    )))
}
