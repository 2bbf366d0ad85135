//! A decoder-only transformer (GPT-2's shape): learned token and position embeddings,
//! pre-LayerNorm blocks of causal multi-head attention and a GeLU MLP, a final LayerNorm and an
//! LM head that shares the token embedding table unless `tie_embeddings` is off.
//!
//! Every op and parameter has a hierarchical name (`blocks.3.attn.qkv.matmul`,
//! `blocks.3.mlp.fc1.weight`); `docs/CONFIG.md` lists them. The attention is laid out as
//! Megatron-LM lays it out, so that splitting the fused QKV projection's output features over
//! `model_parallel` splits the heads: its output features are ordered `(head, q|k|v, head_dim)`,
//! its output `[B, S, 3·H]` is reshaped to `[B, S, heads, 3·head_dim]` (a split of the last dim
//! becomes a split of the heads) and cut into `q`, `k`, `v` along the last dim, or, with
//! `packed_attention`, read where it lies by one `PackedAttention` op.

use graph::models::Model;
use graph::nn::{Activation, Dense, LayerNorm};
use graph::{GraphBuilder, GraphError, Initializer, ValueId};
use tensor::DType;

use crate::error::ModelsError;
use crate::moe::{self, MoeConfig, MoeShape};

/// The shape of a GPT: `[model]`'s keys plus the vocabulary (from the data) and the global
/// batch.
#[derive(Debug, Clone, PartialEq)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block.
    pub heads: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Tokens per sequence (the context length).
    pub seq_len: usize,
    /// Width of the MLP's hidden layer (GPT-2: `4·hidden`).
    pub ffn_hidden: usize,
    /// Probability of dropping an activation (embeddings, attention weights, residual
    /// branches); 0 disables dropout.
    pub dropout: f64,
    /// The LM head multiplies by the token embedding table instead of its own weight.
    pub tie_embeddings: bool,
    /// Attention as one fused `FlashAttention` op (`attn.flash`: the `[S, S]` scores are never
    /// materialised) instead of `scores`, `causal_mask`, `masked`, `softmax` and `context`.
    /// Only without dropout: the fused op has none on the attention weights, so with
    /// `dropout > 0` the unfused ops are built whatever this says.
    pub fused_attention: bool,
    /// The fused attention reads the QKV projection's output where it lies (`PackedAttention`
    /// over `[B, S, heads, 3·head_dim]`, writing `[B, S, heads, head_dim]`) instead of cutting
    /// it into `q`, `k` and `v` and transposing them and the context (`FlashAttention` over
    /// `[B, heads, S, head_dim]`): the same bits with four copies fewer per block, forward and
    /// backward. Ring attention needs `false`: it runs `FlashAttention` on the split sequence
    /// (Ulysses moves `qkv` to the head split whole and runs this one).
    pub packed_attention: bool,
    /// Sequences per global batch.
    pub batch: usize,
    /// Compute the loss as the vocabulary-parallel cross entropy (scope `loss`, see
    /// `GraphBuilder::vocab_parallel_cross_entropy`), which keeps logits split on the vocabulary
    /// (no all-gather); the same value as the fused op otherwise used.
    pub vocab_parallel_loss: bool,
    /// `[model.moe]`: MoE blocks in place of the MLPs ([`crate::moe`]); `None`: dense MLPs.
    pub moe: Option<MoeConfig>,
}

impl GptConfig {
    /// A GPT of `layers` blocks, `heads` heads and width `hidden` over `seq_len` tokens of a
    /// `vocab_size` vocabulary, with GPT-2's defaults: `ffn_hidden = 4·hidden`, no dropout, tied
    /// embeddings; the fused attention.
    pub fn new(
        vocab_size: usize,
        layers: usize,
        heads: usize,
        hidden: usize,
        seq_len: usize,
        batch: usize,
    ) -> GptConfig {
        GptConfig {
            vocab_size,
            layers,
            heads,
            hidden,
            seq_len,
            ffn_hidden: 4 * hidden,
            dropout: 0.0,
            tie_embeddings: true,
            fused_attention: true,
            packed_attention: true,
            batch,
            vocab_parallel_loss: false,
            moe: None,
        }
    }

    /// Whether the attention is built as one fused op (`fused_attention`, honoured only
    /// without dropout).
    pub fn builds_fused_attention(&self) -> bool {
        self.fused_attention && self.dropout == 0.0
    }

    /// Whether the attention is built as `PackedAttention` (fused and `packed_attention`),
    /// whose sequence dim is never split.
    pub fn builds_packed_attention(&self) -> bool {
        self.builds_fused_attention() && self.packed_attention
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    /// Checks the sizes: every one positive, `hidden` a multiple of `heads`, `dropout` in
    /// `[0, 1)`. Errors name the `model.*` key.
    pub fn validate(&self) -> Result<(), ModelsError> {
        let sizes = [
            ("model.layers", self.layers),
            ("model.heads", self.heads),
            ("model.hidden", self.hidden),
            ("model.seq_len", self.seq_len),
            ("model.ffn_hidden", self.ffn_hidden),
            ("the vocabulary size", self.vocab_size),
            ("data.batch_size", self.batch),
        ];
        for (key, size) in sizes {
            if size == 0 {
                return Err(ModelsError::Config {
                    key: key.to_string(),
                    reason: "0 is out of range: it must be ≥ 1".to_string(),
                });
            }
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(ModelsError::Config {
                key: "model.heads".to_string(),
                reason: format!(
                    "{} heads do not divide model.hidden = {}",
                    self.heads, self.hidden
                ),
            });
        }
        if let Some(moe) = &self.moe {
            moe.validate()?;
            if moe.every > self.layers {
                return Err(ModelsError::Config {
                    key: "model.moe.every".to_string(),
                    reason: format!(
                        "{} makes no block a MoE block: the first is block {} (from 0) and model.layers = {}",
                        moe.every,
                        moe.every - 1,
                        self.layers
                    ),
                });
            }
        }
        let params = self.parameter_count();
        if params > MAX_ELEMENTS {
            return Err(ModelsError::Config {
                key: "model".to_string(),
                reason: format!(
                    "{params} parameters (layers {}, hidden {}, ffn_hidden {}, vocabulary {}, seq_len {}{}) exceed the {MAX_ELEMENTS}-element bound",
                    self.layers,
                    self.hidden,
                    self.ffn_hidden,
                    self.vocab_size,
                    self.seq_len,
                    self.moe.as_ref().map_or(String::new(), |moe| format!(
                        ", model.moe.experts {}",
                        moe.experts
                    )),
                ),
            });
        }
        let activation = self.largest_activation();
        if activation > MAX_ELEMENTS {
            return Err(ModelsError::Config {
                key: "data.batch_size".to_string(),
                reason: format!(
                    "the largest activation ({activation} elements: batch {} × seq_len {} × the widest of ffn_hidden, vocabulary and heads × seq_len) exceeds the {MAX_ELEMENTS}-element bound",
                    self.batch, self.seq_len
                ),
            });
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelsError::Config {
                key: "model.dropout".to_string(),
                reason: format!("{} is out of range: it must be in [0, 1)", self.dropout),
            });
        }
        Ok(())
    }
}

/// The most elements a GPT's parameters (together) or any one of its activations may have:
/// 2^31 (8 GiB of f32). Sizes come from files and flags; they are checked before anything is
/// built.
pub const MAX_ELEMENTS: u128 = 1 << 31;

impl GptConfig {
    /// Parameters in the model (tied or untied head included), computed without overflow.
    pub fn parameter_count(&self) -> u128 {
        let (v, h, s, f, l) = (
            self.vocab_size as u128,
            self.hidden as u128,
            self.seq_len as u128,
            self.ffn_hidden as u128,
            self.layers as u128,
        );
        let block = 4 * (h * h + h) + 4 * h;
        let mlp = (h * f + f) + (f * h + h);
        let mlps: u128 = (0..self.layers)
            .map(|layer| match &self.moe {
                Some(moe) if moe.applies_to(layer) => {
                    moe.parameter_count(self.hidden, self.ffn_hidden)
                }
                _ => mlp,
            })
            .sum();
        let head = if self.tie_embeddings { 0 } else { v * h };
        v * h + s * h + l * block + mlps + 2 * h + head
    }

    /// Elements of the largest activation: `batch × seq_len` times the widest of `ffn_hidden`,
    /// the vocabulary (the logits) and `heads × seq_len` (the attention weights).
    pub fn largest_activation(&self) -> u128 {
        let widest = (self.ffn_hidden as u128)
            .max(self.vocab_size as u128)
            .max(self.heads as u128 * self.seq_len as u128)
            .max(self.hidden as u128);
        // A MoE block's dispatch mask holds experts × capacity per token.
        let slots = self.moe.as_ref().map_or(0, |moe| {
            moe.experts as u128 * moe.capacity(self.seq_len) as u128
        });
        self.batch as u128 * self.seq_len as u128 * widest.max(slots)
    }
}

/// GPT-2's initialiser of weights, `Normal(0.02)`.
fn weight_init() -> Initializer {
    Initializer::normal(0.02)
}

/// A dense layer `[in → out]` with a zero bias and GPT-2's weight init.
fn dense(in_features: usize, out_features: usize, std: f64) -> Dense {
    Dense {
        weight_init: Initializer::normal(std),
        bias_init: Initializer::Zeros,
        ..Dense::new(in_features, out_features)
    }
}

/// GPT-2's MLP on `x [..., hidden]` in the current scope: `fc1` (`hidden → ffn_hidden`, tanh
/// GeLU), then `fc2` (`ffn_hidden → hidden`, its weight drawn with `out_std`).
pub(crate) fn mlp(
    b: &mut GraphBuilder,
    hidden: usize,
    ffn_hidden: usize,
    out_std: f64,
    x: ValueId,
) -> Result<ValueId, GraphError> {
    let fc1 = Dense {
        activation: Some(Activation::Gelu { approximate: true }),
        ..dense(hidden, ffn_hidden, 0.02)
    };
    let h = b.call("fc1", &fc1, x)?;
    b.call("fc2", &dense(ffn_hidden, hidden, out_std), h)
}

/// GPT's LayerNorm (epsilon 1e-5, as GPT-2).
fn layer_norm(hidden: usize) -> LayerNorm {
    LayerNorm {
        normalized_size: hidden,
        epsilon: 1e-5,
    }
}

/// Builds the GPT: inputs `input_ids [batch, seq_len]` and `labels [batch, seq_len]` (i32, the
/// next token of every position); outputs the mean cross-entropy `loss` and the `logits
/// [batch·seq_len, vocab]`. Parameters and activations are `dtype` (f32 for training, f64 for
/// gradient checks, bf16 or f16 for mixed precision, where the logits are cast to f32 for the
/// loss and the outputs are f32).
pub fn gpt(config: &GptConfig, dtype: DType) -> Result<Model, ModelsError> {
    config.validate()?;
    Ok(build(config, dtype)?)
}

fn build(c: &GptConfig, dtype: DType) -> Result<Model, GraphError> {
    let mut b = GraphBuilder::with_float_dtype(dtype);
    let (batch, seq, hidden) = (c.batch, c.seq_len, c.hidden);
    let ids = b.input("input_ids", &[batch, seq], DType::I32)?;
    let labels = b.input("labels", &[batch, seq], DType::I32)?;
    let keep = 1.0 - c.dropout;
    let mut seeds = 0u64;
    let mut dropout = |b: &mut GraphBuilder, name: &str, x: ValueId| {
        seeds += 1;
        if keep < 1.0 {
            b.dropout(name, x, keep, seeds)
        } else {
            Ok(x)
        }
    };
    let (table, tokens) = b.scope("embedding", |b| {
        let table = b.parameter("embedding_table", &[c.vocab_size, hidden], weight_init())?;
        Ok((table, b.embedding("gather", table, ids)?))
    })?;
    let positions = b.parameter(
        "position_embedding.embedding_table",
        &[seq, hidden],
        Initializer::normal(0.01),
    )?;
    let mut x = b.add("embed.add", tokens, positions)?;
    x = dropout(&mut b, "embed.dropout", x)?;
    let mut aux_losses = Vec::new();
    for layer in 0..c.layers {
        x = b.scope(&format!("blocks.{layer}"), |b| {
            let h = b.call("ln1", &layer_norm(hidden), x)?;
            let h = attention(b, c, h, &mut dropout)?;
            let x = b.add("residual1", x, h)?;
            let h = b.call("ln2", &layer_norm(hidden), x)?;
            if let Some(moe) = c.moe.as_ref().filter(|m| m.applies_to(layer)) {
                let shape = MoeShape {
                    groups: batch,
                    tokens: seq,
                    hidden,
                    ffn_hidden: c.ffn_hidden,
                    out_std: 0.02 / (2.0 * c.layers as f64).sqrt(),
                };
                let (h, aux) = moe::moe_mlp(b, moe, shape, h)?;
                aux_losses.push(aux);
                let h = dropout(b, "moe.dropout", h)?;
                return b.add("residual2", x, h);
            }
            let h = b.scope("mlp", |b| {
                let out_std = 0.02 / (2.0 * c.layers as f64).sqrt();
                let h = mlp(b, hidden, c.ffn_hidden, out_std, h)?;
                dropout(b, "dropout", h)
            })?;
            b.add("residual2", x, h)
        })?;
    }
    let x = b.call("ln_f", &layer_norm(hidden), x)?;
    let head = if c.tie_embeddings {
        table
    } else {
        b.parameter("lm_head.weight", &[c.vocab_size, hidden], weight_init())?
    };
    let logits = b.batch_matmul("lm_head.matmul", x, head, false, true)?;
    let mut logits = b.reshape("logits", logits, &[batch * seq, c.vocab_size])?;
    if dtype != DType::F32 {
        // Mixed precision: the softmax and the loss in f32, as MindSpore's O2 keeps them.
        logits = b.cast("logits_f32", logits, DType::F32)?;
    }
    let flat_labels = b.reshape("labels_flat", labels, &[batch * seq])?;
    let loss = if c.vocab_parallel_loss {
        b.vocab_parallel_cross_entropy("loss", logits, flat_labels, batch * seq)?
    } else {
        b.sparse_softmax_cross_entropy("loss", logits, flat_labels)?
    };
    let loss = moe::add_aux_losses(&mut b, loss, &aux_losses)?;
    b.output(loss)?;
    b.output(logits)?;
    Ok(Model {
        graph: b.finish(),
        input: ids,
        labels,
        logits,
        loss,
    })
}

/// Causal multi-head self-attention on `x [B, S, H]` in the current scope (`attn.*`).
fn attention(
    b: &mut GraphBuilder,
    c: &GptConfig,
    x: ValueId,
    dropout: &mut impl FnMut(&mut GraphBuilder, &str, ValueId) -> Result<ValueId, GraphError>,
) -> Result<ValueId, GraphError> {
    let (batch, seq, hidden, heads, hd) = (c.batch, c.seq_len, c.hidden, c.heads, c.head_dim());
    b.scope("attn", |b| {
        // One fused projection whose output features are ordered (head, q|k|v, head_dim):
        // `[B, S, 3·H]` → `[B, S, heads, 3·head_dim]` keeps a split of the features as a split
        // of the heads, and the last dim is cut into q, k and v.
        let qkv = b.call("qkv", &dense(hidden, 3 * hidden, 0.02), x)?;
        let qkv = b.reshape("split_heads", qkv, &[batch, seq, heads, 3 * hd])?;
        let scale = 1.0 / (hd as f64).sqrt();
        if c.builds_packed_attention() {
            // One op over the projection's layout: no cut, no transposes.
            let context = b.packed_attention("flash", qkv, true, scale)?.0;
            let context = b.reshape("merge_heads", context, &[batch, seq, hidden])?;
            return projection(b, c, context, dropout);
        }
        let parts = b.split("qkv_split", qkv, 3, &[hd, hd, hd])?;
        let q = b.transpose("q_t", parts[0], &[0, 2, 1, 3])?;
        let k = b.transpose("k_t", parts[1], &[0, 2, 1, 3])?;
        let v = b.transpose("v_t", parts[2], &[0, 2, 1, 3])?;
        let context = if c.builds_fused_attention() {
            // One op, the scores never materialised; it has no dropout on the weights.
            b.flash_attention("flash", (q, k, v), true, scale)?.0
        } else {
            let scores = b.batch_matmul("scores", q, k, false, true)?;
            let mask = b.triu("causal_mask", &[seq, seq], 1)?;
            let scores = b.masked_fill("masked", scores, mask, -1e9)?;
            let probs = b.scaled_softmax("softmax", scores, scale)?;
            let probs = dropout(b, "attn_dropout", probs)?;
            b.batch_matmul("context", probs, v, false, false)?
        };
        let context = b.transpose("context_t", context, &[0, 2, 1, 3])?;
        let context = b.reshape("merge_heads", context, &[batch, seq, hidden])?;
        projection(b, c, context, dropout)
    })
}

/// The attention's output projection of `context [B, S, H]` and its residual dropout.
fn projection(
    b: &mut GraphBuilder,
    c: &GptConfig,
    context: ValueId,
    dropout: &mut impl FnMut(&mut GraphBuilder, &str, ValueId) -> Result<ValueId, GraphError>,
) -> Result<ValueId, GraphError> {
    let out_std = 0.02 / (2.0 * c.layers as f64).sqrt();
    let out = b.call("proj", &dense(c.hidden, c.hidden, out_std), context)?;
    dropout(b, "resid_dropout", out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Elements of every parameter of `graph`.
    pub(crate) fn parameter_elements(graph: &graph::Graph) -> usize {
        graph
            .values()
            .iter()
            .filter(|v| matches!(v.kind, graph::ValueKind::Parameter { .. }))
            .map(|v| v.n_elements())
            .sum()
    }

    #[test]
    fn parameter_count_matches_the_built_graph() {
        for tie in [true, false] {
            let config = GptConfig {
                tie_embeddings: tie,
                ..GptConfig::new(50, 2, 4, 16, 8, 2)
            };
            let model = gpt(&config, DType::F32).unwrap();
            let built = parameter_elements(&model.graph);
            assert_eq!(config.parameter_count(), built as u128, "tie {tie}");
        }
    }

    #[test]
    fn implausible_sizes_are_refused_before_anything_is_built() {
        let huge = GptConfig::new(256, 4, 4, 1 << 20, 64, 16);
        let err = gpt(&huge, DType::F32).unwrap_err().to_string();
        assert!(err.contains("parameters") && err.contains("bound"), "{err}");
        let wide = GptConfig::new(1 << 20, 1, 1, 8, 4096, 64);
        let err = gpt(&wide, DType::F32).unwrap_err().to_string();
        assert!(err.contains("data.batch_size"), "{err}");
        let err = gpt(&GptConfig::new(256, 1, 3, 8, 4, 1), DType::F32).unwrap_err();
        assert!(err.to_string().contains("model.heads"), "{err}");
    }
}
