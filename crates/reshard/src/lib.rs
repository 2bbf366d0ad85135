//! Tessera's reshard planner: moving a tensor from one layout to another with the fewest bytes,
//! planned as pure data. Executing a plan over a communicator is `reshard_exec`'s job.
//!
//! # Brief overview
//! - [`plan()`] intersects boxes: every destination slot receives exactly the elements its device
//!   lacks, from the least-loaded source replica, and copies locally what it already holds. The
//!   result, a [`ReshardPlan`], is data: it knows its bytes per rank, its lower bound, and
//!   [`ReshardPlan::explain`] prints every transfer with its reason. [`plan_from_within`]
//!   counts a plan's transfers first (without making them) and refuses one with more than
//!   its caller can hold: an all-gather over `n` ranks has `n²`.
//! - [`source_pieces`] answers the question checkpoint conversion asks: which source slots hold
//!   which part of a region.
//! - [`lower`] groups a plan's transfers into the collectives they form (all-gather,
//!   all-to-all, or a variable exchange); [`fusion_key`] says which reductions can run as one
//!   collective; [`HalfSum`] says how a pending sum of half values is added. All of it is data
//!   that `reshard_exec` carries out.
//!
//! # Example
//! ```
//! use layout::Layout;
//! use tensor::DType;
//! let src = Layout::new(&[2, 2], &["dp", "tp"], None)?.apply(&["dp".into(), "tp".into()])?.bind(&[8, 8])?;
//! let dst = Layout::new(&[2, 2], &["dp", "tp"], None)?.apply(&["tp".into(), "dp".into()])?.bind(&[8, 8])?;
//! let plan = reshard::plan(&src, &dst, DType::F32)?;
//! assert_eq!(plan.bytes_total(), plan.bytes_lower_bound());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design record: planning moves by box intersection
//! - **Constraints.** A move between two layouts must deliver every destination element exactly
//!   once, move no more bytes than the destination lacks, work between meshes of different shapes,
//!   device counts and rank orders, resolve pending sums, be inspectable before it runs (a plan
//!   for 1024 ranks made on a laptop), and serve checkpoint conversion as well as run-time
//!   resharding.
//! - **Solution.** Plan by intersecting slice boxes instead of composing collective rules
//!   (MindSpore's split/concat/permute greedy, PyTorch DTensor's placement rules): each
//!   destination slot's box, minus what its device already holds, intersected with the distinct
//!   source boxes, gives pieces; each piece comes from the least-loaded holder. A pending sum is
//!   first resolved by whichever of an all-reduce or a reduce-scatter (onto any dim its groups
//!   divide) leads to the fewest total bytes. Lowering then groups the transfers into the
//!   collectives they form (all-gather, all-to-all) or a variable exchange, which execution
//!   (`reshard_exec`) runs.
//! - **Pros.** Minimal bytes by construction (tested: equal to the lower bound on random layout
//!   pairs); one planner for any pair of layouts, no special cases for multi-axis splits,
//!   interleaving, optimizer sharding or different device counts; plans are data (`explain`,
//!   `--json`), and checkpoint conversion reads exactly the pieces it needs from files.
//! - **Cons.** Planning costs O(destination slots × distinct source boxes); pieces of irregular
//!   moves are packed and unpacked (a copy each side) rather than sent in place; the replica
//!   choice balances senders greedily, not optimally.
//! - **Compatibility.** Any layout MindSpore can express (flat and multi-axis tensor maps,
//!   `interleaved_parallel`, optimizer shards, pipeline stages) is a `TensorLayout`, so every
//!   MindSpore redistribution and checkpoint transform has a plan here, usually a smaller one.
//!
//! # Architecture invariant
//! Planning is pure (layouts in, plan out): this crate does not depend on `comm`, so its users
//! (`ckpt`, `parallel`) never link a communicator. Execution lives in `reshard_exec`.
#![deny(missing_docs)]

mod error;
mod fuse;
mod half_sum;
mod lower;
mod partial;
mod plan;
#[cfg(test)]
mod test_util;

pub use crate::error::ReshardError;
pub use crate::fuse::{fusion_key, FusionKey};
pub use crate::half_sum::HalfSum;
pub use crate::lower::{lower, lower_for, lower_kinds, Exchange, ExchangeKind, ExchangeKindOf};
pub use crate::partial::{DistLayout, PendingOp, ReduceKind, ReduceStep};
pub use crate::plan::{
    plan, plan_from, plan_from_within, source_pieces, ReshardPlan, SourcePiece, Transfer,
};
