//! What the benchmarks share.

use tensor::kernels::GemmShape;

/// The product `[m×k]·[k×n]` with its transposes, in a `const` table.
#[allow(dead_code)] // not every benchmark that includes this module times products
pub const fn shape(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> GemmShape {
    GemmShape {
        m,
        n,
        k,
        trans_a,
        trans_b,
    }
}

/// The GPT benchmark model's twelve products over a step's 2,048 tokens, named (`Dense` keeps
/// `[out, in]`: forward `X·Wᵀ`, `dX = dY·W`, `dW = dYᵀ·X`).
#[allow(dead_code)] // not every benchmark that includes this module times the GPT's products
pub const GPT_PRODUCTS: [(&str, GemmShape); 12] = [
    ("qkv forward X·Wᵀ", shape(2048, 768, 256, false, true)),
    ("fc1 forward X·Wᵀ", shape(2048, 1024, 256, false, true)),
    ("fc2 forward X·Wᵀ", shape(2048, 256, 1024, false, true)),
    ("proj forward X·Wᵀ", shape(2048, 256, 256, false, true)),
    ("qkv dX dY·W", shape(2048, 256, 768, false, false)),
    ("fc1 dX dY·W", shape(2048, 256, 1024, false, false)),
    ("fc2 dX dY·W", shape(2048, 1024, 256, false, false)),
    ("proj dX dY·W", shape(2048, 256, 256, false, false)),
    ("qkv dW dYᵀ·X", shape(768, 256, 2048, true, false)),
    ("fc1 dW dYᵀ·X", shape(1024, 256, 2048, true, false)),
    ("fc2 dW dYᵀ·X", shape(256, 1024, 2048, true, false)),
    ("proj dW dYᵀ·X", shape(256, 256, 2048, true, false)),
];

/// Deterministic values in [-1, 1).
#[allow(dead_code)] // not every benchmark that includes this module draws its values here
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Seconds of CPU time this thread has used (`CLOCK_THREAD_CPUTIME_ID`).
#[allow(dead_code)] // not every benchmark that includes this module times by CPU clock
pub fn thread_cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// The 10th, 50th and 90th percentiles of `samples`.
#[allow(dead_code)] // not every benchmark that includes this module reports a spread
pub fn spread(mut samples: Vec<f64>) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: usize| samples[(samples.len() - 1) * q / 10];
    (at(1), at(5), at(9))
}

/// Table cells of every form's speed against the first form's (`times[i]` the per-round seconds
/// of form `i`): the median (p10–p90) of the per-round ratios, each cell ending in `|`.
#[allow(dead_code)] // not every benchmark that includes this module compares forms
pub fn speed_cells(times: &[Vec<f64>]) -> String {
    times[1..]
        .iter()
        .map(|t| {
            let (lo, mid, hi) = spread(times[0].iter().zip(t).map(|(w, x)| w / x).collect());
            format!(" {mid:.3} ({lo:.3}–{hi:.3}) |")
        })
        .collect()
}

/// Thread CPU seconds of each of `forms` over `rounds` rounds, the forms rotated within each
/// round so that all see the same machine load; before each: the caches flushed (through
/// `flush`), then `run(None)` untimed (to set up what the form starts from), then
/// `run(Some(form))` timed.
#[allow(dead_code)] // not every benchmark that includes this module rotates forms
pub fn rotated_rounds(
    rounds: usize,
    forms: &[usize],
    flush: &mut [u8],
    mut run: impl FnMut(Option<usize>),
) -> Vec<Vec<f64>> {
    let mut times = vec![Vec::with_capacity(rounds); forms.len()];
    for round in 0..rounds {
        for i in (0..forms.len()).map(|i| (i + round) % forms.len()) {
            flush
                .iter_mut()
                .for_each(|b| *b = b.wrapping_add(round as u8 | 1));
            std::hint::black_box(&*flush);
            run(None);
            let start = thread_cpu_seconds();
            run(Some(forms[i]));
            times[i].push(thread_cpu_seconds() - start);
        }
    }
    times
}

/// The round count: the first numeric command-line argument (`cargo bench` passes `--bench`
/// and any names too), at least 1, else `default`.
#[allow(dead_code)] // not every benchmark that includes this module takes a round count
pub fn rounds_arg(default: usize) -> usize {
    std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// One attention step's operands, `slices · q_len · head_dim` each.
#[allow(dead_code)] // only the attention benchmarks take attention steps
pub struct AttentionStep {
    /// Queries.
    pub q: Vec<f32>,
    /// Keys.
    pub k: Vec<f32>,
    /// Values.
    pub v: Vec<f32>,
    /// The output's gradient.
    pub dout: Vec<f32>,
}

/// The fused causal attention's forward and backward over all of `s`; returns a checksum.
#[allow(dead_code)] // only the attention benchmarks take attention steps
pub fn fused_attention_step(
    s: &AttentionStep,
    dims: tensor::kernels::AttentionDims,
    scale: f32,
) -> f32 {
    use tensor::kernels::{self, AttentionGradBuffers, AttentionGradInputs, AttentionParams};
    let params = AttentionParams::new(true, scale);
    let mut out = vec![0f32; s.q.len()];
    let mut lse = vec![0f32; dims.slices * dims.q_len];
    kernels::flash_attention_into((&s.q, &s.k, &s.v), dims, params, &mut out, &mut lse).unwrap();
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; s.q.len()],
        vec![0f32; s.k.len()],
        vec![0f32; s.v.len()],
    );
    let input = AttentionGradInputs {
        q: &s.q,
        k: &s.k,
        v: &s.v,
        out: &out,
        lse: &lse,
        dout: &s.dout,
    };
    let grads = AttentionGradBuffers {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    kernels::flash_attention_grad_into(input, dims, params, grads).unwrap();
    out[7] + dq[7] + dk[7] + dv[7]
}
