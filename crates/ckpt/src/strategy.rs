//! The one internal model of a parameter strategy, and reading it from any file flavour.
//!
//! Every parameter becomes, per pipeline stage that holds it, a model-parallel
//! [`layout::Layout`] over a mesh whose rank list is that stage's global ranks, plus an
//! optimizer-shard group size. [`Strategy`] is what a file says (the global shape may be
//! unknown: MindSpore's protobuf does not store it); [`ResolvedStrategy`] has every shape bound,
//! so each rank's box is known. Resolution takes shapes from the file (Tessera JSON, MindSpore
//! JSON `tensor_shape`), from a checkpoint's slices, or from another strategy by name; any
//! disagreement is an error naming the parameter.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use layout::{Layout, LayoutError, TensorLayout};
use tensor::DType;

use crate::error::{io_err, CkptError, Result};
use crate::json::Json;
use crate::ms_strategy::{MsLayout, MsLayoutItem, MsStrategyFile, MsStrategyItem};

/// Which file flavour a strategy came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyFlavour {
    /// MindSpore `ParallelStrategyMap` protobuf.
    MsProtobuf,
    /// MindSpore's JSON strategy file.
    MsJson,
    /// Tessera's own strategy JSON (`"format": "tessera-strategy"`).
    Tessera,
    /// MindSpore's layout dict in memory (`predict_strategy` of `load_distributed_checkpoint`),
    /// see [`Strategy::from_layout_lists`]; saved as protobuf.
    MsLayoutDict,
}

impl std::fmt::Display for StrategyFlavour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StrategyFlavour::MsProtobuf => "MindSpore protobuf",
            StrategyFlavour::MsJson => "MindSpore JSON",
            StrategyFlavour::Tessera => "Tessera JSON",
            StrategyFlavour::MsLayoutDict => "MindSpore layout dict",
        })
    }
}

/// A parameter's placement in one pipeline stage, before its shape is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlacement {
    /// The pipeline stage.
    pub stage: usize,
    /// The model-parallel layout; its mesh's rank list is the stage's global ranks.
    pub layout: Layout,
    /// Optimizer-shard group size: `size` ranks of the replica group split dim 0 further
    /// (1 = no optimizer sharding). MindSpore's `-1` is already resolved to the replica count.
    pub opt_shard: usize,
    /// Rows of each block of dim 0 when a manual split makes them uneven (MindSpore's
    /// `param_split_shape`); `None`: even blocks.
    pub rows: Option<Vec<usize>>,
}

impl StagePlacement {
    /// The model-parallel layout bound to `shape`, with its manual row split if any.
    pub fn bind(&self, shape: &[usize]) -> Result<TensorLayout, LayoutError> {
        match &self.rows {
            Some(rows) => TensorLayout::with_rows(self.layout.clone(), shape, rows),
            None => self.layout.bind(shape),
        }
    }

    /// Per-slice dim-0 sizes and offsets of a manual row split, in MindSpore's slice order
    /// (row-major over the split factors): its `param_split_shape` and `indices_offset`.
    pub fn ms_row_split(layout: &TensorLayout) -> Option<(Vec<i64>, Vec<i64>)> {
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

    /// The layout ranks actually hold: the model-parallel layout with the optimizer shard.
    pub fn held_layout(&self) -> Result<Layout, LayoutError> {
        if self.opt_shard > 1 {
            self.layout.with_optimizer_shard(Some(self.opt_shard))
        } else {
            Ok(self.layout.clone())
        }
    }
}

/// One parameter of a [`Strategy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrategyParam {
    /// The name (without any `"<stage>-"` prefix).
    pub name: String,
    /// The global shape, when the file records it.
    pub shape: Option<Vec<usize>>,
    /// The dtype, when the file records it.
    pub dtype: Option<DType>,
    /// Its placements, one per pipeline stage holding it, in stage order.
    pub placements: Vec<StagePlacement>,
}

/// One operator's sharding strategy as a strategy file records it: MindSpore's
/// `parallel_strategy_item`, Tessera JSON's `"ops"` entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpStrategyRecord {
    /// The operator's name (`matmul1`, `layer2.matmul`).
    pub name: String,
    /// Its pipeline stage.
    pub stage: usize,
    /// One split tuple per input (`shard`'s `in_strategy`).
    pub inputs: Vec<Vec<usize>>,
    /// One split tuple per output, when an `out_strategy` was set. Tessera JSON and MindSpore's
    /// operator strategy file record it; MindSpore's parameter strategy file has no place for it.
    pub outputs: Option<Vec<Vec<usize>>>,
    /// One layout per input when the in_strategy is layout-valued (`inputs` are then their
    /// split factors); only MindSpore's operator strategy file records them.
    pub in_layouts: Option<Vec<layout::Layout>>,
    /// One layout per output when the out_strategy is layout-valued (`outputs` are then their
    /// split factors).
    pub out_layouts: Option<Vec<layout::Layout>>,
}

impl OpStrategyRecord {
    /// The record of a MindSpore `parallel_strategy_item`.
    pub fn from_ms(item: &MsStrategyItem) -> OpStrategyRecord {
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

    /// As a MindSpore `parallel_strategy_item` (the output tuples are dropped).
    pub fn to_ms(&self) -> MsStrategyItem {
        MsStrategyItem {
            node_name: self.name.clone(),
            stage: self.stage as u32,
            strategies: self
                .inputs
                .iter()
                .map(|t| t.iter().map(|&f| f as u32).collect())
                .collect(),
        }
    }
}

/// A strategy file as read: parameters and their placements.
#[derive(Debug, Clone)]
pub struct Strategy {
    /// The file it came from.
    pub path: PathBuf,
    /// The flavour it was written in.
    pub flavour: StrategyFlavour,
    /// The parameters, in file order.
    pub params: Vec<StrategyParam>,
    /// The operators' strategies, in file order (empty when the file records none).
    pub ops: Vec<OpStrategyRecord>,
    /// The MindSpore file model, for MindSpore flavours.
    pub ms: Option<MsStrategyFile>,
}

/// A parameter's placement in one stage, bound to the global shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    /// The pipeline stage.
    pub stage: usize,
    /// The model-parallel layout.
    pub mp: TensorLayout,
    /// What each rank holds: `mp` with the optimizer shard applied.
    pub held: TensorLayout,
    /// Optimizer-shard group size (1 = none).
    pub opt_shard: usize,
}

impl ParamLayout {
    /// Binds a model-parallel layout and an optimizer-shard group size (1 = none).
    pub fn new(
        stage: usize,
        mp: TensorLayout,
        opt_shard: usize,
    ) -> Result<ParamLayout, LayoutError> {
        let held = if opt_shard > 1 {
            mp.with_optimizer_shard(Some(opt_shard))?
        } else {
            mp.clone()
        };
        Ok(ParamLayout {
            stage,
            mp,
            held,
            opt_shard: opt_shard.max(1),
        })
    }

    /// MindSpore's `opt_weight_shard_step`: the rank stride inside the optimizer-shard group,
    /// `(last - first) / (n - 1)` of the group containing the mesh's first slot (0 when not
    /// sharded).
    pub fn opt_shard_step(&self) -> usize {
        if self.opt_shard <= 1 {
            return 0;
        }
        let group = self.mp.replica_slots(0);
        let k = self.opt_shard.min(group.len());
        if k <= 1 {
            return 0;
        }
        let mesh = self.mp.mesh();
        let (first, last) = (mesh.rank_of_slot(group[0]), mesh.rank_of_slot(group[k - 1]));
        (last - first) / (k - 1)
    }
}

/// One parameter of a [`ResolvedStrategy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedParam {
    /// The name.
    pub name: String,
    /// The global shape.
    pub shape: Vec<usize>,
    /// The dtype, when known.
    pub dtype: Option<DType>,
    /// Its placements, one per pipeline stage holding it.
    pub placements: Vec<ParamLayout>,
}

impl ResolvedParam {
    /// The placement whose mesh holds global rank `rank` (as a physical device), with its slot.
    /// The first slot in slot order when an interleaved mesh gives the device several. A lookup
    /// per virtual rank of the device, not a scan of the mesh (constant time for contiguous rank
    /// lists).
    pub fn placement_of_rank(&self, rank: usize) -> Option<(&ParamLayout, usize)> {
        self.placements.iter().find_map(|p| {
            let mesh = p.held.mesh();
            let k = mesh.interleave_factor();
            (0..k)
                .filter_map(|j| {
                    let virtual_rank = rank.checked_mul(k)?.checked_add(j)?;
                    mesh.slot_of_rank(virtual_rank)
                })
                .min()
                .map(|s| (p, s))
        })
    }
}

/// A strategy with every shape bound: each rank's box of each parameter is known.
#[derive(Debug, Clone, Default)]
pub struct ResolvedStrategy {
    params: Vec<ResolvedParam>,
    by_name: HashMap<String, usize>,
}

impl ResolvedStrategy {
    /// Builds a strategy from resolved parameters (names must be unique).
    pub fn new(params: Vec<ResolvedParam>) -> Result<ResolvedStrategy> {
        let mut by_name = HashMap::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            if by_name.insert(p.name.clone(), i).is_some() {
                return Err(CkptError::InvalidRequest(format!(
                    "parameter {:?} appears twice in a strategy",
                    p.name
                )));
            }
            for pl in &p.placements {
                if pl.held.mesh().is_interleaved() {
                    return Err(CkptError::InvalidRequest(format!(
                        "parameter {:?}: interleaved_parallel layouts hold several slices per device and cannot be stored in a per-rank checkpoint",
                        p.name
                    )));
                }
            }
        }
        Ok(ResolvedStrategy { params, by_name })
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[ResolvedParam] {
        &self.params
    }

    /// The parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&ResolvedParam> {
        self.by_name.get(name).map(|&i| &self.params[i])
    }

    /// Every global rank of every placement, ascending.
    pub fn ranks(&self) -> Vec<usize> {
        let mut ranks = BTreeSet::new();
        for p in &self.params {
            for pl in &p.placements {
                ranks.extend(pl.held.mesh().device_ranks());
            }
        }
        ranks.into_iter().collect()
    }

    /// Number of ranks: one past the largest rank.
    pub fn n_ranks(&self) -> usize {
        self.ranks().last().map_or(0, |r| r + 1)
    }

    /// Number of pipeline stages (one past the largest stage).
    pub fn n_stages(&self) -> usize {
        self.params
            .iter()
            .flat_map(|p| p.placements.iter().map(|pl| pl.stage + 1))
            .max()
            .unwrap_or(0)
    }

    /// This strategy's parameters whole on one rank (rank 0), same shapes and dtypes: the
    /// destination of a merge.
    pub fn merged(&self) -> Result<ResolvedStrategy> {
        let params: Vec<_> = self
            .params
            .iter()
            .map(|p| (p.name.clone(), p.shape.clone(), p.dtype))
            .collect();
        ResolvedStrategy::single_rank(&params)
    }

    /// Every parameter fully replicated on one rank (rank 0), with the given shapes: the
    /// destination of a merge.
    pub fn single_rank(params: &[(String, Vec<usize>, Option<DType>)]) -> Result<ResolvedStrategy> {
        let mesh = layout::Mesh::line("rank", 1).expect("a one-rank mesh");
        let params = params
            .iter()
            .map(|(name, shape, dtype)| {
                let mp = TensorLayout::replicated(mesh.clone(), shape);
                Ok(ResolvedParam {
                    name: name.clone(),
                    shape: shape.clone(),
                    dtype: *dtype,
                    placements: vec![ParamLayout::new(0, mp, 1).map_err(|source| {
                        CkptError::Layout {
                            path: PathBuf::from("(single rank)"),
                            tensor: name.clone(),
                            source,
                        }
                    })?],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        ResolvedStrategy::new(params)
    }
}

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
        Strategy::from_ms(label, file, StrategyFlavour::MsLayoutDict)
    }

    /// Reads a strategy file of any flavour, detected by content: JSON (`{`) is Tessera's if
    /// it says `"format": "tessera-strategy"`, MindSpore's if it has `parallel_layout_item`;
    /// anything else is read as MindSpore protobuf.
    pub fn load(path: &Path) -> Result<Strategy> {
        let bytes = std::fs::read(path).map_err(io_err(path, "read"))?;
        Strategy::from_bytes(path, &bytes)
    }

    /// Parses strategy bytes (see [`Strategy::load`]).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Strategy> {
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        if first == Some(&b'{') {
            let text = std::str::from_utf8(bytes).map_err(|_| CkptError::InvalidStrategy {
                path: path.to_path_buf(),
                reason: "a JSON strategy must be UTF-8".to_string(),
            })?;
            let json = Json::parse(text).map_err(|e| CkptError::InvalidStrategy {
                path: path.to_path_buf(),
                reason: format!("not valid JSON ({e})"),
            })?;
            if json.get("format").and_then(Json::as_str)
                == Some(crate::tessera_strategy::FORMAT_NAME)
            {
                return crate::tessera_strategy::from_json(path, &json);
            }
            if json.get("parallel_layout_item").is_some() {
                let file = MsStrategyFile::from_json(path, &json)?;
                return Strategy::from_ms(path, file, StrategyFlavour::MsJson);
            }
            return Err(CkptError::InvalidStrategy {
                path: path.to_path_buf(),
                reason: "JSON that is neither a Tessera strategy (\"format\": \"tessera-strategy\") nor a MindSpore one (\"parallel_layout_item\")".to_string(),
            });
        }
        let file = MsStrategyFile::decode(path, bytes)?;
        Strategy::from_ms(path, file, StrategyFlavour::MsProtobuf)
    }

    /// Builds the model from a MindSpore file.
    ///
    /// Names are split as `"<stage>-<name>"` only when *every* layout name has a numeric
    /// prefix (a file merged by `merge_pipeline_strategys`), and then only at the first `-`;
    /// otherwise names are kept whole and the stage is the first strategy item's. MindSpore
    /// splits any name containing `-`, which breaks names such as `layer-1.w`.
    pub fn from_ms(
        path: &Path,
        file: MsStrategyFile,
        flavour: StrategyFlavour,
    ) -> Result<Strategy> {
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
            if let Some(existing) = params.iter_mut().find(|p| p.name == name) {
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
                params.push(StrategyParam {
                    name,
                    shape,
                    dtype: None,
                    placements: vec![placement],
                });
            }
        }
        Ok(Strategy {
            path: path.to_path_buf(),
            flavour,
            params,
            ops: file
                .strategy_items
                .iter()
                .map(OpStrategyRecord::from_ms)
                .collect(),
            ms: Some(file),
        })
    }

    /// The parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&StrategyParam> {
        self.params.iter().find(|p| p.name == name)
    }

    /// Number of pipeline stages (one past the largest stage).
    pub fn n_stages(&self) -> usize {
        self.params
            .iter()
            .flat_map(|p| p.placements.iter().map(|pl| pl.stage + 1))
            .max()
            .unwrap_or(0)
    }

    /// Checks that the stages present are exactly `0..n`, as conversions need.
    pub fn check_stages(&self) -> Result<()> {
        let present: BTreeSet<usize> = self
            .params
            .iter()
            .flat_map(|p| p.placements.iter().map(|pl| pl.stage))
            .collect();
        if let Some(missing) = (0..self.n_stages()).find(|s| !present.contains(s)) {
            return Err(CkptError::InvalidStrategy {
                path: self.path.clone(),
                reason: format!(
                    "pipeline stage {missing} has no parameters (stages present: {present:?}); per-stage MindSpore files must be merged first (tessera strategy merge-stages)"
                ),
            });
        }
        Ok(())
    }

    /// Binds every parameter to a global shape. `lookup(param, placement)` supplies what the
    /// file lacks: `Some((shape, dtype, global))` where `global` says whether `shape` is the
    /// global shape or one rank's slice (to be multiplied by the placement's split factors).
    /// Parameters for which neither the file nor `lookup` knows a shape are returned apart.
    pub fn resolve(
        &self,
        mut lookup: impl FnMut(&StrategyParam, &StagePlacement) -> Result<Option<ShapeHint>>,
    ) -> Result<(ResolvedStrategy, Vec<String>)> {
        let mut resolved = Vec::with_capacity(self.params.len());
        let mut unknown = Vec::new();
        for p in &self.params {
            let mut shape = p.shape.clone();
            let mut dtype = p.dtype;
            let mut shape_source = "the strategy file".to_string();
            for pl in &p.placements {
                let Some(hint) = lookup(p, pl)? else { continue };
                let global = if hint.is_global {
                    hint.shape.clone()
                } else {
                    let held = pl
                        .held_layout()
                        .map_err(|source| self.layout_err(&p.name, source))?;
                    let factors = held.split_factors();
                    if factors.len() != hint.shape.len() {
                        return Err(CkptError::GlobalShape {
                            tensor: p.name.clone(),
                            reason: format!(
                                "{} holds a slice of shape {:?} ({} dims) but the strategy maps {} dims",
                                hint.source,
                                hint.shape,
                                hint.shape.len(),
                                factors.len()
                            ),
                        });
                    }
                    let mut global = hint
                        .shape
                        .iter()
                        .zip(&factors)
                        .map(|(s, f)| s.checked_mul(*f))
                        .collect::<Option<Vec<usize>>>();
                    // Uneven blocks of rows: the rows are their sum, whatever block was seen.
                    if let (Some(g), Some(rows)) = (global.as_mut(), &pl.rows) {
                        g[0] = rows.iter().sum();
                    }
                    global.ok_or_else(|| CkptError::GlobalShape {
                        tensor: p.name.clone(),
                        reason: "the global shape overflows".to_string(),
                    })?
                };
                match &shape {
                    Some(s) if *s != global => {
                        return Err(CkptError::GlobalShape {
                            tensor: p.name.clone(),
                            reason: format!(
                                "{} implies global shape {global:?} but {shape_source} gives {s:?}",
                                hint.source
                            ),
                        })
                    }
                    Some(_) => {}
                    None => {
                        shape = Some(global);
                        shape_source = hint.source.clone();
                    }
                }
                match (dtype, hint.dtype) {
                    (Some(a), Some(b)) if a != b => {
                        return Err(CkptError::GlobalShape {
                            tensor: p.name.clone(),
                            reason: format!(
                                "{} stores {b} but {shape_source} says {a}",
                                hint.source
                            ),
                        })
                    }
                    (None, b) => dtype = b,
                    _ => {}
                }
            }
            let Some(shape) = shape else {
                unknown.push(p.name.clone());
                continue;
            };
            let mut placements = Vec::with_capacity(p.placements.len());
            for pl in &p.placements {
                let mp = pl
                    .bind(&shape)
                    .map_err(|source| self.layout_err(&p.name, source))?;
                placements.push(
                    ParamLayout::new(pl.stage, mp, pl.opt_shard)
                        .map_err(|source| self.layout_err(&p.name, source))?,
                );
            }
            resolved.push(ResolvedParam {
                name: p.name.clone(),
                shape,
                dtype,
                placements,
            });
        }
        Ok((ResolvedStrategy::new(resolved)?, unknown))
    }

    /// Binds every parameter to its recorded shape or, when the file has none, to the smallest
    /// shape its placements divide (per dim, the least common multiple of the split factors).
    /// Which ranks hold which part of a tensor does not depend on its scale, so this answers
    /// questions about placement (replica groups, rank lists) from the strategy alone.
    pub fn resolve_scale_free(&self) -> Result<ResolvedStrategy> {
        let (resolved, unknown) = self.resolve(|p, _| {
            if p.shape.is_some() {
                return Ok(None);
            }
            let mut factors: Vec<usize> = Vec::new();
            for pl in &p.placements {
                let f = pl
                    .held_layout()
                    .map_err(|source| self.layout_err(&p.name, source))?
                    .split_factors();
                if factors.is_empty() {
                    factors = f;
                } else if factors.len() == f.len() {
                    for (a, b) in factors.iter_mut().zip(f) {
                        *a = lcm(*a, b);
                    }
                }
            }
            Ok(Some(ShapeHint {
                shape: factors,
                is_global: true,
                dtype: None,
                source: "the split factors".to_string(),
            }))
        })?;
        debug_assert!(unknown.is_empty());
        Ok(resolved)
    }

    fn layout_err(&self, tensor: &str, source: LayoutError) -> CkptError {
        CkptError::Layout {
            path: self.path.clone(),
            tensor: tensor.to_string(),
            source,
        }
    }
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

/// A shape found for a parameter outside its strategy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeHint {
    /// The shape.
    pub shape: Vec<usize>,
    /// Whether it is the global shape (otherwise one rank's stored slice).
    pub is_global: bool,
    /// The dtype, if known.
    pub dtype: Option<DType>,
    /// Where it comes from, for messages (a file path, "the source strategy").
    pub source: String,
}

/// Greatest common divisor.
pub(crate) fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Least common multiple (0 counts as absent).
pub(crate) fn lcm(a: usize, b: usize) -> usize {
    if a == 0 || b == 0 {
        a.max(b)
    } else {
        a / gcd(a, b) * b
    }
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
        k if k < -1 => return Err(rule(format!("opt_weight_shard_size {k} is negative"))),
        k => (k as usize).min(replicas),
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

    #[test]
    fn placement_of_rank_finds_the_first_slot_of_each_device() {
        let meshes = [
            layout::Mesh::new(&[2, 4], &["a", "b"], None).unwrap(),
            layout::Mesh::new(&[2, 2], &["a", "b"], Some(vec![7, 3, 5, 1])).unwrap(),
            layout::Mesh::new(&[2, 2], &["a", layout::INTERLEAVED_ALIAS], None).unwrap(),
        ];
        for mesh in meshes {
            let mp = layout::Layout::from_mesh(mesh.clone(), vec![Vec::new(); 1])
                .unwrap()
                .bind(&[4])
                .unwrap();
            let param = ResolvedParam {
                name: "w".into(),
                shape: vec![4],
                dtype: None,
                placements: vec![ParamLayout::new(0, mp, 1).unwrap()],
            };
            for rank in 0..10 {
                let brute = (0..mesh.n_slots()).find(|&s| mesh.device_of_slot(s) == rank);
                assert_eq!(
                    param.placement_of_rank(rank).map(|(_, s)| s),
                    brute,
                    "rank {rank}"
                );
            }
        }
    }
}
