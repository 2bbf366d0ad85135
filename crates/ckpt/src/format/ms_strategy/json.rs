//! The JSON flavour of MindSpore's strategy files (key order kept), and MindSpore's
//! `build_searched_strategy` dict.

use std::path::Path;

use super::{MsLayout, MsLayoutItem, MsStrategyFile, MsStrategyItem};
use crate::error::{CkptError, Result};
use crate::format::codec::json::Json;
use crate::model::check_tuple_count;
use crate::model::tensor::MAX_DIMS;

impl MsStrategyFile {
    /// Reads the JSON flavour from a file's bytes.
    pub(crate) fn from_json_bytes(path: &Path, bytes: &[u8]) -> Result<MsStrategyFile> {
        let json = Json::parse_bytes(bytes).map_err(|reason| CkptError::InvalidStrategy {
            path: path.to_path_buf(),
            reason: crate::format::codec::json::explain_duplicate_op(bytes, reason),
        })?;
        MsStrategyFile::from_json(path, &json)
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
                let shown = crate::error::brief_name(node);
                let stage = item
                    .get("stage")
                    .and_then(Json::as_u64)
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(|| bad(format!("strategy item {shown:?} has no uint32 stage")))?;
                // MindSpore writes "parallel_strategy" for every item; a missing or mistyped
                // one was read as "no inputs", which hid the file's fault.
                let tuples = item
                    .get("parallel_strategy")
                    .and_then(Json::as_arr)
                    .ok_or_else(|| {
                        bad(format!(
                            "strategy item {shown:?}: \"parallel_strategy\" must be a list of split tuples"
                        ))
                    })?;
                check_tuple_count(node, "parallel_strategy", tuples.len()).map_err(bad)?;
                let mut strategies = Vec::with_capacity(tuples.len());
                for s in tuples {
                    strategies.push(uint_list(s).ok_or_else(|| {
                        bad(format!(
                            "strategy item {shown:?}: \"parallel_strategy\" must hold lists of uint32"
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
                        .filter(|a| a.len() <= MAX_DIMS)
                        .and_then(|a| a.iter().map(Json::as_u64).collect::<Option<Vec<u64>>>())
                        .ok_or_else(|| {
                            param(format!(
                                "tensor_shape must be a list of at most {MAX_DIMS} sizes"
                            ))
                        })?,
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
