//! Softmax forward and backward against references and finite differences; a stable log-sum-exp.

use tensor::kernels;
use tensor::{DType, Tensor, TensorError};

use super::reference::{self as r, assert_close, assert_close_f32, Rng};

const SHAPES: [&[usize]; 6] = [&[1], &[17], &[3, 1], &[3, 17], &[2, 5, 10], &[4, 100]];

#[test]
fn forward_matches_reference() {
    let mut rng = Rng::new(40);
    for shape in SHAPES {
        let cols = *shape.last().unwrap();
        // Large offsets: a naive exp would overflow in f32 without the max shift.
        let x: Vec<f64> = rng
            .vec(shape.iter().product(), -5.0, 5.0)
            .iter()
            .map(|v| v + 100.0)
            .collect();
        let want = r::softmax_rows(&x, cols);
        let want_log: Vec<f64> = want.iter().map(|p| p.ln()).collect();
        let y = kernels::softmax(&r::f32_tensor(shape, &x)).unwrap();
        assert_close_f32(y.as_f32().unwrap(), &want, "softmax");
        let y = kernels::log_softmax(&r::f32_tensor(shape, &x)).unwrap();
        assert_close_f32(y.as_f32().unwrap(), &want_log, "log_softmax");
        let y = kernels::softmax(&r::f64_tensor(shape, &x)).unwrap();
        assert_close(&y.to_f64_vec(), &want, 1e-12, 1e-15, "softmax f64");
    }
}

#[test]
fn backward_matches_analytic_reference_and_finite_differences() {
    let mut rng = Rng::new(41);
    for shape in SHAPES {
        let cols = *shape.last().unwrap();
        let n = shape.iter().product();
        let x = rng.vec(n, -3.0, 3.0);
        let dy = rng.vec(n, -1.0, 1.0);
        let p = r::softmax_rows(&x, cols);
        // Analytic: the Jacobian of softmax is diag(p) - p pᵀ per row.
        let mut want = vec![0.0; n];
        let mut want_log = vec![0.0; n];
        for row in 0..n / cols {
            let s = row * cols;
            for i in 0..cols {
                for j in 0..cols {
                    let kron = if i == j { 1.0 } else { 0.0 };
                    want[s + i] += dy[s + j] * p[s + j] * (kron - p[s + i]);
                    want_log[s + i] += dy[s + j] * (kron - p[s + i]);
                }
            }
        }
        let y = kernels::softmax(&r::f64_tensor(shape, &x)).unwrap();
        let dx = kernels::softmax_grad(&y, &r::f64_tensor(shape, &dy)).unwrap();
        assert_close(&dx.to_f64_vec(), &want, 1e-10, 1e-12, "softmax_grad");
        let ly = kernels::log_softmax(&r::f64_tensor(shape, &x)).unwrap();
        let ldx = kernels::log_softmax_grad(&ly, &r::f64_tensor(shape, &dy)).unwrap();
        assert_close(
            &ldx.to_f64_vec(),
            &want_log,
            1e-10,
            1e-12,
            "log_softmax_grad",
        );
        // f32 backward against the same reference.
        let y32 = kernels::softmax(&r::f32_tensor(shape, &x)).unwrap();
        let dx32 = kernels::softmax_grad(&y32, &r::f32_tensor(shape, &dy)).unwrap();
        assert_close_f32(dx32.as_f32().unwrap(), &want, "softmax_grad f32");
        // Finite differences through the f64 forward kernels.
        let numeric = r::numeric_grad(&x, 1e-6, |probe| {
            let mut out = vec![0.0; n];
            kernels::softmax_into(probe, cols, &mut out).unwrap();
            r::weighted_sum(&dy, &out)
        });
        assert_close(&dx.to_f64_vec(), &numeric, 1e-6, 1e-7, "softmax fd");
        let numeric_log = r::numeric_grad(&x, 1e-6, |probe| {
            let mut out = vec![0.0; n];
            kernels::log_softmax_into(probe, cols, &mut out).unwrap();
            r::weighted_sum(&dy, &out)
        });
        assert_close(
            &ldx.to_f64_vec(),
            &numeric_log,
            1e-6,
            1e-7,
            "log_softmax fd",
        );
    }
}

#[test]
fn log_sum_exp_is_stable() {
    assert_close(
        &[kernels::log_sum_exp(&[1000.0f64, 1000.0])],
        &[1000.0 + 2f64.ln()],
        1e-15,
        0.0,
        "lse",
    );
    assert!(
        kernels::softmax(&Tensor::from_vec(&[2], vec![1e30f32, -1e30]).unwrap())
            .unwrap()
            .as_f32()
            .unwrap()
            .iter()
            .all(|v| v.is_finite())
    );
}

#[test]
fn errors() {
    assert!(matches!(
        kernels::softmax(&Tensor::scalar(1.0)),
        Err(TensorError::InvalidArgument { op: "softmax", .. })
    ));
    let y = Tensor::zeros(DType::F32, &[2, 3]);
    assert!(matches!(
        kernels::softmax_grad(&y, &Tensor::zeros(DType::F32, &[3, 2])),
        Err(TensorError::ShapeMismatch { .. })
    ));
    let mut out = vec![0f32; 5];
    assert!(matches!(
        kernels::softmax_into(&[0f32; 6], 4, &mut out),
        Err(TensorError::BufferLength { buffer: "x", .. })
    ));
}

/// Row-wise kernels split their rows over threads: the scaled softmax, its gradient and the
/// bias add on attention- and MLP-sized inputs are bitwise the one thread's.
#[test]
fn row_kernels_are_bitwise_the_same_on_any_thread_count() {
    use tensor::kernels;
    let mut rng = super::reference::Rng::new(13);
    let (rows, cols) = (16 * 4 * 128 + 3, 128);
    let x = super::reference::to_f32(&rng.vec(rows * cols, -3.0, 3.0));
    let dy = super::reference::to_f32(&rng.vec(rows * cols, -1.0, 1.0));
    let bias = super::reference::to_f32(&rng.vec(cols, -1.0, 1.0));
    let run = |threads: usize| {
        kernels::threads::set_threads(threads);
        let mut y = vec![0f32; rows * cols];
        let mut dx = vec![0f32; rows * cols];
        let mut biased = vec![0f32; rows * cols];
        kernels::scaled_softmax_into(&x, 0.125, cols, &mut y).unwrap();
        kernels::scaled_softmax_grad_into(&y, &dy, 0.125, cols, &mut dx).unwrap();
        kernels::bias_add_into(&x, &bias, &mut biased).unwrap();
        kernels::threads::set_threads(1);
        [y, dx, biased].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
    };
    let one = run(1);
    assert!(run(2) == one && run(3) == one);
}
