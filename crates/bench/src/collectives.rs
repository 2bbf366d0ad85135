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

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use comm::{CommError, Communicator, CommunicatorExt, LocalCluster, ReduceOp};

use crate::timing::{gb_per_s, human_bytes, Summary};
use crate::{BenchError, Progress};

/// Which backend to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Ranks are threads of this process.
    Local,
    /// Ranks are processes: run under `mpirun -np N` (needs the `mpi` build feature).
    Mpi,
}

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectivesRequest {
    /// The backend.
    pub backend: Backend,
    /// Number of ranks (local backend; MPI takes the `mpirun -np` count).
    pub ranks: usize,
    /// Largest buffer, in MiB (sizes go from 1 KiB up by ×4).
    pub max_mib: usize,
    /// Repetitions per size.
    pub reps: usize,
    /// MPI backend: blocking collectives guarded by a watchdog that ends the job on a timeout
    /// (`OnTimeout::AbortJob`) instead of polled ones that return an error.
    pub mpi_watchdog: bool,
}

/// The report's header: what ran, and the columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectivesHeader {
    /// The communicator's backend (`local`, `mpi`).
    pub backend: &'static str,
    /// MPI's blocking collectives under a watchdog (else polled ones).
    pub mpi_watchdog: bool,
    /// Ranks.
    pub ranks: usize,
    /// Timed runs per size.
    pub reps: usize,
    /// Whether the MPI library's own collectives are timed beside.
    pub baseline: bool,
}

impl fmt::Display for CollectivesHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match (self.backend, self.mpi_watchdog) {
            ("mpi", true) => " (blocking collectives, watchdog)",
            ("mpi", false) => " (polled collectives)",
            _ => "",
        };
        writeln!(
            f,
            "# {} backend{mode}, {} ranks: bus bandwidth in GB/s, median [min-max] over {} runs",
            self.backend, self.ranks, self.reps
        )?;
        if self.baseline {
            writeln!(
                f,
                "# beside the MPI library's own MPI_Allreduce / MPI_Allgather on the same \
                 communicator, run for run; ratio: median over runs of MPI's time / Tessera's"
            )?;
            writeln!(
                f,
                "#     size   all-reduce             all-gather             MPI_Allreduce          \
                 MPI_Allgather          all-reduce/MPI  all-gather/MPI  \
                 det all-reduce         det/all-reduce"
            )?;
        } else {
            writeln!(
                f,
                "#     size   all-reduce             all-gather             det all-reduce         \
                 det/all-reduce"
            )?;
        }
        writeln!(
            f,
            "# det all-reduce: all_reduce_deterministic (canonical tree, issue 17); \
             det/all-reduce: median over runs of the all-reduce's time / its time"
        )
    }
}

/// The MPI library's own collectives' times of one size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaselineTimes {
    /// `MPI_Allreduce`, per call, run by run.
    pub all_reduce: Vec<Duration>,
    /// `MPI_Allgather`, per call, run by run.
    pub all_gather: Vec<Duration>,
}

/// One size's times per call (the slowest rank's), run by run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectivesRow {
    /// The all-reduce buffer and the all-gather output, bytes.
    pub size: usize,
    /// Ranks.
    pub ranks: usize,
    /// The backend's all-reduce.
    pub all_reduce: Vec<Duration>,
    /// The backend's all-gather.
    pub all_gather: Vec<Duration>,
    /// The deterministic all-reduce.
    pub deterministic_all_reduce: Vec<Duration>,
    /// The MPI library's, when measured.
    pub baseline: Option<BaselineTimes>,
}

impl fmt::Display for CollectivesRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.ranks;
        let all_reduce_factor = 2.0 * (n - 1) as f64 / n as f64;
        let all_gather_factor = (n - 1) as f64 / n as f64;
        let size = self.size;
        write!(
            f,
            "{:>10}  {}  {}",
            human_bytes(size),
            bus_bandwidth(size, &self.all_reduce, all_reduce_factor),
            bus_bandwidth(size, &self.all_gather, all_gather_factor),
        )?;
        if let Some(baseline) = &self.baseline {
            write!(
                f,
                "  {}  {}  {:>13.0}%  {:>13.0}%",
                bus_bandwidth(size, &baseline.all_reduce, all_reduce_factor),
                bus_bandwidth(size, &baseline.all_gather, all_gather_factor),
                100.0 * paired_ratio(&baseline.all_reduce, &self.all_reduce),
                100.0 * paired_ratio(&baseline.all_gather, &self.all_gather),
            )?;
        }
        writeln!(
            f,
            "  {}  {:>13.0}%",
            bus_bandwidth(size, &self.deterministic_all_reduce, all_reduce_factor),
            100.0 * paired_ratio(&self.all_reduce, &self.deterministic_all_reduce),
        )
    }
}

/// Bus bandwidth per size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectivesReport {
    /// What ran.
    pub header: CollectivesHeader,
    /// One row per size, smallest first.
    pub rows: Vec<CollectivesRow>,
}

impl fmt::Display for CollectivesReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.header.fmt(f)?;
        self.rows.iter().try_for_each(|row| row.fmt(f))
    }
}

/// Runs `tessera bench collectives`. Every rank measures; rank 0 reports (under MPI the other
/// processes return `None`).
pub fn collectives(
    request: &CollectivesRequest,
    progress: &mut dyn Progress,
) -> Result<Option<CollectivesReport>, BenchError> {
    let progress = Mutex::new(progress);
    match request.backend {
        Backend::Local => {
            let cluster = LocalCluster::new(request.ranks)?;
            let results = cluster.run(|comm| sweep(&comm, None, request, &progress));
            let mut report = None;
            for (rank, result) in results.into_iter().enumerate() {
                let result = result.map_err(|source| BenchError::Rank { rank, source })??;
                report = report.or(result);
            }
            Ok(report)
        }
        Backend::Mpi => run_mpi(request, &progress),
    }
}

#[cfg(feature = "mpi")]
fn run_mpi(
    request: &CollectivesRequest,
    progress: &Mutex<&mut dyn Progress>,
) -> Result<Option<CollectivesReport>, BenchError> {
    let on_timeout = if request.mpi_watchdog {
        comm::mpi::OnTimeout::AbortJob
    } else {
        comm::mpi::OnTimeout::ReturnError
    };
    // Every call comes from this thread.
    comm::mpi::prefer_thread_level(comm::mpi::ThreadLevel::Single);
    let world = comm::mpi::MpiComm::world_with(comm::mpi::DEFAULT_TIMEOUT, on_timeout)?;
    sweep(&world, Some(&world), request, progress)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(
    _: &CollectivesRequest,
    _: &Mutex<&mut dyn Progress>,
) -> Result<Option<CollectivesReport>, BenchError> {
    Err(BenchError::NoMpi)
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

/// Every rank runs the sweep; rank 0 shows and returns the report.
fn sweep(
    comm: &dyn Communicator,
    baseline: Option<&dyn Baseline>,
    request: &CollectivesRequest,
    progress: &Mutex<&mut dyn Progress>,
) -> Result<Option<CollectivesReport>, BenchError> {
    let n = comm.size();
    let show = |piece: &dyn fmt::Display| {
        if let Ok(mut progress) = progress.lock() {
            progress.piece(piece);
        }
    };
    let mut report = (comm.rank() == 0).then(|| CollectivesReport {
        header: CollectivesHeader {
            backend: comm.backend(),
            mpi_watchdog: request.mpi_watchdog,
            ranks: n,
            reps: request.reps,
            baseline: baseline.is_some(),
        },
        rows: Vec::new(),
    });
    if let Some(report) = &report {
        show(&report.header);
    }
    let mut size = 1024usize;
    while size <= request.max_mib << 20 {
        // Rank 0 (which shows the report) decides whether to stop, and every rank hears it
        // before the next size, so none is left waiting in a collective of a stopped one.
        let mut stop = [u8::from(
            comm.rank() == 0 && progress.lock().is_ok_and(|mut progress| progress.stop()),
        )];
        comm.broadcast_bytes(&mut stop, 0)?;
        if stop[0] != 0 {
            return Err(BenchError::Stopped);
        }
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
        let mut all_reduce = measure(comm, size, request.reps, &mut all_reduces)?;
        let mut all_gather = measure(comm, size, request.reps, &mut all_gathers)?;
        if let Some(report) = &mut report {
            let deterministic_all_reduce = all_reduce.pop().unwrap_or_default();
            let baseline = (baseline.is_some()).then(|| BaselineTimes {
                all_reduce: all_reduce.pop().unwrap_or_default(),
                all_gather: all_gather.pop().unwrap_or_default(),
            });
            let row = CollectivesRow {
                size,
                ranks: n,
                all_reduce: all_reduce.swap_remove(0),
                all_gather: all_gather.swap_remove(0),
                deterministic_all_reduce,
                baseline,
            };
            show(&row);
            report.rows.push(row);
        }
        size *= 4;
    }
    Ok(report)
}

fn bus_bandwidth(size: usize, times: &[Duration], factor: f64) -> String {
    let s = Summary::of(times);
    format!(
        "{:>7.2} [{:.2}-{:.2}]",
        gb_per_s(size, s.median) * factor,
        gb_per_s(size, s.max) * factor,
        gb_per_s(size, s.min) * factor
    )
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
) -> Result<Vec<Vec<Duration>>, CommError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader of rank 0's report gone after the header and the first size: every rank
    /// stops before the next size (none left waiting in a collective of a stopped one), and the
    /// benchmark says it stopped.
    #[test]
    fn every_rank_stops_at_the_next_size_when_the_reader_is_gone() {
        let mut gone = crate::testing::GoneAfter::new(2);
        let request = CollectivesRequest {
            backend: Backend::Local,
            ranks: 3,
            max_mib: 1,
            reps: 1,
            mpi_watchdog: false,
        };
        let err = collectives(&request, &mut gone).unwrap_err();
        assert!(matches!(err, BenchError::Stopped), "{err}");
        assert_eq!(gone.shown.len(), 2, "{:?}", gone.shown);
        assert!(gone.shown[1].contains("1 KiB"), "{:?}", gone.shown);
    }
}
