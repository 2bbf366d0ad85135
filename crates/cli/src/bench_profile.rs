//! `tessera bench profile`: measures this machine as a device profile (matmul FLOP/s by shape
//! class, memcpy bandwidth, all-reduce α and bandwidth on the local backend) and writes it as
//! TOML for `parallel.device_profile` / `tessera plan --profile`.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use comm::{Communicator, CommunicatorExt, LocalCluster, ReduceOp};
use parallel::search::{DeviceProfile, Link, MatmulRate};
use tensor::{DType, Tensor};

/// Arguments of `tessera bench profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// Where to write the profile.
    #[arg(long, default_value = "cpu-local.toml")]
    out: PathBuf,
    /// Ranks (threads) of the collective measurement; also the profile's devices per node.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
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

/// FLOP/s of an `n × n × n` f32 product.
fn matmul_rate(n: usize) -> anyhow::Result<(f64, f64)> {
    let a = Tensor::zeros(DType::F32, &[n, n]);
    let b = Tensor::zeros(DType::F32, &[n, n]);
    let flops = 2.0 * (n as f64).powi(3);
    let reps = (2e9 / flops).clamp(3.0, 200.0) as usize;
    let t = best_of(reps, || {
        tensor::kernels::matmul::matmul(&a, &b, false, false)?;
        Ok(())
    })?;
    Ok((flops, flops / t))
}

/// Seconds of an all-reduce of `elements` f32 over `ranks` local ranks (best of `reps`).
fn all_reduce_time(ranks: usize, elements: usize, reps: usize) -> anyhow::Result<f64> {
    let cluster = LocalCluster::new(ranks)?;
    let times = cluster.run(|comm| {
        let mut buf = vec![1.0f32; elements];
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            comm.barrier()?;
            let start = Instant::now();
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok::<f64, comm::CommError>(best)
    });
    let mut worst: f64 = 0.0;
    for t in times {
        worst = worst.max(t??);
    }
    Ok(worst)
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
        let (flops, rate) = matmul_rate(n)?;
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
    let t = best_of(5, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        Ok(())
    })?;
    // A copy reads and writes every byte.
    let memory_bandwidth = 2.0 * bytes as f64 / t;
    println!("memcpy: {:.2} GB/s (read + write)", memory_bandwidth / 1e9);
    let small = all_reduce_time(args.ranks, 1, 200)?;
    let large_elements = 4 << 20;
    let large = all_reduce_time(args.ranks, large_elements, 5)?;
    let g = args.ranks as f64;
    let steps = 2.0 * (g - 1.0).min(g.log2().ceil());
    let alpha = small / steps;
    let moved = 2.0 * (g - 1.0) / g * (large_elements * 4) as f64;
    let bandwidth = moved / (large - steps * alpha).max(1e-9);
    println!(
        "all-reduce on {} local ranks: α {:.2} µs, bandwidth {:.2} GB/s",
        args.ranks,
        alpha * 1e6,
        bandwidth / 1e9
    );
    let link = Link { alpha, bandwidth };
    let profile = DeviceProfile {
        name: "cpu-local".to_string(),
        matmul,
        memory_bandwidth,
        memory_bytes: args.memory_gib << 30,
        devices_per_node: args.ranks,
        intra_node: link,
        inter_node: link,
    };
    profile
        .validate()
        .map_err(|e| anyhow::anyhow!("the measured profile is not usable: {e}"))?;
    std::fs::write(&args.out, runtime::device_profile::to_toml(&profile))
        .map_err(|e| anyhow::anyhow!("{}: cannot write: {e}", args.out.display()))?;
    println!("profile written to {}", args.out.display());
    Ok(())
}
