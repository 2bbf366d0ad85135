//! `[train]`'s learning-rate schedule keys (`lr_schedule` and each formula's own parameters)
//! and the weight-decay filter (`no_weight_decay`).

use exec::WeightDecayFilter;
use toml::Value;

use super::values::{
    config_error, read_bool, read_count, read_enum, read_float, read_string, wrong_type, Section,
};
use crate::error::RuntimeError;
use crate::lr_schedule::{self, LrDecay, LrSchedule, LR_SCHEDULE_NAMES};

/// A key's value checked by itself, `learning_rate` the peak: the key's type and range, not
/// how it agrees with other keys (those are checked where the key acts).
type RuleCheck = fn(&str, Value, f64) -> Result<(), RuntimeError>;

/// The keys only some schedules read: `(key, the schedules that read it, its check)`. A key
/// given for a schedule that does not read it is checked all the same, then reported as having
/// no effect.
const RULE_KEYS: &[(&str, &[&str], RuleCheck)] = &[
    (
        "min_lr",
        &["cosine", "cosine_decay_lr", "polynomial_decay_lr"],
        |key, v, lr| lr_schedule::check_min_lr(read_float(key, v)?, lr, false),
    ),
    ("decay_steps", &["cosine"], check_at_least_one),
    ("num_cycles", &["cosine"], check_above_zero),
    (
        "step_per_epoch",
        &[
            "warmup_lr",
            "cosine_decay_lr",
            "polynomial_decay_lr",
            "exponential_decay_lr",
        ],
        check_at_least_one,
    ),
    ("warmup_epoch", &["warmup_lr"], check_at_least_one),
    (
        "decay_epoch",
        &[
            "cosine_decay_lr",
            "polynomial_decay_lr",
            "exponential_decay_lr",
        ],
        check_at_least_one,
    ),
    ("power", &["polynomial_decay_lr"], check_above_zero),
    (
        "update_decay_epoch",
        &["polynomial_decay_lr"],
        |key, v, _| read_bool(key, v).map(drop),
    ),
    ("decay_rate", &["exponential_decay_lr"], check_above_zero),
    ("is_stair", &["exponential_decay_lr"], |key, v, _| {
        read_bool(key, v).map(drop)
    }),
    ("milestone", &["piecewise_constant_lr"], |key, v, _| {
        lr_schedule::check_milestones(&read_counts(key, v)?)
    }),
    ("learning_rates", &["piecewise_constant_lr"], |key, v, _| {
        read_floats(key, v)?
            .into_iter()
            .try_for_each(|r| lr_schedule::finite_at_least_zero(short(key), r))
    }),
];

/// `train.<key>` → `<key>` (the schedule's checks name their key without the section).
fn short(key: &str) -> &str {
    key.strip_prefix("train.").unwrap_or(key)
}

/// A count ≥ 1.
fn check_at_least_one(key: &str, value: Value, _: f64) -> Result<(), RuntimeError> {
    lr_schedule::at_least_one(short(key), read_count(key, value)?)
}

/// A finite number > 0.
fn check_above_zero(key: &str, value: Value, _: f64) -> Result<(), RuntimeError> {
    lr_schedule::finite_above_zero(short(key), read_float(key, value)?)
}

/// A list of non-negative integers.
fn read_counts(key: &str, value: Value) -> Result<Vec<u64>, RuntimeError> {
    match value {
        Value::Array(items) => items.into_iter().map(|v| read_count(key, v)).collect(),
        other => Err(wrong_type(key, "a list of non-negative integers", &other)),
    }
}

/// A list of numbers.
fn read_floats(key: &str, value: Value) -> Result<Vec<f64>, RuntimeError> {
    match value {
        Value::Array(items) => items.into_iter().map(|v| read_float(key, v)).collect(),
        other => Err(wrong_type(key, "a list of numbers", &other)),
    }
}

/// A list of strings.
fn read_strings(key: &str, value: Value) -> Result<Vec<String>, RuntimeError> {
    match value {
        Value::Array(items) => items.into_iter().map(|v| read_string(key, v)).collect(),
        other => Err(wrong_type(key, "a list of strings", &other)),
    }
}

/// The schedule of `[train]` (peak `learning_rate`, already read); the keys of other
/// schedules are checked by themselves, then removed and reported in `warnings` as having no
/// effect.
pub(super) fn read_lr_schedule(
    s: &mut Section,
    learning_rate: f64,
    warnings: &mut Vec<String>,
) -> Result<LrSchedule, RuntimeError> {
    let name = s.or("lr_schedule", "constant", |key, v| {
        read_enum(key, v, LR_SCHEDULE_NAMES, |t| {
            LR_SCHEDULE_NAMES.iter().copied().find(|n| *n == t)
        })
    })?;
    let warmup_steps = s.or("warmup_steps", 0, read_count)?;
    let warmup_lr_init = match warmup_steps > 0 {
        true => s.or("warmup_lr_init", 0.0, read_float)?,
        false => {
            let given = s.get("warmup_lr_init", |key, v| {
                lr_schedule::check_warmup_lr_init(read_float(key, v)?, learning_rate)
            })?;
            if given.is_some() {
                warnings.push(
                    "train.warmup_lr_init has no effect without train.warmup_steps".to_string(),
                );
            }
            0.0
        }
    };
    let step_per_epoch = match schedules_reading("step_per_epoch").contains(&name) {
        true => s.or("step_per_epoch", 1, read_count)?,
        false => 1,
    };
    let min_lr = |s: &mut Section| s.or("min_lr", 0.0, read_float);
    let decay_epoch = |s: &mut Section| s.require("decay_epoch", read_count);
    let decay = match name {
        "warmup_lr" => LrDecay::WarmupLr {
            warmup_epoch: s.require("warmup_epoch", read_count)?,
        },
        "cosine_decay_lr" => LrDecay::CosineDecayLr {
            min_lr: min_lr(s)?,
            decay_epoch: decay_epoch(s)?,
        },
        "polynomial_decay_lr" => LrDecay::PolynomialDecayLr {
            end_learning_rate: min_lr(s)?,
            decay_epoch: decay_epoch(s)?,
            power: s.or("power", 1.0, read_float)?,
            update_decay_epoch: s.or("update_decay_epoch", false, read_bool)?,
        },
        "exponential_decay_lr" => LrDecay::ExponentialDecayLr {
            decay_rate: s.require("decay_rate", read_float)?,
            decay_epoch: decay_epoch(s)?,
            is_stair: s.or("is_stair", false, read_bool)?,
        },
        "piecewise_constant_lr" => LrDecay::PiecewiseConstantLr {
            milestone: s.require("milestone", read_counts)?,
            learning_rates: s.require("learning_rates", read_floats)?,
        },
        "cosine" => LrDecay::CosineWithWarmUp {
            lr_end: min_lr(s)?,
            decay_steps: s.get("decay_steps", read_count)?,
            num_cycles: s.or("num_cycles", 0.5, read_float)?,
        },
        _ => LrDecay::Constant,
    };
    for (key, _, check) in RULE_KEYS {
        if s.get(key, |k, v| check(k, v, learning_rate))?.is_some() {
            warnings.push(format!(
                "train.{key} has no effect with lr_schedule = \"{name}\""
            ));
        }
    }
    let schedule = LrSchedule {
        learning_rate,
        warmup_steps,
        warmup_lr_init,
        step_per_epoch,
        decay,
    };
    schedule.validate()?;
    Ok(schedule)
}

/// The schedules that read `key`.
fn schedules_reading(key: &str) -> &'static [&'static str] {
    RULE_KEYS
        .iter()
        .find(|(k, _, _)| *k == key)
        .map_or(&[], |(_, names, _)| names)
}

/// `train.no_weight_decay`: name substrings excluded from weight decay (each non-empty).
pub(super) fn read_weight_decay_filter(s: &mut Section) -> Result<WeightDecayFilter, RuntimeError> {
    let excluded = s.or("no_weight_decay", Vec::new(), read_strings)?;
    if excluded.iter().any(String::is_empty) {
        return Err(config_error(
            "train.no_weight_decay",
            "an empty string would match every parameter: list name parts such as \"bias\" or \"embedding\"",
        ));
    }
    Ok(WeightDecayFilter { excluded })
}
