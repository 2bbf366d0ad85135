//! Splitting buffers into per-rank chunks and messages, and choosing collective schedules:
//! the pure arithmetic under the MPI backend's point-to-point collectives (`mpi/p2p.rs`),
//! compiled and tested in every build.
#![cfg_attr(not(feature = "mpi"), allow(dead_code))]

use std::ops::Range;

/// How an all-reduce of one size runs on one group size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllReduceAlgorithm {
    /// `log p` exchanges of the whole buffer (plus a fold when `p` is not a power of two):
    /// fewest messages, for small buffers.
    RecursiveDoubling,
    /// Reduce-scatter then all-gather around a ring, `2(p−1)` steps of `1/p` of the buffer:
    /// bandwidth-optimal, for large buffers.
    Ring,
}

/// The all-reduce algorithm for `bytes`, from sweeps of both against `MPI_Allreduce` on 2, 3,
/// 4 and 8 ranks on the benchmark machine (docs/PERFORMANCE.md): the crossover came out at
/// 64 KiB for every rank count.
pub(crate) fn all_reduce_algorithm(bytes: usize) -> AllReduceAlgorithm {
    if bytes <= 64 << 10 {
        AllReduceAlgorithm::RecursiveDoubling
    } else {
        AllReduceAlgorithm::Ring
    }
}

/// `0..len` in consecutive ranges of at most `piece` bytes (one empty range when `len` is 0,
/// so that empty transfers still match up).
pub(crate) fn pieces(len: usize, piece: usize) -> impl Iterator<Item = Range<usize>> {
    let count = len.div_ceil(piece).max(1);
    (0..count).map(move |k| k * piece..((k + 1) * piece).min(len))
}

/// `count` elements of `elem` bytes split into `parts` near-equal byte ranges (the first
/// `count % parts` one element longer).
pub(crate) fn balanced_chunks(count: usize, parts: usize, elem: usize) -> Vec<Range<usize>> {
    let (base, extra) = (count / parts, count % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = (base + usize::from(i < extra)) * elem;
            start += len;
            start - len..start
        })
        .collect()
}

/// Byte ranges of consecutive pieces of the given element counts.
pub(crate) fn chunks_of(counts: &[usize], elem: usize) -> Vec<Range<usize>> {
    let mut start = 0;
    counts
        .iter()
        .map(|&c| {
            start += c * elem;
            start - c * elem..start
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_buffer_once() {
        let chunks = balanced_chunks(10, 4, 4);
        assert_eq!(chunks, vec![0..12, 12..24, 24..32, 32..40]);
        assert_eq!(balanced_chunks(2, 3, 8), vec![0..8, 8..16, 16..16]);
        assert_eq!(chunks_of(&[2, 0, 3], 2), vec![0..4, 4..4, 4..10]);
    }

    #[test]
    fn pieces_split_long_transfers_and_keep_empty_ones() {
        assert_eq!(pieces(0, 4).collect::<Vec<_>>(), vec![0..0]);
        assert_eq!(pieces(10, 4).collect::<Vec<_>>(), vec![0..4, 4..8, 8..10]);
        assert_eq!(pieces(8, 4).collect::<Vec<_>>(), vec![0..4, 4..8]);
    }

    #[test]
    fn small_buffers_double_and_large_ones_ring() {
        use AllReduceAlgorithm::*;
        assert_eq!(all_reduce_algorithm(1 << 10), RecursiveDoubling);
        assert_eq!(all_reduce_algorithm(64 << 10), RecursiveDoubling);
        assert_eq!(all_reduce_algorithm((64 << 10) + 4), Ring);
    }
}
