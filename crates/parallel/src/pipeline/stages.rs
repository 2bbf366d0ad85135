//! Which layers (cells) each stage runs, and which ranks each stage holds.

use std::ops::Range;

use super::config::PipelineConfig;
use super::error::PipelineError;

/// One layer (cell) of the model, in model order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// Its hierarchical name (`blocks.0`, `blocks.0.attn`, `embedding`).
    pub name: String,
    /// Its number of parameters (elements, not bytes).
    pub parameter_count: u64,
}

impl Layer {
    /// A layer with a name and a parameter count.
    pub fn new(name: impl Into<String>, parameter_count: u64) -> Layer {
        Layer {
            name: name.into(),
            parameter_count,
        }
    }
}

/// Where every layer runs.
///
/// The model is cut into `stages × chunks` contiguous groups; group `g` is model chunk
/// `g / stages` of stage `g % stages` (Megatron's interleaved assignment: chunk c of stage s holds
/// the (c·P + s)-th group). Without interleave, chunks = 1 and the group is the stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageAssignment {
    /// P.
    pub stages: usize,
    /// Model chunks per stage.
    pub chunks: usize,
    /// For every layer, in model order, its group index `chunk · stages + stage`.
    pub group_of_layer: Vec<usize>,
    /// Parameters per group (index `chunk · stages + stage`).
    pub parameters_per_group: Vec<u64>,
}

impl StageAssignment {
    /// The stage of layer `layer_idx`, if the layer exists.
    pub fn stage_of(&self, layer_idx: usize) -> Option<usize> {
        self.group_of_layer
            .get(layer_idx)
            .and_then(|g| g.checked_rem(self.stages))
    }

    /// The model chunk (within its stage) of layer `layer_idx`, if the layer exists.
    pub fn chunk_of(&self, layer_idx: usize) -> Option<usize> {
        self.group_of_layer
            .get(layer_idx)
            .and_then(|g| g.checked_div(self.stages))
    }

    /// Parameters held by stage `stage`, summed over its chunks.
    pub fn parameters_of_stage(&self, stage: usize) -> u64 {
        self.parameters_per_group
            .iter()
            .enumerate()
            .filter(|(g, _)| g.checked_rem(self.stages) == Some(stage))
            .map(|(_, n)| *n)
            .sum()
    }
}

/// Assigns every layer to a stage (and model chunk).
///
/// - With `stage_config`: a layer goes to the stage of the longest prefix that matches its name
///   on a `.` boundary (`blocks.1` matches `blocks.1` and `blocks.1.mlp`, not `blocks.10`). A
///   layer no prefix matches inherits the stage of the layer before it (stage 0 for the first), as
///   MindSpore's stage colouring passes a producer's stage to its users. Group indices must not
///   decrease along the model ([`PipelineError::StageOrderDecreasing`], naming the cell) and every
///   group must get a layer ([`PipelineError::EmptyStage`], naming the keys of the empty stage).
///   Every key must match some layer ([`PipelineError::StageConfigMatchesNoLayer`]): a typo is
///   an error, not a key silently ignored.
/// - Without: the layers are cut into `stages × chunks` contiguous non-empty groups so that the
///   largest group's parameter count is as small as possible (binary search on that bound, greedy
///   packing; ties leave the later groups lighter).
pub fn assign_stages(
    layers: &[Layer],
    config: &PipelineConfig,
) -> Result<StageAssignment, PipelineError> {
    config.validate_shape()?;
    let stages = config.stages;
    let chunks = config.chunks();
    let groups = stages * chunks;
    if layers.is_empty() {
        return Err(PipelineError::NoLayers);
    }
    if layers.len() < groups {
        return Err(PipelineError::FewerLayersThanStages {
            layers: layers.len(),
            groups,
        });
    }
    let group_of_layer = if config.stage_config.is_empty() {
        split_evenly(layers, groups)
    } else {
        split_by_prefix(layers, &config.stage_config, groups)?
    };
    let mut parameters_per_group = vec![0u64; groups];
    for (layer, group) in layers.iter().zip(&group_of_layer) {
        let slot = &mut parameters_per_group[*group];
        *slot = slot.saturating_add(layer.parameter_count);
    }
    Ok(StageAssignment {
        stages,
        chunks,
        group_of_layer,
        parameters_per_group,
    })
}

/// True when `prefix` is `name` or a `.`-separated ancestor of it.
fn prefix_matches(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

fn split_by_prefix(
    layers: &[Layer],
    stage_config: &[(String, usize)],
    groups: usize,
) -> Result<Vec<usize>, PipelineError> {
    if let Some((prefix, _)) = stage_config
        .iter()
        .find(|(prefix, _)| !layers.iter().any(|l| prefix_matches(prefix, &l.name)))
    {
        const SHOWN: usize = 8;
        let mut names: Vec<&str> = layers.iter().take(SHOWN).map(|l| l.name.as_str()).collect();
        if layers.len() > SHOWN {
            names.push("…");
        }
        return Err(PipelineError::StageConfigMatchesNoLayer {
            prefix: prefix.clone(),
            layers: names.join(", "),
        });
    }
    let mut group_of_layer = Vec::with_capacity(layers.len());
    let mut previous: Option<(usize, usize)> = None; // (layer index, group)
    for (layer_idx, layer) in layers.iter().enumerate() {
        let matched = stage_config
            .iter()
            .filter(|(prefix, _)| prefix_matches(prefix, &layer.name))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, stage)| *stage);
        let group = match (matched, previous) {
            (Some(group), Some((previous_idx, previous_group))) if group < previous_group => {
                return Err(PipelineError::StageOrderDecreasing {
                    cell: layer.name.clone(),
                    stage: group,
                    previous: layers[previous_idx].name.clone(),
                    previous_stage: previous_group,
                });
            }
            (Some(group), _) => group,
            (None, Some((_, previous_group))) => previous_group,
            (None, None) => 0,
        };
        group_of_layer.push(group);
        previous = Some((layer_idx, group));
    }
    let mut used = vec![false; groups];
    for group in &group_of_layer {
        if let Some(slot) = used.get_mut(*group) {
            *slot = true;
        }
    }
    if let Some(stage) = used.iter().position(|u| !u) {
        let keys = stage_config
            .iter()
            .filter(|(_, s)| *s == stage)
            .map(|(prefix, _)| prefix.clone())
            .collect();
        return Err(PipelineError::EmptyStage { stage, keys });
    }
    Ok(group_of_layer)
}

/// Contiguous split into `groups` non-empty groups minimising the largest group's sum.
/// Requires `layers.len() >= groups >= 1`.
fn split_evenly(layers: &[Layer], groups: usize) -> Vec<usize> {
    let weights: Vec<u128> = layers
        .iter()
        .map(|l| u128::from(l.parameter_count))
        .collect();
    let mut low = weights.iter().copied().max().unwrap_or(0);
    let mut high: u128 = weights.iter().sum();
    // The least bound for which greedy packing needs at most `groups` groups.
    while low < high {
        let middle = low + (high - low) / 2;
        if groups_needed(&weights, middle) <= groups {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    let bound = low;
    // Greedy packing under `bound`, closing a group early when the remaining layers are just
    // enough to give every remaining group one.
    let mut group_of_layer = Vec::with_capacity(weights.len());
    let mut group = 0usize;
    let mut sum: u128 = 0;
    let mut group_len = 0usize;
    for (layer_idx, weight) in weights.iter().enumerate() {
        let layers_left = weights.len() - layer_idx;
        let groups_left_after = groups - group - 1;
        if group_len > 0 && (sum + weight > bound || layers_left == groups_left_after) {
            group += 1;
            sum = 0;
            group_len = 0;
        }
        sum += weight;
        group_len += 1;
        group_of_layer.push(group);
    }
    group_of_layer
}

fn groups_needed(weights: &[u128], bound: u128) -> usize {
    let mut count = 1;
    let mut sum = 0;
    for weight in weights {
        if sum + weight > bound {
            count += 1;
            sum = 0;
        }
        sum += weight;
    }
    count
}

/// The ranks of stage `stage` when `device_count` devices are split into `stages` groups,
/// MindSpore's order: stage s holds ranks `s·N/P .. (s+1)·N/P`. `None` if `stages` is 0, does
/// not divide `device_count`, or `stage` is not below `stages`.
pub fn stage_ranks(stage: usize, stages: usize, device_count: usize) -> Option<Range<usize>> {
    if stages == 0 || !device_count.is_multiple_of(stages) || stage >= stages {
        return None;
    }
    let per_stage = device_count / stages;
    Some(stage * per_stage..(stage + 1) * per_stage)
}

/// The stage that holds `rank` (the inverse of [`stage_ranks`]); `None` under the same
/// conditions, or if `rank` is not below `device_count`.
pub fn stage_of_rank(rank: usize, stages: usize, device_count: usize) -> Option<usize> {
    if stages == 0 || !device_count.is_multiple_of(stages) || rank >= device_count {
        return None;
    }
    Some(rank / (device_count / stages))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_on_dot_boundaries_only() {
        assert!(prefix_matches("blocks.1", "blocks.1"));
        assert!(prefix_matches("blocks.1", "blocks.1.mlp.fc"));
        assert!(!prefix_matches("blocks.1", "blocks.10"));
        assert!(!prefix_matches("blocks.1", "blocks"));
    }

    #[test]
    fn greedy_bound_is_the_optimum_on_a_small_case() {
        // [3, 1, 1, 1, 3] into 3: best max is 3 ([3], [1,1,1], [3]).
        let layers: Vec<Layer> = [3, 1, 1, 1, 3]
            .iter()
            .enumerate()
            .map(|(i, n)| Layer::new(format!("l{i}"), *n))
            .collect();
        assert_eq!(split_evenly(&layers, 3), vec![0, 1, 1, 1, 2]);
    }
}
