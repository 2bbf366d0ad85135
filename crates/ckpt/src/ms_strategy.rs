//! MindSpore strategy files: `ParallelStrategyMap` in protobuf and in MindSpore's JSON flavour.
//!
//! This module is the file model only: records exactly as MindSpore writes them, decoded and
//! encoded byte-for-byte. Turning a record into a Tessera layout is [`crate::strategy`]'s job.

use std::path::Path;

use crate::error::{CkptError, Result};
use crate::json::Json;
use crate::wire::{
    as_int32, as_uint32, expect_bytes, expect_string, expect_varint, push_varints, Reader,
    WireError, Writer,
};

/// One `ParallelLayouts` record: how one parameter is laid out, as MindSpore stores it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MsLayout {
    /// `dev_matrix` entries (MindSpore writes exactly one).
    pub dev_matrix: Vec<Vec<u32>>,
    /// `tensor_map` entries: one flat map, or one entry per tensor dim (the multi-axis form).
    pub tensor_map: Vec<Vec<i32>>,
    /// `param_split_shape` entries (one, usually empty).
    pub param_split_shape: Vec<Vec<i64>>,
    /// `indices_offset` entries (one, usually empty).
    pub indices_offset: Vec<Vec<i64>>,
    /// `field` (EmbeddingLookup field size; unused by conversions).
    pub field: i32,
    /// Rank stride inside the optimizer-shard group (0 = no optimizer sharding).
    pub opt_weight_shard_step: i32,
    /// Optimizer-shard group size (0 = none, -1 = the whole replica group).
    pub opt_weight_shard_size: i32,
    /// The global shape, present only in the JSON flavour (`tensor_shape`).
    pub tensor_shape: Option<Vec<u64>>,
}

impl MsLayout {
    /// The device matrix (the first `dev_matrix` entry).
    pub fn device_matrix(&self) -> Option<&[u32]> {
        self.dev_matrix.first().map(Vec::as_slice)
    }

    /// The tensor map per tensor dim, read as MindSpore's `_convert_to_list` reads it: with more
    /// than one entry it is the multi-axis form and empty entries are dropped; with one entry it
    /// is a flat map, one value per dim.
    pub fn dim_axes(&self) -> Vec<Vec<i64>> {
        if self.tensor_map.len() > 1 {
            self.tensor_map
                .iter()
                .filter(|m| !m.is_empty())
                .map(|m| m.iter().map(|&v| i64::from(v)).collect())
                .collect()
        } else {
            self.tensor_map
                .first()
                .map(|m| m.iter().map(|&v| vec![i64::from(v)]).collect())
                .unwrap_or_default()
        }
    }
}

/// One `ParallelLayoutItem`: a parameter name and its layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsLayoutItem {
    /// The parameter name (`"<stage>-<name>"` in merged pipeline files).
    pub param_name: String,
    /// Its layout.
    pub layout: MsLayout,
}

/// One `ParallelStrategyItem`: an operator's input strategies and its pipeline stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsStrategyItem {
    /// The operator's unique name.
    pub node_name: String,
    /// Its pipeline stage.
    pub stage: u32,
    /// One split tuple per operator input.
    pub strategies: Vec<Vec<u32>>,
}

/// A whole `ParallelStrategyMap`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MsStrategyFile {
    /// `current_stage` (a save counter, not a pipeline stage; merged files set 1).
    pub current_stage: u32,
    /// Operator strategies.
    pub strategy_items: Vec<MsStrategyItem>,
    /// Parameter layouts.
    pub layout_items: Vec<MsLayoutItem>,
}

fn wire(path: &Path) -> impl Fn(WireError) -> CkptError + '_ {
    move |e| CkptError::Protobuf {
        path: path.to_path_buf(),
        offset: e.offset as u64,
        reason: e.reason,
    }
}

impl MsStrategyFile {
    /// Decodes protobuf bytes (packed or unpacked repeated fields).
    pub fn decode(path: &Path, bytes: &[u8]) -> Result<MsStrategyFile> {
        decode_map(bytes).map_err(wire(path))
    }

    /// Writes the file atomically: MindSpore's JSON flavour when `path` ends in `.json` (as
    /// MindSpore chooses), protobuf otherwise. An existing file is refused unless `force`.
    pub fn write(&self, path: &Path, force: bool) -> Result<std::path::PathBuf> {
        let is_json = path.extension().is_some_and(|e| e == "json");
        let bytes = if is_json {
            let mut text = self.to_json_text();
            text.push('\n');
            text.into_bytes()
        } else {
            self.encode()
        };
        crate::atomic_write::write_file(path, &bytes, force)
    }

    /// Encodes protobuf bytes the way MindSpore's writer does.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.uint(1, u64::from(self.current_stage));
        for item in &self.strategy_items {
            w.message(2, |w| {
                w.bytes(1, item.node_name.as_bytes());
                w.message(2, |w| {
                    w.uint(1, u64::from(item.stage));
                    for s in &item.strategies {
                        w.message(2, |w| {
                            for &d in s {
                                w.uint(1, u64::from(d));
                            }
                        });
                    }
                });
            });
        }
        for item in &self.layout_items {
            w.message(3, |w| {
                w.bytes(1, item.param_name.as_bytes());
                w.message(2, |w| encode_layout(w, &item.layout));
            });
        }
        w.buf
    }

    /// Reads the JSON flavour (key order kept).
    pub(crate) fn from_json(path: &Path, value: &Json) -> Result<MsStrategyFile> {
        let bad = |reason: String| CkptError::InvalidStrategy {
            path: path.to_path_buf(),
            reason,
        };
        let current_stage = match value.get("current_stage") {
            None => 0,
            Some(v) => v
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| bad("current_stage is not a uint32".to_string()))?,
        };
        let mut strategy_items = Vec::new();
        if let Some(items) = value.get("parallel_strategy_item") {
            let items = items
                .as_obj()
                .ok_or_else(|| bad("parallel_strategy_item is not an object".to_string()))?;
            for (node, item) in items {
                let stage = item
                    .get("stage")
                    .and_then(Json::as_u64)
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(|| bad(format!("strategy item {node:?} has no uint32 stage")))?;
                let mut strategies = Vec::new();
                for s in item
                    .get("parallel_strategy")
                    .and_then(Json::as_arr)
                    .unwrap_or_default()
                {
                    strategies.push(uint_list(s).ok_or_else(|| {
                        bad(format!(
                            "strategy item {node:?}: parallel_strategy must hold lists of uint32"
                        ))
                    })?);
                }
                strategy_items.push(MsStrategyItem {
                    node_name: node.clone(),
                    stage,
                    strategies,
                });
            }
        }
        let items = value
            .get("parallel_layout_item")
            .and_then(Json::as_obj)
            .ok_or_else(|| bad("no parallel_layout_item object".to_string()))?;
        let mut layout_items = Vec::with_capacity(items.len());
        for (name, item) in items {
            let param = |rule: String| CkptError::StrategyParam {
                path: path.to_path_buf(),
                tensor: name.clone(),
                rule,
            };
            let dev = item
                .get("dev_matrix")
                .and_then(uint_list)
                .ok_or_else(|| param("dev_matrix must be a list of uint32".to_string()))?;
            let map_json = item
                .get("tensor_map")
                .and_then(Json::as_arr)
                .ok_or_else(|| param("tensor_map must be a list".to_string()))?;
            // Flat maps are lists of ints; tolerate nested lists (one per dim).
            let tensor_map = if map_json.iter().all(|v| v.as_i64().is_some()) {
                vec![int_list(item.get("tensor_map").expect("checked"))
                    .ok_or_else(|| param("tensor_map values must be int32".to_string()))?]
            } else {
                let mut per_dim = map_json
                    .iter()
                    .map(int_list)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        param("tensor_map must hold ints or lists of ints".to_string())
                    })?;
                if per_dim.len() == 1 {
                    per_dim.push(Vec::new());
                }
                per_dim
            };
            let int_field = |key: &str| -> Result<i32> {
                match item.get(key) {
                    None => Ok(0),
                    Some(v) => v
                        .as_i64()
                        .and_then(|v| i32::try_from(v).ok())
                        .ok_or_else(|| param(format!("{key} is not an int32"))),
                }
            };
            let nested64 = |key: &str| -> Result<Vec<Vec<i64>>> {
                match item.get(key) {
                    None => Ok(vec![Vec::new()]),
                    Some(v) => {
                        let list = v
                            .as_arr()
                            .ok_or_else(|| param(format!("{key} is not a list")))?;
                        if list.iter().all(|x| x.as_i64().is_some()) {
                            Ok(vec![list.iter().filter_map(Json::as_i64).collect()])
                        } else {
                            list.iter()
                                .map(|x| {
                                    x.as_arr()
                                        .map(|a| a.iter().filter_map(Json::as_i64).collect())
                                })
                                .collect::<Option<Vec<Vec<i64>>>>()
                                .ok_or_else(|| param(format!("{key} is not a list of ints")))
                        }
                    }
                }
            };
            let tensor_shape = match item.get("tensor_shape") {
                None => None,
                Some(v) => Some(
                    v.as_arr()
                        .and_then(|a| a.iter().map(Json::as_u64).collect::<Option<Vec<u64>>>())
                        .ok_or_else(|| param("tensor_shape must be a list of sizes".to_string()))?,
                ),
            };
            layout_items.push(MsLayoutItem {
                param_name: name.clone(),
                layout: MsLayout {
                    dev_matrix: vec![dev],
                    tensor_map,
                    param_split_shape: nested64("param_split_shape")?,
                    indices_offset: nested64("indices_offset")?,
                    field: int_field("field")?,
                    opt_weight_shard_step: int_field("opt_weight_shard_step")?,
                    opt_weight_shard_size: int_field("opt_weight_shard_size")?,
                    tensor_shape,
                },
            });
        }
        Ok(MsStrategyFile {
            current_stage,
            strategy_items,
            layout_items,
        })
    }

    /// Writes the JSON flavour as MindSpore does (1-space indent, flat tensor maps, global
    /// shapes in `tensor_shape`).
    pub(crate) fn to_json(&self) -> Json {
        let strategies = self
            .strategy_items
            .iter()
            .map(|s| {
                (
                    s.node_name.clone(),
                    Json::obj([
                        ("stage", Json::UInt(u64::from(s.stage))),
                        (
                            "parallel_strategy",
                            Json::Arr(
                                s.strategies
                                    .iter()
                                    .map(|d| Json::uints(d.iter().map(|&x| u64::from(x))))
                                    .collect(),
                            ),
                        ),
                    ]),
                )
            })
            .collect::<Vec<_>>();
        let layouts = self
            .layout_items
            .iter()
            .map(|item| {
                let l = &item.layout;
                let map = if l.tensor_map.len() > 1 {
                    Json::Arr(l.dim_axes().iter().map(|d| Json::ints(d)).collect())
                } else {
                    Json::ints(l.tensor_map.first().map(Vec::as_slice).unwrap_or_default())
                };
                let mut entries = vec![
                    (
                        "dev_matrix".to_string(),
                        Json::uints(
                            l.device_matrix()
                                .unwrap_or_default()
                                .iter()
                                .map(|&d| u64::from(d)),
                        ),
                    ),
                    ("tensor_map".to_string(), map),
                ];
                if let Some(shape) = &l.tensor_shape {
                    entries.push((
                        "tensor_shape".to_string(),
                        Json::uints(shape.iter().copied()),
                    ));
                }
                entries.push(("field".to_string(), Json::Int(i64::from(l.field))));
                entries.push((
                    "opt_weight_shard_step".to_string(),
                    Json::Int(i64::from(l.opt_weight_shard_step)),
                ));
                entries.push((
                    "opt_weight_shard_size".to_string(),
                    Json::Int(i64::from(l.opt_weight_shard_size)),
                ));
                (item.param_name.clone(), Json::Obj(entries))
            })
            .collect::<Vec<_>>();
        Json::obj([
            ("current_stage", Json::UInt(u64::from(self.current_stage))),
            ("parallel_strategy_item", Json::Obj(strategies)),
            ("parallel_layout_item", Json::Obj(layouts)),
        ])
    }

    /// The JSON flavour as text (MindSpore's layout: 1-space indent).
    pub fn to_json_text(&self) -> String {
        self.to_json().to_pretty(1)
    }

    /// `build_searched_strategy`'s result as JSON text: parameter → the dict of its
    /// `ParallelLayouts` fields (1-space indent).
    pub fn searched_strategy_json(&self) -> String {
        self.searched_strategy().to_pretty(1)
    }

    pub(crate) fn searched_strategy(&self) -> Json {
        let dims = |lists: &[Vec<i64>]| {
            Json::Arr(
                lists
                    .iter()
                    .map(|l| Json::obj([("dim", Json::ints(l))]))
                    .collect(),
            )
        };
        Json::Obj(
            self.layout_items
                .iter()
                .map(|item| {
                    let l = &item.layout;
                    let dev: Vec<Vec<i64>> = l
                        .dev_matrix
                        .iter()
                        .map(|d| d.iter().map(|&x| i64::from(x)).collect())
                        .collect();
                    let map: Vec<Vec<i64>> = l
                        .tensor_map
                        .iter()
                        .map(|d| d.iter().map(|&x| i64::from(x)).collect())
                        .collect();
                    (
                        item.param_name.clone(),
                        Json::obj([
                            ("dev_matrix", dims(&dev)),
                            ("tensor_map", dims(&map)),
                            ("param_split_shape", dims(&l.param_split_shape)),
                            ("indices_offset", dims(&l.indices_offset)),
                            ("field", Json::Int(i64::from(l.field))),
                            (
                                "opt_weight_shard_step",
                                Json::Int(i64::from(l.opt_weight_shard_step)),
                            ),
                            (
                                "opt_weight_shard_size",
                                Json::Int(i64::from(l.opt_weight_shard_size)),
                            ),
                        ]),
                    )
                })
                .collect(),
        )
    }
}

fn uint_list(v: &Json) -> Option<Vec<u32>> {
    v.as_arr()?
        .iter()
        .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
        .collect()
}

fn int_list(v: &Json) -> Option<Vec<i32>> {
    v.as_arr()?
        .iter()
        .map(|x| x.as_i64().and_then(|x| i32::try_from(x).ok()))
        .collect()
}

fn encode_layout(w: &mut Writer, l: &MsLayout) {
    for d in &l.dev_matrix {
        w.message(1, |w| d.iter().for_each(|&x| w.uint(1, u64::from(x))));
    }
    for m in &l.tensor_map {
        w.message(2, |w| m.iter().for_each(|&x| w.int(1, i64::from(x))));
    }
    for s in &l.param_split_shape {
        w.message(3, |w| s.iter().for_each(|&x| w.int(1, x)));
    }
    for s in &l.indices_offset {
        w.message(4, |w| s.iter().for_each(|&x| w.int(1, x)));
    }
    w.int(5, i64::from(l.field));
    w.int(6, i64::from(l.opt_weight_shard_step));
    w.int(7, i64::from(l.opt_weight_shard_size));
}

/// Reads every varint of a `{repeated <int> dim = 1}` message.
pub(crate) fn decode_dims(bytes: &[u8], base: usize) -> Result<Vec<u64>, WireError> {
    let mut r = Reader::nested(bytes, base);
    let mut out = Vec::new();
    while let Some(f) = r.next_field() {
        let (field, value, at) = f?;
        if field == 1 {
            push_varints(value, at, &mut out)?;
        }
    }
    Ok(out)
}

fn decode_map(bytes: &[u8]) -> Result<MsStrategyFile, WireError> {
    let mut out = MsStrategyFile::default();
    let mut r = Reader::new(bytes);
    while let Some(f) = r.next_field() {
        let (field, value, at) = f?;
        match field {
            1 => {
                out.current_stage = as_uint32(
                    expect_varint(value, at, "current_stage")?,
                    at,
                    "current_stage",
                )?
            }
            2 => out.strategy_items.push(decode_strategy_item(
                expect_bytes(value, at, "parallel_strategy_item")?,
                at,
            )?),
            3 => out.layout_items.push(decode_layout_item(
                expect_bytes(value, at, "parallel_layout_item")?,
                at,
            )?),
            _ => {}
        }
    }
    Ok(out)
}

fn decode_strategy_item(bytes: &[u8], base: usize) -> Result<MsStrategyItem, WireError> {
    let mut item = MsStrategyItem {
        node_name: String::new(),
        stage: 0,
        strategies: Vec::new(),
    };
    let mut r = Reader::nested(bytes, base);
    while let Some(f) = r.next_field() {
        let (field, value, at) = f?;
        match field {
            1 => item.node_name = expect_string(value, at, "node_name")?,
            2 => {
                let mut s = Reader::nested(expect_bytes(value, at, "parallel_strategys")?, at);
                while let Some(f) = s.next_field() {
                    let (field, value, at) = f?;
                    match field {
                        1 => {
                            item.stage = as_uint32(expect_varint(value, at, "stage")?, at, "stage")?
                        }
                        2 => {
                            let dims =
                                decode_dims(expect_bytes(value, at, "parallel_strategy")?, at)?;
                            item.strategies.push(
                                dims.into_iter()
                                    .map(|d| as_uint32(d, at, "strategy dim"))
                                    .collect::<Result<_, _>>()?,
                            );
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(item)
}

fn decode_layout_item(bytes: &[u8], base: usize) -> Result<MsLayoutItem, WireError> {
    let mut name = String::new();
    let mut layout = MsLayout::default();
    let mut r = Reader::nested(bytes, base);
    while let Some(f) = r.next_field() {
        let (field, value, at) = f?;
        match field {
            1 => name = expect_string(value, at, "param_name")?,
            2 => layout = decode_layouts(expect_bytes(value, at, "parallel_layouts")?, at)?,
            _ => {}
        }
    }
    Ok(MsLayoutItem {
        param_name: name,
        layout,
    })
}

fn decode_layouts(bytes: &[u8], base: usize) -> Result<MsLayout, WireError> {
    let mut l = MsLayout::default();
    let mut r = Reader::nested(bytes, base);
    while let Some(f) = r.next_field() {
        let (field, value, at) = f?;
        match field {
            1 => {
                let dims = decode_dims(expect_bytes(value, at, "dev_matrix")?, at)?;
                l.dev_matrix.push(
                    dims.into_iter()
                        .map(|d| as_uint32(d, at, "dev_matrix"))
                        .collect::<Result<_, _>>()?,
                );
            }
            2 => {
                let dims = decode_dims(expect_bytes(value, at, "tensor_map")?, at)?;
                l.tensor_map.push(
                    dims.into_iter()
                        .map(|d| as_int32(d, at, "tensor_map"))
                        .collect::<Result<_, _>>()?,
                );
            }
            3 => l.param_split_shape.push(
                decode_dims(expect_bytes(value, at, "param_split_shape")?, at)?
                    .into_iter()
                    .map(|v| v as i64)
                    .collect(),
            ),
            4 => l.indices_offset.push(
                decode_dims(expect_bytes(value, at, "indices_offset")?, at)?
                    .into_iter()
                    .map(|v| v as i64)
                    .collect(),
            ),
            5 => l.field = as_int32(expect_varint(value, at, "field")?, at, "field")?,
            6 => {
                l.opt_weight_shard_step = as_int32(
                    expect_varint(value, at, "opt_weight_shard_step")?,
                    at,
                    "opt_weight_shard_step",
                )?
            }
            7 => {
                l.opt_weight_shard_size = as_int32(
                    expect_varint(value, at, "opt_weight_shard_size")?,
                    at,
                    "opt_weight_shard_size",
                )?
            }
            _ => {}
        }
    }
    Ok(l)
}
