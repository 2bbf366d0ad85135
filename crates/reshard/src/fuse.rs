//! Communication fusion: several reductions that each resolve a pending sum over the same
//! groups of ranks, and move nothing after it, run as one collective over their concatenated
//! buffers — one all-reduce (or one reduce-scatter) per bucket instead of one per tensor.
//!
//! The sums are the same sums: each element is still the sum over the same ranks (with
//! deterministic mode, in the same canonical tree, so fused and unfused give the same bits).

use comm::{Buf, BufMut};
use layout::SliceBox;
use tensor::{DType, Tensor};

use crate::error::ReshardError;
use crate::execute::{canonical_member_order, ReshardRunner};
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
            .map(|g| devices(&canonical_member_order(src, g)))
            .collect(),
    })
}

/// Box `j` of `n` equal parts of a tensor of `shape` along `dim`.
fn part_box(shape: &[usize], dim: usize, n: usize, j: usize) -> SliceBox {
    let len = shape[dim] / n;
    let mut offset = vec![0; shape.len()];
    offset[dim] = j * len;
    let mut extent = shape.to_vec();
    extent[dim] = len;
    SliceBox::new(offset, extent)
}

impl ReshardRunner {
    /// Runs `plans` (each a fusable reduction with one [`fusion_key`]) as one collective:
    /// `local[i]` is this rank's source slice of plan `i`, `out[i]` its destination slice
    /// (allocated, every element overwritten). A rank outside the plans' meshes does nothing.
    pub fn run_fused(
        &mut self,
        plans: &[&ReshardPlan],
        local: &[&Tensor],
        out: &mut [&mut Tensor],
    ) -> Result<(), ReshardError> {
        let Some(first) = plans.first() else {
            return Ok(());
        };
        let key = fusion_key(first).ok_or_else(|| ReshardError::Unsupported {
            what: "fusing a reshard that is not a reduction alone".to_string(),
        })?;
        if plans.iter().any(|p| fusion_key(p).as_ref() != Some(&key)) {
            return Err(ReshardError::Unsupported {
                what: "fusing reductions over different groups, ops or types".to_string(),
            });
        }
        let me = self.rank();
        let Some(g) = key.groups.iter().position(|g| g.contains(&me)) else {
            return Ok(());
        };
        if local.len() != plans.len() || out.len() != plans.len() {
            return Err(ReshardError::LocalMismatch {
                reason: format!(
                    "{} fused plans with {} sources and {} destinations",
                    plans.len(),
                    local.len(),
                    out.len()
                ),
            });
        }
        let deterministic = self.is_deterministic() && key.op == PendingOp::Sum;
        let members = &key.groups[g];
        let n = members.len();
        let j = members
            .iter()
            .position(|&r| r == me)
            .expect("the rank is in its group");
        // The member's part of each plan's slice (the whole slice for an all-reduce).
        let parts: Vec<SliceBox> = plans
            .iter()
            .zip(local)
            .map(|(plan, t)| match key.scatter {
                true => part_box(t.shape(), scatter_dim(plan), n, j),
                false => SliceBox::new(vec![0; t.shape().len()], t.shape().to_vec()),
            })
            .collect();
        if key.scatter && !deterministic {
            // Member k's parts of every plan, one after another, then member k + 1's.
            let mut send = Vec::new();
            let mut counts = Vec::with_capacity(n);
            for k in 0..n {
                let before = send.len();
                for (plan, t) in plans.iter().zip(local) {
                    let dim = scatter_dim(plan);
                    send.extend_from_slice(
                        t.extract_box(&part_box(t.shape(), dim, n, k))?.as_bytes(),
                    );
                }
                counts.push((send.len() - before) / key.dtype.size_in_bytes());
            }
            let send =
                Tensor::from_bytes(key.dtype, &[send.len() / key.dtype.size_in_bytes()], &send)?;
            let mut mine = Tensor::zeros(key.dtype, &[counts[j]]);
            self.group(members)?.reduce_scatter_v(
                Buf::from_tensor(&send),
                BufMut::from_tensor(&mut mine),
                &counts,
                key.op.comm_op(),
            )?;
            let mut at = 0;
            for o in out.iter_mut() {
                let len = o.as_bytes().len();
                o.as_bytes_mut()
                    .copy_from_slice(&mine.as_bytes()[at..at + len]);
                at += len;
            }
            return Ok(());
        }
        // An all-reduce of the concatenation (deterministic mode: also for reduce-scatters,
        // each member then keeping its part, as the unfused deterministic path does).
        let bytes: Vec<u8> = local
            .iter()
            .flat_map(|t| t.as_bytes().iter().copied())
            .collect();
        let mut flat = Tensor::from_bytes(
            key.dtype,
            &[bytes.len() / key.dtype.size_in_bytes()],
            &bytes,
        )?;
        if deterministic {
            let group = self.group(&key.canonical[g])?;
            group.all_reduce_deterministic(&mut flat, key.op.comm_op())?;
        } else {
            self.group(members)?
                .all_reduce(&mut flat, key.op.comm_op())?;
        }
        let mut at = 0;
        for ((o, t), part) in out.iter_mut().zip(local).zip(&parts) {
            let len = t.as_bytes().len();
            let summed = Tensor::from_bytes(key.dtype, t.shape(), &flat.as_bytes()[at..at + len])?;
            at += len;
            let mine = if key.scatter {
                summed.extract_box(part)?
            } else {
                summed
            };
            o.as_bytes_mut().copy_from_slice(mine.as_bytes());
        }
        Ok(())
    }
}

/// The dim a reduce-scatter plan leaves split (0 for an all-reduce).
fn scatter_dim(plan: &ReshardPlan) -> usize {
    match &plan.reduce().expect("a reduction").kind {
        ReduceKind::ReduceScatter { dim } => *dim,
        ReduceKind::AllReduce => 0,
    }
}
