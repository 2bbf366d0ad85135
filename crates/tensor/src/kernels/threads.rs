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
//! ([`for_each_slices`]); LayerNorm, the cross entropy, permutes, and (from other crates,
//! through [`for_each_part`]) `Concat`, `Split` and the optimizer's rules cut their own parts. Work below [`MIN_PARALLEL_FLOPS`] / [`MIN_PARALLEL_ELEMENTS`] stays on
//! the calling thread, where spreading it would cost more than it saves. Every split runs on
//! [`pool`], part `k` always on its thread `k`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

mod pool;

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
/// one the rest), `f` run on each by [`for_each_part`]; or `f` once on all of `out` when the work
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
    let chunk = out.len().div_ceil(n).next_multiple_of(granule);
    let parts: Vec<&mut [T]> = out.chunks_mut(chunk).collect();
    for_each_part(parts, |i, part| f(i * chunk, part));
}

/// Rows per part when `rows` rows of `cols` elements are cut into one part per allowed thread:
/// all of them (one part) when they hold fewer than [`MIN_PARALLEL_ELEMENTS`] elements or one
/// thread is allowed; at least 1.
pub fn rows_per_part(rows: usize, cols: usize) -> usize {
    let n = threads();
    if n < 2 || rows.saturating_mul(cols) < MIN_PARALLEL_ELEMENTS {
        return rows.max(1);
    }
    rows.div_ceil(n).max(1)
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
    let per = n_slices.div_ceil(n);
    let parts: Vec<_> = a
        .chunks_mut(per * a_len)
        .zip(b.chunks_mut(per * b_len))
        .zip(c.chunks_mut(per * c_len))
        .collect();
    for_each_part(parts, |i, ((a, b), c)| f(i * per, a.len() / a_len, a, b, c))
        .into_iter()
        .collect()
}

/// The threads a product of `flops` operations uses.
pub(crate) fn threads_for(flops: u64) -> usize {
    match threads() {
        n if n > 1 && flops >= MIN_PARALLEL_FLOPS => n,
        _ => 1,
    }
}

/// Runs `f(i, part)` on every part, part `i` on thread `i mod n` of the [`pool`] of `n` =
/// [`threads`] threads (thread 0 the caller); their results in order.
///
/// The same part of every split kernel thus runs on the same core from one op to the next: a
/// band of rows one op writes is still in that core's cache when the next op reads it. With one
/// thread allowed, or the pool busy with another rank's kernel, the parts run in order on the
/// caller.
pub fn for_each_part<P, R, F>(parts: Vec<P>, f: F) -> Vec<R>
where
    P: Send,
    R: Send,
    F: Fn(usize, P) -> R + Sync,
{
    for_each_part_on(threads(), parts, f)
}

/// [`for_each_part`] on `n` threads.
fn for_each_part_on<P, R, F>(n: usize, parts: Vec<P>, f: F) -> Vec<R>
where
    P: Send,
    R: Send,
    F: Fn(usize, P) -> R + Sync,
{
    if n > 1 && parts.len() > 1 {
        if let Some(pool) = pool::Pool::get(n) {
            // Each slot is taken by exactly one thread (`i mod n`): its lock is never
            // contended.
            let slots: Vec<Mutex<Slot<P, R>>> = parts
                .into_iter()
                .map(|p| Mutex::new(Slot::Part(p)))
                .collect();
            let run_slot = |i: usize| {
                let mut slot = slots[i].lock().unwrap_or_else(PoisonError::into_inner);
                if let Slot::Part(part) = std::mem::replace(&mut *slot, Slot::Taken) {
                    *slot = Slot::Done(f(i, part));
                }
            };
            if !pool.run(&|k| (k..slots.len()).step_by(n).for_each(run_slot)) {
                (0..slots.len()).for_each(run_slot);
            }
            return slots
                .into_iter()
                .map(
                    |slot| match slot.into_inner().unwrap_or_else(PoisonError::into_inner) {
                        Slot::Done(r) => r,
                        // `run` returns only when every share has run (re-raising a panic).
                        Slot::Part(_) | Slot::Taken => unreachable!("every part has run"),
                    },
                )
                .collect();
        }
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| f(i, p))
        .collect()
}

/// One part of [`for_each_part`]: waiting, being computed, or its result.
enum Slot<P, R> {
    Part(P),
    Taken,
    Done(R),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::ThreadId;

    /// The thread that computed each part, and the parts' results.
    fn run(n: usize, parts: usize) -> (Vec<ThreadId>, Vec<usize>) {
        let out = for_each_part_on(n, (0..parts).collect(), |i, p: usize| {
            assert_eq!(i, p, "part {i} was handed part {p}");
            (std::thread::current().id(), p * 10)
        });
        out.into_iter().unzip()
    }

    #[test]
    fn every_part_runs_once_and_always_on_the_same_thread() {
        // Thread counts no other test uses: a busy pool would run every part on the caller.
        for n in [4, 5] {
            let (first, results) = run(n, 7);
            assert_eq!(results, (0..7).map(|p| p * 10).collect::<Vec<_>>());
            let (second, _) = run(n, 7);
            assert_eq!(first, second, "{n} threads: a part moved to another thread");
            for i in 0..7 {
                // Part i and part i + n share a thread; parts of other residues do not.
                for j in 0..7 {
                    let same = first[i] == first[j];
                    assert_eq!(same, i % n == j % n, "{n} threads: parts {i} and {j}");
                }
            }
            assert_eq!(
                first[0],
                std::thread::current().id(),
                "part 0 runs on the caller"
            );
        }
    }

    #[test]
    fn a_panic_in_a_helper_s_part_reaches_the_caller_and_the_pool_still_works() {
        // A thread count no other test uses, so that the helper is this test's alone.
        let n = 6;
        for failing in [1, 0] {
            let caught = std::panic::catch_unwind(|| {
                for_each_part_on(n, (0..n).collect(), |_, p: usize| {
                    assert!(p != failing, "part {failing} fails");
                    p
                })
            });
            assert!(caught.is_err(), "part {failing}'s panic was lost");
        }
        let (threads, results) = run(n, n);
        assert_eq!(results, (0..n).map(|p| p * 10).collect::<Vec<_>>());
        assert_ne!(
            threads[1], threads[0],
            "after a panic the parts all ran on the caller"
        );
    }

    #[test]
    fn callers_on_several_threads_at_once_all_get_every_part() {
        std::thread::scope(|scope| {
            let callers: Vec<_> = (0..4)
                .map(|c| {
                    scope.spawn(move || {
                        (0..200)
                            .map(|_| for_each_part_on(2, (0..5).collect(), |_, p: usize| p + c))
                            .all(|r| r == (0..5).map(|p| p + c).collect::<Vec<_>>())
                    })
                })
                .collect();
            for caller in callers {
                assert!(caller.join().expect("a caller panicked"));
            }
        });
    }
}
