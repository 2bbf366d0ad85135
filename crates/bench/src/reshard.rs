//! `tessera bench reshard`: time and bytes of resharding one tensor between every pair of a set
//! of layouts on a 2×2 mesh, on the local backend.
//!
//! The layouts are written in DTensor's placement notation, one placement per mesh dim:
//! `(S0,S1)` means mesh dim 0 shards tensor dim 0 and mesh dim 1 shards tensor dim 1; `R`
//! replicates. Each pair is planned once and run `reps` times; a run is timed on every rank from
//! a barrier to the end of its part, and the slowest rank counts. Destination buffers are
//! allocated once and reused, as in a training step.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm::{Communicator, LocalCluster};
use layout::{DimSpec, Layout, TensorLayout};
use reshard_exec::ReshardRunner;
use tensor::DType;

use crate::reshard_check::{iota, source_slices};
use crate::timing::{human_bytes, ms};
use crate::{BenchError, Progress};

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReshardRequest {
    /// The tensor shape (2-D).
    pub shape: Vec<usize>,
    /// Timed runs per pair.
    pub reps: usize,
}

/// The placements benchmarked, as (name, map over mesh `a=2,b=2`).
pub const PLACEMENTS: [(&str, &str); 6] = [
    ("(S0,S0)", "a+b,None"),
    ("(S1,S1)", "None,a+b"),
    ("(S0,S1)", "a,b"),
    ("(R,S1)", "None,b"),
    ("(S0,R)", "a,None"),
    ("(R,R)", "None,None"),
];

/// The report's header: the tensor, and the columns.
struct Header<'a> {
    shape: &'a [usize],
    reps: usize,
}

impl fmt::Display for Header<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n_bytes: usize = self.shape.iter().product::<usize>() * 4;
        writeln!(
            f,
            "reshard of a {:?} f32 tensor ({}) on a 2x2 mesh, local backend, {} runs per pair",
            self.shape,
            human_bytes(n_bytes),
            self.reps
        )?;
        writeln!(
            f,
            "{:>8} -> {:<8} {:>12} {:>12} {:>10}  {:>22}",
            "from", "to", "bytes moved", "lower bound", "ms median", "[min-max]"
        )
    }
}

/// One pair of placements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReshardRow {
    /// The source placement's name (`(S0,R)`).
    pub from: &'static str,
    /// The destination placement's name.
    pub to: &'static str,
    /// Bytes the plan moves.
    pub bytes_total: usize,
    /// The lower bound of bytes any plan moves.
    pub bytes_lower_bound: usize,
    /// Each run's time (the slowest rank's), fastest first.
    pub times: Vec<Duration>,
}

impl fmt::Display for ReshardRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.times;
        writeln!(
            f,
            "{:>8} -> {:<8} {:>12} {:>12} {:>10.2}  [{:>8.2}-{:>8.2}]",
            self.from,
            self.to,
            self.bytes_total,
            self.bytes_lower_bound,
            ms(t[t.len() / 2]),
            ms(t[0]),
            ms(t[t.len() - 1])
        )
    }
}

/// Every pair's bytes and times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReshardReport {
    /// The tensor shape.
    pub shape: Vec<usize>,
    /// Timed runs per pair.
    pub reps: usize,
    /// One row per (source, destination) pair, in [`PLACEMENTS`] order.
    pub rows: Vec<ReshardRow>,
}

impl fmt::Display for ReshardReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Header {
            shape: &self.shape,
            reps: self.reps,
        }
        .fmt(f)?;
        self.rows.iter().try_for_each(|row| row.fmt(f))
    }
}

/// The layout of `map` over the mesh `a=2,b=2`, bound to `shape`.
fn layout(map: &str, shape: &[usize]) -> Result<TensorLayout, BenchError> {
    let dims: Vec<DimSpec> = map.split(',').map(|e| DimSpec::parse(e.trim())).collect();
    let layout = Layout::new(&[2, 2], &["a", "b"], None)?.apply(&dims)?;
    layout.bind(shape).map_err(BenchError::LayoutForShape)
}

/// Runs `tessera bench reshard`.
pub fn reshard(
    request: &ReshardRequest,
    progress: &mut dyn Progress,
) -> Result<ReshardReport, BenchError> {
    let shape = &request.shape;
    let reps = request.reps;
    progress.piece(&Header { shape, reps });
    let mut report = ReshardReport {
        shape: shape.clone(),
        reps,
        rows: Vec::new(),
    };
    let cluster = LocalCluster::new(4)?;
    for (from_name, from_map) in PLACEMENTS {
        for (to_name, to_map) in PLACEMENTS {
            crate::go_on(progress)?;
            let src = layout(from_map, shape)?;
            let dst = layout(to_map, shape)?;
            let plan = reshard::plan(&src, &dst, DType::F32)?;
            let global = iota(shape, DType::F32);
            let times = cluster.run(|comm| -> Result<Vec<Duration>, BenchError> {
                let rank = comm.rank();
                let world: Arc<dyn Communicator> = Arc::new(comm);
                let mut runner = ReshardRunner::new(world.clone());
                let local = source_slices(&plan, &global, rank)?;
                let inputs: Vec<&tensor::Tensor> = local.iter().collect();
                // The destination buffers are allocated once, as a training step reuses them.
                let mut out = runner.run(&plan, local.clone())?;
                let mut times = Vec::with_capacity(reps);
                for _ in 0..reps {
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
                .map(|r| r?)
                .collect::<Result<_, BenchError>>()?;
            let mut slowest: Vec<Duration> = (0..reps)
                .map(|i| per_rank.iter().map(|t| t[i]).max().unwrap_or_default())
                .collect();
            slowest.sort_unstable();
            let row = ReshardRow {
                from: from_name,
                to: to_name,
                bytes_total: plan.bytes_total(),
                bytes_lower_bound: plan.bytes_lower_bound(),
                times: slowest,
            };
            progress.piece(&row);
            report.rows.push(row);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Record;

    #[test]
    fn every_pair_is_reported_as_it_is_measured() {
        let request = ReshardRequest {
            shape: vec![8, 8],
            reps: 1,
        };
        let mut shown = Record::default();
        let report = reshard(&request, &mut shown).unwrap();
        assert_eq!(report.rows.len(), PLACEMENTS.len() * PLACEMENTS.len());
        assert_eq!(shown.0, report.to_string());
        let pair = &report.rows[1];
        assert_eq!((pair.from, pair.to), ("(S0,S0)", "(S1,S1)"));
        assert_eq!(pair.bytes_total, 192);
        assert!(shown.0.starts_with(
            "reshard of a [8, 8] f32 tensor (256 B) on a 2x2 mesh, local backend, 1 runs per pair\n"
        ));
    }

    #[test]
    fn a_shape_the_layouts_do_not_divide_is_refused() {
        let request = ReshardRequest {
            shape: vec![3, 3],
            reps: 1,
        };
        let err = reshard(&request, &mut crate::Silent).unwrap_err();
        assert!(matches!(err, BenchError::LayoutForShape(_)), "{err}");
    }
}
