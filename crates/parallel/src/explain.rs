//! `tessera train --explain`: a program as text — every op's strategy, every inserted
//! communication with its reason and bytes, the parameters' layouts and the pipeline stages.

use std::fmt::Write as _;

use graph::Op;
use reshard::ReshardPlan;

use crate::assign::{NodePlacement, StrategySource};
use crate::error::format_strategy;
use crate::hsdp::{OptimizerShard, ShardDecision};
use crate::lower::{Program, Step};

impl Program {
    /// The pipeline section of [`Program::explain`]: each stage's ranks and the layers (cells)
    /// it runs ([`crate::pipeline::NodeStages::layers`]: a cell with a call raised to a later
    /// stage is named under both stages), and the bytes sent between stages per step.
    fn explain_stages(&self, p: &crate::pipeline::PipelineConfig, out: &mut String) {
        let Ok(stages) = crate::pipeline::node_stages(&self.placed.graph, p) else {
            return;
        };
        let per_stage = self.devices() / p.stages.max(1);
        let _ = writeln!(
            out,
            "\npipeline: {} stages of {per_stage} ranks, {} micro-batch(es) per step, scheduler {}",
            p.stages,
            p.micro_batches,
            p.scheduler.name()
        );
        // A backward costs about two forwards; zero bubble runs it as two halves.
        let durations = match p.scheduler {
            crate::pipeline::Scheduler::ZeroBubble => {
                crate::pipeline::Durations::uniform(1.0, 1.0, 1.0)
            }
            _ => crate::pipeline::Durations::uniform(1.0, 2.0, 0.0),
        };
        if let Ok(report) = crate::pipeline::Schedule::generate(p)
            .and_then(|schedule| crate::pipeline::simulate(&schedule, &durations))
        {
            let _ = writeln!(
                out,
                "  predicted bubble {:.1} % (equal stages; a backward twice a forward); micro-batches held at once, per stage: {:?}",
                report.bubble_fraction * 100.0,
                report.peak_retained
            );
        }
        for s in 0..p.stages {
            let layers = crate::pipeline::layers_of_stage(&stages.layers, s);
            let _ = writeln!(
                out,
                "  stage {s}: ranks {}..{}: {}",
                s * per_stage,
                (s + 1) * per_stage,
                layers.join(", ")
            );
        }
        let crossing: usize = self
            .steps
            .iter()
            .filter_map(|step| match step {
                Step::Reshard(r) => {
                    let (from, to) = (r.plan.src().layout().mesh(), r.plan.dst().mesh());
                    let first = |m: &layout::Mesh| m.rank_list().first().copied().unwrap_or(0);
                    let whole = |m: &layout::Mesh| m.n_slots() == self.devices();
                    (!whole(from) && !whole(to) && first(from) != first(to))
                        .then(|| r.plan.bytes_total())
                }
                Step::Kernel(_) => None,
            })
            .sum();
        let _ = writeln!(
            out,
            "  between stages: {crossing} bytes per step (point-to-point)"
        );
    }

    /// Every op's strategy and every inserted communication with its reason and bytes per step.
    pub fn explain(&self) -> String {
        self.explain_with(None)
    }

    /// [`Program::explain`] for a run in deterministic mode (`Some(max canonical blocks)`): the
    /// header says so and every pending sum is marked as the deterministic collective it runs as.
    pub fn explain_with(&self, deterministic: Option<usize>) -> String {
        let graph = &self.placed.graph;
        let mut out = String::new();
        if let Some(blocks) = deterministic {
            let _ = writeln!(
                out,
                "deterministic mode: every summed dim in at most {blocks} canonical blocks; pending \
                 sums added in the canonical tree over ranks"
            );
        }
        let _ = writeln!(
            out,
            "mode {} on {} device(s); {} steps, {} reshards, {} bytes moved per training step",
            self.placed.config.mode.name(),
            self.devices(),
            self.steps.len(),
            self.reshard_count(),
            self.bytes_per_step()
        );
        if let Some(p) = self
            .placed
            .config
            .pipeline
            .as_ref()
            .filter(|p| p.stages > 1)
        {
            self.explain_stages(p, &mut out);
        }
        let _ = writeln!(out, "\nparameters:");
        for p in &self.params {
            // The layout the parameter's consumers need (under hsdp levels 1–3 its buffer holds less).
            let layout = p.strategy_layout();
            let slice = match layout.row_split() {
                Some(rows) => format!("rows {rows:?} × {:?}", &layout.slice_shape()[1..]),
                None => format!("{:?}", layout.slice_shape()),
            };
            let _ = writeln!(
                out,
                "  {:<20} {:?} as {} over {} (slice {slice}, {} copies)",
                p.name,
                layout.shape(),
                layout.layout().describe_map(),
                layout.mesh(),
                layout.replica_count()
            );
            match &p.hsdp {
                Some(ShardDecision::Sharded(shard)) => {
                    let accumulates = self.placed.config.hsdp.is_some_and(|h| h.accumulates);
                    let what = describe_shard(shard, accumulates);
                    let _ = writeln!(
                        out,
                        "  {:<20} hsdp {}: optimizer shard {} (slice {:?}), dim 0 over groups of {} ranks (step {}): {what}",
                        "",
                        shard.level.name(),
                        shard.layout.layout().describe_map(),
                        shard.layout.slice_shape(),
                        shard.size,
                        shard.step
                    );
                }
                Some(decision) => {
                    let why = decision.why_whole().unwrap_or_default();
                    let _ = writeln!(out, "  {:<20} hsdp: not sharded: {why}", "");
                }
                None => {}
            }
        }
        let _ = writeln!(out, "\nsteps:");
        for step in &self.steps {
            match step {
                Step::Kernel(k) => {
                    let node = &graph.nodes()[k.node.0];
                    let place = &self.placed.nodes[k.node.0];
                    let again = if k.recompute { " (recomputed)" } else { "" };
                    let _ = writeln!(
                        out,
                        "  {}{again}",
                        describe_node(node.name.as_str(), &node.op, place)
                    );
                    if let Some(t) = crate::ring::ring_traffic(self, k) {
                        let (balance, moved) = if t.gathered {
                            (", deterministic: operands gathered whole", String::new())
                        } else if t.zigzag_bytes_per_ring > 0 {
                            (
                                ", zigzag-balanced",
                                format!(
                                    ", {} B per ring to the zigzag placement and back",
                                    t.zigzag_bytes_per_ring
                                ),
                            )
                        } else {
                            ("", String::new())
                        };
                        let _ = writeln!(
                            out,
                            "    -> ring attention over {} ranks ({} ring{}{balance}): {} pass{} of {} ({} B/step, {} B per rank in the passes{moved})",
                            t.members,
                            t.rings,
                            if t.rings == 1 { "" } else { "s" },
                            t.passes,
                            if t.passes == 1 { "" } else { "es" },
                            match (matches!(k.op, graph::Op::FlashAttentionGrad { .. }), t.gathered) {
                                (false, _) => "key/value blocks",
                                (true, false) => "key/value blocks and their gradients",
                                (true, true) => "query, key, value and output-gradient blocks",
                            },
                            t.bytes_total(),
                            t.bytes_per_rank
                        );
                        if let Some(bytes) = crate::ring::ring_workspace_bytes_max(self, k) {
                            let _ = writeln!(
                                out,
                                "       working blocks: up to {bytes} B per rank while it runs"
                            );
                        }
                    }
                }
                Step::Reshard(r) => {
                    let plan = &r.plan;
                    let what = describe_plan_with(plan, deterministic.is_some());
                    let _ = writeln!(
                        out,
                        "    -> reshard {}: {} ({} B/step): {}",
                        graph.values()[r.value.0].name,
                        what,
                        plan.bytes_total(),
                        r.reason
                    );
                }
            }
        }
        let reuse = &self.plan_reuse;
        let _ = writeln!(
            out,
            "\ncommunication plans: {} distinct for {} communications (parallel.comm_reuse)",
            reuse.distinct, reuse.total
        );
        if !self.buckets.is_empty() {
            let _ = writeln!(
                out,
                "\ngradient buckets (parallel.comm_fusion), in the order they run:"
            );
            for (i, b) in self.buckets.iter().enumerate() {
                let names: Vec<&str> = b
                    .params
                    .iter()
                    .map(|&p| self.params[p].name.as_str())
                    .collect();
                let after = match &self.steps[b.ready_after] {
                    Step::Kernel(k) => k.name.clone(),
                    Step::Reshard(r) => format!("reshard of {}", graph.values()[r.value.0].name),
                };
                let _ = writeln!(
                    out,
                    "  bucket {i}: one {} of {} B ({} gradients) after {after}: {}",
                    if b.scatter {
                        "reduce-scatter"
                    } else {
                        "all-reduce"
                    },
                    b.bytes,
                    b.params.len(),
                    names.join(", ")
                );
            }
        }
        if !self.weight_gathers.is_empty() {
            let _ = writeln!(out, "\nafter the optimizer update:");
            for g in &self.weight_gathers {
                let _ = writeln!(
                    out,
                    "    -> gather {}: {} ({} B/step): hsdp: the updated pieces become the whole weight",
                    self.params[g.param].name,
                    describe_plan(&g.plan),
                    g.plan.bytes_total()
                );
            }
            for (i, b) in self.gather_buckets.iter().enumerate() {
                let names: Vec<&str> = b
                    .gathers
                    .iter()
                    .map(|&g| self.params[self.weight_gathers[g].param].name.as_str())
                    .collect();
                let _ = writeln!(
                    out,
                    "    gather bucket {i} (parallel.comm_fusion allgather): one all-gather of {} B per rank over each of {} groups replaces the gathers of {}",
                    b.bytes,
                    b.groups.len(),
                    names.join(", ")
                );
            }
        }
        out
    }
}

fn describe_node(name: &str, op: &Op, place: &NodePlacement) -> String {
    let source = match &place.source {
        StrategySource::User => "user".to_string(),
        StrategySource::Default => "default".to_string(),
        StrategySource::Backward(f) => format!("backward of node {}", f.0),
        StrategySource::Gradient => "gradient".to_string(),
    };
    let strategy = place
        .strategy
        .as_ref()
        .map(|s| format!(" strategy {}", format_strategy(s)))
        .unwrap_or_default();
    let outputs: Vec<String> = place
        .outputs
        .iter()
        .map(|o| {
            let mut s = o.layout().layout().describe_map();
            if o.is_partial() {
                let axes: Vec<&str> = o
                    .partial_axes()
                    .iter()
                    .map(|&a| o.layout().mesh().axis_name(a))
                    .collect();
                s.push_str(&format!(
                    " pending {} over {}",
                    o.pending_op().name(),
                    axes.join("+")
                ));
            }
            s
        })
        .collect();
    format!(
        "{name} ({}){strategy} [{source}] on {}: -> {}",
        op.kind(),
        place.mesh(),
        outputs.join(", ")
    )
}

/// The collective resolving a pending value: `all-reduce`, `reduce-scatter along dim 1`; sums are
/// the common case and go unnamed, other reductions say which they are (`all-reduce (max)`).
pub(crate) fn describe_reduce(step: &reshard::ReduceStep) -> String {
    let op = match step.op {
        reshard::PendingOp::Sum => String::new(),
        other => format!(" ({})", other.name()),
    };
    match step.kind {
        reshard::ReduceKind::AllReduce => format!("all-reduce{op}"),
        reshard::ReduceKind::ReduceScatter { dim } => {
            format!("reduce-scatter{op} along dim {dim}")
        }
    }
}

/// A short description of what a plan does: its collectives.
pub fn describe_plan(plan: &ReshardPlan) -> String {
    describe_plan_with(plan, false)
}

/// [`describe_plan`]; with `deterministic`, a pending sum is marked as the deterministic
/// collective it runs as.
pub fn describe_plan_with(plan: &ReshardPlan, deterministic: bool) -> String {
    let mut parts = Vec::new();
    if let Some(step) = plan.reduce() {
        let n = step.slot_groups.first().map_or(0, Vec::len);
        let marker = if deterministic && step.op == reshard::PendingOp::Sum {
            "deterministic "
        } else {
            ""
        };
        parts.push(format!(
            "{marker}{} over groups of {n}",
            describe_reduce(step)
        ));
    }
    let exchanges = reshard::lower_kinds(plan);
    let mut kinds: Vec<String> = exchanges
        .iter()
        .map(|e| format!("{} over {} ranks", e.kind, e.ranks.len()))
        .collect();
    kinds.dedup();
    parts.extend(kinds);
    if plan.bytes_local() > 0 && parts.is_empty() {
        parts.push("local slice".to_string());
    }
    if parts.is_empty() {
        parts.push("nothing to move".to_string());
    }
    parts.join(", then ")
}

/// What `hsdp` keeps in pieces for a sharded parameter and when its weight is whole, for
/// `--explain` (`accumulates`: the run accumulates gradients over micro-batches).
fn describe_shard(shard: &OptimizerShard, accumulates: bool) -> String {
    let pieces: Vec<&str> = [
        (shard.level.shards_weights(), "weight"),
        (shard.gradient_sharded, "gradient"),
        (true, "optimizer state and update"),
    ]
    .into_iter()
    .filter_map(|(on, what)| on.then_some(what))
    .collect();
    let whole = match (
        shard.level.shards_weights(),
        shard.level.regathers_for_backward(),
    ) {
        (true, true) => "weight gathered before its forward use and again before its backward use",
        (true, false) => "weight gathered before its forward use and kept until its backward use",
        (false, _) => "weights gathered after the update",
    };
    let accumulation = match (accumulates, shard.accumulation_sharded) {
        (false, _) => "",
        (true, true) => "; the gradient accumulated in pieces",
        (true, false) => "; the gradient accumulated whole",
    };
    format!("{} in pieces, {whole}{accumulation}", pieces.join(", "))
}
