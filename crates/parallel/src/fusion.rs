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
    /// The gradients' reduce-scatters (`hsdp` gradients brought to their pieces: every level but
    /// `zero1`, and `level1` only without accumulation).
    pub reducescatter: FusionMode,
    /// The all-gathers of updated weight pieces after the optimizer step (`hsdp` levels `zero1`
    /// and `zero2`, which keep weights whole).
    pub allgather: FusionMode,
}

impl Default for CommFusionConfig {
    /// On, `auto` for every kind.
    fn default() -> CommFusionConfig {
        CommFusionConfig {
            openstate: true,
            allreduce: FusionMode::Auto,
            reducescatter: FusionMode::Auto,
            allgather: FusionMode::Auto,
        }
    }
}

/// `[parallel.overlap]`, named after MindSpore's `transformer_opt` switches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OverlapConfig {
    /// A gradient bucket's reduction runs on a progress thread while the rest of the backward
    /// pass computes (`grad_computation_allreduce_overlap`).
    pub grad_computation_allreduce_overlap: bool,
    /// Under `hsdp`'s MindSpore levels (weights kept in pieces), each weight's all-gather runs
    /// on a progress thread one gather ahead: the next weight arrives while the current layer
    /// computes (`computation_allgather_overlap`).
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
        let runs = cut_into_runs(candidates, mode, |c| c.param, |c| c.bytes);
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

/// `items` (in order) cut into buckets under `mode`: by size (`auto`: 64 MB), a larger item
/// alone; or at parameter indices (`index`), each range whole.
fn cut_into_runs<T>(
    items: Vec<T>,
    mode: &FusionMode,
    param: impl Fn(&T) -> usize,
    bytes: impl Fn(&T) -> usize,
) -> Vec<Vec<T>> {
    match mode {
        FusionMode::Index(bounds) => {
            let mut parts: BTreeMap<usize, Vec<T>> = BTreeMap::new();
            for item in items {
                let part = bounds.iter().filter(|&&x| x <= param(&item)).count();
                parts.entry(part).or_default().push(item);
            }
            parts.into_values().collect()
        }
        FusionMode::Auto | FusionMode::Size(_) => {
            let limit = match mode {
                FusionMode::Size(limit) => *limit,
                _ => AUTO_BUCKET_BYTES,
            };
            let mut runs: Vec<Vec<T>> = Vec::new();
            let mut total = 0;
            for item in items {
                let b = bytes(&item);
                match runs.last_mut() {
                    Some(run) if total + b <= limit => {
                        total += b;
                        run.push(item);
                    }
                    _ => {
                        total = b;
                        runs.push(vec![item]);
                    }
                }
            }
            runs
        }
    }
}

/// Weight gathers run as one all-gather per group: every member's updated pieces of the
/// bucket's parameters, concatenated, gathered, and each member's piece copied to its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatherBucket {
    /// The weight gathers (indices into [`Program::weight_gathers`]), in parameter order.
    pub gathers: Vec<usize>,
    /// The groups gathering together (device ranks, in piece order); every rank of the
    /// parameters' meshes is in exactly one. Group member `j`'s piece of each parameter is
    /// rows `j · rows ..` of the group's common slice.
    pub groups: Vec<Vec<usize>>,
    /// Bytes of one member's concatenated pieces.
    pub bytes: usize,
}

/// The gather groups of weight gather `g` and one member's piece bytes, when the gather is an
/// all-gather of equal dim-0 pieces (what an `hsdp` shard is); `None` when it cannot be fused.
/// The replicas of a slice hold its pieces in classes (the ranks holding the same piece); the
/// `t`-th rank of every class, in piece order, gather together.
fn gather_groups(program: &Program, g: usize) -> Option<(Vec<Vec<usize>>, usize)> {
    let param = &program.params[program.weight_gathers[g].param];
    let shard = param.optimizer_shard()?;
    let (slices, pieces) = (&param.layout, &shard.layout);
    let mesh = slices.mesh();
    let width = program.buffers[param.buffer].dtype.size_in_bytes();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut piece_bytes = None;
    for slot in 0..mesh.n_slots() {
        let replicas = slices.replica_ranks(mesh.device_of_slot(slot))?;
        if replicas[0] != mesh.device_of_slot(slot) {
            continue;
        }
        let whole = slices.slot_box(slot);
        // The ranks holding each piece, by the piece's first row.
        let mut classes: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &rank in &replicas {
            let piece = pieces.slot_box(pieces.mesh().slot_of_rank(rank)?);
            if piece.shape[1..] != whole.shape[1..] || piece.offset[1..] != whole.offset[1..] {
                return None;
            }
            classes
                .entry(*piece.offset.first()?)
                .or_default()
                .push(rank);
        }
        let rows = *whole.shape.first()? / classes.len();
        let per_class = replicas.len() / classes.len();
        for (k, (&first_row, holders)) in classes.iter().enumerate() {
            let piece = pieces.slot_box(pieces.mesh().slot_of_rank(holders[0])?);
            if first_row != whole.offset[0] + k * rows
                || piece.shape[0] != rows
                || holders.len() != per_class
            {
                return None;
            }
        }
        let bytes = piece_elements(&whole.shape, rows) * width;
        if *piece_bytes.get_or_insert(bytes) != bytes {
            return None;
        }
        for t in 0..per_class {
            groups.push(classes.values().map(|holders| holders[t]).collect());
        }
    }
    groups.sort();
    Some((groups, piece_bytes?))
}

/// Elements of a `rows`-row piece of a slice of `shape`.
fn piece_elements(shape: &[usize], rows: usize) -> usize {
    rows * shape[1..].iter().product::<usize>()
}

/// The buckets of `program`'s weight gathers under `config` (`allgather`): gathers over the
/// same groups in the same type fuse, in parameter order, cut by size or index.
pub fn gather_buckets(program: &Program, config: &CommFusionConfig) -> Vec<GatherBucket> {
    if !config.openstate {
        return Vec::new();
    }
    // By group partition and type: the partition, and each gather with its parameter and
    // bytes per member.
    type Fusable = (Vec<Vec<usize>>, Vec<(usize, usize, usize)>);
    let mut by_key: BTreeMap<String, Fusable> = BTreeMap::new();
    for g in 0..program.weight_gathers.len() {
        let Some((groups, bytes)) = gather_groups(program, g) else {
            continue;
        };
        let param = program.weight_gathers[g].param;
        let dtype = program.buffers[program.params[param].buffer].dtype;
        let key = format!("{dtype:?}{groups:?}");
        by_key
            .entry(key)
            .or_insert_with(|| (groups, Vec::new()))
            .1
            .push((g, param, bytes));
    }
    let mut buckets = Vec::new();
    for (_, (groups, gathers)) in by_key {
        for run in cut_into_runs(gathers, &config.allgather, |c| c.1, |c| c.2) {
            buckets.push(GatherBucket {
                gathers: run.iter().map(|c| c.0).collect(),
                groups: groups.clone(),
                bytes: run.iter().map(|c| c.2).sum(),
            });
        }
    }
    buckets.sort_by_key(|b| b.gathers[0]);
    buckets
}

/// By weight gather: whether a [`GatherBucket`] runs it.
pub fn fused_gathers(program: &Program) -> Vec<bool> {
    let mut fused = vec![false; program.weight_gathers.len()];
    for bucket in &program.gather_buckets {
        for &g in &bucket.gathers {
            fused[g] = true;
        }
    }
    fused
}

/// With `computation_allgather_overlap`: the steps (in order) that gather a weight `hsdp` keeps
/// in pieces (levels 1–3) from its pieces, forward and (level 3) backward — each is started
/// when the one before it runs (the first when the step starts) and its result taken at its
/// own step.
pub fn prefetched_gathers(program: &Program) -> Vec<usize> {
    if !program.placed.config.overlap.computation_allgather_overlap {
        return Vec::new();
    }
    let pieces: Vec<usize> = program
        .params
        .iter()
        .filter(|p| {
            p.optimizer_shard()
                .is_some_and(|s| s.level.shards_weights())
        })
        .map(|p| p.buffer)
        .collect();
    program
        .steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Step::Reshard(r) if pieces.contains(&r.from) && r.plan.reduce().is_none() => Some(i),
            _ => None,
        })
        .collect()
}
