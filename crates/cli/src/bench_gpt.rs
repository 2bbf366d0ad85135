//! `tessera bench gpt-step`: training tokens/s of the GPT (4 layers, 4 heads, width 256, 128
//! tokens, batch 16, f32, AdamW) on one rank, and on 2 ranks of the local backend with data
//! parallelism and with model parallelism 2, with a profile of where one rank's step goes.
//!
//! Batches are synthetic token ids (eight, cycled), so no file IO is timed.
//! `scripts/bench-gpt.sh` runs this next to PyTorch (one thread, and DDP on 2 processes).

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use comm::LocalCluster;
use models::{GptConfig, GptParallel};
use parallel::{compile_training, DatasetStrategy, ParallelConfig, ParallelMode};
use runtime::{OptimizerConfig, OptimizerKind};
use tensor::{DType, Tensor};

use crate::bench_train::{lcg, rank_steps, slowest, summary, StepBench};

/// Canonical blocks per summed dim in the deterministic runs (`parallel.deterministic_blocks`'s
/// default).
const DETERMINISTIC_BLOCKS: usize = 16;

/// Arguments of `tessera bench gpt-step`.
#[derive(Debug, Args)]
pub struct GptStepArgs {
    /// Timed steps (after 5 warm-up steps).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Layers of the GPT.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Width of the residual stream.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Print where rank 0's step time goes.
    #[arg(long)]
    profile: bool,
    /// Also time every configuration in deterministic mode (`train.deterministic`, 16 canonical
    /// blocks), right after the ordinary run.
    #[arg(long)]
    deterministic: bool,
    /// With `--deterministic`: time each configuration this many times in each mode, the modes
    /// alternating, and report the median (min–max) of the rounds' throughput ratios.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Also time data parallel 2 with the gradients fused into buckets (`[parallel.comm_fusion]`
    /// auto), then also reduced on a progress thread while the backward pass computes
    /// (`[parallel.overlap]`), right after the plain run.
    #[arg(long)]
    fusion: bool,
    /// Also time every configuration with its gradients clipped by global norm
    /// (`train.max_grad_norm` = 1.0, which binds at every step of the benchmark), the runs
    /// alternating with unclipped ones `--rounds` times; reports the median (min–max) of the
    /// rounds' throughput ratios.
    #[arg(long)]
    clip: bool,
}

/// How a configuration's gradients are reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reduction {
    /// One reduction per gradient, at the end of the backward pass.
    Plain,
    /// `[parallel.comm_fusion]` auto buckets, each run when its last gradient is computed.
    Fused,
    /// `[parallel.comm_fusion]` auto buckets with `grad_computation_allreduce_overlap`.
    FusedOverlapped,
}

/// The benchmark's GPT: byte vocabulary, 4 heads, 128 tokens, batch 16.
fn gpt_config(args: &GptStepArgs) -> GptConfig {
    GptConfig::new(256, args.layers, 4, args.hidden, 128, 16)
}

/// The program under `(data_parallel, model_parallel)` (stand-alone for `(1, 1)`); in
/// deterministic mode with the vocabulary-parallel loss, as training builds it.
fn program(
    gpt: &GptConfig,
    (dp, mp): (usize, usize),
    deterministic: bool,
    reduction: Reduction,
) -> anyhow::Result<Arc<parallel::Program>> {
    let gpt = GptConfig {
        vocab_parallel_loss: deterministic,
        ..gpt.clone()
    };
    let model = models::gpt(&gpt, DType::F32)?;
    let devices = dp * mp;
    let config = if devices == 1 {
        ParallelConfig::stand_alone()
    } else {
        let split = GptParallel::resolve(devices, Some(dp), mp, true, false)?;
        let mut config = ParallelConfig::new(ParallelMode::SemiAuto, devices);
        config.strategies = split.strategies(&model.graph)?;
        config.dataset_strategy = DatasetStrategy::PerInput(split.dataset_strategy());
        if reduction != Reduction::Plain {
            config.comm_fusion = Some(parallel::fusion::CommFusionConfig::default());
        }
        config.overlap.grad_computation_allreduce_overlap = reduction == Reduction::FusedOverlapped;
        config
    };
    Ok(Arc::new(compile_training(
        &model.graph,
        model.loss,
        &config,
    )?))
}

/// Eight batches of pseudo-random token ids: `input_ids` and `labels`, `[batch, seq_len]`.
fn batches(gpt: &GptConfig) -> anyhow::Result<Vec<Vec<Tensor>>> {
    let n = gpt.batch * gpt.seq_len;
    (0..8u64)
        .map(|b| {
            let mut next = lcg(b + 1);
            let mut ids = || -> anyhow::Result<Tensor> {
                let v: Vec<i32> = (0..n).map(|_| (next() % 256) as i32).collect();
                Ok(Tensor::from_vec(&[gpt.batch, gpt.seq_len], v)?)
            };
            Ok(vec![ids()?, ids()?])
        })
        .collect()
}

/// Times one configuration; prints its tokens/s and, when asked, rank 0's profile.
fn measure(
    args: &GptStepArgs,
    gpt: &GptConfig,
    (dp, mp): (usize, usize),
    label: &str,
    (deterministic, reduction): (bool, Reduction),
    clip: bool,
) -> anyhow::Result<f64> {
    let bench = StepBench {
        optimizer: OptimizerConfig {
            kind: OptimizerKind::AdamW {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            learning_rate: 1e-3,
            weight_decay: 0.01,
        },
        warmup: 5,
        steps: args.steps,
        profile: args.profile,
        deterministic: deterministic.then_some(DETERMINISTIC_BLOCKS),
        clip: clip.then(|| runtime::MaxGradNorm::new(1.0)).flatten(),
    };
    let data = batches(gpt)?;
    let prog = program(gpt, (dp, mp), deterministic, reduction)?;
    if deterministic {
        parallel::check_deterministic(&prog, DETERMINISTIC_BLOCKS)?;
    }
    let per_rank = LocalCluster::new(dp * mp)?
        .run(|comm| rank_steps(prog.clone(), Arc::new(comm), &data, &bench))
        .into_iter()
        .collect::<Result<anyhow::Result<Vec<_>>, _>>()??;
    let rank0 = per_rank
        .first()
        .map(|r| (r.optimizer, r.profile.clone(), r.steps.clone()));
    let (median, p10, p90) = summary(slowest(per_rank));
    let tokens = (gpt.batch * gpt.seq_len) as f64;
    let rate = tokens / (median / 1e3);
    println!(
        "tessera, {label}: {rate:.0} tokens/s ({median:.1} ms/step median [p10 {p10:.1} - p90 {p90:.1}])"
    );
    if let Some((optimizer, Some(profile), steps)) = rank0 {
        let total: Duration = steps.iter().sum();
        let per_step = total / steps.len().max(1) as u32;
        print!("{}", profile.table(per_step));
        let runs = profile.runs.max(1) as u32;
        let optimizer = optimizer / runs;
        let other = per_step.saturating_sub(
            profile.kernel_time() / runs + profile.reshards.time / runs + optimizer,
        );
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!("  {:<32} {:>8.3} ms", "optimizer (AdamW)", ms(optimizer));
        println!(
            "  {:<32} {:>8.3} ms",
            "framework (feeding, dispatch)",
            ms(other)
        );
    }
    Ok(rate)
}

/// Runs the benchmark.
pub fn run(args: &GptStepArgs) -> anyhow::Result<()> {
    let gpt = gpt_config(args);
    println!(
        "GPT {} layers, 4 heads, width {}, 128 tokens, batch 16, f32, AdamW; {} timed steps",
        args.layers, args.hidden, args.steps
    );
    let configurations = [
        ((1, 1), "1 rank"),
        ((2, 1), "2 ranks, data parallel"),
        ((1, 2), "2 ranks, model parallel 2"),
    ];
    let mut rates = Vec::new();
    for (split, label) in configurations {
        let rate = measure(args, &gpt, split, label, (false, Reduction::Plain), false)?;
        if args.fusion && split == (2, 1) {
            for (what, reduction) in [
                ("fused", Reduction::Fused),
                ("fused and overlapped", Reduction::FusedOverlapped),
            ] {
                let label = format!("{label}, {what} gradients");
                let fused = measure(args, &gpt, split, &label, (false, reduction), false)?;
                println!("  {what}: {:.2}x the plain throughput", fused / rate);
            }
        }
        if args.deterministic {
            let det_label = format!("{label}, deterministic");
            let mut ratios = Vec::new();
            for round in 0..args.rounds.max(1) {
                let ordinary = if round == 0 {
                    rate
                } else {
                    measure(args, &gpt, split, label, (false, Reduction::Plain), false)?
                };
                let det = measure(
                    args,
                    &gpt,
                    split,
                    &det_label,
                    (true, Reduction::Plain),
                    false,
                )?;
                ratios.push(det / ordinary);
            }
            ratios.sort_by(f64::total_cmp);
            println!(
                "  deterministic mode: {:.2}x the ordinary throughput (median of {} rounds, {:.2}-{:.2})",
                ratios[ratios.len() / 2],
                ratios.len(),
                ratios[0],
                ratios[ratios.len() - 1]
            );
        }
        if args.clip {
            let clip_label = format!("{label}, clipped by global norm");
            let mut ratios = Vec::new();
            for round in 0..args.rounds.max(1) {
                let plain = match round {
                    0 => rate,
                    _ => measure(args, &gpt, split, label, (false, Reduction::Plain), false)?,
                };
                let clipped = measure(
                    args,
                    &gpt,
                    split,
                    &clip_label,
                    (false, Reduction::Plain),
                    true,
                )?;
                ratios.push(clipped / plain);
            }
            ratios.sort_by(f64::total_cmp);
            println!(
                "  clipping by global norm: {:.3}x the unclipped throughput (median of {} rounds, {:.3}-{:.3})",
                ratios[ratios.len() / 2],
                ratios.len(),
                ratios[0],
                ratios[ratios.len() - 1]
            );
        }
        rates.push(rate);
    }
    println!(
        "speed-up on 2 ranks: data parallel {:.2}x, model parallel {:.2}x",
        rates[1] / rates[0],
        rates[2] / rates[0]
    );
    Ok(())
}
