//! The executor against a hand computation, its buffer sharing, and its errors.

use graph::{grad, Executor, GraphBuilder, GraphError, Initializer};
use tensor::{DType, Tensor};

/// `loss = CE(relu(x·W + b), labels)` with values small enough to work out by hand.
#[test]
fn reproduces_a_hand_computation() -> Result<(), GraphError> {
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = b.input("x", &[2, 3], DType::F64)?;
    let labels = b.input("labels", &[2], DType::I32)?;
    let w = b.parameter("w", &[3, 2], Initializer::Zeros)?;
    let bias = b.parameter("b", &[2], Initializer::Zeros)?;
    let h = b.matmul("matmul", x, w)?;
    let h = b.bias_add("bias_add", h, bias)?;
    let logits = b.relu("relu", h)?;
    let loss = b.sparse_softmax_cross_entropy("loss", logits, labels)?;
    let forward = b.finish();
    let training = grad(&forward, loss, &[w, bias])?;
    let mut exec = Executor::with_outputs(
        &training.graph,
        &[loss, logits, training.grad_of(bias).unwrap()],
    )?;
    exec.set_input(
        x,
        &Tensor::from_vec(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
    )?;
    exec.set_input(
        w,
        &Tensor::from_vec(&[3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, -1.0]).unwrap(),
    )?;
    exec.set_input(bias, &Tensor::from_vec(&[2], vec![0.5, 2.0]).unwrap())?;
    exec.set_input(labels, &Tensor::from_vec(&[2], vec![0i32, 1]).unwrap())?;
    exec.run()?;
    // x·W = [[4, -1], [10, -1]]; + b = [[4.5, 1], [10.5, 1]]; relu keeps it.
    assert_eq!(exec.value(logits)?.to_f64_vec(), [4.5, 1.0, 10.5, 1.0]);
    // Row 0 (label 0): ln(1 + e^-3.5); row 1 (label 1): 9.5 + ln(1 + e^-9.5); mean of the two.
    let row0 = (1.0 + (-3.5f64).exp()).ln();
    let row1 = 9.5 + (1.0 + (-9.5f64).exp()).ln();
    let got = exec.value(loss)?.to_f64_vec()[0];
    assert!((got - (row0 + row1) / 2.0).abs() < 1e-12, "loss {got}");
    // d loss / d b = mean over rows of softmax - onehot (relu is active everywhere).
    let p0 = 1.0 / (1.0 + (-3.5f64).exp()); // softmax of row 0, class 0
    let p1 = 1.0 / (1.0 + (-9.5f64).exp()); // softmax of row 1, class 0
    let expected = [
        ((p0 - 1.0) + p1) / 2.0,
        ((1.0 - p0) + (1.0 - p1 - 1.0)) / 2.0,
    ];
    let dbias = exec.value(training.grad_of(bias).unwrap())?.to_f64_vec();
    for (g, e) in dbias.iter().zip(expected) {
        assert!(
            (g - e).abs() < 1e-12,
            "dbias {dbias:?}, expected {expected:?}"
        );
    }
    Ok(())
}

#[test]
fn intermediates_share_buffers() -> Result<(), GraphError> {
    let model = graph::models::seed_mlp(32, &[28, 28], 512, 10)?;
    let forward = Executor::with_outputs(&model.graph, &[model.loss])?;
    // 12 values: 5 leaves and the loss keep their buffers; of the 6 other intermediates,
    // matmul2 reuses matmul1's [32, 512] buffer and relu2 reuses relu1's.
    assert_eq!(model.graph.values().len(), 12);
    assert_eq!(forward.n_buffers(), 10);
    let training = grad(
        &model.graph,
        model.loss,
        &model.graph.trainable_parameters(),
    )?;
    let exec = Executor::new(&training.graph)?;
    let n_values = training.graph.values().len();
    assert!(
        exec.n_buffers() < n_values,
        "{} buffers for {n_values} values",
        exec.n_buffers()
    );
    // The relu2 output is an intermediate whose buffer is reused: it is not readable.
    let relu2 = training.graph.value_by_name("relu2").unwrap();
    assert_eq!(
        exec.value(relu2).unwrap_err().to_string(),
        "executor: value `relu2` is not kept after a run; ask for it as an output when \
         building the executor"
    );
    Ok(())
}

#[test]
fn reused_buffers_give_the_same_results_as_dedicated_ones() -> Result<(), GraphError> {
    let model = graph::models::seed_mlp(8, &[4, 4], 16, 3)?;
    let training = grad(
        &model.graph,
        model.loss,
        &model.graph.trainable_parameters(),
    )?;
    let mut shared = Executor::new(&training.graph)?;
    // A graph without declared outputs keeps every value in its own buffer.
    let mut dedicated = Executor::with_outputs(&training.graph, &[])?;
    for exec in [&mut shared, &mut dedicated] {
        exec.init_parameters(3)?;
        exec.set_input(
            model.input,
            &crate::util::uniform(&[8, 4, 4], 1).to_dtype(DType::F32),
        )?;
        exec.set_input(model.labels, &crate::util::indices(&[8], 3, 2))?;
        exec.run()?;
        exec.run()?; // a second step on reused buffers
    }
    assert!(shared.n_buffers() < dedicated.n_buffers());
    for &(_, g) in &training.grads {
        assert_eq!(shared.value(g)?, dedicated.value(g)?);
    }
    Ok(())
}

#[test]
fn feeding_errors_name_the_value() -> Result<(), GraphError> {
    let model = graph::models::seed_mlp(4, &[2, 2], 3, 2)?;
    let mut exec = Executor::new(&model.graph)?;
    let err = exec
        .set_input(
            model.labels,
            &Tensor::from_vec(&[4], vec![0.0f32; 4]).unwrap(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "input `labels`: expected i32 [4], got f32 [4]"
    );
    // A label out of range is reported by the kernel, with the node.
    exec.set_input(
        model.labels,
        &Tensor::from_vec(&[4], vec![0i32, 1, 7, 0]).unwrap(),
    )?;
    let err = exec.run().unwrap_err().to_string();
    assert!(err.starts_with("loss: "), "{err}");
    assert!(
        err.contains("index 7 at position 2 is out of range 0..2"),
        "{err}"
    );
    Ok(())
}

/// `Sqrt` forward on squares and a negative input (NaN), and its gradient `dy / (2√x)`.
#[test]
fn sqrt_forward_and_gradient() -> Result<(), GraphError> {
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = b.parameter("x", &[5], Initializer::Zeros)?;
    let y = b.sqrt("sqrt", x)?;
    let loss = b.reduce_sum("sum", y, &[], false)?;
    let training = grad(&b.finish(), loss, &[x])?;
    let dx = training.grad_of(x).unwrap();
    let mut exec = Executor::with_outputs(&training.graph, &[y, dx])?;
    let values = vec![0.0, 1.0, 4.0, 2.25, -1.0];
    exec.set_input(x, &Tensor::from_vec(&[5], values).unwrap())?;
    exec.run()?;
    let got = exec.value(y)?.to_f64_vec();
    assert_eq!(got[..4], [0.0, 1.0, 2.0, 1.5]);
    assert!(got[4].is_nan(), "sqrt(-1) = {}", got[4]);
    let grads = exec.value(dx)?.to_f64_vec();
    assert_eq!(grads[1..4], [0.5, 0.25, 1.0 / 3.0]);
    assert!(grads[0].is_infinite(), "d sqrt(x)/dx at 0 = {}", grads[0]);
    Ok(())
}
