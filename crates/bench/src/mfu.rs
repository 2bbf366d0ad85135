//! Model FLOP utilisation of the GPT benchmark: the model's FLOPs per step (PaLM's count,
//! `6 · parameters · tokens + 12 · layers · width · sequence · tokens`) at the measured step
//! time, over the single-thread matrix-product peak measured in the same run on the GPT's own
//! product shapes (the engine's GEMM, `tensor::kernels::gemm`), the faster of a timing before
//! the step's measurement and one after it.

use std::time::Instant;

use graph::{Graph, ValueKind};
use models::GptConfig;
use tensor::kernels::{gemm, GemmShape};

use crate::BenchError;

/// Timed products per shape (after 3 warm-up products); the median counts.
const REPS: usize = 15;

/// The single-thread matrix-product rate on one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeRate {
    /// `[m × k] @ [k × n]`.
    pub mkn: (usize, usize, usize),
    /// GFLOP/s at the median of [`REPS`] products.
    pub gflops: f64,
}

/// The GPT's forward products on `tokens` rows: q/k/v, the attention's projection, the MLP's
/// two layers and the LM head. (Their backward products have these sizes, transposed.)
pub fn gpt_product_shapes(gpt: &GptConfig) -> Vec<(usize, usize, usize)> {
    let (t, h) = (gpt.batch * gpt.seq_len, gpt.hidden);
    let ffn = gpt.ffn_hidden;
    vec![
        (t, h, 3 * h),
        (t, h, h),
        (t, h, ffn),
        (t, ffn, h),
        (t, h, gpt.vocab_size),
    ]
}

/// Times the engine's f32 GEMM on every shape of `shapes` on this thread.
pub fn product_rates(shapes: &[(usize, usize, usize)]) -> Result<Vec<ShapeRate>, BenchError> {
    shapes
        .iter()
        .map(|&(m, k, n)| {
            let (a, b) = (vec![0.5f32; m * k], vec![0.25f32; k * n]);
            let mut c = vec![0f32; m * n];
            let shape = GemmShape::new(m, n, k);
            let mut times = Vec::with_capacity(REPS);
            for rep in 0..REPS + 3 {
                let start = Instant::now();
                gemm(shape, 1.0, &a, &b, 0.0, &mut c)?;
                if rep >= 3 {
                    times.push(start.elapsed().as_secs_f64());
                }
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2].max(f64::MIN_POSITIVE);
            Ok(ShapeRate {
                mkn: (m, k, n),
                gflops: 2.0 * (m * k * n) as f64 / median / 1e9,
            })
        })
        .collect()
}

/// Per shape, the faster of two timings of the same shapes (`earlier` and `later`, in the same
/// order): on a machine whose speed drifts, one timing can land in a slow stretch and make the
/// utilisation read above 100 %.
pub fn faster_of(earlier: Vec<ShapeRate>, later: Vec<ShapeRate>) -> Vec<ShapeRate> {
    earlier
        .into_iter()
        .zip(later)
        .map(|(a, b)| {
            debug_assert_eq!(a.mkn, b.mkn, "the same shapes in the same order");
            if b.gflops > a.gflops {
                b
            } else {
                a
            }
        })
        .collect()
}

/// Trainable parameters of `graph` (elements).
pub fn trainable_parameters(graph: &Graph) -> usize {
    graph
        .values()
        .iter()
        .filter(|v| {
            matches!(
                v.kind,
                ValueKind::Parameter {
                    trainable: true,
                    ..
                }
            )
        })
        .map(|v| v.n_elements())
        .sum()
}

/// FLOPs of one training step of `gpt` with `parameters` trainable parameters: PaLM's
/// `6 · N` per token for the products with the weights (forward and backward) plus
/// `12 · layers · width · sequence` per token for attention's two products (the causal mask's
/// skipped half counted, as that convention does).
pub fn model_flops_per_step(gpt: &GptConfig, parameters: usize) -> f64 {
    let tokens = (gpt.batch * gpt.seq_len) as f64;
    let attention = 12.0 * (gpt.layers * gpt.hidden * gpt.seq_len) as f64;
    tokens * (6.0 * parameters as f64 + attention)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_takes_the_faster_timing_of_each_shape() {
        let rate = |mkn, gflops| ShapeRate { mkn, gflops };
        let earlier = vec![rate((8, 4, 2), 50.0), rate((8, 2, 4), 90.0)];
        let later = vec![rate((8, 4, 2), 70.0), rate((8, 2, 4), 60.0)];
        let best = faster_of(earlier, later);
        assert_eq!(best, vec![rate((8, 4, 2), 70.0), rate((8, 2, 4), 90.0)]);
    }

    #[test]
    fn the_bench_gpt_s_flops_follow_palm_s_count() {
        let gpt = GptConfig::new(256, 4, 4, 256, 128, 16);
        let model = models::gpt(&gpt, tensor::DType::F32).unwrap();
        let n = trainable_parameters(&model.graph);
        // Per block: qkv 256·768 + 768, proj 256·256 + 256, fc1 256·1024 + 1024,
        // fc2 1024·256 + 256, two LayerNorms 4·256; embeddings 256·256 (tied head) and
        // positions 128·256; the final LayerNorm 2·256.
        let block =
            256 * 768 + 768 + 256 * 256 + 256 + 256 * 1024 + 1024 + 1024 * 256 + 256 + 4 * 256;
        assert_eq!(n, 4 * block + 256 * 256 + 128 * 256 + 2 * 256);
        let flops = model_flops_per_step(&gpt, n);
        assert_eq!(
            flops,
            2048.0 * (6.0 * n as f64 + 12.0 * 4.0 * 256.0 * 128.0)
        );
        assert_eq!(gpt_product_shapes(&gpt)[2], (2048, 256, 1024));
    }

    #[test]
    fn a_product_rate_is_positive_for_each_shape() {
        let rates = product_rates(&[(8, 4, 16), (16, 16, 16)]).unwrap();
        assert_eq!(rates.len(), 2);
        assert_eq!(rates[0].mkn, (8, 4, 16));
        assert!(rates.iter().all(|r| r.gflops.is_finite() && r.gflops > 0.0));
    }
}
