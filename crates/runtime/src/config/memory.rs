//! The memory and communication sections of `[parallel]`: `[parallel.recompute]`,
//! `[parallel.comm_fusion]`, `[parallel.overlap]` and `parallel.comm_reuse`.

use parallel::fusion::{CommFusionConfig, FusionMode, OverlapConfig};
use parallel::RecomputeConfig;
use toml::Value;

use super::values::{
    config_error, read_bool, read_count, read_positive, read_string, wrong_type, Section,
};
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

/// The keys of `[parallel.comm_fusion]`.
pub(super) const COMM_FUSION_KEYS: &[&str] =
    &["openstate", "allreduce", "reducescatter", "allgather"];

/// The keys of one collective's entry: `allreduce = { mode = "size", config = 32 }`.
const FUSION_MODE_KEYS: &[&str] = &["mode", "config"];

/// One collective's fusion: MindSpore's `{"mode": "auto" | "size" | "index", "config": …}`.
fn read_fusion_mode(key: &str, value: Value) -> Result<FusionMode, RuntimeError> {
    let mut s = Section::new(key, value, FUSION_MODE_KEYS)?;
    let mode = s.or("mode", "auto".to_string(), read_string)?;
    let config_key = format!("{key}.config");
    match mode.as_str() {
        "auto" => {
            if s.discard("config") {
                return Err(config_error(
                    &config_key,
                    "mode \"auto\" takes no config (64 MB buckets)",
                ));
            }
            Ok(FusionMode::Auto)
        }
        "size" => {
            let mb = s.require("config", read_positive)?;
            let bytes = mb
                .checked_mul(1 << 20)
                .ok_or_else(|| config_error(&config_key, format!("{mb} MB is too large")))?;
            Ok(FusionMode::Size(bytes))
        }
        "index" => {
            let bounds = s.require("config", |k, v| {
                let Value::Array(items) = v else {
                    return Err(wrong_type(k, "a list of parameter indices", &v));
                };
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, item)| read_count(&format!("{k}[{i}]"), item))
                    .map(|n| n.map(|n| usize::try_from(n).unwrap_or(usize::MAX)))
                    .collect::<Result<Vec<usize>, _>>()
            })?;
            if bounds.windows(2).any(|w| w[0] >= w[1]) {
                return Err(config_error(
                    &config_key,
                    format!("the indices {bounds:?} must increase"),
                ));
            }
            Ok(FusionMode::Index(bounds))
        }
        other => Err(config_error(
            &format!("{key}.mode"),
            format!("\"{other}\" is not one of \"auto\", \"size\", \"index\""),
        )),
    }
}

/// Reads `[parallel.comm_fusion]`.
pub(super) fn read_comm_fusion(key: &str, value: Value) -> Result<CommFusionConfig, RuntimeError> {
    let mut s = Section::new(key, value, COMM_FUSION_KEYS)?;
    let defaults = CommFusionConfig::default();
    Ok(CommFusionConfig {
        openstate: s.or("openstate", defaults.openstate, read_bool)?,
        allreduce: s.or("allreduce", defaults.allreduce, read_fusion_mode)?,
        reducescatter: s.or("reducescatter", defaults.reducescatter, read_fusion_mode)?,
        allgather: s.or("allgather", defaults.allgather, read_fusion_mode)?,
    })
}

/// `parallel.comm_reuse`: `-1` (share every identical communication's plan), `0` (none) or a
/// positive cap.
pub(super) fn read_comm_reuse(key: &str, value: Value) -> Result<Option<usize>, RuntimeError> {
    match value {
        Value::Integer(-1) => Ok(None),
        Value::Integer(n) if n >= 0 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        other => Err(wrong_type(key, "-1 or a count ≥ 0", &other)),
    }
}

/// The keys of `[parallel.overlap]`.
pub(super) const OVERLAP_KEYS: &[&str] = &[
    "grad_computation_allreduce_overlap",
    "computation_allgather_overlap",
];

/// Reads `[parallel.overlap]`.
pub(super) fn read_overlap(key: &str, value: Value) -> Result<OverlapConfig, RuntimeError> {
    let mut s = Section::new(key, value, OVERLAP_KEYS)?;
    Ok(OverlapConfig {
        grad_computation_allreduce_overlap: s.or(
            "grad_computation_allreduce_overlap",
            false,
            read_bool,
        )?,
        computation_allgather_overlap: s.or("computation_allgather_overlap", false, read_bool)?,
    })
}
