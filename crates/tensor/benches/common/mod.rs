//! What the benchmarks share.

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
