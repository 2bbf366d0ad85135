//! The GPT benchmark model's products (`Dense` keeps `[out, in]`: forward `X·Wᵀ`, `dX = dY·W`,
//! `dW = dYᵀ·X` over the 2,048 tokens of a step) on the engine's two `gemm` crate backends,
//! through [`gemm_with`] as the engine calls them (the column-major form's transpose back into
//! `C` included), f32, one thread, the caches flushed before every repetition as in a training
//! step. The backends run in rotated order within each round; each is timed by the thread's CPU
//! clock. Prints each backend's GFLOP/s at its median, the column-major form's median per-round
//! speed against the row-major one (above 1: it wins; p10–p90), and the backend
//! [`GemmBackend::for_shape`] routes the shape to.
//!
//! Run: `cargo bench -p tessera-tensor --bench gpt_backends [-- ROUNDS]` (default 30 rounds).

mod common;

use common::{shape, spread, values};
use tensor::kernels::{gemm_with, GemmBackend, GemmShape};

/// The products, named.
const PRODUCTS: [(&str, GemmShape); 12] = [
    ("qkv forward X·Wᵀ", shape(2048, 768, 256, false, true)),
    ("fc1 forward X·Wᵀ", shape(2048, 1024, 256, false, true)),
    ("fc2 forward X·Wᵀ", shape(2048, 256, 1024, false, true)),
    ("proj forward X·Wᵀ", shape(2048, 256, 256, false, true)),
    ("qkv dX dY·W", shape(2048, 256, 768, false, false)),
    ("fc1 dX dY·W", shape(2048, 256, 1024, false, false)),
    ("fc2 dX dY·W", shape(2048, 1024, 256, false, false)),
    ("qkv dW dYᵀ·X", shape(768, 256, 2048, true, false)),
    ("fc1 dW dYᵀ·X", shape(1024, 256, 2048, true, false)),
    ("fc2 dW dYᵀ·X", shape(256, 1024, 2048, true, false)),
    ("proj dW dYᵀ·X", shape(256, 256, 2048, true, false)),
    ("lm head dW dYᵀ·X", shape(256, 256, 2048, true, false)),
];

const BACKENDS: [GemmBackend; 2] = [GemmBackend::Gemm, GemmBackend::GemmColumnMajor];

fn main() {
    let rounds = common::rounds_arg(30);
    let mut flush = vec![0u8; 64 << 20];
    println!("| product, f32, 1 thread | m×n×k | gemm GFLOP/s | gemm_colmajor GFLOP/s | colmajor ÷ gemm | routed to |");
    println!("|---|---|---:|---:|---:|---|");
    for (name, s) in PRODUCTS {
        let (a, b) = (values(s.m * s.k, 1), values(s.k * s.n, 2));
        let mut c = vec![0f32; s.m * s.n];
        let forms = [0, 1];
        let times = common::rotated_rounds(rounds, &forms, &mut flush, |form| {
            if let Some(i) = form {
                gemm_with(BACKENDS[i], s, 1.0, &a, &b, 0.0, &mut c).expect("valid shape");
            }
        });
        let flops = 2.0 * (s.m * s.n * s.k) as f64;
        let rate = |t: &[f64]| flops / spread(t.to_vec()).1 / 1e9;
        let (lo, mid, hi) = spread(times[0].iter().zip(&times[1]).map(|(r, c)| r / c).collect());
        println!(
            "| {name} | {}×{}×{} | {:.1} | {:.1} | {mid:.3} ({lo:.3}–{hi:.3}) | {} |",
            s.m,
            s.n,
            s.k,
            rate(&times[0]),
            rate(&times[1]),
            GemmBackend::for_shape(&s).name()
        );
    }
}
