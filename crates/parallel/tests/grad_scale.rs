//! MindSpore's gradient scaling when `gradients_mean` is off, in data parallel on 2 devices:
//! each rank's gradient is that of its own loss, and MindSpore sums them. For a mean over the
//! rows (`MSELoss`'s: a sum of every row, then a division) each rank divides by its own rows,
//! so the sum is twice the global mean's gradient; for a plain sum it is the global sum's.
//! The numbers MindSpore trained are pinned by `python/tests/test_mindspore_training_diff.py`.

use graph::{GraphBuilder, Initializer, ValueId};
use parallel::{compile_training, ParallelConfig, ParallelMode};
use tensor::DType;

/// `Program::grad_scale` of `y = x·w`, `Σ (y − t)²` (divided by its element count when
/// `mean`) in data parallel on 2 devices, with `gradients_mean`.
fn grad_scale(mean: bool, gradients_mean: bool) -> f64 {
    grad_scale_divided(mean.then_some(24.0), gradients_mean)
}

/// `y = x·w` over 8 rows of 4 and `Σ (y − t)²` (8 rows of 3) in `b`: the sum's value.
fn squares_summed(b: &mut GraphBuilder) -> ValueId {
    let x = b.input("x", &[8, 4], DType::F32).unwrap();
    let t = b.input("t", &[8, 3], DType::F32).unwrap();
    let w = b.parameter("w", &[4, 3], Initializer::normal(1.0)).unwrap();
    let y = b.matmul("y", x, w).unwrap();
    let d = b.sub("d", y, t).unwrap();
    let sq = b.mul("sq", d, d).unwrap();
    b.reduce_sum("sum", sq, &[], false).unwrap()
}

/// `Program::grad_scale` of the loss `scaled(b, Σ (y − t)²)` in data parallel on 2 devices,
/// with `gradients_mean`.
fn grad_scale_of(
    gradients_mean: bool,
    scaled: impl FnOnce(&mut GraphBuilder, ValueId) -> ValueId,
) -> f64 {
    let mut b = GraphBuilder::with_float_dtype(DType::F32);
    let sum = squares_summed(&mut b);
    let loss = scaled(&mut b, sum);
    let graph = b.finish();
    let mut config = ParallelConfig::new(ParallelMode::DataParallel, 2);
    config.gradients_mean = gradients_mean;
    compile_training(&graph, loss, &config).unwrap().grad_scale
}

/// `Program::grad_scale` of `Σ (y − t)²` over 8 rows of 3, divided by `divisor` when given.
fn grad_scale_divided(divisor: Option<f64>, gradients_mean: bool) -> f64 {
    grad_scale_of(gradients_mean, |b, sum| match divisor {
        Some(divisor) => {
            let n = b.fill("count", &[], divisor).unwrap();
            b.div("mean", sum, n).unwrap()
        }
        None => sum,
    })
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
    // A negative log-likelihood's mean, `Σ log p / -n`: a mean too (it was taken for a sum).
    assert_eq!(grad_scale_divided(Some(-8.0), false), 2.0, "Σ / -rows");
    assert_eq!(grad_scale_divided(Some(-3.0), false), 1.0, "Σ / -3");
}

/// `Program::grad_scale` of `Σ (y − t)²` over 8 rows of 3 times the constant `factor` (the
/// constant first when `factor_first`), on 2 devices with `gradients_mean` off.
fn grad_scale_multiplied(factor: f64, factor_first: bool) -> f64 {
    grad_scale_of(false, |b, sum| {
        let c = b.fill("factor", &[], factor).unwrap();
        match factor_first {
            true => b.mul("loss", c, sum).unwrap(),
            false => b.mul("loss", sum, c).unwrap(),
        }
    })
}

/// A sum times the reciprocal of the rows (`Σ · (1 / x.shape[0])`, each MindSpore rank's own
/// rows) is a mean, as `Σ / x.shape[0]` is: MindSpore's ranks' gradients add up to twice the
/// global mean's on 2 ranks. It was taken for a sum (scale 1, half MindSpore's step; found by
/// `scripts/mindspore-train-diff.py --seed 3000 --dp-every 1 --only 65`). A sum times another
/// constant stays a sum.
#[test]
fn a_sum_times_the_reciprocal_of_the_rows_is_a_mean_and_times_another_constant_a_sum() {
    for first in [false, true] {
        assert_eq!(grad_scale_multiplied(1.0 / 8.0, first), 2.0, "Σ · 1/rows");
        assert_eq!(
            grad_scale_multiplied(1.0 / 24.0, first),
            2.0,
            "Σ · 1/elements"
        );
        assert_eq!(
            grad_scale_multiplied(f64::from(1.0f32 / 24.0), first),
            2.0,
            "f32 1/24"
        );
        assert_eq!(grad_scale_multiplied(0.5, first), 1.0, "Σ · 0.5");
        assert_eq!(grad_scale_multiplied(1.0 / 3.0, first), 1.0, "Σ · 1/3");
        assert_eq!(grad_scale_multiplied(1.0 / 12.0, first), 1.0, "Σ · 1/12");
        assert_eq!(grad_scale_multiplied(2.0, first), 1.0, "Σ · 2");
        assert_eq!(grad_scale_multiplied(-1.0 / 8.0, first), 2.0, "Σ · -1/rows");
        assert_eq!(grad_scale_multiplied(-0.5, first), 1.0, "Σ · -0.5");
    }
}
