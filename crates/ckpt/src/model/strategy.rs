//! The model of a parameter strategy, whatever file it came from.
//!
//! Every parameter becomes, per pipeline stage that holds it, a model-parallel
//! [`layout::Layout`] over a mesh whose rank list is that stage's global ranks, plus an
//! optimizer-shard group size. [`Strategy`] is what a file says (the global shape may be
//! unknown: MindSpore's protobuf does not store it); [`ResolvedStrategy`] has every shape bound,
//! so each rank's box is known. Resolution takes shapes from the file (Tessera JSON, MindSpore
//! JSON `tensor_shape`), from a checkpoint's slices, or from another strategy by name; any
//! disagreement is an error naming the parameter.
//!
//! Files are read into this model by the format modules ([`Strategy::load`] picks the reader),
//! and nothing here knows a file's bytes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;

use layout::{Layout, LayoutError, TensorLayout};
use tensor::DType;

use super::resolved::{stage_count, ParamLayout, ResolvedParam, ResolvedStrategy};
use crate::error::{CkptError, Result};

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

/// The most split tuples (inputs, or outputs) one op strategy of a file may hold.
pub(crate) const MAX_OP_TUPLES: usize = 1024;

impl OpStrategyRecord {
    /// Checks the sizes a file gave this record: at most [`MAX_OP_TUPLES`] split tuples per
    /// side, each of at most 64 factors (a tensor's most dims). The rule broken, naming the op.
    pub(crate) fn check_sizes(&self) -> std::result::Result<(), String> {
        let name = &self.name;
        for (what, tuples) in [
            ("in_strategy", Some(&self.inputs)),
            ("out_strategy", self.outputs.as_ref()),
        ] {
            let Some(tuples) = tuples else { continue };
            check_tuple_count(name, what, tuples.len())?;
            if let Some((i, t)) = tuples
                .iter()
                .enumerate()
                .find(|(_, t)| t.len() > super::tensor::MAX_DIMS)
            {
                let name = crate::error::brief_name(name);
                return Err(format!(
                    "op {name:?}: its {what} tuple {i} has {} split factors, more than the {} dims a tensor may have",
                    t.len(),
                    super::tensor::MAX_DIMS
                ));
            }
        }
        Ok(())
    }
}

/// Refuses `n` split tuples in op `name`'s `what` (`in_strategy`, `out_strategy`) when they
/// are more than [`MAX_OP_TUPLES`]: checked by the readers before they convert a file's list.
pub(crate) fn check_tuple_count(
    name: &str,
    what: &str,
    n: usize,
) -> std::result::Result<(), String> {
    if n > MAX_OP_TUPLES {
        let name = crate::error::brief_name(name);
        return Err(format!(
            "op {name:?}: its {what} has {n} split tuples, more than the {MAX_OP_TUPLES} an op may have"
        ));
    }
    Ok(())
}

/// Refuses a second record of one operator in one pipeline stage: which of the two applied
/// was a silent choice. The same name in different stages stays (a merged pipeline file may
/// hold it). Checked by the readers of files that can repeat a record (a list, a repeated
/// protobuf field), given each record's op name and stage; the rule broken, naming the op and
/// the stage.
pub(crate) fn check_unique_ops<'a>(
    ops: impl IntoIterator<Item = (&'a str, usize)>,
) -> std::result::Result<(), String> {
    let mut seen: HashSet<(&str, usize)> = HashSet::new();
    for (name, stage) in ops {
        if !seen.insert((name, stage)) {
            let name = crate::error::brief_name(name);
            return Err(format!(
                "op {name:?} has two strategy records in pipeline stage {stage}; an op has one strategy per stage"
            ));
        }
    }
    Ok(())
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
    /// Parameter name → index in `params`, as built by [`Strategy::new`]: a scan per lookup
    /// made every pass over the parameters quadratic (100 000 parameters took minutes).
    by_name: HashMap<String, usize>,
}

impl Strategy {
    /// A strategy of these parameters (their names distinct) and operator records.
    pub fn new(
        path: PathBuf,
        flavour: StrategyFlavour,
        params: Vec<StrategyParam>,
        ops: Vec<OpStrategyRecord>,
    ) -> Strategy {
        let by_name = params
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        Strategy {
            path,
            flavour,
            params,
            ops,
            by_name,
        }
    }

    /// The parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&StrategyParam> {
        // The index holds while `params` keeps its length (the fields are public); a hit is
        // checked against the name.
        if self.by_name.len() == self.params.len() {
            match self.by_name.get(name).map(|&i| &self.params[i]) {
                Some(p) if p.name == name => return Some(p),
                None => return None,
                Some(_) => {}
            }
        }
        self.params.iter().find(|p| p.name == name)
    }

    /// The number of devices this strategy was trained on: one past the largest rank any of
    /// its placements uses (as [`ResolvedStrategy::n_ranks`]). A merged pipeline strategy lists
    /// every stage's ranks, so this counts all stages; a single stage's file counts that
    /// stage's devices, as MindSpore's `load_distributed_checkpoint` does (the product of the
    /// device matrix).
    pub fn n_ranks(&self) -> usize {
        let mut seen: HashSet<&[usize]> = HashSet::new();
        let mut n = 0;
        for p in &self.params {
            for pl in &p.placements {
                let mesh = pl.layout.mesh();
                if seen.insert(mesh.rank_list()) {
                    if let Some(last) = mesh.device_ranks().into_iter().max() {
                        n = n.max(last + 1);
                    }
                }
            }
        }
        n
    }

    /// Number of pipeline stages (one past the largest stage).
    pub fn n_stages(&self) -> usize {
        stage_count(
            self.params
                .iter()
                .flat_map(|p| p.placements.iter().map(|pl| pl.stage)),
        )
    }

    /// Checks that the stages present are exactly `0..n`, as conversions need, and that no
    /// rank holds parameters of two stages (a rank runs one pipeline stage).
    pub fn check_stages(&self) -> Result<()> {
        self.check_stage_ranks()?;
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

    /// Checks that every rank holds parameters of one stage only, naming a parameter of each
    /// stage that claims a shared rank.
    fn check_stage_ranks(&self) -> Result<()> {
        // Each distinct rank list once per stage: parameters mostly share their stage's list.
        let mut lists: BTreeMap<usize, BTreeMap<&[usize], &str>> = BTreeMap::new();
        for p in &self.params {
            for pl in &p.placements {
                lists
                    .entry(pl.stage)
                    .or_default()
                    .entry(pl.layout.mesh().rank_list())
                    .or_insert(&p.name);
            }
        }
        let mut owner: BTreeMap<usize, (usize, &str)> = BTreeMap::new();
        for (&stage, by_list) in &lists {
            for (ranks, &name) in by_list {
                for &rank in ranks.iter() {
                    match owner.insert(rank, (stage, name)) {
                        Some((other, other_name)) if other != stage => {
                            let (name, other_name) = (
                                crate::error::brief_name(name),
                                crate::error::brief_name(other_name),
                            );
                            return Err(CkptError::InvalidStrategy {
                                path: self.path.clone(),
                                reason: format!(
                                    "rank {rank} holds {other_name:?} of pipeline stage {other} and {name:?} of stage {stage}; a rank runs one stage, so the stages' rank lists must not overlap"
                                ),
                            });
                        }
                        _ => {}
                    }
                }
            }
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
            let placements = self.bind_placements(p, &shape)?;
            resolved.push(ResolvedParam {
                name: p.name.clone(),
                shape,
                dtype,
                placements,
            });
        }
        Ok((ResolvedStrategy::new(resolved)?, unknown))
    }

    /// Every placement of `p` bound to `shape`: the check every conversion applies (the shape
    /// has the layout's rank, each split divides its dim, uneven rows sum to dim 0, the optimizer
    /// shard divides the slice), an error naming the file, the parameter and the rule broken.
    fn bind_placements(&self, p: &StrategyParam, shape: &[usize]) -> Result<Vec<ParamLayout>> {
        let mut placements = Vec::with_capacity(p.placements.len());
        for pl in &p.placements {
            let mp = pl
                .bind(shape)
                .map_err(|source| self.layout_err(&p.name, source))?;
            placements.push(
                ParamLayout::new(pl.stage, mp, pl.opt_shard)
                    .map_err(|source| self.layout_err(&p.name, source))?,
            );
        }
        Ok(placements)
    }

    /// Checks every parameter whose shape the file records against its layouts, as a
    /// conversion binds them ([`Strategy::resolve`]): the first that breaks a rule is an error
    /// naming the file, the parameter and the rule. Parameters without a recorded shape
    /// (MindSpore's protobuf stores none) are not checked.
    pub fn check_recorded_shapes(&self) -> Result<()> {
        for p in &self.params {
            if let Some(shape) = &p.shape {
                self.bind_placements(p, shape)?;
            }
        }
        Ok(())
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
