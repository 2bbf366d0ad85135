//! The embedding gather kernel and its scatter-add gradient against naive references.

use tensor::kernels;
use tensor::{DType, Tensor, TensorError};

use super::reference::{self as r, assert_close, assert_close_f32, Rng};

#[test]
fn gather_and_scatter_add_match_reference() {
    let mut rng = Rng::new(60);
    // (vocab, dim, index shape)
    let cases: [(usize, usize, &[usize]); 5] = [
        (1, 1, &[1]),
        (10, 3, &[4]),
        (7, 17, &[2, 5]),
        (50, 33, &[3, 1, 4]),
        (5, 8, &[0]),
    ];
    for (vocab, dim, index_shape) in cases {
        let table = rng.vec(vocab * dim, -1.0, 1.0);
        let n: usize = index_shape.iter().product();
        // Repeated indices on purpose: the scatter must add, not overwrite.
        let ids: Vec<i64> = (0..n).map(|_| rng.below(vocab.min(4)) as i64).collect();
        let mut out_shape = index_shape.to_vec();
        out_shape.push(dim);
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&i| table[i as usize * dim..][..dim].to_vec())
            .collect();
        let dy = rng.vec(n * dim, -1.0, 1.0);
        let mut want_grad = vec![0.0; vocab * dim];
        for (p, &i) in ids.iter().enumerate() {
            for d in 0..dim {
                want_grad[i as usize * dim + d] += dy[p * dim + d];
            }
        }
        let ids64 = Tensor::from_vec(index_shape, ids.clone()).unwrap();
        let ids32 = Tensor::from_vec(index_shape, ids.iter().map(|&i| i as i32).collect()).unwrap();
        for index_tensor in [&ids64, &ids32] {
            let y =
                kernels::embedding(&r::f32_tensor(&[vocab, dim], &table), index_tensor).unwrap();
            assert_eq!(y.shape(), out_shape.as_slice());
            assert_close_f32(y.as_f32().unwrap(), &want, "embedding");
            let g = kernels::embedding_grad(&r::f32_tensor(&out_shape, &dy), index_tensor, vocab)
                .unwrap();
            assert_eq!(g.shape(), &[vocab, dim]);
            assert_close_f32(g.as_f32().unwrap(), &want_grad, "embedding_grad");
        }
        // Gathering moves elements of any dtype unchanged.
        let table16 = r::f32_tensor(&[vocab, dim], &table).to_dtype(DType::BF16);
        let y = kernels::embedding(&table16, &ids64).unwrap();
        assert_eq!(y.dtype(), DType::BF16);
        let want16: Vec<f64> = ids
            .iter()
            .flat_map(|&i| table16.to_f64_vec()[i as usize * dim..][..dim].to_vec())
            .collect();
        assert_close(&y.to_f64_vec(), &want16, 0.0, 0.0, "embedding bf16");
    }
}

#[test]
fn out_of_range_indices_are_named_and_nothing_is_written() {
    let table = Tensor::zeros(DType::F32, &[4, 2]);
    let ids = Tensor::from_vec(&[3], vec![0i32, 4, 1]).unwrap();
    assert_eq!(
        kernels::embedding(&table, &ids).unwrap_err(),
        TensorError::IndexOutOfRange {
            op: "embedding",
            position: 1,
            index: 4,
            bound: 4
        }
    );
    let negative = Tensor::from_vec(&[2], vec![1i64, -1]).unwrap();
    assert!(matches!(
        kernels::embedding(&table, &negative),
        Err(TensorError::IndexOutOfRange {
            position: 1,
            index: -1,
            ..
        })
    ));
    let mut grad = vec![5f32; 8];
    let err = kernels::scatter_add_rows(&mut grad, 2, &[1i64, 9], &[1.0; 4]).unwrap_err();
    assert!(matches!(
        err,
        TensorError::IndexOutOfRange {
            op: "scatter_add",
            position: 1,
            ..
        }
    ));
    assert_eq!(
        grad,
        vec![5.0; 8],
        "no row may be updated before the indices are validated"
    );
    assert!(matches!(
        kernels::embedding(&table, &Tensor::zeros(DType::F32, &[2])),
        Err(TensorError::IndexDType {
            op: "embedding",
            got: DType::F32
        })
    ));
    assert!(matches!(
        kernels::embedding_grad(&Tensor::zeros(DType::F32, &[3, 5]), &ids, 4),
        Err(TensorError::IndexOutOfRange { .. }) | Err(TensorError::ShapeMismatch { .. })
    ));
}
