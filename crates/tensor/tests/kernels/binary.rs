//! Elementwise binary kernels with broadcasting, their gradients, bias-add, sum-to-shape, against naive references.

use proptest::prelude::*;
use tensor::kernels::{self, BinaryOp};
use tensor::{DType, Tensor, TensorError};

use super::reference::{self as r, assert_close, assert_close_f32, Rng};

/// Pairs of shapes that broadcast: equal, scalar, trailing vector, stretched middle dims,
/// missing leading dims, and sizes that are not multiples of any SIMD width.
const CASES: [(&[usize], &[usize]); 9] = [
    (&[17], &[17]),
    (&[3, 17], &[3, 17]),
    (&[], &[5, 3]),
    (&[4, 17], &[17]),
    (&[4, 17], &[4, 1]),
    (&[2, 1, 5], &[3, 1]),
    (&[1], &[2, 3, 33]),
    (&[2, 3, 1, 7], &[3, 19, 1]),
    (&[1, 1], &[1]),
];

fn reference_op(op: BinaryOp) -> fn(f64, f64) -> f64 {
    match op {
        BinaryOp::Add => |a, b| a + b,
        BinaryOp::Sub => |a, b| a - b,
        BinaryOp::Mul => |a, b| a * b,
        BinaryOp::Div => |a, b| a / b,
    }
}

const OPS: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];

#[test]
fn broadcasting_binary_ops_match_reference() {
    let mut rng = Rng::new(10);
    for (a_shape, b_shape) in CASES {
        for op in OPS {
            let a = rng.vec(a_shape.iter().product(), -2.0, 2.0);
            // Keep divisors away from zero.
            let b: Vec<f64> = rng
                .vec(b_shape.iter().product(), 0.5, 2.0)
                .into_iter()
                .map(|v| if rng.below(2) == 0 { v } else { -v })
                .collect();
            let (want, shape) = r::broadcast_binary(&a, a_shape, &b, b_shape, reference_op(op));
            for (lhs, rhs) in [(a_shape, b_shape), (b_shape, a_shape)] {
                // Both operand orders (the reference is recomputed for the swapped order).
                let (x, y) = if lhs == a_shape { (&a, &b) } else { (&b, &a) };
                let (want, _) = if lhs == a_shape {
                    (want.clone(), shape.clone())
                } else {
                    r::broadcast_binary(&b, b_shape, &a, a_shape, reference_op(op))
                };
                let t =
                    kernels::binary(op, &r::f32_tensor(lhs, x), &r::f32_tensor(rhs, y)).unwrap();
                assert_eq!(t.shape(), shape.as_slice());
                let what = format!("{op:?} {lhs:?} {rhs:?}");
                assert_close_f32(t.as_f32().unwrap(), &want, &what);
            }
        }
    }
}

#[test]
fn named_wrappers_and_f64() {
    let a = Tensor::from_vec(&[2, 2], vec![1.0f64, 2.0, 3.0, 4.0]).unwrap();
    let b = Tensor::from_vec(&[2], vec![10.0f64, 20.0]).unwrap();
    assert_eq!(
        kernels::add(&a, &b).unwrap().to_f64_vec(),
        [11.0, 22.0, 13.0, 24.0]
    );
    assert_eq!(
        kernels::sub(&a, &b).unwrap().to_f64_vec(),
        [-9.0, -18.0, -7.0, -16.0]
    );
    assert_eq!(
        kernels::mul(&a, &b).unwrap().to_f64_vec(),
        [10.0, 40.0, 30.0, 80.0]
    );
    assert_eq!(
        kernels::div(&a, &b).unwrap().to_f64_vec(),
        [0.1, 0.1, 0.3, 0.2]
    );
    let h = a.to_dtype(DType::F16);
    let y = kernels::add(&h, &b.to_dtype(DType::F16)).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(y.to_f64_vec(), [11.0, 22.0, 13.0, 24.0]);
}

#[test]
fn binary_errors() {
    let a = Tensor::zeros(DType::F32, &[2, 3]);
    assert!(matches!(
        kernels::add(&a, &Tensor::zeros(DType::F32, &[2])),
        Err(TensorError::NotBroadcastable { op: "add", .. })
    ));
    assert!(matches!(
        kernels::mul(&a, &Tensor::zeros(DType::F64, &[2, 3])),
        Err(TensorError::DTypeMismatch { op: "mul", .. })
    ));
    assert!(matches!(
        kernels::add(
            &Tensor::zeros(DType::U8, &[2]),
            &Tensor::zeros(DType::U8, &[2])
        ),
        Err(TensorError::UnsupportedDType { op: "add", .. })
    ));
    let mut out = vec![0f32; 5];
    assert!(matches!(
        kernels::binary_into(
            BinaryOp::Add,
            &[0f32; 6],
            &[2, 3],
            &[0f32; 3],
            &[3],
            &mut out
        ),
        Err(TensorError::BufferLength { buffer: "out", .. })
    ));
}

#[test]
fn binary_grads_match_analytic_and_finite_differences() {
    let mut rng = Rng::new(11);
    for (a_shape, b_shape) in CASES {
        for op in OPS {
            let a = rng.vec(a_shape.iter().product(), -2.0, 2.0);
            let b = rng.vec(b_shape.iter().product(), 0.5, 2.0);
            let (_, shape) = r::broadcast_binary(&a, a_shape, &b, b_shape, reference_op(op));
            let dy = rng.vec(shape.iter().product(), -1.0, 1.0);
            let (da, db) = kernels::binary_grad(
                op,
                &r::f64_tensor(a_shape, &a),
                &r::f64_tensor(b_shape, &b),
                &r::f64_tensor(&shape, &dy),
            )
            .unwrap();
            assert_eq!(da.shape(), a_shape);
            assert_eq!(db.shape(), b_shape);
            // Analytic reference: the partial derivatives at the broadcast shape, summed back.
            let (pa, _) = r::broadcast_binary(&a, a_shape, &b, b_shape, |_x, y| match op {
                BinaryOp::Add | BinaryOp::Sub => 1.0,
                BinaryOp::Mul => y,
                BinaryOp::Div => 1.0 / y,
            });
            let (pb, _) = r::broadcast_binary(&a, a_shape, &b, b_shape, |x, y| match op {
                BinaryOp::Add => 1.0,
                BinaryOp::Sub => -1.0,
                BinaryOp::Mul => x,
                BinaryOp::Div => -x / (y * y),
            });
            let ga: Vec<f64> = pa.iter().zip(&dy).map(|(p, g)| p * g).collect();
            let gb: Vec<f64> = pb.iter().zip(&dy).map(|(p, g)| p * g).collect();
            let what = format!("{op:?} {a_shape:?} {b_shape:?}");
            assert_close(
                &da.to_f64_vec(),
                &r::sum_to_shape(&ga, &shape, a_shape),
                1e-12,
                1e-12,
                &what,
            );
            assert_close(
                &db.to_f64_vec(),
                &r::sum_to_shape(&gb, &shape, b_shape),
                1e-12,
                1e-12,
                &what,
            );
            // Finite differences through the f64 kernel itself.
            let forward = |x: &[f64], y: &[f64]| {
                let mut out = vec![0.0; dy.len()];
                kernels::binary_into(op, x, a_shape, y, b_shape, &mut out).unwrap();
                r::weighted_sum(&dy, &out)
            };
            let num_a = r::numeric_grad(&a, 1e-6, |x| forward(x, &b));
            let num_b = r::numeric_grad(&b, 1e-6, |y| forward(&a, y));
            assert_close(&da.to_f64_vec(), &num_a, 1e-6, 1e-6, &what);
            assert_close(&db.to_f64_vec(), &num_b, 1e-6, 1e-6, &what);
        }
    }
}

#[test]
fn sum_to_shape_and_broadcast_to_match_reference() {
    let mut rng = Rng::new(12);
    let cases: [(&[usize], &[usize]); 6] = [
        (&[3, 17], &[17]),
        (&[3, 17], &[3, 1]),
        (&[2, 3, 5], &[]),
        (&[2, 3, 5], &[3, 1]),
        (&[4, 1, 19], &[1, 1, 19]),
        (&[33], &[33]),
    ];
    for (big, small) in cases {
        let g = rng.vec(big.iter().product(), -1.0, 1.0);
        let got = kernels::sum_to_shape(&r::f32_tensor(big, &g), small).unwrap();
        assert_eq!(got.shape(), small);
        assert_close_f32(
            got.as_f32().unwrap(),
            &r::sum_to_shape(&g, big, small),
            "sum_to_shape",
        );
        let x = rng.vec(small.iter().product(), -1.0, 1.0);
        let up = kernels::broadcast_to(&r::f32_tensor(small, &x), big).unwrap();
        let (want, _) = r::broadcast_binary(&x, small, &vec![0.0; g.len()], big, |v, _| v);
        assert_close_f32(up.as_f32().unwrap(), &want, "broadcast_to");
    }
    assert!(matches!(
        kernels::sum_to_shape(&Tensor::zeros(DType::F32, &[3, 4]), &[3]),
        Err(TensorError::NotBroadcastable { .. })
    ));
}

#[test]
fn bias_add_and_its_grad() {
    let mut rng = Rng::new(13);
    for (rows, cols) in [(1, 1), (3, 17), (32, 10), (5, 33)] {
        let x = rng.vec(rows * cols, -1.0, 1.0);
        let bias = rng.vec(cols, -1.0, 1.0);
        let y = kernels::bias_add(
            &r::f32_tensor(&[rows, cols], &x),
            &r::f32_tensor(&[cols], &bias),
        )
        .unwrap();
        let (want, _) = r::broadcast_binary(&x, &[rows, cols], &bias, &[cols], |a, b| a + b);
        assert_close_f32(y.as_f32().unwrap(), &want, "bias_add");
        let dy = rng.vec(rows * cols, -1.0, 1.0);
        let db = kernels::bias_add_grad(&r::f32_tensor(&[rows, cols], &dy)).unwrap();
        assert_close_f32(
            db.as_f32().unwrap(),
            &r::sum_to_shape(&dy, &[rows, cols], &[cols]),
            "bias_add_grad",
        );
    }
    assert!(matches!(
        kernels::bias_add(
            &Tensor::zeros(DType::F32, &[2, 3]),
            &Tensor::zeros(DType::F32, &[2])
        ),
        Err(TensorError::ShapeMismatch { op: "bias_add", .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Summing a broadcast back to the input's shape multiplies it by the broadcast count.
    #[test]
    fn sum_to_shape_of_broadcast_is_count_times_input(
        small in prop::collection::vec(prop_oneof![Just(1usize), 2usize..5], 0..4),
        extra_leading in prop::collection::vec(1usize..4, 0..2),
        seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        // The big shape stretches every size-1 dim of `small` and adds leading dims.
        let mut big = extra_leading.clone();
        big.extend(small.iter().map(|&s| if s == 1 { 1 + rng.below(3) } else { s }));
        let x = rng.vec(small.iter().product(), -1.0, 1.0);
        let up = kernels::broadcast_to(&r::f64_tensor(&small, &x), &big).unwrap();
        let back = kernels::sum_to_shape(&up, &small).unwrap();
        let count = (big.iter().product::<usize>() / small.iter().product::<usize>().max(1)) as f64;
        for (got, v) in back.to_f64_vec().iter().zip(&x) {
            prop_assert!((got - count * v).abs() < 1e-12);
        }
    }
}
