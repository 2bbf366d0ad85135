//! MindSpore's operator strategy file: what `AutoParallel.save_operator_strategy_file` writes
//! and `load_operator_strategy_file` reads (`StrategyJsonInfo` in MindSpore's
//! `strategy_checkpoint_info.cc`).
//!
//! ```json
//! {
//!   "current_stage": 0,
//!   "parallel_strategy_item": {
//!     "blocks.0.mlp.fc1.matmul": {"stage": 0, "parallel_strategy": [[4, 1, 1], [2, 1]]}
//!   },
//!   "parallel_out_strategy_item": {
//!     "head.matmul": {"stage": 0, "parallel_strategy": [[8, 1]]}
//!   }
//! }
//! ```
//! Keys are op names; `parallel_strategy` is the op's `in_strategy` (one split tuple per input),
//! and the optional `parallel_out_strategy_item` holds out_strategies. MindSpore's layout-form
//! entries (`parallel_layout_value_item` and its variants) are refused with a message: Tessera
//! records strategies as tuples.

use std::path::Path;

use crate::atomic_write::write_file;
use crate::error::{CkptError, Result};
use crate::json::Json;
use crate::strategy::OpStrategyRecord;

/// The largest operator strategy file read (bounded before it is read whole).
pub const MAX_OP_STRATEGY_FILE_BYTES: u64 = 256 << 20;

/// The largest split factor or tuple count accepted.
const MAX_ENTRY: u64 = 1 << 24;

/// Reads an operator strategy file: one record per op, in file order.
pub fn read_operator_strategy_file(path: &Path) -> Result<Vec<OpStrategyRecord>> {
    let io = |op: &'static str| {
        move |source: std::io::Error| CkptError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    };
    let size = std::fs::metadata(path).map_err(io("stat"))?.len();
    let bad = |reason: String| CkptError::InvalidStrategy {
        path: path.to_path_buf(),
        reason,
    };
    if size > MAX_OP_STRATEGY_FILE_BYTES {
        return Err(bad(format!(
            "{size} bytes is over the {MAX_OP_STRATEGY_FILE_BYTES}-byte limit of an operator strategy file"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(io("read"))?;
    let json = Json::parse(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    parse(&json).map_err(bad)
}

/// The records of an operator strategy file's JSON, or the rule broken.
fn parse(json: &Json) -> std::result::Result<Vec<OpStrategyRecord>, String> {
    let root = json
        .as_obj()
        .ok_or("the file must be a JSON object with \"parallel_strategy_item\"")?;
    for (key, _) in root {
        if key.contains("layout_value_item") {
            return Err(format!(
                "\"{key}\": layout-form strategies are not supported; save the strategies as tuples"
            ));
        }
        if !matches!(
            key.as_str(),
            "current_stage" | "parallel_strategy_item" | "parallel_out_strategy_item"
        ) {
            return Err(format!(
                "unknown key \"{key}\" (expected current_stage, parallel_strategy_item, parallel_out_strategy_item)"
            ));
        }
    }
    let items = json
        .get("parallel_strategy_item")
        .ok_or("missing \"parallel_strategy_item\"")?
        .as_obj()
        .ok_or("\"parallel_strategy_item\" must be an object of op name → strategy")?;
    let outs = match json.get("parallel_out_strategy_item") {
        None => &[][..],
        Some(v) => v
            .as_obj()
            .ok_or("\"parallel_out_strategy_item\" must be an object of op name → strategy")?,
    };
    let mut records = Vec::with_capacity(items.len());
    for (name, item) in items {
        let (stage, inputs) = entry(name, item)?;
        let outputs = match outs.iter().find(|(n, _)| n == name) {
            Some((_, out)) => Some(entry(name, out)?.1),
            None => None,
        };
        records.push(OpStrategyRecord {
            name: name.clone(),
            stage,
            inputs,
            outputs,
        });
    }
    if let Some((name, _)) = outs
        .iter()
        .find(|(n, _)| !items.iter().any(|(m, _)| m == n))
    {
        return Err(format!(
            "op {name:?} has an out_strategy but no in_strategy in \"parallel_strategy_item\""
        ));
    }
    Ok(records)
}

/// One `{"stage": s, "parallel_strategy": [[…], …]}` entry.
fn entry(name: &str, item: &Json) -> std::result::Result<(usize, Vec<Vec<usize>>), String> {
    let stage = match item.get("stage") {
        None => 0,
        Some(v) => v.as_u64().filter(|&s| s < MAX_ENTRY).ok_or(format!(
            "op {name:?}: \"stage\" must be a small non-negative integer"
        ))? as usize,
    };
    let tuples = item
        .get("parallel_strategy")
        .and_then(Json::as_arr)
        .ok_or(format!(
            "op {name:?}: \"parallel_strategy\" must be a list of split tuples"
        ))?;
    let mut out = Vec::with_capacity(tuples.len());
    for (i, t) in tuples.iter().enumerate() {
        let dims = t.as_arr().ok_or(format!(
            "op {name:?}: input {i} must be a list of split factors"
        ))?;
        let mut tuple = Vec::with_capacity(dims.len());
        for d in dims {
            let f = d
                .as_u64()
                .filter(|&f| (1..MAX_ENTRY).contains(&f))
                .ok_or(format!(
                    "op {name:?}: input {i}: split factor {d:?} must be an integer between 1 and {MAX_ENTRY}"
                ))?;
            tuple.push(f as usize);
        }
        out.push(tuple);
    }
    Ok((stage, out))
}

/// The JSON of `records` in MindSpore's format.
fn to_json(records: &[OpStrategyRecord]) -> Json {
    let item = |stage: usize, tuples: &[Vec<usize>]| {
        Json::obj([
            ("stage", Json::UInt(stage as u64)),
            (
                "parallel_strategy",
                Json::Arr(
                    tuples
                        .iter()
                        .map(|t| Json::Arr(t.iter().map(|&f| Json::UInt(f as u64)).collect()))
                        .collect(),
                ),
            ),
        ])
    };
    let ins = records
        .iter()
        .map(|r| (r.name.clone(), item(r.stage, &r.inputs)));
    let outs: Vec<(String, Json)> = records
        .iter()
        .filter_map(|r| {
            r.outputs
                .as_ref()
                .map(|o| (r.name.clone(), item(r.stage, o)))
        })
        .collect();
    let mut root = vec![
        ("current_stage".to_string(), Json::UInt(0)),
        (
            "parallel_strategy_item".to_string(),
            Json::Obj(ins.collect()),
        ),
    ];
    if !outs.is_empty() {
        root.push(("parallel_out_strategy_item".to_string(), Json::Obj(outs)));
    }
    Json::Obj(root)
}

/// Writes `records` as an operator strategy file, atomically (replacing an older file).
pub fn write_operator_strategy_file(path: &Path, records: &[OpStrategyRecord]) -> Result<()> {
    let mut text = to_json(records).to_pretty(2);
    text.push('\n');
    write_file(path, text.as_bytes(), true)?;
    Ok(())
}
