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

/// Everything a [`Predictor`]'s predictions read of one rank, and nothing else: what each
/// buffer, optimizer piece, ring step and gather group takes on it.
#[derive(Debug, Clone)]
struct RankSizes {
    /// Bytes of each buffer on the rank (0 off its mesh).
    buffers: Vec<usize>,
    /// Per parameter: the elements of its optimizer piece on the rank; `None` when the rank
    /// does not hold the parameter.
    pieces: Vec<Option<usize>>,
    /// Per step: whether the rank is in the destination's mesh, for the reshards the
    /// prediction asks about (prefetched gathers, the first step of each gradient bucket);
    /// `false` for the others.
    in_destination: Vec<bool>,
    /// Per step: the bytes of ring attention's working blocks on the rank, for the ring steps
    /// it takes part in.
    ring: Vec<Option<usize>>,
    /// Per fused gather bucket: the size of the rank's group, `None` outside every group.
    gather_groups: Vec<Option<usize>>,
}

/// What a rank's [`RankSizes`] are made of, in few values: whether the rank is in each of the
/// program's distinct rank lists, its slot in each unevenly split layout, its ring steps'
/// working bytes and its gather groups' sizes. Every size is a function of these (an evenly
/// split layout gives each member the same box), so ranks of one class hold the same memory
/// and predicting thousands of ranks walks the program once per class
/// ([`Predictor::class`]); in an even layout, once per pipeline stage.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RankClass {
    members: Vec<bool>,
    uneven_slots: Vec<Option<usize>>,
    ring: Vec<Option<usize>>,
    gather_groups: Vec<Option<usize>>,
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
    /// Per weight gather: whether a fused bucket runs it ([`crate::fusion::fused_gathers`]).
    fused: Vec<bool>,
    /// The reshard steps whose destination mesh [`RankSizes`] records.
    asked_destinations: Vec<usize>,
    /// One mesh of each distinct rank list the predictions ask about ([`RankClass`]).
    meshes: Vec<&'a layout::Mesh>,
    /// The unevenly split layouts the predictions read ([`RankClass`]).
    uneven: Vec<&'a layout::TensorLayout>,
    /// The ring attention steps.
    ring_steps: Vec<usize>,
}

impl<'a> Predictor<'a> {
    /// The rank-independent analysis of `program`.
    pub fn new(program: &'a Program) -> Predictor<'a> {
        let lifetimes = lifetimes(program);
        let moved = moved_buffers(program, &lifetimes);
        let gathers = crate::fusion::prefetched_gathers(program);
        let mut asked_destinations: Vec<usize> = program
            .buckets
            .iter()
            .filter_map(|bucket| bucket.steps.first().copied())
            .chain(gathers.iter().copied())
            .collect();
        asked_destinations.sort_unstable();
        asked_destinations.dedup();
        let (meshes, uneven) = asked_layouts(program, &asked_destinations);
        let ring_steps = (0..program.steps.len())
            .filter(|&s| match &program.steps[s] {
                Step::Kernel(k) => crate::ring::is_attention_step(k),
                Step::Reshard(_) => false,
            })
            .collect();
        Predictor {
            program,
            lifetimes,
            moved,
            gathers,
            fused: crate::fusion::fused_gathers(program),
            asked_destinations,
            meshes,
            uneven,
            ring_steps,
        }
    }

    /// The class of `rank`: ranks of one class hold the same memory.
    pub fn class(&self, rank: usize) -> RankClass {
        let program = self.program;
        RankClass {
            members: self
                .meshes
                .iter()
                .map(|mesh| mesh.slot_of_rank(rank).is_some())
                .collect(),
            uneven_slots: self
                .uneven
                .iter()
                .map(|layout| layout.mesh().slot_of_rank(rank))
                .collect(),
            ring: self
                .ring_steps
                .iter()
                .map(|&s| ring_workspace(program, &program.steps[s], rank))
                .collect(),
            gather_groups: gather_groups(program, rank),
        }
    }

    /// What the predictions read of `rank`.
    fn sizes(&self, rank: usize) -> RankSizes {
        let program = self.program;
        let mut in_destination = vec![false; program.steps.len()];
        for &s in &self.asked_destinations {
            if let Step::Reshard(r) = &program.steps[s] {
                in_destination[s] = r.plan.dst().mesh().slot_of_rank(rank).is_some();
            }
        }
        RankSizes {
            buffers: (0..program.buffers.len())
                .map(|b| buffer_bytes(program, b, rank))
                .collect(),
            pieces: (0..program.params.len())
                .map(|p| {
                    let held = program.params[p].layout.mesh().slot_of_rank(rank).is_some();
                    held.then(|| piece_elements(program, p, rank))
                })
                .collect(),
            in_destination,
            ring: program
                .steps
                .iter()
                .map(|step| ring_workspace(program, step, rank))
                .collect(),
            gather_groups: gather_groups(program, rank),
        }
    }

    /// [`predict`] of `rank`.
    pub fn predict(&self, rank: usize, state: TrainingState) -> MemoryReport {
        self.predict_sizes(&self.sizes(rank), state)
    }

    /// [`predict`] of a rank whose sizes are `sizes`.
    fn predict_sizes(&self, sizes: &RankSizes, state: TrainingState) -> MemoryReport {
        let lifetimes = &self.lifetimes;
        let mut meter = MemoryMeter::default();
        for (b, &persistent) in lifetimes.persistent.iter().enumerate() {
            if persistent {
                meter.hold(lifetimes.category[b], sizes.buffers[b]);
            }
        }
        self.hold_training_state(&mut meter, sizes, state);
        self.walk_steps(&mut meter, sizes);
        hold_fused_gathers(&mut meter, self.program, sizes);
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
        self.predict_pipelined_sizes(&self.sizes(rank), state, buffers, held)
    }

    /// [`predict_pipelined`] of a rank whose sizes are `sizes`.
    fn predict_pipelined_sizes(
        &self,
        sizes: &RankSizes,
        state: TrainingState,
        buffers: &crate::pipeline::MicroBatchBuffers,
        held: usize,
    ) -> MemoryReport {
        let (program, lifetimes) = (self.program, &self.lifetimes);
        let mut meter = MemoryMeter::default();
        let hold =
            |meter: &mut MemoryMeter, b: usize| meter.hold(lifetimes.category[b], sizes.buffers[b]);
        for b in 0..program.buffers.len() {
            hold(&mut meter, b);
        }
        self.hold_training_state(&mut meter, sizes, state);
        let summed = |b: usize| summed_bytes(program, b, sizes);
        for &b in &buffers.summed {
            meter.hold(lifetimes.category[b], summed(b));
        }
        for _ in 0..held {
            for &b in &buffers.local {
                hold(&mut meter, b);
            }
        }
        // A ring step runs while the micro-batches in flight are held.
        if let Some(ring) = sizes.ring.iter().flatten().max().copied() {
            meter.hold(MemoryCategory::Communication, ring);
            meter.release(MemoryCategory::Communication, ring);
        }
        for &b in &buffers.summed {
            meter.release(lifetimes.category[b], summed(b));
        }
        for &b in (0..held).flat_map(|_| &buffers.local) {
            meter.release(lifetimes.category[b], sizes.buffers[b]);
        }
        hold_fused_gathers(&mut meter, program, sizes);
        meter.report()
    }

    /// Holds what a training run keeps beside the program's buffers: optimizer state (and
    /// master weights), accumulation buffers, and the sources of `hsdp`'s weight gathers.
    fn hold_training_state(
        &self,
        meter: &mut MemoryMeter,
        sizes: &RankSizes,
        state: TrainingState,
    ) {
        let program = self.program;
        for (p, &piece) in program.params.iter().zip(&sizes.pieces) {
            let (Some(grad), Some(elements)) = (p.grad_buffer.filter(|_| p.trainable), piece)
            else {
                continue;
            };
            let dtype = program.buffers[p.buffer].dtype;
            let piece = elements * dtype.size_in_bytes();
            // Accumulation buffers hold the parameter's type, or f32 for a half type
            // (`ParallelConfig::gradient_accumulation_dtype`), as `exec::Accumulation`
            // allocates.
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
                        sizes.buffers[grad] / program.buffers[grad].dtype.size_in_bytes();
                    meter.hold(MemoryCategory::Gradients, grad_elements * accumulated)
                }
                None => {}
            }
        }
        for (g, _) in program
            .weight_gathers
            .iter()
            .zip(&self.fused)
            .filter(|(_, &f)| !f)
        {
            let width = program.buffers[program.params[g.param].buffer]
                .dtype
                .size_in_bytes();
            let bytes = sizes.pieces[g.param].map_or(0, |elements| elements * width);
            meter.hold(MemoryCategory::Communication, bytes);
        }
    }

    /// Walks the steps of a non-pipelined run: each buffer allocated by its first writer and
    /// freed after its last use, prefetched gathers and, with overlap, buckets in flight.
    fn walk_steps(&self, meter: &mut MemoryMeter, sizes: &RankSizes) {
        let (program, lifetimes) = (self.program, &self.lifetimes);
        // With overlap, a bucket's packed gradients are in flight from its step to the end.
        let overlap = program
            .placed
            .config
            .overlap
            .grad_computation_allreduce_overlap;
        let mut in_flight_after = vec![0; program.steps.len()];
        for bucket in program.buckets.iter().filter(|_| overlap) {
            let first = bucket.steps.first().copied();
            let takes_part = first.is_some_and(|s| sizes.in_destination[s]);
            // Half-precision gradients summed in f32 travel widened.
            let widened = first.is_some_and(|s| match &program.steps[s] {
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
        let moved = &self.moved;
        // Prefetched weight gathers (hsdp levels 1–3): each started (its destination
        // allocated, its source copied) when the gather before it runs, the first when the
        // step starts.
        let gathers = &self.gathers;
        let gather_bytes = |g: usize| match &program.steps[g] {
            Step::Reshard(r) if sizes.in_destination[g] => Some((r.to, sizes.buffers[r.from])),
            _ => None,
        };
        let start = |g: usize, meter: &mut MemoryMeter, allocated: &mut [bool]| {
            if let Some((to, src)) = gather_bytes(g) {
                allocated[to] = true;
                meter.hold(lifetimes.category[to], sizes.buffers[to]);
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
                    meter.release(lifetimes.category[from], sizes.buffers[from]);
                }
            }
            let written: &[usize] = match step {
                Step::Kernel(k) => &k.outputs,
                Step::Reshard(r) => std::slice::from_ref(&r.to),
            };
            for &b in written {
                if !allocated[b] {
                    allocated[b] = true;
                    meter.hold(lifetimes.category[b], sizes.buffers[b]);
                }
            }
            // A ring step's working buffers, held for its duration (counted as communication
            // memory, like a reshard's destination).
            if let Some(bytes) = sizes.ring[i] {
                meter.hold(MemoryCategory::Communication, bytes);
                meter.release(MemoryCategory::Communication, bytes);
            }
            meter.hold(MemoryCategory::Communication, in_flight_after[i]);
            for &b in &lifetimes.release_after[i] {
                if allocated[b] {
                    allocated[b] = false;
                    meter.release(lifetimes.category[b], sizes.buffers[b]);
                }
            }
        }
    }
}

/// Per fused gather bucket, the size of `rank`'s group (`None` outside every group).
fn gather_groups(program: &Program, rank: usize) -> Vec<Option<usize>> {
    let group_of = |bucket: &crate::fusion::GatherBucket| {
        bucket
            .groups
            .iter()
            .find(|g| g.contains(&rank))
            .map(Vec::len)
    };
    program.gather_buckets.iter().map(group_of).collect()
}

/// What a rank's sizes read of the layouts: one mesh of each distinct rank list (of the
/// buffers, the parameters, their optimizer pieces and the `asked` reshards' destinations),
/// and the unevenly split layouts among the buffers' and the optimizer pieces', whose boxes
/// differ from slot to slot.
fn asked_layouts<'a>(
    program: &'a Program,
    asked: &[usize],
) -> (Vec<&'a layout::Mesh>, Vec<&'a layout::TensorLayout>) {
    let buffers = program.buffers.iter().map(|b| b.layout.layout());
    let pieces = program
        .params
        .iter()
        .map(|p| p.optimizer_shard().map_or(&p.layout, |shard| &shard.layout));
    let params = program.params.iter().map(|p| &p.layout);
    let destinations = asked.iter().filter_map(|&s| match &program.steps[s] {
        Step::Reshard(r) => Some(r.plan.dst()),
        Step::Kernel(_) => None,
    });
    let mut meshes = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for layout in buffers
        .clone()
        .chain(pieces.clone())
        .chain(params)
        .chain(destinations)
    {
        let ranks = layout.mesh().rank_list();
        // Interned lists are shared: the same address and length is the same list (two
        // copies of one list only cost a second entry).
        if seen.insert((ranks.as_ptr() as usize, ranks.len())) {
            meshes.push(layout.mesh());
        }
    }
    let uneven = buffers.chain(pieces).filter(|l| !l.is_uniform()).collect();
    (meshes, uneven)
}

/// The bytes of a sum of buffer `b` over a step's micro-batches on a rank of `sizes` (a
/// pipelined step's micro-batch sum): `b`'s elements in the dtype gradients of `b`'s type
/// accumulate in ([`crate::ParallelConfig::gradient_accumulation_dtype`]: f32 for a half type,
/// unless gradient sums are in the half type).
fn summed_bytes(program: &Program, b: usize, sizes: &RankSizes) -> usize {
    let dtype = program.buffers[b].dtype;
    sizes.buffers[b] / dtype.size_in_bytes() * accumulation_width(program, dtype)
}

/// The fused weight gathers after the update: each bucket's packed pieces and the gathered
/// buffer, held while it runs.
fn hold_fused_gathers(meter: &mut MemoryMeter, program: &Program, sizes: &RankSizes) {
    for (bucket, group) in program.gather_buckets.iter().zip(&sizes.gather_groups) {
        if let Some(members) = group {
            let transient = bucket.bytes * (1 + members);
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

/// The working buffers `rank` holds while it runs `step`, when it is ring attention
/// ([`crate::ring::ring_workspace_bytes`]).
fn ring_workspace(program: &Program, step: &Step, rank: usize) -> Option<usize> {
    match step {
        Step::Kernel(k) => crate::ring::ring_workspace_bytes(program, k, rank),
        Step::Reshard(_) => None,
    }
}
