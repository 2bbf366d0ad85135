//! Ring attention's communication, as the plan sees it: a `FlashAttention` (or its gradient)
//! whose sequence dim is split runs over rings of ranks (context parallel,
//! `exec::ring` runs them), passing key/value blocks from member to member.
//!
//! Forward: every member sends its key and value blocks on `n − 1` times. Backward: the same
//! `n − 1` passes of keys and values, and `n` passes of their gradient accumulators (the last
//! brings each block's gradients home).

use graph::Op;

use crate::lower::{KernelStep, Program};

/// One ring attention step's communication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingTraffic {
    /// Members of each ring.
    pub members: usize,
    /// Rings (ranks holding the operands, over `members`).
    pub rings: usize,
    /// Passes of blocks around the ring.
    pub passes: usize,
    /// Bytes every rank sends.
    pub bytes_per_rank: usize,
}

impl RingTraffic {
    /// Bytes the step moves over all ranks.
    pub fn bytes_total(&self) -> usize {
        self.bytes_per_rank * self.members * self.rings
    }
}

/// The ring traffic of kernel step `k` of `program`, if it is ring attention.
pub fn ring_traffic(program: &Program, k: &KernelStep) -> Option<RingTraffic> {
    let forward = match k.op {
        Op::FlashAttention { .. } => true,
        Op::FlashAttentionGrad { .. } => false,
        _ => return None,
    };
    let key = &program.buffers[*k.inputs.get(1)?];
    let layout = key.layout.layout();
    let seq = layout.shape().len().checked_sub(2)?;
    let members = layout.split_factors()[seq];
    if members <= 1 {
        return None;
    }
    let block_bytes = layout.slice_elements() * key.dtype.size_in_bytes();
    // Keys and values n − 1 times; backward also their gradients n times.
    let (passes, bytes_per_rank) = if forward {
        (members - 1, 2 * block_bytes * (members - 1))
    } else {
        (members, 2 * block_bytes * (2 * members - 1))
    };
    Some(RingTraffic {
        members,
        rings: layout.mesh().n_slots() / members,
        passes,
        bytes_per_rank,
    })
}
