//! Optimizer parallelism (`[parallel.hsdp]`): which parameters are cut along dim 0 over their
//! replica group, and into which layout.
//!
//! # The rule
//! A trainable parameter is sharded when
//! - it is held by more than one rank per slice (its replica group, MindSpore's repeated
//!   device group, has R > 1 members);
//! - its whole (unsharded) size is at least `threshold` KB;
//! - the shard count K — `shard_size`, or R when `shard_size` is -1 or at least R — divides R;
//! - dim 0 of its slice divides by K (and is not a manual row split).
//!
//! Otherwise it is left unsharded and `--explain` says why (MindSpore skips such parameters
//! with a log line only). The shard layout is the parameter's strategy layout with K of the
//! replica ranks appended to dim 0 as inner axes ([`layout::Layout::with_optimizer_shard`]):
//! MindSpore's chunks of K consecutive ranks of the replica group, each rank holding the
//! piece at its index in its chunk. The piece is a run of whole rows of the rank's slice, so
//! it is contiguous in the slice's row-major buffer.
//!
//! # What each level changes
//! The layout model does the work: a value whose buffer has one layout and whose consumer
//! needs another gets a reshard, and a gradient's pending data-parallel sum is resolved by the
//! cheapest collective into the layout it is brought to. MindSpore's three levels
//! ([`OptimizerLevel::shards_weights`]) give the parameter's own buffer the shard layout:
//! - **level1**: every consumer needs the strategy layout, so the lowering all-gathers the
//!   weight before its first forward use; the backward pass reads that gathered copy, which
//!   lives until its last backward use. The gradient is brought to the shard layout, so its
//!   sum is a reduce-scatter (the backward of the gather), and the optimizer updates the piece
//!   in place: no gather after the update. With gradient accumulation
//!   ([`HsdpConfig::accumulates`]) the gradient is instead brought whole to the strategy
//!   layout and accumulated whole, as MindSpore accumulates the whole gradient at level 1; the
//!   optimizer reads its piece's rows of the sum.
//! - **level2**: as level 1, but with accumulation too the gradient goes to the shard layout
//!   at every micro step and only the piece is accumulated (MindSpore's
//!   `grad_accumulation_shard`). Without accumulation it is level 1.
//! - **level3**: as level 2, and every weight is gathered again before its first backward use
//!   (the `recompute` pass's backward copies), so no whole weight lives from one pass to the
//!   other.
//!
//! ZeRO's first two stages stay reachable under their own names; they keep the weights whole:
//! - **zero1**: weights keep the strategy layout; the gradient is all-reduced into it as
//!   without sharding. The optimizer keeps state for, and updates, only the rank's piece; the
//!   program's [`crate::WeightGather`]s then all-gather the pieces into the whole weights.
//! - **zero2**: as zero1, but the gradient is brought to the shard layout, so its sum is a
//!   reduce-scatter and each rank holds only its piece of the gradient.
//!
//! A gradient with several contributions (a tied embedding table) brought to the shard layout
//! sums them there: each is reduce-scattered, and the pieces are added.
//!
//! The decision is made when a parameter gets its layout (from its first forward consumer),
//! so the accumulations of its gradient, placed later, already know the shard layout.

use graph::Graph;
use layout::TensorLayout;

use crate::config::{HsdpConfig, OptimizerLevel};

/// A parameter cut along dim 0 over (part of) its replica group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptimizerShard {
    /// What is sharded.
    pub level: OptimizerLevel,
    /// The layout the parameter's strategy gives it: what its consumers need.
    pub strategy_layout: TensorLayout,
    /// The strategy layout with dim 0 further split over the shard group: the piece each rank
    /// updates and keeps optimizer state for (and, at MindSpore's levels, holds; with
    /// `gradient_sharded`, receives the gradient of).
    pub layout: TensorLayout,
    /// Whether the program brings the gradient to [`OptimizerShard::layout`] (a
    /// reduce-scatter) rather than to the strategy layout ([`HsdpConfig::gradient_sharded`]).
    pub gradient_sharded: bool,
    /// Whether gradient accumulation keeps only the piece ([`HsdpConfig::accumulation_sharded`]).
    pub accumulation_sharded: bool,
    /// Ranks per shard group (MindSpore's `opt_weight_shard_size`).
    pub size: usize,
    /// The rank stride inside a shard group (MindSpore's `opt_weight_shard_step`).
    pub step: usize,
}

/// What optimizer parallelism decided for one trainable parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardDecision {
    /// Sharded (boxed: two layouts are large beside a reason).
    Sharded(Box<OptimizerShard>),
    /// Left whole because `shard_size` (after its cap to the replicas) does not divide the
    /// parameter's `replicas`, as MindSpore skips such a parameter.
    Skipped {
        /// The shard size asked for, capped to the replicas.
        shard_size: usize,
        /// The ranks holding the same slice of the parameter.
        replicas: usize,
    },
    /// Left whole for another reason, and why.
    Unsharded(String),
}

impl ShardDecision {
    /// The shard, when sharded.
    pub fn shard(&self) -> Option<&OptimizerShard> {
        match self {
            ShardDecision::Sharded(s) => Some(s),
            _ => None,
        }
    }

    /// The parameter's replica count when it is left whole because `shard_size` does not
    /// divide it ([`ShardDecision::Skipped`]); `None` for every other decision.
    pub fn skipped_replicas(&self) -> Option<usize> {
        match self {
            ShardDecision::Skipped { replicas, .. } => Some(*replicas),
            _ => None,
        }
    }

    /// Why the parameter is left whole; `None` when it is sharded.
    pub fn why_whole(&self) -> Option<String> {
        match self {
            ShardDecision::Sharded(_) => None,
            ShardDecision::Skipped {
                shard_size,
                replicas,
            } => Some(format!(
                "shard_size {shard_size} does not divide its {replicas} replicas"
            )),
            ShardDecision::Unsharded(why) => Some(why.clone()),
        }
    }
}

/// The decision for a parameter of `bytes` bytes laid out as `strategy_layout`.
pub(crate) fn decide(
    config: &HsdpConfig,
    strategy_layout: &TensorLayout,
    bytes: usize,
) -> ShardDecision {
    let unsharded = |reason: String| ShardDecision::Unsharded(reason);
    let replicas = strategy_layout.replica_count();
    if replicas <= 1 {
        return unsharded("each slice is held by one rank (no replicas to shard over)".into());
    }
    let threshold = config.threshold_kb.saturating_mul(1024);
    if bytes < threshold {
        return unsharded(format!(
            "{bytes} bytes, below the threshold of {} KB",
            config.threshold_kb
        ));
    }
    let k = config.shard_size.map_or(replicas, |s| s.min(replicas));
    if k <= 1 {
        return unsharded("shard_size 1 leaves every parameter whole".into());
    }
    if !replicas.is_multiple_of(k) {
        return ShardDecision::Skipped {
            shard_size: k,
            replicas,
        };
    }
    if strategy_layout.row_split().is_some() {
        return unsharded("its dim 0 is a manual row split".into());
    }
    let Some(&rows) = strategy_layout.slice_shape().first() else {
        return unsharded("a scalar has no dim 0 to shard".into());
    };
    if rows % k != 0 {
        return unsharded(format!(
            "dim 0 of its slice ({rows} rows) does not divide into {k} pieces"
        ));
    }
    let layout = match strategy_layout.with_optimizer_shard(Some(k)) {
        Ok(l) => l,
        Err(e) => return unsharded(e.to_string()),
    };
    let group = strategy_layout.replica_slots(0);
    let mesh = strategy_layout.mesh();
    let step = mesh
        .rank_of_slot(group[k - 1])
        .abs_diff(mesh.rank_of_slot(group[0]))
        / (k - 1);
    ShardDecision::Sharded(Box::new(OptimizerShard {
        level: config.level,
        gradient_sharded: config.gradient_sharded(),
        accumulation_sharded: config.accumulation_sharded(),
        strategy_layout: strategy_layout.clone(),
        layout,
        size: k,
        step,
    }))
}

/// The whole size in bytes of parameter `value` of `graph`.
pub(crate) fn param_bytes(graph: &Graph, value: graph::ValueId) -> usize {
    let v = &graph.values()[value.0];
    v.shape.iter().product::<usize>() * v.dtype.size_in_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use layout::Layout;

    fn hsdp(shard_size: Option<usize>, threshold_kb: usize) -> HsdpConfig {
        HsdpConfig {
            shard_size,
            threshold_kb,
            level: OptimizerLevel::Level2,
            ..HsdpConfig::default()
        }
    }

    /// A `[rows, 8]` weight split `(None, mp)` on dp 4 × mp 2: replica groups of 4 (the dp
    /// ranks, stride 2).
    fn weight(rows: usize) -> TensorLayout {
        Layout::new(&[4, 2], &["dp", "mp"], None)
            .unwrap()
            .apply(&["None".into(), "mp".into()])
            .unwrap()
            .bind(&[rows, 8])
            .unwrap()
    }

    #[test]
    fn the_shard_group_is_the_replica_group_capped_by_shard_size() {
        let ShardDecision::Sharded(all) = decide(&hsdp(None, 0), &weight(8), 256) else {
            panic!("sharded over the replica group");
        };
        assert_eq!((all.size, all.step), (4, 2));
        assert_eq!(all.layout.slice_shape(), &[2, 4]);
        let ShardDecision::Sharded(two) = decide(&hsdp(Some(2), 0), &weight(8), 256) else {
            panic!("sharded over chunks of 2");
        };
        assert_eq!((two.size, two.step), (2, 2));
        assert_eq!(two.layout.slice_shape(), &[4, 4]);
        // Ranks 0 and 2 share a chunk (the replica group 0, 2, 4, 6 cut into {0, 2}, {4, 6}).
        assert_eq!(two.layout.rank_box(2).unwrap().offset[..], [4, 0]);
        assert_eq!(two.layout.rank_box(4).unwrap().offset[..], [0, 0]);
        // A shard size above the replica count means the whole group.
        let ShardDecision::Sharded(big) = decide(&hsdp(Some(8), 0), &weight(8), 256) else {
            panic!("sharded over the replica group");
        };
        assert_eq!(big.size, 4);
    }

    #[test]
    fn parameters_that_cannot_be_sharded_say_why() {
        let why = |d: ShardDecision| match d.why_whole() {
            Some(reason) => reason,
            None => panic!("unexpectedly sharded: {d:?}"),
        };
        assert!(why(decide(&hsdp(None, 1), &weight(8), 1023)).contains("below the threshold"));
        assert!(why(decide(&hsdp(None, 0), &weight(6), 192)).contains("does not divide into 4"));
        assert!(why(decide(&hsdp(Some(3), 0), &weight(12), 384))
            .contains("does not divide its 4 replicas"));
        assert_eq!(
            decide(&hsdp(Some(3), 0), &weight(12), 384).skipped_replicas(),
            Some(4)
        );
        assert_eq!(
            decide(&hsdp(None, 0), &weight(6), 192).skipped_replicas(),
            None
        );
        assert_eq!(
            decide(&hsdp(Some(2), 0), &weight(8), 256).skipped_replicas(),
            None
        );
        let split = Layout::new(&[8], &["mp"], None)
            .unwrap()
            .apply(&["mp".into(), "None".into()])
            .unwrap()
            .bind(&[8, 8])
            .unwrap();
        assert!(why(decide(&hsdp(None, 0), &split, 256)).contains("no replicas"));
    }
}
