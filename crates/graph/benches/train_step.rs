//! One training step (forward, backward, SGD update) of the seed MLP 784-512-512-10 at batch 32
//! on one thread: the figure to compare with PyTorch's 1.98 ms per step.

use criterion::{criterion_group, criterion_main, Criterion};
use graph::models::seed_mlp;
use graph::{grad, Executor};
use tensor::Tensor;

fn train_step(c: &mut Criterion) {
    let model = seed_mlp(32, &[28, 28], 512, 10).expect("the seed MLP builds");
    let params = model.graph.trainable_parameters();
    let training = grad(&model.graph, model.loss, &params).expect("the seed MLP differentiates");
    let mut exec = Executor::new(&training.graph).expect("the executor builds");
    exec.init_parameters(1).expect("parameters initialise");
    let pixels: Vec<f32> = (0..32 * 784)
        .map(|i| ((i * 7919) % 255) as f32 / 255.0)
        .collect();
    let labels: Vec<i32> = (0..32).map(|i| (i * 7) % 10).collect();
    exec.set_input(
        model.input,
        &Tensor::from_vec(&[32, 28, 28], pixels).unwrap(),
    )
    .unwrap();
    exec.set_input(model.labels, &Tensor::from_vec(&[32], labels).unwrap())
        .unwrap();
    let mut updates: Vec<Vec<f32>> = training
        .grads
        .iter()
        .map(|&(p, _)| vec![0.0; exec.value(p).unwrap().n_elements()])
        .collect();
    let mut group = c.benchmark_group("cpu");
    group.bench_function("mlp_784_512_512_10_b32/forward_backward", |b| {
        b.iter(|| exec.run().unwrap())
    });
    group.bench_function("mlp_784_512_512_10_b32/train_step_sgd", |b| {
        b.iter(|| {
            exec.run().unwrap();
            for (&(param, g), update) in training.grads.iter().zip(&mut updates) {
                update.copy_from_slice(exec.value(g).unwrap().as_f32().unwrap());
                let weights = exec.value_mut(param).unwrap().as_f32_mut().unwrap();
                tensor::kernels::axpy(-0.01, update, weights).unwrap();
            }
        })
    });
    group.finish();
}

criterion_group!(benches, train_step);
criterion_main!(benches);
