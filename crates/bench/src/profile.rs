//! `tessera bench profile`: measures this machine as a device profile (matmul FLOP/s by shape
//! class, memcpy bandwidth, all-reduce α and bandwidth on the local backend for each of
//! the link rank counts, the core count as `compute_slots`) for `parallel.device_profile` /
//! `tessera plan --profile` (the caller writes it, `search::device_profile::to_toml`).

use std::fmt;
use std::time::Instant;

use comm::{Communicator, CommunicatorExt, LocalCluster, ReduceOp};
use search::{DeviceProfile, Link, LocalLink, MatmulRate};
use tensor::{DType, Tensor};

use crate::{BenchError, Pieces, Progress};

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileRequest {
    /// Ranks (threads) of the collective measurement of `intra_node` / `inter_node`; also the
    /// profile's devices per node (2 to 64).
    pub ranks: usize,
    /// Rank counts whose local-backend all-reduce is measured as `[[local_link]]` entries
    /// (ascending, distinct, each 2 to 64).
    pub link_ranks: Vec<usize>,
    /// Cores the ranks share (`compute_slots`; `None`: the cores this process may use).
    pub cores: Option<usize>,
    /// Time each kernel as the mean of back-to-back calls over 0.2 s (the rate this process
    /// sustains on the machine as loaded now, other work's share of the cores included)
    /// instead of its best call (the rate of an idle core).
    pub sustained: bool,
    /// Device memory to record, GiB (the plan's limit).
    pub memory_gib: u64,
}

/// The best of `reps` timings of `f`, seconds.
fn best_of(reps: usize, mut f: impl FnMut() -> Result<(), BenchError>) -> Result<f64, BenchError> {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Seconds of one call of `f`: the best of `reps` calls, or with `sustained` the mean of calls
/// back to back over at least 0.2 s.
fn time_call(
    sustained: bool,
    reps: usize,
    mut f: impl FnMut() -> Result<(), BenchError>,
) -> Result<f64, BenchError> {
    if !sustained {
        return best_of(reps, f);
    }
    let start = Instant::now();
    let mut calls = 0u32;
    while calls == 0 || start.elapsed().as_secs_f64() < 0.2 {
        f()?;
        calls += 1;
    }
    Ok(start.elapsed().as_secs_f64() / f64::from(calls))
}

/// FLOP/s of an `n × n × n` f32 product.
fn matmul_rate(n: usize, sustained: bool) -> Result<(f64, f64), BenchError> {
    let a = Tensor::zeros(DType::F32, &[n, n]);
    let b = Tensor::zeros(DType::F32, &[n, n]);
    let flops = 2.0 * (n as f64).powi(3);
    let reps = (2e9 / flops).clamp(3.0, 200.0) as usize;
    let t = time_call(sustained, reps, || {
        tensor::kernels::matmul::matmul(&a, &b, false, false)?;
        Ok(())
    })?;
    Ok((flops, flops / t))
}

/// Seconds of an all-reduce of `elements` f32 over `ranks` local ranks: `reps` all-reduces
/// back to back after one barrier, the slowest rank's mean. Not the best of single timed
/// calls after a barrier each: when rank threads outnumber the cores (or other work shares
/// them), each collective also waits for descheduled peers.
fn all_reduce_time(ranks: usize, elements: usize, reps: usize) -> Result<f64, BenchError> {
    let cluster = LocalCluster::new(ranks)?;
    let times = cluster.run(|comm| {
        let mut buf = vec![1.0f32; elements];
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..reps {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        }
        Ok::<f64, comm::CommError>(start.elapsed().as_secs_f64() / reps as f64)
    });
    let mut worst: f64 = 0.0;
    for t in times {
        worst = worst.max(t??);
    }
    Ok(worst)
}

/// α and bandwidth of an all-reduce over `ranks` local ranks: α from a 1-element all-reduce
/// over the algorithm's steps, bandwidth from a 16 MiB one.
fn measure_link(ranks: usize) -> Result<Link, BenchError> {
    let small = all_reduce_time(ranks, 1, 200)?;
    let large_elements = 4 << 20;
    let large = all_reduce_time(ranks, large_elements, 9)?;
    let g = ranks as f64;
    let steps = 2.0 * (g - 1.0).min(g.log2().ceil());
    let alpha = small / steps;
    let moved = 2.0 * (g - 1.0) / g * (large_elements * 4) as f64;
    let bandwidth = moved / (large - steps * alpha).max(1e-9);
    Ok(Link { alpha, bandwidth })
}

/// One measurement, in the order they are made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ProfileLine {
    /// An `n × n × n` product's rate.
    Matmul {
        /// The size.
        n: usize,
        /// FLOP/s.
        flops_per_s: f64,
    },
    /// Copy bandwidth (bytes read and written per second).
    Memcpy {
        /// Bytes/s.
        bandwidth: f64,
    },
    /// The cores recorded as `compute_slots`.
    Cores(usize),
    /// An all-reduce on local ranks.
    Link {
        /// Ranks.
        ranks: usize,
        /// The measured link.
        link: Link,
    },
}

impl fmt::Display for ProfileLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileLine::Matmul { n, flops_per_s } => {
                writeln!(f, "matmul {n}×{n}×{n}: {:.2} GFLOP/s", flops_per_s / 1e9)
            }
            ProfileLine::Memcpy { bandwidth } => {
                writeln!(f, "memcpy: {:.2} GB/s (read + write)", bandwidth / 1e9)
            }
            ProfileLine::Cores(cores) => writeln!(f, "cores (compute_slots): {cores}"),
            ProfileLine::Link { ranks, link } => writeln!(
                f,
                "all-reduce on {ranks} local ranks: α {:.2} µs, bandwidth {:.2} GB/s",
                link.alpha * 1e6,
                link.bandwidth / 1e9
            ),
        }
    }
}

/// The measurements and the profile made of them (checked usable).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileReport {
    /// Every measurement, in order.
    pub lines: Pieces<ProfileLine>,
    /// The profile.
    pub profile: DeviceProfile,
}

impl fmt::Display for ProfileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.lines.fmt(f)
    }
}

/// Runs `tessera bench profile`: measures and returns the profile (not written anywhere).
pub fn profile(
    request: &ProfileRequest,
    progress: &mut dyn Progress,
) -> Result<ProfileReport, BenchError> {
    let mut lines = Pieces::default();
    let mut push = |line: ProfileLine| lines.show(progress, line);
    let mut matmul = Vec::new();
    for (i, n) in [32usize, 128, 512].into_iter().enumerate() {
        let (flops, rate) = matmul_rate(n, request.sustained)?;
        push(ProfileLine::Matmul {
            n,
            flops_per_s: rate,
        })?;
        // Class i applies from half this product's size up (the first from 0).
        let min_flops = if i == 0 { 0.0 } else { flops / 2.0 };
        matmul.push(MatmulRate {
            min_flops,
            flops_per_s: rate,
        });
    }
    let bytes = 64usize << 20;
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let t = time_call(request.sustained, 5, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        Ok(())
    })?;
    // A copy reads and writes every byte.
    let memory_bandwidth = 2.0 * bytes as f64 / t;
    push(ProfileLine::Memcpy {
        bandwidth: memory_bandwidth,
    })?;
    let cores = match request.cores {
        Some(c) => c,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    push(ProfileLine::Cores(cores))?;
    let link = measure_link(request.ranks)?;
    push(ProfileLine::Link {
        ranks: request.ranks,
        link,
    })?;
    let mut local_links = Vec::with_capacity(request.link_ranks.len());
    for &ranks in &request.link_ranks {
        let link = if ranks == request.ranks {
            link
        } else {
            let link = measure_link(ranks)?;
            push(ProfileLine::Link { ranks, link })?;
            link
        };
        local_links.push(LocalLink { ranks, link });
    }
    let profile = DeviceProfile {
        name: "cpu-local".to_string(),
        matmul,
        memory_bandwidth,
        memory_bytes: request.memory_gib << 30,
        devices_per_node: request.ranks,
        intra_node: link,
        inter_node: link,
        compute_slots: Some(cores),
        local_links,
    };
    profile.validate().map_err(BenchError::ProfileUnusable)?;
    Ok(ProfileReport { lines, profile })
}
