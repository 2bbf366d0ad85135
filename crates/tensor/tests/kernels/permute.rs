//! Axis permutation (transpose) on every path against index arithmetic.

use proptest::prelude::*;
use tensor::kernels;
use tensor::{DType, Tensor, TensorError};

use super::reference::{self as r, Rng};

/// Reference permute: out[index] = x[index mapped back through axes].
fn reference(x: &[f64], shape: &[usize], axes: &[usize]) -> Vec<f64> {
    let out_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let strides = r::row_major_strides(shape);
    (0..x.len())
        .map(|flat| {
            let index = r::unravel(flat, &out_shape);
            let src: usize = axes.iter().zip(&index).map(|(&a, &i)| i * strides[a]).sum();
            x[src]
        })
        .collect()
}

#[test]
fn permute_matches_reference_on_every_path() {
    let mut rng = Rng::new(70);
    // Shapes and axes exercising: identity, contiguous runs, blocked (batched) transposes with
    // sizes around the tile, size-1 dims, and strided gathers.
    let cases: [(&[usize], &[usize]); 10] = [
        (&[5], &[0]),
        (&[3, 17], &[1, 0]),
        (&[33, 47], &[1, 0]),
        (&[1, 16], &[1, 0]),
        (&[2, 3, 4], &[0, 2, 1]),
        (&[2, 3, 4], &[2, 0, 1]),
        (&[2, 3, 4], &[1, 0, 2]),
        (&[4, 1, 3, 5], &[3, 1, 0, 2]),
        (&[2, 3, 4, 5], &[0, 1, 3, 2]),
        (&[3, 2, 17, 5], &[2, 3, 0, 1]),
    ];
    for (shape, axes) in cases {
        let x = rng.vec(shape.iter().product(), -1.0, 1.0);
        let want = reference(&x, shape, axes);
        let y = kernels::permute(&r::f64_tensor(shape, &x), axes).unwrap();
        assert_eq!(y.shape(), kernels::permuted_shape(shape, axes).as_slice());
        assert_eq!(y.to_f64_vec(), want, "{shape:?} {axes:?}");
        // Every element size goes through the same code.
        let ints: Vec<i64> = (0..x.len() as i64).collect();
        let y = kernels::permute(&Tensor::from_vec(shape, ints.clone()).unwrap(), axes).unwrap();
        let want_ints = reference(
            &ints.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            shape,
            axes,
        );
        assert_eq!(y.to_f64_vec(), want_ints);
        let y = kernels::permute(&r::f32_tensor(shape, &x).to_dtype(DType::F16), axes).unwrap();
        assert_eq!(y.dtype(), DType::F16);
    }
}

#[test]
fn transpose_2d_and_errors() {
    let x = Tensor::from_vec(&[2, 3], vec![1u8, 2, 3, 4, 5, 6]).unwrap();
    let t = kernels::transpose(&x).unwrap();
    assert_eq!(t.shape(), &[3, 2]);
    assert_eq!(t.as_slice::<u8>().unwrap(), &[1, 4, 2, 5, 3, 6]);
    let mut out = vec![0f32; 6];
    kernels::transpose_into(&[1f32, 2., 3., 4., 5., 6.], 3, 2, &mut out).unwrap();
    assert_eq!(out, [1., 3., 5., 2., 4., 6.]);
    assert!(kernels::transpose(&Tensor::zeros(DType::F32, &[2, 2, 2])).is_err());
    for bad in [&[0usize, 0][..], &[0], &[0, 2], &[1, 0, 2]] {
        assert!(matches!(
            kernels::permute(&x, bad),
            Err(TensorError::InvalidArgument { op: "permute", .. })
        ));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Permuting and then applying the inverse permutation is the identity.
    #[test]
    fn permute_then_inverse_is_identity(
        shape in prop::collection::vec(1usize..6, 1..5),
        seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let mut axes: Vec<usize> = (0..shape.len()).collect();
        for i in (1..axes.len()).rev() {
            axes.swap(i, rng.below(i + 1));
        }
        let x = r::f32_tensor(&shape, &rng.vec(shape.iter().product(), -1.0, 1.0));
        let y = kernels::permute(&x, &axes).unwrap();
        let back = kernels::permute(&y, &kernels::inverse_axes(&axes)).unwrap();
        prop_assert_eq!(back, x);
    }
}

/// Large permutes cut their output into runs of whole blocks, one per thread of the rank: the
/// heads' transposes of the GPT, a batched 2-D transpose and a strided gather are bitwise the
/// one thread's.
#[test]
fn permutes_are_the_same_on_any_thread_count() {
    let mut rng = Rng::new(37);
    let cases: [(&[usize], &[usize]); 4] = [
        (&[16, 128, 4, 64], &[0, 2, 1, 3]),
        (&[16, 4, 128, 64], &[0, 2, 1, 3]),
        (&[7, 129, 67], &[0, 2, 1]),
        (&[33, 5, 301], &[2, 1, 0]),
    ];
    for (shape, axes) in cases {
        let n: usize = shape.iter().product();
        let x = r::to_f32(&rng.vec(n, -1.0, 1.0));
        let run = |threads: usize| {
            kernels::threads::set_threads(threads);
            let mut out = vec![0f32; n];
            kernels::permute_into(&x, shape, axes, &mut out).unwrap();
            kernels::threads::set_threads(1);
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let one = run(1);
        assert!(run(2) == one && run(3) == one, "{shape:?} by {axes:?}");
    }
}
