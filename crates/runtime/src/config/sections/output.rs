//! `[output]`: where checkpoints go, how often, and what to resume from.

use std::path::Path;

use toml::Value;

use crate::config::values::{
    config_error, path_reader, read_bool, read_positive, read_string, Section,
};
use crate::config::{OutputConfig, ResumeFrom};
use crate::error::RuntimeError;

/// `[output]`'s keys.
pub(in crate::config) const OUTPUT_KEYS: &[&str] = &[
    "dir",
    "save_checkpoint",
    "save_checkpoint_steps",
    "save_checkpoint_seconds",
    "keep_checkpoint_max",
    "resume_from",
    "resume_strategy",
    "group_info_file",
];

/// Reads `[output]`, resolving its paths against `base`; keys that cannot act in this section
/// (`resume_strategy` without `resume_from`, `keep_checkpoint_max` without periodic sets) are
/// reported in `warnings`.
pub(super) fn read_output(
    mut s: Section,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<OutputConfig, RuntimeError> {
    let keep_given = s.has("keep_checkpoint_max");
    let output = OutputConfig {
        dir: s.require("dir", path_reader(base))?,
        save_checkpoint: s.or("save_checkpoint", true, read_bool)?,
        save_checkpoint_steps: s
            .get("save_checkpoint_steps", read_positive)?
            .map(|n| n as u64),
        save_checkpoint_seconds: s
            .get("save_checkpoint_seconds", read_positive)?
            .map(|n| n as u64),
        keep_checkpoint_max: s.or("keep_checkpoint_max", 5, read_positive)?,
        resume_from: s.get("resume_from", |key, v| match v {
            Value::String(text) if text == "latest" => Ok(ResumeFrom::Latest),
            other => path_reader(base)(key, other).map(ResumeFrom::Dir),
        })?,
        resume_strategy: s.get("resume_strategy", path_reader(base))?,
        group_info_file: s.get("group_info_file", |key, v| {
            let text = read_string(key, v)?;
            if text.is_empty() {
                return Err(config_error(key, "a file name, not the empty string"));
            }
            // The run's checkpoint commits replace these entries of `output.dir` whole: a file
            // written inside one would be removed at the next checkpoint.
            let first = Path::new(&text).components().next();
            let inside_a_set = matches!(first, Some(std::path::Component::Normal(name))
                if ["rank_", "checkpoint_step_"].iter().any(|p| name.to_string_lossy().starts_with(p)));
            if inside_a_set {
                return Err(config_error(
                    key,
                    format!("{text:?} lies inside a checkpoint set's folder (rank_<N>/ or checkpoint_step_<N>/ of output.dir), which every checkpoint replaces; write it beside them"),
                ));
            }
            Ok(text)
        })?,
    };
    if output.resume_strategy.is_some() && output.resume_from.is_none() {
        warnings.push(
            "output.resume_strategy has no effect without output.resume_from (it is the \
             layout of the checkpoint resumed from)"
                .to_string(),
        );
    }
    let periodic =
        output.save_checkpoint_steps.is_some() || output.save_checkpoint_seconds.is_some();
    if keep_given && !periodic {
        warnings.push(
            "output.keep_checkpoint_max has no effect without output.save_checkpoint_steps or \
             output.save_checkpoint_seconds (it bounds the periodic checkpoint sets kept)"
                .to_string(),
        );
    }
    Ok(output)
}
