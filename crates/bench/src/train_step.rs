//! `tessera bench train-step`: the training step of `seed_mlp` with MNIST-sized layers
//! (784-512-512-10, batch 32, f32, Momentum), on one rank and on N ranks of the local backend.
//!
//! The step is everything a training step does: feed the batch, forward, backward, gradient
//! reshards, and the optimizer update. Inputs are synthetic (eight pseudo-random batches,
//! cycled), so no file IO is timed. `scripts/bench-train-step.sh` runs this next to PyTorch on one thread.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm::{Communicator, LocalCluster};
use exec::{Optimizer, OptimizerConfig, OptimizerKind, ParamSpec, RankExecutor};
use graph::models::seed_mlp;
use parallel::{compile_training, ParallelConfig, ParallelMode, Program};
use tensor::Tensor;

use crate::timing::ms;
use crate::{BenchError, Progress};

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainStepRequest {
    /// Timed steps (after 20 warm-up steps).
    pub steps: usize,
    /// Also time the seed run's semi-auto strategies on this many ranks (0 or 1: skip; other
    /// than 8, data parallel).
    pub devices: usize,
}

/// The seed MLP's training program under `config`.
fn program(config: &ParallelConfig) -> Result<Arc<Program>, BenchError> {
    let model = seed_mlp(32, &[28, 28], 512, 10)?;
    Ok(Arc::new(compile_training(
        &model.graph,
        model.loss,
        config,
    )?))
}

/// How a rank times its training steps.
pub(crate) struct StepBench {
    /// The optimizer every step updates with.
    pub optimizer: OptimizerConfig,
    /// Untimed steps first.
    pub warmup: usize,
    /// Timed steps.
    pub steps: usize,
    /// Record where the time of every timed step goes.
    pub profile: bool,
    /// Deterministic mode's most canonical blocks per summed dim (`None`: off).
    pub deterministic: Option<usize>,
    /// `train.max_grad_norm`: clip every step's gradients by global norm (`None`: off).
    pub clip: Option<runtime::MaxGradNorm>,
}

/// What one rank measured.
pub(crate) struct RankTimes {
    /// Every timed step's wall time.
    pub steps: Vec<Duration>,
    /// The optimizer updates' share of the timed steps.
    pub optimizer: Duration,
    /// Clipping by global norm's share of the timed steps (zero without clipping).
    pub clip: Duration,
    /// Kernel and reshard times of the timed steps, when profiled.
    pub profile: Option<exec::StepProfile>,
}

/// Runs `bench.warmup` untimed and `bench.steps` timed training steps on this rank, feeding its blocks of
/// the global `batches` (one tensor per program input), cycled.
pub(crate) fn rank_steps(
    program: Arc<Program>,
    world: Arc<dyn Communicator>,
    batches: &[Vec<Tensor>],
    bench: &StepBench,
) -> Result<RankTimes, BenchError> {
    let mut stepper = RankStepper::new(program, world, batches, bench)?;
    for step in 0..bench.steps + bench.warmup {
        stepper.step(step)?;
    }
    Ok(stepper.finish())
}

/// One rank's training steps, taken one at a time: its executor, its blocks of the batches, its
/// optimizer, and what the timed steps measured so far.
pub(crate) struct RankStepper<'a> {
    exec: RankExecutor,
    world: Arc<dyn Communicator>,
    blocks: Vec<Vec<Tensor>>,
    trainable: Vec<usize>,
    optimizer: Optimizer,
    bench: &'a StepBench,
    times: RankTimes,
}

impl<'a> RankStepper<'a> {
    /// The executor of `program` on this rank, its parameters initialised, and its blocks of the
    /// global `batches` (one tensor per program input).
    pub(crate) fn new(
        program: Arc<Program>,
        world: Arc<dyn Communicator>,
        batches: &[Vec<Tensor>],
        bench: &'a StepBench,
    ) -> Result<RankStepper<'a>, BenchError> {
        let mut exec = RankExecutor::new(program.clone(), world.clone())?;
        exec.set_deterministic(bench.deterministic);
        exec.init_parameters(1)?;
        let blocks: Vec<Vec<Tensor>> = batches
            .iter()
            .map(|batch| {
                program
                    .inputs
                    .iter()
                    .zip(batch)
                    .map(|(input, global)| Ok(global.extract_box(&exec.box_of(&input.layout)?)?))
                    .collect::<Result<Vec<Tensor>, BenchError>>()
            })
            .collect::<Result<_, BenchError>>()?;
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
        let optimizer = Optimizer::new(bench.optimizer, &specs)?;
        Ok(RankStepper {
            exec,
            world,
            blocks,
            trainable,
            optimizer,
            bench,
            times: RankTimes {
                steps: Vec::with_capacity(bench.steps),
                optimizer: Duration::ZERO,
                clip: Duration::ZERO,
                profile: None,
            },
        })
    }

    /// Training step `step` (the first `bench.warmup` untimed, profiling from the first timed
    /// one when asked): feed, forward, backward, clip when asked, update. Its wall time.
    pub(crate) fn step(&mut self, step: usize) -> Result<Duration, BenchError> {
        let (bench, exec) = (self.bench, &mut self.exec);
        let timed = step >= bench.warmup;
        if step == bench.warmup {
            exec.set_profiling(bench.profile);
        }
        let start = Instant::now();
        for (i, block) in self.blocks[step % self.blocks.len()].iter().enumerate() {
            exec.set_input(i, block)?;
        }
        exec.run()?;
        let update = Instant::now();
        if let Some(clip) = bench.clip {
            std::hint::black_box(clip.clip_gradients(
                exec,
                &self.trainable,
                self.world.as_ref(),
            )?);
            if timed {
                self.times.clip += update.elapsed();
            }
        }
        self.optimizer.begin_step();
        for (k, &i) in self.trainable.iter().enumerate() {
            if let Some((param, grad)) = exec.param_and_grad(i) {
                self.optimizer.update(k, param, grad)?;
            }
        }
        std::hint::black_box(exec.output(0));
        let took = start.elapsed();
        if timed {
            self.times.optimizer += update.elapsed();
            self.times.steps.push(took);
        }
        Ok(took)
    }

    /// What the timed steps measured, with the profile when one was asked for.
    pub(crate) fn finish(mut self) -> RankTimes {
        self.times.profile = self.exec.profile().cloned();
        self.times
    }
}

/// A pseudo-random stream (a 64-bit LCG's high bits), for synthetic batches.
pub(crate) fn lcg(seed: u64) -> impl FnMut() -> u32 {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ seed;
    move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as u32
    }
}

/// Eight different synthetic MLP batches: pseudo-random pixels in [0, 1) and labels, so
/// gradients stay realistic (one batch repeated drives them to subnormal numbers).
fn mlp_batches() -> Result<Vec<Vec<Tensor>>, BenchError> {
    (0..8u64)
        .map(|b| {
            let mut next = lcg(b + 1);
            let x = Tensor::from_vec(
                &[32, 28, 28],
                (0..32 * 784)
                    .map(|_| (next() % 1000) as f32 / 1000.0)
                    .collect(),
            )?;
            let labels = Tensor::from_vec(&[32], (0..32).map(|_| (next() % 10) as i32).collect())?;
            Ok(vec![x, labels])
        })
        .collect()
}

/// The slowest rank's time of every step.
pub(crate) fn slowest(per_rank: Vec<RankTimes>) -> Vec<Duration> {
    let mut out = vec![Duration::ZERO; per_rank.first().map_or(0, |r| r.steps.len())];
    for r in per_rank {
        for (s, t) in out.iter_mut().zip(r.steps) {
            *s = (*s).max(t);
        }
    }
    out
}

/// Step times in milliseconds: the median and the 10th and 90th percentiles.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepMillis {
    /// The median.
    pub median: f64,
    /// The 10th percentile.
    pub p10: f64,
    /// The 90th percentile.
    pub p90: f64,
}

impl StepMillis {
    /// The percentiles of `times` (at least one).
    pub fn of(mut times: Vec<Duration>) -> StepMillis {
        times.sort_unstable();
        StepMillis {
            median: ms(times[times.len() / 2]),
            p10: ms(times[times.len() / 10]),
            p90: ms(times[times.len() * 9 / 10]),
        }
    }
}

/// The report's first line.
struct Header {
    steps: usize,
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed_mlp 784-512-512-10, batch 32, f32, Momentum; {} timed steps\nmachine: {}",
            self.steps,
            crate::machine::describe()
        )
    }
}

/// One rank's step time.
struct OneRank(StepMillis);

impl fmt::Display for OneRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let StepMillis { median, p10, p90 } = self.0;
        writeln!(
            f,
            "tessera, 1 rank:  {median:.3} ms/step median [p10 {p10:.3} - p90 {p90:.3}]"
        )
    }
}

/// The step time on several ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ManyRanks {
    /// Ranks.
    pub devices: usize,
    /// The slowest rank's step times.
    pub times: StepMillis,
}

impl fmt::Display for ManyRanks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let StepMillis { median, p10, p90 } = self.times;
        writeln!(
            f,
            "tessera, {} ranks ({}), local backend: {median:.3} ms/step median [p10 {p10:.3} - p90 {p90:.3}] = {:.0} steps/s",
            self.devices,
            if self.devices == 8 { "the seed run's semi-auto strategies" } else { "data parallel" },
            1e3 / median
        )
    }
}

/// The step times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainStepReport {
    /// Timed steps.
    pub steps: usize,
    /// On one rank.
    pub one_rank: StepMillis,
    /// On the requested ranks, when more than one.
    pub many_ranks: Option<ManyRanks>,
}

impl fmt::Display for TrainStepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Header { steps: self.steps }.fmt(f)?;
        OneRank(self.one_rank).fmt(f)?;
        self.many_ranks.iter().try_for_each(|m| m.fmt(f))
    }
}

/// Runs `tessera bench train-step`.
pub fn train_step(
    request: &TrainStepRequest,
    progress: &mut dyn Progress,
) -> Result<TrainStepReport, BenchError> {
    progress.piece(&Header {
        steps: request.steps,
    });
    let bench = StepBench {
        optimizer: OptimizerConfig {
            kind: OptimizerKind::Momentum {
                momentum: 0.9,
                use_nesterov: false,
            },
            learning_rate: 0.01,
            weight_decay: 0.0,
        },
        warmup: 20,
        steps: request.steps,
        profile: false,
        deterministic: None,
        clip: None,
    };
    let batches = mlp_batches()?;
    crate::go_on(progress)?;
    let one = program(&ParallelConfig::stand_alone())?;
    let times = LocalCluster::new(1)?
        .run(|comm| rank_steps(one.clone(), Arc::new(comm), &batches, &bench))
        .pop()
        .expect("one rank")??;
    let one_rank = StepMillis::of(times.steps);
    progress.piece(&OneRank(one_rank));
    let mut many_ranks = None;
    if request.devices > 1 {
        crate::go_on(progress)?;
        let config = ParallelConfig::new(ParallelMode::SemiAuto, request.devices)
            .shard("matmul1", &[&[2, 4], &[4, 1]])
            .shard("relu1", &[&[4, 1]])
            .shard("matmul2", &[&[1, 8], &[8, 1]])
            .shard("relu2", &[&[8, 1]]);
        let config = if request.devices == 8 {
            config
        } else {
            ParallelConfig::new(ParallelMode::DataParallel, request.devices)
        };
        let prog = program(&config)?;
        let per_rank = LocalCluster::new(request.devices)?
            .run(|comm| rank_steps(prog.clone(), Arc::new(comm), &batches, &bench))
            .into_iter()
            .collect::<Result<Result<Vec<_>, BenchError>, _>>()??;
        let many = ManyRanks {
            devices: request.devices,
            times: StepMillis::of(slowest(per_rank)),
        };
        progress.piece(&many);
        many_ranks = Some(many);
    }
    Ok(TrainStepReport {
        steps: request.steps,
        one_rank,
        many_ranks,
    })
}
