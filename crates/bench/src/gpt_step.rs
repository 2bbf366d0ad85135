//! `tessera bench gpt-step`: training tokens/s of the GPT (4 layers, 4 heads, width 256, 128
//! tokens, batch 16, f32, AdamW) on one rank, and on 2 ranks of the local backend with data
//! parallelism and with model parallelism 2, with a profile of where one rank's step goes.
//!
//! Batches are synthetic token ids (eight, cycled), so no file IO is timed.
//! `scripts/bench-gpt.sh` runs this next to PyTorch (one thread, and DDP on 2 processes).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use comm::{Communicator, LocalCluster};
use exec::{OptimizerConfig, OptimizerKind};
use models::{ContextParallelAlgo, GptConfig, GptParallel, GptParallelKeys};
use parallel::{compile_training, DatasetStrategy, ParallelConfig, ParallelMode};
use tensor::{DType, Tensor};

use crate::mfu::ShapeRate;
use crate::timing::ms;
use crate::train_step::{lcg, rank_steps, slowest, RankStepper, RankTimes, StepBench, StepMillis};
use crate::{BenchError, Pieces, Progress};

/// Canonical blocks per summed dim in the deterministic runs (`parallel.deterministic_blocks`'s
/// default).
const DETERMINISTIC_BLOCKS: usize = 16;

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptStepRequest {
    /// Timed steps (after 5 warm-up steps).
    pub steps: usize,
    /// Layers of the GPT.
    pub layers: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Report where rank 0's step time goes (with `deterministic`, in that mode too).
    pub profile: bool,
    /// Also time every configuration in deterministic mode (`train.deterministic`, 16 canonical
    /// blocks), its steps interleaved with ordinary ones.
    pub deterministic: bool,
    /// Sessions of every comparison (the 2-rank speed-ups, and with `deterministic`, `clip`,
    /// `threads` or `context_parallel_seq` each mode against its baseline): the configurations
    /// compared take their steps interleaved, one step each in turn, and the median (min–max)
    /// of every timed step's throughput ratio is reported.
    pub rounds: usize,
    /// Also time data parallel 2 with the gradients fused into buckets (`[parallel.comm_fusion]`
    /// auto), then also reduced on a progress thread while the backward pass computes
    /// (`[parallel.overlap]`), right after the plain run.
    pub fusion: bool,
    /// Also time every configuration with its gradients clipped by global norm
    /// (`train.max_grad_norm` = 1.0, which binds at every step of the benchmark), against
    /// unclipped steps interleaved with them.
    pub clip: bool,
    /// Above 1: also time 1 rank with its large products on this many threads
    /// (`train.threads_per_rank`), against 1-thread steps interleaved with them.
    pub threads: usize,
    /// Also time context parallel 2 (ring and Ulysses, fused attention) against 1 rank (fused
    /// attention) on this many tokens per sequence, the batch cut to keep 2,048 tokens per step,
    /// the three interleaved step by step in `rounds` sessions (`None`: skip).
    pub context_parallel_seq: Option<usize>,
    /// Also time model parallel 2 with sequence parallel (`parallel.use_seq_parallel`), right
    /// after the plain run (with `fusion`, then with its gradients' sums fused into buckets:
    /// the LayerNorms' and biases' over the model-parallel group).
    pub sequence_parallel: bool,
    /// Time 1 rank only (with its variants and the utilisation line): no 2-rank configuration
    /// and no speed-up rounds, for runs paired against another engine's single thread.
    pub one_rank: bool,
}

/// How a timed configuration splits the GPT: data, model and context parallel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Split {
    dp: usize,
    mp: usize,
    cp: usize,
    algo: ContextParallelAlgo,
    /// `parallel.use_seq_parallel`.
    seq_parallel: bool,
}

impl Split {
    /// Data × model parallel, no context parallel.
    const fn dp_mp(dp: usize, mp: usize) -> Split {
        Split {
            dp,
            mp,
            cp: 1,
            algo: ContextParallelAlgo::Ulysses,
            seq_parallel: false,
        }
    }

    fn devices(self) -> usize {
        self.dp * self.mp * self.cp
    }
}

/// How a configuration is timed: plain, or a variant timed against the plain run in
/// [`Bench::variant_ratios`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Variant {
    /// Deterministic mode.
    deterministic: bool,
    /// Clipped by global norm.
    clip: bool,
    /// Threads per rank.
    threads: usize,
}

impl Variant {
    /// Ordinary mode, unclipped, one thread.
    const PLAIN: Variant = Variant {
        deterministic: false,
        clip: false,
        threads: 1,
    };
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

/// Where rank 0's step goes.
#[derive(Debug, Clone, PartialEq)]
pub struct StepBreakdown {
    /// The per-op table of [`exec::StepProfile::table`] for the mean step.
    pub table: String,
    /// The optimizer's share of the mean step.
    pub optimizer: Duration,
    /// What kernels, reshards and the optimizer leave of the mean step.
    pub framework: Duration,
}

/// One timed configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct GptRun {
    /// What ran (`2 ranks, data parallel, deterministic`).
    pub label: String,
    /// Tokens per second at the median step.
    pub tokens_per_s: f64,
    /// The slowest rank's step times.
    pub times: StepMillis,
    /// Rank 0's breakdown, when profiled.
    pub breakdown: Option<StepBreakdown>,
    /// With clipping: rank 0's time in it per step, timed directly around the clip call.
    pub clip_per_step: Option<Duration>,
}

/// Throughput ratios of configurations interleaved step by step, one per timed step, sorted.
#[derive(Debug, Clone, PartialEq)]
pub struct Ratios(pub Vec<f64>);

impl Ratios {
    /// `  {what}: 1.02x {of} (median of 40 interleaved steps, 0.99-1.04)`, with `digits`
    /// decimals.
    fn line(
        &self,
        f: &mut fmt::Formatter<'_>,
        (what, of): (&str, &str),
        digits: usize,
    ) -> fmt::Result {
        let r = &self.0;
        writeln!(
            f,
            "  {what}: {:.digits$}x {of} (median of {} interleaved steps, {:.digits$}-{:.digits$})",
            r[r.len() / 2],
            r.len(),
            r[0],
            r[r.len() - 1]
        )
    }
}

/// A piece of the report, in the order it is measured.
#[derive(Debug, Clone, PartialEq)]
pub enum GptStepLine {
    /// What is measured.
    Header {
        /// Layers.
        layers: usize,
        /// Width.
        hidden: usize,
        /// Timed steps.
        steps: usize,
    },
    /// A timed configuration.
    Run(GptRun),
    /// Fused (and overlapped) gradients' throughput over the plain one's.
    Fusion {
        /// `fused`, `fused and overlapped`.
        what: &'static str,
        /// The ratio.
        ratio: f64,
    },
    /// Deterministic mode's throughput over the ordinary one's, per interleaved step.
    Deterministic(Ratios),
    /// Clipped throughput over unclipped, per interleaved step.
    Clipped(Ratios),
    /// 1 rank on `threads` threads over 1 thread, per interleaved step.
    Threaded {
        /// Threads per rank.
        threads: usize,
        /// The ratios.
        ratios: Ratios,
    },
    /// Context parallel 2's throughput over 1 rank's at `seq` tokens, per interleaved step
    /// ([`interleaved_steps`]): ring, Ulysses.
    ContextParallel {
        /// Tokens per sequence.
        seq: usize,
        /// Ring attention.
        ring: Ratios,
        /// Ulysses.
        ulysses: Ratios,
    },
    /// One rank's model FLOP utilisation: the model's FLOPs at its median step over the best
    /// single-thread product rate on the GPT's product shapes, measured right after it.
    Utilisation {
        /// Model GFLOP per step ([`crate::mfu::model_flops_per_step`]).
        model_gflop: f64,
        /// Model GFLOP/s achieved at the median step.
        achieved: f64,
        /// The product rate on each shape, GFLOP/s.
        shapes: Vec<crate::mfu::ShapeRate>,
    },
    /// Throughput on 2 ranks over 1 rank's, per interleaved step: data parallel, model parallel.
    SpeedUp {
        /// Data parallel 2.
        data_parallel: Ratios,
        /// Model parallel 2.
        model_parallel: Ratios,
    },
}

impl fmt::Display for GptStepLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GptStepLine::Header {
                layers,
                hidden,
                steps,
            } => writeln!(
                f,
                "GPT {layers} layers, 4 heads, width {hidden}, 128 tokens, batch 16, f32, AdamW; {steps} timed steps\nmachine: {}",
                crate::machine::describe()
            ),
            GptStepLine::Run(run) => {
                let StepMillis { median, p10, p90 } = run.times;
                writeln!(
                    f,
                    "tessera, {}: {:.0} tokens/s ({median:.1} ms/step median [p10 {p10:.1} - p90 {p90:.1}])",
                    run.label, run.tokens_per_s
                )?;
                if let Some(clip) = run.clip_per_step {
                    writeln!(
                        f,
                        "  clipping by global norm, timed inside the step: {:.3} ms/step, {:.2} % of the median step (rank 0)",
                        ms(clip),
                        100.0 * ms(clip) / median
                    )?;
                }
                if let Some(b) = &run.breakdown {
                    f.write_str(&b.table)?;
                    writeln!(f, "  {:<32} {:>8.3} ms", "optimizer (AdamW)", ms(b.optimizer))?;
                    writeln!(
                        f,
                        "  {:<32} {:>8.3} ms",
                        "framework (feeding, dispatch)",
                        ms(b.framework)
                    )?;
                }
                Ok(())
            }
            GptStepLine::Fusion { what, ratio } => {
                writeln!(f, "  {what}: {ratio:.2}x the plain throughput")
            }
            GptStepLine::Deterministic(ratios) => ratios.line(
                f,
                ("deterministic mode", "the ordinary throughput"),
                2,
            ),
            GptStepLine::Clipped(ratios) => ratios.line(
                f,
                ("clipping by global norm", "the unclipped throughput"),
                3,
            ),
            GptStepLine::Threaded { threads, ratios } => ratios.line(
                f,
                (&format!("1 rank on {threads} threads"), "1 thread"),
                2,
            ),
            GptStepLine::ContextParallel { seq, ring, ulysses } => {
                ring.line(
                    f,
                    (&format!("context parallel 2 (ring) at {seq} tokens"), "1 rank"),
                    2,
                )?;
                ulysses.line(
                    f,
                    (&format!("context parallel 2 (Ulysses) at {seq} tokens"), "1 rank"),
                    2,
                )
            }
            GptStepLine::Utilisation {
                model_gflop,
                achieved,
                shapes,
            } => {
                let peak = shapes.iter().map(|r| r.gflops).fold(0.0, f64::max);
                let each: Vec<String> = shapes
                    .iter()
                    .map(|r| format!("{}x{}x{} {:.1}", r.mkn.0, r.mkn.1, r.mkn.2, r.gflops))
                    .collect();
                writeln!(
                    f,
                    "model FLOP utilisation, 1 rank: {achieved:.1} GFLOP/s ({model_gflop:.2} GFLOP/step) = {:.1} % of the single-thread product peak {peak:.1} GFLOP/s (m x k x n GFLOP/s: {})",
                    100.0 * achieved / peak.max(f64::MIN_POSITIVE),
                    each.join(", ")
                )
            }
            GptStepLine::SpeedUp {
                data_parallel,
                model_parallel,
            } => {
                let (dp, mp) = (&data_parallel.0, &model_parallel.0);
                writeln!(
                    f,
                    "speed-up on 2 ranks: data parallel {:.2}x, model parallel {:.2}x",
                    dp[dp.len() / 2],
                    mp[mp.len() / 2]
                )?;
                if dp.len() > 1 {
                    data_parallel.line(f, ("data parallel 2", "1 rank"), 2)?;
                    model_parallel.line(f, ("model parallel 2", "1 rank"), 2)?;
                }
                Ok(())
            }
        }
    }
}

/// Every piece of the report, in order.
pub type GptStepReport = Pieces<GptStepLine>;

/// The benchmark's GPT: byte vocabulary, 4 heads, 128 tokens, batch 16.
pub(crate) fn gpt_config(request: &GptStepRequest) -> GptConfig {
    GptConfig::new(256, request.layers, 4, request.hidden, 128, 16)
}

/// The program under `split` (stand-alone on one device); in deterministic mode with the
/// vocabulary-parallel loss, as training builds it, and checked for the canonical blocks.
fn program(
    gpt: &GptConfig,
    split: Split,
    deterministic: bool,
    reduction: Reduction,
) -> Result<Arc<parallel::Program>, BenchError> {
    let gpt = GptConfig {
        vocab_parallel_loss: deterministic,
        // The ring runs FlashAttention on the split sequence, as training builds it.
        packed_attention: split.algo.keeps_the_sequence_whole(split.cp),
        ..gpt.clone()
    };
    let model = models::gpt(&gpt, DType::F32)?;
    let devices = split.devices();
    let config = if devices == 1 {
        ParallelConfig::stand_alone()
    } else {
        let keys = GptParallelKeys {
            data_parallel: Some(split.dp),
            model_parallel: split.mp,
            context_parallel: split.cp,
            context_parallel_algo: split.algo,
            use_seq_parallel: split.seq_parallel,
            ..GptParallelKeys::default()
        };
        let split = GptParallel::resolve(devices, &keys)?;
        split.check(&gpt)?;
        let mut config = ParallelConfig::new(ParallelMode::SemiAuto, devices);
        config.strategies = split.strategies(&model.graph)?;
        config.dataset_strategy = DatasetStrategy::PerInput(split.dataset_strategy());
        if reduction != Reduction::Plain {
            config.comm_fusion = Some(parallel::fusion::CommFusionConfig::default());
        }
        config.overlap.grad_computation_allreduce_overlap = reduction == Reduction::FusedOverlapped;
        config
    };
    let program = compile_training(&model.graph, model.loss, &config)?;
    if deterministic {
        parallel::check_deterministic(&program, DETERMINISTIC_BLOCKS)?;
    }
    Ok(Arc::new(program))
}

/// The program of one rank, stand-alone (what `--one-rank` times).
pub(crate) fn one_rank_program(gpt: &GptConfig) -> Result<Arc<parallel::Program>, BenchError> {
    program(gpt, Split::dp_mp(1, 1), false, Reduction::Plain)
}

/// The benchmark's optimizer: AdamW, learning rate 1e-3, weight decay 0.01.
pub(crate) fn adamw() -> OptimizerConfig {
    OptimizerConfig {
        kind: OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        learning_rate: 1e-3,
        weight_decay: 0.01,
    }
}

/// Eight batches of pseudo-random token ids: `input_ids` and `labels`, `[batch, seq_len]`.
pub(crate) fn batches(gpt: &GptConfig) -> Result<Vec<Vec<Tensor>>, BenchError> {
    let n = gpt.batch * gpt.seq_len;
    (0..8u64)
        .map(|b| {
            let mut next = lcg(b + 1);
            let mut ids = || -> Result<Tensor, BenchError> {
                let v: Vec<i32> = (0..n).map(|_| (next() % 256) as i32).collect();
                Ok(Tensor::from_vec(&[gpt.batch, gpt.seq_len], v)?)
            };
            Ok(vec![ids()?, ids()?])
        })
        .collect()
}

/// A running `gpt-step`: the request, the GPT and the report so far.
struct Bench<'a> {
    request: &'a GptStepRequest,
    gpt: GptConfig,
    progress: &'a mut dyn Progress,
    report: GptStepReport,
}

impl Bench<'_> {
    /// Shows `line` and adds it to the report; [`BenchError::Stopped`] when the caller then
    /// asks the benchmark to stop.
    fn push(&mut self, line: GptStepLine) -> Result<(), BenchError> {
        self.report.show(self.progress, line)
    }

    /// How every rank times its steps: AdamW, 5 warm-up steps, `--steps` timed ones.
    fn step_bench(&self, deterministic: bool, clip: bool) -> StepBench {
        StepBench {
            optimizer: adamw(),
            warmup: 5,
            steps: self.request.steps,
            profile: self.request.profile,
            deterministic: deterministic.then_some(DETERMINISTIC_BLOCKS),
            clip: clip.then(|| runtime::MaxGradNorm::new(1.0)).flatten(),
        }
    }

    /// Times one configuration and reports it; its tokens/s.
    fn measure(
        &mut self,
        split: Split,
        label: &str,
        (deterministic, reduction): (bool, Reduction),
        (clip, threads): (bool, usize),
    ) -> Result<f64, BenchError> {
        crate::go_on(self.progress)?;
        let bench = self.step_bench(deterministic, clip);
        let data = batches(&self.gpt)?;
        let prog = program(&self.gpt, split, deterministic, reduction)?;
        let per_rank = with_threads(threads, || {
            LocalCluster::new(split.devices())?
                .run(|comm| rank_steps(prog.clone(), Arc::new(comm), &data, &bench))
                .into_iter()
                .collect::<Result<Result<Vec<_>, BenchError>, _>>()
                .map_err(BenchError::from)
        })??;
        let clip_per_step = match (clip, per_rank.first()) {
            (true, Some(r)) => Some(r.clip / r.steps.len().max(1) as u32),
            _ => None,
        };
        let rank0 = per_rank
            .first()
            .map(|r| (r.optimizer, r.profile.clone(), r.steps.clone()));
        let times = StepMillis::of(slowest(per_rank));
        let tokens = (self.gpt.batch * self.gpt.seq_len) as f64;
        let rate = tokens / (times.median / 1e3);
        let breakdown = match rank0 {
            Some((optimizer, Some(profile), steps)) => {
                let total: Duration = steps.iter().sum();
                let per_step = total / steps.len().max(1) as u32;
                let runs = profile.runs.max(1) as u32;
                let optimizer = optimizer / runs;
                let framework = per_step.saturating_sub(
                    profile.kernel_time() / runs + profile.reshards.time / runs + optimizer,
                );
                Some(StepBreakdown {
                    table: profile.table(per_step),
                    optimizer,
                    framework,
                })
            }
            _ => None,
        };
        self.push(GptStepLine::Run(GptRun {
            label: label.to_string(),
            tokens_per_s: rate,
            times,
            breakdown,
            clip_per_step,
        }))?;
        Ok(rate)
    }

    /// Times `split` plain against `split` as `variant` (deterministic, clipped or threaded),
    /// interleaved step by step ([`Bench::interleaved`]); the variant's throughput over the
    /// plain one's at every step, sorted.
    fn variant_ratios(
        &mut self,
        split: Split,
        (label, variant_label): (&str, &str),
        variant: Variant,
    ) -> Result<Ratios, BenchError> {
        let [ratios] = self.interleaved(&[
            (split, Variant::PLAIN, label.to_string()),
            (split, variant, variant_label.to_string()),
        ])?;
        Ok(ratios)
    }

    /// Times `configurations` (split, variant, label) interleaved step by step
    /// ([`interleaved_steps`]) in `--rounds` sessions of `--steps` timed steps each, and reports
    /// each session's step times per configuration; for every configuration after the first,
    /// its throughput over the first's at every step, sorted.
    fn interleaved<const N: usize, const M: usize>(
        &mut self,
        configurations: &[(Split, Variant, String); N],
    ) -> Result<[Ratios; M], BenchError> {
        const { assert!(M + 1 == N, "one ratio per configuration after the first") };
        let data = batches(&self.gpt)?;
        let mut sessions = Vec::with_capacity(N);
        for &(split, variant, _) in configurations {
            let program = program(&self.gpt, split, variant.deterministic, Reduction::Plain)?;
            sessions.push(Session {
                devices: split.devices(),
                program,
                bench: StepBench {
                    profile: false,
                    ..self.step_bench(variant.deterministic, variant.clip)
                },
                threads: variant.threads,
            });
        }
        let tokens = (self.gpt.batch * self.gpt.seq_len) as f64;
        let mut ratios: [Vec<f64>; M] = std::array::from_fn(|_| Vec::new());
        for _ in 0..self.request.rounds.max(1) {
            crate::go_on(self.progress)?;
            let times = interleaved_steps(&sessions, &data)?;
            for ((_, _, label), steps) in configurations.iter().zip(&times) {
                let times = StepMillis::of(steps.clone());
                self.push(GptStepLine::Run(GptRun {
                    label: format!("{label}, steps interleaved"),
                    tokens_per_s: tokens / (times.median / 1e3),
                    times,
                    breakdown: None,
                    clip_per_step: None,
                }))?;
            }
            for (r, steps) in ratios.iter_mut().zip(&times[1..]) {
                // Equal tokens per step: the throughput ratio is the inverse of the times'.
                r.extend(
                    times[0]
                        .iter()
                        .zip(steps)
                        .map(|(first, other)| first.as_secs_f64() / other.as_secs_f64()),
                );
            }
        }
        Ok(ratios.map(|mut r| {
            r.sort_by(f64::total_cmp);
            Ratios(r)
        }))
    }
}

impl Bench<'_> {
    /// Pushes one rank's model FLOP utilisation at `rate` tokens/s over the product peak: per
    /// shape the faster of `before` (timed before the step) and a timing now.
    fn utilisation(&mut self, rate: f64, before: Vec<ShapeRate>) -> Result<(), BenchError> {
        let model = models::gpt(&self.gpt, DType::F32)?;
        let parameters = crate::mfu::trainable_parameters(&model.graph);
        let flops = crate::mfu::model_flops_per_step(&self.gpt, parameters);
        let tokens = (self.gpt.batch * self.gpt.seq_len) as f64;
        let after = crate::mfu::product_rates(&crate::mfu::gpt_product_shapes(&self.gpt))?;
        let shapes = crate::mfu::faster_of(before, after);
        self.push(GptStepLine::Utilisation {
            model_gflop: flops / 1e9,
            achieved: flops / 1e9 * rate / tokens,
            shapes,
        })?;
        Ok(())
    }
}

/// Runs `tessera bench gpt-step`.
pub fn gpt_step(
    request: &GptStepRequest,
    progress: &mut dyn Progress,
) -> Result<GptStepReport, BenchError> {
    let gpt = gpt_config(request);
    // The widths and depths come from flags: bounded before any product or model is allocated.
    gpt.validate()?;
    let mut bench = Bench {
        request,
        gpt,
        progress,
        report: Pieces::default(),
    };
    bench.push(GptStepLine::Header {
        layers: request.layers,
        hidden: request.hidden,
        steps: request.steps,
    })?;
    let configurations = [
        (Split::dp_mp(1, 1), "1 rank"),
        (Split::dp_mp(2, 1), "2 ranks, data parallel"),
        (Split::dp_mp(1, 2), "2 ranks, model parallel 2"),
    ];
    let timed = if request.one_rank {
        1
    } else {
        configurations.len()
    };
    // The product peak, timed before the 1-rank step as well as after it (`Bench::utilisation`).
    let mut peak_before = crate::mfu::product_rates(&crate::mfu::gpt_product_shapes(&bench.gpt))?;
    for &(split, label) in &configurations[..timed] {
        let rate = bench.measure(split, label, (false, Reduction::Plain), (false, 1))?;
        if request.fusion && split == Split::dp_mp(2, 1) {
            for (what, reduction) in [
                ("fused", Reduction::Fused),
                ("fused and overlapped", Reduction::FusedOverlapped),
            ] {
                let label = format!("{label}, {what} gradients");
                let fused = bench.measure(split, &label, (false, reduction), (false, 1))?;
                bench.push(GptStepLine::Fusion {
                    what,
                    ratio: fused / rate,
                })?;
            }
        }
        if request.deterministic {
            let det_label = format!("{label}, deterministic");
            let det = Variant {
                deterministic: true,
                ..Variant::PLAIN
            };
            if request.profile {
                bench.measure(split, &det_label, (true, Reduction::Plain), (false, 1))?;
            }
            let ratios = bench.variant_ratios(split, (label, &det_label), det)?;
            bench.push(GptStepLine::Deterministic(ratios))?;
        }
        if request.clip {
            let clip_label = format!("{label}, clipped by global norm");
            let clip = Variant {
                clip: true,
                ..Variant::PLAIN
            };
            let ratios = bench.variant_ratios(split, (label, &clip_label), clip)?;
            bench.push(GptStepLine::Clipped(ratios))?;
        }
        if request.threads > 1 && split == Split::dp_mp(1, 1) {
            let threads = request.threads;
            let threaded = Variant {
                threads,
                ..Variant::PLAIN
            };
            let thread_label = format!("{label} on {threads} threads");
            let ratios = bench.variant_ratios(split, (label, &thread_label), threaded)?;
            bench.push(GptStepLine::Threaded { threads, ratios })?;
        }
        if split == Split::dp_mp(1, 1) {
            bench.utilisation(rate, std::mem::take(&mut peak_before))?;
        }
        if request.sequence_parallel && split == Split::dp_mp(1, 2) {
            let sp = Split {
                seq_parallel: true,
                ..split
            };
            let label = format!("{label}, sequence parallel");
            bench.measure(sp, &label, (false, Reduction::Plain), (false, 1))?;
            if request.fusion {
                let label = format!("{label}, fused gradients");
                bench.measure(sp, &label, (false, Reduction::Fused), (false, 1))?;
            }
        }
    }
    if !request.one_rank {
        let plain = configurations.map(|(split, label)| (split, Variant::PLAIN, label.to_string()));
        let [data_parallel, model_parallel] = bench.interleaved(&plain)?;
        bench.push(GptStepLine::SpeedUp {
            data_parallel,
            model_parallel,
        })?;
    }
    if let Some(seq) = request.context_parallel_seq {
        context_parallel(&mut bench, seq)?;
    }
    Ok(bench.report)
}

/// Times 1 rank, then context parallel 2 by ring and by Ulysses, on `seq`-token sequences
/// (fused attention; the batch keeps 2,048 tokens per step).
fn context_parallel(bench: &mut Bench<'_>, seq: usize) -> Result<(), BenchError> {
    let batch = (2048 / seq).max(1);
    bench.gpt = GptConfig {
        fused_attention: true,
        ..GptConfig::new(
            256,
            bench.request.layers,
            4,
            bench.request.hidden,
            seq,
            batch,
        )
    };
    let one = (
        Split::dp_mp(1, 1),
        format!("1 rank, {seq} tokens × batch {batch}, fused attention"),
    );
    let forms = [
        (ContextParallelAlgo::Ring, "ring"),
        (ContextParallelAlgo::Ulysses, "Ulysses"),
    ]
    .map(|(algo, name)| {
        let split = Split {
            dp: 1,
            mp: 1,
            cp: 2,
            algo,
            seq_parallel: false,
        };
        (
            split,
            format!("2 ranks, context parallel 2 ({name}), {seq} tokens"),
        )
    });
    let [ring_form, ulysses_form] = forms;
    let [ring, ulysses] = bench.interleaved(
        &[one, ring_form, ulysses_form].map(|(split, label)| (split, Variant::PLAIN, label)),
    )?;
    bench.push(GptStepLine::ContextParallel { seq, ring, ulysses })?;
    Ok(())
}

/// Runs `f` with every product of this process allowed `threads` threads, then back to 1.
fn with_threads<R>(threads: usize, f: impl FnOnce() -> R) -> R {
    tensor::kernels::threads::set_threads(threads);
    let result = f();
    tensor::kernels::threads::set_threads(1);
    result
}

/// A program timed in an interleaved session: on how many ranks, how its steps are timed
/// (deterministic mode, clipping), and on how many threads per rank.
struct Session {
    devices: usize,
    program: Arc<parallel::Program>,
    bench: StepBench,
    threads: usize,
}

/// Times several programs step by step in one session of the local backend: at every step each
/// takes one training step, in order, and in reverse order every other step, the ranks meeting
/// at a barrier before each. A program on one rank runs on rank 0 (its own communicator) while
/// the others sleep in the barrier; any other runs on every rank. A drift of the machine's
/// speed, which on a shared VM moves a configuration timed alone for a few seconds by up to
/// 1.5×, thus reaches every program alike, to within a step. The sessions share their warm-up
/// and timed step counts (the first's); returns each program's slowest-rank time of every timed
/// step.
fn interleaved_steps(
    sessions: &[Session],
    data: &[Vec<Tensor>],
) -> Result<Vec<Vec<Duration>>, BenchError> {
    let devices = sessions.iter().map(|s| s.devices).max().unwrap_or(1);
    assert!(
        sessions
            .iter()
            .all(|s| s.devices == 1 || s.devices == devices),
        "an interleaved program runs on one rank or on all of them"
    );
    let (warmup, steps) = sessions
        .first()
        .map_or((0, 0), |s| (s.bench.warmup, s.bench.steps));
    let per_rank = LocalCluster::new(devices)?
        .run(|comm| -> Result<Vec<Option<RankTimes>>, BenchError> {
            let rank = comm.rank();
            let world: Arc<dyn Communicator> = Arc::new(comm);
            let mut steppers = Vec::with_capacity(sessions.len());
            for session in sessions {
                let member: Option<Arc<dyn Communicator>> = match (session.devices == devices, rank)
                {
                    (true, _) => Some(world.clone()),
                    (false, 0) => Some(Arc::new(LocalCluster::new(1)?.comms().remove(0))),
                    (false, _) => None,
                };
                let stepper = member
                    .map(|w| RankStepper::new(session.program.clone(), w, data, &session.bench))
                    .transpose()?;
                steppers.push(stepper);
            }
            for step in 0..warmup + steps {
                let mut order: Vec<usize> = (0..steppers.len()).collect();
                if step % 2 == 1 {
                    order.reverse();
                }
                for i in order {
                    world.barrier()?;
                    if let Some(stepper) = steppers[i].as_mut() {
                        // Only the ranks that step set the threads, all to the same count, and
                        // the others wait in the next barrier until they are done.
                        with_threads(sessions[i].threads, || stepper.step(step))?;
                    }
                }
            }
            Ok(steppers
                .into_iter()
                .map(|s| s.map(RankStepper::finish))
                .collect())
        })
        .into_iter()
        .enumerate()
        .map(|(rank, r)| r.map_err(|source| BenchError::Rank { rank, source })?)
        .collect::<Result<Vec<_>, BenchError>>()?;
    let mut per_session: Vec<Vec<RankTimes>> = sessions.iter().map(|_| Vec::new()).collect();
    for rank_times in per_rank {
        for (session, times) in per_session.iter_mut().zip(rank_times) {
            session.extend(times);
        }
    }
    Ok(per_session.into_iter().map(slowest).collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One timed step of a GPT of `layers` × `hidden` on one rank, nothing else timed.
    pub(crate) fn one_step_on_one_rank(layers: usize, hidden: usize) -> GptStepRequest {
        GptStepRequest {
            steps: 1,
            layers,
            hidden,
            profile: false,
            deterministic: false,
            rounds: 1,
            fusion: false,
            clip: false,
            threads: 1,
            context_parallel_seq: None,
            sequence_parallel: false,
            one_rank: true,
        }
    }

    /// The reader gone after the header (`tessera bench gpt-step | head -1`): no configuration
    /// is timed after it.
    #[test]
    fn a_reader_gone_after_the_header_times_nothing() {
        let request = GptStepRequest {
            one_rank: false,
            ..one_step_on_one_rank(1, 32)
        };
        let mut gone = crate::testing::GoneAfter::new(1);
        let err = gpt_step(&request, &mut gone).unwrap_err();
        assert!(matches!(err, BenchError::Stopped), "{err}");
        assert_eq!(gone.shown.len(), 1, "{:?}", gone.shown);
    }

    /// A width or depth past the model's bounds is refused with the bound's error before the
    /// benchmark allocates anything (the product peak it times first used to allocate
    /// `2,048 × width` elements: 800 GB for `--hidden 100000000`, an abort).
    #[test]
    fn an_oversized_gpt_is_refused_before_anything_is_allocated() {
        for (layers, hidden) in [(4, 100_000_000), (4, 65_536), (100_000, 256)] {
            let request = one_step_on_one_rank(layers, hidden);
            let err = gpt_step(&request, &mut crate::Silent).unwrap_err();
            assert!(
                err.to_string().contains("element bound"),
                "{layers} layers of width {hidden}: {err}"
            );
        }
    }

    /// `--profile --deterministic`: rank 0's step is broken down in deterministic mode too, and
    /// that breakdown shows deterministic mode's own ops (the canonical loss's reductions).
    #[test]
    fn a_profiled_deterministic_run_is_broken_down_too() {
        let request = GptStepRequest {
            profile: true,
            deterministic: true,
            ..one_step_on_one_rank(1, 32)
        };
        let report = gpt_step(&request, &mut crate::Silent).unwrap();
        let table = |label: &str| {
            report.0.iter().find_map(|line| match line {
                GptStepLine::Run(run) if run.label == label => {
                    run.breakdown.as_ref().map(|b| b.table.clone())
                }
                _ => None,
            })
        };
        let ordinary = table("1 rank").expect("the ordinary step is broken down");
        let deterministic = table("1 rank, deterministic").expect("so is the deterministic one");
        assert!(deterministic.contains("BatchMatMul"), "{deterministic}");
        assert!(
            deterministic.contains("ReduceSum") && !ordinary.contains("ReduceSum"),
            "{ordinary}\n{deterministic}"
        );
    }

    /// A 1-rank and a 2-rank program interleaved: each takes every step, the 1-rank one on rank
    /// 0 alone, and each reports one time per timed step.
    #[test]
    fn interleaved_programs_each_take_every_step() {
        let gpt = GptConfig {
            fused_attention: true,
            ..GptConfig::new(256, 1, 4, 32, 64, 2)
        };
        let cp = Split {
            dp: 1,
            mp: 1,
            cp: 2,
            algo: ContextParallelAlgo::Ring,
            seq_parallel: false,
        };
        let bench = |deterministic: bool| StepBench {
            optimizer: adamw(),
            warmup: 1,
            steps: 3,
            profile: false,
            deterministic: deterministic.then_some(DETERMINISTIC_BLOCKS),
            clip: None,
        };
        let sessions = [
            (Split::dp_mp(1, 1), false, 2),
            (cp, false, 1),
            (Split::dp_mp(2, 1), true, 1),
        ]
        .map(|(split, deterministic, threads)| Session {
            devices: split.devices(),
            program: program(&gpt, split, deterministic, Reduction::Plain).unwrap(),
            bench: bench(deterministic),
            threads,
        });
        let times = interleaved_steps(&sessions, &batches(&gpt).unwrap()).unwrap();
        assert_eq!(times.len(), 3);
        for steps in &times {
            assert_eq!(steps.len(), 3);
            assert!(steps.iter().all(|t| !t.is_zero()));
        }
        // The session's thread count does not outlive its steps.
        assert_eq!(tensor::kernels::threads::threads(), 1);
    }
}
