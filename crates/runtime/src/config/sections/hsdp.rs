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

/// What a [`shard_size_warning`] states: every cap and skip, or those at one replica count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ShardSizeCover {
    /// Every parameter's cap or skip.
    Every,
    /// Parameters with this many replicas, sharded over them: fewer than `shard_size`.
    Capped(usize),
    /// Parameters with this many replicas, left whole: `shard_size` does not divide them.
    Skipped(usize),
}

/// A warning about `parallel.hsdp.shard_size`, and what it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardSizeWarning {
    /// The caps and skips the sentence states.
    pub(crate) covers: ShardSizeCover,
    /// The sentence.
    pub(crate) text: String,
}

/// What `parallel.hsdp.shard_size` does that the run would otherwise do without a word, one
/// sentence naming the key, the value and the replica count it meets (the parallel pass
/// decides per parameter, `parallel::hsdp`; MindSpore caps and skips the same way,
/// `SEMANTICS.md`, optimizer sharding):
/// - `1` shards nothing: `[parallel.hsdp]` has no effect;
/// - above a parameter's replicas it is capped to them. No parameter has more replicas than the
///   devices of its pipeline stage, so a value above those is capped for every parameter;
/// - a value that does not divide a parameter's replicas leaves it whole. Every replica group
///   divides the devices of a stage, so a value that does not divide those shards no
///   parameter over that many ranks.
///
/// Below the stage's devices, a GPT in `semi_auto` with `model_parallel` > 1
/// (`gpt_model_parallel`) holds the weights that key splits on `devices per stage /
/// model_parallel` replicas (LayerNorm's and the other whole weights on every device of the
/// stage): a value above that is capped for those weights, one that does not divide it leaves
/// them whole.
pub(crate) fn shard_size_warning(
    parallel: &parallel::ParallelConfig,
    gpt_model_parallel: Option<usize>,
) -> Option<ShardSizeWarning> {
    let size = parallel.hsdp.as_ref().and_then(|h| h.shard_size)?;
    let devices = parallel.effective_devices();
    let stages = parallel.pipeline.as_ref().map_or(1, |p| p.stages.max(1));
    let per_stage = parallel.devices_per_stage();
    // Stand-alone and one device are reported as `[parallel.hsdp]` having no effect; more
    // stages than devices are refused by the pipeline check.
    if parallel.mode == parallel::ParallelMode::StandAlone || devices <= 1 || per_stage == 0 {
        return None;
    }
    let key = format!("parallel.hsdp.shard_size = {size}");
    let warning = |covers, text| Some(ShardSizeWarning { covers, text });
    if size == 1 {
        return warning(
            ShardSizeCover::Every,
            format!(
                "{key} leaves every parameter whole: [parallel.hsdp] has no effect (-1 shards \
                 each parameter over its whole replica group)"
            ),
        );
    }
    let group = if stages > 1 {
        format!(
            "the devices per pipeline stage ({devices} devices / {stages} stages = {per_stage})"
        )
    } else {
        format!("the {devices} devices")
    };
    if size > per_stage {
        return warning(
            ShardSizeCover::Capped(per_stage),
            format!(
                "{key} is capped to {per_stage}: no parameter has more replicas than {group}, \
                 and each is sharded over at most its replicas (as MindSpore caps \
                 optimizer_weight_shard_size)"
            ),
        );
    }
    if !per_stage.is_multiple_of(size) {
        return warning(
            ShardSizeCover::Every,
            format!(
                "{key} does not divide {group}, which every parameter's replica group divides: \
                 a parameter with more than {size} replicas is left whole (its replicas are not \
                 a multiple of {size}, as MindSpore skips it) and one with fewer is sharded \
                 over its replicas"
            ),
        );
    }
    let mp = gpt_model_parallel.filter(|&mp| mp > 1)?;
    let replicas = per_stage / mp;
    let stage = if stages > 1 {
        " per pipeline stage"
    } else {
        ""
    };
    let split = format!(
        "the weights parallel.model_parallel = {mp} splits: each is held by {replicas} \
         replicas ({per_stage} devices{stage} / {mp})"
    );
    if size > replicas {
        warning(
            ShardSizeCover::Capped(replicas),
            format!(
                "{key} is capped to {replicas} for {split}, and is sharded over at most its \
                 replicas (as MindSpore caps optimizer_weight_shard_size)"
            ),
        )
    } else if !replicas.is_multiple_of(size) {
        warning(
            ShardSizeCover::Skipped(replicas),
            format!(
                "{key} does not divide the replicas of {split}: those are left whole (as \
                 MindSpore skips a parameter whose replicas are not a multiple of the shard \
                 size)"
            ),
        )
    } else {
        None
    }
}
