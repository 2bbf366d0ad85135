//! The GPT both sweeps draw: its sizes, dropout, attention kernel and experts.

use crate::{Config, Rng};

/// A drawn GPT's sizes and switches, which a layout must fit.
pub(crate) struct GptModel {
    /// Attention heads.
    pub heads: usize,
    /// Tokens per sample.
    pub seq_len: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// The feed-forward width.
    pub ffn: usize,
    /// Whether dropout is on (ring attention does not run it).
    pub dropout: bool,
    /// Whether the unfused attention is asked for (ring attention runs the fused one only).
    pub unfused: bool,
    /// The experts of its mixture-of-experts blocks, if any.
    pub experts: Option<usize>,
}

/// Draws a GPT of 1 to `max_layers` blocks into `c`'s `model.` keys.
pub(crate) fn draw_gpt_model(rng: &mut Rng, c: &mut Config, max_layers: usize) -> GptModel {
    let heads: usize = rng.pick(&[1, 2, 3, 4, 6, 8, 2, 4]);
    let widths: Vec<usize> = (16..=64usize)
        .step_by(4)
        .filter(|&h| h.is_multiple_of(heads))
        .collect();
    let hidden = rng.pick(&widths);
    let seq_len: usize = rng.pick(&[8, 9, 12, 15, 16, 20, 24, 32]);
    let layers = rng.range(1, max_layers);
    c.set_str("model.name", "gpt");
    c.set("model.layers", layers);
    c.set("model.heads", heads);
    c.set("model.hidden", hidden);
    c.set("model.seq_len", seq_len);
    c.set("model.tie_embeddings", rng.chance(0.7));
    let dropout = rng.chance(0.25);
    let mut unfused = false;
    if dropout {
        c.set("model.dropout", "0.1");
    } else if rng.chance(0.25) {
        c.set("model.fused_attention", false);
        unfused = true;
    }
    let mut ffn = 4 * hidden;
    if rng.chance(0.3) {
        ffn = rng.pick(&[24, 48, 64, 96]);
        c.set("model.ffn_hidden", ffn);
    }
    let experts: Option<usize> = rng.chance(0.25).then(|| rng.pick(&[2, 4, 8]));
    if let Some(experts) = experts {
        c.set("model.moe.experts", experts);
        c.set("model.moe.top_k", rng.pick(&[1, 2]));
        let every = if layers > 1 { rng.pick(&[1, 1, 2]) } else { 1 };
        c.set("model.moe.every", every);
        if rng.chance(0.3) {
            c.set("model.moe.capacity_factor", rng.pick(&["1.0", "2.0"]));
        }
        if rng.chance(0.3) {
            c.set("model.moe.shared_expert", true);
        }
    }
    GptModel {
        heads,
        seq_len,
        layers,
        ffn,
        dropout,
        unfused,
        experts,
    }
}
