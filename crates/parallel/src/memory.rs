//! Memory of a program on one rank: when each buffer lives, and the bytes held by category.
//!
//! The runtime allocates a step's buffers as the steps write them and frees each after its
//! last reader ([`BufferLifetimes`]), so what a rank holds rises and falls over a step; a copy
//! (`Reshape`, `Flatten`, `StopGradient`) of a value read last there takes that value's buffer
//! over instead ([`moved_buffers`]). The
//! categories are those of ZeRO's accounting plus the step's working memory:
//! - **parameters**: the parameters' own buffers (under `hsdp` levels 1–3, the pieces);
//! - **gradients**: the gradients the optimizer reads, after their data-parallel sum, and the
//!   accumulation buffers of gradient accumulation (in f32 for half-precision gradients, see
//!   [`crate::ParallelConfig::gradient_accumulation_dtype`]);
//! - **optimizer**: the optimizer's state;
//! - **activations**: every value a kernel writes (forward activations, the backward pass's
//!   values, gradients before their sum) and the fed inputs;
//! - **communication**: the destinations of reshards (a gathered weight, an all-reduced
//!   activation), the pieces `hsdp` gathers after the update (`zero1`, `zero2`), with
//!   overlap the gradient buckets in flight, and ring attention's working blocks while its step
//!   runs ([`crate::ring::RingCall`]). The messages of a reshard in flight are not counted.
//!
//! [`predict`] walks the program as the runtime runs it, before anything runs, so
//! `tessera train --explain` can say what a run will need.

use tensor::DType;

use crate::lower::{Program, Step};

/// What a buffer holds, for memory accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryCategory {
    /// A parameter's own buffer.
    Parameters,
    /// A gradient the optimizer reads, or its accumulation buffer.
    Gradients,
    /// Optimizer state.
    Optimizer,
    /// A value a kernel writes, or a fed input.
    Activations,
    /// A reshard's destination.
    Communication,
}

/// Bytes by [`MemoryCategory`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryBytes {
    /// [`MemoryCategory::Parameters`].
    pub parameters: usize,
    /// [`MemoryCategory::Gradients`].
    pub gradients: usize,
    /// [`MemoryCategory::Optimizer`].
    pub optimizer: usize,
    /// [`MemoryCategory::Activations`].
    pub activations: usize,
    /// [`MemoryCategory::Communication`].
    pub communication: usize,
}

impl MemoryBytes {
    fn slot(&mut self, category: MemoryCategory) -> &mut usize {
        match category {
            MemoryCategory::Parameters => &mut self.parameters,
            MemoryCategory::Gradients => &mut self.gradients,
            MemoryCategory::Optimizer => &mut self.optimizer,
            MemoryCategory::Activations => &mut self.activations,
            MemoryCategory::Communication => &mut self.communication,
        }
    }

    /// The sum over the categories.
    pub fn total(&self) -> usize {
        self.parameters + self.gradients + self.optimizer + self.activations + self.communication
    }
}

/// A rank's memory over a run: each category's peak, and the peak of their sum (which may be
/// below the sum of the peaks: categories peak at different times).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Each category's peak.
    pub peaks: MemoryBytes,
    /// The peak of the total.
    pub peak: usize,
}

/// Bytes held, as buffers come and go: what the runtime measures and [`predict`] simulates.
#[derive(Debug, Clone, Default)]
pub struct MemoryMeter {
    current: MemoryBytes,
    report: MemoryReport,
}

impl MemoryMeter {
    /// `bytes` more held in `category`.
    pub fn hold(&mut self, category: MemoryCategory, bytes: usize) {
        let now = self.current.slot(category);
        *now += bytes;
        let now = *now;
        let peak = self.report.peaks.slot(category);
        *peak = (*peak).max(now);
        self.report.peak = self.report.peak.max(self.current.total());
    }

    /// `bytes` of `category` released.
    pub fn release(&mut self, category: MemoryCategory, bytes: usize) {
        let now = self.current.slot(category);
        *now = now.saturating_sub(bytes);
    }

    /// What is held now.
    pub fn current(&self) -> MemoryBytes {
        self.current
    }

    /// The peaks so far.
    pub fn report(&self) -> MemoryReport {
        self.report
    }
}

/// When each buffer of a program lives during a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferLifetimes {
    /// By buffer: lives across steps — parameters, gradients, inputs, outputs.
    pub persistent: Vec<bool>,
    /// By step: the other buffers it is the last to read or write (freed after it).
    pub release_after: Vec<Vec<usize>>,
    /// By buffer: what it holds.
    pub category: Vec<MemoryCategory>,
}

/// The lifetimes of `program`'s buffers: a buffer that is not persistent is allocated by the
/// first step writing it and freed after the last step using it.
pub fn lifetimes(program: &Program) -> BufferLifetimes {
    let n = program.buffers.len();
    let mut category = vec![MemoryCategory::Activations; n];
    let mut persistent = vec![false; n];
    let mut last_use: Vec<Option<usize>> = vec![None; n];
    // A fused reduction runs with its bucket, after the bucket's last gradient.
    let mut runs_at: Vec<usize> = (0..program.steps.len()).collect();
    for bucket in &program.buckets {
        for &s in &bucket.steps {
            runs_at[s] = bucket.ready_after;
        }
    }
    for (i, step) in program.steps.iter().enumerate() {
        let i = runs_at[i];
        match step {
            Step::Kernel(k) => {
                for &b in k.inputs.iter().chain(&k.outputs) {
                    last_use[b] = last_use[b].max(Some(i));
                }
            }
            Step::Reshard(r) => {
                category[r.to] = MemoryCategory::Communication;
                last_use[r.from] = last_use[r.from].max(Some(i));
                last_use[r.to] = last_use[r.to].max(Some(i));
            }
        }
    }
    for input in &program.inputs {
        persistent[input.buffer] = true;
    }
    for output in &program.outputs {
        persistent[output.buffer] = true;
    }
    for p in &program.params {
        persistent[p.buffer] = true;
        category[p.buffer] = MemoryCategory::Parameters;
        if let Some(g) = p.grad_buffer {
            persistent[g] = true;
            category[g] = MemoryCategory::Gradients;
        }
    }
    let mut release_after = vec![Vec::new(); program.steps.len()];
    for (b, last) in last_use.iter().enumerate() {
        if let (Some(i), false) = (*last, persistent[b]) {
            release_after[i].push(b);
        }
    }
    BufferLifetimes {
        persistent,
        release_after,
        category,
    }
}

/// Whether step `i`'s output `to` may take over its input `from`: neither persistent, `from` read
/// by nothing after the step, the dtypes equal (what every kind of [`moved_buffers`] needs).
fn takes_over(
    program: &Program,
    lifetimes: &BufferLifetimes,
    i: usize,
    (from, to): (usize, usize),
) -> bool {
    !lifetimes.persistent[from]
        && !lifetimes.persistent[to]
        && lifetimes.release_after[i].contains(&from)
        && program.buffers[from].dtype == program.buffers[to].dtype
}

/// By step: the (input, output) buffers of a step whose output takes over its input's memory
/// instead of a fresh buffer. Three kinds:
/// - a `Reshape`, `Flatten` or `StopGradient` (a plain copy of the bytes): the input's tensor
///   becomes the output, reshaped;
/// - an op computed in place over that input ([`graph::Op::computes_in_place_over`]: the bias
///   add over `x`, elementwise arithmetic over either operand, neither broadcast) when the
///   input's block has the output's shape and is `f32` or `f64`: [`graph::eval_in_place`]
///   writes the result over it, element by element as `eval_op` pairs the local blocks;
/// - a reshard that is one all-reduce of every rank's whole slice into the same slice
///   ([`reshard::ReshardPlan::is_whole_slice_all_reduce`]: model parallel's activation sums),
///   not in a gradient bucket: the sum is taken in place over the input's tensor.
///
/// In every kind the input must be neither persistent nor read after the step (its first such
/// input, for arithmetic), the output not persistent, the step not a recompute, the dtypes
/// equal. The runtime moves the input's tensor to the output (no allocation) in a
/// non-pipelined step, and [`predict`] frees the input before holding the output.
pub fn moved_buffers(
    program: &Program,
    lifetimes: &BufferLifetimes,
) -> Vec<Option<(usize, usize)>> {
    program
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let k = match step {
                Step::Kernel(k) => k,
                Step::Reshard(r) => {
                    let movable = r.plan.is_whole_slice_all_reduce()
                        && !program.buckets.iter().any(|b| b.steps.contains(&i))
                        && takes_over(program, lifetimes, i, (r.from, r.to));
                    return movable.then_some((r.from, r.to));
                }
            };
            let &[to] = k.outputs.as_slice() else {
                return None;
            };
            let movable =
                |from: usize| !k.recompute && takes_over(program, lifetimes, i, (from, to));
            let copies = matches!(
                k.op,
                graph::Op::Reshape { .. } | graph::Op::Flatten { .. } | graph::Op::StopGradient
            );
            if copies {
                let &[from] = k.inputs.as_slice() else {
                    return None;
                };
                return movable(from).then_some((from, to));
            }
            let (out, wide) = (&program.buffers[to], [DType::F32, DType::F64]);
            let from = k.inputs.iter().enumerate().find_map(|(input, &from)| {
                let over = k.op.computes_in_place_over(input)
                    && wide.contains(&out.dtype)
                    // The kernel pairs the local blocks element by element, so a block of
                    // the output's size can hold the result.
                    && program.buffers[from].shape == out.shape
                    // Arithmetic in place does not broadcast: both operands whole.
                    && (matches!(k.op, graph::Op::BiasAdd)
                        || k.inputs.iter().all(|&b| program.buffers[b].shape == out.shape))
                    // Once only: `x + x` reads the dying buffer twice.
                    && k.inputs.iter().filter(|&&b| b == from).count() == 1;
                (over && movable(from)).then_some(from)
            })?;
            Some((from, to))
        })
        .collect()
}

/// What a training run keeps besides the program's buffers, per trainable parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainingState {
    /// Optimizer state tensors per parameter, each shaped like its optimizer piece (SGD 0,
    /// momentum 1, Adam 2).
    pub optimizer_tensors: usize,
    /// Gradient accumulation's buffer per parameter: `None` without accumulation;
    /// `Some(true)` for one shaped like the optimizer piece
    /// (`gradient_accumulation_shard`), `Some(false)` for one shaped like the gradient.
    pub accumulation_sharded: Option<bool>,
    /// Mixed precision: the optimizer keeps an f32 master piece beside the weights, and its
    /// state in f32.
    pub master_weights: bool,
}

/// The bytes of `len` elements of buffer `b`'s type.
fn bytes_of(program: &Program, b: usize, shape: &[usize]) -> usize {
    shape.iter().product::<usize>() * program.buffers[b].dtype.size_in_bytes()
}

/// The bytes buffer `b` takes on `rank` (nothing on a rank of another pipeline stage).
pub fn buffer_bytes(program: &Program, b: usize, rank: usize) -> usize {
    let spec = &program.buffers[b];
    let layout = spec.layout.layout();
    let Some(slot) = layout.mesh().slot_of_rank(rank) else {
        return 0;
    };
    // `BufferSpec::local_shape` without its copy of the shape: predicting a thousand ranks
    // asks this for every buffer of each.
    if layout.is_uniform() {
        bytes_of(program, b, &spec.shape)
    } else {
        bytes_of(program, b, &layout.slot_shape(slot))
    }
}

/// The bytes of a sum of buffer `b` over a step's micro-batches on `rank` (a pipelined step's
/// micro-batch sum): `b`'s elements in the dtype gradients of `b`'s type accumulate in
/// ([`crate::ParallelConfig::gradient_accumulation_dtype`]: f32 for a half type, unless
/// gradient sums are in the half type).
fn summed_bytes(program: &Program, b: usize, rank: usize) -> usize {
    let spec = &program.buffers[b];
    let width = accumulation_width(program, spec.dtype);
    buffer_bytes(program, b, rank) / spec.dtype.size_in_bytes() * width
}

/// The bytes per element of an accumulation of gradients of `dtype`.
fn accumulation_width(program: &Program, dtype: DType) -> usize {
    program
        .placed
        .config
        .gradient_accumulation_dtype(dtype)
        .size_in_bytes()
}

/// Elements of the piece of parameter `p` that `rank`'s optimizer updates: its box of the
/// `hsdp` shard layout, or its whole slice.
fn piece_elements(program: &Program, p: usize, rank: usize) -> usize {
    let param = &program.params[p];
    let layout = param
        .optimizer_shard()
        .map_or(&param.layout, |shard| &shard.layout);
    layout
        .mesh()
        .slot_of_rank(rank)
        .map_or(0, |slot| layout.slot_box(slot).shape.iter().product())
}

/// The memory `rank` will hold running `program` (a non-pipelined step, buffers freed after
/// their last use) with `state` beside it.
pub fn predict(program: &Program, rank: usize, state: TrainingState) -> MemoryReport {
    Predictor::new(program).predict(rank, state)
}

/// What [`predict`] and [`predict_pipelined`] read of a program that is the same on every
/// rank (the buffers' lifetimes, the buffers taken over, the prefetched gathers), worked out
/// once: predicting many ranks of one program (`tessera plan`'s fullest rank among a thousand)
/// then walks only each rank's steps. Its predictions are those of the two functions, which
/// run through it.
#[derive(Debug, Clone)]
pub struct Predictor<'a> {
    program: &'a Program,
    lifetimes: BufferLifetimes,
    moved: Vec<Option<(usize, usize)>>,
    gathers: Vec<usize>,
}

impl<'a> Predictor<'a> {
    /// The rank-independent analysis of `program`.
    pub fn new(program: &'a Program) -> Predictor<'a> {
        let lifetimes = lifetimes(program);
        let moved = moved_buffers(program, &lifetimes);
        let gathers = crate::fusion::prefetched_gathers(program);
        Predictor {
            program,
            lifetimes,
            moved,
            gathers,
        }
    }

    /// [`predict`] of `rank`.
    pub fn predict(&self, rank: usize, state: TrainingState) -> MemoryReport {
        let (program, lifetimes) = (self.program, &self.lifetimes);
        let mut meter = MemoryMeter::default();
        for (b, &persistent) in lifetimes.persistent.iter().enumerate() {
            if persistent {
                meter.hold(lifetimes.category[b], buffer_bytes(program, b, rank));
            }
        }
        hold_training_state(&mut meter, program, rank, state);
        walk_steps(&mut meter, self, rank);
        hold_fused_gathers(&mut meter, program, rank);
        meter.report()
    }

    /// [`predict_pipelined`] of `rank`.
    pub fn predict_pipelined(
        &self,
        rank: usize,
        state: TrainingState,
        buffers: &crate::pipeline::MicroBatchBuffers,
        held: usize,
    ) -> MemoryReport {
        let (program, lifetimes) = (self.program, &self.lifetimes);
        let mut meter = MemoryMeter::default();
        let hold = |meter: &mut MemoryMeter, b: usize| {
            meter.hold(lifetimes.category[b], buffer_bytes(program, b, rank))
        };
        for b in 0..program.buffers.len() {
            hold(&mut meter, b);
        }
        hold_training_state(&mut meter, program, rank, state);
        for &b in &buffers.summed {
            let category = lifetimes.category[b];
            meter.hold(category, summed_bytes(program, b, rank));
        }
        for _ in 0..held {
            for &b in &buffers.local {
                hold(&mut meter, b);
            }
        }
        // A ring step runs while the micro-batches in flight are held.
        if let Some(ring) = program
            .steps
            .iter()
            .filter_map(|step| ring_workspace(program, step, rank))
            .max()
        {
            meter.hold(MemoryCategory::Communication, ring);
            meter.release(MemoryCategory::Communication, ring);
        }
        for &b in &buffers.summed {
            meter.release(lifetimes.category[b], summed_bytes(program, b, rank));
        }
        for &b in (0..held).flat_map(|_| &buffers.local) {
            meter.release(lifetimes.category[b], buffer_bytes(program, b, rank));
        }
        hold_fused_gathers(&mut meter, program, rank);
        meter.report()
    }
}

/// The fused weight gathers after the update: each bucket's packed pieces and the gathered
/// buffer, held while it runs.
fn hold_fused_gathers(meter: &mut MemoryMeter, program: &Program, rank: usize) {
    for bucket in &program.gather_buckets {
        if let Some(group) = bucket.groups.iter().find(|g| g.contains(&rank)) {
            let transient = bucket.bytes * (1 + group.len());
            meter.hold(MemoryCategory::Communication, transient);
            meter.release(MemoryCategory::Communication, transient);
        }
    }
}

/// The memory `rank` will hold running `program` pipelined with `state` beside it: every
/// buffer allocated for good before the first step, plus, during a step, the micro-batch sums
/// and `held` micro-batches' own copies of `buffers.local` (`held` from the stage's schedule,
/// [`crate::pipeline::micro_batches_held`]).
pub fn predict_pipelined(
    program: &Program,
    rank: usize,
    state: TrainingState,
    buffers: &crate::pipeline::MicroBatchBuffers,
    held: usize,
) -> MemoryReport {
    Predictor::new(program).predict_pipelined(rank, state, buffers, held)
}

/// Holds what a training run keeps beside the program's buffers: optimizer state (and master
/// weights), accumulation buffers, and the sources of `hsdp`'s weight gathers.
fn hold_training_state(
    meter: &mut MemoryMeter,
    program: &Program,
    rank: usize,
    state: TrainingState,
) {
    for (i, p) in program.params.iter().enumerate() {
        let held = p.layout.mesh().slot_of_rank(rank).is_some();
        let Some(grad) = p.grad_buffer.filter(|_| p.trainable && held) else {
            continue;
        };
        let dtype = program.buffers[p.buffer].dtype;
        let width = dtype.size_in_bytes();
        let elements = piece_elements(program, i, rank);
        let piece = elements * width;
        // Accumulation buffers hold the parameter's type, or f32 for a half type
        // (`ParallelConfig::gradient_accumulation_dtype`), as `exec::Accumulation` allocates.
        let accumulated = accumulation_width(program, dtype);
        match state.master_weights {
            true => meter.hold(
                MemoryCategory::Optimizer,
                (state.optimizer_tensors + 1) * elements * 4,
            ),
            false => meter.hold(MemoryCategory::Optimizer, state.optimizer_tensors * piece),
        }
        match state.accumulation_sharded {
            Some(true) => meter.hold(MemoryCategory::Gradients, elements * accumulated),
            Some(false) => {
                let grad_elements =
                    buffer_bytes(program, grad, rank) / program.buffers[grad].dtype.size_in_bytes();
                meter.hold(MemoryCategory::Gradients, grad_elements * accumulated)
            }
            None => {}
        }
    }
    let fused = crate::fusion::fused_gathers(program);
    for (g, _) in program
        .weight_gathers
        .iter()
        .zip(&fused)
        .filter(|(_, &f)| !f)
    {
        let width = program.buffers[program.params[g.param].buffer]
            .dtype
            .size_in_bytes();
        let held = program.params[g.param]
            .layout
            .mesh()
            .slot_of_rank(rank)
            .is_some();
        let bytes = if held {
            piece_elements(program, g.param, rank) * width
        } else {
            0
        };
        meter.hold(MemoryCategory::Communication, bytes);
    }
}

/// Walks the steps of a non-pipelined run: each buffer allocated by its first writer and freed
/// after its last use, prefetched gathers and, with overlap, buckets in flight.
fn walk_steps(meter: &mut MemoryMeter, predictor: &Predictor<'_>, rank: usize) {
    let (program, lifetimes) = (predictor.program, &predictor.lifetimes);
    // With overlap, a bucket's packed gradients are in flight from its step to the end.
    let overlap = program
        .placed
        .config
        .overlap
        .grad_computation_allreduce_overlap;
    let mut in_flight_after = vec![0; program.steps.len()];
    for bucket in program.buckets.iter().filter(|_| overlap) {
        let takes_part = bucket
            .steps
            .first()
            .is_some_and(|&s| match &program.steps[s] {
                Step::Reshard(r) => r.plan.dst().mesh().slot_of_rank(rank).is_some(),
                Step::Kernel(_) => false,
            });
        // Half-precision gradients summed in f32 travel widened.
        let widened = bucket
            .steps
            .first()
            .is_some_and(|&s| match &program.steps[s] {
                Step::Reshard(r) => {
                    let config = &program.placed.config;
                    r.plan.dtype().is_half()
                        && (config.gradient_fp32_sync || config.enable_fp32_communication)
                }
                Step::Kernel(_) => false,
            });
        if takes_part {
            in_flight_after[bucket.ready_after] += bucket.bytes * if widened { 2 } else { 1 };
        }
    }
    let mut allocated = lifetimes.persistent.clone();
    let moved = &predictor.moved;
    // Prefetched weight gathers (hsdp levels 1–3): each started (its destination allocated, its source copied)
    // when the gather before it runs, the first when the step starts.
    let gathers = &predictor.gathers;
    let gather_bytes = |g: usize| match &program.steps[g] {
        Step::Reshard(r) if r.plan.dst().mesh().slot_of_rank(rank).is_some() => {
            Some((r.to, buffer_bytes(program, r.from, rank)))
        }
        _ => None,
    };
    let start = |g: usize, meter: &mut MemoryMeter, allocated: &mut [bool]| {
        if let Some((to, src)) = gather_bytes(g) {
            allocated[to] = true;
            meter.hold(lifetimes.category[to], buffer_bytes(program, to, rank));
            meter.hold(MemoryCategory::Communication, src);
        }
    };
    if let Some(&first) = gathers.first() {
        start(first, meter, &mut allocated);
    }
    for (i, step) in program.steps.iter().enumerate() {
        if let Some(k) = gathers.iter().position(|&g| g == i) {
            if let Some((_, src)) = gather_bytes(i) {
                meter.release(MemoryCategory::Communication, src);
            }
            if let Some(&next) = gathers.get(k + 1) {
                start(next, meter, &mut allocated);
            }
        }
        if let Some((from, _)) = moved[i] {
            if allocated[from] {
                allocated[from] = false;
                meter.release(lifetimes.category[from], buffer_bytes(program, from, rank));
            }
        }
        let written: &[usize] = match step {
            Step::Kernel(k) => &k.outputs,
            Step::Reshard(r) => std::slice::from_ref(&r.to),
        };
        for &b in written {
            if !allocated[b] {
                allocated[b] = true;
                meter.hold(lifetimes.category[b], buffer_bytes(program, b, rank));
            }
        }
        hold_ring_workspace(meter, program, step, rank);
        meter.hold(MemoryCategory::Communication, in_flight_after[i]);
        for &b in &lifetimes.release_after[i] {
            if allocated[b] {
                allocated[b] = false;
                meter.release(lifetimes.category[b], buffer_bytes(program, b, rank));
            }
        }
    }
}

/// The working buffers `rank` holds while it runs `step`, when it is ring attention
/// ([`crate::ring::ring_workspace_bytes`]).
fn ring_workspace(program: &Program, step: &Step, rank: usize) -> Option<usize> {
    match step {
        Step::Kernel(k) => crate::ring::ring_workspace_bytes(program, k, rank),
        Step::Reshard(_) => None,
    }
}

/// Holds a ring step's working buffers for its duration (counted as communication memory,
/// like a reshard's destination).
fn hold_ring_workspace(meter: &mut MemoryMeter, program: &Program, step: &Step, rank: usize) {
    if let Some(bytes) = ring_workspace(program, step, rank) {
        meter.hold(MemoryCategory::Communication, bytes);
        meter.release(MemoryCategory::Communication, bytes);
    }
}
