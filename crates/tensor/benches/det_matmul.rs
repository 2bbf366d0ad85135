//! Deterministic mode's canonical-order product (`det::det_gemm`) against the routed `gemm`, on
//! the shapes of the GPT benchmark model (`tessera bench gpt-step`: 4 layers, width 256, 128
//! tokens, batch 16, so 2,048 rows; `parallel.deterministic_blocks = 16`), f32, one thread.
//!
//! The two run in interleaved rounds (gemm, det, gemm, …) so both see the same machine load, and
//! each is timed by the thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`), so time the thread spends
//! descheduled on a shared machine is not counted. Prints a Markdown table of GFLOP/s, median
//! (10th percentile – best round), and the median of the per-round ratio det ÷ gemm.
//!
//! Run: `cargo bench -p tessera-tensor --bench det_matmul [-- ROUNDS] [cold] [NAME…]` (default
//! 30 rounds; names keep only the shapes whose names contain one of them). With `cold`, every
//! product starts with its operands out of the caches (64 MiB written between calls, untimed),
//! as in a training step, where a product's input was written by ops long before.

mod common;

use common::{shape, thread_cpu_seconds};
use tensor::kernels::{det, gemm, GemmShape};

/// Weights `[in, out]`: forward `X·W`, `dX = dY·Wᵀ`, `dW = Xᵀ·dY`; attention per head. Then
/// the GPT's own orientation (`Dense` keeps `[out, in]`: forward `X·Wᵀ`, `dX = dY·W`,
/// `dW = dYᵀ·X`) on one rank and, model parallel 2, each rank's half, whose canonical blocks
/// are those of the whole reduction (the third number: the global `k`).
const GPT_SHAPES: [(&str, GemmShape, usize); 18] = [
    ("qkv forward", shape(2048, 768, 256, false, false), 256),
    ("fc1 forward", shape(2048, 1024, 256, false, false), 256),
    ("fc2 forward", shape(2048, 256, 1024, false, false), 1024),
    ("fc1 dX", shape(2048, 256, 1024, false, true), 1024),
    ("fc2 dX", shape(2048, 1024, 256, false, true), 256),
    ("qkv dW", shape(256, 768, 2048, true, false), 2048),
    ("fc1 dW", shape(256, 1024, 2048, true, false), 2048),
    ("scores (one head)", shape(128, 128, 64, false, true), 64),
    ("context (one head)", shape(128, 64, 128, false, false), 128),
    ("dV (one head)", shape(128, 64, 128, true, false), 128),
    (
        "out-in qkv forward",
        shape(2048, 768, 256, false, true),
        256,
    ),
    ("out-in qkv dX", shape(2048, 256, 768, false, false), 768),
    ("out-in fc1 dW", shape(1024, 256, 2048, true, false), 2048),
    ("mp2 qkv forward", shape(2048, 384, 256, false, true), 256),
    ("mp2 fc2 forward", shape(2048, 256, 512, false, true), 1024),
    ("mp2 qkv dX", shape(2048, 256, 384, false, false), 768),
    ("mp2 fc1 dX", shape(2048, 256, 512, false, false), 1024),
    ("mp2 fc2 dX", shape(2048, 512, 256, false, false), 256),
];

/// `parallel.deterministic_blocks`' default.
const MAX_BLOCKS: usize = 16;

/// Deterministic values in [-0.5, 0.5).
fn values(n: usize, step: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * step) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// Median, 10th percentile and best of `samples` (sorted in place).
fn summary(samples: &mut [f64]) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    (
        samples[samples.len() / 2],
        samples[samples.len() / 10],
        samples[samples.len() - 1],
    )
}

fn main() {
    let rounds = common::rounds_arg(30);
    // Any other argument (not a flag) keeps only the shapes whose names contain it.
    let cold = std::env::args().any(|arg| arg == "cold");
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-') && arg.parse::<usize>().is_err() && arg != "cold")
        .collect();
    let mut flush = vec![0u8; if cold { 64 << 20 } else { 0 }];
    // Seconds of `product` over `reps` calls, each after the caches were flushed when `cold`.
    let mut timed = |reps: usize, product: &mut dyn FnMut()| -> f64 {
        let mut total = 0.0;
        for rep in 0..reps {
            if cold {
                flush
                    .iter_mut()
                    .for_each(|b| *b = b.wrapping_add(rep as u8 | 1));
                std::hint::black_box(&flush);
            }
            let start = thread_cpu_seconds();
            product();
            total += thread_cpu_seconds() - start;
        }
        total
    };
    println!("| shape | m×n×k | block | gemm GFLOP/s | det GFLOP/s | det ÷ gemm |");
    println!("|---|---|---|---|---|---|");
    let (mut total_gemm, mut total_det) = (0.0, 0.0);
    for (name, s, global_k) in GPT_SHAPES {
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        let a = values(s.m * s.k, 7919);
        let b = values(s.k * s.n, 104_729);
        let mut c = vec![0f32; s.m * s.n];
        let block_len = global_k / det::canonical_blocks(global_k, MAX_BLOCKS);
        let flops = s.flops() as f64;
        // About 50 MFLOP per timed batch, so short products are not lost in timer resolution.
        let reps = ((5e7 / flops) as usize).max(1);
        let (mut g, mut d, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let tg = timed(reps, &mut || {
                gemm(s, 1.0, &a, &b, 0.0, &mut c).expect("valid shape");
            });
            let td = timed(reps, &mut || {
                det::det_gemm(s, &a, &b, &mut c, block_len).expect("valid shape");
            });
            g.push(flops * reps as f64 / tg / 1e9);
            d.push(flops * reps as f64 / td / 1e9);
            ratio.push(tg / td);
            total_gemm += tg / reps as f64;
            total_det += td / reps as f64;
        }
        let (gm, gp, gb) = summary(&mut g);
        let (dm, dp, db) = summary(&mut d);
        let (rm, rp, rb) = summary(&mut ratio);
        println!(
            "| {name} | {}×{}×{}{}{} | {block_len} | {gm:.1} ({gp:.1}–{gb:.1}) | {dm:.1} ({dp:.1}–{db:.1}) | {rm:.2}× ({rp:.2}–{rb:.2}) |",
            s.m,
            s.n,
            s.k,
            if s.trans_a { " Aᵀ" } else { "" },
            if s.trans_b { " Bᵀ" } else { "" },
        );
    }
    println!(
        "\nAll shapes, one of each: det ÷ gemm throughput {:.2}×",
        total_gemm / total_det
    );
}
