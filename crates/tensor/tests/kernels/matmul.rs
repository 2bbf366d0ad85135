//! Matrix products on both GEMM backends, every transpose, batched and broadcast, against a naive reference; buffer and shape errors.

use proptest::prelude::*;
use tensor::kernels::{self, gemm_with, solo_band_rows, GemmBackend, GemmShape};
use tensor::{DType, Tensor, TensorError};

use super::reference::{self as r, assert_close, assert_close_f32, Rng};

/// (m, n, k): ones, odd sizes, non-multiples of every SIMD width, an MLP-like shape, and a
/// weight gradient's long reduction (summed in chunks, the last one short).
const SHAPES: [(usize, usize, usize); 9] = [
    (1, 1, 1),
    (1, 17, 3),
    (3, 1, 17),
    (17, 19, 23),
    (5, 33, 1),
    (32, 10, 64),
    (40, 3, 129),
    (33, 65, 31),
    (9, 33, 1100),
];

#[test]
fn gemm_matches_reference_on_both_backends_and_all_transposes() {
    let mut rng = Rng::new(1);
    for (m, n, k) in SHAPES {
        for trans_a in [false, true] {
            for trans_b in [false, true] {
                let a = rng.vec(m * k, -1.0, 1.0);
                let b = rng.vec(k * n, -1.0, 1.0);
                let want = r::matmul(&a, &b, m, n, k, trans_a, trans_b);
                let shape = GemmShape {
                    m,
                    n,
                    k,
                    trans_a,
                    trans_b,
                };
                for backend in GemmBackend::ALL {
                    let what = format!("{backend:?} {shape:?}");
                    // f32, beta = 0 over a NaN-filled output: C must not be read.
                    let mut c = vec![f32::NAN; m * n];
                    gemm_with(
                        backend,
                        shape,
                        1.0,
                        &r::to_f32(&a),
                        &r::to_f32(&b),
                        0.0,
                        &mut c,
                    )
                    .unwrap();
                    assert_close_f32(&c, &want, &what);
                    // f64, accumulating (β = 1) and scaling (β = 0.5): C = 2·AB + β·C0.
                    for beta in [1.0, 0.5] {
                        let c0 = rng.vec(m * n, -1.0, 1.0);
                        let mut c = c0.clone();
                        gemm_with(backend, shape, 2.0, &a, &b, beta, &mut c).unwrap();
                        let acc: Vec<f64> = want
                            .iter()
                            .zip(&c0)
                            .map(|(w, c)| 2.0 * w + beta * c)
                            .collect();
                        assert_close(&c, &acc, 1e-12, 1e-12, &what);
                    }
                }
                // The routed entry point agrees too.
                let mut c = vec![0f32; m * n];
                kernels::gemm(shape, 1.0, &r::to_f32(&a), &r::to_f32(&b), 0.0, &mut c).unwrap();
                assert_close_f32(&c, &want, "routed");
            }
        }
    }
}

#[test]
fn gemm_with_empty_contraction_scales_c() {
    let shape = GemmShape::new(2, 3, 0);
    let mut c = vec![1.5f32; 6];
    kernels::gemm(shape, 1.0, &[], &[], 2.0, &mut c).unwrap();
    assert_eq!(c, vec![3.0; 6]);
    kernels::gemm(shape, 1.0, &[], &[], 0.0, &mut c).unwrap();
    assert_eq!(c, vec![0.0; 6]);
}

#[test]
fn gemm_rejects_wrong_buffer_lengths() {
    let shape = GemmShape::new(2, 3, 4);
    let mut c = vec![0f32; 6];
    let err = kernels::gemm(shape, 1.0, &[0.0; 7], &[0.0; 12], 0.0, &mut c).unwrap_err();
    assert_eq!(
        err,
        TensorError::BufferLength {
            op: "gemm",
            buffer: "a",
            expected: 8,
            got: 7
        }
    );
}

#[test]
fn matmul_tensor_level_f32_f64_bf16() {
    let mut rng = Rng::new(2);
    let (m, n, k) = (7, 5, 9);
    let a = rng.vec(k * m, -1.0, 1.0); // stored [k, m], used transposed
    let b = rng.vec(k * n, -1.0, 1.0);
    let want = r::matmul(&a, &b, m, n, k, true, false);
    let y = kernels::matmul(
        &r::f32_tensor(&[k, m], &a),
        &r::f32_tensor(&[k, n], &b),
        true,
        false,
    )
    .unwrap();
    assert_eq!(y.shape(), &[m, n]);
    assert_close_f32(y.as_f32().unwrap(), &want, "matmul f32");
    let y = kernels::matmul(
        &r::f64_tensor(&[k, m], &a),
        &r::f64_tensor(&[k, n], &b),
        true,
        false,
    )
    .unwrap();
    assert_close(&y.to_f64_vec(), &want, 1e-12, 1e-12, "matmul f64");
    // bf16 storage: computed in f32 from the rounded inputs, returned as bf16.
    let a16 = r::f32_tensor(&[k, m], &a).to_dtype(DType::BF16);
    let b16 = r::f32_tensor(&[k, n], &b).to_dtype(DType::BF16);
    let want16 = r::matmul(&a16.to_f64_vec(), &b16.to_f64_vec(), m, n, k, true, false);
    let y = kernels::matmul(&a16, &b16, true, false).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    assert_close(&y.to_f64_vec(), &want16, 1e-2, 1e-2, "matmul bf16");
}

#[test]
fn matmul_errors() {
    let a = Tensor::zeros(DType::F32, &[2, 3]);
    let b = Tensor::zeros(DType::F32, &[4, 5]);
    assert!(matches!(
        kernels::matmul(&a, &b, false, false),
        Err(TensorError::ShapeMismatch { op: "matmul", .. })
    ));
    let b64 = Tensor::zeros(DType::F64, &[3, 5]);
    assert!(matches!(
        kernels::matmul(&a, &b64, false, false),
        Err(TensorError::DTypeMismatch { .. })
    ));
    let ints = Tensor::zeros(DType::I32, &[2, 3]);
    let ints_b = Tensor::zeros(DType::I32, &[3, 2]);
    assert!(matches!(
        kernels::matmul(&ints, &ints_b, false, false),
        Err(TensorError::UnsupportedDType { op: "matmul", .. })
    ));
    let three_d = Tensor::zeros(DType::F32, &[1, 2, 3]);
    assert!(kernels::matmul(&three_d, &b, false, false).is_err());
}

/// Reference batched product with broadcast batch dims.
fn batch_reference(
    a: &[f64],
    a_shape: &[usize],
    b: &[f64],
    b_shape: &[usize],
    trans_a: bool,
    trans_b: bool,
) -> (Vec<f64>, Vec<usize>) {
    let (ar, ac) = (a_shape[a_shape.len() - 2], a_shape[a_shape.len() - 1]);
    let (br, bc) = (b_shape[b_shape.len() - 2], b_shape[b_shape.len() - 1]);
    let (m, k) = if trans_a { (ac, ar) } else { (ar, ac) };
    let n = if trans_b { br } else { bc };
    let a_batch = &a_shape[..a_shape.len() - 2];
    let b_batch = &b_shape[..b_shape.len() - 2];
    let batch = r::broadcast_shape(a_batch, b_batch);
    let n_batch: usize = batch.iter().product();
    let mut out = Vec::new();
    for flat in 0..n_batch {
        let index = r::unravel(flat, &batch);
        let ai = r::broadcast_source(&index, a_batch);
        let bi = r::broadcast_source(&index, b_batch);
        out.extend(r::matmul(
            &a[ai * m * k..(ai + 1) * m * k],
            &b[bi * k * n..(bi + 1) * k * n],
            m,
            n,
            k,
            trans_a,
            trans_b,
        ));
    }
    let mut shape = batch;
    shape.extend([m, n]);
    (out, shape)
}

#[test]
fn batch_matmul_broadcasts_batch_dims() {
    let mut rng = Rng::new(3);
    // (a shape, b shape, trans_a, trans_b)
    let cases: [(&[usize], &[usize], bool, bool); 6] = [
        (&[2, 3, 4], &[2, 4, 5], false, false),
        (&[2, 3, 4], &[4, 5], false, false), // shared weight: folded into one tall gemm
        (&[2, 4, 3], &[4, 5], true, false),  // shared weight, transposed A: per batch
        (&[3, 1, 5, 4], &[2, 3, 4], false, true),
        (&[1, 3, 4], &[3, 2, 4, 1], false, false),
        (&[4, 3], &[2, 3, 17], false, false), // shared left operand
    ];
    for (a_shape, b_shape, trans_a, trans_b) in cases {
        let a = rng.vec(a_shape.iter().product(), -1.0, 1.0);
        let b = rng.vec(b_shape.iter().product(), -1.0, 1.0);
        let (want, want_shape) = batch_reference(&a, a_shape, &b, b_shape, trans_a, trans_b);
        let y = kernels::batch_matmul(
            &r::f32_tensor(a_shape, &a),
            &r::f32_tensor(b_shape, &b),
            trans_a,
            trans_b,
        )
        .unwrap();
        assert_eq!(
            y.shape(),
            want_shape.as_slice(),
            "{a_shape:?} x {b_shape:?}"
        );
        assert_close_f32(y.as_f32().unwrap(), &want, "batch_matmul");
    }
    let bad = kernels::batch_matmul(
        &Tensor::zeros(DType::F32, &[2, 3, 4]),
        &Tensor::zeros(DType::F32, &[3, 4, 5]),
        false,
        false,
    );
    assert!(matches!(bad, Err(TensorError::NotBroadcastable { .. })));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A product with transposed operands equals the product of explicitly transposed inputs.
    #[test]
    fn transposed_matmul_equals_matmul_of_transposes(
        m in 1usize..12, n in 1usize..12, k in 1usize..12,
        trans_a: bool, trans_b: bool, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let a_stored = if trans_a { [k, m] } else { [m, k] };
        let b_stored = if trans_b { [n, k] } else { [k, n] };
        let a = r::f64_tensor(&a_stored, &rng.vec(m * k, -1.0, 1.0));
        let b = r::f64_tensor(&b_stored, &rng.vec(k * n, -1.0, 1.0));
        let fused = kernels::matmul(&a, &b, trans_a, trans_b).unwrap();
        let a_plain = if trans_a { kernels::transpose(&a).unwrap() } else { a.clone() };
        let b_plain = if trans_b { kernels::transpose(&b).unwrap() } else { b.clone() };
        let explicit = kernels::matmul(&a_plain, &b_plain, false, false).unwrap();
        prop_assert_eq!(fused.shape(), explicit.shape());
        for (x, y) in fused.to_f64_vec().iter().zip(explicit.to_f64_vec()) {
            prop_assert!((x - y).abs() < 1e-12);
        }
    }
}

/// Threads inside a rank (`kernels::threads`) split a large product's output, never its
/// contraction: every backend gives the single thread's bits on 2 and 4 threads, for the GPT's
/// shapes, a contraction longer than the crate's depth block, and every transpose. (Other tests
/// may run meanwhile under the changed setting; their results are the same bits too.)
#[test]
fn a_product_is_bitwise_the_same_on_any_thread_count() {
    let mut rng = Rng::new(9);
    let shapes = [
        (2048, 512, 128),
        (2048, 128, 512),
        (128, 512, 2048),
        (300, 700, 1500),
    ];
    for (m, n, k) in shapes {
        assert!(2 * (m * n * k) as u64 >= kernels::threads::MIN_PARALLEL_FLOPS);
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true)] {
            let shape = GemmShape {
                m,
                n,
                k,
                trans_a,
                trans_b,
            };
            let a = r::to_f32(&rng.vec(m * k, -1.0, 1.0));
            let b = r::to_f32(&rng.vec(k * n, -1.0, 1.0));
            let c0 = r::to_f32(&rng.vec(m * n, -1.0, 1.0));
            for backend in GemmBackend::ALL {
                let run = |threads: usize| {
                    kernels::threads::set_threads(threads);
                    let mut c = c0.clone();
                    gemm_with(backend, shape, 1.5, &a, &b, 1.0, &mut c).unwrap();
                    kernels::threads::set_threads(1);
                    c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                let one = run(1);
                for threads in [2, 4] {
                    assert!(
                        run(threads) == one,
                        "{backend:?} {shape:?} on {threads} threads"
                    );
                }
            }
        }
    }
}

/// A tall product is computed in bands of at most `solo_band_rows()` rows, one call each: its
/// bits are those of calls over 100 rows at a time (each too short to be cut), with `β·C` read,
/// on both `gemm` crate backends and every transpose, the last band shorter than the others.
#[test]
fn a_tall_product_in_bands_equals_calls_over_short_bands() {
    let mut rng = Rng::new(12);
    let short = 100;
    // Past two whole bands, and a whole number of short calls.
    let (m, n, k) = (
        (2 * solo_band_rows()).next_multiple_of(short) + short,
        96,
        300,
    );
    for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = r::to_f32(&rng.vec(m * k, -1.0, 1.0));
        let b = r::to_f32(&rng.vec(k * n, -1.0, 1.0));
        let c0 = r::to_f32(&rng.vec(m * n, -1.0, 1.0));
        for backend in [GemmBackend::Gemm, GemmBackend::GemmColumnMajor] {
            let shape = GemmShape {
                m,
                n,
                k,
                trans_a,
                trans_b,
            };
            let mut whole = c0.clone();
            gemm_with(backend, shape, 1.5, &a, &b, 1.0, &mut whole).unwrap();
            for first in (0..m).step_by(short) {
                // Rows `first..first + short` of op(A), as their own operand.
                let band_a: Vec<f32> = if trans_a {
                    (0..k)
                        .flat_map(|kk| a[kk * m + first..kk * m + first + short].to_vec())
                        .collect()
                } else {
                    a[first * k..(first + short) * k].to_vec()
                };
                let mut band = c0[first * n..(first + short) * n].to_vec();
                let band_shape = GemmShape { m: short, ..shape };
                gemm_with(backend, band_shape, 1.5, &band_a, &b, 1.0, &mut band).unwrap();
                let got = &whole[first * n..(first + short) * n];
                assert!(
                    got.iter()
                        .zip(&band)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{backend:?} {shape:?}: rows {first}..{} differ from one call over them",
                    first + short
                );
            }
        }
    }
}

/// Batched products too small to split themselves (attention's per-head `[128, 64]·[64, 128]`)
/// are shared out among the threads whole: the bits are the single thread's, with a broadcast
/// batch and either operand transposed.
#[test]
fn a_batch_of_small_products_is_bitwise_the_same_on_any_thread_count() {
    let mut rng = Rng::new(11);
    let cases: [(&[usize], &[usize], bool, bool); 3] = [
        (&[16, 4, 128, 64], &[16, 4, 64, 128], false, false),
        (&[16, 4, 128, 64], &[16, 4, 128, 64], false, true),
        (&[16, 4, 64, 128], &[1, 4, 64, 128], true, false),
    ];
    for (a_shape, b_shape, trans_a, trans_b) in cases {
        let a = Tensor::from_vec(
            a_shape,
            r::to_f32(&rng.vec(a_shape.iter().product(), -1.0, 1.0)),
        )
        .unwrap();
        let b = Tensor::from_vec(
            b_shape,
            r::to_f32(&rng.vec(b_shape.iter().product(), -1.0, 1.0)),
        )
        .unwrap();
        let run = |threads: usize| {
            kernels::threads::set_threads(threads);
            let out = kernels::batch_matmul(&a, &b, trans_a, trans_b).unwrap();
            kernels::threads::set_threads(1);
            out.as_f32()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        };
        let one = run(1);
        for threads in [2, 3] {
            assert!(
                run(threads) == one,
                "{a_shape:?}·{b_shape:?} on {threads} threads"
            );
        }
    }
}

/// The engine's own tiles sum every output as one fused multiply-add chain over the reduction,
/// from zero and in order: the bits of that chain written out, on every transpose, for sizes
/// that leave short row tiles and panels, a reduction longer than a pass of the canonical
/// product, and rows split over threads.
#[test]
fn the_tiles_sum_each_output_as_one_chain_in_order() {
    let mut rng = Rng::new(21);
    for (m, n, k) in [
        (1, 1, 1),
        (7, 17, 3),
        (13, 70, 65),
        (300, 129, 1030),
        (40, 70, 2500),
    ] {
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
            let shape = GemmShape {
                m,
                n,
                k,
                trans_a,
                trans_b,
            };
            let a = r::to_f32(&rng.vec(m * k, -1.0, 1.0));
            let b = r::to_f32(&rng.vec(k * n, -1.0, 1.0));
            let (a_at, b_at) = (shape.a_strides(), shape.b_strides());
            for threads in [1, 2] {
                kernels::threads::set_threads(threads);
                let mut c = vec![f32::NAN; m * n];
                let done = gemm_with(GemmBackend::Tiles, shape, 1.0, &a, &b, 0.0, &mut c);
                kernels::threads::set_threads(1);
                done.unwrap();
                for i in 0..m {
                    for j in 0..n {
                        let chain = (0..k).fold(0f32, |acc, s| {
                            let x = a[(i as isize * a_at.0 + s as isize * a_at.1) as usize];
                            let y = b[(s as isize * b_at.0 + j as isize * b_at.1) as usize];
                            x.mul_add(y, acc)
                        });
                        assert_eq!(
                            c[i * n + j].to_bits(),
                            chain.to_bits(),
                            "{shape:?} ({i}, {j}) on {threads} threads"
                        );
                    }
                }
            }
        }
    }
}

/// A product with its bias (`gemm_bias`, `batch_matmul_bias_into`) has the bits of the product
/// followed by the bias add, wherever the bias is added (in the tiles' stores on their route,
/// after the product on the others), on one and two threads, with short last panels and row
/// tiles; a bias of the wrong length is refused.
#[test]
fn a_product_with_its_bias_has_the_bits_of_the_product_then_the_bias_add() {
    let mut rng = Rng::new(23);
    for (m, n, k) in [(517, 88, 256), (300, 70, 65), (5, 3, 7), (256, 64, 1024)] {
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false)] {
            let shape = GemmShape {
                m,
                n,
                k,
                trans_a,
                trans_b,
            };
            let a = r::to_f32(&rng.vec(m * k, -1.0, 1.0));
            let b = r::to_f32(&rng.vec(k * n, -1.0, 1.0));
            let bias = r::to_f32(&rng.vec(n, -1.0, 1.0));
            let mut want = vec![0f32; m * n];
            kernels::gemm(shape, 1.0, &a, &b, 0.0, &mut want).unwrap();
            kernels::bias_add_in_place(&mut want, &bias).unwrap();
            for threads in [1, 2] {
                kernels::threads::set_threads(threads);
                let mut got = vec![f32::NAN; m * n];
                let done = kernels::gemm_bias(shape, &a, &b, &bias, &mut got);
                kernels::threads::set_threads(1);
                done.unwrap();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "{shape:?} on {threads} threads");
            }
            // Batched: `a` as [2, m/2·…] rows sharing `b`, the same rows in one tall product.
            if !trans_a && m % 2 == 0 {
                let mut got = vec![f32::NAN; m * n];
                let b_shape = if trans_b { [n, k] } else { [k, n] };
                kernels::batch_matmul_bias_into(
                    (&a, &[2, m / 2, k]),
                    (&b, &b_shape),
                    (false, trans_b),
                    Some(&bias),
                    (&mut got, &[2, m / 2, n]),
                )
                .unwrap();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "batched {shape:?}");
            }
            let mut c = vec![0f32; m * n];
            let short = kernels::gemm_bias(shape, &a, &b, &bias[..n - 1], &mut c).unwrap_err();
            assert!(
                matches!(short, TensorError::BufferLength { buffer: "bias", .. }),
                "{short:?}"
            );
        }
    }
}
