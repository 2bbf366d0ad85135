//! One pass of any training graph sharded on a local cluster against the same pass on one device.

use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use exec::RankExecutor;
use graph::{Graph, ValueId};
use parallel::{compile_training, ParallelConfig, Program};
use tensor::Tensor;

/// The loss and every trainable parameter's global gradient after one pass.
pub struct Pass {
    /// The loss (whole, as every rank reports it).
    pub loss: Vec<f64>,
    /// Gradients, in the program's parameter order, assembled from every rank's shard.
    pub grads: Vec<Vec<f64>>,
}

/// Compiles `graph` for training `loss` under `config`.
pub fn compile(graph: &Graph, loss: ValueId, config: &ParallelConfig) -> Program {
    compile_training(graph, loss, config).unwrap_or_else(|e| panic!("compiling: {e}"))
}

/// One forward/backward pass of `program` on a local cluster, feeding every rank its block of
/// the global `inputs` (graph input order); parameters initialised from `seed`.
pub fn run(program: Program, inputs: &[Tensor], seed: u64) -> Pass {
    let program = Arc::new(program);
    let devices = program.devices();
    let results = LocalCluster::new(devices).unwrap().run(|comm| {
        let world: Arc<dyn Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(program.clone(), world).unwrap();
        exec.init_parameters(seed).unwrap();
        for (i, input) in program.inputs.iter().enumerate() {
            let b = exec.box_of(&input.layout).unwrap();
            exec.set_input(i, &inputs[i].extract_box(&b).unwrap())
                .unwrap();
        }
        exec.run().unwrap();
        let loss = exec.output(0).to_f64_vec();
        let grads: Vec<Option<(layout::SliceBox, Tensor)>> = (0..program.params.len())
            .map(|i| {
                exec.grad(i)
                    .map(|g| (exec.box_of(&program.params[i].layout).unwrap(), g.clone()))
            })
            .collect();
        (loss, grads)
    });
    let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    let loss = results[0].0.clone();
    for (rank, r) in results.iter().enumerate() {
        assert_eq!(r.0, loss, "rank {rank} reports another loss");
    }
    let grads = (0..program.params.len())
        .map(|i| {
            let p = &program.params[i];
            let mut g = Tensor::zeros(program.buffers[p.buffer].dtype, p.layout.shape());
            for r in &results {
                if let Some((region, shard)) = &r.1[i] {
                    g.insert_box(region, shard).unwrap();
                }
            }
            g.to_f64_vec()
        })
        .collect();
    Pass { loss, grads }
}

/// Asserts that `graph`'s loss and gradients under `config` equal those on one device.
pub fn assert_matches_one_device(
    graph: &Graph,
    loss: ValueId,
    config: &ParallelConfig,
    inputs: &[Tensor],
    tolerance: f64,
) {
    let one = run(
        compile(graph, loss, &ParallelConfig::stand_alone()),
        inputs,
        5,
    );
    let many = run(compile(graph, loss, config), inputs, 5);
    assert_close(&many.loss, &one.loss, tolerance, "loss");
    for (i, (a, b)) in many.grads.iter().zip(&one.grads).enumerate() {
        assert_close(a, b, tolerance, &format!("gradient {i}"));
    }
}

/// Asserts `a` ≈ `b` elementwise (relative to `1 + |b|`).
pub fn assert_close(a: &[f64], b: &[f64], tolerance: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tolerance * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// A deterministic f64 tensor of `shape` with varied values.
pub fn values(shape: &[usize], salt: usize) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(
        shape,
        (0..n)
            .map(|i| (((i + salt) * 7919 + salt * 31) % 23) as f64 / 11.0 - 1.0)
            .collect(),
    )
    .unwrap()
}
