//! Cross-entropy loss and its gradient against a naive reference and finite differences; large logits do not overflow.

use tensor::kernels;
use tensor::{DType, Tensor, TensorError};

use super::reference::{self as r, assert_close, assert_close_f32, Rng};

fn reference_loss(logits: &[f64], classes: usize, labels: &[i64]) -> f64 {
    let p = r::softmax_rows(logits, classes);
    let n = labels.len();
    -labels
        .iter()
        .enumerate()
        .map(|(i, &l)| p[i * classes + l as usize].ln())
        .sum::<f64>()
        / n as f64
}

#[test]
fn loss_and_gradient_match_reference_and_finite_differences() {
    let mut rng = Rng::new(80);
    for (n, classes) in [(1, 1), (1, 3), (4, 10), (17, 5), (32, 10), (3, 33)] {
        let logits = rng.vec(n * classes, -4.0, 4.0);
        let labels: Vec<i64> = (0..n).map(|_| rng.below(classes) as i64).collect();
        let want = reference_loss(&logits, classes, &labels);
        let p = r::softmax_rows(&logits, classes);
        let mut want_grad: Vec<f64> = p.iter().map(|v| v / n as f64).collect();
        for (i, &l) in labels.iter().enumerate() {
            want_grad[i * classes + l as usize] -= 1.0 / n as f64;
        }
        let labels64 = Tensor::from_vec(&[n], labels.clone()).unwrap();
        let labels32 = Tensor::from_vec(&[n], labels.iter().map(|&l| l as i32).collect()).unwrap();
        for label_tensor in [&labels64, &labels32] {
            let x = r::f32_tensor(&[n, classes], &logits);
            let loss = kernels::sparse_softmax_cross_entropy(&x, label_tensor).unwrap();
            assert!(loss.shape().is_empty());
            assert_close_f32(loss.as_f32().unwrap(), &[want], "loss");
            let one = Tensor::from_vec(&[], vec![1.0f32]).unwrap();
            let g = kernels::sparse_softmax_cross_entropy_grad(&x, label_tensor, &one).unwrap();
            assert_close_f32(g.as_f32().unwrap(), &want_grad, "dlogits");
        }
        // f64, an upstream gradient of 0.5, and finite differences of the f64 loss.
        let x64 = r::f64_tensor(&[n, classes], &logits);
        let half = Tensor::from_vec(&[1], vec![0.5f64]).unwrap();
        let g = kernels::sparse_softmax_cross_entropy_grad(&x64, &labels64, &half).unwrap();
        let scaled: Vec<f64> = want_grad.iter().map(|v| 0.5 * v).collect();
        assert_close(&g.to_f64_vec(), &scaled, 1e-12, 1e-14, "dlogits f64");
        let numeric = r::numeric_grad(&logits, 1e-6, |probe| {
            kernels::sparse_softmax_cross_entropy_slice(probe, classes, &labels).unwrap()
        });
        let unscaled: Vec<f64> = g.to_f64_vec().iter().map(|v| v * 2.0).collect();
        assert_close(&unscaled, &numeric, 1e-6, 1e-8, "dlogits fd");
    }
}

#[test]
fn large_logits_do_not_overflow() {
    let x = Tensor::from_vec(&[1, 3], vec![1000f32, 0.0, -1000.0]).unwrap();
    let labels = Tensor::from_vec(&[1], vec![1i32]).unwrap();
    let loss = kernels::sparse_softmax_cross_entropy(&x, &labels).unwrap();
    assert_close_f32(loss.as_f32().unwrap(), &[1000.0], "loss");
}

#[test]
fn errors() {
    let x = Tensor::zeros(DType::F32, &[2, 3]);
    let labels = Tensor::from_vec(&[2], vec![0i64, 3]).unwrap();
    assert_eq!(
        kernels::sparse_softmax_cross_entropy(&x, &labels).unwrap_err(),
        TensorError::IndexOutOfRange {
            op: "sparse_softmax_cross_entropy",
            position: 1,
            index: 3,
            bound: 3
        }
    );
    let short = Tensor::from_vec(&[1], vec![0i64]).unwrap();
    assert!(matches!(
        kernels::sparse_softmax_cross_entropy(&x, &short),
        Err(TensorError::ShapeMismatch { .. })
    ));
    let float_labels = Tensor::zeros(DType::F32, &[2]);
    assert!(matches!(
        kernels::sparse_softmax_cross_entropy(&x, &float_labels),
        Err(TensorError::IndexDType { .. })
    ));
    let ok = Tensor::from_vec(&[2], vec![0i64, 2]).unwrap();
    let two = Tensor::zeros(DType::F32, &[2]);
    assert!(matches!(
        kernels::sparse_softmax_cross_entropy_grad(&x, &ok, &two),
        Err(TensorError::InvalidArgument { .. })
    ));
    let empty = Tensor::zeros(DType::F32, &[0, 3]);
    let no_labels = Tensor::zeros(DType::I64, &[0]);
    assert!(kernels::sparse_softmax_cross_entropy(&empty, &no_labels).is_err());
}

/// The loss and its gradient split their rows over the rank's threads (the loss sums the rows'
/// terms in row order afterwards): bitwise the one thread's on the GPT's logits.
#[test]
fn loss_and_gradient_are_bitwise_the_same_on_any_thread_count() {
    let mut rng = Rng::new(31);
    let (rows, classes) = (16 * 128 + 3, 96);
    let logits = r::to_f32(&rng.vec(rows * classes, -4.0, 4.0));
    let labels: Vec<i64> = (0..rows)
        .map(|i| ((i * 37 + 11) % classes) as i64)
        .collect();
    let run = |threads: usize| {
        kernels::threads::set_threads(threads);
        let loss = kernels::sparse_softmax_cross_entropy_slice(&logits, classes, &labels).unwrap();
        let mut d = vec![0f32; rows * classes];
        kernels::sparse_softmax_cross_entropy_grad_into(&logits, classes, &labels, 0.5, &mut d)
            .unwrap();
        kernels::threads::set_threads(1);
        (
            loss.to_bits(),
            d.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        )
    };
    let one = run(1);
    assert!(run(2) == one && run(3) == one);
}
