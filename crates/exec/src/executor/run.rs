//! Running the program's steps: whole runs, the step lists of a pipelined step, the gradient
//! buckets and prefetched gathers that overlap them, and the weight gathers after an update.

use std::time::{Duration, Instant};

use comm::Tag;
use graph::{eval_op, EvalCtx, Placement};
use parallel::memory::MemoryCategory;
use parallel::{Program, Step};
use tensor::Tensor;

use super::RankExecutor;
use crate::error::ExecError;
use crate::pipeline::{SpanKind, TraceSpan};
use crate::profile::SpanStart;
use crate::progress::Job;

impl RankExecutor {
    /// After the optimizer has updated this rank's piece of every parameter in place, brings
    /// the updated pieces together into the whole weights (the program's weight gathers,
    /// `hsdp` levels `zero1` and `zero2`; nothing otherwise).
    pub fn gather_updated_weights(&mut self) -> Result<(), ExecError> {
        let program = self.program.clone();
        let fused = parallel::fusion::fused_gathers(&program);
        for bucket in &program.gather_buckets {
            self.run_gather_bucket(&program, bucket)?;
        }
        let unfused = program.weight_gathers.iter().zip(&fused);
        for ((g, _), src) in unfused
            .zip(&mut self.gather_sources)
            .filter(|((_, &f), _)| !f)
        {
            let p = &program.params[g.param];
            if p.layout.mesh().slot_of_rank(self.rank).is_none() {
                continue;
            }
            let piece = &self.pieces[g.param];
            let param = self.buffers[p.buffer]
                .take()
                .expect("buffers are put back after every step");
            let width = param.dtype().size_in_bytes();
            let start = piece.param_offset * width;
            let len = src.as_bytes().len();
            src.as_bytes_mut()
                .copy_from_slice(&param.as_bytes()[start..start + len]);
            let mut out = [param];
            let result = self.runner.run_into(&g.plan, &[&*src], &mut out);
            let [param] = out;
            self.buffers[p.buffer] = Some(param);
            result?;
        }
        Ok(())
    }

    /// One fused weight gather (`[parallel.comm_fusion] allgather`): this rank's updated
    /// pieces of the bucket's parameters, concatenated, all-gathered over its group, and every
    /// member's piece copied to its rows of the parameter's slice.
    fn run_gather_bucket(
        &mut self,
        program: &Program,
        bucket: &parallel::fusion::GatherBucket,
    ) -> Result<(), ExecError> {
        let Some(group) = bucket.groups.iter().find(|g| g.contains(&self.rank)) else {
            return Ok(());
        };
        let params: Vec<usize> = bucket
            .gathers
            .iter()
            .map(|&g| program.weight_gathers[g].param)
            .collect();
        let mut packed = Vec::with_capacity(bucket.bytes);
        let mut lengths = Vec::with_capacity(params.len());
        for &i in &params {
            let param = self.param(i);
            let width = param.dtype().size_in_bytes();
            let piece = &self.pieces[i];
            let len = piece.shape.iter().product::<usize>() * width;
            let start = piece.param_offset * width;
            packed.extend_from_slice(&param.as_bytes()[start..start + len]);
            lengths.push(len);
        }
        let mut gathered = vec![0u8; packed.len() * group.len()];
        let transient = packed.len() + gathered.len();
        self.meter.hold(MemoryCategory::Communication, transient);
        let result = self
            .runner
            .group(group)
            .and_then(|comm| Ok(comm.all_gather_bytes(&packed, &mut gathered)?));
        self.meter.release(MemoryCategory::Communication, transient);
        result?;
        let mut at = 0;
        for member in 0..group.len() {
            for (&i, &len) in params.iter().zip(&lengths) {
                let dst = &mut self.param_mut(i).as_bytes_mut()[member * len..(member + 1) * len];
                dst.copy_from_slice(&gathered[at..at + len]);
                at += len;
            }
        }
        Ok(())
    }

    /// Runs every step of the program once, each buffer freed after its last use.
    pub fn run(&mut self) -> Result<(), ExecError> {
        self.materialize_parameters()?;
        let program = self.program.clone();
        if let Some(p) = self.profile.as_mut() {
            p.runs += 1;
        }
        if let Some(first) = self.first_prefetch {
            self.start_gather(&program, first)?;
        }
        // The `BiasAdd` step whose bias the last product added as its epilogue.
        let mut bias_added = None;
        // The `BiasAddGrad` step whose sums the step before it took, and the sums.
        let mut bias_grad: Option<(usize, Tensor)> = None;
        for i in 0..program.steps.len() {
            if let Some((_, sums)) = bias_grad.take_if(|(j, _)| *j == i) {
                self.store_bias_grad(&program, i, sums)?;
            } else if let Some(j) = self.fused_bias_grad(i) {
                bias_grad = self.run_summing_rows(&program, i, j)?.map(|sums| (j, sums));
            } else if self.prefetched[i] {
                self.finish_gather(&program, i)?;
            } else if let Some(moved) = self.moved[i].filter(|_| self.offsets[i].is_some()) {
                self.run_moved(&program, i, moved, bias_added == Some(i))?;
            } else if !self.fused[i] {
                let epilogue =
                    self.bias_epilogue[i].filter(|&j| self.offsets[j].is_some() && !self.fused[j]);
                self.run_step(&program, i, None, epilogue)?;
                bias_added = epilogue;
            }
            if let Some(next) = self.prefetch_after[i] {
                self.start_gather(&program, next)?;
            }
            for b in 0..self.buckets_after[i].len() {
                self.run_bucket(&program, self.buckets_after[i][b])?;
            }
            if let Some(progress) = self.overlap.as_mut() {
                progress.poll()?;
            }
            self.release_after(i);
        }
        self.collect_buckets(&program)?;
        self.finish_gradients();
        Ok(())
    }

    /// Runs the steps `steps` (indices into the program's steps, in order); a reshard given a
    /// tag moves its data as point-to-point messages with that tag
    /// ([`reshard_exec::ReshardRunner::run_into_messages`]), so that the other side may run it
    /// later. The pieces of a pipelined training step. Buffers written stay allocated (the
    /// pipeline keeps each micro-batch's).
    pub fn run_steps(&mut self, steps: &[(usize, Option<Tag>)]) -> Result<(), ExecError> {
        self.materialize_parameters()?;
        let program = self.program.clone();
        for &(i, tag) in steps {
            if i >= program.steps.len() {
                return Err(ExecError::Mismatch {
                    what: "a step to run".to_string(),
                    expected: format!("below {}", program.steps.len()),
                    got: i.to_string(),
                });
            }
            self.run_step(&program, i, tag, None)?;
        }
        Ok(())
    }

    /// Scales the gradients as MindSpore's flags ask (`Program::grad_scale`), once per step.
    pub fn finish_gradients(&mut self) {
        let program = self.program.clone();
        if program.grad_scale != 1.0 {
            for p in &program.params {
                if let Some(g) = p.grad_buffer {
                    scale(self.buffer_mut(g), program.grad_scale);
                }
            }
        }
    }

    /// The reshard steps of bucket `b` this rank takes part in.
    fn bucket_steps<'p>(&self, program: &'p Program, b: usize) -> Vec<&'p parallel::ReshardStep> {
        program.buckets[b]
            .steps
            .iter()
            .filter_map(|&s| match &program.steps[s] {
                Step::Reshard(r) if self.holds(r.plan.dst()) => Some(r),
                _ => None,
            })
            .collect()
    }

    /// Runs bucket `b` of `program`'s fused gradient reductions as one collective, or with
    /// overlap packs it and hands it to the progress thread.
    fn run_bucket(&mut self, program: &Program, b: usize) -> Result<(), ExecError> {
        let started = self.profile.is_some().then(SpanStart::now);
        let steps = self.bucket_steps(program, b);
        let plans: Vec<&reshard::ReshardPlan> = steps.iter().map(|r| &*r.plan).collect();
        let packed = {
            let srcs: Vec<&Tensor> = steps
                .iter()
                .map(|r| {
                    self.buffers[r.from]
                        .as_ref()
                        .expect("a fused reduction's source is computed")
                })
                .collect();
            // A bucket holds gradients.
            let half_sum = crate::precision::half_sum(&program.placed.config, true);
            let modes = (self.runner.is_deterministic(), half_sum);
            // The last step's bucket of this size, its values stale: packing overwrites them.
            let spare = srcs.first().and_then(|first| {
                let total = srcs.iter().map(|t| t.n_elements()).sum::<usize>();
                self.recycler.take(first.dtype(), &[total])
            });
            reshard_exec::PackedReduction::pack(&plans, &srcs, self.rank, modes, spare)?
        };
        if let Some(mut packed) = packed {
            let overlapped = program
                .placed
                .config
                .overlap
                .grad_computation_allreduce_overlap;
            match self.overlap.as_mut().filter(|_| overlapped) {
                Some(reducer) => {
                    // In flight until collected: counted as communication memory.
                    self.meter
                        .hold(MemoryCategory::Communication, packed.bytes());
                    reducer.submit(Job::Bucket(b, packed))?;
                }
                None => {
                    self.runner.reduce_packed(&mut packed)?;
                    self.unpack_bucket(program, b, &packed)?;
                    self.recycle_bucket(packed);
                }
            }
        }
        if let (Some(p), Some(t)) = (self.profile.as_mut(), started) {
            p.reshard(crate::profile::FUSED_BUCKETS, t.elapsed(), t.waited());
        }
        Ok(())
    }

    /// Writes bucket `b`'s reduced gradients into their buffers.
    fn unpack_bucket(
        &mut self,
        program: &Program,
        b: usize,
        packed: &reshard_exec::PackedReduction,
    ) -> Result<(), ExecError> {
        let steps = self.bucket_steps(program, b);
        // Unpacking writes every element of every destination.
        let mut outs: Vec<Tensor> = steps.iter().map(|r| self.take_output(r.to, true)).collect();
        let result = {
            let mut dsts: Vec<&mut Tensor> = outs.iter_mut().collect();
            packed.unpack(&mut dsts)
        };
        for (r, t) in steps.iter().zip(outs) {
            self.buffers[r.to] = Some(t);
        }
        Ok(result?)
    }

    /// Keeps a bucket's packed buffer, once unpacked, for the next step's bucket of its size.
    fn recycle_bucket(&mut self, packed: reshard_exec::PackedReduction) {
        let room = self.recycler_room();
        self.recycler.keep(packed.into_data(), room);
    }

    /// Hands the gather of step `i` (an hsdp weight's, levels 1–3) to the progress thread: its
    /// destination is allocated now, and the copy of its source counts as communication until
    /// it is done.
    fn start_gather(&mut self, program: &Program, i: usize) -> Result<(), ExecError> {
        let Step::Reshard(r) = &program.steps[i] else {
            return Ok(());
        };
        if !self.holds(r.plan.dst()) {
            return Ok(());
        }
        let dst = self.take_for_writing(r.to);
        let src = self.buffers[r.from]
            .clone()
            .expect("a parameter's buffer is always held");
        self.meter
            .hold(MemoryCategory::Communication, src.as_bytes().len());
        let job = Job::Gather {
            step: i,
            plan: r.plan.clone(),
            src,
            dst,
        };
        self.overlap
            .as_mut()
            .expect("gathers are prefetched with a progress worker")
            .submit(job)?;
        Ok(())
    }

    /// Takes the prefetched gather of step `i` into its buffer.
    fn finish_gather(&mut self, program: &Program, i: usize) -> Result<(), ExecError> {
        let Step::Reshard(r) = &program.steps[i] else {
            return Ok(());
        };
        if !self.holds(r.plan.dst()) {
            return Ok(());
        }
        let started = self.profile.is_some().then(SpanStart::now);
        let (dst, src) = self
            .overlap
            .as_mut()
            .expect("gathers are prefetched with a progress worker")
            .take_gather(i)?;
        self.meter
            .release(MemoryCategory::Communication, src.as_bytes().len());
        self.buffers[r.to] = Some(dst);
        if let (Some(p), Some(t)) = (self.profile.as_mut(), started) {
            p.reshard(crate::profile::PREFETCHED_GATHERS, t.elapsed(), t.waited());
        }
        Ok(())
    }

    /// Waits for the buckets handed to the progress thread and writes their gradients.
    fn collect_buckets(&mut self, program: &Program) -> Result<(), ExecError> {
        let Some(reducer) = self.overlap.as_mut() else {
            return Ok(());
        };
        let started = self.profile.is_some().then(SpanStart::now);
        for (b, packed) in reducer.collect_buckets()? {
            self.unpack_bucket(program, b, &packed)?;
            self.meter
                .release(MemoryCategory::Communication, packed.bytes());
            self.recycle_bucket(packed);
        }
        if let (Some(p), Some(t)) = (self.profile.as_mut(), started) {
            p.reshard(crate::profile::FUSED_BUCKETS, t.elapsed(), t.waited());
        }
        Ok(())
    }

    /// Runs the ring attention of step `i` (a `FlashAttention` or its gradient whose sequence
    /// is split, [`crate::ring`]) over this rank's ring; the time it waited for blocks and
    /// its spans.
    fn ring_step(
        &self,
        i: usize,
        attention: (bool, f64),
        ins: &[&Tensor],
        outs: &mut [Tensor],
    ) -> Result<crate::ring::RingTiming, ExecError> {
        let ring = self.rings[i].as_ref().expect("a ring step has its ring");
        let tag = crate::ring::ring_tag(i)?;
        let comm = self.runner.world().as_ref();
        let how = crate::ring::RingAttention {
            causal: attention.0,
            scale: attention.1,
            canonical: self.deterministic.is_some(),
        };
        match (ins, outs) {
            ([q, k, v], [out, lse]) => {
                crate::ring::forward(comm, ring, tag, how, (q, k, v), (out, lse))
            }
            ([q, k, v, out, lse, dout], [dq, dk, dv]) => crate::ring::backward(
                comm,
                ring,
                tag,
                how,
                [q, k, v, out, lse, dout],
                [dq, dk, dv],
            ),
            _ => unreachable!("FlashAttention has 3 inputs and 2 outputs, its gradient 6 and 3"),
        }
    }

    /// Adds the token choices a `MoeRoute` step dropped (chosen, given no capacity slot) in
    /// this rank's block of its outputs to [`RankExecutor::take_moe_dropped`]'s count; only the
    /// first replica of the block counts, so the ranks' counts add up to the whole batch's.
    fn count_dropped_choices(
        &mut self,
        program: &Program,
        k: &parallel::KernelStep,
        outs: &[Tensor],
    ) {
        let layout = program.buffers[k.outputs[0]].layout.layout();
        let first_replica = layout
            .mesh()
            .slot_of_rank(self.rank)
            .is_some_and(|slot| layout.replica_index(slot) == 0);
        if let ([dispatch, chosen, ..], true) = (outs, first_replica) {
            let sum = |t: &Tensor| t.to_f64_vec().iter().sum::<f64>();
            self.moe_dropped += sum(chosen) - sum(dispatch);
        }
    }

    /// Step `i` as a move of its dying input `from` to its output `to`
    /// ([`parallel::memory::moved_buffers`]); an op computed in place then writes its result
    /// over the moved tensor ([`graph::eval_in_place`]), timed as its kind when profiling,
    /// unless `computed` (a `BiasAdd` its product ran as its epilogue); a whole-slice
    /// all-reduce sums over it, timed as communication. A rank that holds no slice of a
    /// reshard's source does nothing.
    fn run_moved(
        &mut self,
        program: &Program,
        i: usize,
        (from, to): (usize, usize),
        computed: bool,
    ) -> Result<(), ExecError> {
        let started = self.profile.is_some().then(SpanStart::now);
        if let Step::Reshard(r) = &program.steps[i] {
            if !self.holds(r.plan.src().layout()) {
                return Ok(());
            }
        }
        self.move_buffer(i, (from, to))?;
        let k = match &program.steps[i] {
            Step::Kernel(k) => k,
            Step::Reshard(r) => {
                // The sum taken over the moved slice: no copy on either side of it.
                self.runner.set_half_sum(self.half_sums[i]);
                let mut slice = self.buffers[to].take().expect("the move just put it there");
                let result = self.runner.all_reduce_in_place(&r.plan, &mut slice);
                self.buffers[to] = Some(slice);
                result?;
                if let (Some(p), Some(t)) = (self.profile.as_mut(), started) {
                    p.reshard(r.plan.collective_on(self.rank), t.elapsed(), t.waited());
                }
                return Ok(());
            }
        };
        let Some(input) = k
            .inputs
            .iter()
            .position(|&b| b == from)
            .filter(|&input| k.op.computes_in_place_over(input) && !computed)
        else {
            if let (Some(p), Some(t), true) = (self.profile.as_mut(), started, computed) {
                p.kernel(k.op.kind(), t.elapsed());
            }
            return Ok(());
        };
        let mut acc = self.buffers[to].take().expect("the move just put it there");
        let result = {
            let ctx = EvalCtx {
                node: &k.name,
                step: self.step,
                placement: None,
                input_blocks: &[],
                deterministic: self.deterministic,
            };
            let other = self.buffer(k.inputs[1 - input]);
            graph::eval_in_place(&k.op, input, &mut acc, other, &ctx)
        };
        self.buffers[to] = Some(acc);
        result?;
        if let (Some(p), Some(t)) = (self.profile.as_mut(), started) {
            p.kernel(k.op.kind(), t.elapsed());
        }
        Ok(())
    }

    /// Runs step `i` of `program` (this executor's program); a product given `bias_add` (the
    /// `BiasAdd` step over its output, [`RankExecutor`]'s `bias_epilogue`) adds that step's
    /// bias as its epilogue.
    fn run_step(
        &mut self,
        program: &Program,
        i: usize,
        tag: Option<Tag>,
        bias_add: Option<usize>,
    ) -> Result<(), ExecError> {
        let step = &program.steps[i];
        let started = self.profile.is_some().then(SpanStart::now);
        // Ring attention's time blocked waiting for blocks (communication, not compute).
        let mut ring_wait = Duration::ZERO;
        let mut ring_spans = Vec::new();
        // Ring attention's working buffers, held while it ran (counted as communication).
        let mut ring_workspace = 0;
        match step {
            Step::Kernel(_) if self.offsets[i].is_none() => return Ok(()),
            Step::Kernel(k) => {
                let whole = k.op.writes_every_output_element();
                let mut outs: Vec<Tensor> = k
                    .outputs
                    .iter()
                    .map(|&b| self.take_output(b, whole))
                    .collect();
                let result = {
                    let ins: Vec<&Tensor> = k.inputs.iter().map(|&b| self.buffer(b)).collect();
                    let out_layout = program.buffers[k.outputs[0]].layout.layout();
                    let ctx = EvalCtx {
                        node: &k.name,
                        step: self.step,
                        placement: Some(Placement {
                            offset: self.offsets[i].as_deref().unwrap_or_default(),
                            global_shape: out_layout.shape(),
                        }),
                        input_blocks: &self.input_blocks[i],
                        deterministic: self.deterministic,
                    };
                    match &k.op {
                        graph::Op::FlashAttention { causal, scale }
                        | graph::Op::FlashAttentionGrad { causal, scale }
                            if self.rings[i].is_some() =>
                        {
                            self.ring_step(i, (*causal, *scale), &ins, &mut outs)
                                .map(|timing| {
                                    ring_wait = timing.waited;
                                    ring_spans = timing.spans;
                                    ring_workspace = timing.workspace_bytes;
                                })
                        }
                        graph::Op::Fill { shape, dtype, .. }
                            if self.loss_seed[i] && self.loss_scale != 1.0 =>
                        {
                            let scaled = graph::Op::Fill {
                                shape: shape.clone(),
                                dtype: *dtype,
                                value: self.loss_scale,
                            };
                            eval_op(&scaled, &ins, &mut outs, &ctx).map_err(ExecError::from)
                        }
                        op => match bias_add.map(|j| &program.steps[j]) {
                            Some(Step::Kernel(add)) => {
                                let bias = self.buffer(add.inputs[1]);
                                graph::eval_product_with_bias(op, &ins, bias, &mut outs[0], &ctx)
                                    .map_err(ExecError::from)
                            }
                            _ => eval_op(op, &ins, &mut outs, &ctx).map_err(ExecError::from),
                        },
                    }
                };
                self.meter
                    .hold(MemoryCategory::Communication, ring_workspace);
                self.meter
                    .release(MemoryCategory::Communication, ring_workspace);
                if result.is_ok() && matches!(k.op, graph::Op::MoeRoute { .. }) && !k.recompute {
                    self.count_dropped_choices(program, k, &outs);
                }
                for (&b, t) in k.outputs.iter().zip(outs) {
                    self.buffers[b] = Some(t);
                }
                result?;
            }
            Step::Reshard(r) => {
                self.runner.set_half_sum(self.half_sums[i]);
                // A rank outside the source (destination) mesh gives (takes) no slice:
                // between pipeline stages one side sends and the other receives.
                let gives = self.holds(r.plan.src().layout());
                let takes = self.holds(r.plan.dst());
                let mut out: Vec<Tensor> = if takes {
                    vec![self.take_for_writing(r.to)]
                } else {
                    Vec::new()
                };
                let result = {
                    let src: Vec<&Tensor> = if gives {
                        vec![self.buffers[r.from]
                            .as_ref()
                            .expect("reshard source present")]
                    } else {
                        Vec::new()
                    };
                    match tag {
                        Some(tag) => self.runner.run_into_messages(&r.plan, &src, &mut out, tag),
                        None => self.runner.run_into(&r.plan, &src, &mut out),
                    }
                };
                if let Some(t) = out.pop() {
                    self.buffers[r.to] = Some(t);
                }
                result?;
            }
        }
        if let (Some(trace), Step::Kernel(k)) = (self.ring_trace.as_mut(), step) {
            let origin = crate::pipeline::epoch();
            let us = |t: Instant| t.saturating_duration_since(origin).as_secs_f64() * 1e6;
            trace.extend(ring_spans.iter().map(|s| TraceSpan {
                rank: self.rank,
                name: match s.wait {
                    true => format!("wait {} pass {}", k.name, s.pass),
                    false => format!("{} pass {}", k.name, s.pass),
                },
                start_us: us(s.from),
                dur_us: (s.to - s.from).as_secs_f64() * 1e6,
                kind: match s.wait {
                    true => SpanKind::Wait,
                    false => SpanKind::Compute,
                },
            }));
        }
        if let (Some(p), Some(t)) = (self.profile.as_mut(), started) {
            match step {
                Step::Kernel(k) => {
                    p.kernel(k.op.kind(), t.elapsed().saturating_sub(ring_wait));
                    if !ring_wait.is_zero() {
                        p.reshard(crate::profile::RING_WAITS, ring_wait, ring_wait);
                    }
                }
                Step::Reshard(r) => {
                    p.reshard(r.plan.collective_on(self.rank), t.elapsed(), t.waited())
                }
            }
        }
        Ok(())
    }
}

fn scale(t: &mut Tensor, factor: f64) {
    if let Ok(xs) = t.as_slice_mut::<f32>() {
        let f = factor as f32;
        xs.iter_mut().for_each(|x| *x *= f);
    } else if let Ok(xs) = t.as_slice_mut::<f64>() {
        xs.iter_mut().for_each(|x| *x *= factor);
    }
}
