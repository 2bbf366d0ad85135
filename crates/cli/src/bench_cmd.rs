//! `tessera bench …`: benchmarks that compare Tessera with its baselines in one run.
//!
//! Each benchmark reports the median and the spread (min–max) of repeated runs. Figures go in
//! `docs/PERFORMANCE.md` with the command that produced them; no test asserts a time.

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};

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
    CkptConvert(crate::bench_ckpt::CkptConvertArgs),
    /// Bus bandwidth of all-reduce and all-gather over a `comm` backend, 1 KiB to 256 MiB.
    Collectives(crate::bench_collectives::CollectivesArgs),
    /// Time and bytes of resharding a tensor between every pair of six layouts on a 2x2 mesh.
    Reshard(crate::bench_reshard::ReshardBenchArgs),
    /// Training-step time of seed_mlp (784-512-512-10, batch 32) on one rank and on N ranks.
    TrainStep(crate::bench_train::TrainStepArgs),
    /// Training tokens/s of the GPT (4 layers, width 256, 128 tokens, batch 16) on 1 and 2 ranks.
    GptStep(crate::bench_gpt::GptStepArgs),
    /// Parameter-server steps/s (sync, async; 1-4 workers, 1-2 servers) next to all-reduce
    /// data parallel, and the recovery time from a killed worker.
    Ps(crate::bench_ps::PsBenchArgs),
    /// Parameter-server embedding bag with its table on the workers (dense) and on the servers
    /// (`ps.embedding_on_server`, row-sparse): bytes per step and steps/s.
    PsEmbedding(crate::bench_ps_embedding::PsEmbeddingBenchArgs),
    /// Measure this machine as a device profile for the searches (cpu-local.toml).
    Profile(crate::bench_profile::ProfileArgs),
}

/// Arguments of `tessera bench memcpy`.
#[derive(Debug, Args)]
struct MemcpyArgs {
    /// Largest buffer, in MiB.
    #[arg(long, default_value_t = 256)]
    max_mib: usize,
    /// Repetitions per size.
    #[arg(long, default_value_t = 9)]
    reps: usize,
}

/// Runs `tessera bench …`.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    match &args.command {
        BenchCommand::Memcpy(a) => memcpy(a),
        BenchCommand::CkptConvert(a) => crate::bench_ckpt::run(a),
        BenchCommand::Collectives(a) => crate::bench_collectives::run(a),
        BenchCommand::Reshard(a) => crate::bench_reshard::run(a),
        BenchCommand::TrainStep(a) => crate::bench_train::run(a),
        BenchCommand::GptStep(a) => crate::bench_gpt::run(a),
        BenchCommand::Profile(a) => crate::bench_profile::run(a),
        BenchCommand::Ps(a) => crate::bench_ps::run(a),
        BenchCommand::PsEmbedding(a) => crate::bench_ps_embedding::run(a),
    }
}

/// Median, minimum and maximum of a set of durations.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// The median.
    pub median: Duration,
    /// The fastest run.
    pub min: Duration,
    /// The slowest run.
    pub max: Duration,
}

/// Times `f` `reps` times (after one warm-up call) and summarises.
pub fn time_reps(reps: usize, mut f: impl FnMut()) -> Summary {
    f();
    let mut times: Vec<Duration> = (0..reps.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort_unstable();
    Summary {
        median: times[times.len() / 2],
        min: times[0],
        max: times[times.len() - 1],
    }
}

/// Bytes per second as GB/s (10^9).
pub fn gb_per_s(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-12) / 1e9
}

/// Human size: `64 KiB`, `16 MiB`.
pub fn human_bytes(bytes: usize) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

fn memcpy(args: &MemcpyArgs) -> anyhow::Result<()> {
    println!(
        "single-thread memcpy (GB/s: median [min-max] over {} runs)",
        args.reps
    );
    let mut size = 1024usize;
    while size <= args.max_mib << 20 {
        let src = vec![1u8; size];
        let mut dst = vec![0u8; size];
        // Small sizes repeat inside one timing so the clock resolution does not dominate.
        let inner = ((1 << 24) / size).max(1);
        let s = time_reps(args.reps, || {
            for _ in 0..inner {
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&mut dst);
            }
        });
        let bytes = size * inner;
        println!(
            "{:>9}  {:>6.2} [{:.2}-{:.2}]",
            human_bytes(size),
            gb_per_s(bytes, s.median),
            gb_per_s(bytes, s.max),
            gb_per_s(bytes, s.min)
        );
        size *= 4;
    }
    Ok(())
}
