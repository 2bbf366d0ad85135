//! One layout-form entry of MindSpore's operator strategy file: an op's in_strategy (or
//! out_strategy) given as `Layout`s, as `parallel_layout_value_item` (and
//! `parallel_out_layout_value_item`) record it.
//!
//! MindSpore writes each entry in `StrategyCheckpointInfo::to_json_layout_value_tuple_item`
//! (`mindspore/ccsrc/frontend/parallel/strategy_checkpoint/strategy_checkpoint_info.cc`) and
//! reads it back in `StrategyJsonInfo::LayoutFromJson`: an object keyed by the input index as a
//! string (`"0"`, `"1"`, …), each value
//!
//! ```json
//! {"dev_matrix": [2, 2, 2], "tensor_map": [[2, 1], [-1]],
//!  "interleaved_parallel": false, "alias_name": ["dp", "sp", "mp"]}
//! ```
//!
//! `tensor_map` has one list per tensor dim; each number names a device-matrix axis counted
//! from the right (`len(dev_matrix) - 1 - axis`, MindSpore's convention), outer first, and
//! `-1` means "not split". `[[2, 1], [-1]]` above is `layout(("dp", "sp"), "None")`.

use layout::{Layout, Mesh, INTERLEAVED_ALIAS};

use crate::format::codec::json::Json;
use crate::model::MAX_OP_TUPLES;

/// The largest device-matrix axis size accepted.
const MAX_AXIS: u64 = 1 << 24;

/// The keys of one layout.
const KEYS: &[&str] = &[
    "dev_matrix",
    "tensor_map",
    "interleaved_parallel",
    "alias_name",
];

/// The layouts of one entry (`{"0": {…}, "1": {…}}`), in input order, or the rule broken
/// (prefixed by the caller with the op key).
pub(crate) fn read_layouts(entry: &Json) -> Result<Vec<Layout>, String> {
    let items = entry
        .as_obj()
        .ok_or("must be an object of input index (\"0\", \"1\", …) → layout")?;
    if items.len() > MAX_OP_TUPLES {
        return Err(format!(
            "{} layouts, more than the {MAX_OP_TUPLES} inputs or outputs an op may have",
            items.len()
        ));
    }
    let mut slots: Vec<Option<Layout>> = vec![None; items.len()];
    for (key, item) in items {
        let index = key
            .parse::<usize>()
            .ok()
            .filter(|&i| i < items.len() && key == &i.to_string())
            .ok_or_else(|| {
                format!(
                    "key {:?} must be an input index from \"0\" to \"{}\"",
                    crate::error::brief_name(key),
                    items.len().saturating_sub(1)
                )
            })?;
        if slots[index].is_some() {
            return Err(format!("input {index} is given twice"));
        }
        slots[index] = Some(read_layout(item).map_err(|e| format!("input {index}: {e}"))?);
    }
    Ok(slots.into_iter().flatten().collect())
}

/// One `{"dev_matrix", "tensor_map", "interleaved_parallel", "alias_name"}` layout.
fn read_layout(item: &Json) -> Result<Layout, String> {
    let fields = item
        .as_obj()
        .ok_or("must be an object with dev_matrix, tensor_map, interleaved_parallel, alias_name")?;
    if let Some((key, _)) = fields.iter().find(|(k, _)| !KEYS.contains(&k.as_str())) {
        return Err(format!(
            "unknown key {:?} (expected {})",
            crate::error::brief_name(key),
            KEYS.join(", ")
        ));
    }
    let field = |key: &str| item.get(key).ok_or(format!("missing \"{key}\""));
    let dev_matrix = field("dev_matrix")?
        .as_arr()
        .ok_or("\"dev_matrix\" must be a list of axis sizes")?
        .iter()
        .map(|d| {
            d.as_u64()
                .filter(|&n| (1..=MAX_AXIS).contains(&n))
                .map(|n| n as usize)
                .ok_or(format!(
                    "\"dev_matrix\": axis size {} must be an integer between 1 and {MAX_AXIS}",
                    d.brief()
                ))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let alias_name = field("alias_name")?
        .as_arr()
        .ok_or("\"alias_name\" must be a list of strings")?
        .iter()
        .map(|a| a.as_str().ok_or("\"alias_name\" must be a list of strings"))
        .collect::<Result<Vec<_>, _>>()?;
    let interleaved = match field("interleaved_parallel")? {
        Json::Bool(b) => *b,
        _ => return Err("\"interleaved_parallel\" must be true or false".to_string()),
    };
    if interleaved != alias_name.contains(&INTERLEAVED_ALIAS) {
        return Err(format!(
            "\"interleaved_parallel\" is {interleaved} but \"alias_name\" {} \"{INTERLEAVED_ALIAS}\"",
            if interleaved { "lacks" } else { "has" }
        ));
    }
    if interleaved {
        return Err(format!(
            "\"{INTERLEAVED_ALIAS}\" layouts are not supported in training strategies"
        ));
    }
    let mesh = Mesh::new(&dev_matrix, &alias_name, None).map_err(|e| e.to_string())?;
    let n_axes = mesh.n_axes();
    let dims = field("tensor_map")?
        .as_arr()
        .ok_or("\"tensor_map\" must be a list of per-dim lists of axis numbers")?
        .iter()
        .enumerate()
        .map(|(d, dim)| tensor_map_dim(d, dim, n_axes))
        .collect::<Result<Vec<_>, _>>()?;
    Layout::from_mesh(mesh, dims).map_err(|e| format!("\"tensor_map\": {e}"))
}

/// Mesh axes (from the left) of tensor dim `d`'s `tensor_map` entry: numbers counted from the
/// right, `-1` alone for "not split".
fn tensor_map_dim(d: usize, dim: &Json, n_axes: usize) -> Result<Vec<usize>, String> {
    let rule = format!(
        "\"tensor_map\"[{d}] must be [-1] or a non-empty list of axis numbers from 0 to {} \
         (counted from the right of dev_matrix)",
        n_axes - 1
    );
    let numbers = dim
        .as_arr()
        .filter(|n| !n.is_empty())
        .ok_or(rule.clone())?
        .iter()
        .map(|n| n.as_i64().ok_or(rule.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    if numbers == [-1] {
        return Ok(Vec::new());
    }
    numbers
        .iter()
        .map(|&n| {
            usize::try_from(n)
                .ok()
                .filter(|&n| n < n_axes)
                .map(|n| n_axes - 1 - n)
                .ok_or(rule.clone())
        })
        .collect()
}

/// The JSON of `layouts` as MindSpore writes a layout-form entry. Every layout must have its
/// tensor map (the layouts of a strategy always do).
pub(crate) fn layouts_json(layouts: &[Layout]) -> Json {
    Json::Obj(
        layouts
            .iter()
            .enumerate()
            .map(|(i, l)| (i.to_string(), layout_json(l)))
            .collect(),
    )
}

/// One layout's JSON object.
fn layout_json(layout: &Layout) -> Json {
    let mesh = layout.mesh();
    let n_axes = mesh.n_axes();
    let tensor_map = layout
        .dims()
        .unwrap_or(&[])
        .iter()
        .map(|axes| {
            if axes.is_empty() {
                Json::Arr(vec![Json::Int(-1)])
            } else {
                Json::Arr(
                    axes.iter()
                        .map(|&a| Json::Int((n_axes - 1 - a) as i64))
                        .collect(),
                )
            }
        })
        .collect();
    Json::obj([
        (
            "dev_matrix",
            Json::uints(mesh.device_matrix().iter().map(|&d| d as u64)),
        ),
        ("tensor_map", Json::Arr(tensor_map)),
        ("interleaved_parallel", Json::Bool(false)),
        (
            "alias_name",
            Json::Arr(
                mesh.alias_names()
                    .iter()
                    .map(|a| Json::Str(a.to_string()))
                    .collect(),
            ),
        ),
    ])
}
