//! `[model.moe]`: the GPT's mixture-of-experts blocks (`models::moe`).

use models::MoeConfig;
use toml::Value;

use crate::config::values::{config_error, read_bool, read_float, read_positive, Section};
use crate::error::RuntimeError;

/// `[model.moe]`'s keys.
pub(in crate::config) const MOE_KEYS: &[&str] = &[
    "experts",
    "top_k",
    "capacity_factor",
    "aux_loss_coeff",
    "shared_expert",
    "every",
];

/// Reads `[model.moe]` (`key` is `model.moe`): `experts` is required, the rest default to
/// [`MoeConfig::new`]'s values (`top_k` 1). Every range is checked; errors name the key.
pub(super) fn read_moe(key: &str, value: Value) -> Result<MoeConfig, RuntimeError> {
    let mut s = Section::new(key, value, MOE_KEYS)?;
    // One rule for every value below 2 (0 and negatives included): `MoeConfig::validate`'s.
    let experts = s.require("experts", |key, value| match value {
        Value::Integer(n) if n < 2 => Err(config_error(
            key,
            format!("{n} is out of range: it must be ≥ 2"),
        )),
        value => read_positive(key, value),
    })?;
    let defaults = MoeConfig::new(experts, 1);
    let moe = MoeConfig {
        experts,
        top_k: s.or("top_k", defaults.top_k, read_positive)?,
        capacity_factor: s.or("capacity_factor", defaults.capacity_factor, read_float)?,
        aux_loss_coeff: s.or("aux_loss_coeff", defaults.aux_loss_coeff, read_float)?,
        shared_expert: s.or("shared_expert", defaults.shared_expert, read_bool)?,
        every: s.or("every", defaults.every, read_positive)?,
    };
    moe.validate()?;
    Ok(moe)
}
