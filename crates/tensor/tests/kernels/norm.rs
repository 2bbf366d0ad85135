//! Layer norm forward and backward against naive references and finite differences.

use tensor::kernels::{self, LayerNormGradBuffers, LayerNormParams, LayerNormSaved};
use tensor::{DType, Tensor, TensorError};

use super::reference::{self as r, assert_close, assert_close_f32, Rng};

const EPS: f64 = 1e-5;

/// Reference layer norm: returns (y, mean, rstd).
fn reference(x: &[f64], gamma: &[f64], beta: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let cols = gamma.len();
    let (mut y, mut means, mut rstds) = (Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks(cols) {
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + EPS).sqrt();
        y.extend(
            row.iter()
                .zip(gamma)
                .zip(beta)
                .map(|((v, g), b)| (v - mean) * rstd * g + b),
        );
        means.push(mean);
        rstds.push(rstd);
    }
    (y, means, rstds)
}

/// Reference gradients from the textbook per-row Jacobian (dense, O(cols²)).
fn reference_grad(x: &[f64], gamma: &[f64], dy: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let cols = gamma.len();
    let (_, means, rstds) = reference(x, gamma, &vec![0.0; cols]);
    let mut dx = vec![0.0; x.len()];
    let (mut dgamma, mut dbeta) = (vec![0.0; cols], vec![0.0; cols]);
    for (r, (row, g)) in x.chunks(cols).zip(dy.chunks(cols)).enumerate() {
        let (mean, rstd) = (means[r], rstds[r]);
        let xhat: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
        for j in 0..cols {
            dgamma[j] += g[j] * xhat[j];
            dbeta[j] += g[j];
        }
        // ∂xhat_j/∂x_i = rstd·(δ_ij - 1/n - xhat_i·xhat_j/n)
        for i in 0..cols {
            let mut acc = 0.0;
            for j in 0..cols {
                let kron = if i == j { 1.0 } else { 0.0 };
                acc += g[j]
                    * gamma[j]
                    * rstd
                    * (kron - 1.0 / cols as f64 - xhat[i] * xhat[j] / cols as f64);
            }
            dx[r * cols + i] = acc;
        }
    }
    (dx, dgamma, dbeta)
}

/// (x shape, number of normalised trailing dims)
const CASES: [(&[usize], usize); 6] = [
    (&[1, 1], 1),
    (&[3, 17], 1),
    (&[4, 2, 5], 2),
    (&[2, 3, 33], 1),
    (&[7], 1),
    (&[5, 100], 1),
];

#[test]
fn forward_matches_reference() {
    let mut rng = Rng::new(50);
    for (shape, k) in CASES {
        let norm = &shape[shape.len() - k..];
        let lead = &shape[..shape.len() - k];
        let x: Vec<f64> = rng
            .vec(shape.iter().product(), -2.0, 2.0)
            .iter()
            .map(|v| v + 3.0)
            .collect();
        let gamma = rng.vec(norm.iter().product(), 0.5, 1.5);
        let beta = rng.vec(norm.iter().product(), -0.5, 0.5);
        let (want_y, want_mean, want_rstd) = reference(&x, &gamma, &beta);
        let out = kernels::layer_norm(
            &r::f32_tensor(shape, &x),
            &r::f32_tensor(norm, &gamma),
            &r::f32_tensor(norm, &beta),
            EPS,
        )
        .unwrap();
        assert_eq!(out.y.shape(), shape);
        assert_eq!(out.mean.shape(), lead);
        assert_close(&out.y.to_f64_vec(), &want_y, 1e-3, 1e-3, "layer_norm y");
        assert_close_f32(out.mean.as_f32().unwrap(), &want_mean, "layer_norm mean");
        assert_close(
            &out.rstd.to_f64_vec(),
            &want_rstd,
            1e-3,
            0.0,
            "layer_norm rstd",
        );
        let out = kernels::layer_norm(
            &r::f64_tensor(shape, &x),
            &r::f64_tensor(norm, &gamma),
            &r::f64_tensor(norm, &beta),
            EPS,
        )
        .unwrap();
        assert_close(
            &out.y.to_f64_vec(),
            &want_y,
            1e-10,
            1e-10,
            "layer_norm y f64",
        );
    }
}

#[test]
fn backward_matches_reference_and_finite_differences() {
    let mut rng = Rng::new(51);
    for (shape, k) in CASES {
        let norm = &shape[shape.len() - k..];
        let cols: usize = norm.iter().product();
        if cols == 1 {
            continue; // a one-element row normalises to beta: dx is identically 0 (checked below)
        }
        let n: usize = shape.iter().product();
        let x = rng.vec(n, -2.0, 2.0);
        let gamma = rng.vec(cols, 0.5, 1.5);
        let beta = rng.vec(cols, -0.5, 0.5);
        let dy = rng.vec(n, -1.0, 1.0);
        let fwd = kernels::layer_norm(
            &r::f64_tensor(shape, &x),
            &r::f64_tensor(norm, &gamma),
            &r::f64_tensor(norm, &beta),
            EPS,
        )
        .unwrap();
        let grads = kernels::layer_norm_grad(
            &r::f64_tensor(shape, &x),
            &r::f64_tensor(shape, &dy),
            &fwd.mean,
            &fwd.rstd,
            &r::f64_tensor(norm, &gamma),
        )
        .unwrap();
        let (want_dx, want_dgamma, want_dbeta) = reference_grad(&x, &gamma, &dy);
        assert_close(&grads.dx.to_f64_vec(), &want_dx, 1e-9, 1e-10, "dx");
        assert_close(
            &grads.dgamma.to_f64_vec(),
            &want_dgamma,
            1e-9,
            1e-10,
            "dgamma",
        );
        assert_close(&grads.dbeta.to_f64_vec(), &want_dbeta, 1e-9, 1e-10, "dbeta");
        // Finite differences of Σ dy·y wrt x, gamma and beta through the f64 slice kernel.
        let loss = |xv: &[f64], g: &[f64], b: &[f64]| {
            let rows = xv.len() / cols;
            let (mut y, mut mean, mut rstd) =
                (vec![0.0; xv.len()], vec![0.0; rows], vec![0.0; rows]);
            let params = LayerNormParams {
                gamma: g,
                beta: b,
                epsilon: EPS,
            };
            kernels::layer_norm_into(xv, params, &mut y, &mut mean, &mut rstd).unwrap();
            r::weighted_sum(&dy, &y)
        };
        let num_dx = r::numeric_grad(&x, 1e-6, |p| loss(p, &gamma, &beta));
        let num_dgamma = r::numeric_grad(&gamma, 1e-6, |p| loss(&x, p, &beta));
        let num_dbeta = r::numeric_grad(&beta, 1e-6, |p| loss(&x, &gamma, p));
        assert_close(&grads.dx.to_f64_vec(), &num_dx, 1e-5, 1e-7, "dx fd");
        assert_close(
            &grads.dgamma.to_f64_vec(),
            &num_dgamma,
            1e-5,
            1e-7,
            "dgamma fd",
        );
        assert_close(
            &grads.dbeta.to_f64_vec(),
            &num_dbeta,
            1e-5,
            1e-7,
            "dbeta fd",
        );
        // f32 backward against the reference.
        let fwd32 = kernels::layer_norm(
            &r::f32_tensor(shape, &x),
            &r::f32_tensor(norm, &gamma),
            &r::f32_tensor(norm, &beta),
            EPS,
        )
        .unwrap();
        let g32 = kernels::layer_norm_grad(
            &r::f32_tensor(shape, &x),
            &r::f32_tensor(shape, &dy),
            &fwd32.mean,
            &fwd32.rstd,
            &r::f32_tensor(norm, &gamma),
        )
        .unwrap();
        assert_close(&g32.dx.to_f64_vec(), &want_dx, 1e-3, 1e-4, "dx f32");
    }
}

#[test]
fn one_element_rows_and_bf16_inputs() {
    let x = Tensor::from_vec(&[3, 1], vec![1.0f32, -2.0, 7.0]).unwrap();
    let gamma = Tensor::from_vec(&[1], vec![2.0f32]).unwrap();
    let beta = Tensor::from_vec(&[1], vec![0.25f32]).unwrap();
    let out = kernels::layer_norm(&x, &gamma, &beta, EPS).unwrap();
    assert_eq!(out.y.as_f32().unwrap(), &[0.25, 0.25, 0.25]);
    let g = kernels::layer_norm_grad(&x, &x, &out.mean, &out.rstd, &gamma).unwrap();
    assert_eq!(g.dx.as_f32().unwrap(), &[0.0, 0.0, 0.0]);
    // bf16 storage: y comes back as bf16, the statistics stay f32.
    let out = kernels::layer_norm(
        &x.to_dtype(DType::BF16),
        &gamma.to_dtype(DType::BF16),
        &beta.to_dtype(DType::BF16),
        EPS,
    )
    .unwrap();
    assert_eq!(out.y.dtype(), DType::BF16);
    assert_eq!(out.mean.dtype(), DType::F32);
}

#[test]
fn errors() {
    let x = Tensor::zeros(DType::F32, &[2, 3]);
    let wrong = Tensor::zeros(DType::F32, &[2]);
    assert!(matches!(
        kernels::layer_norm(&x, &wrong, &wrong, EPS),
        Err(TensorError::ShapeMismatch {
            op: "layer_norm",
            ..
        })
    ));
    let mut y = vec![0f32; 6];
    let (mut mean, mut rstd) = (vec![0f32; 2], vec![0f32; 1]);
    let params = LayerNormParams {
        gamma: &[1.0; 3],
        beta: &[0.0; 3],
        epsilon: 1e-5,
    };
    assert!(matches!(
        kernels::layer_norm_into(&[0f32; 6], params, &mut y, &mut mean, &mut rstd),
        Err(TensorError::BufferLength { buffer: "rstd", .. })
    ));
    let (mut dx, mut dg, mut db) = (vec![0f32; 6], vec![0f32; 3], vec![0f32; 2]);
    let saved = LayerNormSaved {
        x: &[0f32; 6],
        mean: &[0.0; 2],
        rstd: &[1.0; 2],
        gamma: &[1.0; 3],
    };
    let buffers = LayerNormGradBuffers {
        dx: &mut dx,
        dgamma: &mut dg,
        dbeta: &mut db,
    };
    assert!(matches!(
        kernels::layer_norm_grad_into(saved, &[0f32; 6], buffers),
        Err(TensorError::BufferLength {
            buffer: "dbeta",
            ..
        })
    ));
}

/// The forward pass splits its rows over the rank's threads: bitwise the one thread's on the
/// GPT's shape (2,048 rows of 256, and a ragged row count).
#[test]
fn forward_is_bitwise_the_same_on_any_thread_count() {
    let mut rng = Rng::new(29);
    for (rows, cols) in [(2048, 256), (16 * 128 + 5, 256)] {
        let x = r::to_f32(&rng.vec(rows * cols, -3.0, 3.0));
        let gamma = r::to_f32(&rng.vec(cols, 0.5, 1.5));
        let beta = r::to_f32(&rng.vec(cols, -0.5, 0.5));
        let run = |threads: usize| {
            kernels::threads::set_threads(threads);
            let (mut y, mut mean, mut rstd) =
                (vec![0f32; rows * cols], vec![0f32; rows], vec![0f32; rows]);
            let params = LayerNormParams {
                gamma: &gamma,
                beta: &beta,
                epsilon: 1e-5,
            };
            kernels::layer_norm_into(&x, params, &mut y, &mut mean, &mut rstd).unwrap();
            kernels::threads::set_threads(1);
            [y, mean, rstd].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
        };
        let one = run(1);
        assert!(run(2) == one && run(3) == one, "{rows} rows of {cols}");
    }
}
