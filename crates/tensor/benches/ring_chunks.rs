//! Ring attention's per-rank work against one call: the fused causal attention (forward +
//! backward, f32, one thread) of `tessera bench gpt-step --context-parallel-seq 1024`'s shape
//! (batch 2 × 4 heads, 1,024 tokens, head dim 64) in one call, and as context parallel 2's two
//! ranks attend it in the zigzag placement (each rank's queries are chunks `r` and `3 − r` of
//! four, attended against every chunk it sees, the state carried across chunk pairs, the
//! backward pass by [`kernels::attention_backward_block_accumulate`] per pair).
//!
//! Balanced chunks with no overhead would take half the one call each. Prints the median
//! milliseconds of each (thread CPU time, interleaved rounds) and each rank's median ratio to
//! half of the one call.
//!
//! Run: `cargo bench -p tessera-tensor --bench ring_chunks [-- ROUNDS]` (default 10 rounds).

mod common;

use common::{fused_attention_step, thread_cpu_seconds, values, AttentionStep};
use tensor::kernels::{
    self, AttentionDims, AttentionGradBuffers, AttentionParams, AttentionState, BlockGradInputs,
};

const SLICES: usize = 2 * 4;
const SEQ: usize = 1024;
const D: usize = 64;
/// Zigzag chunks of context parallel 2.
const CHUNKS: usize = 4;
const CHUNK: usize = SEQ / CHUNKS;

/// Rows `c·CHUNK ..` of every slice of `x` (`[SLICES, SEQ, width]`).
fn chunk(x: &[f32], c: usize, width: usize) -> Vec<f32> {
    (0..SLICES)
        .flat_map(|s| {
            let at = (s * SEQ + c * CHUNK) * width;
            x[at..at + CHUNK * width].iter().copied()
        })
        .collect()
}

fn dims(q_len: usize, kv_len: usize) -> AttentionDims {
    AttentionDims {
        slices: SLICES,
        q_len,
        kv_len,
        head_dim: D,
    }
}

/// Rank `r`'s chunk pairs, forward and backward; a checksum.
fn rank(s: &AttentionStep, scale: f32, r: usize) -> f32 {
    let mine = [r, CHUNKS - 1 - r];
    let q: Vec<Vec<f32>> = mine.iter().map(|&c| chunk(&s.q, c, D)).collect();
    let dout: Vec<Vec<f32>> = mine.iter().map(|&c| chunk(&s.dout, c, D)).collect();
    let k: Vec<Vec<f32>> = (0..CHUNKS).map(|c| chunk(&s.k, c, D)).collect();
    let v: Vec<Vec<f32>> = (0..CHUNKS).map(|c| chunk(&s.v, c, D)).collect();
    let params = |qc: usize, kc: usize| AttentionParams {
        q_offset: qc * CHUNK,
        k_offset: kc * CHUNK,
        ..AttentionParams::new(true, scale)
    };
    let mut sink = 0f32;
    let mut dk = vec![vec![0f32; SLICES * CHUNK * D]; CHUNKS];
    let mut dv = dk.clone();
    for (a, &qc) in mine.iter().enumerate() {
        let mut state = AttentionState::new(SLICES, CHUNK, D).unwrap();
        for kc in 0..=qc {
            state
                .accumulate((&q[a], &k[kc], &v[kc]), CHUNK, params(qc, kc))
                .unwrap();
        }
        let mut out = vec![0f32; SLICES * CHUNK * D];
        let mut lse = vec![0f32; SLICES * CHUNK];
        state.finish_into(&mut out, &mut lse).unwrap();
        let mut delta = vec![0f32; SLICES * CHUNK];
        kernels::attention_delta_into(&out, &dout[a], D, &mut delta).unwrap();
        let mut dq = vec![0f32; SLICES * CHUNK * D];
        for kc in 0..=qc {
            let input = BlockGradInputs {
                q: &q[a],
                k: &k[kc],
                v: &v[kc],
                dout: &dout[a],
                lse: &lse,
                delta: &delta,
            };
            let grads = AttentionGradBuffers {
                dq: &mut dq,
                dk: &mut dk[kc],
                dv: &mut dv[kc],
            };
            kernels::attention_backward_block_accumulate(
                input,
                dims(CHUNK, CHUNK),
                params(qc, kc),
                grads,
            )
            .unwrap();
        }
        sink += out[7] + dq[7];
    }
    sink + dk[0][7] + dv[0][7]
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

fn main() {
    let rounds = common::rounds_arg(10);
    let n = SLICES * SEQ * D;
    let step = AttentionStep {
        q: values(n, 7),
        k: values(n, 11),
        v: values(n, 13),
        dout: values(n, 17),
    };
    let scale = 1.0 / (D as f32).sqrt();
    let (mut one, mut r0, mut r1, mut ratio0, mut ratio1) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut sink = 0f32;
    for _ in 0..rounds {
        let t0 = thread_cpu_seconds();
        sink += fused_attention_step(&step, dims(SEQ, SEQ), scale);
        let t1 = thread_cpu_seconds();
        sink += rank(&step, scale, 0);
        let t2 = thread_cpu_seconds();
        sink += rank(&step, scale, 1);
        let t3 = thread_cpu_seconds();
        one.push(t1 - t0);
        r0.push(t2 - t1);
        r1.push(t3 - t2);
        ratio0.push((t2 - t1) / ((t1 - t0) / 2.0));
        ratio1.push((t3 - t2) / ((t1 - t0) / 2.0));
    }
    println!("| causal attention fwd+bwd, {SLICES} slices × {SEQ} tokens × {D}, f32, 1 thread | ms | ÷ half the one call |");
    println!("|---|---:|---:|");
    println!("| one call | {:.1} | |", 1e3 * median(one));
    println!(
        "| rank 0 of cp 2 (zigzag chunks 0, 3) | {:.1} | {:.2} |",
        1e3 * median(r0),
        median(ratio0)
    );
    println!(
        "| rank 1 of cp 2 (zigzag chunks 1, 2) | {:.1} | {:.2} |",
        1e3 * median(r1),
        median(ratio1)
    );
    std::hint::black_box(sink);
}
