//! The GPT benchmark model's products (`Dense` keeps `[out, in]`: forward `X·Wᵀ`, `dX = dY·W`,
//! `dW = dYᵀ·X` over the 2,048 tokens of a step; then data parallel 2's 1,024-token halves and
//! model parallel 2's halves of the weights, and three of a model 1,024 wide) on the engine's
//! `gemm` backends, through
//! [`gemm_with`] as the engine calls them (the column-major form's transpose back into `C`
//! included): the `gemm` crate row-major and column-major, and the engine's own tiles. f32, one
//! thread, the caches flushed before every repetition as in a training step. The backends run in
//! rotated order within each round; each is timed by the thread's CPU clock. Prints each
//! backend's GFLOP/s at its median, the other forms' median per-round speed against the
//! row-major crate's (above 1: they win; p10–p90), and the backend [`GemmBackend::for_shape`]
//! routes the shape to on this CPU.
//!
//! Run: `cargo bench -p tessera-tensor --bench gpt_backends [-- ROUNDS]` (default 30 rounds).

mod common;

use common::{shape, speed_cells, spread, values};
use tensor::kernels::{gemm_with, GemmBackend, GemmShape};

/// The products beyond [`common::GPT_PRODUCTS`], named.
const MORE_PRODUCTS: [(&str, GemmShape); 13] = [
    ("dp2 qkv forward", shape(1024, 768, 256, false, true)),
    ("dp2 fc2 forward", shape(1024, 256, 1024, false, true)),
    ("dp2 qkv dX", shape(1024, 256, 768, false, false)),
    ("dp2 fc1 dW", shape(1024, 256, 1024, true, false)),
    ("mp2 qkv forward", shape(2048, 384, 256, false, true)),
    ("mp2 fc2 forward", shape(2048, 256, 512, false, true)),
    ("mp2 qkv dX", shape(2048, 256, 384, false, false)),
    ("mp2 fc1 dX", shape(2048, 256, 512, false, false)),
    ("mp2 fc2 dX", shape(2048, 512, 256, false, false)),
    ("mp2 fc1 dW", shape(512, 256, 2048, true, false)),
    (
        "width 1024 fc2 forward",
        shape(2048, 1024, 4096, false, true),
    ),
    ("width 1024 fc1 dX", shape(2048, 1024, 4096, false, false)),
    ("width 1024 fc1 dW", shape(4096, 1024, 2048, true, false)),
];

const BACKENDS: [GemmBackend; 3] = [
    GemmBackend::Gemm,
    GemmBackend::GemmColumnMajor,
    GemmBackend::Tiles,
];

fn main() {
    let rounds = common::rounds_arg(30);
    let mut flush = vec![0u8; 64 << 20];
    println!("| product, f32, 1 thread | m×n×k | gemm GFLOP/s | gemm_colmajor GFLOP/s | tiles GFLOP/s | colmajor ÷ gemm | tiles ÷ gemm | routed to |");
    println!("|---|---|---:|---:|---:|---:|---:|---|");
    for &(name, s) in common::GPT_PRODUCTS.iter().chain(&MORE_PRODUCTS) {
        let (a, b) = (values(s.m * s.k, 1), values(s.k * s.n, 2));
        let mut c = vec![0f32; s.m * s.n];
        let forms: Vec<usize> = (0..BACKENDS.len()).collect();
        let times = common::rotated_rounds(rounds, &forms, &mut flush, |form| {
            if let Some(i) = form {
                gemm_with(BACKENDS[i], s, 1.0, &a, &b, 0.0, &mut c).expect("valid shape");
            }
        });
        let flops = 2.0 * (s.m * s.n * s.k) as f64;
        let rate = |t: &[f64]| flops / spread(t.to_vec()).1 / 1e9;
        println!(
            "| {name} | {}×{}×{} | {:.1} | {:.1} | {:.1} |{} {} |",
            s.m,
            s.n,
            s.k,
            rate(&times[0]),
            rate(&times[1]),
            rate(&times[2]),
            speed_cells(&times),
            GemmBackend::for_shape(&s).name()
        );
    }
}
