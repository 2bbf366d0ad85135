//! StopGradient, ReduceMax and OneHot, and the cross entropy built from them, which equals
//! SparseSoftmaxCrossEntropy in value and gradient.

use graph::{grad, Executor, GraphBuilder, GraphError, Initializer, Op, ValueId};
use tensor::{DType, Tensor};

use crate::util::indices;

/// The loss, the gradient of parameter `x` and `x`'s values, of the graph `build` makes (f64,
/// `x` drawn from N(0, 1.5)).
fn loss_and_grad(
    shape: &[usize],
    feeds: &[(&str, Tensor)],
    build: impl FnOnce(&mut GraphBuilder, ValueId) -> Result<ValueId, GraphError>,
) -> (f64, Vec<f64>, Vec<f64>) {
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = b.parameter("x", shape, Initializer::normal(1.5)).unwrap();
    let loss = build(&mut b, x).unwrap();
    let forward = b.finish();
    let training = grad(&forward, loss, &[x]).unwrap();
    let mut exec = Executor::new(&training.graph).unwrap();
    exec.init_parameters(3).unwrap();
    for (name, t) in feeds {
        let v = training.graph.value_by_name(name).unwrap();
        exec.set_input(v, t).unwrap();
    }
    exec.run().unwrap();
    let value = exec.value(loss).unwrap().to_f64_vec()[0];
    let g = exec
        .value(training.grad_of(x).unwrap())
        .unwrap()
        .to_f64_vec();
    (value, g, exec.value(x).unwrap().to_f64_vec())
}

#[test]
fn no_gradient_flows_through_stop_gradient() {
    // d/dx Σ x·sg(x) = sg(x) = x, not 2x.
    let (_, g, x) = loss_and_grad(&[2, 3], &[], |b, x| {
        let s = b.stop_gradient("sg", x)?;
        let y = b.mul("mul", x, s)?;
        b.reduce_sum("sum", y, &[], false)
    });
    assert_eq!(g, x);
}

#[test]
fn reduce_max_needs_stop_gradient() {
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = b.parameter("x", &[2, 3], Initializer::normal(1.0)).unwrap();
    let m = b.reduce_max("max", x, &[1], false).unwrap();
    assert_eq!(b.shape(m).unwrap(), &[2]);
    let loss = b.reduce_sum("sum", m, &[], false).unwrap();
    let err = grad(&b.finish(), loss, &[x]).unwrap_err().to_string();
    assert!(
        err.contains("`max` is a ReduceMax node, which has no gradient rule")
            && err.contains("StopGradient"),
        "{err}"
    );
}

#[test]
fn reduce_max_and_one_hot_values() {
    let x = Tensor::from_vec(&[2, 3], vec![1.0f64, 5.0, 2.0, 4.0, 3.0, 0.0]).unwrap();
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let xi = b.input("x", &[2, 3], DType::F64).unwrap();
    let labels = b.input("labels", &[2], DType::I64).unwrap();
    let rows = b.reduce_max("rows", xi, &[1], true).unwrap();
    let all = b.reduce_max("all", xi, &[], false).unwrap();
    let hot = b.one_hot("hot", labels, 4).unwrap();
    for v in [rows, all, hot] {
        b.output(v).unwrap();
    }
    let g = b.finish();
    let mut exec = Executor::new(&g).unwrap();
    exec.set_input(xi, &x).unwrap();
    exec.set_input(labels, &Tensor::from_vec(&[2], vec![2i64, 0]).unwrap())
        .unwrap();
    exec.run().unwrap();
    assert_eq!(exec.value(rows).unwrap().to_f64_vec(), vec![5.0, 4.0]);
    assert_eq!(exec.value(all).unwrap().to_f64_vec(), vec![5.0]);
    assert_eq!(
        exec.value(hot).unwrap().to_f64_vec(),
        vec![0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    );
    exec.set_input(labels, &Tensor::from_vec(&[2], vec![4i64, 0]).unwrap())
        .unwrap();
    let err = exec.run().unwrap_err().to_string();
    assert!(err.contains("hot") && err.contains('4'), "{err}");
}

#[test]
fn new_ops_reject_bad_attributes_and_inputs() {
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = b.input("x", &[2, 0], DType::F64).unwrap();
    let labels = b.input("labels", &[2], DType::I32).unwrap();
    let err = b.reduce_max("max", x, &[1], true).unwrap_err().to_string();
    assert!(err.contains("max: attribute `axes` reduce dim 1"), "{err}");
    let err = b.one_hot("hot", labels, 0).unwrap_err().to_string();
    assert!(err.contains("`depth` must be at least 1"), "{err}");
    let err = b
        .node(
            "hot_int",
            Op::OneHot {
                depth: 3,
                dtype: DType::I32,
            },
            &[labels],
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("floating-point"), "{err}");
    let err = b.exp("exp", labels).unwrap_err().to_string();
    assert!(err.contains("floating-point"), "{err}");
    let err = b
        .vocab_parallel_cross_entropy("xent", labels, labels, 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("2-D logits"), "{err}");
}

#[test]
fn the_composite_cross_entropy_equals_sparse_softmax_cross_entropy() {
    for (n, c, divisor) in [(4, 5, 4), (3, 7, 12), (1, 2, 1)] {
        let labels = indices(&[n], c, 7);
        let feeds = [("labels", labels)];
        let composite = loss_and_grad(&[n, c], &feeds, |b, x| {
            let labels = b.input("labels", &[n], DType::I32)?;
            b.vocab_parallel_cross_entropy("xent", x, labels, divisor)
        });
        let fused = loss_and_grad(&[n, c], &feeds, |b, x| {
            let labels = b.input("labels", &[n], DType::I32)?;
            b.node(
                "xent",
                Op::SparseSoftmaxCrossEntropy {
                    batch_divisor: divisor,
                },
                &[x, labels],
            )
            .map(|v| v[0])
        });
        assert!(
            (composite.0 - fused.0).abs() <= 1e-13 * fused.0.abs().max(1.0),
            "{composite:?} vs {fused:?}"
        );
        assert_eq!(composite.2, fused.2, "the same logits");
        for (a, b) in composite.1.iter().zip(&fused.1) {
            assert!((a - b).abs() <= 1e-14, "{a} vs {b}");
        }
    }
}
