//! Communication fusion (`[parallel.comm_fusion]`, MindSpore's `comm_fusion`): the gradient
//! reductions of a training program grouped into buckets, each run as one collective over the
//! bucket's concatenated gradients as soon as the bucket's last gradient is computed.
//!
//! A reduction can join a bucket when it is a pending sum resolved and nothing else
//! ([`reshard::fusion_key`]); reductions join the same bucket only with an equal key (same
//! groups, op, type, and all-reduce or reduce-scatter). Within a key, gradients are taken in
//! the order the backward pass computes them and cut into buckets by size (`auto`: 64 MB,
//! `size`: the configured MB) or at the configured parameter indices (`index`).

use std::collections::BTreeMap;

use crate::lower::{Program, Step};

/// The bucket size of mode `auto`: MindSpore's 64 MB.
pub const AUTO_BUCKET_BYTES: usize = 64 << 20;

/// How one kind of collective is fused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FusionMode {
    /// Buckets of [`AUTO_BUCKET_BYTES`].
    Auto,
    /// Buckets of at most this many bytes (a gradient larger than that is a bucket alone).
    Size(usize),
    /// Bucket boundaries at these parameter indices (in the model's parameter order):
    /// `[20, 35]` fuses parameters 0–19, 20–34 and 35 on.
    Index(Vec<usize>),
}

/// `[parallel.comm_fusion]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommFusionConfig {
    /// Fusion on (`openstate`).
    pub openstate: bool,
    /// The gradients' all-reduces.
    pub allreduce: FusionMode,
    /// The gradients' reduce-scatters (hsdp levels 2 and 3).
    pub reducescatter: FusionMode,
}

impl Default for CommFusionConfig {
    /// On, `auto` for every kind.
    fn default() -> CommFusionConfig {
        CommFusionConfig {
            openstate: true,
            allreduce: FusionMode::Auto,
            reducescatter: FusionMode::Auto,
        }
    }
}

/// `[parallel.overlap]`, named after MindSpore's `transformer_opt` switches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OverlapConfig {
    /// A gradient bucket's reduction runs on a progress thread while the rest of the backward
    /// pass computes (`grad_computation_allreduce_overlap`).
    pub grad_computation_allreduce_overlap: bool,
    /// Under `hsdp` level 3, each weight's all-gather runs on a progress thread one gather
    /// ahead: the next weight arrives while the current layer computes
    /// (`computation_allgather_overlap`).
    pub computation_allgather_overlap: bool,
}

/// Gradient reductions run as one collective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommBucket {
    /// Reduce-scatters rather than all-reduces.
    pub scatter: bool,
    /// The reshard steps (indices into the program's steps) it runs, in gradient order.
    pub steps: Vec<usize>,
    /// The parameters whose gradients they are.
    pub params: Vec<usize>,
    /// Bytes of the concatenated gradients on each rank.
    pub bytes: usize,
    /// The step after which every gradient of the bucket is computed: the bucket runs then.
    pub ready_after: usize,
}

/// One fusable gradient reduction.
struct Candidate {
    step: usize,
    param: usize,
    bytes: usize,
    ready: usize,
}

/// The buckets of `program`'s gradient reductions under `config`.
pub fn gradient_buckets(program: &Program, config: &CommFusionConfig) -> Vec<CommBucket> {
    if !config.openstate {
        return Vec::new();
    }
    let mut written_by = vec![None; program.buffers.len()];
    for (i, step) in program.steps.iter().enumerate() {
        let outputs = match step {
            Step::Kernel(k) => k.outputs.as_slice(),
            Step::Reshard(r) => std::slice::from_ref(&r.to),
        };
        for &b in outputs {
            written_by[b].get_or_insert(i);
        }
    }
    let mut by_key: BTreeMap<String, (bool, Vec<Candidate>)> = BTreeMap::new();
    for (param, p) in program.params.iter().enumerate() {
        let Some(grad) = p.grad_buffer else { continue };
        let found = program.steps.iter().enumerate().find_map(|(i, s)| match s {
            Step::Reshard(r) if r.to == grad => Some((i, r)),
            _ => None,
        });
        let Some((step, r)) = found else { continue };
        let Some(key) = reshard::fusion_key(&r.plan) else {
            continue;
        };
        let Some(ready) = written_by[r.from] else {
            continue;
        };
        let src = r.plan.src().layout();
        let bytes = src.slice_elements() * r.plan.dtype().size_in_bytes();
        let entry = by_key
            .entry(format!("{key:?}"))
            .or_insert_with(|| (key.scatter, Vec::new()));
        entry.1.push(Candidate {
            step,
            param,
            bytes,
            ready,
        });
    }
    let mut buckets = Vec::new();
    for (_, (scatter, mut candidates)) in by_key {
        candidates.sort_by_key(|c| (c.ready, c.step));
        let mode = match scatter {
            true => &config.reducescatter,
            false => &config.allreduce,
        };
        // Runs of candidates, each run cut by size or taken whole (one per index range).
        let runs: Vec<Vec<Candidate>> = match mode {
            FusionMode::Index(bounds) => {
                let mut parts: BTreeMap<usize, Vec<Candidate>> = BTreeMap::new();
                for c in candidates {
                    let part = bounds.iter().filter(|&&x| x <= c.param).count();
                    parts.entry(part).or_default().push(c);
                }
                parts.into_values().collect()
            }
            FusionMode::Auto | FusionMode::Size(_) => {
                let limit = match mode {
                    FusionMode::Size(limit) => *limit,
                    _ => AUTO_BUCKET_BYTES,
                };
                let mut runs: Vec<Vec<Candidate>> = Vec::new();
                let mut bytes = 0;
                for c in candidates {
                    match runs.last_mut() {
                        Some(run) if bytes + c.bytes <= limit => {
                            bytes += c.bytes;
                            run.push(c);
                        }
                        _ => {
                            bytes = c.bytes;
                            runs.push(vec![c]);
                        }
                    }
                }
                runs
            }
        };
        buckets.extend(runs.into_iter().map(|run| CommBucket {
            scatter,
            steps: run.iter().map(|c| c.step).collect(),
            params: run.iter().map(|c| c.param).collect(),
            bytes: run.iter().map(|c| c.bytes).sum(),
            ready_after: run.iter().map(|c| c.ready).max().unwrap_or(0),
        }));
    }
    buckets.sort_by_key(|b| (b.ready_after, b.steps[0]));
    buckets
}

/// With `computation_allgather_overlap`: the steps (in order) that gather a level-3 weight from
/// its pieces, forward and backward — each is started when the one before it runs (the first
/// when the step starts) and its result taken at its own step.
pub fn prefetched_gathers(program: &Program) -> Vec<usize> {
    if !program.placed.config.overlap.computation_allgather_overlap {
        return Vec::new();
    }
    let level3: Vec<usize> = program
        .params
        .iter()
        .filter(|p| {
            p.optimizer_shard()
                .is_some_and(|s| s.level == crate::config::OptimizerLevel::Level3)
        })
        .map(|p| p.buffer)
        .collect();
    program
        .steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Step::Reshard(r) if level3.contains(&r.from) && r.plan.reduce().is_none() => Some(i),
            _ => None,
        })
        .collect()
}
