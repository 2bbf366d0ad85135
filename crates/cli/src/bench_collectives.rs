//! `tessera bench collectives`: bus bandwidth of all-reduce and all-gather over a `comm`
//! backend.
//!
//! Sizes follow nccl-tests: `size` is the all-reduce buffer and the all-gather *output*
//! (each rank sends `size / n`). Bus bandwidth is the algorithm bandwidth `size / t` times
//! `2(n-1)/n` for all-reduce and `(n-1)/n` for all-gather, so it is comparable across rank
//! counts and with the hardware's copy bandwidth. Each timing is the slowest rank's.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use comm::{Communicator, CommunicatorExt, LocalCluster, ReduceOp};

use crate::bench_cmd::{gb_per_s, human_bytes, Summary};

/// Which backend to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Ranks are threads of this process.
    Local,
    /// Ranks are processes: run under `mpirun -np N` (needs the `mpi` build feature).
    Mpi,
}

/// Arguments of `tessera bench collectives`.
#[derive(Debug, Args)]
pub struct CollectivesArgs {
    /// The backend.
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    backend: Backend,
    /// Number of ranks (local backend; MPI takes the `mpirun -np` count).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Largest buffer, in MiB (sizes go from 1 KiB up by ×4).
    #[arg(long, default_value_t = 256)]
    max_mib: usize,
    /// Repetitions per size.
    #[arg(long, default_value_t = 9)]
    reps: usize,
    /// MPI backend: blocking collectives guarded by a watchdog that ends the job on a timeout
    /// (`OnTimeout::AbortJob`) instead of polled ones that return an error.
    #[arg(long)]
    mpi_watchdog: bool,
}

/// Runs `tessera bench collectives`.
pub fn run(args: &CollectivesArgs) -> anyhow::Result<()> {
    match args.backend {
        Backend::Local => {
            let cluster = LocalCluster::new(args.ranks)?;
            let results = cluster.run(|comm| sweep(&comm, args));
            for (rank, result) in results.into_iter().enumerate() {
                result.with_context(|| format!("rank {rank}"))??;
            }
            Ok(())
        }
        Backend::Mpi => run_mpi(args),
    }
}

#[cfg(feature = "mpi")]
fn run_mpi(args: &CollectivesArgs) -> anyhow::Result<()> {
    let on_timeout = if args.mpi_watchdog {
        comm::mpi::OnTimeout::AbortJob
    } else {
        comm::mpi::OnTimeout::ReturnError
    };
    let world = comm::mpi::MpiComm::world_with(comm::mpi::DEFAULT_TIMEOUT, on_timeout)?;
    sweep(&world, args)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: &CollectivesArgs) -> anyhow::Result<()> {
    anyhow::bail!("this tessera was built without MPI; rebuild with `--features mpi`")
}

#[derive(Debug, Clone, Copy)]
enum Op {
    AllReduce,
    AllGather,
}

/// Every rank runs the sweep; rank 0 prints.
fn sweep(comm: &dyn Communicator, args: &CollectivesArgs) -> anyhow::Result<()> {
    let n = comm.size();
    if comm.rank() == 0 {
        let mode = match (comm.backend(), args.mpi_watchdog) {
            ("mpi", true) => " (blocking collectives, watchdog)",
            ("mpi", false) => " (polled collectives)",
            _ => "",
        };
        println!(
            "# {} backend{mode}, {n} ranks: bus bandwidth in GB/s, median [min-max] over {} runs",
            comm.backend(),
            args.reps
        );
        println!("#     size   all-reduce             all-gather");
    }
    let mut size = 1024usize;
    while size <= args.max_mib << 20 {
        let all_reduce = measure(comm, Op::AllReduce, size, args.reps)?;
        let all_gather = measure(comm, Op::AllGather, size, args.reps)?;
        if comm.rank() == 0 {
            println!(
                "{:>10}  {}  {}",
                human_bytes(size),
                bus_bandwidth(size, all_reduce, 2.0 * (n - 1) as f64 / n as f64),
                bus_bandwidth(size, all_gather, (n - 1) as f64 / n as f64),
            );
        }
        size *= 4;
    }
    Ok(())
}

fn bus_bandwidth(size: usize, s: Summary, factor: f64) -> String {
    format!(
        "{:>7.2} [{:.2}-{:.2}]",
        gb_per_s(size, s.median) * factor,
        gb_per_s(size, s.max) * factor,
        gb_per_s(size, s.min) * factor
    )
}

/// Times `reps` runs (after a warm-up) of `inner` back-to-back calls; each run's time per call
/// is the slowest rank's.
fn measure(comm: &dyn Communicator, op: Op, size: usize, reps: usize) -> anyhow::Result<Summary> {
    let n = comm.size();
    let mut buf = vec![1f32; size / 4];
    let send = vec![1f32; size / 4 / n];
    let mut recv = vec![0f32; send.len() * n];
    // Small sizes repeat inside one timing so the clock and the barrier do not dominate.
    let inner = ((16usize << 20) / size).clamp(1, 2_000);
    let mut times = Vec::with_capacity(reps);
    for rep in 0..=reps.max(1) {
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..inner {
            match op {
                Op::AllReduce => comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?,
                Op::AllGather => comm.all_gather_into(&send, &mut recv)?,
            }
        }
        let mut per_call = [start.elapsed().as_secs_f64() / inner as f64];
        comm.all_reduce_in_place(&mut per_call, ReduceOp::Max)?;
        if rep > 0 {
            times.push(Duration::from_secs_f64(per_call[0]));
        }
    }
    times.sort_unstable();
    Ok(Summary {
        median: times[times.len() / 2],
        min: times[0],
        max: times[times.len() - 1],
    })
}
