//! Tessera's strategy JSON: a versioned, self-describing record of every tensor's global shape,
//! dtype and placement (the format is specified in the crate documentation).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use layout::{Layout, Mesh, MeshAxis};
use tensor::DType;

use super::codec::json::Json;
use crate::error::{CkptError, Result};
use crate::io::atomic_write::write_file;
use crate::model::tensor::MAX_DIMS;
use crate::model::{
    check_tuple_count, check_unique_ops, OpStrategyRecord, ResolvedStrategy, StagePlacement,
    Strategy, StrategyFlavour, StrategyParam,
};

/// The value of the `"format"` key.
pub const FORMAT_NAME: &str = "tessera-strategy";
/// The version this crate writes. It reads this one and version 1, which knows no
/// `"rank_range"` (version 2's compact form of consecutive ranks): a version-1 reader would take
/// a mesh without `"rank_list"` to hold ranks `0..n`, so files that may use it say version 2.
pub const VERSION: u64 = 2;

/// Reads a Tessera strategy file's bytes.
pub(crate) fn read(path: &Path, bytes: &[u8]) -> Result<Strategy> {
    let json = Json::parse_bytes(bytes).map_err(|reason| CkptError::InvalidStrategy {
        path: path.to_path_buf(),
        reason,
    })?;
    from_json(path, &json)
}

/// Reads a parsed Tessera strategy.
pub(crate) fn from_json(path: &Path, json: &Json) -> Result<Strategy> {
    let bad = |reason: String| CkptError::InvalidStrategy {
        path: path.to_path_buf(),
        reason,
    };
    let version = match json.get("version").and_then(Json::as_u64) {
        Some(v @ (1 | VERSION)) => v,
        Some(v) => {
            return Err(bad(format!(
                "version {v} is not supported (this build reads versions 1 to {VERSION})"
            )))
        }
        None => return Err(bad("no \"version\"".to_string())),
    };
    let tensors = json
        .get("tensors")
        .and_then(Json::as_arr)
        .ok_or_else(|| bad("no \"tensors\" list".to_string()))?;
    let mut params = Vec::with_capacity(tensors.len());
    // The names seen, to refuse a second one without a quadratic scan of `params`.
    let mut names: HashSet<String> = HashSet::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        let name = t
            .get("name")
            .and_then(Json::as_str)
            .ok_or_else(|| bad(format!("tensor #{i} has no \"name\"")))?
            .to_string();
        let rule = |rule: String| CkptError::StrategyParam {
            path: path.to_path_buf(),
            tensor: name.clone(),
            rule,
        };
        if !names.insert(name.clone()) {
            return Err(rule("the name appears twice".to_string()));
        }
        let shape = t
            .get("shape")
            .and_then(Json::as_arr)
            .filter(|a| a.len() <= MAX_DIMS)
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().map(|d| d as usize))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| {
                rule(format!(
                    "\"shape\" must be a list of at most {MAX_DIMS} sizes"
                ))
            })?;
        let dtype = match t.get("dtype") {
            None | Some(Json::Null) => None,
            Some(d) => Some(
                d.as_str()
                    .and_then(|s| s.parse::<DType>().ok())
                    .ok_or_else(|| rule(format!("unknown \"dtype\" {}", d.brief())))?,
            ),
        };
        let list = t
            .get("placements")
            .and_then(Json::as_arr)
            .filter(|a| !a.is_empty())
            .ok_or_else(|| rule("\"placements\" must be a non-empty list".to_string()))?;
        let mut placements = Vec::with_capacity(list.len());
        // A stage placed twice is refused at its second copy, before that copy's mesh is
        // built: a list of 100 000 copies of one placement was read whole and accepted.
        let mut stages: HashSet<usize> = HashSet::new();
        for pl in list {
            let stage = match pl.get("stage") {
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
        placements.sort_by_key(|p| p.stage);
        params.push(StrategyParam {
            name,
            shape: Some(shape),
            dtype,
            placements,
        });
    }
    let ops = match json.get("ops") {
        None | Some(Json::Null) => Vec::new(),
        Some(list) => list
            .as_arr()
            .ok_or_else(|| bad("\"ops\" must be a list".to_string()))?
            .iter()
            .enumerate()
            .map(|(i, op)| op_record(op).map_err(|reason| bad(format!("ops #{i}: {reason}"))))
            .collect::<std::result::Result<Vec<_>, _>>()?,
    };
    check_unique_ops(ops.iter().map(|op| (op.name.as_str(), op.stage)))
        .map_err(|reason| bad(format!("\"ops\": {reason}")))?;
    Ok(Strategy::new(
        path.to_path_buf(),
        StrategyFlavour::Tessera,
        params,
        ops,
    ))
}

/// One `"ops"` entry: `{"name", "stage", "in_strategy", "out_strategy"}`.
fn op_record(op: &Json) -> std::result::Result<OpStrategyRecord, String> {
    let name = op
        .get("name")
        .and_then(Json::as_str)
        .ok_or("no \"name\"")?
        .to_string();
    let tuples = |key: &str| -> std::result::Result<Option<Vec<Vec<usize>>>, String> {
        match op.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => v
                .as_arr()
                .map(|list| check_tuple_count(&name, key, list.len()).map(|()| list))
                .transpose()?
                .and_then(|list| {
                    list.iter()
                        .map(|t| {
                            t.as_arr()?
                                .iter()
                                .map(|f| f.as_u64().filter(|&f| f >= 1).map(|f| f as usize))
                                .collect::<Option<Vec<_>>>()
                        })
                        .collect::<Option<Vec<_>>>()
                })
                .map(Some)
                .ok_or_else(|| {
                    format!(
                        "op {name:?}: {key:?} must be a list of split tuples of positive integers"
                    )
                }),
        }
    };
    let inputs =
        tuples("in_strategy")?.ok_or_else(|| format!("op {name:?} has no \"in_strategy\""))?;
    let outputs = tuples("out_strategy")?;
    let stage = match op.get("stage") {
        None => 0,
        Some(s) => s
            .as_u64()
            .ok_or_else(|| format!("op {name:?}: \"stage\" must be a non-negative integer"))?
            as usize,
    };
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

fn op_json(op: &OpStrategyRecord) -> Json {
    let tuples = |ts: &[Vec<usize>]| {
        Json::Arr(
            ts.iter()
                .map(|t| Json::uints(t.iter().map(|&f| f as u64)))
                .collect(),
        )
    };
    Json::obj([
        ("name", Json::Str(op.name.clone())),
        ("stage", Json::UInt(op.stage as u64)),
        ("in_strategy", tuples(&op.inputs)),
        (
            "out_strategy",
            op.outputs.as_deref().map_or(Json::Null, tuples),
        ),
    ])
}

/// One placement of tensor `name` in pipeline `stage` (read by the caller) from a file of
/// `version`.
fn placement(
    path: &Path,
    name: &str,
    stage: usize,
    version: u64,
    pl: &Json,
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
        .get("mesh")
        .ok_or_else(|| rule("a placement has no \"mesh\"".to_string()))?;
    let mut axes = Vec::new();
    for a in mesh
        .get("axes")
        .and_then(Json::as_arr)
        .ok_or_else(|| rule("\"mesh\".\"axes\" must be a list of [name, size]".to_string()))?
    {
        match a.as_arr() {
            Some([n, s]) if n.as_str().is_some() && s.as_u64().is_some() => axes.push(MeshAxis {
                name: n.as_str().expect("checked").to_string(),
                size: s.as_u64().expect("checked") as usize,
            }),
            _ => return Err(rule(format!("mesh axis {} is not [name, size]", a.brief()))),
        }
    }
    let rank_list = rank_list(mesh, version, &axes).map_err(|e| match e {
        RanksError::Rule(r) => rule(r),
        RanksError::Layout(e) => layout_err(e),
    })?;
    let mesh = Mesh::from_axes(axes, rank_list).map_err(layout_err)?;
    let mut dims = Vec::new();
    for d in pl.get("dims").and_then(Json::as_arr).ok_or_else(|| {
        rule("\"dims\" must be a list (one list of axis names per tensor dim)".to_string())
    })? {
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
    let opt_shard = match pl.get("optimizer_shard") {
        None | Some(Json::Null) => 1,
        Some(k) => k.as_u64().filter(|&k| k >= 1).ok_or_else(|| {
            rule("\"optimizer_shard\" must be a group size of at least 1".to_string())
        })? as usize,
    };
    let rows = match pl.get("rows") {
        None | Some(Json::Null) => None,
        Some(r) => Some(
            r.as_arr()
                .and_then(|a| {
                    a.iter()
                        .map(|x| x.as_u64().filter(|&x| x >= 1).map(|x| x as usize))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| {
                    rule(
                        "\"rows\" must be a list of positive row counts, one per block of dim 0"
                            .to_string(),
                    )
                })?,
        ),
    };
    if let Some(rows) = &rows {
        let blocks = layout.split_factors().first().copied().unwrap_or(1);
        if rows.len() != blocks {
            return Err(rule(format!(
                "\"rows\" has {} entries, but dim 0 is split into {blocks} blocks",
                rows.len()
            )));
        }
    }
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
/// before a rank is allocated.
fn rank_list(
    mesh: &Json,
    version: u64,
    axes: &[MeshAxis],
) -> std::result::Result<Option<Vec<usize>>, RanksError> {
    let present = |key: &str| mesh.get(key).filter(|v| !matches!(v, Json::Null));
    match (present("rank_list"), present("rank_range")) {
        (Some(_), Some(_)) => Err(RanksError::Rule(
            "the mesh gives both \"rank_list\" and \"rank_range\"; give exactly one".to_string(),
        )),
        (None, None) if version == 1 => Ok(None),
        (None, None) => Err(RanksError::Rule(
            "the mesh gives neither \"rank_list\" nor \"rank_range\"; give exactly one".to_string(),
        )),
        (Some(r), None) => r
            .as_arr()
            .and_then(|a| {
                a.iter()
                    .map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok()))
                    .collect::<Option<Vec<_>>>()
            })
            .map(Some)
            .ok_or_else(|| RanksError::Rule("\"rank_list\" must be a list of ranks".to_string())),
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

/// A mesh's ranks as JSON: `"rank_range": [start, count]` when they are consecutive
/// ([`rank_range`]), otherwise `"rank_list"` with every rank. A rank list of 8 192 ranks per
/// tensor put a thousand-tensor strategy over the JSON reader's value limit.
fn ranks_json(ranks: &[usize]) -> (&'static str, Json) {
    match rank_range(ranks) {
        Some((start, count)) => ("rank_range", Json::uints([start as u64, count as u64])),
        None => ("rank_list", Json::uints(ranks.iter().map(|&r| r as u64))),
    }
}

/// A resolved strategy and its operators' strategies as Tessera JSON.
pub fn to_json(strategy: &ResolvedStrategy, ops: &[OpStrategyRecord]) -> Json {
    let tensors = strategy
        .params()
        .iter()
        .map(|p| {
            let placements = p
                .placements
                .iter()
                .map(|pl| {
                    let layout = pl.mp.layout();
                    let mesh = layout.mesh();
                    let axes = mesh
                        .axes()
                        .iter()
                        .map(|a| {
                            Json::Arr(vec![Json::Str(a.name.clone()), Json::UInt(a.size as u64)])
                        })
                        .collect();
                    let dims = pl
                        .mp
                        .dims()
                        .iter()
                        .map(|axes| {
                            Json::Arr(
                                axes.iter()
                                    .map(|&a| Json::Str(mesh.axis_name(a).to_string()))
                                    .collect(),
                            )
                        })
                        .collect();
                    Json::obj([
                        ("stage", Json::UInt(pl.stage as u64)),
                        (
                            "mesh",
                            Json::obj([("axes", Json::Arr(axes)), ranks_json(mesh.rank_list())]),
                        ),
                        ("dims", Json::Arr(dims)),
                        ("optimizer_shard", Json::UInt(pl.opt_shard as u64)),
                        (
                            "rows",
                            pl.mp.row_split().map_or(Json::Null, |rows| {
                                Json::uints(rows.iter().map(|&r| r as u64))
                            }),
                        ),
                    ])
                })
                .collect();
            Json::obj([
                ("name", Json::Str(p.name.clone())),
                ("shape", Json::uints(p.shape.iter().map(|&d| d as u64))),
                (
                    "dtype",
                    p.dtype
                        .map_or(Json::Null, |d| Json::Str(d.name().to_string())),
                ),
                ("placements", Json::Arr(placements)),
            ])
        })
        .collect();
    Json::obj([
        ("format", Json::Str(FORMAT_NAME.to_string())),
        ("version", Json::UInt(VERSION)),
        ("tensors", Json::Arr(tensors)),
        ("ops", Json::Arr(ops.iter().map(op_json).collect())),
    ])
}

/// Writes a resolved strategy and its operators' strategies as Tessera JSON, atomically.
pub fn write(
    path: &Path,
    strategy: &ResolvedStrategy,
    ops: &[OpStrategyRecord],
    force: bool,
) -> Result<PathBuf> {
    let mut text = to_json(strategy, ops).to_pretty(2);
    text.push('\n');
    write_file(path, text.as_bytes(), force)
}
