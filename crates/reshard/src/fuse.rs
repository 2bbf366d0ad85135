//! Communication fusion, the planning side: which reductions can run as one collective. Several
//! reductions that each resolve a pending sum over the same groups of ranks, and move nothing
//! after it, share a [`FusionKey`]; `reshard_exec::PackedReduction` packs them and runs one
//! all-reduce (or one reduce-scatter) per bucket instead of one per tensor.
//!
//! The sums are the same sums: each element is still the sum over the same ranks (with
//! deterministic mode, in the same canonical tree, so fused and unfused give the same bits).

use tensor::DType;

use crate::partial::{PendingOp, ReduceKind};
use crate::plan::ReshardPlan;

/// What reductions must share to run as one collective: [`fusion_key`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FusionKey {
    /// A reduce-scatter (each member keeps a part) rather than an all-reduce.
    pub scatter: bool,
    /// The reduction.
    pub op: PendingOp,
    /// The element type.
    pub dtype: DType,
    /// Every group, as device ranks in member order.
    pub groups: Vec<Vec<usize>>,
    /// Every group in deterministic mode's canonical order.
    pub canonical: Vec<Vec<usize>>,
}

/// The fusion key of `plan`, when it is a reduction and nothing else: one slot per device, the
/// source pending a reduction, and the reduction's result already laid out as the destination.
pub fn fusion_key(plan: &ReshardPlan) -> Option<FusionKey> {
    let step = plan.reduce()?;
    let src = plan.src();
    let mesh = src.layout().mesh();
    if mesh.interleave_factor() != 1 || !step.result.same_placement(plan.dst()) {
        return None;
    }
    let devices = |slots: &[usize]| slots.iter().map(|&s| mesh.device_of_slot(s)).collect();
    Some(FusionKey {
        scatter: matches!(step.kind, ReduceKind::ReduceScatter { .. }),
        op: step.op,
        dtype: plan.dtype(),
        groups: step.slot_groups.iter().map(|g| devices(g)).collect(),
        canonical: step
            .slot_groups
            .iter()
            .map(|g| devices(&src.canonical_member_order(g)))
            .collect(),
    })
}
