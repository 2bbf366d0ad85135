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
//!   sums become reduce-scatters and the column-parallel inputs all-gathers;
//! - `context_parallel = N` (a `cp` mesh axis between `dp` and `mp`) splits the sequence of
//!   everything outside the attention core over N ranks: embeddings, LayerNorms, projections,
//!   MLP, LM head and loss. With `context_parallel_algo = "ulysses"` (DeepSpeed-Ulysses) the
//!   attention core runs on the whole sequence with its heads split over `mp × cp`: q, k and v
//!   move from sequence-split to head-split by one all-to-all inside each `cp` group, and the
//!   context back by another (the reshard planner derives both from the layouts). With
//!   `"ring"` the fused attention keeps the sequence split and passes key/value blocks around
//!   each `cp` ring (`exec::ring`).
//!
//! The MoE blocks' strategies (experts split over `expert_parallel`) are
//! [`crate::moe_parallel`]'s.
//!
//! Strategies are keyed by op name; [`GptParallel::strategies`] gives one for every forward op of
//! a built GPT graph, found by the name's last components, so optional ops (dropout) need no
//! special case.

use std::collections::BTreeMap;

use graph::{Graph, NodeRole, Op};
use layout::{DimSpec, Layout};
use parallel::OpStrategy;

use crate::error::ModelsError;
use crate::gpt::GptConfig;

/// How attention runs when the sequence is split over `context_parallel` ranks
/// (`parallel.context_parallel_algo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContextParallelAlgo {
    /// DeepSpeed-Ulysses: an all-to-all from sequence-split to head-split q, k, v (and back for
    /// the context); needs `heads` divisible by `model_parallel × context_parallel`.
    #[default]
    Ulysses,
    /// Ring attention: q, k and v stay split on the sequence; the fused attention passes the
    /// key/value blocks around the `cp` ring (`exec::ring`); any `context_parallel` dividing
    /// the sequence, whatever the heads. Needs `model.fused_attention`.
    Ring,
}

impl ContextParallelAlgo {
    /// Whether the attention core sees every position of its sequences with the sequence
    /// split over `context_parallel` ranks: without context parallel, or with Ulysses (which
    /// splits the heads instead); the ring keeps the sequence split. The packed attention
    /// (`GptConfig::packed_attention`) needs it.
    pub fn keeps_the_sequence_whole(self, context_parallel: usize) -> bool {
        context_parallel == 1 || self == ContextParallelAlgo::Ulysses
    }

    /// The config spellings, in declaration order.
    pub const NAMES: [&'static str; 2] = ["ulysses", "ring"];

    /// Parses a config spelling.
    pub fn parse(text: &str) -> Option<ContextParallelAlgo> {
        match text {
            "ulysses" => Some(ContextParallelAlgo::Ulysses),
            "ring" => Some(ContextParallelAlgo::Ring),
            _ => None,
        }
    }
}

/// `[parallel]`'s MindFormers keys as written, before they are resolved against the device
/// count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptParallelKeys {
    /// `parallel.data_parallel` (default: the devices over `model_parallel × context_parallel`).
    pub data_parallel: Option<usize>,
    /// `parallel.model_parallel` (default 1).
    pub model_parallel: usize,
    /// `parallel.context_parallel` (default 1).
    pub context_parallel: usize,
    /// `parallel.context_parallel_algo` (default Ulysses).
    pub context_parallel_algo: ContextParallelAlgo,
    /// `parallel.vocab_emb_dp` (default true).
    pub vocab_emb_dp: bool,
    /// `parallel.use_seq_parallel` (default false).
    pub use_seq_parallel: bool,
    /// `parallel.expert_parallel` (default 1): shards of the MoE experts, taken from the
    /// data-parallel ranks ([`crate::moe_parallel`]).
    pub expert_parallel: usize,
}

impl Default for GptParallelKeys {
    fn default() -> Self {
        GptParallelKeys {
            data_parallel: None,
            model_parallel: 1,
            context_parallel: 1,
            context_parallel_algo: ContextParallelAlgo::Ulysses,
            vocab_emb_dp: true,
            use_seq_parallel: false,
            expert_parallel: 1,
        }
    }
}

/// `[parallel]`'s MindFormers keys, resolved against the device count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptParallel {
    /// Batch shards (`parallel.data_parallel`).
    pub data_parallel: usize,
    /// Tensor-parallel shards of heads and features (`parallel.model_parallel`).
    pub model_parallel: usize,
    /// Sequence shards of the whole network (`parallel.context_parallel`).
    pub context_parallel: usize,
    /// How attention runs over the sequence shards (`parallel.context_parallel_algo`).
    pub context_parallel_algo: ContextParallelAlgo,
    /// Keep the embedding table and LM head whole (`parallel.vocab_emb_dp`).
    pub vocab_emb_dp: bool,
    /// Split the residual stream's sequence dim over `model_parallel`
    /// (`parallel.use_seq_parallel`).
    pub use_seq_parallel: bool,
    /// Expert-parallel shards of the MoE blocks' experts (`parallel.expert_parallel`).
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
    /// `devices / (model_parallel × context_parallel)`; when given, `data_parallel ×
    /// context_parallel × model_parallel` must equal `devices`, unless `model_parallel` and
    /// `context_parallel` are 1: then every device is a data-parallel shard.
    ///
    /// `devices` is one pipeline stage's devices: none (more stages than devices, which
    /// `ParallelConfig::validate_pipeline` refuses first) is an error naming
    /// `parallel.pipeline.stages` and `parallel.devices`.
    pub fn resolve(devices: usize, keys: &GptParallelKeys) -> Result<GptParallel, ModelsError> {
        if devices == 0 {
            return Err(config_error(
                "parallel.pipeline.stages",
                "leaves a pipeline stage without devices: the stages must divide parallel.devices"
                    .to_string(),
            ));
        }
        let (mp, cp) = (keys.model_parallel, keys.context_parallel);
        if mp == 0 || !devices.is_multiple_of(mp) {
            return Err(config_error(
                "parallel.model_parallel",
                format!("{mp} does not divide the {devices} devices"),
            ));
        }
        if cp == 0 || !devices.is_multiple_of(mp * cp) {
            return Err(config_error(
                "parallel.context_parallel",
                format!("{cp} × model_parallel {mp} does not divide the {devices} devices"),
            ));
        }
        // With no model or context parallelism every device is a data-parallel shard, whatever
        // `data_parallel` says (the rest is data parallel).
        let data_parallel = match keys.data_parallel {
            _ if mp == 1 && cp == 1 => devices,
            Some(dp) => dp,
            None => devices / (mp * cp),
        };
        if data_parallel * cp * mp != devices {
            return Err(config_error(
                "parallel.data_parallel",
                format!(
                    "data_parallel × context_parallel × model_parallel = {data_parallel} × {cp} × {mp} must equal the {devices} devices"
                ),
            ));
        }
        GptParallel {
            data_parallel,
            model_parallel: mp,
            context_parallel: cp,
            context_parallel_algo: keys.context_parallel_algo,
            vocab_emb_dp: keys.vocab_emb_dp,
            use_seq_parallel: keys.use_seq_parallel,
            expert_parallel: 1,
        }
        .with_expert_parallel(keys.expert_parallel)
    }

    /// Whether the attention core sees every position of its sequences
    /// ([`ContextParallelAlgo::keeps_the_sequence_whole`]).
    pub fn keeps_the_sequence_whole_in_attention(&self) -> bool {
        self.context_parallel_algo
            .keeps_the_sequence_whole(self.context_parallel)
    }

    /// Checks that the splits divide the model's sizes; errors name the key and the size.
    pub fn check(&self, c: &GptConfig) -> Result<(), ModelsError> {
        let (dp, mp, cp) = (
            self.data_parallel,
            self.model_parallel,
            self.context_parallel,
        );
        let mut rules = vec![
            ("data.batch_size", c.batch, dp, "data_parallel".to_string()),
            ("model.heads", c.heads, mp, "model_parallel".to_string()),
            (
                "model.ffn_hidden",
                c.ffn_hidden,
                mp,
                "model_parallel".to_string(),
            ),
        ];
        if !self.vocab_emb_dp {
            rules.push((
                "the vocabulary size",
                c.vocab_size,
                mp,
                "model_parallel (vocab_emb_dp = false)".to_string(),
            ));
        }
        if !self.keeps_the_sequence_whole_in_attention() && c.builds_packed_attention() {
            return Err(config_error(
                "parallel.context_parallel",
                format!(
                    "{cp} splits the sequence, which the packed attention (PackedAttention) keeps whole, and context_parallel_algo = \"ring\" keeps it split: build the GPT with FlashAttention (packed_attention = false)"
                ),
            ));
        }
        if cp > 1 {
            rules.push((
                "model.seq_len",
                c.seq_len,
                cp,
                "context_parallel".to_string(),
            ));
            rules.push((
                "data.batch_size",
                c.batch,
                dp * cp,
                format!(
                    "data_parallel × context_parallel = {dp} × {cp} (the LM head and the loss split the batch over both)"
                ),
            ));
            match self.context_parallel_algo {
                ContextParallelAlgo::Ulysses => rules.push((
                    "model.heads",
                    c.heads,
                    mp * cp,
                    format!(
                        "model_parallel × context_parallel = {mp} × {cp} (context_parallel_algo = \"ulysses\" splits the heads over both)"
                    ),
                )),
                ContextParallelAlgo::Ring if !c.builds_fused_attention() => {
                    return Err(config_error(
                        "parallel.context_parallel_algo",
                        "\"ring\" passes key/value blocks through the fused attention: it needs model.fused_attention = true and model.dropout = 0".to_string(),
                    ));
                }
                ContextParallelAlgo::Ring => {}
            }
        }
        if self.use_seq_parallel {
            rules.push((
                "model.seq_len",
                c.seq_len,
                mp * cp,
                "model_parallel × context_parallel (use_seq_parallel)".to_string(),
            ));
        }
        crate::moe_parallel::check(self, c)?;
        for (key, size, split, by) in rules {
            // A split of 0 (a `GptParallel` built by hand) divides nothing.
            if size.checked_rem(split) != Some(0) {
                return Err(config_error(
                    key,
                    format!("{size} is not divisible by parallel.{by} = {split}"),
                ));
            }
        }
        Ok(())
    }

    /// The dataset strategy: `input_ids` and `labels` split over `data_parallel` by rows and
    /// over `context_parallel` by positions.
    pub fn dataset_strategy(&self) -> Vec<Vec<usize>> {
        let split = vec![self.data_parallel, self.context_parallel];
        vec![split.clone(), split]
    }

    /// A strategy for every forward op of `graph` (a GPT built by [`crate::gpt()`]) with
    /// inputs, by op name.
    pub fn strategies(&self, graph: &Graph) -> Result<BTreeMap<String, OpStrategy>, ModelsError> {
        let mut out = BTreeMap::new();
        // The vocabulary-parallel loss's ops, when the graph has them (scope `loss`); its rows
        // (batch × positions) are split over data and context parallel.
        let v = if self.vocab_emb_dp {
            1
        } else {
            self.model_parallel
        };
        let rows = self.data_parallel * self.context_parallel;
        let loss_ops: BTreeMap<String, Vec<Vec<usize>>> =
            graph::vocab_parallel_cross_entropy_strategies("loss", rows, v)
                .into_iter()
                .collect();
        let heads = self.head_split()?;
        for node in graph.nodes() {
            if node.role != NodeRole::Forward || node.inputs.is_empty() {
                continue;
            }
            let strategy = match loss_ops.get(&node.name) {
                Some(tuples) => Some(OpStrategy::from_tuples(tuples.clone(), None)),
                // `qkv [B, S, heads, 3·head_dim]`: the batch and the heads split, the sequence
                // whole (Ulysses moves `qkv` there by one all-to-all; `check` keeps the ring,
                // which splits the sequence, off this op).
                None if matches!(node.op, Op::PackedAttention { .. }) => {
                    Some(heads.packed_strategy())
                }
                None => self.strategy_of(&node.name, &heads).or_else(|| {
                    self.moe_strategy_of(&node.name)
                        .map(|tuples| OpStrategy::from_tuples(tuples, None))
                }),
            };
            let strategy = strategy.ok_or_else(|| {
                config_error(
                    "model.name",
                    format!(
                        "the GPT has an op {:?} without a default strategy",
                        node.name
                    ),
                )
            })?;
            out.insert(node.name.clone(), strategy);
        }
        Ok(out)
    }

    /// How the attention core's `[B, heads, S, head_dim]` tensors are split: by tuple
    /// `[dp, mp, 1, 1]` without context parallelism; with it, by a layout over the mesh
    /// `(dp, cp, mp)`: Ulysses splits the heads over `mp` then `cp` (so that each rank's heads
    /// lie inside its `mp` block and the move from the sequence split is an all-to-all within
    /// its `cp` group); the ring keeps the sequence split over `cp`.
    fn head_split(&self) -> Result<HeadSplit, ModelsError> {
        let (dp, mp, cp) = (
            self.data_parallel,
            self.model_parallel,
            self.context_parallel,
        );
        if cp == 1 {
            return Ok(HeadSplit::Tuple(vec![dp, mp, 1, 1]));
        }
        let layout_error =
            |e: layout::LayoutError| config_error("parallel.context_parallel", e.to_string());
        let mesh = Layout::new(&[dp, cp, mp], &["dp", "cp", "mp"], None).map_err(layout_error)?;
        // Ulysses: heads over mp then cp, the sequence whole; ring: heads over mp, the
        // sequence over cp (as the stream holds it: no move before attention).
        let (head_dim, seq_dim): (DimSpec, DimSpec) = match self.context_parallel_algo {
            ContextParallelAlgo::Ulysses => (["mp", "cp"].into(), DimSpec::Replicated),
            ContextParallelAlgo::Ring => ("mp".into(), "cp".into()),
        };
        let heads = mesh
            .apply(&[
                "dp".into(),
                head_dim.clone(),
                seq_dim.clone(),
                DimSpec::Replicated,
            ])
            .map_err(layout_error)?;
        let packed = mesh
            .apply(&["dp".into(), seq_dim, head_dim, DimSpec::Replicated])
            .map_err(layout_error)?;
        let mask = mesh
            .apply(&[DimSpec::Replicated, DimSpec::Replicated])
            .map_err(layout_error)?;
        Ok(HeadSplit::Layout(Box::new(MeshSplit {
            heads,
            packed,
            mask,
        })))
    }

    /// The strategy of the GPT op named `name`.
    fn strategy_of(&self, name: &str, heads: &HeadSplit) -> Option<OpStrategy> {
        let (dp, mp, cp) = (
            self.data_parallel,
            self.model_parallel,
            self.context_parallel,
        );
        // The residual stream's sequence split, and the vocabulary split.
        let s = if self.use_seq_parallel { cp * mp } else { cp };
        let v = if self.vocab_emb_dp { 1 } else { mp };
        let stream = vec![dp, s, 1];
        let tail: Vec<&str> = name.rsplitn(3, '.').collect();
        let last = tail.first().copied()?;
        let parent = tail.get(1).copied().unwrap_or("");
        let tuples = match (parent, last) {
            ("attn", "flash") => return Some(heads.strategy(&[true, true, true])),
            ("attn", "scores" | "context") => return Some(heads.strategy(&[true, true])),
            ("attn", "masked") => return Some(heads.strategy(&[true, false])),
            ("attn", "softmax" | "attn_dropout" | "context_t") => {
                return Some(heads.strategy(&[true]))
            }
            ("embedding", "gather") => vec![vec![v, 1], vec![dp, cp]],
            ("embed", "add") => vec![stream.clone(), vec![s, 1]],
            (_, "layer_norm") => vec![stream.clone(), vec![1], vec![1]],
            ("qkv" | "fc1", "matmul") => vec![vec![dp, cp, 1], vec![mp, 1]],
            ("qkv" | "fc1", "bias_add") => vec![vec![dp, cp, mp], vec![mp]],
            ("fc1", "gelu") => vec![vec![dp, cp, mp]],
            ("proj" | "fc2", "matmul") => vec![vec![dp, cp, mp], vec![1, mp]],
            ("proj" | "fc2", "bias_add") => vec![stream.clone(), vec![1]],
            ("attn", "split_heads") => vec![vec![dp, cp, mp]],
            ("attn", "qkv_split" | "q_t" | "k_t" | "v_t" | "merge_heads") => {
                vec![vec![dp, cp, mp, 1]]
            }
            (_, "resid_dropout" | "dropout") => vec![stream],
            (_, "residual1" | "residual2") => vec![stream.clone(), stream],
            // The LM head and the loss split the batch over `dp × cp` (the final hidden states
            // move from the sequence split by one all-to-all in each `cp` group), so that the
            // flattened `[batch·seq, vocab]` rows stay contiguous blocks.
            ("lm_head", "matmul") => vec![vec![dp * cp, 1, 1], vec![v, 1]],
            (_, "logits") => vec![vec![dp * cp, 1, v]],
            (_, "logits_f32") => vec![vec![dp * cp, v]],
            (_, "labels_flat") => vec![vec![dp * cp, 1]],
            ("", "loss") => vec![vec![dp * cp, 1], vec![dp * cp]],
            _ => return None,
        };
        Some(OpStrategy::from_tuples(tuples, None))
    }
}

/// The split of the attention core's `[B, heads, S, head_dim]` operands (see
/// [`GptParallel::head_split`]), and of the `[S, S]` causal mask beside them.
enum HeadSplit {
    /// Split tuples: the head-split tensors' tuple (the mask is whole).
    Tuple(Vec<usize>),
    /// Layouts over the `(dp, cp, mp)` mesh.
    Layout(Box<MeshSplit>),
}

/// [`HeadSplit`]'s layouts over the `(dp, cp, mp)` mesh.
struct MeshSplit {
    /// A head-split tensor's layout.
    heads: Layout,
    /// The packed attention's `[B, S, heads, 3·head_dim]` input, split as `heads`.
    packed: Layout,
    /// The mask's layout (replicated).
    mask: Layout,
}

impl HeadSplit {
    /// An op's strategy whose inputs are head-split (`true`) or the mask (`false`).
    fn strategy(&self, head_split_inputs: &[bool]) -> OpStrategy {
        match self {
            HeadSplit::Tuple(tuple) => OpStrategy::from_tuples(
                head_split_inputs
                    .iter()
                    .map(|&h| if h { tuple.clone() } else { vec![1, 1] })
                    .collect(),
                None,
            ),
            HeadSplit::Layout(split) => OpStrategy::from_layouts(
                head_split_inputs
                    .iter()
                    .map(|&h| {
                        if h {
                            split.heads.clone()
                        } else {
                            split.mask.clone()
                        }
                    })
                    .collect(),
                None,
            ),
        }
    }

    /// The packed attention's strategy: its `[B, S, heads, 3·head_dim]` input split as the
    /// head-split `[B, heads, S, head_dim]` tensors are, dims 1 and 2 swapped.
    fn packed_strategy(&self) -> OpStrategy {
        match self {
            HeadSplit::Tuple(t) => {
                OpStrategy::from_tuples(vec![vec![t[0], t[2], t[1], t[3]]], None)
            }
            HeadSplit::Layout(split) => OpStrategy::from_layouts(vec![split.packed.clone()], None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Probe E8: a pipeline stage without devices (more stages than devices) is an error
    /// naming the keys, and a split of 0 built by hand is refused by `check`, never a division
    /// by zero.
    #[test]
    fn no_devices_and_zero_splits_are_errors_not_divisions_by_zero() {
        let err = GptParallel::resolve(0, &GptParallelKeys::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("parallel.pipeline.stages") && text.contains("parallel.devices"),
            "{text}"
        );
        let gpt = GptConfig::new(64, 2, 4, 16, 8, 8);
        let split = GptParallel::resolve(2, &GptParallelKeys::default()).unwrap();
        assert!(split.check(&gpt).is_ok());
        let zero = GptParallel {
            data_parallel: 0,
            ..split
        };
        let text = zero.check(&gpt).unwrap_err().to_string();
        assert!(text.contains("parallel.data_parallel = 0"), "{text}");
    }

    /// The ring keeps the sequence split, which `PackedAttention` keeps whole: a GPT built with
    /// it is refused under the ring, naming the key, and placed with `FlashAttention`. Ulysses
    /// moves `qkv` to the head split whole, so it places the packed op: its strategy splits
    /// `qkv`'s batch over dp and its heads over mp × cp, the sequence whole; without context
    /// parallel the heads over mp.
    #[test]
    fn the_ring_needs_the_transposing_attention_and_ulysses_runs_the_packed_one() {
        let packed = GptConfig::new(64, 2, 4, 16, 8, 8);
        let flash = GptConfig {
            packed_attention: false,
            ..packed.clone()
        };
        let ring = GptParallel::resolve(
            8,
            &GptParallelKeys {
                model_parallel: 2,
                context_parallel: 2,
                context_parallel_algo: ContextParallelAlgo::Ring,
                ..GptParallelKeys::default()
            },
        )
        .unwrap();
        let text = ring.check(&packed).unwrap_err().to_string();
        assert!(
            text.contains("parallel.context_parallel") && text.contains("PackedAttention"),
            "{text}"
        );
        assert!(ring.check(&flash).is_ok());
        assert!(!ring.keeps_the_sequence_whole_in_attention());

        let ulysses = GptParallel::resolve(
            8,
            &GptParallelKeys {
                model_parallel: 2,
                context_parallel: 2,
                ..GptParallelKeys::default()
            },
        )
        .unwrap();
        assert!(ulysses.keeps_the_sequence_whole_in_attention());
        assert!(ulysses.check(&packed).is_ok());
        let model = crate::gpt(&packed, tensor::DType::F32).unwrap();
        let strategies = ulysses.strategies(&model.graph).unwrap();
        let flash_op = &strategies["blocks.0.attn.flash"];
        // [B, S, heads, 3·head_dim] on the (dp 2, cp 2, mp 2) mesh: the batch over dp, the
        // sequence whole, the heads over mp × cp.
        assert_eq!(flash_op.inputs, vec![vec![2, 1, 4, 1]]);
        let layout = &flash_op.in_layouts.as_ref().expect("a layout strategy")[0];
        assert_eq!(layout.mesh().device_matrix(), vec![2, 2, 2]);
        let dims = layout.dims().unwrap();
        assert!(dims[1].is_empty(), "the sequence whole: {dims:?}");
        assert_eq!(dims[2].len(), 2, "the heads over mp and cp: {dims:?}");

        let plain = GptParallel::resolve(
            8,
            &GptParallelKeys {
                model_parallel: 2,
                ..GptParallelKeys::default()
            },
        )
        .unwrap();
        let strategies = plain.strategies(&model.graph).unwrap();
        let flash_op = &strategies["blocks.0.attn.flash"];
        assert_eq!(flash_op.inputs, vec![vec![4, 1, 2, 1]]);
    }
}
