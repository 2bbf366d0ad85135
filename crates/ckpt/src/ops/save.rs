//! Saving, for the training runtime: per-rank checkpoints from tensors, and strategy files in
//! any flavour from resolved layouts.

use std::path::{Path, PathBuf};

use tensor::Tensor;

use crate::error::{CkptError, Result};
use crate::format::ms_strategy::{to_ms_strategy, MsStrategyFile, MsStrategyItem};
use crate::format::safetensors::{canonical_order, SafetensorsWriter};
use crate::format::{tessera_strategy, Format};
use crate::io::atomic_write::write_file;
use crate::model::{OpStrategyRecord, ResolvedStrategy, StoredType, StrategyFlavour, TensorMeta};
use crate::set::SET_ID_KEY;
use crate::source::rank_file_path;

/// Saves one rank's tensors as `dir/rank_<rank>/checkpoint_<rank>.safetensors` (metadata
/// `{"format": "ms"}`, so MindSpore reads it too), atomically.
pub fn save_rank_checkpoint(
    dir: &Path,
    rank: usize,
    tensors: &[(&str, &Tensor)],
    force: bool,
) -> Result<PathBuf> {
    let dest = dir
        .join(format!("rank_{rank}"))
        .join(format!("checkpoint_{rank}.safetensors"));
    save_safetensors(&dest, tensors, force)
}

/// Saves one rank's tensors into the staging directory of a set being written
/// ([`crate::SetWriter::staging`]), as `rank_<rank>/checkpoint_<rank>.safetensors` carrying the
/// set's id. The set may be written by several processes (one per rank); the one holding the
/// [`crate::SetWriter`] commits it.
pub fn save_rank_checkpoint_in_set(
    staging: &Path,
    set_id: &str,
    rank: usize,
    tensors: &[(&str, &Tensor)],
) -> Result<PathBuf> {
    let dest = rank_file_path(staging, rank, "checkpoint_", Format::Safetensors);
    let metadata = [
        ("format".to_string(), "ms".to_string()),
        (SET_ID_KEY.to_string(), set_id.to_string()),
    ];
    write_safetensors(&dest, tensors, &metadata, false)
}

/// Saves tensors into one safetensors file, atomically.
pub fn save_safetensors(dest: &Path, tensors: &[(&str, &Tensor)], force: bool) -> Result<PathBuf> {
    write_safetensors(
        dest,
        tensors,
        &[("format".to_string(), "ms".to_string())],
        force,
    )
}

fn write_safetensors(
    dest: &Path,
    tensors: &[(&str, &Tensor)],
    metadata: &[(String, String)],
    force: bool,
) -> Result<PathBuf> {
    let mut metas: Vec<TensorMeta> = tensors
        .iter()
        .map(|(name, t)| TensorMeta::new(name, StoredType::DType(t.dtype()), t.shape().to_vec()))
        .collect();
    canonical_order(&mut metas);
    for w in metas.windows(2) {
        if w[0].name == w[1].name {
            return Err(CkptError::DuplicateTensor {
                path: dest.to_path_buf(),
                tensor: w[0].name.clone(),
            });
        }
    }
    let mut writer = SafetensorsWriter::create(dest, metadata, metas.clone(), force)?;
    // Name → tensor (the names are distinct, checked above): a linear search per tensor would
    // make saving many tensors quadratic.
    let by_name: std::collections::HashMap<&str, &Tensor> =
        tensors.iter().map(|&(n, t)| (n, t)).collect();
    for m in &metas {
        writer.write(by_name[m.name.as_str()].as_bytes())?;
    }
    writer.finish()?.commit()
}

/// MindSpore's `save_param_strategy_file`: writes `strategy` (the parameters' layouts) and `ops`
/// (the operators' strategies, which `load_param_strategy_file` reapplies) as Tessera JSON,
/// MindSpore JSON or MindSpore protobuf, atomically. Pipeline strategies are written merged
/// (`"<stage>-name"`). MindSpore's flavours have no place for output strategies and drop them.
pub fn save_param_strategy_file(
    path: &Path,
    strategy: &ResolvedStrategy,
    ops: &[OpStrategyRecord],
    flavour: StrategyFlavour,
    force: bool,
) -> Result<PathBuf> {
    let ms_file = |with_shapes| -> Result<MsStrategyFile> {
        let mut file = to_ms_strategy(path, strategy, with_shapes)?;
        file.strategy_items = ops.iter().map(MsStrategyItem::from_record).collect();
        Ok(file)
    };
    match flavour {
        StrategyFlavour::Tessera => tessera_strategy::write(path, strategy, ops, force),
        StrategyFlavour::MsProtobuf | StrategyFlavour::MsLayoutDict => {
            let file = ms_file(false)?;
            write_file(path, &file.encode(), force)
        }
        StrategyFlavour::MsJson => {
            let file = ms_file(true)?;
            let mut text = file.to_json().to_pretty(1);
            text.push('\n');
            write_file(path, text.as_bytes(), force)
        }
    }
}

/// Writes a small side file of a checkpoint (a model description, `model.json`) atomically:
/// a reader sees the whole file or none. Refuses an existing `path` unless `force`; returns the
/// path written.
pub fn save_side_file(path: &Path, bytes: &[u8], force: bool) -> Result<PathBuf> {
    write_file(path, bytes, force)
}
