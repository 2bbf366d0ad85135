//! Tessera's strategy JSON: a versioned, self-describing record of every tensor's global shape,
//! dtype and placement (the format is specified in the crate documentation).

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use layout::{Layout, Mesh, MeshAxis};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::ser::PrettyFormatter;
use tensor::DType;

mod stream;
#[cfg(test)]
mod tests;

use self::stream::{
    Caps, List, Listed, Name, RawMesh, RawOp, RawPlacement, RawTensor, Stop, MAX_NAME_BYTES,
};
use super::codec::json::Json;
use crate::error::{brief_name, io_err, CkptError, Result};
use crate::io::atomic_write::AtomicFile;
use crate::io::durability::Durability;
use crate::model::tensor::MAX_DIMS;
use crate::model::{
    check_tuple_count, check_unique_ops, OpStrategyRecord, ParamLayout, ResolvedParam,
    ResolvedStrategy, StagePlacement, Strategy, StrategyFlavour, StrategyParam, MAX_OP_TUPLES,
};

/// The value of the `"format"` key.
pub const FORMAT_NAME: &str = "tessera-strategy";
/// The version this crate writes. It reads this one and version 1, which knows no
/// `"rank_range"` (version 2's compact form of consecutive ranks): a version-1 reader would take
/// a mesh without `"rank_list"` to hold ranks `0..n`, so files that may use it say version 2.
pub const VERSION: u64 = 2;

/// The most tensors a strategy file may hold (4 194 304): far above any real model, and checked
/// as they are read.
pub(crate) const MAX_TENSORS: usize = 1 << 22;
/// The most `"ops"` entries a strategy file may hold (4 194 304).
pub(crate) const MAX_OPS: usize = 1 << 22;
/// The most placements (pipeline stages) one tensor may have (65 536).
pub(crate) const MAX_PLACEMENTS: usize = 1 << 16;

/// Whether `bytes` open with `{"format": "tessera-strategy"` (JSON white space allowed between
/// the tokens), as every file this crate writes does. Such a file can be nothing but a Tessera
/// strategy if it reads as one, so [`crate::Strategy::from_bytes`] reads it at once, without the
/// detection step's pass over the whole text first; only a file that then fails to read goes
/// through the detection step, whose verdict (not JSON, another kind of JSON) names the fault as
/// before.
pub(crate) fn declared_first(bytes: &[u8]) -> bool {
    let format = format!("\"{FORMAT_NAME}\"");
    let mut rest = bytes;
    for token in [&b"{"[..], b"\"format\"", b":", format.as_bytes()] {
        let start = rest
            .iter()
            .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            .unwrap_or(rest.len());
        match rest[start..].strip_prefix(token) {
            Some(r) => rest = r,
            None => return false,
        }
    }
    true
}

/// Reads a Tessera strategy file's bytes, streaming: each tensor is checked and built as it is
/// read, never a tree of the whole file (see [`stream`]).
pub(crate) fn read(path: &Path, bytes: &[u8]) -> Result<Strategy> {
    let bad = |reason: String| CkptError::InvalidStrategy {
        path: path.to_path_buf(),
        reason,
    };
    let text =
        std::str::from_utf8(bytes).map_err(|_| bad("a JSON file must be UTF-8".to_string()))?;
    let caps = Caps {
        dims: MAX_DIMS,
        placements: MAX_PLACEMENTS,
        axes: layout::limits::MAX_MESH_AXES,
        ranks: layout::limits::max_ranks(),
        tuples: MAX_OP_TUPLES,
        ops: MAX_OPS,
    };
    let mut tensors = Tensors {
        path,
        params: Vec::new(),
        names: HashSet::new(),
        waiting: Vec::new(),
    };
    let top = stream::decode(
        text,
        caps,
        &mut |version, i, raw| tensors.take(version, i, raw),
        op_record,
    )
    .map_err(|stop| match stop {
        Stop::Json(e) => bad(format!("not valid JSON ({e})")),
        Stop::Sink(e) => e,
    })?;
    let version = check_version(path, top.version.as_ref())?;
    if top.tensors != Some(true) {
        return Err(bad("no \"tensors\" list".to_string()));
    }
    // Tensors read before the `"version"` key are checked now that it is known.
    for (i, raw) in std::mem::take(&mut tensors.waiting) {
        tensors.add(version, i, raw)?;
    }
    if let Some((i, reason)) = top.op_error {
        return Err(bad(format!("ops #{i}: {reason}")));
    }
    let ops = match top.ops {
        None | Some(Listed::Null) => Vec::new(),
        Some(Listed::Other) => return Err(bad("\"ops\" must be a list".to_string())),
        Some(Listed::List(list)) => {
            if list.len > list.items.len() {
                return Err(bad(format!(
                    "\"ops\" has {} entries, more than the {MAX_OPS} a strategy file may hold",
                    list.len
                )));
            }
            list.items
        }
    };
    check_unique_ops(ops.iter().map(|op| (op.name.as_str(), op.stage)))
        .map_err(|reason| bad(format!("\"ops\": {reason}")))?;
    Ok(Strategy::new(
        path.to_path_buf(),
        StrategyFlavour::Tessera,
        tensors.params,
        ops,
    ))
}

/// The version a file's `"version"` gives, if this build reads it.
fn check_version(path: &Path, version: Option<&Json>) -> Result<u64> {
    let bad = |reason: String| CkptError::InvalidStrategy {
        path: path.to_path_buf(),
        reason,
    };
    match version.and_then(Json::as_u64) {
        Some(v @ (1 | VERSION)) => Ok(v),
        Some(v) => Err(bad(format!(
            "version {v} is not supported (this build reads versions 1 to {VERSION})"
        ))),
        None => Err(bad("no \"version\"".to_string())),
    }
}

/// The tensors read so far.
struct Tensors<'a> {
    path: &'a Path,
    params: Vec<StrategyParam>,
    /// The names seen, to refuse a second one without a quadratic scan of `params`.
    names: HashSet<String>,
    /// Tensors read before the `"version"` key (a file that gives it after `"tensors"`).
    waiting: Vec<(usize, RawTensor)>,
}

impl Tensors<'_> {
    /// Takes tensor #`i`, read after the `"version"` (if any).
    fn take(&mut self, version: Option<&Json>, i: usize, raw: RawTensor) -> Result<()> {
        if i >= MAX_TENSORS {
            return Err(CkptError::InvalidStrategy {
                path: self.path.to_path_buf(),
                reason: format!(
                    "\"tensors\" has more than {MAX_TENSORS} entries, the most a strategy file may hold"
                ),
            });
        }
        match version {
            Some(v) => {
                let version = check_version(self.path, Some(v))?;
                self.add(version, i, raw)
            }
            None => {
                self.waiting.push((i, raw));
                Ok(())
            }
        }
    }

    /// Checks tensor #`i` of a file of `version` and keeps it.
    fn add(&mut self, version: u64, i: usize, t: RawTensor) -> Result<()> {
        let path = self.path;
        let bad = |reason: String| CkptError::InvalidStrategy {
            path: path.to_path_buf(),
            reason,
        };
        let name = match t.name {
            Name::Str(name) => name,
            Name::Missing => return Err(bad(format!("tensor #{i} has no \"name\""))),
            Name::TooLong(n) => {
                return Err(bad(format!(
                    "tensor #{i}: its \"name\" is {n} bytes long, more than the {MAX_NAME_BYTES} a name may have"
                )))
            }
        };
        let rule = |rule: String| CkptError::StrategyParam {
            path: path.to_path_buf(),
            tensor: name.clone(),
            rule,
        };
        if self.names.contains(&name) {
            return Err(rule("the name appears twice".to_string()));
        }
        let shape = t
            .shape
            .as_ref()
            .and_then(Listed::list)
            .and_then(List::whole)
            .and_then(|a| {
                a.iter()
                    .map(|&d| usize::try_from(d).ok())
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| {
                rule(format!(
                    "\"shape\" must be a list of at most {MAX_DIMS} sizes"
                ))
            })?;
        let dtype = match &t.dtype {
            None | Some(Json::Null) => None,
            Some(d) => Some(
                d.as_str()
                    .and_then(|s| s.parse::<DType>().ok())
                    .ok_or_else(|| rule(format!("unknown \"dtype\" {}", d.brief())))?,
            ),
        };
        let list = t
            .placements
            .as_ref()
            .and_then(Listed::list)
            .filter(|a| a.len > 0)
            .ok_or_else(|| rule("\"placements\" must be a non-empty list".to_string()))?;
        let mut placements = Vec::with_capacity(list.items.len());
        // A stage placed twice is refused at its second copy, before that copy's mesh is
        // built: a list of 100 000 copies of one placement was read whole and accepted.
        let mut stages: HashSet<usize> = HashSet::new();
        for pl in &list.items {
            let stage = match &pl.stage {
                None => 0,
                Some(s) => s
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| rule("\"stage\" must be a non-negative integer".to_string()))?,
            };
            if !stages.insert(stage) {
                return Err(rule(format!(
                    "stage {stage} is placed twice: a tensor has at most one placement per pipeline stage"
                )));
            }
            placements.push(placement(path, &name, stage, version, pl)?);
        }
        // Checked after the kept ones: a stage placed twice is named first.
        if list.len > list.items.len() {
            return Err(rule(format!(
                "\"placements\" has {} entries, more than the {MAX_PLACEMENTS} pipeline stages a tensor may be placed in",
                list.len
            )));
        }
        placements.sort_by_key(|p| p.stage);
        self.names.insert(name.clone());
        self.params.push(StrategyParam {
            name,
            shape: Some(shape),
            dtype,
            placements,
        });
        Ok(())
    }
}

/// One `"ops"` entry: `{"name", "stage", "in_strategy", "out_strategy"}`.
fn op_record(op: &RawOp) -> std::result::Result<OpStrategyRecord, String> {
    let name = match &op.name {
        Name::Str(name) => name.clone(),
        Name::Missing => return Err("no \"name\"".to_string()),
        Name::TooLong(n) => {
            return Err(format!(
                "its \"name\" is {n} bytes long, more than the {MAX_NAME_BYTES} a name may have"
            ))
        }
    };
    let quoted = format!("{:?}", brief_name(&name));
    // The first tuple of more factors than a tensor has dims (`what`, index, factors): only
    // counted, so it is named after the other checks, as `check_sizes` names one.
    let mut wide: Option<(&str, usize, usize)> = None;
    let mut tuples = |key: &'static str,
                      field: &Option<Listed<List<u64>>>|
     -> std::result::Result<Option<Vec<Vec<usize>>>, String> {
        let list = match field {
            None | Some(Listed::Null) => return Ok(None),
            Some(Listed::Other) => None,
            Some(Listed::List(list)) => {
                check_tuple_count(&name, key, list.len)?;
                Some(list)
            }
        };
        list.filter(|l| l.ok)
            .and_then(|l| {
                l.items
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let t = Some(t).filter(|t| t.ok)?;
                        if t.len > t.items.len() && wide.is_none() {
                            wide = Some((key, i, t.len));
                        }
                        t.items
                            .iter()
                            .map(|&f| usize::try_from(f).ok())
                            .collect::<Option<Vec<_>>>()
                    })
                    .collect::<Option<Vec<_>>>()
            })
            .map(Some)
            .ok_or_else(|| {
                format!("op {quoted}: {key:?} must be a list of split tuples of positive integers")
            })
    };
    let inputs = tuples("in_strategy", &op.in_strategy)?
        .ok_or_else(|| format!("op {quoted} has no \"in_strategy\""))?;
    let outputs = tuples("out_strategy", &op.out_strategy)?;
    let stage = match &op.stage {
        None => 0,
        Some(s) => s
            .as_u64()
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(|| format!("op {quoted}: \"stage\" must be a non-negative integer"))?,
    };
    if let Some((what, i, n)) = wide {
        return Err(format!(
            "op {quoted}: its {what} tuple {i} has {n} split factors, more than the {MAX_DIMS} dims a tensor may have"
        ));
    }
    let record = OpStrategyRecord {
        name,
        stage,
        inputs,
        outputs,
        in_layouts: None,
        out_layouts: None,
    };
    record.check_sizes()?;
    Ok(record)
}

/// One placement of tensor `name` in pipeline `stage` (read by the caller) from a file of
/// `version`.
fn placement(
    path: &Path,
    name: &str,
    stage: usize,
    version: u64,
    pl: &RawPlacement,
) -> Result<StagePlacement> {
    let rule = |rule: String| CkptError::StrategyParam {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        rule,
    };
    let layout_err = |source| CkptError::Layout {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        source,
    };
    let mesh = pl
        .mesh
        .as_ref()
        .ok_or_else(|| rule("a placement has no \"mesh\"".to_string()))?;
    let listed_axes = mesh
        .axes
        .as_ref()
        .and_then(Listed::list)
        .ok_or_else(|| rule("\"mesh\".\"axes\" must be a list of [name, size]".to_string()))?;
    let mut axes = Vec::with_capacity(listed_axes.items.len());
    for a in &listed_axes.items {
        match a.as_arr() {
            Some([n, s]) if n.as_str().is_some() && s.as_u64().is_some() => axes.push(MeshAxis {
                name: n.as_str().expect("checked").to_string(),
                size: s.as_u64().expect("checked") as usize,
            }),
            _ => return Err(rule(format!("mesh axis {} is not [name, size]", a.brief()))),
        }
    }
    if listed_axes.len > listed_axes.items.len() {
        return Err(rule(format!(
            "\"mesh\".\"axes\" has {} axes, more than the {} a mesh may have",
            listed_axes.len,
            layout::limits::MAX_MESH_AXES
        )));
    }
    let rank_list = rank_list(mesh, version, &axes).map_err(|e| match e {
        RanksError::Rule(r) => rule(r),
        RanksError::Layout(e) => layout_err(e),
    })?;
    let mesh = Mesh::from_axes(axes, rank_list).map_err(layout_err)?;
    let listed_dims = pl.dims.as_ref().and_then(Listed::list).ok_or_else(|| {
        rule("\"dims\" must be a list (one list of axis names per tensor dim)".to_string())
    })?;
    if listed_dims.len > listed_dims.items.len() {
        return Err(rule(format!(
            "\"dims\" has {} entries, more than the {MAX_DIMS} dims a tensor may have",
            listed_dims.len
        )));
    }
    let mut dims = Vec::with_capacity(listed_dims.items.len());
    for d in &listed_dims.items {
        let names = d.as_arr().ok_or_else(|| {
            rule(format!(
                "dim entry {} is not a list of axis names",
                d.brief()
            ))
        })?;
        let mut axes = Vec::with_capacity(names.len());
        for n in names {
            let n = n
                .as_str()
                .ok_or_else(|| rule(format!("axis {} is not a name", n.brief())))?;
            axes.push(mesh.axis_index(n).map_err(layout_err)?);
        }
        dims.push(axes);
    }
    let layout = Layout::from_mesh(mesh, dims).map_err(layout_err)?;
    let opt_shard = match &pl.optimizer_shard {
        None | Some(Json::Null) => 1,
        Some(k) => k.as_u64().filter(|&k| k >= 1).ok_or_else(|| {
            rule("\"optimizer_shard\" must be a group size of at least 1".to_string())
        })? as usize,
    };
    let rows = match &pl.rows {
        None | Some(Listed::Null) => None,
        Some(r) => Some(r.list().filter(|l| l.ok).ok_or_else(|| {
            rule(
                "\"rows\" must be a list of positive row counts, one per block of dim 0"
                    .to_string(),
            )
        })?),
    };
    let rows = match rows {
        None => None,
        Some(rows) => {
            let blocks = layout.split_factors().first().copied().unwrap_or(1);
            if rows.len != blocks {
                return Err(rule(format!(
                    "\"rows\" has {} entries, but dim 0 is split into {blocks} blocks",
                    rows.len
                )));
            }
            Some(rows.items.iter().map(|&r| r as usize).collect::<Vec<_>>())
        }
    };
    let replicas = layout.replica_count();
    if replicas % opt_shard != 0 {
        return Err(rule(format!(
            "\"optimizer_shard\" {opt_shard} does not divide the {replicas} rank(s) holding each slice: the optimizer shard splits a slice among ranks that hold it"
        )));
    }
    let placement = StagePlacement {
        stage,
        layout,
        opt_shard,
        rows,
    };
    placement.held_layout().map_err(layout_err)?;
    Ok(placement)
}

/// Why a placement's ranks were refused: a rule of this format, or a layout bound.
enum RanksError {
    Rule(String),
    Layout(layout::LayoutError),
}

/// The ranks of a placement's `"mesh"`: its `"rank_list"` (every rank, in slot order) or its
/// `"rank_range"` (`[start, count]`: the ranks `start..start + count`), exactly one of them.
/// A version-1 file may give neither (the ranks are then `0..n`); it predates `"rank_range"`.
/// `count` is checked against the mesh's device count (itself bounded by the rank ceiling)
/// before a rank is allocated; a `"rank_list"` was kept only up to the rank ceiling.
fn rank_list(
    mesh: &RawMesh,
    version: u64,
    axes: &[MeshAxis],
) -> std::result::Result<Option<Vec<usize>>, RanksError> {
    let listed = mesh
        .rank_list
        .as_ref()
        .filter(|l| !matches!(l, Listed::Null));
    let range = mesh
        .rank_range
        .as_ref()
        .filter(|v| !matches!(v, Json::Null));
    match (listed, range) {
        (Some(_), Some(_)) => Err(RanksError::Rule(
            "the mesh gives both \"rank_list\" and \"rank_range\"; give exactly one".to_string(),
        )),
        (None, None) if version == 1 => Ok(None),
        (None, None) => Err(RanksError::Rule(
            "the mesh gives neither \"rank_list\" nor \"rank_range\"; give exactly one".to_string(),
        )),
        (Some(r), None) => {
            let list = r.list().filter(|l| l.ok).ok_or_else(|| {
                RanksError::Rule("\"rank_list\" must be a list of ranks".to_string())
            })?;
            if list.len > list.items.len() {
                // Longer than the rank ceiling: longer than any mesh's device count.
                let sizes: Vec<usize> = axes.iter().map(|a| a.size).collect();
                let n = layout::limits::checked_rank_count(&sizes).map_err(RanksError::Layout)?;
                return Err(RanksError::Rule(format!(
                    "\"rank_list\" has {} ranks, but the mesh axes {sizes:?} have {n} devices",
                    list.len
                )));
            }
            list.items
                .iter()
                .map(|&x| usize::try_from(x).ok())
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| {
                    RanksError::Rule("\"rank_list\" must be a list of ranks".to_string())
                })
        }
        (None, Some(r)) => {
            // Any non-negative integer is read whole (not only up to 2^63 - 1, as `as_u64`
            // reads): a start of 2^64 - 1 breaks the rank limit, not the form of the pair.
            let whole = |v: &Json| match *v {
                Json::UInt(v) => Some(v),
                _ => v.as_u64(),
            };
            let (start, count) = match r.as_arr() {
                Some([s, c]) => match (whole(s), whole(c)) {
                    (Some(s), Some(c)) => (s, c),
                    _ => return Err(range_shape(r)),
                },
                _ => return Err(range_shape(r)),
            };
            let sizes: Vec<usize> = axes.iter().map(|a| a.size).collect();
            let n = layout::limits::checked_rank_count(&sizes).map_err(RanksError::Layout)?;
            if count != n as u64 {
                return Err(RanksError::Rule(format!(
                    "\"rank_range\" [{start}, {count}] gives {count} ranks, but the mesh axes {sizes:?} have {n} devices"
                )));
            }
            let max = layout::limits::max_ranks() as u64;
            match start.checked_add(count) {
                Some(end) if end <= max => Ok(Some((start as usize..end as usize).collect())),
                _ => Err(RanksError::Rule(format!(
                    "\"rank_range\" [{start}, {count}] reaches past the limit of {max} ranks (ranks are 0..{max}; set TESSERA_MAX_RANKS to change the limit)"
                ))),
            }
        }
    }
}

fn range_shape(r: &Json) -> RanksError {
    RanksError::Rule(format!(
        "\"rank_range\" {} must be [start, count]: the first rank and the number of consecutive ranks, non-negative integers",
        r.brief()
    ))
}

/// `ranks` as a Tessera strategy's `"rank_range"`: `Some((start, count))` when they are the
/// consecutive ranks `start, start + 1, …, start + count - 1` (at least one), `None` when they
/// must be listed one by one (`"rank_list"`). The Tessera strategy writer and
/// `tessera strategy show --json` print ranks this way.
pub fn rank_range(ranks: &[usize]) -> Option<(usize, usize)> {
    let start = *ranks.first()?;
    ranks
        .windows(2)
        .all(|w| w[0].checked_add(1) == Some(w[1]))
        .then_some((start, ranks.len()))
}

/// A slice serialised as a JSON list of what `item` makes of each element.
struct ListOf<'a, T, F>(&'a [T], F);

/// [`ListOf`] `items`, mapped by `item` (a function, so a closure's argument type is known).
fn list_of<'a, T, V: Serialize, F: Fn(&'a T) -> V>(items: &'a [T], item: F) -> ListOf<'a, T, F> {
    ListOf(items, item)
}

impl<'a, T, V: Serialize, F: Fn(&'a T) -> V> Serialize for ListOf<'a, T, F> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(&self.1))
    }
}

/// A whole Tessera strategy file: `{"format", "version", "tensors", "ops"}`, serialised from
/// the strategy itself (no tree of the file is built).
struct FileView<'a> {
    strategy: &'a ResolvedStrategy,
    ops: &'a [OpStrategyRecord],
}

impl Serialize for FileView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(4))?;
        map.serialize_entry("format", FORMAT_NAME)?;
        map.serialize_entry("version", &VERSION)?;
        map.serialize_entry("tensors", &list_of(self.strategy.params(), TensorView))?;
        map.serialize_entry("ops", &list_of(self.ops, OpView))?;
        map.end()
    }
}

/// One `"tensors"` entry: `{"name", "shape", "dtype", "placements"}`.
struct TensorView<'a>(&'a ResolvedParam);

impl Serialize for TensorView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let p = self.0;
        let mut map = s.serialize_map(Some(4))?;
        map.serialize_entry("name", &p.name)?;
        map.serialize_entry("shape", &p.shape)?;
        map.serialize_entry("dtype", &p.dtype.map(|d| d.name()))?;
        map.serialize_entry("placements", &list_of(&p.placements, PlacementView))?;
        map.end()
    }
}

/// One placement: `{"stage", "mesh", "dims", "optimizer_shard", "rows"}`.
struct PlacementView<'a>(&'a ParamLayout);

impl Serialize for PlacementView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let pl = self.0;
        let mesh = pl.mp.layout().mesh();
        let mut map = s.serialize_map(Some(5))?;
        map.serialize_entry("stage", &pl.stage)?;
        map.serialize_entry("mesh", &MeshView(mesh))?;
        let dims = list_of(pl.mp.dims(), |axes| {
            list_of(axes, move |&a| mesh.axis_name(a))
        });
        map.serialize_entry("dims", &dims)?;
        map.serialize_entry("optimizer_shard", &pl.opt_shard)?;
        map.serialize_entry("rows", &pl.mp.row_split())?;
        map.end()
    }
}

/// A mesh: `{"axes": [[name, size], …]}` and its ranks, as `"rank_range": [start, count]` when
/// they are consecutive ([`rank_range`]), otherwise as `"rank_list"` with every rank. A rank
/// list of 8 192 ranks per tensor made a thousand-tensor file megabytes (and, before the reader
/// streamed, over the value limit of the JSON tree it built).
struct MeshView<'a>(&'a Mesh);

impl Serialize for MeshView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        let axes = list_of(self.0.axes(), |a| (a.name.as_str(), a.size));
        map.serialize_entry("axes", &axes)?;
        let ranks = self.0.rank_list();
        match rank_range(ranks) {
            Some((start, count)) => map.serialize_entry("rank_range", &[start, count])?,
            None => map.serialize_entry("rank_list", ranks)?,
        }
        map.end()
    }
}

/// One `"ops"` entry: `{"name", "stage", "in_strategy", "out_strategy"}`.
struct OpView<'a>(&'a OpStrategyRecord);

impl Serialize for OpView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let op = self.0;
        let mut map = s.serialize_map(Some(4))?;
        map.serialize_entry("name", &op.name)?;
        map.serialize_entry("stage", &op.stage)?;
        map.serialize_entry("in_strategy", &op.inputs)?;
        map.serialize_entry("out_strategy", &op.outputs)?;
        map.end()
    }
}

/// Writes a resolved strategy and its operators' strategies as Tessera JSON (pretty, two-space
/// indents, a final newline) to `out`, streaming: each tensor is printed straight from the
/// strategy, never through a tree of the whole file.
fn write_json(
    out: impl std::io::Write,
    strategy: &ResolvedStrategy,
    ops: &[OpStrategyRecord],
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, out);
    let mut ser =
        serde_json::Serializer::with_formatter(&mut out, PrettyFormatter::with_indent(b"  "));
    FileView { strategy, ops }
        .serialize(&mut ser)
        .map_err(std::io::Error::from)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Writes a resolved strategy and its operators' strategies as Tessera JSON, atomically: the
/// file is printed straight into a temporary file beside `path` (no copy of it in memory),
/// which is renamed into place once whole. Refuses an existing `path` unless `force`.
pub fn write(
    path: &Path,
    strategy: &ResolvedStrategy,
    ops: &[OpStrategyRecord],
    force: bool,
) -> Result<PathBuf> {
    write_with(path, strategy, ops, force, Durability::Fsync)
}

/// [`write`] flushed to disk as `durability` says (a file of a set is written with the set's).
pub(crate) fn write_with(
    path: &Path,
    strategy: &ResolvedStrategy,
    ops: &[OpStrategyRecord],
    force: bool,
    durability: Durability,
) -> Result<PathBuf> {
    let file = AtomicFile::create(path, force, durability)?;
    write_json(file.as_file(), strategy, ops).map_err(io_err(path, "write"))?;
    file.commit()
}
