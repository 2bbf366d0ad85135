//! Threads inside a rank: how many threads a large matrix product may use (`train.threads_per_rank`;
//! 1 by default, the one-core-per-rank model).
//!
//! Only [`gemm`](fn@super::gemm)'s `gemm`-crate backends use them, splitting the output into
//! tiles (the `gemm` crate's rayon parallelism): every element is still summed over the
//! contracted dim in the same order, so a product is bitwise the same on any thread count
//! (tested in `tests/kernels/matmul.rs`). Products below [`MIN_PARALLEL_FLOPS`] stay on the
//! calling thread, where spreading them would cost more than it saves.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The threads a product may use; process-wide (every rank of the process shares the setting).
static THREADS: AtomicUsize = AtomicUsize::new(1);

/// The fewest floating-point operations (2·m·n·k) a product needs to be split over threads.
pub const MIN_PARALLEL_FLOPS: u64 = 1 << 22;

/// The most threads a product may be split over.
pub const MAX_THREADS: usize = 256;

/// Lets every later product of this process use up to `threads` threads (clamped to
/// `1..=MAX_THREADS`).
pub fn set_threads(threads: usize) {
    THREADS.store(threads.clamp(1, MAX_THREADS), Ordering::Relaxed);
}

/// The threads a product may use (1 unless [`set_threads`] raised it).
pub fn threads() -> usize {
    THREADS.load(Ordering::Relaxed)
}

/// The threads a product of `flops` operations uses.
pub(crate) fn threads_for(flops: u64) -> usize {
    match threads() {
        n if n > 1 && flops >= MIN_PARALLEL_FLOPS => n,
        _ => 1,
    }
}
