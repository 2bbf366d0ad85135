//! `tessera reshard`: plan (and optionally run) moving a tensor from one layout to another.

use anyhow::{bail, Context};
use bench::reshard_check::{self, world_size, RankCheck};
use clap::Args;
use reshard::{DistLayout, ExchangeKind, ReduceKind, ReshardError, ReshardPlan};
use serde::Serialize;
use tensor::DType;

use crate::parse::{parse_layout, parse_usizes};
use crate::stdout::write_stdout;

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
    /// The destination mesh (default: the source mesh, on the source's ranks).
    #[arg(long)]
    to_mesh: Option<String>,
    /// The destination map.
    #[arg(long)]
    to: String,
    /// Explicit ranks of the destination mesh (default: `--from-rank-list` when `--to-mesh` is
    /// not given, else ranks 0..N).
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
    // With no --to-mesh the destination is the source mesh, its rank list included: a tensor
    // re-laid out on ranks 5 and 6 stays on them unless --to-rank-list says otherwise.
    let to_rank_list = match (&args.to_mesh, &args.to_rank_list) {
        (_, Some(list)) => Some(list.as_str()),
        (None, None) => args.from_rank_list.as_deref(),
        (Some(_), None) => None,
    };
    let dst = parse_layout(
        args.to_mesh.as_deref().unwrap_or(&args.from_mesh),
        &[],
        &args.to,
        to_rank_list,
        &shape,
    )
    .context("the destination (--to-mesh, --to)")?;
    let src = match &args.from_partial {
        None => DistLayout::from(src),
        Some(axes_text) => {
            let axes: Vec<usize> = axes_text
                .split('+')
                .map(|a| src.mesh().axis_index(a.trim()))
                .collect::<Result<_, _>>()
                .context("--from-partial")?;
            // The planner takes a set of axes; a repeated one (`tp+tp`) would be dropped
            // without a word, so it is refused as the --from/--to maps refuse one.
            if let Some(twice) = axes
                .iter()
                .enumerate()
                .find(|&(i, a)| axes[..i].contains(a))
                .map(|(_, &a)| src.mesh().axis_name(a))
            {
                bail!(
                    "--from-partial {text:?}: axis {twice} is listed more than once; list each \
                     axis of the pending sum once",
                    text = axes_text
                );
            }
            DistLayout::partial(src, &axes).context("--from-partial")?
        }
    };
    // The report lists every transfer (one line, or one JSON object, each): an all-gather over
    // N ranks has N² of them, so 65536 ranks would be 4·10⁹ lines built in memory. The planner
    // counts them first and refuses such a plan before making it (making it took minutes).
    let plan = match reshard::plan_from_within(&src, &dst, dtype, MAX_LISTED_TRANSFERS) {
        Ok(plan) => plan,
        Err(ReshardError::TooManyTransfers {
            n_transfers,
            src_devices,
            dst_devices,
            ..
        }) => bail!(
            "the plan has {n_transfers} transfers (between {src_devices} source and \
             {dst_devices} destination ranks), more than the {MAX_LISTED_TRANSFERS} this command \
             lists one by one: use fewer ranks in --from-mesh/--to-mesh, or a layout pair that \
             moves less"
        ),
        Err(e) => return Err(e.into()),
    };
    let mut out = if args.json {
        plan_json_text(&plan)?
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

/// The `--json` document, serialized as it is written: every transfer is made into text from
/// the plan's own data, with no `serde_json::Value` per transfer (at the listing bound those
/// took 13.7 GB and over two minutes). Field names are listed in sorted order, the order
/// `serde_json` writes the keys of a `Value` object, so the text is what serialising the
/// equivalent `Value` gives.
#[derive(Serialize)]
struct PlanJson {
    bytes_lower_bound: usize,
    bytes_per_rank: Vec<usize>,
    bytes_total: usize,
    ranks: Vec<usize>,
    steps: Vec<StepJson>,
}

/// A step of [`PlanJson`]: a reduction (`dim` for a reduce-scatter), the local copies
/// (`copies`) or an exchange (`transfers`).
#[derive(Serialize)]
struct StepJson {
    bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    copies: Option<Vec<CopyJson>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dim: Option<usize>,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ranks: Option<Vec<usize>>,
    reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    transfers: Option<Vec<TransferJson>>,
}

/// A local copy in [`StepJson::copies`].
#[derive(Serialize)]
struct CopyJson {
    bytes: usize,
    rank: usize,
    #[serde(serialize_with = "region_json")]
    region: layout::SliceBox,
}

/// A network transfer in [`StepJson::transfers`].
#[derive(Serialize)]
struct TransferJson {
    bytes: usize,
    from: usize,
    #[serde(serialize_with = "region_json")]
    region: layout::SliceBox,
    to: usize,
}

/// A region as `{"offset": […], "shape": […]}`.
fn region_json<S: serde::Serializer>(b: &layout::SliceBox, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Region<'a> {
        offset: &'a [usize],
        shape: &'a [usize],
    }
    Region {
        offset: &b.offset,
        shape: &b.shape,
    }
    .serialize(s)
}

/// The `--json` text, with its final newline.
fn plan_json_text(plan: &ReshardPlan) -> anyhow::Result<String> {
    let mut s = serde_json::to_string_pretty(&plan_json(plan))?;
    s.push('\n');
    Ok(s)
}

/// The `--json` document.
fn plan_json(plan: &ReshardPlan) -> PlanJson {
    let elem = plan.dtype().size_in_bytes();
    let mut steps = Vec::new();
    if let Some(step) = plan.reduce() {
        let mesh = plan.src().layout().mesh();
        let per_member =
            step.elements_received_per_member(plan.src()) * plan.dtype().size_in_bytes();
        for group in &step.slot_groups {
            steps.push(StepJson {
                bytes: per_member * group.len(),
                copies: None,
                dim: match step.kind {
                    ReduceKind::AllReduce => None,
                    ReduceKind::ReduceScatter { dim } => Some(dim),
                },
                kind: step.kind.name(),
                ranks: Some(group.iter().map(|&s| mesh.device_of_slot(s)).collect()),
                reason: "the source values are partial sums of one box",
                transfers: None,
            });
        }
    }
    let local: Vec<CopyJson> = plan
        .transfers()
        .filter(|t| t.is_local())
        .map(|t| CopyJson {
            bytes: t.region.n_elements() * elem,
            rank: t.dst_rank,
            region: t.region,
        })
        .collect();
    if !local.is_empty() {
        steps.push(StepJson {
            bytes: plan.bytes_local(),
            copies: Some(local),
            dim: None,
            kind: "local-copy",
            ranks: None,
            reason: "already held by the destination rank under the source layout",
            transfers: None,
        });
    }
    for ex in reshard::lower(plan) {
        let transfers: Vec<TransferJson> = ex
            .transfers
            .into_iter()
            .map(|t| TransferJson {
                bytes: t.region.n_elements() * elem,
                from: t.src_rank,
                region: t.region,
                to: t.dst_rank,
            })
            .collect();
        steps.push(StepJson {
            bytes: transfers.iter().map(|t| t.bytes).sum(),
            copies: None,
            dim: None,
            kind: ex.kind.name(),
            ranks: Some(ex.ranks),
            reason: exchange_reason(ex.kind),
            transfers: Some(transfers),
        });
    }
    let per_rank = plan.bytes_per_rank();
    PlanJson {
        bytes_lower_bound: plan.bytes_lower_bound(),
        bytes_per_rank: per_rank.iter().map(|&(_, b)| b).collect(),
        bytes_total: plan.bytes_total(),
        ranks: per_rank.iter().map(|&(r, _)| r).collect(),
        steps,
    }
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

/// The most transfers a report lists (about 100 bytes of text each).
const MAX_LISTED_TRANSFERS: usize = 1 << 22;

/// The most ranks `--run` starts: one thread each, on one machine.
const MAX_RUN_RANKS: usize = 4096;

/// Checks, before anything is allocated, that `--run` fits this machine: at most
/// [`MAX_RUN_RANKS`] threads, and the global tensor, every source slice and every destination
/// slice (with the expected copy it is compared against) within the memory available.
fn check_run_fits(plan: &ReshardPlan) -> anyhow::Result<()> {
    check_sum_groups_span_devices(plan)?;
    let world = world_size(plan);
    if world > MAX_RUN_RANKS {
        bail!(
            "--run: the plan needs {world} local ranks (one thread each, up to its largest rank); --run starts at most {MAX_RUN_RANKS}"
        );
    }
    let dst = plan.dst();
    let bytes = reshard_check::run_bytes(plan);
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

/// Refuses, before any rank starts, a pending sum whose group puts two of its parts on one
/// device (a sum over an interleaved axis): the executor adds one part per device, so such a
/// run failed on its first rank only after the global tensor and every slice were allocated.
fn check_sum_groups_span_devices(plan: &ReshardPlan) -> anyhow::Result<()> {
    let Some(step) = plan.reduce() else {
        return Ok(());
    };
    let mesh = plan.src().layout().mesh();
    for group in &step.slot_groups {
        let mut devices: Vec<usize> = group.iter().map(|&s| mesh.device_of_slot(s)).collect();
        devices.sort_unstable();
        if let Some(pair) = devices.windows(2).find(|pair| pair[0] == pair[1]) {
            bail!(
                "--run: the source {} is a pending sum over an interleaved axis: device {} holds \
                 two parts of one sum, and the executor adds one part per device; a pending sum \
                 must be over axes whose parts lie on different devices",
                plan.src(),
                pair[0]
            );
        }
    }
    Ok(())
}

/// The memory available to new allocations (`MemAvailable`, or the cgroup's room when
/// lower), or `None` when unknown.
fn memory_available() -> Option<usize> {
    runtime::host_memory().and_then(|m| usize::try_from(m.available).ok())
}

/// Runs `plan` on the local backend and counts ranks whose result differs from their box.
fn run_and_check(plan: &ReshardPlan) -> anyhow::Result<usize> {
    check_run_fits(plan)?;
    let mut mismatches = 0;
    for (rank, outcome) in reshard_check::run_and_check(plan)?.into_iter().enumerate() {
        match outcome {
            RankCheck::Matches => {}
            RankCheck::Differs => {
                eprintln!("rank {rank}: result differs from its box of the global tensor");
                mismatches += 1;
            }
            RankCheck::Failed(e) => bail!("rank {rank}: {:#}", anyhow::Error::from(e)),
            RankCheck::Panicked(e) => bail!("rank {rank}: {e}"),
        }
    }
    Ok(mismatches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn region_value(b: &layout::SliceBox) -> Value {
        json!({"offset": &b.offset[..], "shape": &b.shape[..]})
    }

    /// The `--json` document as it was built before, one `Value` per transfer: the reference
    /// the serialized structs must match byte for byte.
    fn plan_value(plan: &ReshardPlan) -> Value {
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
            .map(|t| json!({"rank": t.dst_rank, "region": region_value(&t.region), "bytes": t.region.n_elements() * elem}))
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
                        "region": region_value(&t.region),
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

    /// `--json` writes, byte for byte, what serializing one `Value` per transfer wrote: every
    /// kind of step (all-reduce, reduce-scatter with its dim, local copies, all-gather,
    /// all-to-all, point-to-point).
    #[test]
    fn the_json_listing_is_the_value_it_replaced() {
        let layout = |mesh: &str, map: &str, shape: &[usize]| {
            parse_layout(mesh, &[], map, None, shape).unwrap()
        };
        let partial = |mesh: &str, map: &str, axes: &[usize], shape: &[usize]| {
            DistLayout::partial(layout(mesh, map, shape), axes).unwrap()
        };
        let cases: Vec<(DistLayout, layout::TensorLayout)> = vec![
            (
                layout("dp=2,tp=2", "dp,tp", &[8, 8]).into(),
                layout("dp=2,tp=2", "tp,dp", &[8, 8]),
            ),
            (
                layout("dp=4", "dp,None", &[8, 12]).into(),
                layout("dp=4", "None,None", &[8, 12]),
            ),
            (
                layout("dp=4", "dp,None", &[8, 12]).into(),
                layout("dp=4", "None,dp", &[8, 12]),
            ),
            (
                layout("a=2,b=3", "None,a+b", &[8, 12]).into(),
                layout("p=3,q=2", "q,p", &[8, 12]),
            ),
            (layout("a=2", "a", &[12]).into(), layout("b=3", "b", &[12])),
            (
                partial("dp=2,tp=2", "dp,None", &[1], &[8, 8]),
                layout("dp=2,tp=2", "dp,tp", &[8, 8]),
            ),
            (
                partial("dp=2,tp=2", "dp,None", &[1], &[8, 8]),
                layout("dp=2,tp=2", "None,None", &[8, 8]),
            ),
        ];
        let mut kinds = std::collections::BTreeSet::new();
        for (src, dst) in cases {
            let plan = reshard::plan_from(&src, &dst, DType::F32).unwrap();
            let mut want = serde_json::to_string_pretty(&plan_value(&plan)).unwrap();
            want.push('\n');
            assert_eq!(plan_json_text(&plan).unwrap(), want, "{src} to {dst}");
            let v: Value = serde_json::from_str(&want).unwrap();
            for step in v["steps"].as_array().unwrap() {
                kinds.insert(step["kind"].as_str().unwrap().to_string());
            }
        }
        let all = [
            "all-gather",
            "all-reduce",
            "all-to-all",
            "local-copy",
            "point-to-point",
            "reduce-scatter",
        ];
        assert_eq!(kinds.into_iter().collect::<Vec<_>>(), all);
    }
}
