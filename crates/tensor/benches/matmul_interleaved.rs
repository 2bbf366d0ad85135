//! The routing evidence for `GemmBackend::for_shape`: every backend and the routed `gemm` timed
//! in interleaved rounds on the seed MLP's shapes (784-512-512-10, batch 32), f32, one thread.
//!
//! Interleaving (backend 1, 2, 3, routed, backend 1, …) exposes all candidates to the same
//! machine load, so the comparison stays fair on a shared machine where criterion's sequential
//! runs drift. Prints a Markdown table of GFLOP/s: median, 10th percentile and best round.
//!
//! Run: `cargo bench -p tessera-tensor --bench matmul_interleaved [-- ROUNDS [gpt]]` (default 100
//! rounds; `gpt` times the bench GPT's shapes instead).

mod common;

use common::shape;

use std::time::Instant;

use tensor::kernels::{gemm, gemm_with, GemmBackend, GemmShape};

/// Weights are stored `[in, out]`: forward `X·W`, backward `dX = dY·Wᵀ`, `dW = Xᵀ·dY`.
const MLP_SHAPES: [(&str, GemmShape); 9] = [
    ("mlp_fc1_fwd", shape(32, 512, 784, false, false)),
    ("mlp_fc2_fwd", shape(32, 512, 512, false, false)),
    ("mlp_fc3_fwd", shape(32, 10, 512, false, false)),
    ("mlp_fc1_dx", shape(32, 784, 512, false, true)),
    ("mlp_fc2_dx", shape(32, 512, 512, false, true)),
    ("mlp_fc3_dx", shape(32, 512, 10, false, true)),
    ("mlp_fc1_dw", shape(784, 512, 32, true, false)),
    ("mlp_fc2_dw", shape(512, 512, 32, true, false)),
    ("mlp_fc3_dw", shape(512, 10, 32, true, false)),
];

/// The bench GPT's products (width 256, MLP 1024, 2,048 tokens a step; weights `[out, in]`):
/// forward `X·Wᵀ`, `dX = dY·W`, `dW = dYᵀ·X` (the batch folded into the reduction).
const GPT_SHAPES: [(&str, GemmShape); 9] = [
    ("gpt_qkv_fwd", shape(2048, 768, 256, false, true)),
    ("gpt_fc1_fwd", shape(2048, 1024, 256, false, true)),
    ("gpt_fc2_fwd", shape(2048, 256, 1024, false, true)),
    ("gpt_qkv_dx", shape(2048, 256, 768, false, false)),
    ("gpt_fc1_dx", shape(2048, 256, 1024, false, false)),
    ("gpt_fc2_dx", shape(2048, 1024, 256, false, false)),
    ("gpt_qkv_dw", shape(768, 256, 2048, true, false)),
    ("gpt_fc1_dw", shape(1024, 256, 2048, true, false)),
    ("gpt_fc2_dw", shape(256, 1024, 2048, true, false)),
];

/// Deterministic values in [-0.5, 0.5).
fn values(n: usize, step: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * step) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

fn main() {
    let rounds = common::rounds_arg(100);
    // `gpt` after the round count picks the GPT's shapes.
    let shapes = match std::env::args().any(|arg| arg == "gpt") {
        true => &GPT_SHAPES[..],
        false => &MLP_SHAPES[..],
    };
    let mut header = String::from("| shape | m×n×k |");
    for backend in GemmBackend::ALL {
        header += &format!(" {} |", backend.name());
    }
    println!("{header} routed |");
    println!("|---|---|{}---|", "---|".repeat(GemmBackend::ALL.len()));
    for &(name, s) in shapes {
        let a = values(s.m * s.k, 7919);
        let b = values(s.k * s.n, 104_729);
        let mut c = vec![0f32; s.m * s.n];
        let flops = s.flops() as f64;
        // About 20 MFLOP per timed batch, so short products are not lost in timer resolution.
        let reps = ((2e7 / flops) as usize).max(1);
        let n_candidates = GemmBackend::ALL.len() + 1;
        let mut gflops = vec![Vec::with_capacity(rounds); n_candidates];
        for _ in 0..rounds {
            for (candidate, samples) in gflops.iter_mut().enumerate() {
                let start = Instant::now();
                for _ in 0..reps {
                    let result = match GemmBackend::ALL.get(candidate) {
                        Some(&backend) => gemm_with(backend, s, 1.0, &a, &b, 0.0, &mut c),
                        None => gemm(s, 1.0, &a, &b, 0.0, &mut c),
                    };
                    result.expect("the MLP shapes are valid");
                }
                samples.push(flops * reps as f64 / start.elapsed().as_secs_f64() / 1e9);
            }
        }
        let transposes = match (s.trans_a, s.trans_b) {
            (false, false) => "",
            (true, false) => " Aᵀ",
            (false, true) => " Bᵀ",
            (true, true) => " AᵀBᵀ",
        };
        let mut line = format!("| {name} | {}×{}×{}{transposes} |", s.m, s.n, s.k);
        for samples in gflops.iter_mut() {
            samples.sort_by(f64::total_cmp);
            let (median, p10, best) = (
                samples[samples.len() / 2],
                samples[samples.len() / 10],
                samples[samples.len() - 1],
            );
            line += &format!(" {median:.1} ({p10:.1}–{best:.1}) |");
        }
        println!("{line} → {}", GemmBackend::for_shape(&s).name());
    }
}
