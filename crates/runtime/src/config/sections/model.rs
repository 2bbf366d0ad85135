//! `[model]`: which built-in network, its widths, and the GPT's keys.

use super::moe::read_moe;
use super::{check_unused, checked, Check};
use crate::config::values::{
    config_error, read_bool, read_enum, read_positive, read_unit_fraction, Section,
};
use crate::config::{DataConfig, GptKeys, ModelConfig, ModelName};
use crate::error::RuntimeError;

/// `[model]`'s keys.
pub(in crate::config) const MODEL_KEYS: &[&str] = &[
    "name",
    "hidden",
    "classes",
    "layers",
    "heads",
    "seq_len",
    "ffn_hidden",
    "dropout",
    "tie_embeddings",
    "fused_attention",
    "moe",
];

/// Reads `[model]`; the keys of the other models are checked as where they act, then reported
/// in `warnings` and dropped.
pub(super) fn read_model(
    mut s: Section,
    warnings: &mut Vec<String>,
) -> Result<ModelConfig, RuntimeError> {
    let name = s.or("name", ModelName::SeedMlp, |key, v| {
        read_enum(key, v, &["seed_mlp", "gpt", "embedding_bag"], |t| match t {
            "seed_mlp" => Some(ModelName::SeedMlp),
            "gpt" => Some(ModelName::Gpt),
            "embedding_bag" => Some(ModelName::EmbeddingBag),
            _ => None,
        })
    })?;
    let hidden = s.require("hidden", read_positive)?;
    if name != ModelName::Gpt {
        // The keys only the GPT reads.
        let gpt_keys: [(&str, Check<'_>); 8] = [
            ("layers", &checked(read_positive)),
            ("heads", &checked(read_positive)),
            ("seq_len", &checked(read_positive)),
            ("ffn_hidden", &checked(read_positive)),
            ("dropout", &checked(read_unit_fraction)),
            ("tie_embeddings", &checked(read_bool)),
            ("fused_attention", &checked(read_bool)),
            ("moe", &checked(read_moe)),
        ];
        check_unused(
            &mut s,
            "model",
            &gpt_keys,
            "unless model.name = \"gpt\"",
            warnings,
        )?;
        let classes = s.require("classes", read_positive)?;
        // Checked before any graph is built: the hidden layer's weights are hidden × hidden
        // and hidden × classes elements.
        let largest = (hidden as u128) * (hidden.max(classes) as u128);
        if largest > models::gpt::MAX_ELEMENTS {
            let key = match hidden >= classes {
                true => "model.hidden",
                false => "model.classes",
            };
            return Err(config_error(
                key,
                format!(
                    "a weight of {hidden} × {} = {largest} elements (model.hidden {hidden}, model.classes {classes}) exceeds the {}-element bound",
                    hidden.max(classes),
                    models::gpt::MAX_ELEMENTS
                ),
            ));
        }
        return Ok(ModelConfig {
            name,
            hidden,
            classes,
            gpt: None,
        });
    }
    check_unused(
        &mut s,
        "model",
        &[("classes", &checked(read_positive))],
        "for the GPT (its classes are the vocabulary, from the data)",
        warnings,
    )?;
    let dropout = s.or("dropout", 0.0, read_unit_fraction)?;
    // On by default without dropout: once its slices ran on the widest vector unit the fused
    // op took the bench GPT's step (128 tokens) from 305 to 243 ms against the unfused ops
    // (docs/PERFORMANCE.md), and it saves the [S, S] buffers; ring attention needs it. It has
    // no dropout on the attention weights: asking for it with dropout is an error rather than
    // ignored, and with dropout the default is the unfused ops.
    let fused_attention = s.or("fused_attention", dropout == 0.0, read_bool)?;
    if fused_attention && dropout > 0.0 {
        return Err(config_error(
            "model.fused_attention",
            format!(
                "the fused attention has no dropout on the attention weights, but model.dropout \
                 = {dropout}: set model.fused_attention = false or model.dropout = 0"
            ),
        ));
    }
    let gpt = GptKeys {
        layers: s.require("layers", read_positive)?,
        heads: s.require("heads", read_positive)?,
        seq_len: s.require("seq_len", read_positive)?,
        ffn_hidden: s.or("ffn_hidden", hidden.saturating_mul(4), read_positive)?,
        dropout,
        tie_embeddings: s.or("tie_embeddings", true, read_bool)?,
        fused_attention,
        moe: s.get("moe", read_moe)?,
    };
    if hidden % gpt.heads != 0 {
        return Err(config_error(
            "model.heads",
            format!("{} heads do not divide model.hidden = {hidden}", gpt.heads),
        ));
    }
    Ok(ModelConfig {
        name,
        hidden,
        classes: 0,
        gpt: Some(gpt),
    })
}

/// The GPT trains on the text formats, the MLP on images.
pub(super) fn check_model_data(model: &ModelConfig, data: &DataConfig) -> Result<(), RuntimeError> {
    let text = data.text.is_some();
    match (model.name, text) {
        (ModelName::Gpt, false) => Err(config_error(
            "data.format",
            format!(
                "the GPT trains on text: set data.format = \"text\" or \"tokens\" (got \"{}\")",
                data.format.name()
            ),
        )),
        (ModelName::SeedMlp | ModelName::EmbeddingBag, true) => Err(config_error(
            "data.format",
            format!(
                "\"{}\" data needs model.name = \"gpt\" (the seed MLP and the embedding bag classify images)",
                data.format.name()
            ),
        )),
        _ => Ok(()),
    }
}
