//! `[train]`: the optimizer and the training loop's keys (epochs, accumulation, precision,
//! evaluation, clipping, logging); the LR schedule's keys are read by `config::lr`.

use std::path::Path;

use exec::{LossScale, OptimizerConfig, OptimizerKind, Precision};
use toml::Value;

use super::{check_unused, checked, Check};
use crate::config::values::{
    check_grad_accumulation_steps, config_error, path_reader, read_bool, read_count, read_enum,
    read_float, read_positive, wrong_type, Section,
};
use crate::config::{OutputConfig, TrainLoopConfig};
use crate::error::RuntimeError;
use exec::clip::MaxGradNorm;

/// `[train]`'s keys.
pub(in crate::config) const TRAIN_KEYS: &[&str] = &[
    "epochs",
    "max_steps",
    "grad_accumulation_steps",
    "optimizer",
    "learning_rate",
    "weight_decay",
    "momentum",
    "use_nesterov",
    "use_amsgrad",
    "beta1",
    "beta2",
    "eps",
    "no_weight_decay",
    "lr_schedule",
    "warmup_steps",
    "warmup_lr_init",
    "min_lr",
    "decay_steps",
    "num_cycles",
    "step_per_epoch",
    "warmup_epoch",
    "decay_epoch",
    "power",
    "update_decay_epoch",
    "decay_rate",
    "is_stair",
    "milestone",
    "learning_rates",
    "seed",
    "deterministic",
    "eval",
    "eval_interval",
    "per_print_times",
    "print_local_norm",
    "dump_local_norm",
    "dump_local_norm_path",
    "precision",
    "loss_scale",
    "parameter_broadcast",
    "lazy_init",
    "threads_per_rank",
    "max_grad_norm",
    "elastic",
    "elastic_interval",
];

/// The optimizer keys of `[train]`; keys of other optimizers are left in `s` and reported as
/// having no effect.
pub(super) fn read_optimizer(
    s: &mut Section,
    warnings: &mut Vec<String>,
) -> Result<OptimizerConfig, RuntimeError> {
    let names = ["sgd", "momentum", "adam", "adamw", "mint_adamw", "lamb"];
    let name = s.require("optimizer", |key, v| {
        read_enum(key, v, &names, |t| names.iter().copied().find(|n| *n == t))
    })?;
    let learning_rate = s.require("learning_rate", read_float)?;
    // mint.optim.AdamW's default weight decay is 1e-2; the MindSpore nn optimizers' is 0.
    let default_weight_decay = if name == "mint_adamw" { 1e-2 } else { 0.0 };
    let weight_decay = s.or("weight_decay", default_weight_decay, read_float)?;
    let kind = match name {
        "sgd" => OptimizerKind::Sgd,
        "momentum" => OptimizerKind::Momentum {
            momentum: s.require("momentum", read_float)?,
            use_nesterov: s.or("use_nesterov", false, read_bool)?,
        },
        _ => {
            // MindSpore's defaults: nn.Adam and mint.optim.AdamW eps 1e-8,
            // nn.AdamWeightDecay and nn.Lamb eps 1e-6.
            let default_eps = if matches!(name, "adamw" | "lamb") {
                1e-6
            } else {
                1e-8
            };
            let beta1 = s.or("beta1", 0.9, read_float)?;
            let beta2 = s.or("beta2", 0.999, read_float)?;
            let eps = s.or("eps", default_eps, read_float)?;
            match name {
                "adam" => OptimizerKind::Adam {
                    beta1,
                    beta2,
                    eps,
                    use_amsgrad: s.or("use_amsgrad", false, read_bool)?,
                    use_nesterov: s.or("use_nesterov", false, read_bool)?,
                },
                "adamw" => OptimizerKind::AdamW { beta1, beta2, eps },
                "lamb" => OptimizerKind::Lamb { beta1, beta2, eps },
                _ => OptimizerKind::MintAdamW { beta1, beta2, eps },
            }
        }
    };
    // The keys of the other rules: checked by the rule that reads them, then reported.
    let hyperparameter = |key: &str, v| {
        let x = read_float(key, v)?;
        let short = key.strip_prefix("train.").unwrap_or(key);
        OptimizerConfig::check_hyperparameter(short, x).map_err(RuntimeError::from)
    };
    let other_rules: [(&str, Check<'_>); 6] = [
        ("momentum", &hyperparameter),
        ("use_nesterov", &checked(read_bool)),
        ("use_amsgrad", &checked(read_bool)),
        ("beta1", &hyperparameter),
        ("beta2", &hyperparameter),
        ("eps", &hyperparameter),
    ];
    let why = format!("with optimizer \"{name}\"");
    check_unused(s, "train", &other_rules, &why, warnings)?;
    let config = OptimizerConfig {
        kind,
        learning_rate,
        weight_decay,
    };
    config.validate()?;
    Ok(config)
}

/// Reads the rest of `[train]` (after the optimizer and the LR schedule) into the loop config;
/// `output` gives the default dump directory.
pub(super) fn read_train_loop(
    mut s: Section,
    output: &OutputConfig,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<TrainLoopConfig, RuntimeError> {
    let epochs = s.require("epochs", read_positive)?;
    let max_steps = s.or("max_steps", 0, read_count)?;
    let grad_accumulation_steps = s.or("grad_accumulation_steps", 1, |key, v| {
        let n = read_positive(key, v)?;
        check_grad_accumulation_steps(key, n)?;
        Ok(n)
    })?;
    let seed = s.or("seed", 1, read_count)?;
    let deterministic = s.or("deterministic", false, read_bool)?;
    let eval = s.or("eval", true, read_bool)?;
    let eval_interval = s.get("eval_interval", read_positive)?.map(|n| n as u64);
    let parameter_broadcast = s.or("parameter_broadcast", false, read_bool)?;
    let lazy_init = s.or("lazy_init", false, read_bool)?;
    let threads_per_rank = s.or("threads_per_rank", 1, |key, v| {
        let n = read_positive(key, v)?;
        let max = tensor::kernels::threads::MAX_THREADS;
        if n > max {
            return Err(config_error(key, format!("{n} is above {max}")));
        }
        Ok(n)
    })?;
    let max_grad_norm = s.get("max_grad_norm", read_max_grad_norm)?;
    let elastic = s.or("elastic", false, read_bool)?;
    let elastic_interval = s.get("elastic_interval", read_positive)?;
    let elastic = match (elastic, elastic_interval) {
        (true, interval) => Some(interval.map_or(crate::elastic::DEFAULT_INTERVAL, |n| n as u64)),
        (false, Some(_)) => {
            warnings.push(
                "train.elastic_interval has no effect unless train.elastic = true".to_string(),
            );
            None
        }
        (false, None) => None,
    };
    let per_print_times = s.or("per_print_times", 1, read_count)?;
    let print_local_norm = s.or("print_local_norm", false, read_bool)?;
    let dump = s.or("dump_local_norm", false, read_bool)?;
    let dump_path = s.get("dump_local_norm_path", path_reader(base))?;
    let dump_local_norm = match (dump, dump_path) {
        (true, Some(path)) => Some(path),
        (true, None) => Some(output.dir.join("local_norm")),
        (false, Some(_)) => {
            warnings.push(
                "train.dump_local_norm_path has no effect unless train.dump_local_norm = true"
                    .to_string(),
            );
            None
        }
        (false, None) => None,
    };
    let precision = s.or("precision", Precision::F32, |key, v| {
        read_enum(key, v, &["f32", "bf16", "f16"], Precision::parse)
    })?;
    let loss_scale = s.get("loss_scale", |key, v| match v {
        Value::String(text) if text == "dynamic" => Ok(LossScale::Dynamic),
        Value::Integer(n) if n >= 1 => Ok(LossScale::Static(n as f64)),
        Value::Float(x) if x.is_finite() && x >= 1.0 => Ok(LossScale::Static(x)),
        other => Err(wrong_type(key, "\"dynamic\" or a number ≥ 1", &other)),
    })?;
    let loss_scale = match (precision, loss_scale) {
        // f16's range needs a scale: dynamic unless one is given.
        (Precision::F16, None) => Some(LossScale::Dynamic),
        (Precision::F32, Some(_)) => {
            warnings
                .push("train.loss_scale has no effect with train.precision = \"f32\"".to_string());
            None
        }
        (_, given) => given,
    };
    Ok(TrainLoopConfig {
        epochs,
        max_steps: (max_steps > 0).then_some(max_steps),
        grad_accumulation_steps,
        seed,
        deterministic,
        eval,
        eval_interval,
        per_print_times,
        print_local_norm,
        dump_local_norm,
        precision,
        loss_scale,
        parameter_broadcast,
        lazy_init,
        threads_per_rank,
        max_grad_norm,
        elastic,
    })
}

/// `train.max_grad_norm`: a finite number > 0.
fn read_max_grad_norm(key: &str, value: Value) -> Result<MaxGradNorm, RuntimeError> {
    let norm = read_float(key, value)?;
    MaxGradNorm::new(norm).ok_or_else(|| {
        config_error(
            key,
            format!("{norm} is not a clipping norm: it must be a finite number > 0 (the global gradient norm is clipped to it)"),
        )
    })
}
