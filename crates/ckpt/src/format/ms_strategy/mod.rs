//! MindSpore strategy files: `ParallelStrategyMap` in protobuf (this module) and in MindSpore's
//! JSON flavour ([`json`]), and their conversion to and from the model ([`model`]).
//!
//! The records here are the file model only: exactly what MindSpore writes, decoded and encoded
//! byte for byte. [`model`] turns them into [`crate::Strategy`] placements and back, so the
//! model never carries a MindSpore record: MindSpore-specific data is converted at this edge.

pub(crate) mod json;
pub(crate) mod model;

use std::path::Path;

use super::codec::wire::{
    as_int32, as_uint32, decode_dims, expect_bytes, expect_string, expect_varint, peek_field,
    Reader, WireError, Writer,
};
use crate::error::{io_err, CkptError, Result};
use crate::io::atomic_write::write_file;
use crate::model::{Strategy, StrategyFlavour};

pub use model::{to_ms_strategy, LayoutList};

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
        write_file(path, &bytes, force)
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

    /// The MindSpore records of a strategy read from a MindSpore strategy file, read again
    /// from `strategy.path` in the flavour it was detected in, as stored (names, tensor maps and
    /// optimizer fields as MindSpore wrote them): what MindSpore's `build_searched_strategy`
    /// shows. `None` for a strategy of another flavour.
    pub fn of_strategy(strategy: &Strategy) -> Result<Option<MsStrategyFile>> {
        let path = strategy.path.as_path();
        let read = || {
            layout::limits::read_bounded(path, layout::limits::MAX_STRATEGY_FILE_BYTES)
                .map_err(io_err(path, "read"))
        };
        match strategy.flavour {
            StrategyFlavour::MsProtobuf => MsStrategyFile::decode(path, &read()?).map(Some),
            StrategyFlavour::MsJson => MsStrategyFile::from_json_bytes(path, &read()?).map(Some),
            StrategyFlavour::Tessera | StrategyFlavour::MsLayoutDict => Ok(None),
        }
    }
}

/// Whether `head`, the first bytes of a file, starts like a protobuf strategy file: with
/// `current_stage` (field 1, a varint), which MindSpore always writes first, or with a
/// `parallel_layout_item` (field 3). The evidence, or why not (for the detection step).
pub(crate) fn sniff(head: &[u8]) -> std::result::Result<String, String> {
    match peek_field(head).map(|f| (f.field, f.wire_type)) {
        Some((1, 0)) => Ok("protobuf starting with current_stage (field 1, varint) of a ParallelStrategyMap".to_string()),
        Some((3, 2)) => Ok("protobuf starting with a parallel_layout_item (field 3) of a ParallelStrategyMap".to_string()),
        _ => Err("not a MindSpore strategy file: a ParallelStrategyMap starts with current_stage (field 1, varint)".to_string()),
    }
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
