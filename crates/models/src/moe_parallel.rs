//! The strategies of the GPT's MoE blocks ([`crate::moe`]): expert parallel.
//!
//! Expert parallel takes its ranks from the data-parallel ones, as DeepSpeed-MoE and Megatron
//! do: `parallel.expert_parallel = ep` must divide `data_parallel` (and the experts). The
//! token side of a MoE block (the router, the masks, the dispatch and combine products, all
//! `[G, …]`) splits the groups (the batch) over `data_parallel` like the rest of the GPT; the
//! expert side (`[E, …]`: the expert weights, their inputs and outputs) splits the experts over
//! `ep` and the groups' slots over the remaining `data_parallel / ep`, and the experts' hidden
//! width over `model_parallel` (Megatron's column- then row-parallel MLP). An expert's weights
//! are replicated over the `data_parallel / ep` ranks that share it; their gradients are summed
//! there. Between the two sides, `[E, G, C, d]` goes from split on `G` (by `data_parallel`) to
//! split on `E` and `G` (by `ep` × `data_parallel / ep`) and back: the reshards the parallel pass
//! plans for them are the all-to-all dispatch and combine, and the slots come back to their
//! tokens in their order (the layouts place every element).
//!
//! The MoE ops are split tuples, so they place on any GPT mesh: with `context_parallel` (or
//! `use_seq_parallel`) the block's input, split on the sequence, is gathered within its group
//! first (routing and capacity are per whole sequence), and its output split again.

use crate::error::ModelsError;
use crate::gpt::GptConfig;
use crate::gpt_parallel::GptParallel;

fn config_error(key: &str, reason: String) -> ModelsError {
    ModelsError::Config {
        key: key.to_string(),
        reason,
    }
}

impl GptParallel {
    /// The same split with the MoE experts over `expert_parallel` shards
    /// (`parallel.expert_parallel`), which must divide `data_parallel`.
    pub fn with_expert_parallel(self, expert_parallel: usize) -> Result<GptParallel, ModelsError> {
        if expert_parallel == 0 || !self.data_parallel.is_multiple_of(expert_parallel) {
            return Err(config_error(
                "parallel.expert_parallel",
                format!(
                    "{expert_parallel} does not divide parallel.data_parallel = {} (expert-parallel ranks are data-parallel ranks)",
                    self.data_parallel
                ),
            ));
        }
        Ok(GptParallel {
            expert_parallel,
            ..self
        })
    }

    /// The strategy of the MoE block op named `name` (`blocks.N.moe.*`), or of the sum of the
    /// auxiliary losses.
    pub(crate) fn moe_strategy_of(&self, name: &str) -> Option<Vec<Vec<usize>>> {
        let (dp, mp, ep) = (
            self.data_parallel,
            self.model_parallel,
            self.expert_parallel,
        );
        let rest = dp / ep.max(1);
        if name == "loss_with_aux" || name.starts_with("moe_aux.") {
            return Some(vec![vec![], vec![]]);
        }
        let (_, op) = name.split_once(".moe.")?;
        let tokens3 = vec![dp, 1, 1];
        let tokens4 = vec![dp, 1, 1, 1];
        let strategy = match op {
            "router.matmul" => vec![tokens3, vec![1, 1]],
            "router.cast" | "router.softmax" | "route" | "gates_sum" | "gates_4d" | "slots_4d"
            | "aux.counts" | "aux.mass" => vec![tokens3],
            "gates" | "gates_norm" | "dispatch" | "combine_matmul" | "add_shared" => {
                vec![tokens3.clone(), tokens3]
            }
            "combine" => vec![tokens4.clone(), tokens4],
            "dispatch_half" | "combine_half" | "dispatch_flat" | "combine_flat" | "to_experts"
            | "slots_flat" => vec![tokens4],
            // [E, G, C, d]: the dispatch's all-to-all lands here, the combine's leaves from here.
            "expert_in" => vec![vec![ep, rest, 1, 1]],
            "to_tokens" => vec![vec![1, dp, 1, 1]],
            "experts.fc1" => vec![vec![ep, rest, 1], vec![ep, 1, mp]],
            "experts.fc1_bias" => vec![vec![ep, rest, mp], vec![ep, 1, mp]],
            "experts.gelu" => vec![vec![ep, rest, mp]],
            "experts.fc2" => vec![vec![ep, rest, mp], vec![ep, mp, 1]],
            "experts.fc2_bias" => vec![vec![ep, rest, 1], vec![ep, 1, 1]],
            "expert_out" => vec![vec![ep, rest, 1]],
            "aux.product" => vec![vec![1], vec![1]],
            "aux.total" => vec![vec![1]],
            "aux.loss" => vec![vec![], vec![]],
            _ => return None,
        };
        Some(strategy)
    }
}

/// Checks that the expert split fits the model: `expert_parallel` needs MoE blocks and must
/// divide the experts. Errors name the key.
pub(crate) fn check(split: &GptParallel, c: &GptConfig) -> Result<(), ModelsError> {
    let ep = split.expert_parallel;
    match &c.moe {
        None if ep > 1 => Err(config_error(
            "parallel.expert_parallel",
            format!("{ep} expert-parallel shards need MoE blocks: set [model.moe]"),
        )),
        Some(moe) if !moe.experts.is_multiple_of(ep) => Err(config_error(
            "model.moe.experts",
            format!(
                "{} experts are not divisible by parallel.expert_parallel = {ep}",
                moe.experts
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt_parallel::GptParallelKeys;
    use crate::moe::MoeConfig;

    fn moe_gpt(experts: usize) -> GptConfig {
        GptConfig {
            moe: Some(MoeConfig::new(experts, 2)),
            ..GptConfig::new(64, 2, 4, 16, 8, 8)
        }
    }

    #[test]
    fn every_moe_op_has_a_strategy() {
        for shared in [false, true] {
            let mut config = moe_gpt(4);
            if let Some(moe) = config.moe.as_mut() {
                moe.shared_expert = shared;
            }
            let model = crate::gpt(&config, tensor::DType::F32).unwrap();
            let keys = GptParallelKeys {
                model_parallel: 2,
                expert_parallel: 2,
                ..GptParallelKeys::default()
            };
            let split = GptParallel::resolve(8, &keys).unwrap();
            split.check(&config).unwrap();
            let strategies = split.strategies(&model.graph).unwrap();
            assert_eq!(
                strategies["blocks.1.moe.experts.fc1"].inputs,
                [vec![2, 2, 1], vec![2, 1, 2]]
            );
        }
    }

    #[test]
    fn bad_expert_splits_name_their_key() {
        let split = GptParallel::resolve(4, &GptParallelKeys::default()).unwrap();
        let err = split.with_expert_parallel(3).unwrap_err().to_string();
        assert!(err.starts_with("parallel.expert_parallel"), "{err}");
        let ep4 = split.with_expert_parallel(4).unwrap();
        let err = ep4.check(&moe_gpt(6)).unwrap_err().to_string();
        assert!(err.starts_with("model.moe.experts"), "{err}");
        let dense = GptConfig::new(64, 2, 4, 16, 8, 8);
        let err = ep4.check(&dense).unwrap_err().to_string();
        assert!(err.starts_with("parallel.expert_parallel"), "{err}");
    }
}
