//! Threads inside a rank: how many threads a large matrix product may use (`train.threads_per_rank`;
//! 1 by default, the one-core-per-rank model).
//!
//! [`gemm`](fn@super::gemm)'s `gemm`-crate backends cut the output into one band of rows (or
//! columns) per thread, each band one single-threaded product: every element is still summed
//! over the contracted dim in the same order, so a product is bitwise the same on any thread
//! count (tested in `tests/kernels/matmul.rs`); a batch of products each too small to split is shared out whole
//! among the threads; the unary kernels and their gradients (GeLU, …) split their elements
//! ([`for_each_chunk`]), the softmax (and its gradient) and the bias add their rows
//! ([`for_each_rows`]), the fused attention its independent (batch, head) slices
//! ([`for_each_slices`]). Work below [`MIN_PARALLEL_FLOPS`] / [`MIN_PARALLEL_ELEMENTS`] stays on
//! the calling thread, where spreading it would cost more than it saves.

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

/// The fewest elements an elementwise kernel needs to be split over threads.
pub const MIN_PARALLEL_ELEMENTS: usize = 1 << 15;

/// Runs `f(start, chunk)` over consecutive chunks of `out` that together cover it — on the
/// allowed threads when `out` has at least [`MIN_PARALLEL_ELEMENTS`], else once on the whole of
/// it. For elementwise kernels: each element is computed as on one thread, so the bits are the
/// same; `f` reads its inputs at `start..start + chunk.len()`.
pub(crate) fn for_each_chunk<T, F>(out: &mut [T], f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    // Whole cache lines per chunk.
    split(out, 64, f)
}

/// [`for_each_chunk`] for row-wise kernels: every chunk holds whole rows of `cols` elements
/// (each row is computed as on one thread).
pub(crate) fn for_each_rows<T, F>(out: &mut [T], cols: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    split(out, cols, f)
}

/// `out` cut into one chunk per allowed thread, each a multiple of `granule` elements (the last
/// one the rest), `f` run on each on the rayon pool; or `f` once on all of `out` when the work
/// is too small or one thread is allowed.
fn split<T, F>(out: &mut [T], granule: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    let n = threads();
    if n < 2 || granule == 0 || out.len() < MIN_PARALLEL_ELEMENTS {
        f(0, out);
        return;
    }
    use rayon::prelude::*;
    let chunk = out.len().div_ceil(n).next_multiple_of(granule);
    out.par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(i, part)| f(i * chunk, part));
}

/// Runs `f(first, count, a, b, c)` over consecutive parts of `n_slices` independent slices, where
/// slice `i` owns `a[i·a_len..]`, `b[i·b_len..]` and `c[i·c_len..]` (each buffer holds exactly
/// `n_slices` slices) — on the allowed threads when the slices together cost at least
/// [`MIN_PARALLEL_FLOPS`] (`flops_per_slice` each) and there are two or more, else once on all
/// of them; returns the first error a part returns. Each slice is computed whole by one call, so
/// the bits do not depend on the split.
pub(crate) fn for_each_slices<A, B, C, E, F>(
    n_slices: usize,
    flops_per_slice: u64,
    (a, a_len): (&mut [A], usize),
    (b, b_len): (&mut [B], usize),
    (c, c_len): (&mut [C], usize),
    f: F,
) -> Result<(), E>
where
    A: Send,
    B: Send,
    C: Send,
    E: Send,
    F: Fn(usize, usize, &mut [A], &mut [B], &mut [C]) -> Result<(), E> + Sync,
{
    let total = flops_per_slice.saturating_mul(n_slices as u64);
    let n = threads_for(total).min(n_slices);
    // A zero-length slice cannot be cut into chunks; it has nothing to compute in parallel.
    if n < 2 || a_len == 0 || b_len == 0 || c_len == 0 {
        return f(0, n_slices, a, b, c);
    }
    use rayon::prelude::*;
    let per = n_slices.div_ceil(n);
    a.par_chunks_mut(per * a_len)
        .zip(b.par_chunks_mut(per * b_len))
        .zip(c.par_chunks_mut(per * c_len))
        .enumerate()
        .try_for_each(|(i, ((a, b), c))| f(i * per, a.len() / a_len, a, b, c))
}

/// The threads a product of `flops` operations uses.
pub(crate) fn threads_for(flops: u64) -> usize {
    match threads() {
        n if n > 1 && flops >= MIN_PARALLEL_FLOPS => n,
        _ => 1,
    }
}
