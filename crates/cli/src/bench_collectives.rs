//! `tessera bench collectives`: bus bandwidth of all-reduce and all-gather over a `comm`
//! backend.
//!
//! Sizes follow nccl-tests: `size` is the all-reduce buffer and the all-gather *output*
//! (each rank sends `size / n`). Bus bandwidth is the algorithm bandwidth `size / t` times
//! `2(n-1)/n` for all-reduce and `(n-1)/n` for all-gather, so it is comparable across rank
//! counts and with the hardware's copy bandwidth. Each timing is the slowest rank's.
//!
//! The deterministic all-reduce (issue 17: the canonical summation tree over the ranks) is
//! timed in the same runs as the ordinary one, run for run, and reported beside it with the
//! median ratio of their times (its bandwidth as a share of the ordinary one's).

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use comm::{CommError, Communicator, CommunicatorExt, LocalCluster, ReduceOp};

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
            let results = cluster.run(|comm| sweep(&comm, None, args));
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
    // Every call comes from this thread.
    comm::mpi::prefer_thread_level(comm::mpi::ThreadLevel::Single);
    let world = comm::mpi::MpiComm::world_with(comm::mpi::DEFAULT_TIMEOUT, on_timeout)?;
    sweep(&world, Some(&world), args)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: &CollectivesArgs) -> anyhow::Result<()> {
    anyhow::bail!("this tessera was built without MPI; rebuild with `--features mpi`")
}

/// The MPI library's own collectives, timed beside the backend's in the same run: every
/// repetition runs both, one after the other, so the comparison sees the same machine state.
trait Baseline {
    fn all_reduce(&self, buf: &mut [f32]) -> Result<(), CommError>;
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError>;
}

#[cfg(feature = "mpi")]
impl Baseline for comm::mpi::MpiComm {
    fn all_reduce(&self, buf: &mut [f32]) -> Result<(), CommError> {
        self.library_all_reduce_sum(buf)
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        self.library_all_gather(send, recv)
    }
}

/// One collective call with its own buffers, as a sweep times it.
type Variant<'a> = Box<dyn FnMut() -> Result<(), CommError> + 'a>;

/// Every rank runs the sweep; rank 0 prints.
fn sweep(
    comm: &dyn Communicator,
    baseline: Option<&dyn Baseline>,
    args: &CollectivesArgs,
) -> anyhow::Result<()> {
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
        if baseline.is_some() {
            println!(
                "# beside the MPI library's own MPI_Allreduce / MPI_Allgather on the same \
                 communicator, run for run; ratio: median over runs of MPI's time / Tessera's"
            );
            println!(
                "#     size   all-reduce             all-gather             MPI_Allreduce          \
                 MPI_Allgather          all-reduce/MPI  all-gather/MPI  \
                 det all-reduce         det/all-reduce"
            );
        } else {
            println!(
                "#     size   all-reduce             all-gather             det all-reduce         \
                 det/all-reduce"
            );
        }
        println!(
            "# det all-reduce: all_reduce_deterministic (canonical tree, issue 17); \
             det/all-reduce: median over runs of the all-reduce's time / its time"
        );
    }
    let all_reduce_factor = 2.0 * (n - 1) as f64 / n as f64;
    let all_gather_factor = (n - 1) as f64 / n as f64;
    let mut size = 1024usize;
    while size <= args.max_mib << 20 {
        let count = size / 4;
        let send_count = count / n;
        let mut all_reduces: Vec<Variant> = vec![Box::new({
            let mut buf = vec![1f32; count];
            move || comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        })];
        let mut all_gathers: Vec<Variant> = vec![Box::new({
            let (send, mut recv) = (vec![1f32; send_count], vec![0f32; send_count * n]);
            move || comm.all_gather_into(&send, &mut recv)
        })];
        if let Some(baseline) = baseline {
            all_reduces.push(Box::new({
                let mut buf = vec![1f32; count];
                move || baseline.all_reduce(&mut buf)
            }));
            all_gathers.push(Box::new({
                let (send, mut recv) = (vec![1f32; send_count], vec![0f32; send_count * n]);
                move || baseline.all_gather(&send, &mut recv)
            }));
        }
        // Last, so the baseline keeps index 1.
        all_reduces.push(Box::new({
            let mut buf = vec![1f32; count];
            move || comm.all_reduce_deterministic_in_place(&mut buf, ReduceOp::Sum)
        }));
        let det = all_reduces.len() - 1;
        let all_reduce = measure(comm, size, args.reps, &mut all_reduces)?;
        let all_gather = measure(comm, size, args.reps, &mut all_gathers)?;
        if comm.rank() == 0 {
            let mut line = format!(
                "{:>10}  {}  {}",
                human_bytes(size),
                bus_bandwidth(size, &all_reduce[0], all_reduce_factor),
                bus_bandwidth(size, &all_gather[0], all_gather_factor),
            );
            if baseline.is_some() {
                line += &format!(
                    "  {}  {}  {:>13.0}%  {:>13.0}%",
                    bus_bandwidth(size, &all_reduce[1], all_reduce_factor),
                    bus_bandwidth(size, &all_gather[1], all_gather_factor),
                    100.0 * paired_ratio(&all_reduce[1], &all_reduce[0]),
                    100.0 * paired_ratio(&all_gather[1], &all_gather[0]),
                );
            }
            line += &format!(
                "  {}  {:>13.0}%",
                bus_bandwidth(size, &all_reduce[det], all_reduce_factor),
                100.0 * paired_ratio(&all_reduce[0], &all_reduce[det]),
            );
            println!("{line}");
        }
        size *= 4;
    }
    Ok(())
}

fn bus_bandwidth(size: usize, times: &[Duration], factor: f64) -> String {
    let s = summarize(times);
    format!(
        "{:>7.2} [{:.2}-{:.2}]",
        gb_per_s(size, s.median) * factor,
        gb_per_s(size, s.max) * factor,
        gb_per_s(size, s.min) * factor
    )
}

fn summarize(times: &[Duration]) -> Summary {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    Summary {
        median: sorted[sorted.len() / 2],
        min: sorted[0],
        max: sorted[sorted.len() - 1],
    }
}

/// The median over runs of `numerator[k] / denominator[k]`: a comparison of two variants
/// measured run for run, which the machine's drift between runs does not skew.
fn paired_ratio(numerator: &[Duration], denominator: &[Duration]) -> f64 {
    let mut ratios: Vec<f64> = numerator
        .iter()
        .zip(denominator)
        .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
        .collect();
    ratios.sort_unstable_by(f64::total_cmp);
    ratios[ratios.len() / 2]
}

/// Times `reps` runs (after a warm-up run) of each variant, interleaved: run `k` of every
/// variant comes before run `k + 1` of any. A run is one untimed call, then `inner` timed
/// back-to-back calls; its time per call is the slowest rank's. Returns each variant's times per call, in run order.
fn measure(
    comm: &dyn Communicator,
    size: usize,
    reps: usize,
    variants: &mut [Variant],
) -> anyhow::Result<Vec<Vec<Duration>>> {
    // Small sizes repeat inside one timing so the clock and the barrier do not dominate.
    let inner = ((16usize << 20) / size).clamp(1, 2_000);
    let mut times = vec![Vec::with_capacity(reps); variants.len()];
    for rep in 0..=reps.max(1) {
        for (variant, times) in variants.iter_mut().zip(&mut times) {
            // One untimed call first: the run starts with its buffers warm, whatever ran before.
            variant()?;
            comm.barrier()?;
            let start = Instant::now();
            for _ in 0..inner {
                variant()?;
            }
            let mut per_call = [start.elapsed().as_secs_f64() / inner as f64];
            comm.all_reduce_in_place(&mut per_call, ReduceOp::Max)?;
            if rep > 0 {
                times.push(Duration::from_secs_f64(per_call[0]));
            }
        }
    }
    Ok(times)
}
