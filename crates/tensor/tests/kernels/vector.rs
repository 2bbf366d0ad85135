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

/// Mixed precision's accumulation: a bf16 or f16 source added into an f32 accumulator in f32
/// (widened exactly, scaled, never rounded to the half type), into a half accumulator rounded
/// after every addition, an f32 sum rounded once into a half accumulator, and f32 into f32
/// bitwise [`kernels::accumulate_scaled_from`]; an offset picks the source's run of rows.
#[test]
fn mixed_precision_accumulation() {
    for dtype in [DType::BF16, DType::F16] {
        let ulp = if dtype == DType::BF16 {
            2f32.powi(-7)
        } else {
            2f32.powi(-10)
        };
        // 1 + 3/8 ulp, twice: in f32 the sum keeps both small parts, in the half type each
        // is lost (below half an ulp of 1).
        let one = Tensor::from_vec(&[2], vec![1f32, -3.0])
            .unwrap()
            .to_dtype(dtype);
        let small = Tensor::from_vec(&[2], vec![0.375 * ulp, 0.5])
            .unwrap()
            .to_dtype(dtype);
        let mut wide = Tensor::zeros(DType::F32, &[2]);
        let mut narrow = Tensor::zeros(dtype, &[2]);
        for (x, alpha) in [(&one, 1.0), (&small, 1.0), (&small, 1.0)] {
            kernels::accumulate_scaled_mixed(&mut wide, alpha, x).unwrap();
            kernels::accumulate_scaled_mixed(&mut narrow, alpha, x).unwrap();
        }
        assert_eq!(wide.as_f32().unwrap(), &[1.0 + 0.75 * ulp, -2.0]);
        assert_eq!(narrow.dtype(), dtype);
        assert_eq!(narrow.to_f64_vec(), vec![1.0, -2.0]);
        // An f32 sum into a zeroed half accumulator: rounded once.
        let mut mean = Tensor::zeros(dtype, &[2]);
        kernels::accumulate_scaled_mixed(&mut mean, 0.5, &wide).unwrap();
        let once = Tensor::from_vec(&[2], vec![0.5 + 0.375 * ulp, -1.0])
            .unwrap()
            .to_dtype(dtype);
        assert_eq!(mean, once);
        // The run of x from element 1, scaled.
        let mut acc = Tensor::from_vec(&[1], vec![1f32]).unwrap();
        kernels::accumulate_scaled_mixed_from(&mut acc, 0.25, &one, 1).unwrap();
        assert_eq!(acc.as_f32().unwrap(), &[0.25]);
        assert!(matches!(
            kernels::accumulate_scaled_mixed_from(&mut acc, 1.0, &one, 2),
            Err(TensorError::ElementCount { .. })
        ));
    }
    // f32 into f32 is accumulate_scaled_from, bit for bit.
    let x = Tensor::from_vec(&[5], vec![0.1f32, -1.7, 3.3, 1e-8, 7.0]).unwrap();
    let (mut a, mut b) = (
        Tensor::from_vec(&[3], vec![0.3f32, 1.1, -2.9]).unwrap(),
        Tensor::from_vec(&[3], vec![0.3f32, 1.1, -2.9]).unwrap(),
    );
    kernels::accumulate_scaled_from(&mut a, 0.37, &x, 2).unwrap();
    kernels::accumulate_scaled_mixed_from(&mut b, 0.37, &x, 2).unwrap();
    assert_eq!(a, b);
    // f64 only with f64; integers never.
    let mut f64_acc = Tensor::zeros(DType::F64, &[2]);
    assert!(
        kernels::accumulate_scaled_mixed(&mut f64_acc, 1.0, &Tensor::zeros(DType::F64, &[2]))
            .is_ok()
    );
    assert!(matches!(
        kernels::accumulate_scaled_mixed(&mut f64_acc, 1.0, &Tensor::zeros(DType::F32, &[2])),
        Err(TensorError::UnsupportedDType {
            got: DType::F64,
            ..
        })
    ));
    let mut ints = Tensor::zeros(DType::I32, &[2]);
    assert!(matches!(
        kernels::accumulate_scaled_mixed(&mut ints, 1.0, &Tensor::zeros(DType::F32, &[2])),
        Err(TensorError::UnsupportedDType {
            got: DType::I32,
            ..
        })
    ));
}
