//! One optimizer step: the forward and backward passes over the step's batch (one batch, the
//! one micro-step loop of gradient accumulation — plain or interleaved — or a pipelined step),
//! then the parameter update.

use std::sync::Arc;

use comm::Communicator;
use exec::{
    update_parameters, Accumulation, LossScaler, PipelineRunner, RankExecutor, StepTrace,
    StepUpdate, UpdateContext,
};

use super::feed::StepAt;
use super::run::RankRun;
use super::TrainSession;
use crate::elastic::fault::{strike, FaultPoint};
use crate::error::RuntimeError;

impl TrainSession {
    /// Trains one optimizer step of `run` on the batch `at` at learning rate `lr`: the forward
    /// and backward passes (of one batch, or of every micro-batch of the step), the gradients
    /// of parameters shared by pipeline stages summed over their copies, and the update.
    /// Returns the step's loss and what the update did.
    pub(super) fn train_step(
        &self,
        run: &mut RankRun,
        at: StepAt<'_>,
        lr: f64,
    ) -> Result<(f32, StepUpdate), RuntimeError> {
        let step = run.global_step + 1;
        strike(run.rank, step, FaultPoint::Forward)?;
        run.optimizer.set_learning_rate(lr)?;
        run.exec
            .set_loss_scale(run.scaler.as_ref().map_or(1.0, LossScaler::scale));
        for p in &mut run.partners {
            p.set_loss_scale(run.scaler.as_ref().map_or(1.0, LossScaler::scale));
        }
        let clip = self.config.train().max_grad_norm;
        let world = run.world.as_ref();
        let Some(accumulated) = run.accumulated.as_mut() else {
            self.feed_step(&mut run.exec, at, 0)?;
            run.exec.set_step(run.global_step);
            run.exec.run()?;
            run.shared_grads
                .sum(&mut run.exec, None, &run.trainable, world)?;
            strike(run.rank, step, FaultPoint::Update)?;
            let update = update_parameters(
                &mut run.exec,
                &mut run.optimizer,
                UpdateContext {
                    trainable: &run.trainable,
                    accumulated: None,
                    master: run.master.as_mut(),
                    scaler: run.scaler.as_mut(),
                    world,
                    clip,
                },
            )?;
            return Ok((run.exec.output(0).to_f64_vec()[0] as f32, update));
        };
        let loss = match &run.pipelined {
            Some(runner) => {
                let (loss, trace) = self.pipelined_step(
                    &mut run.exec,
                    runner,
                    accumulated,
                    &run.trainable,
                    at,
                    run.global_step,
                    (&mut run.shared_grads, world),
                )?;
                if self.output_broadcast() {
                    run.outcome
                        .micro_batch_losses
                        .push(trace.micro_batch_losses.clone());
                }
                run.outcome.pipeline.push(trace);
                loss
            }
            None => self.micro_step_loop(
                &mut run.exec,
                &mut run.partners,
                accumulated,
                &run.trainable,
                at,
                run.global_step,
            )?,
        };
        if run.pipelined.is_none() {
            run.shared_grads
                .sum(&mut run.exec, Some(accumulated), &run.trainable, world)?;
        }
        strike(run.rank, step, FaultPoint::Update)?;
        let update = update_parameters(
            &mut run.exec,
            &mut run.optimizer,
            UpdateContext {
                trainable: &run.trainable,
                accumulated: Some(accumulated),
                master: run.master.as_mut(),
                scaler: run.scaler.as_mut(),
                world,
                clip,
            },
        )?;
        Ok((loss, update))
    }

    /// The forward and backward passes of one optimizer step with gradient accumulation, the
    /// one micro-step loop: runs each of the step's micro-batches (`at`: the step's batch) and
    /// leaves in `accumulated[k]` the mean of trainable parameter `trainable[k]`'s gradients
    /// over them — the gradient of the mean loss over all the step's samples, what one run on
    /// the `micro_steps` times larger batch computes. Returns the mean of the micro-batches'
    /// losses, that batch's loss.
    ///
    /// Each micro-batch's gradient is reduced over the ranks by the program, as without
    /// accumulation; the sum here is local to each rank's shard. Dropout draws micro-batch
    /// `j` of optimizer step `s` at step `s · micro_steps + j`, so no two micro-batches share a
    /// mask (the masks are not those of the larger batch: they are keyed by element position).
    ///
    /// What differs between plain and interleaved accumulation is `partners`. Without any,
    /// every micro-batch runs on `exec` in turn. With `parallel.micro_batch_interleave`'s
    /// partners (see [`TrainSession::interleave_partners`]) the micro-steps run in groups of
    /// `1 + partners.len()` parts, the parts of a group at once (part 0 on `exec`, part `j` on
    /// `partners[j − 1]`, each on its own thread and communicators, from the parameters `exec`
    /// holds), so while one part waits in a collective another computes. Either way losses and
    /// gradients are added in micro-batch order, with the same arithmetic.
    pub(super) fn micro_step_loop(
        &self,
        exec: &mut RankExecutor,
        partners: &mut [RankExecutor],
        accumulated: &mut Accumulation,
        trainable: &[usize],
        at: StepAt<'_>,
        global_step: u64,
    ) -> Result<f32, RuntimeError> {
        let micro_steps = self.micro_steps();
        let share = 1.0 / micro_steps as f64;
        accumulated.zero();
        if !partners.is_empty() {
            exec.materialize_parameters()?;
            for p in partners.iter_mut() {
                p.materialize_parameters()?;
                for i in 0..exec.program().params.len() {
                    if exec.holds_param(i) {
                        p.param_mut(i)
                            .as_bytes_mut()
                            .copy_from_slice(exec.param(i).as_bytes());
                    }
                }
            }
        }
        let step_of = |micro: usize| {
            global_step
                .wrapping_mul(micro_steps as u64)
                .wrapping_add(micro as u64)
        };
        let mut loss_sum = 0.0f64;
        let n = partners.len() + 1;
        for first in (0..micro_steps).step_by(n) {
            let others = &mut partners[..(micro_steps - first).min(n) - 1];
            self.feed_step(exec, at, first)?;
            exec.set_step(step_of(first));
            for (j, p) in others.iter_mut().enumerate() {
                self.feed_step(p, at, first + 1 + j)?;
                p.set_step(step_of(first + 1 + j));
            }
            run_parts(exec, others)?;
            loss_sum += exec.output(0).to_f64_vec()[0];
            accumulated.add(exec, trainable, share)?;
            for p in others.iter() {
                loss_sum += p.output(0).to_f64_vec()[0];
                accumulated.add(p, trainable, share)?;
            }
        }
        Ok((loss_sum / micro_steps as f64) as f32)
    }

    /// The forward and backward passes of one pipelined optimizer step: `runner` runs the
    /// step's micro-batches (`at`: the step's batch) through the stages, and `accumulated[k]`
    /// ends with the mean of trainable parameter `trainable[k]`'s gradients over them, as
    /// [`TrainSession::micro_step_loop`] leaves it. Returns the mean of the micro-batches' losses
    /// and this rank's timeline of the step.
    ///
    /// The gradients of parameters shared by several stages are summed over their copies
    /// (`shared`: the sums and the world) before the update. In deterministic mode every
    /// micro-batch's gradients are reduced, summed over the copies and added into
    /// `accumulated` one micro-batch at a time, in the order and with the arithmetic of
    /// [`TrainSession::micro_step_loop`], so a pipelined step is bitwise one device's step with
    /// `train.grad_accumulation_steps` = `micro_batches` (what the pipeline's micro-batches
    /// are); otherwise the rank sums its micro-batches first and reduces once.
    #[allow(clippy::too_many_arguments)]
    fn pipelined_step(
        &self,
        exec: &mut RankExecutor,
        runner: &PipelineRunner,
        accumulated: &mut Accumulation,
        trainable: &[usize],
        at: StepAt<'_>,
        global_step: u64,
        shared: (&mut exec::SharedGradients, &dyn Communicator),
    ) -> Result<(f32, StepTrace), RuntimeError> {
        let (shared_grads, world) = shared;
        let micro_steps = self.micro_steps() as u64;
        let feed = |exec: &mut RankExecutor, mb| self.feed_step(exec, at, mb);
        let step = |mb| {
            global_step
                .wrapping_mul(micro_steps)
                .wrapping_add(mb as u64)
        };
        if self.deterministic.is_none() {
            let trace = runner.run_step(exec, feed, step, None)?;
            accumulated.copy(exec, trainable)?;
            shared_grads.sum(exec, Some(accumulated), trainable, world)?;
            return Ok((exec.output(0).to_f64_vec()[0] as f32, trace));
        }
        let share = 1.0 / micro_steps as f64;
        accumulated.zero();
        let mut loss_sum = 0.0f64;
        let mut each = |exec: &mut RankExecutor, _mb: usize| {
            shared_grads.sum(exec, None, trainable, world)?;
            loss_sum += exec.output(0).to_f64_vec()[0];
            Ok(accumulated.add(exec, trainable, share)?)
        };
        let trace = runner.run_step(exec, feed, step, Some(&mut each))?;
        Ok(((loss_sum / micro_steps as f64) as f32, trace))
    }

    /// This rank's plan for pipelined steps, when the run has pipeline stages and more than one
    /// micro-batch per step.
    pub(super) fn pipeline_runner(
        &self,
        rank: usize,
    ) -> Result<Option<PipelineRunner>, RuntimeError> {
        let Some((schedule, per_stage)) = self.pipeline_schedule()? else {
            return Ok(None);
        };
        let runner = PipelineRunner::new(&self.train, &schedule, rank, per_stage)?;
        Ok(Some(match self.output_broadcast() {
            true => runner.broadcast_outputs(&self.train, per_stage)?,
            false => runner,
        }))
    }

    /// With `parallel.micro_batch_interleave = n` on the local backend: `n − 1` more executors
    /// of the training program for this rank, each over its own communicator of every rank
    /// (so their messages and collectives never mix with the first one's). None otherwise:
    /// under MPI a process's calls hold one lock for a whole collective, so the parts run
    /// one after the other there.
    pub(super) fn interleave_partners(
        &self,
        world: &Arc<dyn Communicator>,
    ) -> Result<Vec<RankExecutor>, RuntimeError> {
        let n = self.config.micro_batch_interleave();
        if n < 2 || world.backend() != "local" {
            return Ok(Vec::new());
        }
        let all: Vec<usize> = (0..world.size()).collect();
        (1..n)
            .map(|_| {
                let own: Arc<dyn Communicator> = Arc::from(world.group(&all)?);
                let mut exec = RankExecutor::new(self.train.clone(), own)?;
                exec.set_deterministic(self.deterministic_blocks());
                exec.init_parameters(self.config.train().seed)?;
                Ok(exec)
            })
            .collect()
    }
}

/// Runs `exec` and, at once, `others` (each on its own thread): the parts of a group of
/// interleaved micro-steps. Without others, just `exec`.
fn run_parts(exec: &mut RankExecutor, others: &mut [RankExecutor]) -> Result<(), RuntimeError> {
    if others.is_empty() {
        exec.run()?;
        return Ok(());
    }
    let (mine, theirs) = std::thread::scope(|s| {
        let handles: Vec<_> = others
            .iter_mut()
            .map(|p| s.spawn(move || p.run()))
            .collect();
        let mine = exec.run();
        let theirs: Vec<Result<(), RuntimeError>> = handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(run) => run.map_err(RuntimeError::from),
                Err(_) => Err(RuntimeError::Mismatch {
                    what: "an interleaved part of the batch".to_string(),
                    expected: "its run to finish".to_string(),
                    got: "its thread panicked".to_string(),
                }),
            })
            .collect();
        (mine, theirs)
    });
    mine?;
    theirs.into_iter().collect::<Result<Vec<()>, _>>()?;
    Ok(())
}
