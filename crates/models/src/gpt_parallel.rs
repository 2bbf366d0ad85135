//! The GPT's op strategies from a MindFormers-style parallel config.
//!
//! Megatron-LM's layout, as MindFormers' GPT cells set it from `parallel_config`:
//! - the fused QKV projection and `fc1` are column parallel (output features split over
//!   `model_parallel`), so attention runs with its heads split over `model_parallel`;
//! - the attention output projection and `fc2` are row parallel (input features split), so
//!   their outputs are pending sums, all-reduced where they rejoin the residual stream;
//! - every op splits the batch over `data_parallel`;
//! - `vocab_emb_dp = false` splits the embedding table's rows and the LM head's vocabulary over
//!   `model_parallel` (vocabulary parallel); `true` keeps them whole (data parallel);
//! - `use_seq_parallel` splits the sequence dim of the residual stream (LayerNorms, dropouts,
//!   residual adds, biases of row-parallel layers) over `model_parallel`, so the row-parallel
//!   sums become reduce-scatters and the column-parallel inputs all-gathers.
//!
//! The MoE blocks' strategies (experts split over `expert_parallel`) are
//! [`crate::moe_parallel`]'s.
//!
//! Strategies are keyed by op name; [`GptParallel::strategies`] gives one for every forward op of
//! a built GPT graph, found by the name's last components, so optional ops (dropout) need no
//! special case.

use std::collections::BTreeMap;

use graph::{Graph, NodeRole};
use parallel::OpStrategy;

use crate::error::ModelsError;
use crate::gpt::GptConfig;

/// `[parallel]`'s MindFormers keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptParallel {
    /// Batch shards (`parallel.data_parallel`).
    pub data_parallel: usize,
    /// Tensor-parallel shards of heads and features (`parallel.model_parallel`).
    pub model_parallel: usize,
    /// Keep the embedding table and LM head whole (`parallel.vocab_emb_dp`).
    pub vocab_emb_dp: bool,
    /// Split the residual stream's sequence dim over `model_parallel`
    /// (`parallel.use_seq_parallel`).
    pub use_seq_parallel: bool,
    /// Expert-parallel shards of the MoE blocks' experts (`parallel.expert_parallel`, 1 unless
    /// set by [`GptParallel::with_expert_parallel`]).
    pub expert_parallel: usize,
}

fn config_error(key: &str, reason: String) -> ModelsError {
    ModelsError::Config {
        key: key.to_string(),
        reason,
    }
}

impl GptParallel {
    /// The parallel config on `devices` devices: `data_parallel` defaults to
    /// `devices / model_parallel`; when given, `data_parallel × model_parallel` must equal
    /// `devices`, unless `model_parallel` is 1: then every device is a data-parallel shard.
    pub fn resolve(
        devices: usize,
        data_parallel: Option<usize>,
        model_parallel: usize,
        vocab_emb_dp: bool,
        use_seq_parallel: bool,
    ) -> Result<GptParallel, ModelsError> {
        if model_parallel == 0 || !devices.is_multiple_of(model_parallel) {
            return Err(config_error(
                "parallel.model_parallel",
                format!("{model_parallel} does not divide the {devices} devices"),
            ));
        }
        // With no model parallelism every device is a data-parallel shard, whatever
        // `data_parallel` says (the rest is data parallel).
        let data_parallel = match data_parallel {
            _ if model_parallel == 1 => devices,
            Some(dp) => dp,
            None => devices / model_parallel,
        };
        if data_parallel * model_parallel != devices {
            return Err(config_error(
                "parallel.data_parallel",
                format!(
                    "data_parallel × model_parallel = {data_parallel} × {model_parallel} must equal the {devices} devices"
                ),
            ));
        }
        Ok(GptParallel {
            data_parallel,
            model_parallel,
            vocab_emb_dp,
            use_seq_parallel,
            expert_parallel: 1,
        })
    }

    /// Checks that the splits divide the model's sizes; errors name the key and the size.
    pub fn check(&self, c: &GptConfig) -> Result<(), ModelsError> {
        let (dp, mp) = (self.data_parallel, self.model_parallel);
        let mut rules = vec![
            ("data.batch_size", c.batch, dp, "data_parallel"),
            ("model.heads", c.heads, mp, "model_parallel"),
            ("model.ffn_hidden", c.ffn_hidden, mp, "model_parallel"),
        ];
        if !self.vocab_emb_dp {
            rules.push((
                "the vocabulary size",
                c.vocab_size,
                mp,
                "model_parallel (vocab_emb_dp = false)",
            ));
        }
        if self.use_seq_parallel {
            rules.push((
                "model.seq_len",
                c.seq_len,
                mp,
                "model_parallel (use_seq_parallel)",
            ));
        }
        crate::moe_parallel::check(self, c)?;
        for (key, size, split, by) in rules {
            if size % split != 0 {
                return Err(config_error(
                    key,
                    format!("{size} is not divisible by parallel.{by} = {split}"),
                ));
            }
        }
        Ok(())
    }

    /// The dataset strategy: `input_ids` and `labels` split over `data_parallel` by rows.
    pub fn dataset_strategy(&self) -> Vec<Vec<usize>> {
        vec![vec![self.data_parallel, 1], vec![self.data_parallel, 1]]
    }

    /// A strategy for every forward op of `graph` (a GPT built by [`crate::gpt()`]) with
    /// inputs, by op name.
    pub fn strategies(&self, graph: &Graph) -> Result<BTreeMap<String, OpStrategy>, ModelsError> {
        let mut out = BTreeMap::new();
        // The vocabulary-parallel loss's ops, when the graph has them (scope `loss`).
        let v = if self.vocab_emb_dp {
            1
        } else {
            self.model_parallel
        };
        let loss_ops: BTreeMap<String, Vec<Vec<usize>>> =
            graph::vocab_parallel_cross_entropy_strategies("loss", self.data_parallel, v)
                .into_iter()
                .collect();
        for node in graph.nodes() {
            if node.role != NodeRole::Forward || node.inputs.is_empty() {
                continue;
            }
            let strategy = loss_ops
                .get(&node.name)
                .cloned()
                .or_else(|| self.strategy_of(&node.name))
                .or_else(|| self.moe_strategy_of(&node.name));
            let strategy = strategy.ok_or_else(|| {
                config_error(
                    "model.name",
                    format!(
                        "the GPT has an op {:?} without a default strategy",
                        node.name
                    ),
                )
            })?;
            out.insert(node.name.clone(), OpStrategy::from_tuples(strategy, None));
        }
        Ok(out)
    }

    /// The strategy of the GPT op named `name`.
    fn strategy_of(&self, name: &str) -> Option<Vec<Vec<usize>>> {
        let (dp, mp) = (self.data_parallel, self.model_parallel);
        // The residual stream's sequence split, and the vocabulary split.
        let s = if self.use_seq_parallel { mp } else { 1 };
        let v = if self.vocab_emb_dp { 1 } else { mp };
        let stream = vec![dp, s, 1];
        let heads4 = vec![dp, mp, 1, 1];
        let tail: Vec<&str> = name.rsplitn(3, '.').collect();
        let last = tail.first().copied()?;
        let parent = tail.get(1).copied().unwrap_or("");
        let strategy = match (parent, last) {
            ("embedding", "gather") => vec![vec![v, 1], vec![dp, 1]],
            ("embed", "add") => vec![stream.clone(), vec![s, 1]],
            (_, "layer_norm") => vec![stream.clone(), vec![1], vec![1]],
            ("qkv" | "fc1", "matmul") => vec![vec![dp, 1, 1], vec![mp, 1]],
            ("qkv" | "fc1", "bias_add") => vec![vec![dp, 1, mp], vec![mp]],
            ("fc1", "gelu") => vec![vec![dp, 1, mp]],
            ("proj" | "fc2", "matmul") => vec![vec![dp, 1, mp], vec![1, mp]],
            ("proj" | "fc2", "bias_add") => vec![stream.clone(), vec![1]],
            ("attn", "split_heads") => vec![vec![dp, 1, mp]],
            ("attn", "qkv_split" | "q_t" | "k_t" | "v_t" | "merge_heads") => {
                vec![vec![dp, 1, mp, 1]]
            }
            ("attn", "scores" | "context") => vec![heads4.clone(), heads4],
            ("attn", "masked") => vec![heads4, vec![1, 1]],
            ("attn", "softmax" | "attn_dropout" | "context_t") => vec![heads4],
            (_, "resid_dropout" | "dropout") => vec![stream],
            (_, "residual1" | "residual2") => vec![stream.clone(), stream],
            ("lm_head", "matmul") => vec![vec![dp, 1, 1], vec![v, 1]],
            (_, "logits") => vec![vec![dp, 1, v]],
            (_, "logits_f32") => vec![vec![dp, v]],
            (_, "labels_flat") => vec![vec![dp, 1]],
            ("", "loss") => vec![vec![dp, 1], vec![dp]],
            _ => return None,
        };
        Some(strategy)
    }
}
