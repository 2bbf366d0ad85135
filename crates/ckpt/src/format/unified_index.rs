//! The index of a unified checkpoint (MindSpore's `unified_safetensors` output):
//! `param_name_map.json`, mapping every parameter to the part file holding it.
//!
//! ```text
//! {"metadata": {"total_size": <bytes of tensor data>},
//!  "weight_map": {"<parameter>": "part<i>.safetensors", …}}
//! ```
//! Parameters are listed largest first (MindSpore's order); every file name is a plain name in
//! the index's directory. Tensors outside the strategy are in `hyper_param.safetensors` beside
//! it, which the index does not list.

use std::path::Path;

use super::codec::json::Json;
use crate::error::{io_err, CkptError, Result};

/// The index file of a unified checkpoint.
pub const PARAM_NAME_MAP: &str = "param_name_map.json";
/// The file of parameters outside the strategy in a unified checkpoint.
pub const HYPER_PARAM_FILE: &str = "hyper_param.safetensors";

/// Reads the index at `path`: every `(parameter, part file name)` in index order. A file name
/// that is not a plain name in the directory is refused.
pub(crate) fn read(path: &Path) -> Result<Vec<(String, String)>> {
    let text = layout::limits::read_text_bounded(path, layout::limits::MAX_TEXT_FILE_BYTES)
        .map_err(io_err(path, "read"))?;
    let bad = |reason: String| CkptError::InvalidStrategy {
        path: path.to_path_buf(),
        reason,
    };
    let json = Json::parse(&text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
    let map = json
        .get("weight_map")
        .and_then(Json::as_obj)
        .ok_or_else(|| bad("no \"weight_map\" object".to_string()))?;
    let mut weight_map = Vec::with_capacity(map.len());
    for (name, file) in map {
        let file = file
            .as_str()
            .filter(|f| !f.contains('/') && !f.contains("..") && !f.is_empty())
            .ok_or_else(|| {
                bad(format!(
                    "weight_map entry {:?} is not a file name in the directory",
                    crate::error::brief_name(name)
                ))
            })?;
        weight_map.push((name.clone(), file.to_string()));
    }
    Ok(weight_map)
}

/// The text of an index: `total_size` bytes of tensor data and `weight_map`'s
/// `(parameter, part file name)` entries in the order given (4-space indent, as MindSpore
/// writes it).
pub(crate) fn to_text(total_size: u64, weight_map: &[(String, String)]) -> String {
    let index = Json::obj([
        (
            "metadata",
            Json::obj([("total_size", Json::UInt(total_size))]),
        ),
        (
            "weight_map",
            Json::Obj(
                weight_map
                    .iter()
                    .map(|(name, file)| (name.clone(), Json::Str(file.clone())))
                    .collect(),
            ),
        ),
    ]);
    index.to_pretty(4)
}
