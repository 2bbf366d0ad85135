//! Running a [`Program`] on one rank: the executor, its buffers, parameters and optimizer
//! pieces (the steps themselves run in [`run`]).

use std::sync::Arc;

use comm::Communicator;
use graph::InputBlock;
use layout::{SliceBox, TensorLayout};
use parallel::memory::{lifetimes, moved_buffers, BufferLifetimes, MemoryCategory, MemoryMeter};
use parallel::{Program, Step};
use reshard::HalfSum;
use reshard_exec::ReshardRunner;
use tensor::Tensor;

use crate::error::ExecError;
use crate::pipeline::TraceSpan;
use crate::profile::StepProfile;
use crate::progress::Progress;
use crate::recycle::Recycler;

mod bias_grad;
mod pieces;
mod run;

pub use pieces::OptimizerPiece;
use pieces::{optimizer_pieces, slot_of};

/// One rank's executor of a program: its buffers (this rank's block of every value), and a
/// reshard runner over the world communicator.
///
/// Built once; every [`RankExecutor::run`] evaluates the program's steps in order into the same
/// buffers, so a training step allocates only the messages of its reshards.
#[derive(Debug)]
pub struct RankExecutor {
    program: Arc<Program>,
    rank: usize,
    buffers: Vec<Option<Tensor>>,
    runner: ReshardRunner,
    /// For each step, the offset of this rank's output block in the global tensor (kernel
    /// steps), for ops whose values depend on global positions; `None` for a kernel of another
    /// pipeline stage, which this rank skips.
    offsets: Vec<Option<Vec<usize>>>,
    /// For each step, where this rank's block of every input lies (kernel steps), for ops
    /// that depend on which part of an input they get (a vocabulary-parallel embedding).
    input_blocks: Vec<Vec<InputBlock>>,
    step: u64,
    /// Deterministic mode's most canonical blocks per summed dim ([`RankExecutor::set_deterministic`]).
    deterministic: Option<usize>,
    /// Time per kind of step, when profiling ([`RankExecutor::set_profiling`]).
    profile: Option<StepProfile>,
    /// For each parameter, the part of it this rank's optimizer updates.
    pieces: Vec<OptimizerPiece>,
    /// For each of the program's weight gathers, a buffer for this rank's updated piece.
    gather_sources: Vec<Tensor>,
    /// When each buffer is allocated and freed.
    lifetimes: BufferLifetimes,
    /// The bytes held, by category.
    meter: MemoryMeter,
    /// By step: the (input, output) buffers of a copy whose output takes over its dying
    /// input's tensor in a non-pipelined run ([`parallel::memory::moved_buffers`]).
    moved: Vec<Option<(usize, usize)>>,
    /// By step: for a product whose output the next step, a `BiasAdd` computed over it in
    /// place (a `moved` step), reads and lets die, that step: in a non-pipelined run (ordinary
    /// or deterministic mode) the product adds the bias as its epilogue
    /// ([`graph::eval_product_with_bias`]) and the `BiasAdd` only takes the buffer over.
    bias_epilogue: Vec<Option<usize>>,
    /// By step: for an activation's gradient (not moved) or an arithmetic op computed in
    /// place (a `moved` step) whose output the next step, a `BiasAddGrad`, sums over its rows,
    /// that step: in a non-pipelined run the op sums its rows as it writes them
    /// ([`graph::eval_with_bias_grad`]) and the `BiasAddGrad` only stores the sums.
    bias_grad_fusion: Vec<Option<usize>>,
    /// By step: whether it runs fused in a bucket rather than alone.
    fused: Vec<bool>,
    /// By step: the buckets that run after it.
    buckets_after: Vec<Vec<usize>>,
    /// With `[parallel.overlap]`: where buckets are reduced and weights gathered while the
    /// steps go on.
    overlap: Option<Progress>,
    /// With `computation_allgather_overlap`: by step, the hsdp weight gather started after it
    /// (`prefetch_after`), and whether the step's own gather was started before
    /// (`prefetched`).
    prefetch_after: Vec<Option<usize>>,
    prefetched: Vec<bool>,
    /// The first prefetched gather, started when a run begins.
    first_prefetch: Option<usize>,
    /// By step: whether it seeds the backward pass with the loss's gradient (a `Fill` of 1).
    loss_seed: Vec<bool>,
    /// The factor the loss seed is multiplied by (mixed precision's loss scale; 1 otherwise).
    loss_scale: f64,
    /// By step: how its pending sum adds half-precision values.
    half_sums: Vec<HalfSum>,
    /// Lazy parameters ([`RankExecutor::with_lazy_parameters`]): the buffers of parameters
    /// neither filled nor loaded yet, and the seed they are filled from when a run needs them.
    lazy: Option<LazyParameters>,
    /// Bytes of parameter values filled by their initialisers so far.
    initialised_bytes: usize,
    /// By step: the ring of a `FlashAttention` (or its gradient) whose sequence is split
    /// (context parallel's ring attention, [`crate::ring`]).
    rings: Vec<Option<crate::ring::Ring>>,
    /// With [`RankExecutor::set_ring_tracing`]: the ring attention steps' spans since the last
    /// [`RankExecutor::take_ring_trace`].
    ring_trace: Option<Vec<TraceSpan>>,
    /// Token choices this rank's `MoeRoute` steps dropped since the last
    /// [`RankExecutor::take_moe_dropped`].
    moe_dropped: f64,
    /// Freed buffers kept for outputs that are written whole ([`crate::recycle`]).
    recycler: Recycler,
}

/// The parameters a lazy executor has not allocated yet.
#[derive(Debug, Clone, Default)]
struct LazyParameters {
    /// Parameter indices still unallocated.
    pending: Vec<usize>,
    /// The seed of [`RankExecutor::init_parameters`], once called.
    seed: Option<u64>,
}

/// [`RankExecutor`]'s `bias_epilogue`: by step, the `BiasAdd` step right after a `MatMul` or
/// `BatchMatMul` that adds a bias over the product's output in place, the output dying there
/// (the step is in `moved` with the product's output as its source).
pub fn bias_epilogues(program: &Program, moved: &[Option<(usize, usize)>]) -> Vec<Option<usize>> {
    let fused_into = |i: usize| {
        let (Step::Kernel(product), Some(Step::Kernel(add))) =
            (&program.steps[i], program.steps.get(i + 1))
        else {
            return None;
        };
        let is_product = matches!(
            product.op,
            graph::Op::MatMul { .. } | graph::Op::BatchMatMul { .. }
        );
        let out = *product.outputs.first()?;
        let adds_over_it = matches!(add.op, graph::Op::BiasAdd)
            && add.inputs.len() == 2
            && add.inputs[0] == out
            && add.inputs[1] != out
            && moved[i + 1] == Some((out, *add.outputs.first()?));
        (is_product && adds_over_it).then_some(i + 1)
    };
    (0..program.steps.len()).map(fused_into).collect()
}

/// [`RankExecutor`]'s `bias_grad_fusion`: by step, the `BiasAddGrad` step that sums the step's
/// output (and nothing else) into a bias's gradient right after it, or after one `Reshape` that
/// takes the output over (`moved`), when the step can sum the rows as it writes them: an
/// activation's gradient (`GeluGrad`, `ReluGrad`, `TanhGrad`, `SigmoidGrad`) or
/// `PackedAttentionGrad`, not moved, or an arithmetic op computed in place over its dying
/// input (`moved`). No step of these recomputes; the `BiasAddGrad` is not moved.
pub fn bias_grad_fusions(
    program: &Program,
    moved: &[Option<(usize, usize)>],
) -> Vec<Option<usize>> {
    let kernel = |i: usize| match program.steps.get(i) {
        Some(Step::Kernel(k)) if !k.recompute => Some(k),
        _ => None,
    };
    let fused_into = |i: usize| {
        let op = kernel(i)?;
        let &[out] = op.outputs.as_slice() else {
            return None;
        };
        let in_place = matches!(
            op.op,
            graph::Op::Add | graph::Op::Sub | graph::Op::Mul | graph::Op::Div
        ) && moved[i].is_some_and(|(_, to)| to == out);
        let summing = matches!(
            op.op,
            graph::Op::GeluGrad { .. }
                | graph::Op::ReluGrad
                | graph::Op::TanhGrad
                | graph::Op::SigmoidGrad
                | graph::Op::PackedAttentionGrad { .. }
        ) && moved[i].is_none();
        if !(in_place || summing) {
            return None;
        }
        // A reshape that takes the output over changes no element's place.
        let (mut j, mut summed) = (i + 1, out);
        if let Some(reshape) = kernel(j).filter(|k| matches!(k.op, graph::Op::Reshape { .. })) {
            if moved[j] == Some((out, reshape.outputs[0])) {
                (j, summed) = (j + 1, reshape.outputs[0]);
            }
        }
        let sum = kernel(j)?;
        (matches!(sum.op, graph::Op::BiasAddGrad) && sum.inputs == [summed] && moved[j].is_none())
            .then_some(j)
    };
    (0..program.steps.len()).map(fused_into).collect()
}

/// With `[parallel.overlap]` and something to overlap (gradient buckets, prefetched `gathers`):
/// this rank's progress worker — a thread on the local backend, whose group communicators are
/// created here, job kind by job kind in program order, by every rank alike; inline under MPI.
fn progress_for(
    program: &Program,
    world: &Arc<dyn Communicator>,
    gathers: &[usize],
) -> Result<Option<Progress>, ExecError> {
    let overlap = &program.placed.config.overlap;
    let buckets = overlap.grad_computation_allreduce_overlap && !program.buckets.is_empty();
    if !buckets && gathers.is_empty() {
        return Ok(None);
    }
    let mut runner = ReshardRunner::new(world.clone());
    if world.backend() != "local" {
        return Ok(Some(Progress::inline(runner)));
    }
    let rank = world.rank();
    for bucket in program.buckets.iter().filter(|_| buckets) {
        let Some(Step::Reshard(first)) = bucket.steps.first().map(|&s| &program.steps[s]) else {
            continue;
        };
        let Some(key) = reshard::fusion_key(&first.plan) else {
            continue;
        };
        if let Some(g) = key.groups.iter().position(|g| g.contains(&rank)) {
            runner.group(&key.groups[g])?;
            if key.canonical[g] != key.groups[g] {
                runner.group(&key.canonical[g])?;
            }
        }
    }
    for &g in gathers {
        if let Step::Reshard(r) = &program.steps[g] {
            for exchange in reshard::lower(&r.plan) {
                if exchange.ranks.contains(&rank) {
                    runner.group(&exchange.ranks)?;
                }
            }
        }
    }
    Ok(Some(Progress::thread(runner)))
}

impl RankExecutor {
    /// An executor of `program` for the rank of `world` (world ranks are device ranks).
    pub fn new(
        program: Arc<Program>,
        world: Arc<dyn Communicator>,
    ) -> Result<RankExecutor, ExecError> {
        RankExecutor::build(program, world, false)
    }

    /// An executor that allocates no parameter until it is loaded ([`RankExecutor::set_param`])
    /// or a run needs it, when [`RankExecutor::init_parameters`]' seed fills it (MindSpore's
    /// `no_init_parameters`): a resumed run never fills what it then overwrites.
    pub fn with_lazy_parameters(
        program: Arc<Program>,
        world: Arc<dyn Communicator>,
    ) -> Result<RankExecutor, ExecError> {
        RankExecutor::build(program, world, true)
    }

    fn build(
        program: Arc<Program>,
        world: Arc<dyn Communicator>,
        lazy: bool,
    ) -> Result<RankExecutor, ExecError> {
        let rank = world.rank();
        if world.size() != program.devices() {
            return Err(ExecError::Mismatch {
                what: "communicator".to_string(),
                expected: format!("{} ranks (the program's devices)", program.devices()),
                got: format!("{} ranks", world.size()),
            });
        }
        // Buffers that live across steps now; a step's own when a step first writes them. A
        // buffer of another pipeline stage's ranks holds nothing here.
        let lifetimes = lifetimes(&program);
        let moved = moved_buffers(&program, &lifetimes);
        let bias_epilogue = bias_epilogues(&program, &moved);
        let bias_grad_fusion = bias_grad_fusions(&program, &moved);
        let mut meter = MemoryMeter::default();
        let lazy = lazy.then(|| LazyParameters {
            pending: (0..program.params.len())
                .filter(|&p| {
                    let layout = &program.params[p].layout;
                    layout.mesh().slot_of_rank(rank).is_some()
                })
                .collect(),
            seed: None,
        });
        let unallocated: Vec<usize> = lazy
            .iter()
            .flat_map(|l| &l.pending)
            .map(|&p| program.params[p].buffer)
            .collect();
        let buffers = program
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let held = b.layout.layout().mesh().slot_of_rank(rank).is_some();
                let shape = if held { b.local_shape(rank) } else { vec![0] };
                let persistent = lifetimes.persistent[i] && !unallocated.contains(&i);
                persistent.then(|| {
                    let t = Tensor::zeros(b.dtype, &shape);
                    meter.hold(lifetimes.category[i], t.as_bytes().len());
                    t
                })
            })
            .collect();
        let mut offsets = Vec::with_capacity(program.steps.len());
        let mut input_blocks = Vec::with_capacity(program.steps.len());
        for step in &program.steps {
            let (offset, blocks) = match step {
                Step::Kernel(k)
                    if program.buffers[k.outputs[0]]
                        .layout
                        .layout()
                        .mesh()
                        .slot_of_rank(rank)
                        .is_none() =>
                {
                    // Another stage's op: this rank skips it.
                    (None, Vec::new())
                }
                Step::Kernel(k) => {
                    let layout = program.buffers[k.outputs[0]].layout.layout();
                    let blocks = k
                        .inputs
                        .iter()
                        .map(|&b| {
                            let layout = program.buffers[b].layout.layout();
                            Ok(InputBlock {
                                offset: layout.slot_box(slot_of(layout, rank)?).offset.into_vec(),
                                global_shape: layout.shape().to_vec(),
                            })
                        })
                        .collect::<Result<Vec<_>, ExecError>>()?;
                    (
                        Some(layout.slot_box(slot_of(layout, rank)?).offset.into_vec()),
                        blocks,
                    )
                }
                Step::Reshard(_) => (Some(Vec::new()), Vec::new()),
            };
            offsets.push(offset);
            input_blocks.push(blocks);
        }
        let rings = program
            .steps
            .iter()
            .map(|step| match step {
                Step::Kernel(k) => parallel::ring::ring_of_step(&program, k, rank),
                Step::Reshard(_) => None,
            })
            .collect();
        let mut fused = vec![false; program.steps.len()];
        let mut buckets_after = vec![Vec::new(); program.steps.len()];
        for (b, bucket) in program.buckets.iter().enumerate() {
            for &s in &bucket.steps {
                fused[s] = true;
            }
            buckets_after[bucket.ready_after].push(b);
        }
        let gathers = parallel::fusion::prefetched_gathers(&program);
        let overlap = progress_for(&program, &world, &gathers)?;
        let mut prefetch_after = vec![None; program.steps.len()];
        let mut prefetched = vec![false; program.steps.len()];
        for w in gathers.windows(2) {
            prefetch_after[w[0]] = Some(w[1]);
        }
        for &g in &gathers {
            prefetched[g] = true;
        }
        let config = &program.placed.config;
        let grads: Vec<usize> = program
            .params
            .iter()
            .filter_map(|p| p.grad_buffer)
            .collect();
        let half_sums = program
            .steps
            .iter()
            .map(|s| match s {
                Step::Reshard(r) => crate::precision::half_sum(config, grads.contains(&r.to)),
                Step::Kernel(_) => HalfSum::default(),
            })
            .collect();
        let loss_seed = program
            .steps
            .iter()
            .map(|s| match s {
                Step::Kernel(k) => {
                    matches!(
                        program.placed.graph.nodes()[k.node.0].role,
                        graph::NodeRole::Seed { .. }
                    ) && matches!(k.op, graph::Op::Fill { value, .. } if value == 1.0)
                }
                Step::Reshard(_) => false,
            })
            .collect();
        let pieces = optimizer_pieces(&program, rank)?;
        let fused_gathers = parallel::fusion::fused_gathers(&program);
        let gather_sources = program
            .weight_gathers
            .iter()
            .zip(&fused_gathers)
            .map(|(g, &fused)| {
                let dtype = program.buffers[program.params[g.param].buffer].dtype;
                // A fused gather packs its source with its bucket's.
                let shape = if fused {
                    vec![0]
                } else {
                    pieces[g.param].shape.clone()
                };
                let t = Tensor::zeros(dtype, &shape);
                meter.hold(MemoryCategory::Communication, t.as_bytes().len());
                t
            })
            .collect();
        Ok(RankExecutor {
            program,
            rank,
            pieces,
            gather_sources,
            buffers,
            runner: ReshardRunner::new(world),
            offsets,
            input_blocks,
            rings,
            ring_trace: None,
            moe_dropped: 0.0,
            recycler: Recycler::default(),
            step: 0,
            deterministic: None,
            profile: None,
            moved,
            bias_epilogue,
            bias_grad_fusion,
            lifetimes,
            meter,
            fused,
            buckets_after,
            overlap,
            prefetch_after,
            prefetched,
            first_prefetch: gathers.first().copied(),
            loss_seed,
            loss_scale: 1.0,
            half_sums,
            lazy,
            initialised_bytes: 0,
        })
    }

    /// Multiplies the gradient seeding the backward pass by `scale` (a loss scale), so every
    /// gradient comes out `scale` times the loss's.
    pub fn set_loss_scale(&mut self, scale: f64) {
        self.loss_scale = scale;
    }

    /// The bytes this rank holds, by category, and their peaks so far. The training loop adds
    /// what it keeps beside the program's buffers (optimizer state, accumulation buffers).
    pub fn memory(&mut self) -> &mut MemoryMeter {
        &mut self.meter
    }

    /// Allocates every buffer now, for good: a pipelined step keeps its buffers (and swaps
    /// in each micro-batch's), so none is allocated or freed step by step.
    pub fn allocate_all(&mut self) {
        let pending: Vec<usize> = self
            .lazy
            .iter()
            .flat_map(|l| &l.pending)
            .map(|&p| self.program.params[p].buffer)
            .collect();
        for b in 0..self.buffers.len() {
            if self.buffers[b].is_none() && !pending.contains(&b) {
                let t = self.take_for_writing(b);
                self.buffers[b] = Some(t);
            }
        }
    }

    /// Buffer `b` to be written: the one held, or a fresh one, counted.
    fn take_for_writing(&mut self, b: usize) -> Tensor {
        self.take_output(b, false)
    }

    /// Buffer `b` for a step to write: the one already there, else a recycled one when the
    /// step writes every element (`whole`), else a fresh zeroed one; a new one is counted.
    pub(crate) fn take_output(&mut self, b: usize, whole: bool) -> Tensor {
        if let Some(t) = self.buffers[b].take() {
            return t;
        }
        let recycled = whole
            .then(|| {
                self.recycler
                    .take(self.program.buffers[b].dtype, &self.fresh_shape(b))
            })
            .flatten();
        let t = recycled.unwrap_or_else(|| self.fresh_buffer(b));
        self.meter
            .hold(self.lifetimes.category[b], t.as_bytes().len());
        self.recycler.shrink_to(self.recycler_room());
        t
    }

    /// The bytes the recycler may keep: the meter's peak less what is live, so live and
    /// recycled buffers together never exceed the reported peak.
    fn recycler_room(&self) -> usize {
        let live = self.meter.current().total();
        self.meter.report().peak.saturating_sub(live)
    }

    /// Step `i` of a non-pipelined run as a move: buffer `from` (read last here) becomes
    /// buffer `to`, reshaped, with no copy; the memory meter moves its bytes between their
    /// categories.
    fn move_buffer(&mut self, i: usize, (from, to): (usize, usize)) -> Result<(), ExecError> {
        let Some(t) = self.buffers[from].take() else {
            return Err(ExecError::Mismatch {
                what: format!("the input of step {i}"),
                expected: "a computed buffer".to_string(),
                got: "none".to_string(),
            });
        };
        if let Some(old) = self.buffers[to].take() {
            self.meter
                .release(self.lifetimes.category[to], old.as_bytes().len());
        }
        let bytes = t.as_bytes().len();
        let shape = self.fresh_shape(to);
        let t = t.reshape(&shape)?;
        self.meter.release(self.lifetimes.category[from], bytes);
        self.meter.hold(self.lifetimes.category[to], bytes);
        self.buffers[to] = Some(t);
        Ok(())
    }

    /// Frees the buffers whose last use is step `i`.
    fn release_after(&mut self, i: usize) {
        for &b in &self.lifetimes.release_after[i] {
            if let Some(t) = self.buffers[b].take() {
                self.meter
                    .release(self.lifetimes.category[b], t.as_bytes().len());
                let room = self.recycler_room();
                self.recycler.keep(t, room);
            }
        }
    }

    /// The rank lists of every sub-group communicator this rank has created so far (its
    /// reshards' and its progress worker's), ascending.
    pub fn created_groups(&self) -> Vec<Vec<usize>> {
        let mut groups = self.runner.created_groups();
        if let Some(progress) = &self.overlap {
            groups.extend(progress.created_groups());
        }
        groups.sort();
        groups.dedup();
        groups
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The program.
    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    /// The step counter dropout masks are drawn for.
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// Whether this rank holds a part of tensors laid out as `layout` (with pipeline stages, a
    /// rank holds only its stage's).
    pub fn holds(&self, layout: &TensorLayout) -> bool {
        layout.mesh().slot_of_rank(self.rank).is_some()
    }

    /// Whether this rank holds a shard of parameter `index`.
    pub fn holds_param(&self, index: usize) -> bool {
        self.program
            .params
            .get(index)
            .is_some_and(|p| self.holds(&p.layout))
    }

    /// The part of `layout`'s global tensor this rank holds.
    pub fn box_of(&self, layout: &TensorLayout) -> Result<SliceBox, ExecError> {
        Ok(layout.slot_box(slot_of(layout, self.rank)?))
    }

    /// Initialises this rank's shard of every parameter; every sharding gives the same global
    /// values for one seed.
    ///
    /// A lazy executor ([`RankExecutor::with_lazy_parameters`]) only keeps the seed: each
    /// parameter not loaded by then is filled when a run first needs it.
    pub fn init_parameters(&mut self, seed: u64) -> Result<(), ExecError> {
        if let Some(lazy) = self.lazy.as_mut() {
            lazy.seed = Some(seed);
            return Ok(());
        }
        let program = self.program.clone();
        let rank = self.rank;
        let held = |p: &&parallel::ProgramParam| p.layout.mesh().slot_of_rank(rank).is_some();
        for p in program.params.iter().filter(held) {
            let t = self.filled_param(p, seed)?;
            self.buffers[p.buffer] = Some(t);
        }
        Ok(())
    }

    /// This rank's shard of `p` filled by its initialiser from `seed`.
    fn filled_param(&mut self, p: &parallel::ProgramParam, seed: u64) -> Result<Tensor, ExecError> {
        let region = self.box_of(&p.layout)?;
        let dtype = self.program.buffers[p.buffer].dtype;
        // A shared parameter's copy starts from its owner's values.
        let name = parallel::pipeline::shared_copy_of(&p.name).map_or(p.name.as_str(), |c| c.0);
        let t = p.init.fill(p.layout.shape(), &region, dtype, seed, name)?;
        self.initialised_bytes += t.as_bytes().len();
        Ok(t)
    }

    /// Bytes of parameter values this rank has filled by their initialisers: every shard's
    /// once the parameters are initialised eagerly, only those of parameters no checkpoint
    /// loaded under lazy initialisation.
    pub fn initialised_bytes(&self) -> usize {
        self.initialised_bytes
    }

    /// Fills every parameter a lazy executor has not allocated yet (nothing otherwise): what a
    /// run does first. An error if [`RankExecutor::init_parameters`] gave no seed.
    pub fn materialize_parameters(&mut self) -> Result<(), ExecError> {
        let Some(lazy) = self.lazy.as_mut() else {
            return Ok(());
        };
        if lazy.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut lazy.pending);
        let Some(seed) = lazy.seed else {
            let name = &self.program.params[pending[0]].name;
            return Err(ExecError::Mismatch {
                what: format!("parameter {name} of a lazily initialised program"),
                expected: "a seed (init_parameters) or loaded values (set_param) before a run"
                    .to_string(),
                got: "neither".to_string(),
            });
        };
        let program = self.program.clone();
        for &i in &pending {
            let p = &program.params[i];
            let t = self.filled_param(p, seed)?;
            self.meter
                .hold(MemoryCategory::Parameters, t.as_bytes().len());
            self.buffers[p.buffer] = Some(t);
        }
        Ok(())
    }

    /// Sets this rank's shard of parameter `index` to `values` (a loaded checkpoint), which
    /// must have the shard's shape and dtype; a lazy executor allocates nothing else for it.
    pub fn set_param(&mut self, index: usize, values: Tensor) -> Result<(), ExecError> {
        let p = &self.program.params[index];
        let spec = &self.program.buffers[p.buffer];
        let shape = spec.local_shape(self.rank);
        if values.shape() != shape.as_slice() || values.dtype() != spec.dtype {
            return Err(ExecError::Mismatch {
                what: format!("values of parameter {}", p.name),
                expected: format!("{shape:?} {}", spec.dtype),
                got: format!("{:?} {}", values.shape(), values.dtype()),
            });
        }
        let b = p.buffer;
        if let Some(lazy) = self.lazy.as_mut() {
            if let Some(at) = lazy.pending.iter().position(|&q| q == index) {
                lazy.pending.swap_remove(at);
                self.meter
                    .hold(MemoryCategory::Parameters, values.as_bytes().len());
            }
        }
        self.buffers[b] = Some(values);
        Ok(())
    }

    /// The dtype of parameter `index` (known before a lazy executor allocates it).
    pub fn param_dtype(&self, index: usize) -> tensor::DType {
        self.program.buffers[self.program.params[index].buffer].dtype
    }

    fn buffer(&self, b: usize) -> &Tensor {
        self.buffers[b]
            .as_ref()
            .expect("buffers are put back after every step")
    }

    fn buffer_mut(&mut self, b: usize) -> &mut Tensor {
        self.buffers[b]
            .as_mut()
            .expect("buffers are put back after every step")
    }

    /// Writes this rank's block of input `index` (its shape must be the input's local shape).
    pub fn set_input(&mut self, index: usize, local: &Tensor) -> Result<(), ExecError> {
        let input = &self.program.inputs[index];
        let spec = &self.program.buffers[input.buffer];
        let shape = spec.local_shape(self.rank);
        if local.shape() != shape.as_slice() || local.dtype() != spec.dtype {
            return Err(ExecError::Mismatch {
                what: format!("input {}", input.name),
                expected: format!("{:?} {}", shape, spec.dtype),
                got: format!("{:?} {}", local.shape(), local.dtype()),
            });
        }
        let b = input.buffer;
        self.buffer_mut(b)
            .as_bytes_mut()
            .copy_from_slice(local.as_bytes());
        Ok(())
    }

    /// This rank's shard of parameter `index`.
    pub fn param(&self, index: usize) -> &Tensor {
        self.buffer(self.program.params[index].buffer)
    }

    /// This rank's shard of parameter `index`, writable.
    pub fn param_mut(&mut self, index: usize) -> &mut Tensor {
        let b = self.program.params[index].buffer;
        self.buffer_mut(b)
    }

    /// This rank's shard of the gradient of parameter `index` after a run, in the parameter's
    /// layout (`None` for parameters without a gradient).
    pub fn grad(&self, index: usize) -> Option<&Tensor> {
        self.program.params[index]
            .grad_buffer
            .map(|b| self.buffer(b))
    }

    /// This rank's shard of the gradient of parameter `index`, writable.
    pub fn grad_mut(&mut self, index: usize) -> Option<&mut Tensor> {
        let b = self.program.params[index].grad_buffer?;
        Some(self.buffer_mut(b))
    }

    /// The shard of parameter `index` and of its gradient together (for an optimizer update).
    pub fn param_and_grad(&mut self, index: usize) -> Option<(&mut Tensor, &Tensor)> {
        let p = &self.program.params[index];
        let (pb, gb) = (p.buffer, p.grad_buffer?);
        debug_assert_ne!(pb, gb);
        // Split the borrow: the two buffers are distinct.
        let (lo, hi) = self.buffers.split_at_mut(pb.max(gb));
        let (param, grad) = if pb < gb {
            (lo[pb].as_mut(), hi[0].as_ref())
        } else {
            (hi[0].as_mut(), lo[gb].as_ref())
        };
        Some((param?, grad?))
    }

    /// The part of parameter `index` this rank's optimizer updates (the whole shard without
    /// `hsdp`).
    pub fn optimizer_piece(&self, index: usize) -> &OptimizerPiece {
        &self.pieces[index]
    }

    /// Output `index` after a run (replicated: the whole value).
    pub fn output(&self, index: usize) -> &Tensor {
        self.buffer(self.program.outputs[index].buffer)
    }

    /// Feeds input `index` from `rows`, this rank's rows of the global batch (every other dim
    /// whole): the rest of the rank's box is cut from them when the input's other dims are
    /// split too.
    pub fn set_input_rows(&mut self, index: usize, rows: Tensor) -> Result<(), ExecError> {
        let layout = self.program.inputs[index].layout.clone();
        let mut within = self.box_of(&layout)?;
        if let Some(o) = within.offset.first_mut() {
            *o = 0;
        }
        let block = if within.shape[..] == *rows.shape() {
            rows
        } else {
            rows.extract_box(&within)?
        };
        self.set_input(index, &block)
    }

    /// Deterministic mode (`Some(max canonical blocks)`): the summing kernels and the pending
    /// sums of reshards add in the canonical order; `None` turns it off.
    pub fn set_deterministic(&mut self, max_blocks: Option<usize>) {
        self.deterministic = max_blocks;
        self.runner.set_deterministic(max_blocks.is_some());
    }

    /// Turns the per-step timing of [`RankExecutor::run`] on (a fresh [`StepProfile`]) or off.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(StepProfile::default);
    }

    /// The time per kind of step since profiling was turned on.
    pub fn profile(&self) -> Option<&StepProfile> {
        self.profile.as_ref()
    }

    /// Turns the recording of ring attention's timeline on or off: each ring step's passes, as
    /// attending (`compute`) and waiting-for-a-block (`wait`) spans named after the step's node
    /// and pass (`blocks.0.attn.flash pass 1`, `wait blocks.0.attn.flash pass 1`).
    pub fn set_ring_tracing(&mut self, on: bool) {
        self.ring_trace = on.then(Vec::new);
    }

    /// The ring spans recorded since the last call (empty when tracing is off or no step ran a
    /// ring).
    pub fn take_ring_trace(&mut self) -> Vec<TraceSpan> {
        self.ring_trace
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The token choices this rank's mixture-of-experts routing dropped (chosen, given no
    /// capacity slot) since the last call, counted on the first replica of each block of the
    /// routing's outputs (recomputed routing not counted again): summed over the ranks, the
    /// batch's dropped choices.
    pub fn take_moe_dropped(&mut self) -> f64 {
        std::mem::take(&mut self.moe_dropped)
    }

    /// Swaps the buffers `indices` with `store` (one tensor per index): a pipelined step keeps
    /// one set of a micro-batch's buffers per micro-batch in flight.
    pub fn swap_buffers(&mut self, indices: &[usize], store: &mut [Option<Tensor>]) {
        for (&b, t) in indices.iter().zip(store.iter_mut()) {
            std::mem::swap(&mut self.buffers[b], t);
        }
    }

    /// A zeroed tensor shaped like buffer `b` on this rank (empty when another stage holds it).
    pub fn fresh_buffer(&self, b: usize) -> Tensor {
        Tensor::zeros(self.program.buffers[b].dtype, &self.fresh_shape(b))
    }

    /// Buffer `b`'s shape on this rank (`[0]` when another stage holds it).
    fn fresh_shape(&self, b: usize) -> Vec<usize> {
        let spec = &self.program.buffers[b];
        if self.holds(spec.layout.layout()) {
            spec.local_shape(self.rank)
        } else {
            vec![0]
        }
    }

    /// [`RankExecutor::fresh_buffer`], its bytes counted in `b`'s memory category until
    /// [`RankExecutor::release_counted`] (a pipelined micro-batch's own buffers).
    pub fn fresh_counted(&mut self, b: usize) -> Tensor {
        let t = self.fresh_buffer(b);
        self.meter
            .hold(self.lifetimes.category[b], t.as_bytes().len());
        t
    }

    /// A zeroed sum of buffer `b` over a pipelined step's micro-batches, in the dtype its
    /// gradients accumulate in ([`parallel::ParallelConfig::gradient_accumulation_dtype`]:
    /// f32 for a half-precision buffer unless gradient sums are in the half type), its bytes
    /// counted in `b`'s memory category until [`RankExecutor::release_counted`].
    pub fn fresh_sum_counted(&mut self, b: usize) -> Tensor {
        let dtype = self
            .program
            .placed
            .config
            .gradient_accumulation_dtype(self.program.buffers[b].dtype);
        let t = Tensor::zeros(dtype, &self.fresh_shape(b));
        self.meter
            .hold(self.lifetimes.category[b], t.as_bytes().len());
        t
    }

    /// Stops counting `t`, a [`RankExecutor::fresh_counted`] (or
    /// [`RankExecutor::fresh_sum_counted`]) buffer of `b`, as it is dropped.
    pub fn release_counted(&mut self, b: usize, t: Tensor) {
        self.meter
            .release(self.lifetimes.category[b], t.as_bytes().len());
    }

    /// Buffer `b` (for accumulating a micro-batch's gradients).
    pub fn buffer_at(&self, b: usize) -> &Tensor {
        self.buffer(b)
    }

    /// Buffer `b`, writable.
    pub fn buffer_at_mut(&mut self, b: usize) -> &mut Tensor {
        self.buffer_mut(b)
    }
}
