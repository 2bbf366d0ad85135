//! Saving, for the training runtime: per-rank checkpoints from tensors, and strategy files in
//! any flavour from resolved layouts.

use std::path::{Path, PathBuf};

use tensor::Tensor;

use crate::ckpt_file::{Format, StoredType, TensorMeta};
use crate::error::{CkptError, Result};
use crate::ms_strategy::{MsLayout, MsLayoutItem, MsStrategyFile};
use crate::rank_dir::rank_file_path;
use crate::safetensors::{canonical_order, SafetensorsWriter};
use crate::set::SET_ID_KEY;
use crate::strategy::StagePlacement;
use crate::strategy::{OpStrategyRecord, ResolvedStrategy, StrategyFlavour};

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
            return Err(CkptError::InvalidRequest(format!(
                "{}: tensor {:?} given twice",
                dest.display(),
                w[0].name
            )));
        }
    }
    let mut writer = SafetensorsWriter::create(dest, metadata, metas.clone(), force)?;
    for m in &metas {
        let (_, t) = tensors
            .iter()
            .find(|(n, _)| *n == m.name)
            .expect("every meta comes from a tensor");
        writer.write(t.as_bytes())?;
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
        file.strategy_items = ops.iter().map(OpStrategyRecord::to_ms).collect();
        Ok(file)
    };
    match flavour {
        StrategyFlavour::Tessera => crate::tessera_strategy::write(path, strategy, ops, force),
        StrategyFlavour::MsProtobuf | StrategyFlavour::MsLayoutDict => {
            let file = ms_file(false)?;
            crate::atomic_write::write_file(path, &file.encode(), force)
        }
        StrategyFlavour::MsJson => {
            let file = ms_file(true)?;
            let mut text = file.to_json().to_pretty(1);
            text.push('\n');
            crate::atomic_write::write_file(path, text.as_bytes(), force)
        }
    }
}

/// A resolved strategy as MindSpore's file model. Every placement's mesh must cover its stage's
/// contiguous ranks `stage*P..(stage+1)*P`, as MindSpore requires; layouts with one axis per
/// dim are written in the flat form, others in the multi-axis form.
pub fn to_ms_strategy(
    path: &Path,
    strategy: &ResolvedStrategy,
    with_shapes: bool,
) -> Result<MsStrategyFile> {
    // Several stages in one file take MindSpore's merged names; one stage's file keeps plain
    // names (its stage is in its strategy items), as each stage saves it.
    let stages: std::collections::BTreeSet<usize> = strategy
        .params()
        .iter()
        .flat_map(|p| p.placements.iter().map(|pl| pl.stage))
        .collect();
    let merged = stages.len() > 1;
    let mut layout_items = Vec::new();
    for p in strategy.params() {
        for pl in &p.placements {
            let mesh = pl.mp.mesh();
            let n = mesh.n_slots();
            let first = pl.stage * n;
            if mesh
                .rank_list()
                .iter()
                .enumerate()
                .any(|(i, &r)| r != first + i)
            {
                return Err(CkptError::StrategyParam {
                    path: path.to_path_buf(),
                    tensor: p.name.clone(),
                    rule: format!(
                        "its rank list {:?} is not stage {}'s contiguous ranks {first}..{}, which MindSpore's format requires",
                        mesh.rank_list(),
                        pl.stage,
                        first + n
                    ),
                });
            }
            let layout = pl.mp.layout();
            let tensor_map: Vec<Vec<i32>> = match layout.ms_flat_tensor_map() {
                Some(flat) => vec![flat.iter().map(|&v| v as i32).collect()],
                None => {
                    let mut per_dim: Vec<Vec<i32>> = layout
                        .ms_tensor_map()
                        .expect("a bound layout has a map")
                        .iter()
                        .map(|d| d.iter().map(|&v| v as i32).collect())
                        .collect();
                    if per_dim.len() == 1 {
                        per_dim.push(Vec::new());
                    }
                    per_dim
                }
            };
            let name = if merged {
                format!("{}-{}", pl.stage, p.name)
            } else {
                p.name.clone()
            };
            let split = StagePlacement::ms_row_split(&pl.mp).unwrap_or_default();
            layout_items.push(MsLayoutItem {
                param_name: name,
                layout: MsLayout {
                    dev_matrix: vec![mesh.device_matrix().iter().map(|&d| d as u32).collect()],
                    tensor_map,
                    param_split_shape: vec![split.0],
                    indices_offset: vec![split.1],
                    field: 0,
                    opt_weight_shard_step: pl.opt_shard_step() as i32,
                    opt_weight_shard_size: if pl.opt_shard > 1 {
                        pl.opt_shard as i32
                    } else {
                        0
                    },
                    tensor_shape: with_shapes.then(|| p.shape.iter().map(|&d| d as u64).collect()),
                },
            });
        }
    }
    Ok(MsStrategyFile {
        current_stage: 1,
        strategy_items: Vec::new(),
        layout_items,
    })
}

/// Writes a small side file of a checkpoint (a model description, `model.json`) atomically:
/// a reader sees the whole file or none. Refuses an existing `path` unless `force`; returns the
/// path written.
pub fn save_side_file(path: &Path, bytes: &[u8], force: bool) -> Result<PathBuf> {
    crate::atomic_write::write_file(path, bytes, force)
}
