//! MindSpore strategy records to and from the model: a layout record becomes a
//! [`StagePlacement`] (device matrix and tensor map to a [`Layout`], the optimizer-shard fields
//! checked against the replica group, `param_split_shape` to uneven rows), a strategy item an
//! [`OpStrategyRecord`], and a [`ResolvedStrategy`] becomes records again
//! ([`to_ms_strategy`]). MindSpore's layout dict in memory ([`LayoutList`]) goes the same way.

use std::collections::HashMap;
use std::path::Path;

use layout::{Layout, LayoutError, TensorLayout};

use super::{MsLayout, MsLayoutItem, MsStrategyFile, MsStrategyItem};
use crate::error::{CkptError, Result};
use crate::model::tensor::MAX_DIMS;
use crate::model::{
    check_unique_ops, OpStrategyRecord, ResolvedStrategy, StagePlacement, Strategy,
    StrategyFlavour, StrategyParam,
};

/// One entry of MindSpore's layout dict, `{name: [dev_matrix, tensor_map, param_split_shape,
/// field_size, opt_shard_step, opt_shard_size]}` (the `_convert_to_list` form that
/// `load_distributed_checkpoint` accepts as `predict_strategy`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LayoutList {
    /// The device matrix.
    pub dev_matrix: Vec<i64>,
    /// MindSpore's flat tensor map (reversed axis indices, `-1` for an unsplit dim).
    pub tensor_map: Vec<i64>,
    /// `param_split_shape` (empty for even splits).
    pub param_split_shape: Vec<i64>,
    /// `field_size` (MindSpore requires 0).
    pub field_size: i64,
    /// Rank stride inside the optimizer-shard group (0: no optimizer sharding).
    pub opt_shard_step: i64,
    /// Optimizer-shard group size (0: none).
    pub opt_shard_size: i64,
}

impl Strategy {
    /// A strategy from MindSpore's layout dict (see [`LayoutList`]); `label` names it in
    /// errors (the dict has no file). Every entry goes through the same checks as a strategy
    /// file's layout item; shapes come from the checkpoint it is used with.
    pub fn from_layout_lists(label: &Path, items: &[(String, LayoutList)]) -> Result<Strategy> {
        let bad = |name: &str, rule: String| CkptError::StrategyParam {
            path: label.to_path_buf(),
            tensor: name.to_string(),
            rule,
        };
        let mut layout_items = Vec::with_capacity(items.len());
        for (name, l) in items {
            let dev_matrix = l
                .dev_matrix
                .iter()
                .map(|&d| u32::try_from(d).ok().filter(|&d| d > 0))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    bad(
                        name,
                        format!("dev_matrix {:?} must hold positive ints", l.dev_matrix),
                    )
                })?;
            let tensor_map = l
                .tensor_map
                .iter()
                .map(|&v| i32::try_from(v).ok())
                .collect::<Option<Vec<i32>>>()
                .ok_or_else(|| {
                    bad(
                        name,
                        format!("tensor_map {:?} is out of range", l.tensor_map),
                    )
                })?;
            if l.field_size != 0 {
                return Err(bad(
                    name,
                    format!("field_size is {}, but MindSpore requires 0", l.field_size),
                ));
            }
            let small = |v: i64, what: &str| {
                i32::try_from(v).map_err(|_| bad(name, format!("{what} {v} is out of range")))
            };
            layout_items.push(MsLayoutItem {
                param_name: name.clone(),
                layout: MsLayout {
                    dev_matrix: vec![dev_matrix],
                    tensor_map: vec![tensor_map],
                    param_split_shape: vec![l.param_split_shape.clone()],
                    indices_offset: vec![Vec::new()],
                    field: 0,
                    opt_weight_shard_step: small(l.opt_shard_step, "opt_shard_step")?,
                    opt_weight_shard_size: small(l.opt_shard_size, "opt_shard_size")?,
                    tensor_shape: None,
                },
            });
        }
        let file = MsStrategyFile {
            current_stage: 0,
            strategy_items: Vec::new(),
            layout_items,
        };
        file.into_strategy(label, StrategyFlavour::MsLayoutDict)
    }
}

impl MsStrategyFile {
    /// The model of this file: every layout record as a [`StagePlacement`], every strategy
    /// item as an [`OpStrategyRecord`]; `path` names the file in errors.
    ///
    /// Names are split as `"<stage>-<name>"` only when *every* layout name has a numeric
    /// prefix (a file merged by `merge_pipeline_strategys`), and then only at the first `-`;
    /// otherwise names are kept whole and the stage is the first strategy item's. MindSpore
    /// splits any name containing `-`, which breaks names such as `layer-1.w`.
    pub fn into_strategy(self, path: &Path, flavour: StrategyFlavour) -> Result<Strategy> {
        let file = self;
        if file.layout_items.is_empty() {
            return Err(CkptError::InvalidStrategy {
                path: path.to_path_buf(),
                reason: "the file has no parameter layouts".to_string(),
            });
        }
        let merged = file
            .layout_items
            .iter()
            .all(|item| split_stage_prefix(&item.param_name).is_some());
        let file_stage = file.strategy_items.first().map_or(0, |s| s.stage as usize);
        let mut params: Vec<StrategyParam> = Vec::new();
        // Name → index in `params`: a scan of `params` per record was quadratic (a 3 MB file
        // of 100 000 parameters took 15 seconds to read).
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut stage_devices: Option<(usize, String)> = None;
        for item in &file.layout_items {
            let (stage, name) = if merged {
                let (s, n) = split_stage_prefix(&item.param_name).expect("checked above");
                (s, n.to_string())
            } else {
                (file_stage, item.param_name.clone())
            };
            let placement = ms_placement(path, &name, stage, &item.layout)?;
            let n = placement.layout.mesh().n_slots();
            match &stage_devices {
                None => stage_devices = Some((n, name.clone())),
                Some((m, first)) if *m != n => {
                    return Err(CkptError::StrategyParam {
                        path: path.to_path_buf(),
                        tensor: name,
                        rule: format!(
                            "its device matrix covers {n} devices but {first:?}'s covers {m}; every layout of a pipeline stage must cover the stage's devices"
                        ),
                    })
                }
                _ => {}
            }
            let shape = item
                .layout
                .tensor_shape
                .as_ref()
                .map(|s| s.iter().map(|&d| d as usize).collect::<Vec<usize>>());
            if let Some(existing) = index.get(&name).map(|&i| &mut params[i]) {
                if existing.placements.iter().any(|p| p.stage == stage) {
                    return Err(CkptError::StrategyParam {
                        path: path.to_path_buf(),
                        tensor: name,
                        rule: format!("it has two layouts for pipeline stage {stage}"),
                    });
                }
                if shape.is_some() && existing.shape.is_some() && shape != existing.shape {
                    return Err(CkptError::StrategyParam {
                        path: path.to_path_buf(),
                        tensor: name,
                        rule: format!(
                            "tensor_shape {:?} in one stage disagrees with {:?} in another",
                            shape, existing.shape
                        ),
                    });
                }
                existing.shape = existing.shape.take().or(shape);
                existing.placements.push(placement);
                existing.placements.sort_by_key(|p| p.stage);
            } else {
                index.insert(name.clone(), params.len());
                params.push(StrategyParam {
                    name,
                    shape,
                    dtype: None,
                    placements: vec![placement],
                });
            }
        }
        let ops =
            file.strategy_items
                .iter()
                .map(|item| {
                    let record = item.to_record();
                    record.check_sizes().map(|()| record).map_err(|reason| {
                        CkptError::InvalidStrategy {
                            path: path.to_path_buf(),
                            reason,
                        }
                    })
                })
                .collect::<Result<Vec<_>>>()?;
        check_unique_ops(ops.iter().map(|op| (op.name.as_str(), op.stage))).map_err(|reason| {
            CkptError::InvalidStrategy {
                path: path.to_path_buf(),
                reason: format!("parallel_strategy_item: {reason}"),
            }
        })?;
        Ok(Strategy::new(path.to_path_buf(), flavour, params, ops))
    }
}

impl MsStrategyItem {
    /// This `parallel_strategy_item` as the model's operator record.
    pub fn to_record(&self) -> OpStrategyRecord {
        let item = self;
        OpStrategyRecord {
            name: item.node_name.clone(),
            stage: item.stage as usize,
            inputs: item
                .strategies
                .iter()
                .map(|t| t.iter().map(|&f| f as usize).collect())
                .collect(),
            outputs: None,
            in_layouts: None,
            out_layouts: None,
        }
    }

    /// The `parallel_strategy_item` of an operator record (its output tuples are dropped:
    /// MindSpore's parameter strategy file has no place for them).
    pub fn from_record(record: &OpStrategyRecord) -> MsStrategyItem {
        MsStrategyItem {
            node_name: record.name.clone(),
            stage: record.stage as u32,
            strategies: record
                .inputs
                .iter()
                .map(|t| t.iter().map(|&f| f as u32).collect())
                .collect(),
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
            let split = ms_row_split(&pl.mp).unwrap_or_default();
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

/// (row-major over the split factors): its `param_split_shape` and `indices_offset`.
fn ms_row_split(layout: &TensorLayout) -> Option<(Vec<i64>, Vec<i64>)> {
    let rows = layout.row_split()?;
    let inner: usize = layout.split_factors()[1..].iter().product();
    let offsets: Vec<usize> = rows
        .iter()
        .scan(0, |acc, &r| {
            let first = *acc;
            *acc += r;
            Some(first)
        })
        .collect();
    let per_slice = |v: &[usize]| -> Vec<i64> {
        v.iter()
            .flat_map(|&x| std::iter::repeat_n(x as i64, inner))
            .collect()
    };
    Some((per_slice(rows), per_slice(&offsets)))
}

/// The rows of each block of dim 0 that MindSpore's `param_split_shape` (one dim-0 size per
/// slice, in slice order) and `indices_offset` (each slice's first row) record, or `None` when
/// they are empty.
fn ms_rows(layout: &Layout, l: &MsLayout) -> std::result::Result<Option<Vec<usize>>, String> {
    let Some(sizes) = l.param_split_shape.iter().find(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let factors = layout.split_factors();
    let slices: usize = factors.iter().product();
    if sizes.len() != slices {
        return Err(format!(
            "param_split_shape has {} entries, but the layout cuts the tensor into {slices} slices (one entry per slice)",
            sizes.len()
        ));
    }
    let inner: usize = factors.iter().skip(1).product();
    let mut rows = Vec::with_capacity(factors.first().copied().unwrap_or(1));
    for (i, &size) in sizes.iter().enumerate() {
        let size = usize::try_from(size)
            .ok()
            .filter(|&s| s >= 1)
            .ok_or_else(|| {
                format!("param_split_shape entry {i} is {size}; a slice needs at least one row")
            })?;
        if i % inner == 0 {
            rows.push(size);
        } else if rows.last() != Some(&size) {
            return Err(format!(
                "param_split_shape entry {i} is {size}, but slices of one block of rows have the same rows ({})",
                rows.last().copied().unwrap_or(0)
            ));
        }
    }
    rows.iter()
        .try_fold(0usize, |acc, &r| acc.checked_add(r))
        .ok_or("param_split_shape's rows overflow")?;
    if let Some(offsets) = l.indices_offset.iter().find(|o| !o.is_empty()) {
        let mut first = 0i64;
        let expected: Vec<i64> = rows
            .iter()
            .flat_map(|&r| {
                let at = first;
                first += r as i64;
                std::iter::repeat_n(at, inner)
            })
            .collect();
        if *offsets != expected {
            return Err(format!(
                "indices_offset {offsets:?} does not match param_split_shape {sizes:?}: each slice starts at the rows before it, {expected:?}"
            ));
        }
    }
    Ok(Some(rows))
}

/// `"3-name"` → `(3, "name")`: a numeric stage prefix, split at the first `-` only.
pub(crate) fn split_stage_prefix(name: &str) -> Option<(usize, &str)> {
    let (prefix, rest) = name.split_once('-')?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || rest.is_empty() {
        return None;
    }
    Some((prefix.parse().ok()?, rest))
}

/// One MindSpore layout record as a [`StagePlacement`] in `stage`.
fn ms_placement(path: &Path, name: &str, stage: usize, l: &MsLayout) -> Result<StagePlacement> {
    let rule = |rule: String| CkptError::StrategyParam {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        rule,
    };
    // What the fields mean (SEMANTICS §5.1 and §6.1): `field` is a field size and
    // `opt_weight_shard_step` a rank stride, 0 when unused; `opt_weight_shard_size` is a group
    // size, 0 when unused and -1 for the whole replica group. No other negative has a meaning.
    if l.field < 0 {
        return Err(rule(format!(
            "field is {}, but it is a field size (0 = none) and cannot be negative",
            l.field
        )));
    }
    // MindSpore merges a parameter with a field size (an EmbeddingLookup split by fields) by
    // its own interleaving of the slices' columns, not by the tensor map: placing it by the
    // tensor map alone would put its elements in the wrong order, silently.
    if l.field > 0 {
        return Err(rule(format!(
            "field is {}: a parameter split by fields (MindSpore's EmbeddingLookup field_size) \
             is merged by MindSpore in an order of its own, which Tessera does not implement, \
             so it cannot be placed by its tensor map",
            l.field
        )));
    }
    if l.opt_weight_shard_step < 0 {
        return Err(rule(format!(
            "opt_weight_shard_step is {}, but it is a rank stride (0 = no optimizer shard) and cannot be negative",
            l.opt_weight_shard_step
        )));
    }
    if l.opt_weight_shard_size < -1 {
        return Err(rule(format!(
            "opt_weight_shard_size is {}, but it is a group size: 0 = none, -1 = the whole replica group, and no other negative",
            l.opt_weight_shard_size
        )));
    }
    let dev: Vec<usize> = l
        .device_matrix()
        .filter(|d| !d.is_empty())
        .ok_or_else(|| rule("it has no dev_matrix".to_string()))?
        .iter()
        .map(|&d| d as usize)
        .collect();
    let layout_err = |source: LayoutError| CkptError::Layout {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        source,
    };
    // A tensor's dims: the protobuf flavour records no shape that would bound them.
    let dims = match l.tensor_map.as_slice() {
        [flat] => flat.len(),
        per_dim => per_dim.len(),
    };
    if dims > MAX_DIMS {
        return Err(rule(format!(
            "its tensor_map gives {dims} tensor dims, more than the {MAX_DIMS} a tensor may have"
        )));
    }
    // Bounded (axes, overflow, the rank ceiling) before the rank list is allocated.
    let n = layout::limits::checked_rank_count(&dev).map_err(layout_err)?;
    if n == 0 {
        return Err(rule(format!("dev_matrix {dev:?} has a zero product")));
    }
    let ranks = stage
        .checked_mul(n)
        .and_then(|first| Some(first..first.checked_add(n)?))
        .ok_or_else(|| rule("stage × devices overflows".to_string()))?;
    let layout = Layout::from_ms_extended(&dev, &l.dim_axes(), Some(ranks.clone().collect()))
        .map_err(layout_err)?;
    let first = ranks.start;
    let replicas = layout.replica_count();
    let opt_shard = match l.opt_weight_shard_size {
        0 | 1 => 1,
        -1 => replicas,
        k => usize::try_from(k).map_or(replicas, |k| k.min(replicas)),
    };
    let rows = ms_rows(&layout, l).map_err(rule)?;
    if rows.is_some() && opt_shard > 1 {
        return Err(rule(format!(
            "param_split_shape splits dim 0 unevenly, which an optimizer shard of {opt_shard} cannot divide further"
        )));
    }
    let placement = StagePlacement {
        stage,
        layout,
        opt_shard,
        rows,
    };
    if opt_shard > 1 {
        placement.held_layout().map_err(layout_err)?;
        let step = l.opt_weight_shard_step;
        let group = placement
            .layout
            .mesh()
            .slots_varying(0, &placement.layout.unused_axes());
        let implied = (group[opt_shard - 1] - group[0]) / (opt_shard - 1);
        if step <= 0 || step as usize != implied {
            return Err(rule(format!(
                "opt_weight_shard_step is {step} but an optimizer shard of {opt_shard} over the replica group {:?} has rank stride {implied}",
                group.iter().map(|s| s + first).collect::<Vec<_>>()
            )));
        }
    }
    Ok(placement)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_prefix_splits_once() {
        assert_eq!(split_stage_prefix("0-w0"), Some((0, "w0")));
        assert_eq!(split_stage_prefix("1-layer-1.w"), Some((1, "layer-1.w")));
        assert_eq!(split_stage_prefix("layer-1.w"), None);
        assert_eq!(split_stage_prefix("-x"), None);
        assert_eq!(split_stage_prefix("3-"), None);
    }
}
