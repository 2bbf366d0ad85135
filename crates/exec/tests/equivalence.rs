//! Sharded programs compute what one device computes.

use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use exec::RankExecutor;
use graph::models::seed_mlp;
use parallel::{compile_training, ParallelConfig, ParallelMode};
use tensor::Tensor;

/// One forward/backward pass under `config`: the loss and every parameter's global gradient.
fn one_step(config: &ParallelConfig, batch: usize) -> (f32, Vec<Tensor>) {
    let model = seed_mlp(batch, &[8, 8], 64, 10).unwrap();
    let program = Arc::new(compile_training(&model.graph, model.loss, config).unwrap());
    let n: usize = batch * 64;
    let x = Tensor::from_vec(
        &[batch, 8, 8],
        (0..n).map(|i| ((i * 7919) % 17) as f32 / 16.0).collect(),
    )
    .unwrap();
    let labels = Tensor::from_vec(&[batch], (0..batch).map(|i| (i % 10) as i32).collect()).unwrap();
    let devices = program.devices();
    let results = LocalCluster::new(devices).unwrap().run(|comm| {
        let world: Arc<dyn Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(program.clone(), world).unwrap();
        exec.init_parameters(7).unwrap();
        for (i, input) in program.inputs.iter().enumerate() {
            let global = if i == 0 { &x } else { &labels };
            let b = exec.box_of(&input.layout).unwrap();
            exec.set_input(i, &global.extract_box(&b).unwrap()).unwrap();
        }
        exec.run().unwrap();
        let loss = exec.output(0).as_f32().unwrap()[0];
        let grads: Vec<(layout::SliceBox, Tensor)> = (0..program.params.len())
            .map(|i| {
                (
                    exec.box_of(&program.params[i].layout).unwrap(),
                    exec.grad(i).unwrap().clone(),
                )
            })
            .collect();
        (loss, grads)
    });
    let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    let loss = results[0].0;
    for (rank, r) in results.iter().enumerate() {
        assert_eq!(r.0, loss, "rank {rank} reports another loss");
    }
    let grads = (0..program.params.len())
        .map(|i| {
            let shape = program.params[i].layout.shape().to_vec();
            let mut g = Tensor::zeros(tensor::DType::F32, &shape);
            for r in &results {
                g.insert_box(&r.1[i].0, &r.1[i].1).unwrap();
            }
            g
        })
        .collect();
    (loss, grads)
}

fn assert_close(a: &Tensor, b: &Tensor, what: &str) {
    let (a, b) = (a.as_f32().unwrap(), b.as_f32().unwrap());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

#[test]
fn seed_strategies_on_8_devices_match_one_device() {
    let (loss1, grads1) = one_step(&ParallelConfig::stand_alone(), 32);
    let config = ParallelConfig::new(ParallelMode::SemiAuto, 8)
        .shard("matmul1", &[&[2, 4], &[4, 1]])
        .shard("relu1", &[&[4, 1]])
        .shard("matmul2", &[&[1, 8], &[8, 1]])
        .shard("relu2", &[&[8, 1]]);
    let (loss8, grads8) = one_step(&config, 32);
    assert!(
        (loss1 - loss8).abs() <= 1e-5 * loss1.abs(),
        "{loss1} vs {loss8}"
    );
    for (i, (a, b)) in grads8.iter().zip(&grads1).enumerate() {
        assert_close(a, b, &format!("grad {i}"));
    }
}

fn check_against_one_device(config: &ParallelConfig) {
    let (loss1, grads1) = one_step(&ParallelConfig::stand_alone(), 32);
    let (loss_n, grads_n) = one_step(config, 32);
    assert!(
        (loss1 - loss_n).abs() <= 1e-5 * loss1.abs(),
        "{loss1} vs {loss_n}"
    );
    for (i, (a, b)) in grads_n.iter().zip(&grads1).enumerate() {
        assert_close(a, b, &format!("grad {i}"));
    }
}

#[test]
fn more_strategies_match_one_device() {
    let configs = [
        ParallelConfig::new(ParallelMode::DataParallel, 8),
        ParallelConfig::new(ParallelMode::SemiAuto, 4).shard("matmul1", &[&[1, 4], &[4, 1]]),
        ParallelConfig::new(ParallelMode::SemiAuto, 4).shard("matmul2", &[&[1, 1], &[1, 4]]),
        ParallelConfig::new(ParallelMode::SemiAuto, 8).shard_with_out(
            "matmul1",
            &[&[2, 4], &[4, 1]],
            &[&[8, 1]],
        ),
        ParallelConfig::new(ParallelMode::SemiAuto, 8).shard("matmul1", &[&[2, 1], &[1, 1]]),
        ParallelConfig {
            dataset_strategy: parallel::DatasetStrategy::FullBatch,
            ..ParallelConfig::new(ParallelMode::SemiAuto, 2).shard("matmul3", &[&[1, 2], &[2, 1]])
        },
    ];
    for config in &configs {
        check_against_one_device(config);
    }
}

#[test]
fn the_seed_plan_moves_what_mindspore_would_and_less() {
    let model = seed_mlp(32, &[8, 8], 512, 10).unwrap();
    let config = ParallelConfig::new(ParallelMode::SemiAuto, 8)
        .shard("matmul1", &[&[2, 4], &[4, 1]])
        .shard("relu1", &[&[4, 1]])
        .shard("matmul2", &[&[1, 8], &[8, 1]])
        .shard("relu2", &[&[8, 1]]);
    let program = compile_training(&model.graph, model.loss, &config).unwrap();
    let explain = program.explain();
    // matmul2's split reduction dim is summed where relu2 consumes it: one reduce-scatter.
    assert!(
        explain.contains("-> reshard matmul2: reduce-scatter along dim 0 over groups of 8"),
        "{explain}"
    );
    // The gradients of the replicated fc3_weight are summed over all 8 ranks.
    assert!(
        explain.contains("-> reshard matmul3.grad1: all-reduce over groups of 8"),
        "{explain}"
    );
    // The forward sums move less than the all-reduces MindSpore inserts after the two split
    // matmuls (a ring all-reduce of S bytes over n ranks receives 2(n-1)/n·S on each rank):
    // matmul1's [16, 512] f32 slices over groups of 4, matmul2's [32, 512] over groups of 8.
    let ring = |slice_bytes: usize, n: usize, ranks: usize| 2 * (n - 1) * slice_bytes / n * ranks;
    let mindspore_matmul_allreduces = ring(16 * 512 * 4, 4, 8) + ring(32 * 512 * 4, 8, 8);
    let forward_bytes: usize = program
        .steps
        .iter()
        .filter_map(|s| match s {
            parallel::Step::Reshard(r)
                if ["matmul1", "matmul2"]
                    .contains(&program.placed.graph.values()[r.value.0].name.as_str()) =>
            {
                Some(r.plan.bytes_total())
            }
            _ => None,
        })
        .sum();
    assert!(
        forward_bytes < mindspore_matmul_allreduces,
        "{forward_bytes} vs {mindspore_matmul_allreduces}"
    );
}
