//! One rank's run: its executors, optimizer and state set up (and resumed), every epoch's steps
//! with their callbacks, evaluations and periodic checkpoints, then the end of the run.

use std::sync::Arc;
use std::time::Instant;

use comm::Communicator;
use exec::{
    parameter_broadcast, Accumulation, LossScaler, MasterWeights, Optimizer, ParamSpec,
    PipelineRunner, RankExecutor,
};
use parallel::memory::MemoryCategory;

use super::feed::StepAt;
use super::{ParamMemory, ParamShard, RankOutcome, TrainSession};
use crate::callbacks::{Callback, EpochInfo, EvalInfo, ShardView, StepInfo, TrainEndInfo};
use crate::error::RuntimeError;
use crate::lr_schedule::LrSchedule;
use crate::periodic_ckpt::SaveSchedule;
use exec::StepUpdate;

/// One rank's state through a run: set up by [`TrainSession::start_rank`], advanced by every step,
/// ended by [`TrainSession::finish_rank`].
pub(super) struct RankRun {
    /// Every rank.
    pub(super) world: Arc<dyn Communicator>,
    /// This rank.
    pub(super) rank: usize,
    /// The training program's executor.
    pub(super) exec: RankExecutor,
    /// The evaluation program's executor.
    pub(super) eval: RankExecutor,
    /// The optimizer of the trainable parameters this rank holds.
    pub(super) optimizer: Optimizer,
    /// The trainable parameters this rank holds (indices into the program's), in the
    /// optimizer's order.
    pub(super) trainable: Vec<usize>,
    /// With `train.grad_accumulation_steps` > 1, the mean gradient of a step's micro-batches.
    pub(super) accumulated: Option<Accumulation>,
    /// This rank's plan for pipelined steps.
    pub(super) pipelined: Option<PipelineRunner>,
    /// `parallel.micro_batch_interleave`'s further executors of this rank.
    pub(super) partners: Vec<RankExecutor>,
    /// Mixed precision's f32 master pieces.
    pub(super) master: Option<MasterWeights>,
    /// The loss scaler, when the gradients carry a loss scale.
    pub(super) scaler: Option<LossScaler>,
    /// Copies of parameters shared by pipeline stages: their gradients summed every step.
    pub(super) shared_grads: exec::SharedGradients,
    /// The global step reached.
    pub(super) global_step: u64,
    /// What the run has recorded so far.
    pub(super) outcome: RankOutcome,
    /// Whether this rank's group-info file is written (after the first step).
    group_info_written: bool,
    /// `train.elastic`: this rank's store, buddy and snapshot interval.
    pub(super) elastic: Option<super::elastic::ElasticRun>,
}

/// The steps of a run, fixed before its first.
struct RunSteps<'c> {
    /// `train.max_steps` (no limit without it).
    max_steps: u64,
    /// Optimizer steps per epoch.
    batches_per_epoch: u64,
    /// The steps of the whole run, which the learning-rate schedule spans.
    run_steps: u64,
    /// The learning rate by global step: a function of the global step alone, so every rank,
    /// and a resumed run, takes the same rate at the same step.
    schedule: &'c LrSchedule,
}

/// What a step leaves for its callbacks and records.
struct StepDone {
    /// The epoch, from 1.
    epoch: usize,
    /// The step's index in its epoch.
    index: u64,
    /// The step's loss.
    loss: f32,
    /// Its wall time in milliseconds.
    step_ms: f64,
    /// Its learning rate.
    lr: f64,
    /// What its update did.
    update: StepUpdate,
    /// With mixture-of-experts routing: the token choices the step dropped (every rank, every
    /// MoE layer and micro-batch).
    moe_dropped: Option<f64>,
}

impl TrainSession {
    /// Runs the whole schedule on this rank of `world`. `callbacks` see every step, epoch and the
    /// end; `want_shards` makes the loop hand them the parameter and gradient shards.
    pub fn run_rank(
        &self,
        world: Arc<dyn Communicator>,
        callbacks: &mut dyn Callback,
        want_shards: bool,
    ) -> Result<RankOutcome, RuntimeError> {
        self.run_rank_traced(world, callbacks, want_shards, false)
    }

    /// [`TrainSession::run_rank`]; with `trace_ring`, each step's ring attention passes are
    /// recorded in [`RankOutcome::ring_trace`] (one [`exec::StepTrace`] per step of a run
    /// without pipeline stages; the pipelined steps' timelines are recorded either way).
    pub fn run_rank_traced(
        &self,
        world: Arc<dyn Communicator>,
        callbacks: &mut dyn Callback,
        want_shards: bool,
        trace_ring: bool,
    ) -> Result<RankOutcome, RuntimeError> {
        let mut run = self.start_rank(world)?;
        run.exec.set_ring_tracing(trace_ring);
        let out = self.config.output();
        let mut save_schedule =
            SaveSchedule::new(out.save_checkpoint_steps, out.save_checkpoint_seconds);
        let cfg = self.config.train();
        let max_steps = cfg.max_steps.unwrap_or(u64::MAX);
        let batches_per_epoch = self.batches_per_epoch();
        let schedule = self.config.lr_schedule();
        let run_steps = self.planned_steps();
        schedule.check_run_steps(run_steps)?;
        let steps = RunSteps {
            max_steps,
            batches_per_epoch,
            run_steps,
            schedule,
        };
        let mut epochs_run = 0;
        let first_epoch = (run.global_step / batches_per_epoch) as usize + 1;
        for epoch in first_epoch..=cfg.epochs {
            epochs_run = epoch;
            let saves = save_schedule.as_mut();
            self.run_epoch(&mut run, epoch, &steps, saves, callbacks, want_shards)?;
            // `max_steps` cuts the run short after evaluating the epoch it ends in.
            if run.global_step >= max_steps {
                break;
            }
        }
        self.finish_rank(run, callbacks, epochs_run)
    }

    /// The token choices the step just trained dropped, over every rank (`None` without
    /// mixture-of-experts routing): each rank's count (its own and its interleaved partners'),
    /// summed by an all-reduce every rank takes part in.
    fn moe_dropped(&self, run: &mut RankRun) -> Result<Option<f64>, RuntimeError> {
        if !self.routes_experts() {
            return Ok(None);
        }
        let mut local = run.exec.take_moe_dropped();
        for partner in &mut run.partners {
            local += partner.take_moe_dropped();
        }
        let mut total = tensor::Tensor::from_vec(&[1], vec![local])?;
        run.world.all_reduce(&mut total, comm::ReduceOp::Sum)?;
        Ok(total.to_f64_vec().first().copied())
    }

    /// Sets up this rank of `world` for a run: its executors with their parameters
    /// initialised, the optimizer, gradient accumulation, the pipeline's plan and the
    /// interleaved partners; then the resumed checkpoint, the parameter broadcast, the
    /// mixed-precision master weights and the loss scaler.
    fn start_rank(&self, world: Arc<dyn Communicator>) -> Result<RankRun, RuntimeError> {
        let rank = world.rank();
        let (mut exec, eval) = self.executors(&world)?;
        let trainable: Vec<usize> = (0..self.train.params.len())
            .filter(|&i| {
                self.train.params[i].trainable
                    && self.train.params[i].grad_buffer.is_some()
                    && exec.holds_param(i)
            })
            .collect();
        let mut optimizer = self.optimizer_for(&exec, &trainable)?;
        let accumulation_sharded = self.accumulation_sharded();
        let accumulated = (self.micro_steps() > 1)
            .then(|| Accumulation::new(&exec, &trainable, accumulation_sharded));
        let optimizer_bytes: usize = (0..trainable.len())
            .map(|k| optimizer.state(k))
            .collect::<Result<Vec<_>, _>>()?
            .iter()
            .flatten()
            .map(|(_, t)| t.as_bytes().len())
            .sum();
        exec.memory()
            .hold(MemoryCategory::Optimizer, optimizer_bytes);
        if let Some(acc) = &accumulated {
            exec.memory().hold(MemoryCategory::Gradients, acc.bytes());
        }
        let pipelined = self.pipeline_runner(rank)?;
        if pipelined.is_some() {
            exec.allocate_all();
        }
        let partners = self.interleave_partners(&world)?;
        let mut global_step = 0u64;
        let mut resumed_masters = Vec::new();
        let mut resumed_scale = None;
        let (elastic, elastic_from) = match self.config.train().elastic {
            Some(interval) => {
                let (elastic, from) = self.elastic_start(world.as_ref(), interval)?;
                (Some(elastic), from)
            }
            None => (None, None),
        };
        let from = match elastic_from {
            Some(dir) => Some(dir),
            None => self.resume_dir()?,
        };
        if let Some(from) = from {
            (global_step, resumed_masters, resumed_scale) =
                self.resume(&mut exec, &mut optimizer, &trainable, &from, rank)?;
        }
        let mut broadcast = Vec::new();
        if self.config.train().parameter_broadcast {
            exec.materialize_parameters()?;
            let layouts = self
                .train
                .params
                .iter()
                .map(|p| (p.name.clone(), p.layout.clone()))
                .collect();
            let first = exec::stage_first_rank(&self.train, rank);
            broadcast = parameter_broadcast(&mut exec, world.as_ref(), &layouts, rank, first)?;
        }
        // Mixed precision: f32 master pieces (after a resume, of the weights it loaded).
        let master = match self.config.train().precision.has_master_weights() {
            true => {
                exec.materialize_parameters()?;
                let mut master = MasterWeights::new(&exec, &trainable)?;
                // A resume continues from the saved f32 masters (or f32 weights), not from the
                // half-precision weights rounded from them.
                for (k, piece) in resumed_masters.into_iter().enumerate() {
                    if let Some(piece) = piece {
                        *master.piece_mut(k) = piece;
                    }
                }
                Some(master)
            }
            false => None,
        };
        if let Some(m) = &master {
            exec.memory().hold(MemoryCategory::Optimizer, m.bytes());
        }
        let mut scaler = LossScaler::new(self.config.train().loss_scale);
        if let (Some(scaler), Some(saved)) = (scaler.as_mut(), resumed_scale) {
            scaler.restore(saved);
        }
        Ok(RankRun {
            world,
            rank,
            exec,
            eval,
            optimizer,
            trainable,
            accumulated,
            pipelined,
            partners,
            master,
            scaler,
            shared_grads: exec::SharedGradients::default(),
            elastic,
            global_step,
            outcome: RankOutcome {
                broadcast,
                ..RankOutcome::default()
            },
            group_info_written: false,
        })
    }

    /// This rank's executors of the training and evaluation programs (deterministic when the
    /// session is), the training parameters initialised (lazily under `train.lazy_init`).
    fn executors(
        &self,
        world: &Arc<dyn Communicator>,
    ) -> Result<(RankExecutor, RankExecutor), RuntimeError> {
        // `train.threads_per_rank`: large products may use more threads (the same bits).
        tensor::kernels::threads::set_threads(self.config.train().threads_per_rank);
        let mut exec = match self.config.train().lazy_init {
            true => RankExecutor::with_lazy_parameters(self.train.clone(), world.clone())?,
            false => RankExecutor::new(self.train.clone(), world.clone())?,
        };
        let mut eval = RankExecutor::new(self.eval.clone(), world.clone())?;
        let deterministic = self.deterministic_blocks();
        exec.set_deterministic(deterministic);
        eval.set_deterministic(deterministic);
        exec.init_parameters(self.config.train().seed)?;
        Ok((exec, eval))
    }

    /// The optimizer of the trainable parameters `trainable` (indices into the program's) that
    /// `exec` holds: over each one's optimizer piece, its state in f32 under mixed precision.
    fn optimizer_for(
        &self,
        exec: &RankExecutor,
        trainable: &[usize],
    ) -> Result<Optimizer, RuntimeError> {
        let precision = self.config.train().precision;
        let specs: Vec<ParamSpec> = trainable
            .iter()
            .map(|&i| ParamSpec {
                name: self.train.params[i].name.clone(),
                // This rank's optimizer piece: the whole shard, or its hsdp piece; its state in
                // f32 under mixed precision (beside f32 master weights).
                shape: exec.optimizer_piece(i).shape.clone(),
                dtype: match precision.has_master_weights() {
                    true => tensor::DType::F32,
                    false => exec.param_dtype(i),
                },
            })
            .collect();
        let mut optimizer = Optimizer::new(self.config.optimizer_config(), &specs)?;
        optimizer.set_weight_decay_filter(self.config.weight_decay_filter());
        Ok(optimizer)
    }

    /// Runs the steps of `epoch` that `run` has not yet taken (a resumed run skips the batches
    /// its checkpoint already trained on), then evaluates after it when `train.eval` asks.
    fn run_epoch(
        &self,
        run: &mut RankRun,
        epoch: usize,
        steps: &RunSteps<'_>,
        mut save_schedule: Option<&mut SaveSchedule>,
        callbacks: &mut dyn Callback,
        want_shards: bool,
    ) -> Result<(), RuntimeError> {
        let epoch_start = Instant::now();
        let plan = self.epoch_plan(epoch)?;
        for index in 0..plan.len() {
            // A resumed run skips the batches its checkpoint already trained on.
            if (epoch as u64 - 1) * steps.batches_per_epoch + index < run.global_step {
                continue;
            }
            if run.global_step >= steps.max_steps {
                break;
            }
            let start = Instant::now();
            let lr = steps
                .schedule
                .learning_rate(run.global_step, steps.run_steps);
            let at = StepAt {
                plan: &plan,
                epoch,
                index,
            };
            let (loss, update) = self.train_step(run, at, lr)?;
            let step_ms = start.elapsed().as_secs_f64() * 1e3;
            let moe_dropped = self.moe_dropped(run)?;
            let spans = run.exec.take_ring_trace();
            if !spans.is_empty() {
                run.outcome.ring_trace.push(exec::StepTrace {
                    spans,
                    ..exec::StepTrace::default()
                });
            }
            let done = StepDone {
                epoch,
                index,
                loss,
                step_ms,
                lr,
                update,
                moe_dropped,
            };
            self.end_step(run, done, callbacks, want_shards)?;
            if let Some(save_schedule) = save_schedule.as_deref_mut() {
                self.save_if_due(run, save_schedule)?;
            }
            if run.elastic.as_ref().is_some_and(|e| e.due(run.global_step)) {
                self.elastic_snapshot(run)?;
            }
        }
        let (eval_accuracy, eval_loss) = if self.config.train().eval {
            self.evaluate_now(&mut run.exec, &mut run.eval)?
        } else {
            (None, None)
        };
        run.outcome.accuracies.extend(eval_accuracy);
        run.outcome.eval_losses.extend(eval_loss);
        callbacks.on_epoch_end(&EpochInfo {
            rank: run.rank,
            epoch,
            global_step: run.global_step,
            eval_accuracy,
            eval_loss,
            epoch_ms: epoch_start.elapsed().as_secs_f64() * 1e3,
        })?;
        Ok(())
    }

    /// Records a step taken (`done`), tells `callbacks` about it, and evaluates when
    /// `train.eval_interval` says so.
    fn end_step(
        &self,
        run: &mut RankRun,
        done: StepDone,
        callbacks: &mut dyn Callback,
        want_shards: bool,
    ) -> Result<(), RuntimeError> {
        let StepDone {
            epoch,
            index,
            loss,
            step_ms,
            lr,
            update,
            moe_dropped,
        } = done;
        if self.output_broadcast() && run.pipelined.is_none() {
            // One batch per step: the loss every rank holds is the last stage's.
            run.outcome.micro_batch_losses.push(vec![loss]);
        }
        run.global_step += 1;
        let global_step = run.global_step;
        run.outcome.skipped_steps += u64::from(!update.applied);
        let cfg = self.config.train();
        if cfg.max_grad_norm.is_some() {
            run.outcome.grad_norms.push(update.grad_norm);
        }
        if !run.group_info_written {
            // Every group a step creates exists after the first one.
            self.write_group_info(&run.exec, run.rank)?;
            run.group_info_written = true;
        }
        run.outcome.losses.push(loss);
        run.outcome.step_ms.push(step_ms);
        if let Some(dropped) = moe_dropped {
            run.outcome.moe_dropped.push(dropped);
        }
        let shards = match want_shards {
            true => self.shard_views(run),
            false => Vec::new(),
        };
        callbacks.on_step_end(&StepInfo {
            rank: run.rank,
            epoch,
            step_in_epoch: index as usize + 1,
            global_step,
            loss,
            step_ms,
            lr,
            grad_norm: update.grad_norm,
            moe_dropped,
            shards: &shards,
        })?;
        if cfg
            .eval_interval
            .is_some_and(|n| global_step.is_multiple_of(n))
        {
            let (eval_accuracy, eval_loss) = self.evaluate_now(&mut run.exec, &mut run.eval)?;
            let info = EvalInfo {
                rank: run.rank,
                global_step,
                eval_accuracy,
                eval_loss,
            };
            callbacks.on_eval(&info)?;
            run.outcome.step_evals.push(info);
        }
        Ok(())
    }

    /// Every parameter's shard and the gradient the step's update applied (with accumulation,
    /// the mean), as the callbacks see them.
    fn shard_views<'r>(&'r self, run: &'r RankRun) -> Vec<ShardView<'r>> {
        self.train
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| ShardView {
                name: &p.name,
                param: run.exec.param(i),
                // With accumulation, the gradient the update applied: the mean.
                grad: match (&run.accumulated, run.trainable.iter().position(|&t| t == i)) {
                    (Some(accumulated), Some(k)) => Some(accumulated.buffer(k)),
                    _ => run.exec.grad(i),
                },
            })
            .collect()
    }

    /// Ends `run` after `epochs_run` epochs: checks that some step updated the parameters,
    /// gathers every rank's memory report, tells `callbacks`, saves the final checkpoint set
    /// and returns what the rank ends with.
    fn finish_rank(
        &self,
        mut run: RankRun,
        callbacks: &mut dyn Callback,
        epochs_run: usize,
    ) -> Result<RankOutcome, RuntimeError> {
        if !run.group_info_written {
            self.write_group_info(&run.exec, run.rank)?;
        }
        exec::check_some_update(
            run.outcome.losses.len() as u64,
            run.outcome.skipped_steps,
            run.scaler.as_ref(),
        )?;
        // A run of no step still ends with every parameter (saved, reported).
        run.exec.materialize_parameters()?;
        let memory = exec::gather_reports(run.world.as_ref(), &run.exec.memory().report())?;
        // The trained model is saved before the end callbacks run: a callback that fails (the
        // metrics log's closing lines on a full disk, a user's callback) fails the run, but
        // after the checkpoint set is committed, not at the cost of it; and a callback that
        // looks for the final checkpoint finds it.
        self.save_final(&run)?;
        callbacks.on_train_end(&TrainEndInfo {
            rank: run.rank,
            epochs: epochs_run,
            global_step: run.global_step,
            last_loss: run.outcome.losses.last().copied(),
            memory: &memory,
        })?;
        run.outcome.memory_by_rank = memory;
        let exec = &run.exec;
        let mut outcome = std::mem::take(&mut run.outcome);
        for (i, p) in self.train.params.iter().enumerate() {
            if !exec.holds_param(i) {
                continue;
            }
            let shard = ParamShard {
                name: p.name.clone(),
                layout: p.layout.clone(),
                region: exec.box_of(&p.layout)?,
                values: exec.param(i).clone(),
            };
            match parallel::pipeline::shared_copy_of(&p.name) {
                Some(_) => outcome.shared_copies.push(shard),
                None => outcome.params.push(shard),
            }
        }
        outcome.global_step = run.global_step;
        outcome.initialised_bytes = exec.initialised_bytes();
        outcome.memory = ParamMemory::measure(exec, &run.optimizer, &run.trainable)?;
        Ok(outcome)
    }

    /// Writes `rank`'s group-info file when `output.group_info_file` asks for one.
    fn write_group_info(&self, exec: &RankExecutor, rank: usize) -> Result<(), RuntimeError> {
        let out = self.config.output();
        let Some(template) = &out.group_info_file else {
            return Ok(());
        };
        let path = crate::group_info::group_info_path(&out.dir, template, rank);
        crate::group_info::write_group_info(&path, &self.train, rank, &exec.created_groups())
    }
}
