//! The fused attention (`flash_attention_into` + `flash_attention_grad_into`) against the
//! unfused kernels it replaces in the GPT (per head: the `[S, S]` scores by `gemm`, the causal
//! mask, `scaled_softmax_into`, the context by `gemm`; backward through the materialised
//! probabilities), forward and backward of one step, f32, one thread, on the attention of the
//! GPT benchmark model (`tessera bench gpt-step`: batch 16, 4 heads, 128 tokens, head dim 64) and
//! on a longer context (batch 4, 4 heads, 512 tokens) with the same element count per step.
//!
//! The two run in interleaved rounds so both see the same machine load, each timed by the
//! thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`). Prints the median milliseconds of each and the
//! median per-round ratio fused ÷ unfused.
//!
//! Run: `cargo bench -p tessera-tensor --bench attention [-- ROUNDS]` (default 10 rounds).

mod common;

use common::{fused_attention_step, thread_cpu_seconds, AttentionStep};
use tensor::kernels::{self, gemm, AttentionDims, GemmShape};

/// Batch × heads, tokens, head dim.
const SHAPES: [AttentionDims; 2] = [
    AttentionDims {
        slices: 16 * 4,
        q_len: 128,
        kv_len: 128,
        head_dim: 64,
    },
    AttentionDims {
        slices: 4 * 4,
        q_len: 512,
        kv_len: 512,
        head_dim: 64,
    },
];

/// Deterministic values in [-0.5, 0.5).
fn values(n: usize, step: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * step) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// The unfused kernels per head, as the GPT's unfused ops run them; returns a checksum.
fn unfused(s: &AttentionStep, dims: AttentionDims, scale: f32) -> f32 {
    let (n, d) = (dims.q_len, dims.head_dim);
    let (mut scores, mut probs, mut dp, mut ds) = (
        vec![0f32; n * n],
        vec![0f32; n * n],
        vec![0f32; n * n],
        vec![0f32; n * n],
    );
    let mut out = vec![0f32; s.q.len()];
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; s.q.len()],
        vec![0f32; s.k.len()],
        vec![0f32; s.v.len()],
    );
    let nt = GemmShape {
        trans_b: true,
        ..GemmShape::new(n, n, d)
    };
    let tn = GemmShape {
        trans_a: true,
        ..GemmShape::new(n, d, n)
    };
    for h in 0..dims.slices {
        let r = h * n * d..(h + 1) * n * d;
        let (q, k, v, dout) = (
            &s.q[r.clone()],
            &s.k[r.clone()],
            &s.v[r.clone()],
            &s.dout[r.clone()],
        );
        gemm(nt, 1.0, q, k, 0.0, &mut scores).unwrap();
        for i in 0..n {
            scores[i * n + i + 1..(i + 1) * n].fill(-1e9);
        }
        kernels::scaled_softmax_into(&scores, scale, n, &mut probs).unwrap();
        gemm(
            GemmShape::new(n, d, n),
            1.0,
            &probs,
            v,
            0.0,
            &mut out[r.clone()],
        )
        .unwrap();
        gemm(tn, 1.0, &probs, dout, 0.0, &mut dv[r.clone()]).unwrap();
        gemm(nt, 1.0, dout, v, 0.0, &mut dp).unwrap();
        kernels::scaled_softmax_grad_into(&probs, &dp, scale, n, &mut ds).unwrap();
        gemm(
            GemmShape::new(n, d, n),
            1.0,
            &ds,
            k,
            0.0,
            &mut dq[r.clone()],
        )
        .unwrap();
        gemm(tn, 1.0, &ds, q, 0.0, &mut dk[r]).unwrap();
    }
    out[7] + dq[7] + dk[7] + dv[7]
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

fn main() {
    let rounds = common::rounds_arg(10);
    println!(
        "| attention fwd+bwd, causal, f32, 1 thread | fused ms | unfused ms | fused ÷ unfused |"
    );
    println!("|---|---|---|---|");
    for dims in SHAPES {
        let n = dims.slices * dims.q_len * dims.head_dim;
        let step = AttentionStep {
            q: values(n, 7),
            k: values(n, 11),
            v: values(n, 13),
            dout: values(n, 17),
        };
        let scale = 1.0 / (dims.head_dim as f32).sqrt();
        let (mut fused_s, mut unfused_s, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut sink = 0f32;
        for _ in 0..rounds {
            let t0 = thread_cpu_seconds();
            sink += fused_attention_step(&step, dims, scale);
            let t1 = thread_cpu_seconds();
            sink += unfused(&step, dims, scale);
            let t2 = thread_cpu_seconds();
            fused_s.push(t1 - t0);
            unfused_s.push(t2 - t1);
            ratios.push((t1 - t0) / (t2 - t1));
        }
        println!(
            "| {} slices × {} tokens × {} | {:.1} | {:.1} | {:.2} |",
            dims.slices,
            dims.q_len,
            dims.head_dim,
            1e3 * median(fused_s),
            1e3 * median(unfused_s),
            median(ratios)
        );
        std::hint::black_box(sink);
    }
}
