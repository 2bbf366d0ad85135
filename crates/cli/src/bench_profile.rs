//! `tessera bench profile`: measures this machine as a device profile (matmul FLOP/s by shape
//! class, memcpy bandwidth, all-reduce α and bandwidth on the local backend for each of
//! `--link-ranks`, the core count as `compute_slots`) and writes it as TOML for
//! `parallel.device_profile` / `tessera plan --profile`.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use comm::{Communicator, CommunicatorExt, LocalCluster, ReduceOp};
use search::{DeviceProfile, Link, LocalLink, MatmulRate};
use tensor::{DType, Tensor};

/// Arguments of `tessera bench profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
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
    #[arg(long)]
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

/// The best of `reps` timings of `f`, seconds.
fn best_of(reps: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
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
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
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
fn matmul_rate(n: usize, sustained: bool) -> anyhow::Result<(f64, f64)> {
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
fn all_reduce_time(ranks: usize, elements: usize, reps: usize) -> anyhow::Result<f64> {
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
fn measure_link(ranks: usize) -> anyhow::Result<Link> {
    let small = all_reduce_time(ranks, 1, 200)?;
    let large_elements = 4 << 20;
    let large = all_reduce_time(ranks, large_elements, 9)?;
    let g = ranks as f64;
    let steps = 2.0 * (g - 1.0).min(g.log2().ceil());
    let alpha = small / steps;
    let moved = 2.0 * (g - 1.0) / g * (large_elements * 4) as f64;
    let bandwidth = moved / (large - steps * alpha).max(1e-9);
    println!(
        "all-reduce on {ranks} local ranks: α {:.2} µs, bandwidth {:.2} GB/s",
        alpha * 1e6,
        bandwidth / 1e9
    );
    Ok(Link { alpha, bandwidth })
}

/// Runs `tessera bench profile`.
pub fn run(args: &ProfileArgs) -> anyhow::Result<()> {
    if !(2..=64).contains(&args.ranks) {
        anyhow::bail!("--ranks {}: between 2 and 64 ranks", args.ranks);
    }
    if !(1..=1 << 20).contains(&args.memory_gib) {
        anyhow::bail!("--memory-gib {}: between 1 and 1048576", args.memory_gib);
    }
    let mut matmul = Vec::new();
    for (i, n) in [32usize, 128, 512].into_iter().enumerate() {
        let (flops, rate) = matmul_rate(n, args.sustained)?;
        println!("matmul {n}×{n}×{n}: {:.2} GFLOP/s", rate / 1e9);
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
    let t = time_call(args.sustained, 5, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        Ok(())
    })?;
    // A copy reads and writes every byte.
    let memory_bandwidth = 2.0 * bytes as f64 / t;
    println!("memcpy: {:.2} GB/s (read + write)", memory_bandwidth / 1e9);
    let mut link_ranks = args.link_ranks.clone();
    link_ranks.sort_unstable();
    link_ranks.dedup();
    if let Some(&r) = link_ranks.iter().find(|&&r| !(2..=64).contains(&r)) {
        anyhow::bail!("--link-ranks {r}: between 2 and 64 ranks");
    }
    let cores = match args.cores {
        Some(c) => c,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    println!("cores (compute_slots): {cores}");
    let link = measure_link(args.ranks)?;
    let mut local_links = Vec::with_capacity(link_ranks.len());
    for ranks in link_ranks {
        let link = if ranks == args.ranks {
            link
        } else {
            measure_link(ranks)?
        };
        local_links.push(LocalLink { ranks, link });
    }
    let profile = DeviceProfile {
        name: "cpu-local".to_string(),
        matmul,
        memory_bandwidth,
        memory_bytes: args.memory_gib << 30,
        devices_per_node: args.ranks,
        intra_node: link,
        inter_node: link,
        compute_slots: Some(cores),
        local_links,
    };
    profile
        .validate()
        .map_err(|e| anyhow::anyhow!("the measured profile is not usable: {e}"))?;
    std::fs::write(&args.out, search::device_profile::to_toml(&profile))
        .map_err(|e| anyhow::anyhow!("{}: cannot write: {e}", args.out.display()))?;
    println!("profile written to {}", args.out.display());
    Ok(())
}
