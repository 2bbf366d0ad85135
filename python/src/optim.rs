//! The engine's optimizers under MindSpore's class names (`tessera.nn` optimizers).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runtime::{OptimizerConfig, OptimizerKind};

/// The optimizer named as MindSpore's class (`SGD`, `Momentum`, `Adam`, `AdamWeightDecay`).
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
        other => {
            return Err(PyValueError::new_err(format!(
                "optimizer {other} is not supported (SGD, Momentum, Adam, AdamWeightDecay)"
            )))
        }
    };
    Ok(OptimizerConfig {
        kind,
        learning_rate,
        weight_decay,
    })
}
