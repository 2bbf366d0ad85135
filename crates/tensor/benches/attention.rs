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
//! A second table times, on the GPT benchmark's shape, the fused attention reading the packed
//! output of the fused QKV projection, `qkv [batch, seq, heads, 3·head_dim]`
//! (`packed_attention_into` / `packed_attention_grad_into`), against the transposing path it
//! replaces: `q`, `k`, `v` split off and transposed to `[batch, heads, seq, head_dim]` (one
//! permute), `flash_attention_into`, the context transposed back; backward: `dout` transposed,
//! `flash_attention_grad_into`, `dq`, `dk`, `dv` transposed back into `dqkv` (one permute).
//! Forward and backward are timed apart (the same bits either way).
//!
//! Run: `cargo bench -p tessera-tensor --bench attention [-- ROUNDS]` (default 10 rounds).

mod common;

use common::{fused_attention_step, thread_cpu_seconds, AttentionStep};
use tensor::kernels::{
    self, gemm, AttentionDims, AttentionGradBuffers, AttentionGradInputs, AttentionParams,
    GemmShape, PackedDims,
};

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

/// The GPT benchmark model's attention in the packed layout.
const PACKED: PackedDims = PackedDims {
    batch: 16,
    seq: 128,
    heads: 4,
    head_dim: 64,
};

/// Buffers of the packed and the transposing paths, allocated once.
struct PackedStep {
    qkv: Vec<f32>,
    dout: Vec<f32>,
    /// Packed path: `out`, `lse`, `dqkv`.
    out: Vec<f32>,
    lse: Vec<f32>,
    dqkv: Vec<f32>,
    /// Transposing path: `[3, batch, heads, seq, d]` q | k | v, `[batch, heads, seq, d]` out
    /// and dout, `[batch, heads, seq]` lse, `[3, batch, heads, seq, d]` dq | dk | dv, and the
    /// results in the packed layout.
    qkv_t: Vec<f32>,
    out_t: Vec<f32>,
    lse_t: Vec<f32>,
    dout_t: Vec<f32>,
    dqkv_t: Vec<f32>,
    out_back: Vec<f32>,
    dqkv_back: Vec<f32>,
}

impl PackedStep {
    fn new(p: PackedDims) -> PackedStep {
        let rows = p.batch * p.seq * p.heads;
        let n = rows * p.head_dim;
        PackedStep {
            qkv: values(3 * n, 7),
            dout: values(n, 17),
            out: vec![0.0; n],
            lse: vec![0.0; rows],
            dqkv: vec![0.0; 3 * n],
            qkv_t: vec![0.0; 3 * n],
            out_t: vec![0.0; n],
            lse_t: vec![0.0; rows],
            dout_t: vec![0.0; n],
            dqkv_t: vec![0.0; 3 * n],
            out_back: vec![0.0; n],
            dqkv_back: vec![0.0; 3 * n],
        }
    }

    /// The transposing path's one-call dims.
    fn slices(p: PackedDims) -> AttentionDims {
        AttentionDims {
            slices: p.batch * p.heads,
            q_len: p.seq,
            kv_len: p.seq,
            head_dim: p.head_dim,
        }
    }

    /// Transpose q/k/v, `flash_attention_into`, transpose the context back.
    fn transposing_forward(&mut self, p: PackedDims, params: AttentionParams<f32>) {
        let (b, s, h, d) = (p.batch, p.seq, p.heads, p.head_dim);
        kernels::permute_into(
            &self.qkv,
            &[b, s, h, 3, d],
            &[3, 0, 2, 1, 4],
            &mut self.qkv_t,
        )
        .unwrap();
        let n = b * s * h * d;
        let (q, kv) = self.qkv_t.split_at(n);
        let (k, v) = kv.split_at(n);
        let dims = Self::slices(p);
        kernels::flash_attention_into((q, k, v), dims, params, &mut self.out_t, &mut self.lse_t)
            .unwrap();
        kernels::permute_into(
            &self.out_t,
            &[b, h, s, d],
            &[0, 2, 1, 3],
            &mut self.out_back,
        )
        .unwrap();
    }

    /// Transpose dout, `flash_attention_grad_into`, transpose dq | dk | dv back into dqkv.
    fn transposing_backward(&mut self, p: PackedDims, params: AttentionParams<f32>) {
        let (b, s, h, d) = (p.batch, p.seq, p.heads, p.head_dim);
        kernels::permute_into(&self.dout, &[b, s, h, d], &[0, 2, 1, 3], &mut self.dout_t).unwrap();
        let n = b * s * h * d;
        let (q, kv) = self.qkv_t.split_at(n);
        let (k, v) = kv.split_at(n);
        let (dq, dkv) = self.dqkv_t.split_at_mut(n);
        let (dk, dv) = dkv.split_at_mut(n);
        let input = AttentionGradInputs {
            q,
            k,
            v,
            out: &self.out_t,
            lse: &self.lse_t,
            dout: &self.dout_t,
        };
        let grads = AttentionGradBuffers { dq, dk, dv };
        kernels::flash_attention_grad_into(input, Self::slices(p), params, grads).unwrap();
        kernels::permute_into(
            &self.dqkv_t,
            &[3, b, h, s, d],
            &[1, 3, 2, 0, 4],
            &mut self.dqkv_back,
        )
        .unwrap();
    }

    fn packed_forward(&mut self, p: PackedDims, params: AttentionParams<f32>) {
        kernels::packed_attention_into(&self.qkv, p, params, &mut self.out, &mut self.lse).unwrap();
    }

    fn packed_backward(&mut self, p: PackedDims, params: AttentionParams<f32>) {
        kernels::packed_attention_grad_into(
            &self.qkv,
            &self.out,
            &self.lse,
            &self.dout,
            p,
            params,
            &mut self.dqkv,
        )
        .unwrap();
    }
}

/// The packed entry points against the transposing path, forward and backward apart.
fn packed_table(rounds: usize) {
    let p = PACKED;
    let params = AttentionParams::new(true, 1.0 / (p.head_dim as f32).sqrt());
    let mut step = PackedStep::new(p);
    // [transposing fwd, packed fwd, transposing bwd, packed bwd]
    let mut times = vec![Vec::new(); 4];
    for _ in 0..rounds {
        let t0 = thread_cpu_seconds();
        step.transposing_forward(p, params);
        let t1 = thread_cpu_seconds();
        step.packed_forward(p, params);
        let t2 = thread_cpu_seconds();
        step.transposing_backward(p, params);
        let t3 = thread_cpu_seconds();
        step.packed_backward(p, params);
        let t4 = thread_cpu_seconds();
        for (i, t) in [t1 - t0, t2 - t1, t3 - t2, t4 - t3].into_iter().enumerate() {
            times[i].push(t);
        }
    }
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same(&step.out, &step.out_back), "packed out differs");
    assert!(same(&step.dqkv, &step.dqkv_back), "packed dqkv differs");
    println!();
    println!(
        "| packed qkv attention, causal, f32, 1 thread | transposing ms | packed ms | packed ÷ transposing |"
    );
    println!("|---|---|---|---|");
    let shape = format!(
        "{} batch × {} tokens × {} heads × {}",
        p.batch, p.seq, p.heads, p.head_dim
    );
    for (name, base, packed) in [("forward", 0, 1), ("backward", 2, 3)] {
        let ratios: Vec<f64> = times[packed]
            .iter()
            .zip(&times[base])
            .map(|(x, y)| x / y)
            .collect();
        println!(
            "| {shape}, {name} | {:.2} | {:.2} | {:.3} |",
            1e3 * median(times[base].clone()),
            1e3 * median(times[packed].clone()),
            median(ratios)
        );
    }
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
    packed_table(rounds);
}
