//! Pipelined training steps: every rank runs its stage's forward and backward passes of the
//! micro-batches in the order its schedule lists them (`parallel::pipeline::Schedule`); the
//! activations and gradients that cross stages travel as point-to-point messages, so a stage
//! sends and goes on; each micro-batch in flight has its own buffers; the gradients (and the
//! loss) are summed over the micro-batches and reduced once per step.

use std::sync::OnceLock;
use std::time::Instant;

use comm::{Tag, MAX_TAG};
use parallel::pipeline::{
    frees_micro_batch, step_reads, step_writes, Action, ActionKind, MicroBatchBuffers, Schedule,
    StepPhase,
};
use parallel::Program;
use tensor::Tensor;

use crate::error::ExecError;
use crate::executor::RankExecutor;

/// Called after each micro-batch's reductions in deterministic mode (see
/// [`PipelineRunner::run_step`]): the executor and the micro-batch. `E` is the caller's error
/// type.
pub type MicroBatchReduced<'a, E = ExecError> =
    dyn FnMut(&mut RankExecutor, usize) -> Result<(), E> + 'a;

/// One span of a rank's timeline in a pipelined step.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSpan {
    /// The rank.
    pub rank: usize,
    /// What ran: `F3` (forward of micro-batch 3), `B3`, `W3`; `wait F3` / `wait B3` (receiving
    /// what the pass needs from another stage, the time the pipeline keeps this rank idle); or
    /// the runtime's own work around a pass (`buffers 3`: a micro-batch's buffers, `feed F3`: its
    /// inputs, `sum W3`: adding its gradients to the step's sums).
    pub name: String,
    /// Microseconds since the process's first pipelined step.
    pub start_us: f64,
    /// Microseconds.
    pub dur_us: f64,
    /// What the rank did in the span.
    pub kind: SpanKind,
}

/// What a rank did during a [`TraceSpan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// A scheduled pass (forward, backward or weight-gradient steps of the program).
    Compute,
    /// Waiting to receive an activation or gradient from another stage.
    Wait,
    /// The runtime's bookkeeping between passes: a micro-batch's inputs, its buffers, summing
    /// its gradients.
    Runtime,
}

impl SpanKind {
    /// The Chrome trace category: `compute`, `wait` or `runtime`.
    pub fn category(self) -> &'static str {
        match self {
            SpanKind::Compute => "compute",
            SpanKind::Wait => "wait",
            SpanKind::Runtime => "runtime",
        }
    }
}

/// One rank's timeline of a pipelined step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepTrace {
    /// The spans, in order.
    pub spans: Vec<TraceSpan>,
    /// The share of this rank's own span (its first span's start to its last one's end) spent
    /// waiting for other stages. The run's measured bubble ([`crate::measured_bubble`]) also
    /// counts the time before and after this span within the step's span over every rank.
    pub bubble: f64,
    /// The most micro-batches whose buffers this rank held at once.
    pub peak_in_flight: usize,
    /// The bytes of one micro-batch's buffers on this rank (activations, their gradients and
    /// the transfers' copies).
    pub micro_batch_bytes: usize,
    /// With `parallel.pipeline.output_broadcast`: every micro-batch's loss, computed by the
    /// last stage and broadcast to every rank (empty otherwise).
    pub micro_batch_losses: Vec<f32>,
    /// Microseconds this rank worked (waits left out) in its forward passes, its full or
    /// input-gradient backward passes, and its weight-gradient passes, each with the runtime's
    /// bookkeeping around it (buffers and inputs with the forward, the gradients' sum with a
    /// micro-batch's last pass).
    pub pass_us: PassTimes,
}

/// Time per kind of pass (see [`StepTrace::pass_us`]), summed over a step's passes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PassTimes {
    /// Forward passes.
    pub forward: f64,
    /// Full backward passes, or zero bubble's input-gradient halves.
    pub backward_input: f64,
    /// Zero bubble's weight-gradient halves.
    pub backward_weight: f64,
}

impl PassTimes {
    /// Adds `us` to the time of `kind` (a full backward counts as an input-gradient one).
    fn add(&mut self, kind: ActionKind, us: f64) {
        match kind {
            ActionKind::Forward => self.forward += us,
            ActionKind::Backward | ActionKind::BackwardInput => self.backward_input += us,
            ActionKind::BackwardWeight => self.backward_weight += us,
        }
    }
}

impl StepTrace {
    /// The rank's own span, in microseconds since the trace origin: its first span's start and
    /// its last span's end (`None` without spans).
    pub fn extent(&self) -> Option<(f64, f64)> {
        let first = self.spans.first()?;
        let last = self.spans.last()?;
        Some((first.start_us, last.start_us + last.dur_us))
    }

    /// Microseconds spent waiting for other stages (the [`SpanKind::Wait`] spans).
    pub fn waiting_us(&self) -> f64 {
        self.spans
            .iter()
            .filter(|s| s.kind == SpanKind::Wait)
            .map(|s| s.dur_us)
            .sum()
    }
}

/// The process's clock origin for traces.
pub(crate) fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Steps to run, in program order, each with the message tag of a transfer between stages.
type StepList = Vec<(usize, Option<Tag>)>;

/// One rank's plan for a pipelined training step.
#[derive(Debug)]
pub struct PipelineRunner {
    /// This rank's stage's actions, in schedule order: kind, micro-batch, model chunk.
    actions: Vec<(ActionKind, usize, usize)>,
    /// Steps run once before the micro-batches, by every rank.
    prologue: StepList,
    /// Per model chunk of this stage, its forward pass of one micro-batch (transfers tagged).
    forward: Vec<StepList>,
    /// Per model chunk, its backward pass of one micro-batch.
    backward: Vec<StepList>,
    /// Per model chunk, the part of its backward that the input gradients sent to the previous
    /// stage need (a split backward's input half, zero bubble's B); the rest is its weight half.
    backward_input: Vec<StepList>,
    /// Per model chunk, `backward` less `backward_input`.
    backward_weight: Vec<StepList>,
    /// Steps run once after the micro-batches, by every rank.
    epilogue: StepList,
    /// Buffers a micro-batch writes: each micro-batch in flight has its own.
    local: Vec<usize>,
    /// Micro-batch buffers summed over the micro-batches (gradients before their reduction, the
    /// loss) and divided by their count before the epilogue.
    summed: Vec<usize>,
    /// Micro-batches per step.
    micro_batches: usize,
    /// This rank.
    rank: usize,
    /// Per step, whether this rank receives in it (a transfer into its stage).
    receives: Vec<bool>,
    /// With `output_broadcast`: the epilogue step that brings the loss from the last stage to
    /// every rank, its source buffer (a micro-batch buffer) and the output buffer it fills.
    output_broadcast: Option<(usize, usize, usize)>,
}

impl PipelineRunner {
    /// The plan of `rank` for `program` under `schedule`, with stages of `per_stage` ranks.
    pub fn new(
        program: &Program,
        schedule: &Schedule,
        rank: usize,
        per_stage: usize,
    ) -> Result<PipelineRunner, ExecError> {
        if program.steps.len() > MAX_TAG as usize {
            return Err(ExecError::Mismatch {
                what: "a pipelined program".to_string(),
                expected: format!("at most {MAX_TAG} steps (one message tag per step)"),
                got: format!("{} steps", program.steps.len()),
            });
        }
        let stage = rank / per_stage.max(1);
        let phases = parallel::pipeline::step_phases(program, per_stage);
        let tag = |i: usize| Some(i as Tag);
        let receives: Vec<bool> = phases
            .iter()
            .map(|p| matches!(p, StepPhase::Transfer { to, .. } if *to == stage))
            .collect();
        let chunks = schedule.chunks().max(1);
        let (mut prologue, mut epilogue) = (Vec::new(), Vec::new());
        let mut forward: Vec<StepList> = vec![Vec::new(); chunks];
        let mut backward: Vec<StepList> = vec![Vec::new(); chunks];
        let mut pass =
            |b: bool, chunk: usize, step: (usize, Option<Tag>)| -> Result<(), ExecError> {
                let lists = if b { &mut backward } else { &mut forward };
                lists
                    .get_mut(chunk)
                    .ok_or_else(|| ExecError::Mismatch {
                        what: "a model chunk of the program".to_string(),
                        expected: format!("below {chunks} (the schedule's chunks)"),
                        got: chunk.to_string(),
                    })?
                    .push(step);
                Ok(())
            };
        for (i, phase) in phases.iter().enumerate() {
            match *phase {
                StepPhase::Prologue => prologue.push((i, None)),
                StepPhase::Epilogue => epilogue.push((i, None)),
                StepPhase::Stage {
                    stage: s,
                    chunk,
                    backward: b,
                } => {
                    if s == stage {
                        pass(b, chunk, (i, None))?;
                    }
                }
                StepPhase::Transfer {
                    from,
                    from_chunk,
                    to,
                    to_chunk,
                    backward: b,
                } => {
                    if from == stage {
                        pass(b, from_chunk, (i, tag(i)))?;
                    }
                    if to == stage {
                        pass(b, to_chunk, (i, tag(i)))?;
                    }
                }
            }
        }
        let MicroBatchBuffers { local, summed } =
            parallel::pipeline::micro_batch_buffers(program, per_stage);
        let (backward_input, backward_weight): (Vec<StepList>, Vec<StepList>) = backward
            .iter()
            .enumerate()
            .map(|(chunk, list)| split_backward(program, &phases, list, stage, chunk))
            .unzip();
        let actions = schedule
            .per_stage()
            .get(stage)
            .map(|list| {
                list.iter()
                    .map(|a| (a.kind, a.micro_batch, a.chunk))
                    .collect()
            })
            .unwrap_or_default();
        Ok(PipelineRunner {
            actions,
            prologue,
            forward,
            backward,
            backward_input,
            backward_weight,
            epilogue,
            local,
            summed,
            micro_batches: schedule.micro_batches(),
            rank,
            receives,
            output_broadcast: None,
        })
    }

    /// Broadcasts every micro-batch's loss from the last stage to every rank
    /// (`parallel.pipeline.output_broadcast`): after the micro-batches, the epilogue's move of
    /// the loss to every rank runs once per micro-batch on that micro-batch's loss, before it
    /// runs on their mean. An error when the program reports no loss made on one stage.
    pub fn broadcast_outputs(
        mut self,
        program: &Program,
        per_stage: usize,
    ) -> Result<PipelineRunner, ExecError> {
        let output = program.outputs.first().map(|o| o.buffer);
        let phases = parallel::pipeline::step_phases(program, per_stage);
        let found = program
            .steps
            .iter()
            .enumerate()
            .find_map(|(i, step)| match step {
                parallel::Step::Reshard(r)
                    if Some(r.to) == output
                        && phases[i] == StepPhase::Epilogue
                        && self.summed.contains(&r.from) =>
                {
                    Some((i, r.from, r.to))
                }
                _ => None,
            });
        self.output_broadcast = Some(found.ok_or_else(|| ExecError::Config {
            key: "parallel.pipeline.output_broadcast".to_string(),
            reason: "the program's loss does not come from one stage's micro-batches, so there is no last-stage output to broadcast".to_string(),
        })?);
        Ok(self)
    }

    /// Runs one training step: the prologue, this stage's passes of every micro-batch in
    /// schedule order (`feed` writes micro-batch `mb`'s inputs before its forward pass; `step`
    /// is the dropout counter of each micro-batch), then the reductions.
    ///
    /// Without `each`, the gradients and the loss are summed over the micro-batches on the
    /// rank, their mean is taken and the epilogue (their reductions) runs once: the executor
    /// then holds the step's gradients and loss as an ordinary run leaves them. Half-precision
    /// gradients are summed in f32 (or in the half type under `gradient_fp32_sync = false`,
    /// see [`parallel::ParallelConfig::gradient_accumulation_dtype`]) and their mean rounded
    /// once into the gradient buffer.
    ///
    /// With `each` (deterministic mode), every micro-batch's gradients and loss are kept apart
    /// and, after the schedule, reduced one micro-batch at a time in micro-batch order: the
    /// epilogue runs on micro-batch `mb`'s values and `each(exec, mb)` then finds that
    /// micro-batch's reduced gradients and loss in the executor, as an unpipelined run of it
    /// leaves them. Gradient accumulation (`train.grad_accumulation_steps`) reduces in that
    /// order, so the caller's sum over the micro-batches adds what one device adds, bit for bit
    /// (the sum of the ranks' local sums over the micro-batches would add the same terms in
    /// another order).
    ///
    /// `feed` and `each` fail with the caller's error type `E`; the runner's own errors are
    /// converted into it.
    pub fn run_step<E: From<ExecError>>(
        &self,
        exec: &mut RankExecutor,
        mut feed: impl FnMut(&mut RankExecutor, usize) -> Result<(), E>,
        step: impl Fn(usize) -> u64,
        mut each: Option<&mut MicroBatchReduced<'_, E>>,
    ) -> Result<StepTrace, E> {
        let apart = each.is_some();
        exec.run_steps(&self.prologue)?;
        let origin = epoch();
        let mut trace = StepTrace::default();
        // A micro-batch's buffers exist from its forward pass to its last backward action, so a
        // schedule's memory is what it keeps in flight (1F1B: at most P − s on stage s).
        let mut slots: Vec<Option<Vec<Option<Tensor>>>> = vec![None; self.micro_batches];
        // Buffers of finished micro-batches, reused by the next ones: every pass writes the
        // buffers it reads later, as unpipelined steps reuse the executor's buffers, so only
        // the step's peak in flight is ever allocated (and counted), and freed after the step.
        let mut pool: Vec<Vec<Option<Tensor>>> = Vec::new();
        let mut in_flight = std::collections::BTreeSet::new();
        // With `output_broadcast`: each micro-batch's loss as this rank holds it (its part of
        // the last stage's value; nothing on other stages).
        let mut mb_outputs: Vec<Option<Tensor>> = vec![None; self.micro_batches];
        let mut sums: Vec<Option<Tensor>> = match apart {
            true => Vec::new(),
            false => self
                .summed
                .iter()
                .map(|&b| Some(exec.fresh_sum_counted(b)))
                .collect(),
        };
        // With `each`: every micro-batch's summed buffers, kept apart until the reductions.
        let mut kept: Vec<Option<Vec<Tensor>>> = vec![None; self.micro_batches];
        for &(kind, mb, chunk) in &self.actions {
            let entry = slots.get_mut(mb).ok_or_else(|| ExecError::Mismatch {
                what: "a scheduled micro-batch".to_string(),
                expected: format!("below {}", self.micro_batches),
                got: mb.to_string(),
            })?;
            let first_span = trace.spans.len();
            let allocated = Instant::now();
            let fresh = entry.is_none() && pool.is_empty();
            let slot = entry.get_or_insert_with(|| {
                pool.pop().unwrap_or_else(|| {
                    self.local
                        .iter()
                        .map(|&b| Some(exec.fresh_counted(b)))
                        .collect()
                })
            });
            if fresh {
                let name = format!("buffers {mb}");
                let span = (allocated, Instant::now());
                self.record(&mut trace, &name, SpanKind::Runtime, span, origin);
            }
            if trace.micro_batch_bytes == 0 {
                trace.micro_batch_bytes = slot.iter().flatten().map(|t| t.as_bytes().len()).sum();
            }
            in_flight.insert(mb);
            trace.peak_in_flight = trace.peak_in_flight.max(in_flight.len());
            exec.swap_buffers(&self.local, slot);
            exec.set_step(step(mb));
            let label = match (kind, self.forward.len()) {
                (ActionKind::Forward, 1) => format!("F{mb}"),
                (ActionKind::BackwardWeight, 1) => format!("W{mb}"),
                (_, 1) => format!("B{mb}"),
                (ActionKind::Forward, _) => format!("F{mb}.{chunk}"),
                (ActionKind::BackwardWeight, _) => format!("W{mb}.{chunk}"),
                _ => format!("B{mb}.{chunk}"),
            };
            let add_sums = |exec: &RankExecutor, sums: &mut [Option<Tensor>]| {
                for (&b, sum) in self.summed.iter().zip(sums.iter_mut()) {
                    let sum = sum.as_mut().expect("sums stay in place");
                    if sum.n_elements() > 0 {
                        tensor::kernels::accumulate_scaled_mixed(sum, 1.0, exec.buffer_at(b))?;
                    }
                }
                Ok::<(), ExecError>(())
            };
            fn pick(lists: &[StepList], chunk: usize) -> &[(usize, Option<Tag>)] {
                lists.get(chunk).map_or(&[], |l| l.as_slice())
            }
            let steps = |lists| pick(lists, chunk);
            // A micro-batch's last action on this stage is chunk 0's (whole or weight) backward.
            let last = frees_micro_batch(&Action::new(kind, mb, chunk));
            let result = match kind {
                ActionKind::Forward => {
                    let fed = Instant::now();
                    (if chunk == 0 { feed(exec, mb) } else { Ok(()) }).and_then(|()| {
                        let span = (fed, Instant::now());
                        let name = format!("feed {label}");
                        self.record(&mut trace, &name, SpanKind::Runtime, span, origin);
                        self.timed(exec, steps(&self.forward), &label, origin, &mut trace)
                            .map_err(E::from)
                    })
                }
                ActionKind::Backward | ActionKind::BackwardInput | ActionKind::BackwardWeight => {
                    let lists = match kind {
                        ActionKind::BackwardInput => &self.backward_input,
                        ActionKind::BackwardWeight => &self.backward_weight,
                        _ => &self.backward,
                    };
                    self.timed(exec, steps(lists), &label, origin, &mut trace)
                        .map_err(E::from)
                }
            }
            .and_then(|()| {
                if last {
                    let summing = Instant::now();
                    if let Some((_, src, _)) = self.output_broadcast {
                        mb_outputs[mb] = Some(exec.buffer_at(src).clone());
                    }
                    let summed = match apart {
                        true => {
                            kept[mb] = Some(
                                self.summed
                                    .iter()
                                    .map(|&b| exec.buffer_at(b).clone())
                                    .collect(),
                            );
                            Ok(())
                        }
                        false => add_sums(exec, &mut sums),
                    };
                    let span = (summing, Instant::now());
                    self.record(
                        &mut trace,
                        &format!("sum {label}"),
                        SpanKind::Runtime,
                        span,
                        origin,
                    );
                    summed.map_err(E::from)
                } else {
                    Ok(())
                }
            });
            exec.swap_buffers(&self.local, slot);
            let worked: f64 = trace.spans[first_span..]
                .iter()
                .filter(|s| s.kind != SpanKind::Wait)
                .map(|s| s.dur_us)
                .sum();
            trace.pass_us.add(kind, worked);
            // The last backward action of a micro-batch hands its buffers to the next one.
            if last {
                pool.extend(entry.take());
                in_flight.remove(&mb);
            }
            result?;
        }
        if let Some((step, src, out)) = self.output_broadcast {
            for (mb, loss) in mb_outputs.into_iter().enumerate() {
                let loss = loss.ok_or_else(|| ExecError::Mismatch {
                    what: format!("micro-batch {mb}'s loss"),
                    expected: "one per micro-batch of the step".to_string(),
                    got: "none: the schedule did not finish it".to_string(),
                })?;
                if loss.n_elements() > 0 {
                    exec.buffer_at_mut(src)
                        .as_bytes_mut()
                        .copy_from_slice(loss.as_bytes());
                }
                exec.run_steps(&[(step, None)])?;
                trace
                    .micro_batch_losses
                    .push(exec.buffer_at(out).to_f64_vec()[0] as f32);
            }
        }
        for slot in pool {
            for (&b, t) in self.local.iter().zip(slot) {
                exec.release_counted(b, t.expect("slots are whole after a swap"));
            }
        }
        match each.as_mut() {
            Some(each) => self.reduce_apart(exec, kept, &mut **each)?,
            None => {
                let share = 1.0 / self.micro_batches as f64;
                for (&b, sum) in self.summed.iter().zip(sums.iter_mut()) {
                    let sum = sum.take().expect("sums stay in place");
                    let dst = exec.buffer_at_mut(b);
                    dst.as_bytes_mut().fill(0);
                    if dst.n_elements() > 0 {
                        tensor::kernels::accumulate_scaled_mixed(dst, share, &sum)
                            .map_err(ExecError::from)?;
                    }
                    exec.release_counted(b, sum);
                }
                exec.run_steps(&self.epilogue)?;
                exec.finish_gradients();
            }
        }
        if let Some((start, end)) = trace.extent() {
            trace.bubble = if end > start {
                (trace.waiting_us() / (end - start)).clamp(0.0, 1.0)
            } else {
                0.0
            };
        }
        Ok(trace)
    }

    /// The reductions of a step whose micro-batches' summed buffers were `kept` apart: for
    /// each micro-batch in order, its values into the summed buffers, the epilogue, then
    /// `each(exec, mb)`.
    fn reduce_apart<E: From<ExecError>>(
        &self,
        exec: &mut RankExecutor,
        kept: Vec<Option<Vec<Tensor>>>,
        each: &mut MicroBatchReduced<'_, E>,
    ) -> Result<(), E> {
        for (mb, values) in kept.into_iter().enumerate() {
            let values = values.ok_or_else(|| ExecError::Mismatch {
                what: format!("micro-batch {mb}'s gradients"),
                expected: "one set per micro-batch of the step".to_string(),
                got: "none: the schedule did not finish it".to_string(),
            })?;
            for (&b, value) in self.summed.iter().zip(&values) {
                if value.n_elements() > 0 {
                    exec.buffer_at_mut(b)
                        .as_bytes_mut()
                        .copy_from_slice(value.as_bytes());
                }
            }
            exec.run_steps(&self.epilogue)?;
            exec.finish_gradients();
            each(exec, mb)?;
        }
        Ok(())
    }

    /// Runs `steps`, recording a busy span for the computation and a waiting span for each
    /// receive from another stage.
    fn timed(
        &self,
        exec: &mut RankExecutor,
        steps: &[(usize, Option<Tag>)],
        label: &str,
        origin: Instant,
        trace: &mut StepTrace,
    ) -> Result<(), ExecError> {
        let mut span_start = Instant::now();
        for &step in steps {
            if self.receives[step.0] {
                let before = Instant::now();
                self.record(
                    trace,
                    label,
                    SpanKind::Compute,
                    (span_start, before),
                    origin,
                );
                exec.run_steps(&[step])?;
                let after = Instant::now();
                let wait = format!("wait {label}");
                self.record(trace, &wait, SpanKind::Wait, (before, after), origin);
                span_start = after;
            } else {
                exec.run_steps(&[step])?;
            }
        }
        let end = Instant::now();
        self.record(trace, label, SpanKind::Compute, (span_start, end), origin);
        Ok(())
    }

    /// Adds the span `from .. to` to `trace` (nothing when it is empty).
    fn record(
        &self,
        trace: &mut StepTrace,
        name: &str,
        kind: SpanKind,
        (from, to): (Instant, Instant),
        origin: Instant,
    ) {
        if to > from {
            trace.spans.push(TraceSpan {
                rank: self.rank,
                name: name.to_string(),
                start_us: from.duration_since(origin).as_secs_f64() * 1e6,
                dur_us: (to - from).as_secs_f64() * 1e6,
                kind,
            });
        }
    }
}

/// Splits this stage's backward steps into the ones the input gradients sent to the previous
/// stage need (walking back from those sends through what each step reads) and the rest, which
/// only make the parameters' gradients.
fn split_backward(
    program: &Program,
    phases: &[StepPhase],
    backward: &[(usize, Option<Tag>)],
    stage: usize,
    chunk: usize,
) -> (StepList, StepList) {
    let mut needed = vec![false; backward.len()];
    let mut wanted: Vec<usize> = Vec::new();
    for (j, &(i, _)) in backward.iter().enumerate().rev() {
        let sends_back = matches!(
            phases[i],
            StepPhase::Transfer { from, from_chunk, backward: true, .. }
                if from == stage && from_chunk == chunk
        );
        if sends_back || step_writes(program, i).iter().any(|b| wanted.contains(b)) {
            needed[j] = true;
            wanted.extend(step_reads(program, i));
        }
    }
    let (mut input, mut weight) = (Vec::new(), Vec::new());
    for (j, &step) in backward.iter().enumerate() {
        if needed[j] { &mut input } else { &mut weight }.push(step);
    }
    (input, weight)
}

/// The Chrome trace-event JSON (Perfetto, chrome://tracing) of the ranks' pipelined steps: one
/// complete event (`"ph": "X"`) per span, a thread per rank; waits are category `wait`.
pub fn chrome_trace(traces: &[(usize, &[StepTrace])]) -> serde_json::Value {
    let mut events = Vec::new();
    for &(rank, steps) in traces {
        events.push(serde_json::json!({
            "name": "thread_name", "ph": "M", "pid": 0, "tid": rank,
            "args": {"name": format!("rank {rank}")},
        }));
        for span in steps.iter().flat_map(|s| &s.spans) {
            events.push(serde_json::json!({
                "name": span.name,
                "cat": span.kind.category(),
                "ph": "X",
                "ts": span.start_us,
                "dur": span.dur_us,
                "pid": 0,
                "tid": rank,
            }));
        }
    }
    serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}
