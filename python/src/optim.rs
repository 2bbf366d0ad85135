//! The engine's optimizers under MindSpore's class names (`tessera.nn` optimizers,
//! `tessera.mint.optim.AdamW`) and the rest of a run's training recipe built in Python
//! ([`Recipe`]: learning-rate schedule, weight-decay filter, gradient clipping, periodic
//! checkpoints).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime::{
    LrDecay, LrSchedule, MaxGradNorm, OptimizerConfig, OptimizerKind, OutputConfig, TrainConfig,
    TrainLoopConfig, WeightDecayFilter,
};

use crate::errors::runtime_err;

/// The optimizer named as MindSpore's class (`SGD`, `Momentum`, `Adam`, `AdamWeightDecay`,
/// `mint.optim.AdamW`).
pub(crate) fn optimizer_config(
    name: &str,
    learning_rate: f64,
    momentum: f64,
    use_nesterov: bool,
    betas: (f64, f64, f64),
    weight_decay: f64,
) -> PyResult<OptimizerConfig> {
    let (beta1, beta2, eps) = betas;
    let kind = match name {
        "SGD" => OptimizerKind::Sgd,
        "Momentum" => OptimizerKind::Momentum {
            momentum,
            use_nesterov,
        },
        "Adam" => OptimizerKind::Adam { beta1, beta2, eps },
        "AdamWeightDecay" => OptimizerKind::AdamW { beta1, beta2, eps },
        "mint.optim.AdamW" => OptimizerKind::MintAdamW { beta1, beta2, eps },
        other => {
            return Err(PyValueError::new_err(format!(
                "optimizer {other} is not supported (SGD, Momentum, Adam, AdamWeightDecay, \
                 mint.optim.AdamW)"
            )))
        }
    };
    Ok(OptimizerConfig {
        kind,
        learning_rate,
        weight_decay,
    })
}

/// The keys a recipe dict may hold.
const RECIPE_KEYS: &[&str] = &[
    "lr_schedule",
    "no_weight_decay",
    "max_grad_norm",
    "save_checkpoint_steps",
    "save_checkpoint_seconds",
    "keep_checkpoint_max",
];

/// What `tessera.nn` optimizers and `tessera.train` callbacks ask of a run beyond the
/// optimizer's rule (`train_network(recipe={...})`): the keys of `[train]` and `[output]` a
/// TOML configuration would set (see docs/CONFIG.md).
#[derive(Debug, Default)]
pub(crate) struct Recipe {
    schedule: Option<LrSchedule>,
    no_weight_decay: Vec<String>,
    max_grad_norm: Option<MaxGradNorm>,
    save_checkpoint_steps: Option<u64>,
    save_checkpoint_seconds: Option<u64>,
    keep_checkpoint_max: Option<usize>,
}

fn bad_key(key: &str, rule: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("recipe key {key}: {rule}"))
}

/// Item `key` of `dict`, extracted as `T` (`None` when absent or `None`).
fn item<'py, T: FromPyObjectOwned<'py>>(
    dict: &Bound<'py, PyDict>,
    key: &str,
) -> PyResult<Option<T>> {
    match dict.get_item(key)? {
        Some(v) if !v.is_none() => v
            .extract::<T>()
            .map(Some)
            .map_err(|e| bad_key(key, format!("wrong type: {}", Into::<PyErr>::into(e)))),
        _ => Ok(None),
    }
}

/// Item `key` of schedule `dict`, which must be there.
fn required<'py, T: FromPyObjectOwned<'py>>(dict: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
    item(dict, key)?.ok_or_else(|| {
        bad_key(
            &format!("lr_schedule.{key}"),
            "missing (the schedule needs it)",
        )
    })
}

/// The engine schedule a `lr_schedule` dict describes: `name` (an `LrDecay` name),
/// `learning_rate` (the peak), `step_per_epoch` (default 1) and the rule's own parameters.
fn read_schedule(dict: &Bound<'_, PyDict>) -> PyResult<LrSchedule> {
    let name: String = required(dict, "name")?;
    let min_lr = || -> PyResult<f64> { Ok(item(dict, "min_lr")?.unwrap_or(0.0)) };
    let decay_epoch = || required::<u64>(dict, "decay_epoch");
    let decay = match name.as_str() {
        "warmup_lr" => LrDecay::WarmupLr {
            warmup_epoch: required(dict, "warmup_epoch")?,
        },
        "cosine_decay_lr" => LrDecay::CosineDecayLr {
            min_lr: min_lr()?,
            decay_epoch: decay_epoch()?,
        },
        "polynomial_decay_lr" => LrDecay::PolynomialDecayLr {
            end_learning_rate: min_lr()?,
            decay_epoch: decay_epoch()?,
            power: required(dict, "power")?,
            update_decay_epoch: item(dict, "update_decay_epoch")?.unwrap_or(false),
        },
        "exponential_decay_lr" => LrDecay::ExponentialDecayLr {
            decay_rate: required(dict, "decay_rate")?,
            decay_epoch: decay_epoch()?,
            is_stair: item(dict, "is_stair")?.unwrap_or(false),
        },
        "piecewise_constant_lr" => LrDecay::PiecewiseConstantLr {
            milestone: required(dict, "milestone")?,
            learning_rates: required(dict, "learning_rates")?,
        },
        other => {
            return Err(bad_key(
                "lr_schedule.name",
                format!(
                    "{other} is not one of warmup_lr, cosine_decay_lr, polynomial_decay_lr, \
                     exponential_decay_lr, piecewise_constant_lr"
                ),
            ))
        }
    };
    Ok(LrSchedule {
        learning_rate: required(dict, "learning_rate")?,
        warmup_steps: 0,
        warmup_lr_init: 0.0,
        step_per_epoch: item(dict, "step_per_epoch")?.unwrap_or(1),
        decay,
    })
}

impl Recipe {
    /// The recipe of `dict` (none: the engine's defaults); an unknown key or a value of the
    /// wrong type is a `ValueError` naming the key.
    pub(crate) fn read(dict: Option<&Bound<'_, PyDict>>) -> PyResult<Recipe> {
        let Some(dict) = dict else {
            return Ok(Recipe::default());
        };
        for key in dict.keys() {
            let key: String = key.extract()?;
            if !RECIPE_KEYS.contains(&key.as_str()) {
                return Err(bad_key(
                    &key,
                    format!("unknown (known: {})", RECIPE_KEYS.join(", ")),
                ));
            }
        }
        let schedule = match dict.get_item("lr_schedule")? {
            Some(v) if !v.is_none() => Some(read_schedule(
                v.cast::<PyDict>()
                    .map_err(|_| bad_key("lr_schedule", "must be a dict"))?,
            )?),
            _ => None,
        };
        let max_grad_norm =
            match item::<f64>(dict, "max_grad_norm")? {
                Some(v) => Some(MaxGradNorm::new(v).ok_or_else(|| {
                    bad_key("max_grad_norm", format!("{v} must be finite and > 0"))
                })?),
                None => None,
            };
        let positive = |key: &str| -> PyResult<Option<u64>> {
            match item::<u64>(dict, key)? {
                Some(0) => Err(bad_key(key, "0 is out of range: it must be ≥ 1")),
                v => Ok(v),
            }
        };
        Ok(Recipe {
            schedule,
            no_weight_decay: item(dict, "no_weight_decay")?.unwrap_or_default(),
            max_grad_norm,
            save_checkpoint_steps: positive("save_checkpoint_steps")?,
            save_checkpoint_seconds: positive("save_checkpoint_seconds")?,
            keep_checkpoint_max: positive("keep_checkpoint_max")?.map(|v| v as usize),
        })
    }

    /// Sets the recipe's `[train]` loop and `[output]` keys (clipping, periodic checkpoints).
    pub(crate) fn apply_to_sections(&self, train: &mut TrainLoopConfig, output: &mut OutputConfig) {
        if self.max_grad_norm.is_some() {
            train.max_grad_norm = self.max_grad_norm;
        }
        output.save_checkpoint_steps = self.save_checkpoint_steps;
        output.save_checkpoint_seconds = self.save_checkpoint_seconds;
        if let Some(keep) = self.keep_checkpoint_max {
            output.keep_checkpoint_max = keep;
        }
    }

    /// `config` with the recipe's schedule and weight-decay filter (checked by the engine).
    pub(crate) fn apply(self, config: TrainConfig) -> PyResult<TrainConfig> {
        let config = config.with_weight_decay_filter(WeightDecayFilter {
            excluded: self.no_weight_decay,
        });
        match self.schedule {
            Some(schedule) => config.with_lr_schedule(schedule).map_err(runtime_err),
            None => Ok(config),
        }
    }
}
