//! Reductions over axes and whole tensors, and their gradients, against naive references.

use tensor::kernels::{self, Reduction};
use tensor::{DType, Tensor, TensorError};

use super::reference::{self as r, assert_close, assert_close_f32, Rng};

/// Reference reduction of `x` (of `shape`) over `axis`.
fn reduce_reference(reduction: Reduction, x: &[f64], shape: &[usize], axis: usize) -> Vec<f64> {
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let values = (0..len).map(|l| x[(o * len + l) * inner + i]);
            out.push(match reduction {
                Reduction::Sum => values.sum(),
                Reduction::Mean => values.sum::<f64>() / len as f64,
                Reduction::Max => values.fold(f64::NEG_INFINITY, f64::max),
            });
        }
    }
    out
}

const SHAPES: [&[usize]; 7] = [
    &[1],
    &[17],
    &[3, 17],
    &[100, 3],
    &[2, 33, 5],
    &[4, 1, 19],
    &[2, 3, 4, 5],
];
const REDUCTIONS: [Reduction; 3] = [Reduction::Sum, Reduction::Mean, Reduction::Max];

#[test]
fn axis_reductions_match_reference() {
    let mut rng = Rng::new(30);
    for shape in SHAPES {
        let x = rng.vec(shape.iter().product(), -1.0, 1.0);
        for axis in 0..shape.len() {
            for reduction in REDUCTIONS {
                let want = reduce_reference(reduction, &x, shape, axis);
                let what = format!("{reduction:?} {shape:?} axis {axis}");
                let y = kernels::reduce_axis(reduction, &r::f32_tensor(shape, &x), axis, false)
                    .unwrap();
                let mut kept = shape.to_vec();
                kept.remove(axis);
                assert_eq!(y.shape(), kept.as_slice(), "{what}");
                assert_close_f32(y.as_f32().unwrap(), &want, &what);
                let y =
                    kernels::reduce_axis(reduction, &r::f64_tensor(shape, &x), axis, true).unwrap();
                assert_eq!(y.shape()[axis], 1);
                assert_close(&y.to_f64_vec(), &want, 1e-12, 1e-13, &what);
            }
        }
    }
}

#[test]
fn whole_tensor_reductions_and_named_wrappers() {
    let mut rng = Rng::new(31);
    for n in [1usize, 15, 16, 17, 1000, 1023] {
        let x = rng.vec(n, -1.0, 1.0);
        let t = r::f32_tensor(&[n], &x);
        let sum: f64 = x.iter().sum();
        let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let got_sum = kernels::sum_all(&t).unwrap();
        assert!(got_sum.shape().is_empty());
        assert_close_f32(got_sum.as_f32().unwrap(), &[sum], "sum_all");
        assert_close_f32(
            kernels::mean_all(&t).unwrap().as_f32().unwrap(),
            &[sum / n as f64],
            "mean_all",
        );
        assert_close_f32(
            kernels::max_all(&t).unwrap().as_f32().unwrap(),
            &[max],
            "max_all",
        );
        assert_close_f32(
            kernels::sum(&t, 0, false).unwrap().as_f32().unwrap(),
            &[sum],
            "sum",
        );
        assert_close_f32(
            kernels::mean(&t, 0, true).unwrap().as_f32().unwrap(),
            &[sum / n as f64],
            "mean",
        );
        assert_close_f32(
            kernels::max(&t, 0, false).unwrap().as_f32().unwrap(),
            &[max],
            "max",
        );
        let y: Vec<f64> = rng.vec(n, -1.0, 1.0);
        let dot: f64 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
        assert_close(&[kernels::dot_slice(&x, &y)], &[dot], 1e-12, 1e-12, "dot");
    }
}

#[test]
fn empty_axes_and_errors() {
    let empty = Tensor::zeros(DType::F32, &[2, 0]);
    assert_eq!(
        kernels::sum(&empty, 1, false).unwrap().as_f32().unwrap(),
        &[0.0, 0.0]
    );
    assert!(kernels::mean(&empty, 1, false).unwrap().as_f32().unwrap()[0].is_nan());
    assert!(matches!(
        kernels::max(&empty, 1, false),
        Err(TensorError::InvalidArgument { op: "max", .. })
    ));
    assert!(kernels::max_all(&empty).is_err());
    let x = Tensor::zeros(DType::F32, &[2, 3]);
    assert_eq!(
        kernels::sum(&x, 2, false).unwrap_err(),
        TensorError::DimOutOfRange {
            op: "sum",
            dim: 2,
            ndim: 2
        }
    );
    assert!(matches!(
        kernels::sum_all(&Tensor::zeros(DType::Bool, &[2])),
        Err(TensorError::UnsupportedDType { op: "sum", .. })
    ));
}

#[test]
fn axis_reduction_gradients_match_reference_and_finite_differences() {
    let mut rng = Rng::new(32);
    for shape in SHAPES {
        let x = rng.vec(shape.iter().product(), -1.0, 1.0);
        for axis in 0..shape.len() {
            let mut reduced = shape.to_vec();
            reduced.remove(axis);
            let n_out: usize = reduced.iter().product();
            let dy = rng.vec(n_out, -1.0, 1.0);
            for reduction in REDUCTIONS {
                let what = format!("{reduction:?} grad {shape:?} axis {axis}");
                let dx = kernels::reduce_axis_grad(
                    reduction,
                    &r::f64_tensor(shape, &x),
                    axis,
                    &r::f64_tensor(&reduced, &dy),
                )
                .unwrap();
                // Finite differences of Σ dy·reduce(x); max is piecewise linear and the random
                // inputs have distinct values, so a small step stays on one piece.
                let numeric = r::numeric_grad(&x, 1e-7, |probe| {
                    r::weighted_sum(&dy, &reduce_reference(reduction, probe, shape, axis))
                });
                assert_close(&dx.to_f64_vec(), &numeric, 1e-6, 1e-7, &what);
            }
        }
    }
    let x = Tensor::zeros(DType::F32, &[2, 3]);
    assert!(matches!(
        kernels::reduce_axis_grad(Reduction::Sum, &x, 1, &Tensor::zeros(DType::F32, &[3])),
        Err(TensorError::ShapeMismatch { .. })
    ));
}
