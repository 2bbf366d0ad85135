//! Products whose reduction is cut into chunks, each a `gemm` crate call adding into `C`, against
//! one call (the engine's `gemm` cuts a weight gradient's reduction into chunks of 128,
//! `kernels::matmul::reduction_chunk`), f32, one thread, caches flushed before every repetition
//! as in a training step. The GPT benchmark model's weight gradients (`dW = dYᵀ·X` over 2,048
//! rows, and over 1,024 as data parallel 2 has them), and, for contrast, forward and `dX`
//! products, whose reductions are 256–1,024 long.
//!
//! The forms run in rotated order within each round so that all see the same machine load; each
//! is timed by the thread's CPU clock. Prints the one-call form's GFLOP/s and every chunk size's
//! median per-round speed against it (above 1: the chunks win), p10–p90.
//!
//! Run: `cargo bench -p tessera-tensor --bench reduction_chunks [-- ROUNDS]` (default 20 rounds).

mod common;

use common::{shape, speed_cells, spread, values};
use tensor::kernels::GemmShape;

/// Reduction steps per call; the first is the whole reduction in one call.
const CHUNKS: [usize; 4] = [usize::MAX, 64, 128, 256];

/// The products timed, by name.
const PRODUCTS: [(&str, GemmShape); 9] = [
    ("qkv dW dYᵀ·X", shape(768, 256, 2048, true, false)),
    ("fc1 dW dYᵀ·X", shape(1024, 256, 2048, true, false)),
    ("fc2 dW dYᵀ·X", shape(256, 1024, 2048, true, false)),
    ("proj dW dYᵀ·X", shape(256, 256, 2048, true, false)),
    ("data parallel 2 qkv dW", shape(768, 256, 1024, true, false)),
    (
        "data parallel 2 fc2 dW",
        shape(256, 1024, 1024, true, false),
    ),
    ("qkv forward X·Wᵀ", shape(2048, 768, 256, false, true)),
    ("fc2 forward X·Wᵀ", shape(2048, 256, 1024, false, true)),
    ("fc1 dX dY·W", shape(2048, 256, 1024, false, false)),
];

/// `c ← op(A)·op(B)`, the reduction in calls of `chunk` steps.
fn chunked(p: GemmShape, (a, b, c): (&[f32], &[f32], &mut [f32]), chunk: usize) {
    let (m, n, k) = (p.m, p.n, p.k);
    assert!(a.len() == m * k && b.len() == k * n && c.len() == m * n);
    let (a_rs, a_cs) = p.a_strides();
    let (b_rs, b_cs) = p.b_strides();
    for k0 in (0..k).step_by(chunk.min(k)) {
        let kc = chunk.min(k - k0);
        let add = k0 > 0;
        // SAFETY: the assert keeps every (row, col, step) of the chunk, at these strides,
        // inside its slice; `c` is borrowed mutably and cannot alias `a` or `b`.
        unsafe {
            gemm::gemm(
                m,
                n,
                kc,
                c.as_mut_ptr(),
                1,
                n as isize,
                add,
                a.as_ptr().offset(k0 as isize * a_cs),
                a_cs,
                a_rs,
                b.as_ptr().offset(k0 as isize * b_rs),
                b_cs,
                b_rs,
                if add { 1.0 } else { 0.0 },
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    }
}

fn main() {
    let rounds = common::rounds_arg(20);
    let mut flush = vec![0u8; 64 << 20];
    println!("| product, f32, 1 thread | m×n×k | one call GFLOP/s | chunks of 64 | 128 | 256 |");
    println!("|---|---|---:|---:|---:|---:|");
    for (name, p) in PRODUCTS {
        let (a, b) = (values(p.m * p.k, 1), values(p.k * p.n, 2));
        let mut c = vec![0f32; p.m * p.n];
        let times = common::rotated_rounds(rounds, &CHUNKS, &mut flush, |chunk| {
            if let Some(chunk) = chunk {
                chunked(p, (&a, &b, &mut c), chunk)
            }
        });
        let rate = 2.0 * (p.m * p.n * p.k) as f64 / spread(times[0].clone()).1 / 1e9;
        let cells = speed_cells(&times);
        println!("| {name} | {}×{}×{} | {rate:.1} |{cells}", p.m, p.n, p.k);
    }
}
