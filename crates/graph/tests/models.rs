//! Whole models: the seed MLP's names and backward graph, and autodiff checked by finite
//! differences on the seed MLP and on a network of Dense, GeLU, LayerNorm and Embedding.

use graph::models::{seed_mlp, seed_mlp_with_dtype};
use graph::{grad, nn, Executor, GraphError, NodeRole, Op};
use tensor::{DType, Tensor};

use crate::util::{check_gradients, indices, uniform};

#[test]
fn seed_mlp_has_the_expected_names_and_shapes() -> Result<(), GraphError> {
    let model = seed_mlp(32, &[8, 8], 512, 10)?;
    let g = &model.graph;
    let names: Vec<&str> = g.nodes().iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        ["flatten", "matmul1", "relu1", "matmul2", "relu2", "matmul3", "loss"]
    );
    let params: Vec<(&str, &[usize])> = g
        .parameters()
        .iter()
        .map(|&p| {
            (
                g.values()[p.0].name.as_str(),
                g.values()[p.0].shape.as_slice(),
            )
        })
        .collect();
    assert_eq!(
        params,
        [
            ("fc1_weight", &[64, 512][..]),
            ("fc2_weight", &[512, 512]),
            ("fc3_weight", &[512, 10])
        ]
    );
    let plain = Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    for name in ["matmul1", "matmul2", "matmul3"] {
        assert_eq!(g.node(g.node_by_name(name).unwrap())?.op, plain);
    }
    assert_eq!(
        g.node(g.node_by_name("loss").unwrap())?.op,
        Op::SparseSoftmaxCrossEntropy { batch_divisor: 32 }
    );
    assert_eq!(
        g.value(g.value_by_name("flatten").unwrap())?.shape,
        [32, 64]
    );
    assert_eq!(g.value(model.logits)?.shape, [32, 10]);
    assert_eq!(g.value(model.labels)?.dtype, DType::I32);
    // Traversal: the logits feed the loss only; matmul1 needs flatten.
    assert_eq!(g.consumers(model.logits).len(), 1);
    let matmul1 = g.node_by_name("matmul1").unwrap();
    let flat = g.node(matmul1)?.inputs[0];
    assert_eq!(g.producer(flat), g.node_by_name("flatten"));
    Ok(())
}

#[test]
fn seed_mlp_backward_graph() -> Result<(), GraphError> {
    let model = seed_mlp(32, &[8, 8], 512, 10)?;
    let params = model.graph.trainable_parameters();
    let training = grad(&model.graph, model.loss, &params)?;
    let g = &training.graph;
    let forward_node = |name: &str| model.graph.node_by_name(name).unwrap();
    let backward: Vec<(&str, &str)> = g.nodes()[model.graph.nodes().len()..]
        .iter()
        .map(|n| (n.name.as_str(), n.op.kind()))
        .collect();
    assert_eq!(
        backward,
        [
            ("loss.grad_seed", "Fill"),
            ("loss.grad0", "SparseSoftmaxCrossEntropyGrad"),
            ("matmul3.grad0", "MatMul"),
            ("matmul3.grad1", "MatMul"),
            ("relu2.grad0", "ReluGrad"),
            ("matmul2.grad0", "MatMul"),
            ("matmul2.grad1", "MatMul"),
            ("relu1.grad0", "ReluGrad"),
            // No gradient flows into the data input: matmul1's rule builds only dW1.
            ("matmul1.grad1", "MatMul"),
        ]
    );
    let dw3 = g.node(g.node_by_name("matmul3.grad1").unwrap())?;
    assert_eq!(
        dw3.op,
        Op::MatMul {
            transpose_a: true,
            transpose_b: false
        }
    );
    assert_eq!(
        dw3.role,
        NodeRole::Backward(graph::GradOf {
            forward: forward_node("matmul3"),
            wrt: vec![Some(1)]
        })
    );
    let dx3 = g.node(g.node_by_name("matmul3.grad0").unwrap())?;
    assert_eq!(
        dx3.op,
        Op::MatMul {
            transpose_a: false,
            transpose_b: true
        }
    );
    let ce = g.node(g.node_by_name("loss.grad0").unwrap())?;
    assert_eq!(
        ce.op,
        Op::SparseSoftmaxCrossEntropyGrad { batch_divisor: 32 }
    );
    let w1 = model.graph.value_by_name("fc1_weight").unwrap();
    assert_eq!(g.value(training.grad_of(w1).unwrap())?.shape, [64, 512]);
    assert_eq!(g.outputs().len(), 4);
    assert_eq!(g.outputs()[0], model.loss);
    // A parameter listed twice gets one gradient; an input is not differentiable.
    let twice = grad(&model.graph, model.loss, &[w1, w1])?;
    assert_eq!(twice.grads[0], twice.grads[1]);
    let err = grad(&model.graph, model.loss, &[model.input]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "grad: `x` cannot be differentiated: it is an input of f32, not a floating-point parameter"
    );
    let err = grad(&model.graph, model.logits, &[w1]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "grad: `matmul3` is not a loss: it must be a floating-point scalar (shape []), got [32, 10] of f32"
    );
    Ok(())
}

#[test]
fn seed_mlp_gradients_match_finite_differences() {
    check_gradients("seed_mlp", |b| {
        // The seed MLP's structure in f64 (with its parameters renamed into a scope): the loss
        // itself is the checked output.
        let model = seed_mlp_with_dtype(4, &[3, 3], 6, 5, DType::F64)?;
        let g = &model.graph;
        let x = b.input("x", &[4, 3, 3], DType::F64)?;
        let labels = b.input("labels", &[4], DType::I32)?;
        let mut map = std::collections::HashMap::new();
        map.insert(model.input, x);
        map.insert(model.labels, labels);
        for &p in &g.parameters() {
            let value = g.value(p)?;
            let graph::ValueKind::Parameter { init, .. } = &value.kind else {
                unreachable!()
            };
            map.insert(p, b.parameter(&value.name, &value.shape, init.clone())?);
        }
        for node in g.nodes() {
            let inputs: Vec<_> = node.inputs.iter().map(|v| map[v]).collect();
            let outputs = b.node(&node.name, node.op.clone(), &inputs)?;
            for (old, new) in node.outputs.iter().zip(outputs) {
                map.insert(*old, new);
            }
        }
        let feeds = vec![(x, uniform(&[4, 3, 3], 3)), (labels, indices(&[4], 5, 2))];
        Ok((map[&model.loss], feeds))
    })
    .unwrap();
}

#[test]
fn dense_gelu_layernorm_embedding_gradients() {
    check_gradients("mixed network", |b| {
        let ids = b.input("ids", &[3, 4], DType::I32)?;
        let labels = b.input("labels", &[3], DType::I64)?;
        let h = b.call("embed", &nn::Embedding::new(7, 5), ids)?;
        let gelu = nn::Activation::Gelu { approximate: true };
        let h = b.call("dense1", &nn::Dense::new(5, 6).activation(gelu), h)?;
        let h = b.call("norm", &nn::LayerNorm::new(6), h)?;
        let h = b.flatten("flatten", h)?;
        let erf = nn::Activation::Gelu { approximate: false };
        let h = b.call("mlp", &nn::Mlp::new(&[24, 8, 4]).activation(erf), h)?;
        let loss = b.sparse_softmax_cross_entropy("loss", h, labels)?;
        let label_values = Tensor::from_vec(&[3], vec![0i64, 3, 1]).unwrap();
        Ok((
            loss,
            vec![(ids, indices(&[3, 4], 7, 9)), (labels, label_values)],
        ))
    })
    .unwrap();
}

#[test]
fn dense_sigmoid_gradients() {
    check_gradients("dense sigmoid", |b| {
        let x = b.input("x", &[3, 5], DType::F64)?;
        let labels = b.input("labels", &[3], DType::I64)?;
        let sigmoid = nn::Activation::Sigmoid;
        let h = b.call("dense1", &nn::Dense::new(5, 6).activation(sigmoid), x)?;
        let h = b.call("dense2", &nn::Dense::new(6, 4), h)?;
        let loss = b.sparse_softmax_cross_entropy("loss", h, labels)?;
        let label_values = Tensor::from_vec(&[3], vec![0i64, 3, 1]).unwrap();
        Ok((loss, vec![(x, uniform(&[3, 5], 4)), (labels, label_values)]))
    })
    .unwrap();
}

#[test]
fn seed_mlp_trains_with_sgd() -> Result<(), GraphError> {
    // Learn a fixed random labelling of 16 samples: 40 SGD steps must cut the loss well down.
    let model = seed_mlp(16, &[8, 8], 32, 4)?;
    let training = grad(
        &model.graph,
        model.loss,
        &model.graph.trainable_parameters(),
    )?;
    let mut exec = Executor::new(&training.graph)?;
    exec.init_parameters(5)?;
    exec.set_input(model.input, &uniform(&[16, 8, 8], 4).to_dtype(DType::F32))?;
    exec.set_input(model.labels, &indices(&[16], 4, 6))?;
    let mut losses = Vec::new();
    for _ in 0..40 {
        exec.run()?;
        losses.push(exec.value(model.loss)?.to_f64_vec()[0]);
        for &(param, g) in &training.grads {
            let update: Vec<f32> = exec.value(g)?.as_f32().unwrap().to_vec();
            let weights = exec.value_mut(param)?.as_f32_mut().unwrap();
            for (w, d) in weights.iter_mut().zip(update) {
                *w -= 0.1 * d;
            }
        }
    }
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(
        (first - 4f64.ln()).abs() < 1.0,
        "initial loss {first} near ln 4"
    );
    assert!(last < 0.5 * first, "loss went from {first} to {last}");
    Ok(())
}

#[test]
fn graph_display_lists_leaves_and_nodes() -> Result<(), GraphError> {
    let model = seed_mlp(2, &[2, 2], 3, 2)?;
    let expected = "\
%0 = input x: [2, 2, 2] f32
%1 = input labels: [2] i32
%2 = parameter fc1_weight: [4, 3] f32
%3 = parameter fc2_weight: [3, 3] f32
%4 = parameter fc3_weight: [3, 2] f32
%5 = flatten: Flatten(%0) { shape: [2, 4] } -> [2, 4] f32
%6 = matmul1: MatMul(%5, %2) { transpose_a: false, transpose_b: false } -> [2, 3] f32
%7 = relu1: ReLU(%6) -> [2, 3] f32
%8 = matmul2: MatMul(%7, %3) { transpose_a: false, transpose_b: false } -> [2, 3] f32
%9 = relu2: ReLU(%8) -> [2, 3] f32
%10 = matmul3: MatMul(%9, %4) { transpose_a: false, transpose_b: false } -> [2, 2] f32
%11 = loss: SparseSoftmaxCrossEntropy(%10, %1) { batch_divisor: 2 } -> [] f32
";
    assert_eq!(model.graph.to_string(), expected);
    Ok(())
}
