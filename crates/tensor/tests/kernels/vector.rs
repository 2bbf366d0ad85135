//! BLAS-1 updates and tensor-level scale and accumulate against naive loops.

use tensor::kernels;
use tensor::{DType, Tensor, TensorError};

use super::reference::{assert_close, Rng};

#[test]
fn blas1_updates_match_reference() {
    let mut rng = Rng::new(90);
    for n in [1usize, 3, 17, 64] {
        let x = rng.vec(n, -1.0, 1.0);
        let y0 = rng.vec(n, -1.0, 1.0);
        let v = rng.vec(n, 0.0, 1.0);
        let mut y = y0.clone();
        kernels::axpy(0.5, &x, &mut y).unwrap();
        let want: Vec<f64> = x.iter().zip(&y0).map(|(a, b)| 0.5 * a + b).collect();
        assert_close(&y, &want, 1e-15, 1e-15, "axpy");
        let mut y = y0.clone();
        kernels::axpby(0.1, &x, 0.9, &mut y).unwrap();
        let want: Vec<f64> = x.iter().zip(&y0).map(|(a, b)| 0.1 * a + 0.9 * b).collect();
        assert_close(&y, &want, 1e-15, 1e-15, "axpby");
        let mut y = y0.clone();
        kernels::square_axpby(0.001, &x, 0.999, &mut y).unwrap();
        let want: Vec<f64> = x
            .iter()
            .zip(&y0)
            .map(|(a, b)| 0.001 * a * a + 0.999 * b)
            .collect();
        assert_close(&y, &want, 1e-15, 1e-15, "square_axpby");
        let mut y = y0.clone();
        kernels::div_sqrt_axpy(-0.01, &x, &v, 1e-8, &mut y).unwrap();
        let want: Vec<f64> = (0..n)
            .map(|i| y0[i] - 0.01 * x[i] / (v[i].sqrt() + 1e-8))
            .collect();
        assert_close(&y, &want, 1e-14, 1e-15, "div_sqrt_axpy");
        let mut y = y0.clone();
        kernels::scale_inplace(-2.0, &mut y);
        let want: Vec<f64> = y0.iter().map(|b| -2.0 * b).collect();
        assert_close(&y, &want, 0.0, 0.0, "scale_inplace");
        kernels::fill(&mut y, 3.0);
        assert!(y.iter().all(|&v| v == 3.0));
    }
    let mut short = vec![0f32; 2];
    assert!(matches!(
        kernels::axpy(1.0, &[1f32; 3], &mut short),
        Err(TensorError::BufferLength {
            op: "axpy",
            buffer: "y",
            ..
        })
    ));
}

#[test]
fn tensor_level_scale_and_accumulate() {
    let x = Tensor::from_vec(&[3], vec![1f32, -2.0, 4.0]).unwrap();
    assert_eq!(
        kernels::scale(&x, 0.5).unwrap().as_f32().unwrap(),
        &[0.5, -1.0, 2.0]
    );
    let mut acc = Tensor::from_vec(&[3], vec![1f32, 1.0, 1.0]).unwrap();
    kernels::accumulate_scaled(&mut acc, 2.0, &x).unwrap();
    assert_eq!(acc.as_f32().unwrap(), &[3.0, -3.0, 9.0]);
    let mut half = x.to_dtype(DType::F16);
    assert!(matches!(
        kernels::accumulate_scaled(&mut half, 1.0, &x.to_dtype(DType::F16)),
        Err(TensorError::DTypeMismatch {
            expected: DType::F32,
            got: DType::F16,
            ..
        })
    ));
    assert!(matches!(
        kernels::accumulate_scaled(&mut acc, 1.0, &Tensor::zeros(DType::F32, &[4])),
        Err(TensorError::ShapeMismatch { .. })
    ));
}
