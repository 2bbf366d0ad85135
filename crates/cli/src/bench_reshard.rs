//! `tessera bench reshard`: time and bytes of resharding one tensor between every pair of a set
//! of layouts on a 2×2 mesh, on the local backend.
//!
//! The layouts are written in DTensor's placement notation, one placement per mesh dim:
//! `(S0,S1)` means mesh dim 0 shards tensor dim 0 and mesh dim 1 shards tensor dim 1; `R`
//! replicates. Each pair is planned once and run `reps` times; a run is timed on every rank from
//! a barrier to the end of its part, and the slowest rank counts. Destination buffers are
//! allocated once and reused, as in a training step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use comm::{Communicator, LocalCluster};
use reshard_exec::ReshardRunner;
use tensor::DType;

use crate::bench_cmd::human_bytes;
use crate::parse::{parse_layout, parse_usizes};
use crate::reshard_cmd::{iota, source_slices};

/// Arguments of `tessera bench reshard`.
#[derive(Debug, Args)]
pub struct ReshardBenchArgs {
    /// The tensor shape (2-D).
    #[arg(long, default_value = "4096,4096")]
    shape: String,
    /// Timed runs per pair.
    #[arg(long, default_value_t = 7)]
    reps: usize,
}

/// The placements benchmarked, as (name, map over mesh `a=2,b=2`).
const PLACEMENTS: [(&str, &str); 6] = [
    ("(S0,S0)", "a+b,None"),
    ("(S1,S1)", "None,a+b"),
    ("(S0,S1)", "a,b"),
    ("(R,S1)", "None,b"),
    ("(S0,R)", "a,None"),
    ("(R,R)", "None,None"),
];

/// Runs the benchmark.
pub fn run(args: &ReshardBenchArgs) -> anyhow::Result<()> {
    let shape = parse_usizes(&args.shape, "--shape")?;
    let n_bytes: usize = shape.iter().product::<usize>() * 4;
    println!(
        "reshard of a {:?} f32 tensor ({}) on a 2x2 mesh, local backend, {} runs per pair",
        shape,
        human_bytes(n_bytes),
        args.reps
    );
    println!(
        "{:>8} -> {:<8} {:>12} {:>12} {:>10}  {:>22}",
        "from", "to", "bytes moved", "lower bound", "ms median", "[min-max]"
    );
    let cluster = LocalCluster::new(4)?;
    for (from_name, from_map) in PLACEMENTS {
        for (to_name, to_map) in PLACEMENTS {
            let src = parse_layout("a=2,b=2", &[], from_map, None, &shape)?;
            let dst = parse_layout("a=2,b=2", &[], to_map, None, &shape)?;
            let plan = reshard::plan(&src, &dst, DType::F32)?;
            let global = iota(&shape, DType::F32);
            let times = cluster.run(|comm| -> anyhow::Result<Vec<Duration>> {
                let rank = comm.rank();
                let world: Arc<dyn Communicator> = Arc::new(comm);
                let mut runner = ReshardRunner::new(world.clone());
                let local = source_slices(&plan, &global, rank)?;
                let inputs: Vec<&tensor::Tensor> = local.iter().collect();
                // The destination buffers are allocated once, as a training step reuses them.
                let mut out = runner.run(&plan, local.clone())?;
                let mut times = Vec::with_capacity(args.reps);
                for _ in 0..args.reps {
                    world.barrier()?;
                    let start = Instant::now();
                    runner.run_into(&plan, &inputs, &mut out)?;
                    times.push(start.elapsed());
                }
                std::hint::black_box(&out);
                Ok(times)
            });
            let per_rank: Vec<Vec<Duration>> = times
                .into_iter()
                .map(|r| r.map_err(anyhow::Error::from).and_then(|x| x))
                .collect::<anyhow::Result<_>>()?;
            let mut slowest: Vec<Duration> = (0..args.reps)
                .map(|i| per_rank.iter().map(|t| t[i]).max().unwrap_or_default())
                .collect();
            slowest.sort_unstable();
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            println!(
                "{:>8} -> {:<8} {:>12} {:>12} {:>10.2}  [{:>8.2}-{:>8.2}]",
                from_name,
                to_name,
                plan.bytes_total(),
                plan.bytes_lower_bound(),
                ms(slowest[slowest.len() / 2]),
                ms(slowest[0]),
                ms(slowest[slowest.len() - 1])
            );
        }
    }
    Ok(())
}
