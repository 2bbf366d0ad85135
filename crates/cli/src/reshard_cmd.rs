//! `tessera reshard`: plan (and optionally run) moving a tensor from one layout to another.

use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use comm::{Communicator, LocalCluster};
use reshard::{DistLayout, ExchangeKind, ReduceKind, ReshardPlan};
use reshard_exec::{DistTensor, ReshardRunner};
use serde_json::{json, Value};
use tensor::{DType, Tensor};

use crate::grid::write_stdout;
use crate::parse::{parse_layout, parse_usizes};

/// Arguments of `tessera reshard`.
#[derive(Debug, Args)]
pub struct ReshardArgs {
    /// The global tensor shape, e.g. `4096,4096`.
    #[arg(long)]
    shape: String,
    /// The source mesh, `name=size,…` (outermost first).
    #[arg(long)]
    from_mesh: String,
    /// The source map: per dim an axis, `None`, or `a+b`.
    #[arg(long)]
    from: String,
    /// Explicit ranks of the source mesh.
    #[arg(long)]
    from_rank_list: Option<String>,
    /// Mark the source as a pending sum over these axes of the source mesh (`tp` or `dp+tp`).
    #[arg(long)]
    from_partial: Option<String>,
    /// The destination mesh (default: the source mesh).
    #[arg(long)]
    to_mesh: Option<String>,
    /// The destination map.
    #[arg(long)]
    to: String,
    /// Explicit ranks of the destination mesh.
    #[arg(long)]
    to_rank_list: Option<String>,
    /// Element type.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Execute the plan on the local backend (one thread per rank) and check every rank's
    /// result against the global tensor; exits non-zero on any mismatch.
    #[arg(long)]
    run: bool,
}

/// Runs `tessera reshard`.
pub fn run(args: &ReshardArgs) -> anyhow::Result<()> {
    let shape = parse_usizes(&args.shape, "--shape")?;
    let dtype: DType = args.dtype.parse()?;
    let src = parse_layout(
        &args.from_mesh,
        &[],
        &args.from,
        args.from_rank_list.as_deref(),
        &shape,
    )
    .context("the source (--from-mesh, --from)")?;
    let dst = parse_layout(
        args.to_mesh.as_deref().unwrap_or(&args.from_mesh),
        &[],
        &args.to,
        args.to_rank_list.as_deref(),
        &shape,
    )
    .context("the destination (--to-mesh, --to)")?;
    let src = match &args.from_partial {
        None => DistLayout::from(src),
        Some(axes) => {
            let axes: Vec<usize> = axes
                .split('+')
                .map(|a| src.mesh().axis_index(a.trim()))
                .collect::<Result<_, _>>()
                .context("--from-partial")?;
            DistLayout::partial(src, &axes).context("--from-partial")?
        }
    };
    let plan = reshard::plan_from(&src, &dst, dtype)?;
    let mut out = if args.json {
        let mut s = serde_json::to_string_pretty(&plan_json(&plan))?;
        s.push('\n');
        s
    } else {
        plan_text(&plan)
    };
    if args.run {
        let mismatches = run_and_check(&plan)?;
        if !args.json {
            out.push_str(&format!(
                "ran on {} local ranks: every rank holds exactly its box\n",
                world_size(&plan)
            ));
        }
        if mismatches > 0 {
            write_stdout(&out)?;
            bail!("{mismatches} rank(s) got data different from their box of the global tensor");
        }
    }
    write_stdout(&out)
}

/// Number of ranks needed to run `plan`: one past the largest rank of either mesh.
pub fn world_size(plan: &ReshardPlan) -> usize {
    let ranks = plan
        .src()
        .layout()
        .mesh()
        .device_ranks()
        .into_iter()
        .chain(plan.dst().mesh().device_ranks());
    ranks.max().map_or(1, |r| r.saturating_add(1))
}

fn region_json(b: &layout::SliceBox) -> Value {
    json!({"offset": b.offset, "shape": b.shape})
}

/// The `--json` object.
pub fn plan_json(plan: &ReshardPlan) -> Value {
    let elem = plan.dtype().size_in_bytes();
    let mut steps = Vec::new();
    if let Some(step) = plan.reduce() {
        let mesh = plan.src().layout().mesh();
        let per_member =
            step.elements_received_per_member(plan.src()) * plan.dtype().size_in_bytes();
        for group in &step.slot_groups {
            let ranks: Vec<usize> = group.iter().map(|&s| mesh.device_of_slot(s)).collect();
            let mut v = json!({
                "kind": match step.kind {
                    ReduceKind::AllReduce => "all-reduce",
                    ReduceKind::ReduceScatter { .. } => "reduce-scatter",
                },
                "ranks": ranks,
                "bytes": per_member * group.len(),
                "reason": "the source values are partial sums of one box",
            });
            if let ReduceKind::ReduceScatter { dim } = step.kind {
                v["dim"] = json!(dim);
            }
            steps.push(v);
        }
    }
    let local: Vec<Value> = plan
        .transfers()
        .filter(|t| t.is_local())
        .map(|t| json!({"rank": t.dst_rank, "region": region_json(&t.region), "bytes": t.region.n_elements() * elem}))
        .collect();
    if !local.is_empty() {
        steps.push(json!({
            "kind": "local-copy",
            "bytes": plan.bytes_local(),
            "reason": "already held by the destination rank under the source layout",
            "copies": local,
        }));
    }
    for ex in reshard::lower(plan) {
        let transfers: Vec<Value> = ex
            .transfers
            .iter()
            .map(|t| {
                json!({
                    "from": t.src_rank,
                    "to": t.dst_rank,
                    "region": region_json(&t.region),
                    "bytes": t.region.n_elements() * elem,
                })
            })
            .collect();
        steps.push(json!({
            "kind": ex.kind.to_string(),
            "ranks": ex.ranks,
            "bytes": ex.transfers.iter().map(|t| t.region.n_elements() * elem).sum::<usize>(),
            "reason": exchange_reason(ex.kind),
            "transfers": transfers,
        }));
    }
    json!({
        "bytes_total": plan.bytes_total(),
        "bytes_lower_bound": plan.bytes_lower_bound(),
        "bytes_per_rank": plan.bytes_per_rank().iter().map(|&(_, b)| b).collect::<Vec<_>>(),
        "ranks": plan.bytes_per_rank().iter().map(|&(r, _)| r).collect::<Vec<_>>(),
        "steps": steps,
    })
}

fn exchange_reason(kind: ExchangeKind) -> &'static str {
    match kind {
        ExchangeKind::AllGather => "every rank of the group needs the others' whole slices",
        ExchangeKind::AllToAll => {
            "every rank of the group needs a different equal piece of each other's slice"
        }
        ExchangeKind::PointToPoint => "each rank receives exactly the pieces of its box it lacks",
    }
}

/// The text report.
fn plan_text(plan: &ReshardPlan) -> String {
    let mut out = plan.explain();
    out.push_str("collectives:\n");
    for ex in reshard::lower(plan) {
        let bytes: usize = ex.transfers.iter().map(|t| plan.transfer_bytes(t)).sum();
        out.push_str(&format!(
            "  {} within ranks {:?}: {} B ({})\n",
            ex.kind,
            ex.ranks,
            bytes,
            exchange_reason(ex.kind)
        ));
    }
    out.push_str("bytes received per rank:\n");
    for (rank, bytes) in plan.bytes_per_rank() {
        out.push_str(&format!("  rank {rank:>4}: {bytes} B\n"));
    }
    out
}

/// A global tensor with a distinct value per element (exact in f32 up to 2^24 elements; beyond
/// that values repeat with period 2^24, which still catches misplaced blocks).
pub fn iota(shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(shape, (0..n).map(|i| (i % (1 << 24)) as f32).collect())
        .expect("the shape matches the data")
        .to_dtype(dtype)
}

/// This rank's source slices; for a partial source, member `j` of each partial group holds a
/// share such that the shares add up to the global values.
pub fn source_slices(
    plan: &ReshardPlan,
    global: &Tensor,
    rank: usize,
) -> anyhow::Result<Vec<Tensor>> {
    let src = plan.src();
    let mut local = DistTensor::from_global(global, src.layout(), rank)?.into_local();
    if src.is_partial() {
        let mesh = src.layout().mesh();
        let groups = src.partial_slot_groups();
        let slots: Vec<usize> = (0..mesh.n_slots())
            .filter(|&s| mesh.device_of_slot(s) == rank)
            .collect();
        for (t, &slot) in local.iter_mut().zip(&slots) {
            let j = groups
                .iter()
                .find_map(|g| g.iter().position(|&s| s == slot))
                .expect("every slot is in a partial group");
            if j > 0 {
                *t = Tensor::zeros(t.dtype(), t.shape());
            }
        }
    }
    Ok(local)
}

/// The most ranks `--run` starts: one thread each, on one machine.
const MAX_RUN_RANKS: usize = 4096;

/// Checks, before anything is allocated, that `--run` fits this machine: at most
/// [`MAX_RUN_RANKS`] threads, and the global tensor, every source slice and every destination
/// slice (with the expected copy it is compared against) within the memory available.
fn check_run_fits(plan: &ReshardPlan) -> anyhow::Result<()> {
    let world = world_size(plan);
    if world > MAX_RUN_RANKS {
        bail!(
            "--run: the plan needs {world} local ranks (one thread each, up to its largest rank); --run starts at most {MAX_RUN_RANKS}"
        );
    }
    let elem = plan.dtype().size_in_bytes();
    let src = plan.src().layout();
    let dst = plan.dst();
    let bytes = (|| {
        // The global values are made in f32, then converted.
        let global = src.n_elements().checked_mul(4 + elem)?;
        let sources = src.mesh().n_slots().checked_mul(src.slice_elements())?;
        let results = dst.mesh().n_slots().checked_mul(dst.slice_elements())?;
        let elements = sources.checked_add(results.checked_mul(2)?)?;
        global.checked_add(elements.checked_mul(elem)?)
    })();
    let available = memory_available();
    match (bytes, available) {
        (None, _) => bail!(
            "--run: a {:?} tensor over these meshes needs more bytes than fit in 64 bits",
            dst.shape()
        ),
        (Some(b), Some(avail)) if b > avail => bail!(
            "--run: a {:?} {} tensor over these meshes needs {b} bytes, more than the {avail} bytes of memory available",
            dst.shape(),
            plan.dtype()
        ),
        _ => Ok(()),
    }
}

/// The memory available to new allocations (`MemAvailable`, or the cgroup's room when
/// lower), or `None` when unknown.
fn memory_available() -> Option<usize> {
    runtime::host_memory().and_then(|m| usize::try_from(m.available).ok())
}

/// Runs `plan` on the local backend and counts ranks whose result differs from their box.
fn run_and_check(plan: &ReshardPlan) -> anyhow::Result<usize> {
    check_run_fits(plan)?;
    let world = world_size(plan);
    let global = iota(plan.dst().shape(), plan.dtype());
    let results = LocalCluster::new(world)?.run(|comm| -> anyhow::Result<bool> {
        let rank = comm.rank();
        let local = source_slices(plan, &global, rank)?;
        let mut runner = ReshardRunner::new(Arc::new(comm));
        let got = runner.run(plan, local)?;
        let dst = plan.dst();
        let mesh = dst.mesh();
        let slots = (0..mesh.n_slots()).filter(|&s| mesh.device_of_slot(s) == rank);
        let mut ok = true;
        for (t, slot) in got.iter().zip(slots) {
            ok &= *t == global.extract_box(&dst.slot_box(slot))?;
        }
        Ok(ok)
    });
    let mut mismatches = 0;
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                eprintln!("rank {rank}: result differs from its box of the global tensor");
                mismatches += 1;
            }
            Ok(Err(e)) => bail!("rank {rank}: {e:#}"),
            Err(e) => bail!("rank {rank}: {e}"),
        }
    }
    Ok(mismatches)
}
