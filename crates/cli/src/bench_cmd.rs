//! `tessera bench …`: benchmarks that compare Tessera with its baselines in one run.
//!
//! Each subcommand's arguments become a request of the `bench` crate, checked here; one call
//! measures, and every piece of its report is printed as soon as it is measured.

use std::fmt;
use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, Subcommand, ValueEnum};
use runtime::PathKind;

use crate::stdout::{self, outln, StdoutLines};

/// Arguments of `tessera bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Single-thread memcpy bandwidth, the ceiling every copy and collective is measured against.
    Memcpy(MemcpyArgs),
    /// Checkpoint conversion (1 GiB, 8 ranks to 4) next to `cp -r` + `sync` of the same source.
    CkptConvert(CkptConvertArgs),
    /// Bus bandwidth of all-reduce and all-gather over a `comm` backend, 1 KiB to 256 MiB.
    Collectives(CollectivesArgs),
    /// Time and bytes of resharding a tensor between every pair of six layouts on a 2x2 mesh.
    Reshard(ReshardBenchArgs),
    /// Training-step time of seed_mlp (784-512-512-10, batch 32) on one rank and on N ranks.
    TrainStep(TrainStepArgs),
    /// Training tokens/s of the GPT (4 layers, width 256, 128 tokens, batch 16) on 1 and 2 ranks.
    GptStep(GptStepArgs),
    /// Parameter-server steps/s (sync, async; 1-4 workers, 1-2 servers) next to all-reduce
    /// data parallel, and the recovery time from a killed worker.
    Ps(PsBenchArgs),
    /// Parameter-server embedding bag with its table on the workers (dense) and on the servers
    /// (`ps.embedding_on_server`, row-sparse): bytes per step and steps/s.
    PsEmbedding(PsEmbeddingBenchArgs),
    /// Measure this machine as a device profile for the searches (cpu-local.toml).
    Profile(ProfileArgs),
    /// Elastic collective training on real processes (two loopback nodes under `tessera
    /// launch`, needs the `mpi` feature): kill → next completed step, and the snapshots' cost.
    Elastic(ElasticBenchArgs),
}

/// Arguments of `tessera bench elastic`.
#[derive(Debug, Args)]
struct ElasticBenchArgs {
    /// Trials of each measurement.
    #[arg(long, default_value_t = 5, value_parser = crate::parse::count(1..=100))]
    trials: usize,
    /// Steps of each run.
    #[arg(long, default_value_t = 60, value_parser = crate::parse::count_u64(2..=1_000_000))]
    steps: u64,
    /// The step at whose start rank 1 is killed.
    #[arg(long, default_value_t = 25)]
    kill_step: u64,
    /// The GPT configuration.
    #[arg(long, default_value = "examples/gpt_kjv.toml")]
    config: std::path::PathBuf,
    /// `train.elastic_interval` of the runs (default: its default).
    #[arg(long, value_parser = crate::parse::count_u64(1..=1_000_000))]
    interval: Option<u64>,
}

/// Arguments of `tessera bench memcpy`.
#[derive(Debug, Args)]
struct MemcpyArgs {
    /// Largest buffer, in MiB.
    #[arg(long, default_value_t = 256, value_parser = crate::parse::count(1..=16_384))]
    max_mib: usize,
    /// Repetitions per size.
    #[arg(long, default_value_t = 9, value_parser = crate::parse::count(1..=1000))]
    reps: usize,
}

/// Arguments of `tessera bench ckpt-convert`.
#[derive(Debug, Args)]
struct CkptConvertArgs {
    /// Working directory to create (it must not exist; default: a fresh directory under the
    /// system temp dir). Removed at the end unless `--keep`.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the generated source, copy and output.
    #[arg(long)]
    keep: bool,
    /// Timed repetitions of each side.
    #[arg(long, default_value_t = 5, value_parser = crate::parse::count(1..=100))]
    reps: usize,
    /// Number of [8192, 4096] f32 tensors (8 = 1 GiB).
    #[arg(long, default_value_t = 8, value_parser = crate::parse::count(1..=64))]
    tensors: usize,
}

/// Which backend to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// Ranks are threads of this process.
    Local,
    /// Ranks are processes: run under `mpirun -np N` (needs the `mpi` build feature).
    Mpi,
}

/// Arguments of `tessera bench collectives`.
#[derive(Debug, Args)]
struct CollectivesArgs {
    /// The backend.
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    backend: Backend,
    /// Number of ranks (local backend; MPI takes the `mpirun -np` count).
    #[arg(long, default_value_t = 2, value_parser = crate::parse::count(1..=256))]
    ranks: usize,
    /// Largest buffer, in MiB (sizes go from 1 KiB up by ×4).
    #[arg(long, default_value_t = 256, value_parser = crate::parse::count(1..=16_384))]
    max_mib: usize,
    /// Repetitions per size.
    #[arg(long, default_value_t = 9, value_parser = crate::parse::count(1..=1000))]
    reps: usize,
    /// MPI backend: blocking collectives guarded by a watchdog that ends the job on a timeout
    /// (`OnTimeout::AbortJob`) instead of polled ones that return an error.
    #[arg(long)]
    mpi_watchdog: bool,
}

/// Arguments of `tessera bench reshard`.
#[derive(Debug, Args)]
struct ReshardBenchArgs {
    /// The tensor shape (2-D).
    #[arg(long, default_value = "4096,4096")]
    shape: String,
    /// Timed runs per pair.
    #[arg(long, default_value_t = 7, value_parser = crate::parse::count(1..=1000))]
    reps: usize,
}

/// Arguments of `tessera bench train-step`.
#[derive(Debug, Args)]
struct TrainStepArgs {
    /// Timed steps (after 20 warm-up steps).
    #[arg(long, default_value_t = 300, value_parser = crate::parse::count(1..=1_000_000))]
    steps: usize,
    /// Also time the seed run's semi-auto strategies on this many ranks (0: skip; at most the
    /// seed batch of 32, which they split).
    #[arg(long, default_value_t = 8, value_parser = crate::parse::count(0..=32))]
    devices: usize,
}

/// Arguments of `tessera bench gpt-step`.
#[derive(Debug, Args)]
struct GptStepArgs {
    /// Timed steps (after 5 warm-up steps).
    #[arg(long, default_value_t = 20, value_parser = crate::parse::count(1..=100_000))]
    steps: usize,
    /// Layers of the GPT.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Width of the residual stream.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Print where rank 0's step time goes (with `--deterministic`, in deterministic mode too).
    #[arg(long)]
    profile: bool,
    /// Also time every configuration in deterministic mode (`train.deterministic`, 16 canonical
    /// blocks), its steps interleaved with ordinary ones.
    #[arg(long)]
    deterministic: bool,
    /// Sessions of every comparison (the 2-rank speed-ups, and with `--deterministic`,
    /// `--clip`, `--threads` or `--context-parallel-seq` each mode against its baseline): the
    /// configurations compared take their steps interleaved, one step each in turn (so a drift
    /// of the machine's speed reaches them alike), and the median (min–max) of every timed
    /// step's throughput ratio is reported.
    #[arg(long, default_value_t = 1, value_parser = crate::parse::count(1..=1000))]
    rounds: usize,
    /// Also time data parallel 2 with the gradients fused into buckets (`[parallel.comm_fusion]`
    /// auto), then also reduced on a progress thread while the backward pass computes
    /// (`[parallel.overlap]`), right after the plain run.
    #[arg(long)]
    fusion: bool,
    /// Also time every configuration with its gradients clipped by global norm
    /// (`train.max_grad_norm` = 1.0, which binds at every step of the benchmark), its steps
    /// interleaved with unclipped ones.
    #[arg(long)]
    clip: bool,
    /// Also time 1 rank with its large products on this many threads
    /// (`train.threads_per_rank`), its steps interleaved with 1-thread ones. 1: not timed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Also time context parallel 2 (ring and Ulysses, fused attention) against 1 rank on
    /// sequences of this many tokens (a power of two from 64 to 2048: the batch keeps 2,048
    /// tokens per step), the three interleaved step by step.
    #[arg(long, value_parser = context_parallel_seq)]
    context_parallel_seq: Option<usize>,
    /// Also time model parallel 2 with sequence parallel (`parallel.use_seq_parallel`), right
    /// after the plain run (with `--fusion`, then with its gradients' sums fused into buckets).
    #[arg(long)]
    sequence_parallel: bool,
    /// Time 1 rank only (with `--deterministic`, `--clip` or `--threads` its variants, and the
    /// utilisation line): no 2-rank configuration and no speed-up rounds
    /// (`scripts/bench-gpt-pairs.sh` pairs it with PyTorch's single thread).
    #[arg(long, conflicts_with_all = ["fusion", "sequence_parallel"])]
    one_rank: bool,
    /// Time 1 rank step by step as a driver paces it (`scripts/bench-gpt-lockstep.py`, which
    /// alternates its steps with PyTorch's): after the warm-up print `ready`, then run one
    /// timed step per line read from stdin and answer `step <ms>`, until end of input or
    /// `--steps` steps.
    #[arg(long, conflicts_with_all = ["fusion", "sequence_parallel", "profile", "deterministic", "clip", "threads", "context_parallel_seq", "rounds"])]
    paced: bool,
}

/// `--context-parallel-seq`: a power of two from 64 to 2048.
fn context_parallel_seq(text: &str) -> Result<usize, String> {
    let n: usize = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of tokens"))?;
    if n.is_power_of_two() && (64..=2048).contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "{n} tokens: must be a power of two from 64 to 2048"
        ))
    }
}

/// Arguments of `tessera bench ps`.
#[derive(Debug, Args)]
struct PsBenchArgs {
    /// Steps per run.
    #[arg(long, default_value_t = 200, value_parser = crate::parse::count_u64(1..=1_000_000))]
    steps: u64,
    /// The digits directory.
    #[arg(long, default_value = "data/digits")]
    data: PathBuf,
    /// `ps.dead_after_ms` of the recovery run.
    #[arg(long, default_value_t = 1000, value_parser = crate::parse::count_u64(1..=3_600_000))]
    dead_after_ms: u64,
    /// Only measure recovery: a killed worker and a killed, restarted server, `--trials` times.
    #[arg(long)]
    recovery: bool,
    /// Fresh jobs per kind of failure with `--recovery`.
    #[arg(long, default_value_t = 5, value_parser = crate::parse::count(1..=100))]
    trials: usize,
    /// The model of the steps/s table: `seed_mlp` or `gpt` (a small GPT on `--text`).
    #[arg(long, default_value = "seed_mlp")]
    model: String,
    /// The text the GPT trains on.
    #[arg(long, default_value = "data/kjv/kjv.txt.gz")]
    text: PathBuf,
}

/// Arguments of `tessera bench ps-embedding`.
#[derive(Debug, Args)]
struct PsEmbeddingBenchArgs {
    /// Steps per run.
    #[arg(long, default_value_t = 100, value_parser = crate::parse::count_u64(1..=1_000_000))]
    steps: u64,
    /// The digits directory.
    #[arg(long, default_value = "data/digits")]
    data: PathBuf,
    /// Servers.
    #[arg(long, default_value_t = 2)]
    servers: usize,
    /// Workers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
}

/// Arguments of `tessera bench profile`.
#[derive(Debug, Args)]
struct ProfileArgs {
    /// Where to write the profile.
    #[arg(long, default_value = "cpu-local.toml")]
    out: PathBuf,
    /// Ranks (threads) of the collective measurement of `intra_node` / `inter_node`; also the
    /// profile's devices per node.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Rank counts whose local-backend all-reduce is measured as `[[local_link]]` entries.
    #[arg(long, value_delimiter = ',', default_value = "2,8")]
    link_ranks: Vec<usize>,
    /// Cores the ranks share (`compute_slots`; default: the cores this process may use).
    #[arg(long, value_parser = crate::parse::count(1..=65_536))]
    cores: Option<usize>,
    /// Time each kernel as the mean of back-to-back calls over 0.2 s (the rate this process
    /// sustains on the machine as loaded now, other work's share of the cores included)
    /// instead of its best call (the rate of an idle core).
    #[arg(long)]
    sustained: bool,
    /// Device memory to record, GiB (the plan's limit; default: this machine's 24 GiB).
    #[arg(long, default_value_t = 24)]
    memory_gib: u64,
}

/// The most elements `tessera bench reshard --shape` may ask for.
const MAX_RESHARD_ELEMENTS: usize = 1 << 30;

/// Prints every piece of a report on stdout as it is measured, and notes on stderr.
///
/// When stdout cannot be written (a full disk) or its reader has gone (`tessera bench … |
/// head -1`), the benchmark is asked to stop at its next step or round
/// ([`bench::Progress::stop`]): it still removes its scratch files and stops the processes it
/// started (exiting here would leave both behind), and no piece after the failure is written
/// (the report would have holes). A failed write is said at once on stderr (a closed pipe is
/// not worth a word), and [`run`] ends with it as its error; a closed pipe ends the command
/// quietly, as every command does.
#[derive(Default)]
struct Console {
    /// Set at the first failed write: nothing more goes to stdout.
    failed: bool,
}

impl bench::Progress for Console {
    fn piece(&mut self, piece: &dyn fmt::Display) {
        if self.failed {
            return;
        }
        let text = piece.to_string();
        let written = StdoutLines.write_line(text.as_bytes(), |err| {
            if err.kind() != std::io::ErrorKind::BrokenPipe {
                eprintln!("tessera bench: cannot write the report to stdout: {err}; the benchmark stops at its next step, cleaning up after itself, then ends with this error");
            }
        });
        self.failed = written.is_err();
    }

    fn note(&mut self, note: &dyn fmt::Display) {
        eprintln!("{note}");
    }

    fn stop(&mut self) -> bool {
        self.failed || stdout::reader_gone()
    }
}

/// Runs `tessera bench …`: the benchmark's error, else the failure to write its report. A
/// benchmark stopped because its report had nowhere to go ends with the failed write, or
/// with a broken pipe when its reader went away before it wrote again.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let outcome = run_bench(args, &mut Console::default());
    let stopped = outcome.as_ref().is_err_and(|err| {
        matches!(
            err.downcast_ref::<bench::BenchError>(),
            Some(bench::BenchError::Stopped)
        )
    });
    if !stopped {
        outcome?;
    }
    match stdout::take_failure("the report") {
        Some(failure) => Err(failure),
        None if stopped => Err(stdout::reader_gone_error("the report")),
        None => Ok(()),
    }
}

/// Runs the benchmark `args` names, showing its report on `console`.
fn run_bench(args: &BenchArgs, console: &mut Console) -> anyhow::Result<()> {
    match &args.command {
        BenchCommand::Memcpy(a) => {
            let request = bench::memcpy::MemcpyRequest {
                max_mib: a.max_mib,
                reps: a.reps,
            };
            bench::memcpy::memcpy(&request, console);
        }
        BenchCommand::CkptConvert(a) => {
            // Before the source is generated: an existing --dir is refused by the benchmark
            // itself, naming the flag; a missing one must be creatable.
            if let Some(dir) = a
                .dir
                .as_ref()
                .filter(|d| std::fs::symlink_metadata(d).is_err())
            {
                runtime::check_output_path(
                    "--dir",
                    dir,
                    PathKind::Directory,
                    "a directory to create (the benchmark's working directory, which must not exist)",
                )?;
            }
            let request = bench::ckpt_convert::CkptConvertRequest {
                dir: a.dir.clone(),
                keep: a.keep,
                reps: a.reps,
                tensors: a.tensors,
                tessera: std::env::current_exe()?,
            };
            bench::ckpt_convert::ckpt_convert(&request, console)?;
        }
        BenchCommand::Collectives(a) => {
            let request = bench::collectives::CollectivesRequest {
                backend: match a.backend {
                    Backend::Local => bench::collectives::Backend::Local,
                    Backend::Mpi => bench::collectives::Backend::Mpi,
                },
                ranks: a.ranks,
                max_mib: a.max_mib,
                reps: a.reps,
                mpi_watchdog: a.mpi_watchdog,
            };
            bench::collectives::collectives(&request, console)?;
        }
        BenchCommand::Reshard(a) => {
            let shape = crate::parse::parse_usizes(&a.shape, "--shape")?;
            // The global tensor and its slices are allocated: bounded before anything is.
            let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            anyhow::ensure!(
                elements.is_some_and(|n| (1..=MAX_RESHARD_ELEMENTS).contains(&n)),
                "--shape {}: the tensor must hold between 1 and {MAX_RESHARD_ELEMENTS} elements (4 GiB of f32)",
                a.shape
            );
            let request = bench::reshard::ReshardRequest {
                shape,
                reps: a.reps,
            };
            bench::reshard::reshard(&request, console)?;
        }
        BenchCommand::TrainStep(a) => {
            let request = bench::train_step::TrainStepRequest {
                steps: a.steps,
                devices: a.devices,
            };
            bench::train_step::train_step(&request, console)?;
        }
        BenchCommand::GptStep(a) => {
            let request = bench::gpt_step::GptStepRequest {
                steps: a.steps,
                layers: a.layers,
                hidden: a.hidden,
                profile: a.profile,
                deterministic: a.deterministic,
                rounds: a.rounds,
                fusion: a.fusion,
                clip: a.clip,
                threads: usize::from(a.threads),
                context_parallel_seq: a.context_parallel_seq,
                sequence_parallel: a.sequence_parallel,
                one_rank: a.one_rank,
            };
            if a.paced {
                let stdout = std::io::stdout();
                bench::gpt_paced::gpt_step_paced(
                    &request,
                    &mut std::io::stdin().lock(),
                    &mut stdout.lock(),
                )?;
            } else {
                bench::gpt_step::gpt_step(&request, console)?;
            }
        }
        BenchCommand::Ps(a) => {
            bench::ps::ps(&ps_request(a)?, console)?;
        }
        BenchCommand::PsEmbedding(a) => {
            runtime::check_idx_dir("--data", &a.data)?;
            let request = bench::ps_embedding::PsEmbeddingRequest {
                steps: a.steps,
                data: a.data.clone(),
                servers: a.servers,
                workers: a.workers,
            };
            bench::ps_embedding::ps_embedding(&request, console)?;
        }
        BenchCommand::Profile(a) => profile(a, console)?,
        BenchCommand::Elastic(a) => {
            anyhow::ensure!(
                (1..=100).contains(&a.trials) && a.kill_step >= 1 && a.kill_step < a.steps,
                "--trials must be 1 to 100 and --kill-step below --steps"
            );
            runtime::check_input_path(
                "--config",
                &a.config,
                PathKind::File,
                "a file (the GPT training configuration, TOML)",
            )?;
            let request = bench::elastic::ElasticRequest {
                tessera: std::env::current_exe()?,
                config: a.config.clone(),
                trials: a.trials,
                steps: a.steps,
                kill_step: a.kill_step,
                interval: a.interval,
            };
            bench::elastic::elastic(&request, console)?;
        }
    }
    Ok(())
}

/// The request of `tessera bench ps`.
fn ps_request(args: &PsBenchArgs) -> anyhow::Result<bench::ps::PsRequest> {
    let model = match args.model.as_str() {
        "gpt" => bench::ps::PsModel::Gpt,
        "seed_mlp" => bench::ps::PsModel::SeedMlp,
        // The recovery runs take any other name for the seed MLP, as they always did.
        _ if args.recovery => bench::ps::PsModel::SeedMlp,
        other => bail!("--model {other}: expected seed_mlp or gpt"),
    };
    // Before any run starts: the runs read only their model's data.
    match model {
        bench::ps::PsModel::Gpt => runtime::check_input_path(
            "--text",
            &args.text,
            PathKind::File,
            "a file (the text the GPT trains on, plain or .gz)",
        )?,
        bench::ps::PsModel::SeedMlp => runtime::check_idx_dir("--data", &args.data)?,
    }
    Ok(bench::ps::PsRequest {
        steps: args.steps,
        data: args.data.clone(),
        dead_after_ms: args.dead_after_ms,
        recovery_trials: args.recovery.then_some(args.trials),
        model,
        text: args.text.clone(),
        tessera: std::env::current_exe()?,
    })
}

/// `tessera bench profile`: measures, then writes the profile to `--out`.
fn profile(args: &ProfileArgs, console: &mut Console) -> anyhow::Result<()> {
    if !(2..=64).contains(&args.ranks) {
        bail!("--ranks {}: between 2 and 64 ranks", args.ranks);
    }
    if !(1..=1 << 20).contains(&args.memory_gib) {
        bail!("--memory-gib {}: between 1 and 1048576", args.memory_gib);
    }
    let mut link_ranks = args.link_ranks.clone();
    link_ranks.sort_unstable();
    link_ranks.dedup();
    if let Some(&r) = link_ranks.iter().find(|&&r| !(2..=64).contains(&r)) {
        bail!("--link-ranks {r}: between 2 and 64 ranks");
    }
    // Before the minutes of measurement, not after them.
    runtime::check_output_file("--out", &args.out)?;
    let request = bench::profile::ProfileRequest {
        ranks: args.ranks,
        link_ranks,
        cores: args.cores,
        sustained: args.sustained,
        memory_gib: args.memory_gib,
    };
    let report = bench::profile::profile(&request, console)?;
    std::fs::write(&args.out, search::device_profile::to_toml(&report.profile))
        .map_err(|e| anyhow::anyhow!("--out {}: cannot write: {e}", args.out.display()))?;
    outln!("profile written to {}", args.out.display())?;
    Ok(())
}
