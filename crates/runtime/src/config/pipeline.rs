//! `[parallel.pipeline]`: pipeline stages, micro-batches and the schedule.

use parallel::pipeline::{PipelineConfig, Scheduler};
use toml::Value;

use super::overrides::display_key;
use super::values::{config_error, read_bool, read_positive, read_string, wrong_type, Section};
use crate::error::RuntimeError;

/// The keys of `[parallel.pipeline]`.
const PIPELINE_KEYS: &[&str] = &[
    "stages",
    "micro_batches",
    "scheduler",
    "interleave",
    "virtual_stages",
    "output_broadcast",
    "stage_config",
];

/// Reads `[parallel.pipeline]` (checked against the device count later, by the parallel pass),
/// with a warning for each key given that has no effect.
pub(super) fn read_pipeline(
    key: &str,
    value: Value,
) -> Result<(PipelineConfig, Vec<String>), RuntimeError> {
    let mut warnings = Vec::new();
    let mut s = Section::new(key, value, PIPELINE_KEYS)?;
    let stages = s.require("stages", read_positive)?;
    let micro_batches = s.or("micro_batches", 1, read_positive)?;
    let scheduler = s.or("scheduler", Scheduler::OneFOneB, |k, v| {
        let text = read_string(k, v)?;
        Scheduler::parse(&text).map_err(|e| config_error(k, e.to_string()))
    })?;
    let mut config = PipelineConfig::new(stages, micro_batches, scheduler);
    if let Some(on) = s.get("interleave", read_bool)? {
        config.interleave = on;
    }
    if let Some(v) = s.get("virtual_stages", read_positive)? {
        config.virtual_stages = v;
        if !config.interleave {
            warnings.push(format!(
                "{key}.virtual_stages = {v} has no effect without {key}.interleave = true or \
                 scheduler = \"interleaved_1f1b\" (each stage runs one chunk of layers)"
            ));
        }
    }
    config.output_broadcast = s.or("output_broadcast", false, read_bool)?;
    let stage_config = s.or("stage_config", Vec::new(), |k, v| {
        let Value::Table(table) = v else {
            return Err(wrong_type(k, "a table of cell-name prefix = stage", &v));
        };
        table
            .into_iter()
            .map(|(prefix, stage)| {
                let stage_key = format!("{k}.{}", display_key(std::slice::from_ref(&prefix)));
                let stage = match stage {
                    Value::Integer(n) if n >= 0 => usize::try_from(n)
                        .map_err(|_| config_error(&stage_key, format!("{n} is too large")))?,
                    other => {
                        return Err(wrong_type(&stage_key, "a stage number (0, 1, …)", &other))
                    }
                };
                Ok((prefix, stage))
            })
            .collect()
    })?;
    config.stage_config = stage_config;
    config
        .validate_shape()
        .map_err(|e| config_error(key, e.to_string()))?;
    Ok((config, warnings))
}
