//! `tessera bench train-step`: the training step of `seed_mlp` with MNIST-sized layers
//! (784-512-512-10, batch 32, f32, Momentum), on one rank and on N ranks of the local backend.
//!
//! The step is everything a training step does: feed the batch, forward, backward, gradient
//! reshards, and the optimizer update. Inputs are synthetic (eight pseudo-random batches,
//! cycled), so no file IO is timed. `scripts/bench-train-step.sh` runs this next to PyTorch on one thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use comm::{Communicator, LocalCluster};
use graph::models::seed_mlp;
use parallel::{compile_training, ParallelConfig, ParallelMode, Program};
use runtime::{Optimizer, OptimizerConfig, OptimizerKind, ParamSpec, RankExecutor};
use tensor::Tensor;

/// Arguments of `tessera bench train-step`.
#[derive(Debug, Args)]
pub struct TrainStepArgs {
    /// Timed steps (after 20 warm-up steps).
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Also time the seed run's semi-auto strategies on this many ranks (0: skip).
    #[arg(long, default_value_t = 8)]
    devices: usize,
}

/// The seed MLP's training program under `config`.
fn program(config: &ParallelConfig) -> anyhow::Result<Arc<Program>> {
    let model = seed_mlp(32, &[28, 28], 512, 10)?;
    Ok(Arc::new(compile_training(
        &model.graph,
        model.loss,
        config,
    )?))
}

/// Runs `steps` training steps on this rank; returns every step's time.
fn rank_steps(
    program: Arc<Program>,
    world: Arc<dyn Communicator>,
    steps: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut exec = RankExecutor::new(program.clone(), world)?;
    exec.init_parameters(1)?;
    // Eight different synthetic batches, cycled: pseudo-random pixels in [0, 1) and labels, so
    // gradients stay realistic (one batch repeated drives them to subnormal numbers).
    let batches: Vec<Vec<Tensor>> = (0..8u64)
        .map(|b| -> anyhow::Result<Vec<Tensor>> {
            let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (b + 1);
            let mut next = move || {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (state >> 33) as u32
            };
            let x = Tensor::from_vec(
                &[32, 28, 28],
                (0..32 * 784)
                    .map(|_| (next() % 1000) as f32 / 1000.0)
                    .collect(),
            )?;
            let labels = Tensor::from_vec(&[32], (0..32).map(|_| (next() % 10) as i32).collect())?;
            program
                .inputs
                .iter()
                .enumerate()
                .map(|(i, input)| {
                    let global = if i == 0 { &x } else { &labels };
                    Ok(global.extract_box(&exec.box_of(&input.layout)?)?)
                })
                .collect()
        })
        .collect::<anyhow::Result<_>>()?;
    let trainable: Vec<usize> = (0..program.params.len())
        .filter(|&i| program.params[i].grad_buffer.is_some())
        .collect();
    let specs: Vec<ParamSpec> = trainable
        .iter()
        .map(|&i| ParamSpec {
            name: program.params[i].name.clone(),
            shape: exec.param(i).shape().to_vec(),
            dtype: exec.param(i).dtype(),
        })
        .collect();
    let mut optimizer = Optimizer::new(
        OptimizerConfig {
            kind: OptimizerKind::Momentum {
                momentum: 0.9,
                use_nesterov: false,
            },
            learning_rate: 0.01,
            weight_decay: 0.0,
        },
        &specs,
    )?;
    let mut times = Vec::with_capacity(steps);
    for step in 0..steps + 20 {
        let start = Instant::now();
        for (i, block) in batches[step % batches.len()].iter().enumerate() {
            exec.set_input(i, block)?;
        }
        exec.run()?;
        optimizer.begin_step();
        for (k, &i) in trainable.iter().enumerate() {
            if let Some((param, grad)) = exec.param_and_grad(i) {
                optimizer.update(k, param, grad)?;
            }
        }
        std::hint::black_box(exec.output(0));
        if step >= 20 {
            times.push(start.elapsed());
        }
    }
    Ok(times)
}

fn summary(mut times: Vec<Duration>) -> (f64, f64, f64) {
    times.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (
        ms(times[times.len() / 2]),
        ms(times[times.len() / 10]),
        ms(times[times.len() * 9 / 10]),
    )
}

/// Runs the benchmark.
pub fn run(args: &TrainStepArgs) -> anyhow::Result<()> {
    println!(
        "seed_mlp 784-512-512-10, batch 32, f32, Momentum; {} timed steps",
        args.steps
    );
    let one = program(&ParallelConfig::stand_alone())?;
    let times = LocalCluster::new(1)?
        .run(|comm| rank_steps(one.clone(), Arc::new(comm), args.steps))
        .pop()
        .expect("one rank")??;
    let (median, p10, p90) = summary(times);
    println!("tessera, 1 rank:  {median:.3} ms/step median [p10 {p10:.3} - p90 {p90:.3}]");
    if args.devices > 1 {
        let config = ParallelConfig::new(ParallelMode::SemiAuto, args.devices)
            .shard("matmul1", &[&[2, 4], &[4, 1]])
            .shard("relu1", &[&[4, 1]])
            .shard("matmul2", &[&[1, 8], &[8, 1]])
            .shard("relu2", &[&[8, 1]]);
        let config = if args.devices == 8 {
            config
        } else {
            ParallelConfig::new(ParallelMode::DataParallel, args.devices)
        };
        let prog = program(&config)?;
        let per_rank = LocalCluster::new(args.devices)?
            .run(|comm| rank_steps(prog.clone(), Arc::new(comm), args.steps));
        let mut slowest = vec![Duration::ZERO; args.steps];
        for r in per_rank {
            for (s, t) in slowest.iter_mut().zip(r??) {
                *s = (*s).max(t);
            }
        }
        let (median, p10, p90) = summary(slowest);
        println!(
            "tessera, {} ranks ({}), local backend: {median:.3} ms/step median [p10 {p10:.3} - p90 {p90:.3}] = {:.0} steps/s",
            args.devices,
            if args.devices == 8 { "the seed run's semi-auto strategies" } else { "data parallel" },
            1e3 / median
        );
    }
    Ok(())
}
