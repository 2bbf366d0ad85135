//! `[parallel.hsdp]`: MindSpore's `AutoParallel.hsdp` (optimizer-state sharding).

use parallel::{HsdpConfig, OptimizerLevel};
use toml::Value;

use crate::config::values::{config_error, read_bool, Section};
use crate::error::RuntimeError;

/// `[parallel.hsdp]`'s keys: MindSpore's `AutoParallel.hsdp(shard_size, threshold,
/// optimizer_level)`.
pub(in crate::config) const HSDP_KEYS: &[&str] = &[
    "shard_size",
    "threshold",
    "optimizer_level",
    "gradient_accumulation_shard",
];

/// Checks `parallel.hsdp.shard_size` against the run's `devices` (given by `devices_key`).
pub(in crate::config) fn check_shard_size(
    shard_size: Option<usize>,
    devices: usize,
    devices_key: &str,
) -> Result<(), RuntimeError> {
    match shard_size {
        Some(n) if n > devices || !devices.is_multiple_of(n) => Err(config_error(
            "parallel.hsdp.shard_size",
            format!(
                "{n} must be -1 or a positive divisor of the {devices} devices ({devices_key}): \
                 the shard group is a chunk of a parameter's data-parallel group"
            ),
        )),
        _ => Ok(()),
    }
}

/// `[parallel.hsdp]` on `devices` devices. The errors of a bad value are MindSpore's
/// (`AutoParallel.hsdp`), prefixed by the key.
pub(super) fn read_hsdp(
    key: &str,
    value: Value,
    devices: usize,
) -> Result<HsdpConfig, RuntimeError> {
    let mut s = Section::new(key, value, HSDP_KEYS)?;
    let defaults = HsdpConfig::default();
    let shard_size = s.or("shard_size", None, |key, v| match v {
        Value::Integer(-1) => Ok(None),
        Value::Integer(n) if n >= 1 => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            check_shard_size(Some(n), devices, "parallel.devices")?;
            Ok(Some(n))
        }
        other => Err(config_error(
            key,
            format!("shard_size must be a positive integer or -1, but got {other}."),
        )),
    })?;
    let threshold_kb = s.or("threshold", defaults.threshold_kb, |key, v| match v {
        Value::Integer(n) if n >= 0 => {
            usize::try_from(n).map_err(|_| config_error(key, format!("{n} is too large")))
        }
        other => Err(config_error(
            key,
            format!("threshold must be a positive integer or 0, but got {other}."),
        )),
    })?;
    let level = s.or("optimizer_level", defaults.level, |key, v| {
        let parsed = match &v {
            Value::String(text) => OptimizerLevel::parse(text),
            _ => None,
        };
        parsed.ok_or_else(|| {
            let names: Vec<String> = OptimizerLevel::ALL
                .iter()
                .map(|l| format!("'{}'", l.name()))
                .collect();
            config_error(
                key,
                format!(
                    "Optimizer level should in [{}], but got {v}",
                    names.join(", ")
                ),
            )
        })
    })?;
    let gradient_accumulation_shard = s.get("gradient_accumulation_shard", |key, v| {
        let given = read_bool(key, v)?;
        // MindSpore's levels decide it themselves: only a value that agrees is accepted.
        match level.accumulation_shard() {
            Some(decided) if decided != given => Err(config_error(
                key,
                format!(
                    "{given} contradicts optimizer_level \"{}\", which accumulates {}; \
                     gradient_accumulation_shard chooses only under \"zero1\" (MindSpore: only \
                     level2 shards the accumulation)",
                    level.name(),
                    match decided {
                        true => "only each rank's piece of the gradient",
                        false => "the whole gradient (\"level2\" accumulates the pieces)",
                    }
                ),
            )),
            _ => Ok(given),
        }
    })?;
    Ok(HsdpConfig {
        shard_size,
        threshold_kb,
        level,
        gradient_accumulation_shard: gradient_accumulation_shard
            .unwrap_or(defaults.gradient_accumulation_shard),
        accumulates: false,
    })
}
