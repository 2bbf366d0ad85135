//! Pipelined training steps: every rank runs its stage's forward and backward passes of the
//! micro-batches in the order its schedule lists them (`parallel::pipeline::Schedule`); the
//! activations and gradients that cross stages travel as point-to-point messages, so a stage
//! sends and goes on; each micro-batch in flight has its own buffers; the gradients (and the
//! loss) are summed over the micro-batches and reduced once per step.

use comm::{Tag, MAX_TAG};
use parallel::pipeline::{ActionKind, Schedule, StepPhase};
use parallel::{Program, Step};
use tensor::Tensor;

use crate::error::RuntimeError;
use crate::executor::RankExecutor;

/// One rank's plan for a pipelined training step.
#[derive(Debug)]
pub(crate) struct PipelineRunner {
    /// This rank's stage's actions, in schedule order.
    actions: Vec<(ActionKind, usize)>,
    /// Steps run once before the micro-batches, by every rank.
    prologue: Vec<(usize, Option<Tag>)>,
    /// This stage's forward pass of one micro-batch (transfers tagged).
    forward: Vec<(usize, Option<Tag>)>,
    /// This stage's backward pass of one micro-batch.
    backward: Vec<(usize, Option<Tag>)>,
    /// Steps run once after the micro-batches, by every rank.
    epilogue: Vec<(usize, Option<Tag>)>,
    /// Buffers a micro-batch writes: each micro-batch in flight has its own.
    local: Vec<usize>,
    /// Micro-batch buffers summed over the micro-batches (gradients before their reduction, the
    /// loss) and divided by their count before the epilogue.
    summed: Vec<usize>,
    /// Micro-batches per step.
    micro_batches: usize,
}

impl PipelineRunner {
    /// The plan of `rank` for `program` under `schedule`, with stages of `per_stage` ranks.
    pub(crate) fn new(
        program: &Program,
        schedule: &Schedule,
        rank: usize,
        per_stage: usize,
    ) -> Result<PipelineRunner, RuntimeError> {
        if program.steps.len() > MAX_TAG as usize {
            return Err(RuntimeError::Mismatch {
                what: "a pipelined program".to_string(),
                expected: format!("at most {MAX_TAG} steps (one message tag per step)"),
                got: format!("{} steps", program.steps.len()),
            });
        }
        let stage = rank / per_stage.max(1);
        let phases = parallel::pipeline::step_phases(program, per_stage);
        let tag = |i: usize| Some(i as Tag);
        let (mut prologue, mut forward, mut backward, mut epilogue) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut local: Vec<usize> = program.inputs.iter().map(|i| i.buffer).collect();
        for (i, phase) in phases.iter().enumerate() {
            match *phase {
                StepPhase::Prologue => prologue.push((i, None)),
                StepPhase::Epilogue => epilogue.push((i, None)),
                StepPhase::Stage {
                    stage: s,
                    backward: b,
                } => {
                    if s == stage {
                        if b { &mut backward } else { &mut forward }.push((i, None));
                    }
                    local.extend(written(program, i));
                }
                StepPhase::Transfer {
                    from,
                    to,
                    backward: b,
                } => {
                    if from == stage || to == stage {
                        if b { &mut backward } else { &mut forward }.push((i, tag(i)));
                    }
                    local.extend(written(program, i));
                }
            }
        }
        local.sort_unstable();
        local.dedup();
        let mut summed: Vec<usize> = epilogue
            .iter()
            .filter_map(|&(i, _)| match &program.steps[i] {
                Step::Reshard(r) => Some(r.from),
                Step::Kernel(_) => None,
            })
            .chain(program.params.iter().filter_map(|p| p.grad_buffer))
            .chain(program.outputs.iter().map(|o| o.buffer))
            .filter(|b| local.binary_search(b).is_ok())
            .collect();
        summed.sort_unstable();
        summed.dedup();
        let actions = schedule
            .per_stage()
            .get(stage)
            .map(|list| list.iter().map(|a| (a.kind, a.micro_batch)).collect())
            .unwrap_or_default();
        Ok(PipelineRunner {
            actions,
            prologue,
            forward,
            backward,
            epilogue,
            local,
            summed,
            micro_batches: schedule.micro_batches(),
        })
    }

    /// Runs one training step: the prologue, this stage's passes of every micro-batch in
    /// schedule order (`feed` writes micro-batch `mb`'s inputs before its forward pass; `step`
    /// is the dropout counter of each micro-batch), the gradients' and loss's mean over the
    /// micro-batches, then the epilogue (their reductions). The executor then holds the step's
    /// gradients and loss as an ordinary run leaves them.
    pub(crate) fn run_step(
        &self,
        exec: &mut RankExecutor,
        mut feed: impl FnMut(&mut RankExecutor, usize) -> Result<(), RuntimeError>,
        step: impl Fn(usize) -> u64,
    ) -> Result<(), RuntimeError> {
        exec.run_steps(&self.prologue)?;
        let mut slots: Vec<Vec<Option<Tensor>>> = (0..self.micro_batches)
            .map(|_| {
                self.local
                    .iter()
                    .map(|&b| Some(exec.fresh_buffer(b)))
                    .collect()
            })
            .collect();
        let mut sums: Vec<Option<Tensor>> = self
            .summed
            .iter()
            .map(|&b| Some(exec.fresh_buffer(b)))
            .collect();
        for &(kind, mb) in &self.actions {
            let slot = slots.get_mut(mb).ok_or_else(|| RuntimeError::Mismatch {
                what: "a scheduled micro-batch".to_string(),
                expected: format!("below {}", self.micro_batches),
                got: mb.to_string(),
            })?;
            exec.swap_buffers(&self.local, slot);
            exec.set_step(step(mb));
            let result = match kind {
                ActionKind::Forward => feed(exec, mb).and_then(|()| exec.run_steps(&self.forward)),
                ActionKind::Backward | ActionKind::BackwardInput => {
                    exec.run_steps(&self.backward).and_then(|()| {
                        for (&b, sum) in self.summed.iter().zip(sums.iter_mut()) {
                            let sum = sum.as_mut().expect("sums stay in place");
                            if sum.n_elements() > 0 {
                                tensor::kernels::accumulate_scaled(sum, 1.0, exec.buffer_at(b))?;
                            }
                        }
                        Ok(())
                    })
                }
                // The weight half of a split backward runs with its input half.
                ActionKind::BackwardWeight => Ok(()),
            };
            exec.swap_buffers(&self.local, slot);
            result?;
        }
        let share = 1.0 / self.micro_batches as f64;
        for (&b, sum) in self.summed.iter().zip(sums.iter_mut()) {
            let sum = sum.take().expect("sums stay in place");
            let dst = exec.buffer_at_mut(b);
            dst.as_bytes_mut().fill(0);
            if dst.n_elements() > 0 {
                tensor::kernels::accumulate_scaled(dst, share, &sum)?;
            }
        }
        exec.run_steps(&self.epilogue)?;
        exec.finish_gradients();
        Ok(())
    }
}

/// The buffers step `i` writes.
fn written(program: &Program, i: usize) -> Vec<usize> {
    match &program.steps[i] {
        Step::Kernel(k) => k.outputs.clone(),
        Step::Reshard(r) => vec![r.to],
    }
}
