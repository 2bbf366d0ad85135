//! Ring attention's communication, as the plan sees it: a `FlashAttention` (or its gradient)
//! whose sequence dim is split runs over rings of ranks (context parallel,
//! `exec::ring` runs them), passing key/value blocks from member to member.
//!
//! Forward: every member sends its key and value blocks on `n − 1` times. Backward: the same
//! `n − 1` passes of keys and values, and `n` passes of their gradient accumulators (the last
//! brings each block's gradients home).
//!
//! Under the causal mask a contiguous split is unbalanced: the member holding the last block
//! attends to every key, the first only to its own. So a causal ring whose blocks have one even
//! length attends in the **zigzag** placement ([`Zigzag`]): the sequence is cut into `2n` chunks,
//! and member `i` attends with chunks `i` and `2n − 1 − i`, which gives every member the same
//! work at every pass. The operands move to that placement before the passes and the results
//! come back after, so everything outside the attention keeps its contiguous split.
//!
//! In deterministic mode the passes gather the operands whole instead (keys and values
//! forward; queries, keys, values, the output's gradient, lse and delta backward), and each
//! rank attends as one device does: bitwise one device's, at the price of the whole sequence's
//! operands held during the step and, backward, each rank computing its queries' gradient and
//! its keys' gradients in two calls.

mod members;
mod workspace;

use graph::Op;

use crate::lower::{KernelStep, Program};
pub use members::{is_attention_step, ring_of_step, Ring};
pub use workspace::{ring_element_bytes, ring_workspace_bytes, ring_workspace_bytes_max, RingCall};

/// The zigzag placement of a ring of `members` (see the module's doc): chunk `x` of the
/// sequence (of `2 · members` equal chunks) is *owned* by member `x / 2` (the contiguous split)
/// and *held*, while the ring attends, by member `x` if `x < members`, else `2 · members − 1 − x`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zigzag {
    /// Members of the ring.
    pub members: usize,
}

impl Zigzag {
    /// The placement of a ring whose members' blocks have the rows `block_rows` (in sequence
    /// order), when it applies: a causal mask, at least two members, and one even block length.
    pub fn of(causal: bool, block_rows: &[usize]) -> Option<Zigzag> {
        let first = *block_rows.first()?;
        let applies = causal
            && block_rows.len() > 1
            && first > 0
            && first % 2 == 0
            && block_rows.iter().all(|&rows| rows == first);
        applies.then_some(Zigzag {
            members: block_rows.len(),
        })
    }

    /// The chunks member `member` holds while the ring attends, in sequence order.
    pub fn held(&self, member: usize) -> [usize; 2] {
        [member, 2 * self.members - 1 - member]
    }

    /// The member holding chunk `chunk` while the ring attends.
    pub fn holder(&self, chunk: usize) -> usize {
        if chunk < self.members {
            chunk
        } else {
            2 * self.members - 1 - chunk
        }
    }

    /// The member owning chunk `chunk` in the contiguous split.
    pub fn owner(chunk: usize) -> usize {
        chunk / 2
    }

    /// Chunks whose holder is not their owner: each moves once to the placement and once back.
    pub fn moved_chunks(&self) -> usize {
        (0..2 * self.members)
            .filter(|&x| self.holder(x) != Zigzag::owner(x))
            .count()
    }
}

/// One ring attention step's communication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingTraffic {
    /// Members of each ring.
    pub members: usize,
    /// Rings (ranks holding the operands, over `members`).
    pub rings: usize,
    /// Passes of blocks around the ring.
    pub passes: usize,
    /// Bytes every rank sends in the passes.
    pub bytes_per_rank: usize,
    /// Bytes each ring moves to the zigzag placement and back (0 when it attends contiguously).
    pub zigzag_bytes_per_ring: usize,
    /// Deterministic mode: the passes gather the operands whole, which are then attended in
    /// one device's order (no zigzag placement).
    pub gathered: bool,
}

impl RingTraffic {
    /// Bytes the step moves over all ranks.
    pub fn bytes_total(&self) -> usize {
        (self.bytes_per_rank * self.members + self.zigzag_bytes_per_ring) * self.rings
    }
}

/// The ring traffic of kernel step `k` of `program`, if it is ring attention.
pub fn ring_traffic(program: &Program, k: &KernelStep) -> Option<RingTraffic> {
    let (forward, causal) = match k.op {
        Op::FlashAttention { causal, .. } => (true, causal),
        Op::FlashAttentionGrad { causal, .. } => (false, causal),
        _ => return None,
    };
    let key = &program.buffers[*k.inputs.get(1)?];
    let layout = key.layout.layout();
    let block = RingBlock::of(
        layout.shape(),
        &layout.split_factors(),
        ring_element_bytes(key.dtype),
    )?;
    let rings = layout.mesh().n_slots() / block.members;
    Some(block.traffic(rings, causal, forward, program.placed.config.deterministic))
}

/// One member's key (or value) block of a ring: what its traffic is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingBlock {
    /// Members of the ring (the sequence's split factor).
    pub members: usize,
    /// Sequence rows of each member's block.
    pub rows: usize,
    /// Elements of a row (the head dim).
    pub head_dim: usize,
    /// Bytes of the block (every slice of its batch and heads).
    pub bytes: usize,
}

impl RingBlock {
    /// The block of keys of `shape` (`[..., seq, head_dim]`, `elem_bytes` bytes an element)
    /// split by `factors`, when the sequence dim is split (a ring of more than one member).
    pub fn of(shape: &[usize], factors: &[usize], elem_bytes: usize) -> Option<RingBlock> {
        let seq = shape.len().checked_sub(2)?;
        let members = factors.get(seq).copied().unwrap_or(1);
        if members <= 1 {
            return None;
        }
        let elements: usize = shape
            .iter()
            .zip(factors.iter().chain(std::iter::repeat(&1)))
            .map(|(&d, &f)| d / f.max(1))
            .product();
        Some(RingBlock {
            members,
            rows: shape[seq] / members,
            head_dim: shape[seq + 1],
            bytes: elements * elem_bytes,
        })
    }

    /// The traffic of one ring step over blocks like this one, in `rings` rings: the forward
    /// pass or the backward pass, in the ordinary order or deterministic mode's (the operands
    /// gathered whole).
    pub fn traffic(
        &self,
        rings: usize,
        causal: bool,
        forward: bool,
        deterministic: bool,
    ) -> RingTraffic {
        let (members, block_bytes) = (self.members, self.bytes);
        if deterministic {
            // One device's order: the operands gathered whole, each block passed n − 1 times —
            // keys and values forward; queries, keys, values and the output's gradient (wide)
            // and lse and delta (one per row) backward.
            let narrow_bytes = block_bytes / self.head_dim.max(1);
            let per_pass = if forward {
                2 * block_bytes
            } else {
                4 * block_bytes + 2 * narrow_bytes
            };
            return RingTraffic {
                members,
                rings,
                passes: members - 1,
                bytes_per_rank: per_pass * (members - 1),
                zigzag_bytes_per_ring: 0,
                gathered: true,
            };
        }
        // Keys and values n − 1 times; backward also their gradients n times.
        let (passes, bytes_per_rank) = if forward {
            (members - 1, 2 * block_bytes * (members - 1))
        } else {
            (members, 2 * block_bytes * (2 * members - 1))
        };
        let zigzag_bytes_per_ring = match Zigzag::of(causal, &vec![self.rows; members]) {
            Some(zigzag) => {
                // A chunk is half a block: `head_dim`-wide rows of q, k, v, out (forward) or q,
                // k, v, dout, dq, dk, dv (backward), and one-wide rows of lse (and delta).
                let row_bytes = block_bytes / self.rows.max(1) / self.head_dim.max(1);
                let widths = if forward {
                    4 * self.head_dim + 1
                } else {
                    7 * self.head_dim + 2
                };
                zigzag.moved_chunks() * (self.rows / 2) * widths * row_bytes
            }
            None => 0,
        };
        RingTraffic {
            members,
            rings,
            passes,
            bytes_per_rank,
            zigzag_bytes_per_ring,
            gathered: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chunk is held by exactly one member, each member holds two, and under the causal
    /// mask every member attends to the same number of (query chunk, key chunk) pairs at
    /// every pass of the ring.
    #[test]
    fn the_zigzag_placement_balances_every_pass() {
        for n in 2..=9 {
            let z = Zigzag::of(true, &vec![4; n]).unwrap();
            let mut seen = vec![0; 2 * n];
            for m in 0..n {
                for x in z.held(m) {
                    assert_eq!(z.holder(x), m);
                    seen[x] += 1;
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "n {n}: {seen:?}");
            // Work of a (query chunk a, key chunk b) pair: 2 when b < a, 1 on the diagonal.
            let work = |a: usize, b: usize| match b.cmp(&a) {
                std::cmp::Ordering::Less => 2,
                std::cmp::Ordering::Equal => 1,
                std::cmp::Ordering::Greater => 0,
            };
            for t in 0..n {
                let per_member: Vec<usize> = (0..n)
                    .map(|m| {
                        let j = (m + n - t) % n;
                        let mine = z.held(m);
                        z.held(j)
                            .iter()
                            .map(|&b| mine.iter().map(|&a| work(a, b)).sum::<usize>())
                            .sum()
                    })
                    .collect();
                assert!(
                    per_member.iter().all(|&w| w == per_member[0]),
                    "n {n}, pass {t}: {per_member:?}"
                );
            }
        }
        // Not causal, odd blocks, unequal blocks or one member: contiguous.
        assert_eq!(Zigzag::of(false, &[4, 4]), None);
        assert_eq!(Zigzag::of(true, &[3, 3]), None);
        assert_eq!(Zigzag::of(true, &[4, 2]), None);
        assert_eq!(Zigzag::of(true, &[4]), None);
        // n = 2: chunks 1 and 3 trade places; n = 3: all but chunk 0 move.
        assert_eq!(Zigzag { members: 2 }.moved_chunks(), 2);
        assert_eq!(Zigzag { members: 3 }.moved_chunks(), 5);
    }
}
