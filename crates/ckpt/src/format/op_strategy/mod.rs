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
//!   },
//!   "parallel_layout_value_item": {
//!     "matmul1": {"0": {"dev_matrix": [2, 2], "tensor_map": [[1], [-1]],
//!                       "interleaved_parallel": false, "alias_name": ["dp", "mp"]},
//!                 "1": {"dev_matrix": [2, 2], "tensor_map": [[-1], [0]],
//!                       "interleaved_parallel": false, "alias_name": ["dp", "mp"]}}
//!   }
//! }
//! ```
//! Keys are op names; `parallel_strategy` is the op's `in_strategy` (one split tuple per input),
//! and the optional `parallel_out_strategy_item` holds out_strategies (an op runs in one pipeline
//! stage: an out_strategy whose `stage` differs from its in_strategy's is refused). Ops sharded
//! with layouts
//! are in `parallel_layout_value_item` / `parallel_out_layout_value_item` (one layout per input
//! or output, read and written by [`layout_value`]). Layout items name no stage (nor does
//! `current_stage`, a save counter): an op's stage is its `parallel_strategy_item` entry's
//! (which must agree with the layouts' split factors), else its out_strategy entry's, else 0 —
//! and an op whose stage the file does not give is refused in a file whose other entries name
//! stages above 0. The writer gives a layout-form op a `parallel_strategy_item` entry too when
//! the file has stages.
//! MindSpore's reshape variants (`parallel_newshape_layout_value_item`, …) are refused.

use std::collections::HashMap;
use std::path::Path;

use layout::Layout;

use self::layout_value::{layouts_json, read_layouts};
use super::codec::json::Json;
use crate::error::{brief_name, CkptError, Result};
use crate::io::atomic_write::write_file;
use crate::model::{check_tuple_count, OpStrategyRecord};

mod layout_value;

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
    let text =
        layout::limits::read_text_bounded(path, MAX_OP_STRATEGY_FILE_BYTES).map_err(io("read"))?;
    let json = Json::parse(&text).map_err(|e| {
        bad(crate::format::codec::json::explain_duplicate_op(
            text.as_bytes(),
            format!("not JSON: {e}"),
        ))
    })?;
    parse(&json).map_err(bad)
}

/// The top-level keys of an operator strategy file.
const ROOT_KEYS: &[&str] = &[
    "current_stage",
    "parallel_strategy_item",
    "parallel_out_strategy_item",
    "parallel_layout_value_item",
    "parallel_out_layout_value_item",
];

/// The object under `key`, empty when absent.
fn section<'a>(json: &'a Json, key: &str) -> std::result::Result<&'a [(String, Json)], String> {
    match json.get(key) {
        None => Ok(&[]),
        Some(v) => v
            .as_obj()
            .ok_or(format!("\"{key}\" must be an object of op name → strategy")),
    }
}

/// The layouts of every op of a layout-form section, in file order.
fn layout_section(
    json: &Json,
    key: &str,
) -> std::result::Result<Vec<(String, Vec<Layout>)>, String> {
    section(json, key)?
        .iter()
        .map(|(name, entry)| {
            read_layouts(entry)
                .map(|l| (name.clone(), l))
                .map_err(|e| format!("\"{key}\": op {:?}: {e}", brief_name(name)))
        })
        .collect()
}

/// Checks that an op's split tuples and its layouts say the same thing.
fn agree(
    name: &str,
    what: &str,
    tuples: &[Vec<usize>],
    layouts: &[Layout],
) -> std::result::Result<(), String> {
    let factors: Vec<Vec<usize>> = layouts.iter().map(Layout::split_factors).collect();
    if factors != tuples {
        let name = brief_name(name);
        return Err(format!(
            "op {name:?}: its {what} tuples {tuples:?} disagree with its layouts' split factors {factors:?}"
        ));
    }
    Ok(())
}

/// The records of an operator strategy file's JSON, or the rule broken.
fn parse(json: &Json) -> std::result::Result<Vec<OpStrategyRecord>, String> {
    let root = json
        .as_obj()
        .ok_or("the file must be a JSON object with \"parallel_strategy_item\"")?;
    for (key, _) in root {
        if key.contains("newshape_layout_value_item") {
            return Err(format!(
                "\"{key}\": layouts of reshaped inputs are not supported; give the op's layouts in \"parallel_layout_value_item\""
            ));
        }
        if !ROOT_KEYS.contains(&key.as_str()) {
            return Err(format!(
                "unknown key \"{key}\" (expected {})",
                ROOT_KEYS.join(", ")
            ));
        }
    }
    if json.get("parallel_strategy_item").is_none()
        && json.get("parallel_layout_value_item").is_none()
    {
        return Err(
            "missing \"parallel_strategy_item\" (and no \"parallel_layout_value_item\")".into(),
        );
    }
    if let Some(v) = json.get("current_stage") {
        v.as_u64().filter(|&s| s < MAX_ENTRY).ok_or(format!(
            "\"current_stage\" must be a small non-negative integer, not {}",
            v.brief()
        ))?;
    }
    let items = section(json, "parallel_strategy_item")?;
    let outs = section(json, "parallel_out_strategy_item")?;
    let in_layouts = layout_section(json, "parallel_layout_value_item")?;
    let out_layouts = layout_section(json, "parallel_out_layout_value_item")?;
    let mut records = Vec::with_capacity(items.len() + in_layouts.len());
    // Op name → index in `records`, so that matching the other sections is not a quadratic scan.
    let mut index: HashMap<String, usize> = HashMap::with_capacity(records.capacity());
    for (name, item) in items {
        let (stage, inputs) = entry(name, "in_strategy", item)?;
        index.insert(name.clone(), records.len());
        records.push(OpStrategyRecord {
            name: name.clone(),
            stage,
            inputs,
            outputs: None,
            in_layouts: None,
            out_layouts: None,
        });
    }
    for (name, layouts) in in_layouts {
        match index.get(&name).map(|&i| &mut records[i]) {
            Some(r) => {
                agree(&name, "in_strategy", &r.inputs, &layouts)?;
                r.in_layouts = Some(layouts);
            }
            None => {
                index.insert(name.clone(), records.len());
                records.push(OpStrategyRecord {
                    inputs: layouts.iter().map(Layout::split_factors).collect(),
                    name,
                    stage: 0,
                    outputs: None,
                    in_layouts: Some(layouts),
                    out_layouts: None,
                })
            }
        }
    }
    // The ops known only from "parallel_layout_value_item", which gives no stage: their stage is
    // their out_strategy entry's when it names one, else unknown.
    let mut unstaged: Vec<bool> = vec![false; items.len()];
    unstaged.resize(records.len(), true);
    let no_in = |name: &str| {
        let name = brief_name(name);
        format!("op {name:?} has an out_strategy but no in_strategy in \"parallel_strategy_item\" or \"parallel_layout_value_item\"")
    };
    for (name, out) in outs {
        let i = *index.get(name.as_str()).ok_or_else(|| no_in(name))?;
        let r = &mut records[i];
        let (stage, tuples) = entry(name, "out_strategy", out)?;
        // An op runs in one pipeline stage: an out_strategy placing it in another was dropped
        // unread. An op known only from "parallel_layout_value_item" takes the stage its
        // out_strategy entry names.
        if unstaged[i] {
            if out.get("stage").is_some() {
                r.stage = stage;
                unstaged[i] = false;
            }
        } else if out.get("stage").is_some() && stage != r.stage {
            let name = brief_name(name);
            return Err(format!(
                "op {name:?}: its out_strategy is in pipeline stage {stage} but its in_strategy in stage {}; an op runs in one stage",
                r.stage
            ));
        }
        r.outputs = Some(tuples);
    }
    for (name, layouts) in out_layouts {
        let r = index
            .get(&name)
            .map(|&i| &mut records[i])
            .ok_or_else(|| no_in(&name))?;
        if let Some(tuples) = &r.outputs {
            agree(&name, "out_strategy", tuples, &layouts)?;
        }
        r.outputs = Some(layouts.iter().map(Layout::split_factors).collect());
        r.out_layouts = Some(layouts);
    }
    check_layout_only_stages(&records, &unstaged)?;
    for r in &records {
        r.check_sizes()?;
    }
    Ok(records)
}

/// Refuses an op whose stage the file does not give (`unstaged`: known only from
/// `"parallel_layout_value_item"`) when other entries name stages above 0: MindSpore's
/// layout items carry no stage, and `current_stage` is a save counter, not a pipeline stage,
/// so the op's stage cannot be told (placing it on stage 0 would move it silently).
fn check_layout_only_stages(
    records: &[OpStrategyRecord],
    unstaged: &[bool],
) -> std::result::Result<(), String> {
    let Some(staged) = records
        .iter()
        .zip(unstaged)
        .find(|(r, &u)| !u && r.stage > 0)
        .map(|(r, _)| r)
    else {
        return Ok(());
    };
    match records.iter().zip(unstaged).find(|(_, &u)| u) {
        Some((r, _)) => Err(format!(
            "op {:?} is only in \"parallel_layout_value_item\", which gives no pipeline stage, but the file's entries name stages above 0 (op {:?} is in stage {}); give it a \"parallel_strategy_item\" entry with its \"stage\" (its layouts' split factors)",
            brief_name(&r.name),
            brief_name(&staged.name),
            staged.stage
        )),
        None => Ok(()),
    }
}

/// One `{"stage": s, "parallel_strategy": [[…], …]}` entry, op `name`'s `what`
/// (`in_strategy` or `out_strategy`).
fn entry(
    name: &str,
    what: &str,
    item: &Json,
) -> std::result::Result<(usize, Vec<Vec<usize>>), String> {
    let shown = brief_name(name);
    let stage = match item.get("stage") {
        None => 0,
        Some(v) => v.as_u64().filter(|&s| s < MAX_ENTRY).ok_or_else(|| {
            format!("op {shown:?}: \"stage\" must be a small non-negative integer")
        })? as usize,
    };
    let tuples = item
        .get("parallel_strategy")
        .and_then(Json::as_arr)
        .ok_or_else(|| {
            format!("op {shown:?}: \"parallel_strategy\" must be a list of split tuples")
        })?;
    check_tuple_count(name, what, tuples.len())?;
    let mut out = Vec::with_capacity(tuples.len());
    for (i, t) in tuples.iter().enumerate() {
        let dims = t
            .as_arr()
            .ok_or_else(|| format!("op {shown:?}: input {i} must be a list of split factors"))?;
        let mut tuple = Vec::with_capacity(dims.len());
        for d in dims {
            let f = d
                .as_u64()
                .filter(|&f| (1..MAX_ENTRY).contains(&f))
                .ok_or_else(|| format!(
                    "op {shown:?}: input {i}: split factor {} must be an integer between 1 and {MAX_ENTRY}",
                    d.brief()
                ))?;
            tuple.push(f as usize);
        }
        out.push(tuple);
    }
    Ok((stage, out))
}

/// The JSON of `records` in MindSpore's format: tuple-valued strategies in
/// `parallel_strategy_item` / `parallel_out_strategy_item`, layout-valued ones in
/// `parallel_layout_value_item` / `parallel_out_layout_value_item`.
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
    let mut sections: [(&str, Vec<(String, Json)>); 4] = [
        ("parallel_strategy_item", Vec::new()),
        ("parallel_out_strategy_item", Vec::new()),
        ("parallel_layout_value_item", Vec::new()),
        ("parallel_out_layout_value_item", Vec::new()),
    ];
    // Layout items carry no stage: in a file with stages, a layout-form op also gets its
    // split-tuple entry, which names its stage.
    let staged = records.iter().any(|r| r.stage > 0);
    for r in records {
        let name = r.name.clone();
        if let Some(layouts) = &r.in_layouts {
            sections[2].1.push((name.clone(), layouts_json(layouts)));
        }
        if r.in_layouts.is_none() || staged {
            sections[0].1.push((name.clone(), item(r.stage, &r.inputs)));
        }
        match (&r.out_layouts, &r.outputs) {
            (Some(layouts), _) => sections[3].1.push((name, layouts_json(layouts))),
            (None, Some(tuples)) => sections[1].1.push((name, item(r.stage, tuples))),
            (None, None) => {}
        }
    }
    let mut root = vec![("current_stage".to_string(), Json::UInt(0))];
    for (i, (key, entries)) in sections.into_iter().enumerate() {
        if i == 0 || !entries.is_empty() {
            root.push((key.to_string(), Json::Obj(entries)));
        }
    }
    Json::Obj(root)
}

/// Writes `records` as an operator strategy file, atomically (replacing an older file),
/// creating its missing parent directories; a failed write leaves neither the file nor the
/// directories it created.
pub fn write_operator_strategy_file(path: &Path, records: &[OpStrategyRecord]) -> Result<()> {
    let mut text = to_json(records).to_pretty(2);
    text.push('\n');
    write_file(path, text.as_bytes(), true)?;
    Ok(())
}
