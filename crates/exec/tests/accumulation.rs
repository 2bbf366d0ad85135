//! Gradient accumulation under mixed precision ([`exec::Accumulation`]), by hand: the
//! gradients of `loss = Σ x·w` are the micro-batch's row of `x`, so the accumulated mean of
//! four micro-batches is known exactly. Half-precision gradients are accumulated in f32 (each
//! widened and added in f32, never rounded to the half type), or under
//! `parallel.gradient_fp32_sync = false` in the half type, rounded after every addition.

use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use exec::{Accumulation, RankExecutor};
use graph::{GraphBuilder, Initializer};
use parallel::{compile_training, ParallelConfig};
use tensor::{DType, Tensor};

/// `x` rounded to `dtype`.
fn round(dtype: DType, x: f64) -> f64 {
    Tensor::from_vec(&[1], vec![x])
        .unwrap()
        .to_dtype(dtype)
        .to_f64_vec()[0]
}

/// Micro-batch `j`'s row: column 0 is 1 in micro-batch 0 and 3/8 of the half type's ulp at 1
/// in the others (each share alone is below half an ulp of the running sum, so the half-type
/// sum never moves, while the f32 sum keeps all three); the other columns inexact values over
/// three decades.
fn row(dtype: DType, j: usize, columns: usize) -> Vec<f64> {
    let ulp = if dtype == DType::BF16 {
        2f64.powi(-7)
    } else {
        2f64.powi(-10)
    };
    (0..columns)
        .map(|c| match (c, j) {
            (0, 0) => 1.0,
            (0, _) => 0.375 * ulp,
            _ => {
                let k = j * 5 + c * 3;
                let x = (1.0 + (k % 11) as f64) / 13.0 * 10f64.powi((k % 3) as i32 - 1);
                round(dtype, if k.is_multiple_of(2) { -x } else { x })
            }
        })
        .collect()
}

/// Four micro-batches of `loss = Σ x·w` in bf16 and f16: with `gradient_fp32_sync` (the
/// default, and whenever `enable_fp32_communication` is set) the accumulation buffer is f32
/// and holds `Σ_j (f32) ¼·g_j` added in f32; with `gradient_fp32_sync = false` it is the half
/// type and holds the sum rounded after every addition; the two differ. `copy` widens the
/// program's half gradient exactly into an f32 buffer.
#[test]
fn half_precision_gradients_accumulate_in_f32_or_the_half_type() {
    let (columns, outputs, micro) = (9, 2, 4);
    for dtype in [DType::BF16, DType::F16] {
        let rows: Vec<Vec<f64>> = (0..micro).map(|j| row(dtype, j, columns)).collect();
        let share = 1.0 / micro as f64;
        // Every gradient element of w[c][·] is x[c]: the expected buffers, by hand.
        let by_hand = |in_f32: bool| -> Vec<f64> {
            (0..columns)
                .map(|c| {
                    rows.iter().fold(0.0, |acc, r| match in_f32 {
                        true => (acc as f32 + share as f32 * r[c] as f32) as f64,
                        false => round(dtype, acc + share * r[c]),
                    })
                })
                .flat_map(|g| std::iter::repeat_n(g, outputs))
                .collect()
        };
        let (f32_sums, half_sums) = (by_hand(true), by_hand(false));
        assert_ne!(
            f32_sums, half_sums,
            "{dtype}: the values tell the two apart"
        );
        let mut b = GraphBuilder::with_float_dtype(dtype);
        let x = b.input("x", &[1, columns], dtype).unwrap();
        let w = b
            .parameter("w", &[columns, outputs], Initializer::normal(1.0))
            .unwrap();
        let y = b.matmul("m", x, w).unwrap();
        let loss = b.reduce_sum("loss", y, &[], false).unwrap();
        let graph = b.finish();
        for (fp32_sync, fp32_communication, want_dtype, want) in [
            (true, false, DType::F32, &f32_sums),
            (false, true, DType::F32, &f32_sums),
            (false, false, dtype, &half_sums),
        ] {
            let config = ParallelConfig {
                gradient_fp32_sync: fp32_sync,
                enable_fp32_communication: fp32_communication,
                ..ParallelConfig::stand_alone()
            };
            let label = format!(
                "{dtype}, gradient_fp32_sync = {fp32_sync}, enable_fp32_communication = {fp32_communication}"
            );
            assert_eq!(config.gradient_accumulation_dtype(dtype), want_dtype);
            let program = Arc::new(compile_training(&graph, loss, &config).unwrap());
            let rows = rows.clone();
            let ran = LocalCluster::new(1).unwrap().run(|comm| {
                let world: Arc<dyn Communicator> = Arc::new(comm);
                let mut exec = RankExecutor::new(program.clone(), world).unwrap();
                exec.init_parameters(5).unwrap();
                let trainable = [0];
                let mut acc = Accumulation::new(&exec, &trainable, false);
                for r in &rows {
                    let input = Tensor::from_vec(&[1, columns], r.clone())
                        .unwrap()
                        .to_dtype(dtype);
                    exec.set_input(0, &input).unwrap();
                    exec.run().unwrap();
                    acc.add(&exec, &trainable, share).unwrap();
                }
                let summed = acc.buffer(0).clone();
                let bytes = acc.bytes();
                acc.copy(&exec, &trainable).unwrap();
                let copied = acc.buffer(0).clone();
                (summed, bytes, copied, exec.grad(0).unwrap().clone())
            });
            let (summed, bytes, copied, grad) = ran.into_iter().next().unwrap().unwrap();
            assert_eq!(summed.dtype(), want_dtype, "{label}");
            assert_eq!(
                bytes,
                columns * outputs * want_dtype.size_in_bytes(),
                "{label}"
            );
            assert_eq!(&summed.to_f64_vec(), want, "{label}");
            assert_eq!(copied.dtype(), want_dtype, "{label}: copy");
            assert_eq!(copied.to_f64_vec(), grad.to_f64_vec(), "{label}: copy");
        }
    }
}
