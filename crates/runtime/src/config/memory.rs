//! The memory sections of `[parallel]`: `[parallel.recompute]`.

use parallel::RecomputeConfig;
use toml::Value;

use super::values::{read_bool, wrong_type, Section};
use crate::error::RuntimeError;

/// The keys of `[parallel.recompute]`.
pub(super) const RECOMPUTE_KEYS: &[&str] = &[
    "cells",
    "ops",
    "mp_comm_recompute",
    "parallel_optimizer_comm_recompute",
];

/// A list of glob strings.
fn read_globs(key: &str, value: Value) -> Result<Vec<String>, RuntimeError> {
    let Value::Array(items) = value else {
        return Err(wrong_type(key, "a list of name globs", &value));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(glob) if !glob.is_empty() => Ok(glob),
            other => Err(wrong_type(
                &format!("{key}[{i}]"),
                "a non-empty name glob",
                &other,
            )),
        })
        .collect()
}

/// Reads `[parallel.recompute]` (whether every glob matches is checked by the parallel pass).
pub(super) fn read_recompute(key: &str, value: Value) -> Result<RecomputeConfig, RuntimeError> {
    let mut s = Section::new(key, value, RECOMPUTE_KEYS)?;
    let defaults = RecomputeConfig::default();
    Ok(RecomputeConfig {
        cells: s.or("cells", Vec::new(), read_globs)?,
        ops: s.or("ops", Vec::new(), read_globs)?,
        mp_comm_recompute: s.or("mp_comm_recompute", defaults.mp_comm_recompute, read_bool)?,
        parallel_optimizer_comm_recompute: s.or(
            "parallel_optimizer_comm_recompute",
            defaults.parallel_optimizer_comm_recompute,
            read_bool,
        )?,
    })
}
