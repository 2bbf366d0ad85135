//! [`Ring`]: the members of one rank's ring, where their sequence blocks start and how long
//! they are.

use graph::Op;
use layout::TensorLayout;

use crate::lower::{KernelStep, Program};

/// One rank's ring: the members in sequence order, where their blocks start and how long
/// they are, and this rank's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// Device ranks, by sequence block.
    pub members: Vec<usize>,
    /// Global position of each member's first row.
    pub offsets: Vec<usize>,
    /// Rows of each member's block.
    pub lengths: Vec<usize>,
    /// This rank's index in `members`.
    pub position: usize,
}

impl Ring {
    /// The ring of `rank` for attention operands laid out as `layout` (`[..., seq, head_dim]`),
    /// or `None` when the sequence dim is not split (or `rank` holds no block).
    ///
    /// The members are the ranks holding the same batch/heads block in the same replica,
    /// ordered by their sequence block.
    pub fn of(layout: &TensorLayout, rank: usize) -> Option<Ring> {
        let ndim = layout.shape().len();
        let seq = ndim.checked_sub(2)?;
        if layout.split_factors()[seq] <= 1 {
            return None;
        }
        let mesh = layout.mesh();
        let mine = mesh.slot_of_rank(rank)?;
        let (block, replica) = (layout.block_index(mine), layout.replica_index(mine));
        let mut members: Vec<(usize, usize, usize, usize)> = (0..mesh.n_slots())
            .filter(|&s| layout.replica_index(s) == replica)
            .filter_map(|s| {
                let b = layout.block_index(s);
                let same_rest = (0..ndim).all(|d| d == seq || b[d] == block[d]);
                let slot_box = layout.slot_box(s);
                same_rest.then(|| {
                    (
                        b[seq],
                        mesh.device_of_slot(s),
                        slot_box.offset[seq],
                        slot_box.shape[seq],
                    )
                })
            })
            .collect();
        members.sort();
        let position = members.iter().position(|m| m.0 == block[seq])?;
        Some(Ring {
            members: members.iter().map(|m| m.1).collect(),
            offsets: members.iter().map(|m| m.2).collect(),
            lengths: members.iter().map(|m| m.3).collect(),
            position,
        })
    }

    /// Members of the ring.
    pub fn n(&self) -> usize {
        self.members.len()
    }

    /// The member whose block this rank holds after `t` passes.
    pub fn held_after(&self, t: usize) -> usize {
        (self.position + self.n() - t % self.n()) % self.n()
    }
}

/// Whether kernel step `k` is an attention step, forward or backward: the steps that may run
/// as ring attention ([`ring_of_step`] says on which ranks).
pub fn is_attention_step(k: &KernelStep) -> bool {
    matches!(
        k.op,
        Op::FlashAttention { .. } | Op::FlashAttentionGrad { .. }
    )
}

/// The ring `rank` runs kernel step `k` of `program` over, when the step is ring attention: a
/// `FlashAttention` (or its gradient) whose queries' sequence dim is split. The one test the
/// executor, the memory prediction and `--explain` share.
pub fn ring_of_step(program: &Program, k: &KernelStep, rank: usize) -> Option<Ring> {
    if !is_attention_step(k) {
        return None;
    }
    Ring::of(program.buffers[*k.inputs.first()?].layout.layout(), rank)
}

#[cfg(test)]
mod tests {
    use super::*;
    use layout::Layout;

    #[test]
    fn a_ring_holds_the_ranks_of_one_batch_and_heads_block_in_sequence_order() {
        // [B, H, S, d] over (dp 2, cp 2, mp 2): heads over mp, sequence over cp.
        let base = Layout::new(&[2, 2, 2], &["dp", "cp", "mp"], None).unwrap();
        let layout = base
            .apply(&["dp".into(), "mp".into(), "cp".into(), "None".into()])
            .unwrap()
            .bind(&[4, 8, 16, 4])
            .unwrap();
        // Rank 5 = (dp 1, cp 0, mp 1): its ring partner is rank 7 = (dp 1, cp 1, mp 1).
        let ring = Ring::of(&layout, 5).unwrap();
        assert_eq!(ring.members, vec![5, 7]);
        assert_eq!(ring.offsets, vec![0, 8]);
        assert_eq!(ring.lengths, vec![8, 8]);
        assert_eq!(ring.position, 0);
        assert_eq!(Ring::of(&layout, 7).unwrap().position, 1);
        // Not split on the sequence: no ring.
        let whole = base
            .apply(&["dp".into(), "mp".into(), "None".into(), "None".into()])
            .unwrap()
            .bind(&[4, 8, 16, 4])
            .unwrap();
        assert_eq!(Ring::of(&whole, 5), None);
    }
}
