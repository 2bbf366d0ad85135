//! MindSpore's gradient scaling when `gradients_mean` is off, in data parallel on 2 devices:
//! each rank's gradient is that of its own loss, and MindSpore sums them. For a mean over the
//! rows (`MSELoss`'s: a sum of every row, then a division) each rank divides by its own rows,
//! so the sum is twice the global mean's gradient; for a plain sum it is the global sum's.
//! The numbers MindSpore trained are pinned by `python/tests/test_mindspore_training_diff.py`.

use graph::{GraphBuilder, Initializer};
use parallel::{compile_training, ParallelConfig, ParallelMode};
use tensor::DType;

/// `Program::grad_scale` of `y = x·w`, `Σ (y − t)²` (divided by its element count when
/// `mean`) in data parallel on 2 devices, with `gradients_mean`.
fn grad_scale(mean: bool, gradients_mean: bool) -> f64 {
    grad_scale_divided(mean.then_some(24.0), gradients_mean)
}

/// `Program::grad_scale` of `Σ (y − t)²` over 8 rows of 3, divided by `divisor` when given.
fn grad_scale_divided(divisor: Option<f64>, gradients_mean: bool) -> f64 {
    let mut b = GraphBuilder::with_float_dtype(DType::F32);
    let x = b.input("x", &[8, 4], DType::F32).unwrap();
    let t = b.input("t", &[8, 3], DType::F32).unwrap();
    let w = b.parameter("w", &[4, 3], Initializer::normal(1.0)).unwrap();
    let y = b.matmul("y", x, w).unwrap();
    let d = b.sub("d", y, t).unwrap();
    let sq = b.mul("sq", d, d).unwrap();
    let mut loss = b.reduce_sum("sum", sq, &[], false).unwrap();
    if let Some(divisor) = divisor {
        let n = b.fill("count", &[], divisor).unwrap();
        loss = b.div("mean", loss, n).unwrap();
    }
    let graph = b.finish();
    let mut config = ParallelConfig::new(ParallelMode::DataParallel, 2);
    config.gradients_mean = gradients_mean;
    compile_training(&graph, loss, &config).unwrap().grad_scale
}

#[test]
fn gradients_mean_off_doubles_a_mean_losss_gradient_on_two_ranks_and_not_a_sums() {
    assert_eq!(grad_scale(true, false), 2.0, "a mean loss");
    assert_eq!(grad_scale(false, false), 1.0, "a sum loss");
    assert_eq!(grad_scale(true, true), 1.0, "gradients_mean on");
}

/// A sum divided by a constant that counts no rows stays a sum: each MindSpore rank divides its
/// own sum by the same constant, and their gradients add up to the global loss's. It was taken
/// for a mean (any division after the rows' sum) and doubled on 2 ranks.
#[test]
fn a_sum_divided_by_a_constant_keeps_scale_one_and_by_the_batch_size_is_a_mean() {
    assert_eq!(grad_scale_divided(Some(3.0), false), 1.0, "Σ / 3");
    assert_eq!(grad_scale_divided(Some(0.5), false), 1.0, "Σ / 0.5");
    assert_eq!(grad_scale_divided(Some(8.0), false), 2.0, "Σ / rows");
    assert_eq!(grad_scale_divided(Some(24.0), false), 2.0, "Σ / elements");
}
