//! A worker: asks the scheduler for each step's rows, pulls the weights, computes the gradient
//! on its rows and pushes it to the servers; worker 0 reports losses and accuracy like the
//! runtime's training loop.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::net::JobChannel as Channel;
use runtime::{
    Callback, CallbackList, EpochInfo, LossMonitor, LrSchedule, MaxGradNorm, MetricsLog, StepInfo,
    TrainConfig,
};
use tensor::Tensor;

use crate::compute::Compute;
use crate::env::{JobSettings, RoleEnv};
use crate::error::PsError;
use crate::net::scheduler_client;
use crate::proto::scheduler_client::SchedulerClient;
use crate::proto::*;
use crate::sparse::{split_rows, to_rows_msg, PulledRows, Rows};
use crate::wire::to_msg;

mod links;
mod norms;
use links::{Links, Want};

/// What a worker ends with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerReport {
    /// The worker.
    pub worker_id: usize,
    /// Steps this worker computed.
    pub steps_run: u64,
    /// Worker 0: every step's loss (sync: the mean over the step's workers; async: its own).
    pub losses: Vec<f32>,
    /// Worker 0: the test accuracy after each epoch (when `train.eval`).
    pub accuracies: Vec<f64>,
    /// Wall time of the whole run in seconds.
    pub seconds: f64,
    /// Wall time of the step loop in seconds (from the first step to the last push).
    pub step_seconds: f64,
    /// Bytes of tensor and row values this worker pulled (payload, without framing).
    pub pull_bytes: u64,
    /// Bytes of gradient values (dense and row-sparse) this worker pushed.
    pub push_bytes: u64,
    /// The largest buffer of server-resident table rows the worker held (its batch's rows).
    pub largest_table_bytes: u64,
    /// Worker 0: the workers that ran their last step (the job finished on these).
    pub finished_workers: usize,
    /// Worker 0: the workers the job lost (declared dead, not back), with the last step each
    /// had begun.
    pub lost_workers: Vec<(u32, u64)>,
}

/// Worker 0's reporting: the runtime's loss monitor and metrics log.
struct Reporter {
    callbacks: CallbackList,
    epoch_start: Instant,
    /// The job's learning-rate schedule and its run length in steps: each step's rate.
    schedule: LrSchedule,
    run_steps: u64,
}

impl Reporter {
    fn step(
        &mut self,
        compute: &Compute,
        (step, grad_norm): (u64, Option<f64>),
        loss: f32,
        ms: f64,
    ) -> Result<(), PsError> {
        let (epoch, index) = compute.epoch_of(step);
        self.callbacks.on_step_end(&StepInfo {
            rank: 0,
            epoch,
            step_in_epoch: index as usize + 1,
            global_step: step + 1,
            loss,
            step_ms: ms,
            lr: self.schedule.learning_rate(step, self.run_steps),
            grad_norm,
            moe_dropped: None,
            shards: &[],
        })?;
        Ok(())
    }

    fn epoch(
        &mut self,
        epoch: usize,
        global_step: u64,
        accuracy: Option<f64>,
    ) -> Result<(), PsError> {
        self.callbacks.on_epoch_end(&EpochInfo {
            rank: 0,
            epoch,
            global_step,
            eval_accuracy: accuracy,
            eval_loss: None,
            epoch_ms: self.epoch_start.elapsed().as_secs_f64() * 1e3,
        })?;
        self.epoch_start = Instant::now();
        Ok(())
    }
}

/// Runs worker `env.worker_id` to the end of the job; worker 0 writes the metrics log to
/// `metrics_log` (`None`: `<output.dir>/metrics.jsonl`, as collective training does).
pub fn run(
    config: &TrainConfig,
    settings: &JobSettings,
    env: &RoleEnv,
    metrics_log: Option<&Path>,
) -> Result<WorkerReport, PsError> {
    let mut compute = Compute::new(config)?;
    let rt = crate::scheduler::runtime(2)?;
    let reporter = match env.worker_id {
        0 => {
            let mut callbacks = CallbackList::new();
            callbacks.push(Box::new(LossMonitor::stdout(
                config.train().per_print_times,
            )));
            let default_log = config.output().metrics_file();
            callbacks.push(Box::new(MetricsLog::create(
                metrics_log.unwrap_or(&default_log),
            )?));
            Some(Reporter {
                callbacks,
                epoch_start: Instant::now(),
                schedule: config.lr_schedule().clone(),
                run_steps: compute.total_steps(),
            })
        }
        _ => None,
    };
    rt.block_on(work(config, settings, env, &mut compute, reporter))
}

/// Per-step state shared with the heartbeat task.
struct Beat {
    step: AtomicU64,
    /// Steps this worker computed and pushed.
    computed: AtomicU64,
    stop: AtomicBool,
    rejoin: AtomicBool,
}

async fn work(
    config: &TrainConfig,
    settings: &JobSettings,
    env: &RoleEnv,
    compute: &mut Compute,
    mut reporter: Option<Reporter>,
) -> Result<WorkerReport, PsError> {
    let started = Instant::now();
    let worker_id = env.worker_id as u32;
    let mut links = Links {
        settings: settings.clone(),
        worker_id,
        secret: env.secret.clone(),
        incarnation: crate::auth::new_incarnation()?,
        scheduler: scheduler_client(&env.scheduler_addr, settings.retry.timeout, &env.secret)?,
        scheduler_peer: format!("the scheduler at {}", env.scheduler_addr),
        servers: Vec::new(),
        epoch: 0,
        pull_bytes: 0,
        push_bytes: 0,
        norms: Default::default(),
    };
    let mut step = links.register(env.restart_count).await?;
    let beat = Arc::new(Beat {
        step: AtomicU64::new(step),
        computed: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        rejoin: AtomicBool::new(false),
    });
    let heart = tokio::spawn(heartbeat(
        links.scheduler.clone(),
        settings.heartbeat,
        worker_id,
        beat.clone(),
    ));
    links.follow_map(compute, true).await?;
    let loop_start = Instant::now();
    let outcome = steps(
        config,
        settings,
        &mut links,
        compute,
        &mut reporter,
        &beat,
        &mut step,
    )
    .await;
    let step_seconds = loop_start.elapsed().as_secs_f64();
    beat.stop.store(true, Ordering::Relaxed);
    let _ = heart.await;
    let ending = outcome?;
    eprintln!(
        "[ps worker {worker_id}] ran {computed} step(s)",
        computed = beat.computed.load(Ordering::Relaxed)
    );
    Ok(WorkerReport {
        worker_id: env.worker_id,
        steps_run: step,
        losses: ending.losses,
        accuracies: ending.accuracies,
        seconds: started.elapsed().as_secs_f64(),
        step_seconds,
        pull_bytes: links.pull_bytes,
        push_bytes: links.push_bytes,
        largest_table_bytes: ending.largest_table_bytes,
        finished_workers: ending.finished_workers,
        lost_workers: ending.lost_workers,
    })
}

/// Heartbeats until told to stop; notes when the scheduler asks for a new registration.
async fn heartbeat(
    mut client: SchedulerClient<Channel>,
    every: Duration,
    id: u32,
    beat: Arc<Beat>,
) {
    while !beat.stop.load(Ordering::Relaxed) {
        let request = HeartbeatRequest {
            role: Role::Worker as i32,
            id,
            step: beat.step.load(Ordering::Relaxed),
        };
        if let Ok(Ok(reply)) = tokio::time::timeout(every * 4, client.heartbeat(request)).await {
            if reply.get_ref().rejoin {
                beat.rejoin.store(true, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// What the step loop ends with.
struct Ending {
    /// Worker 0's losses and accuracies.
    losses: Vec<f32>,
    accuracies: Vec<f64>,
    /// The largest buffer of table rows held.
    largest_table_bytes: u64,
    /// Worker 0: the workers that ran their last step, and those lost (with their last step).
    finished_workers: usize,
    lost_workers: Vec<(u32, u64)>,
}

/// The step loop; returns what [`Ending`] holds.
async fn steps(
    config: &TrainConfig,
    settings: &JobSettings,
    links: &mut Links,
    compute: &mut Compute,
    reporter: &mut Option<Reporter>,
    beat: &Beat,
    step: &mut u64,
) -> Result<Ending, PsError> {
    let total = compute.total_steps();
    // The schedule is a function of the global step alone: every worker gives the servers the
    // same rate for a step, the rate a data-parallel run takes at it.
    let schedule = config.lr_schedule();
    schedule.check_run_steps(total)?;
    let limit = crate::embedding::worker_limit(config, compute)?;
    let mut largest_table_bytes = 0u64;
    let per_epoch = compute.steps_per_epoch();
    let evaluate = config.train().eval;
    let worker_id = links.worker_id;
    let mut weights: Vec<Tensor> = compute
        .params()
        .iter()
        .map(|p| Tensor::zeros(tensor::DType::F32, &p.shape))
        .collect();
    let mut losses = Vec::new();
    let mut accuracies = Vec::new();
    // Sync: the step whose loss worker 0 reports once the servers have applied it.
    let mut unreported: Option<(u64, f64)> = None;
    let mut step_start = Instant::now();
    while *step < total {
        beat.step.store(*step, Ordering::Relaxed);
        if beat.rejoin.swap(false, Ordering::Relaxed) {
            *step = (*step).max(links.register(0).await?);
            continue;
        }
        let s = *step;
        let begin = links
            .scheduler_call("BeginStep", |mut c| async move {
                c.begin_step(BeginStepRequest { worker_id, step: s }).await
            })
            .await?;
        match StepStatus::try_from(begin.status) {
            Ok(StepStatus::Go) => {}
            Ok(StepStatus::Wait) => continue,
            Ok(StepStatus::Skip) => {
                *step += 1;
                continue;
            }
            Ok(StepStatus::Rejoin) => {
                *step = (*step).max(links.register(0).await?);
                continue;
            }
            _ => {
                return Err(PsError::message(
                    format!("BeginStep reply of step {s}"),
                    format!("unknown status {}", begin.status),
                ))
            }
        }
        if begin.map_epoch != links.epoch {
            // A server was added: the step boundary where this worker switches maps.
            links.follow_map(compute, false).await?;
        }
        let min_version = if settings.sync { s } else { 0 };
        let rows = compute.rows(s, begin.row_offset as usize, begin.row_count as usize)?;
        let mut pulled = match compute.tables().first() {
            Some(table) => {
                let pulled = PulledRows::new(table, compute.table_ids(&rows)?);
                crate::embedding::check_rows_limit(&pulled, limit)?;
                largest_table_bytes = largest_table_bytes.max(pulled.bytes() as u64);
                pulled
            }
            None => PulledRows::none(),
        };
        let loss_before = links
            .pull_all(
                (min_version, Want::Weights),
                &mut weights,
                compute,
                &mut pulled,
            )
            .await?;
        if let (Some(rep), Some((done, ms))) = (reporter.as_mut(), unreported.take()) {
            report_step(
                rep,
                compute,
                (done, links.norms.norm(done)),
                loss_before,
                ms,
                &mut losses,
            )?;
            if evaluate && (done + 1) % per_epoch == 0 {
                let acc = compute.accuracy(&weights)?;
                accuracies.push(acc);
                rep.epoch(compute.epoch_of(done).0, done + 1, Some(acc))?;
            }
        }
        let (loss, mut grads, mut table_rows) = match &pulled.table {
            Some(table) => {
                let values = Tensor::from_vec(
                    &[pulled.ids.len(), table.width],
                    std::mem::take(&mut pulled.values),
                )
                .map_err(|e| {
                    PsError::tensor(format!("the pulled rows of table {}", table.name), e)
                })?;
                let (loss, grads, rows) =
                    compute.gradient_with_rows(&weights, &rows, &pulled.ids, &values)?;
                (loss, grads, Some((table.clone(), rows)))
            }
            None => {
                let (loss, grads) = compute.gradient(&weights, &rows)?;
                (loss, grads, None)
            }
        };
        // Async: the update is this worker's whole gradient, clipped by its own norm. Sync:
        // the servers clip the step's mean by its global norm, which the workers gather.
        let grad_norm = match config.train().max_grad_norm.filter(|_| !settings.sync) {
            Some(clip) => Some(clip_worker_gradient(
                clip,
                &mut grads,
                table_rows.as_mut().map(|(_, rows)| rows),
            )?),
            None => None,
        };
        // A diverged step stops this worker before anything is pushed (the servers refuse a
        // non-finite gradient too): data parallel stops at a non-finite loss as well.
        check_step_finite((worker_id, s), loss, compute, &grads, table_rows.as_ref())?;
        let row_grads = table_rows.map(|(table, rows)| {
            let split = split_rows(&table, links.servers.len(), &rows);
            (table, split)
        });
        for srv in 0..links.servers.len() {
            let held = links.servers[srv].held.clone();
            let request = PushRequest {
                worker_id,
                step: s,
                members: begin.members.clone(),
                rows: begin.row_count,
                loss,
                replay: false,
                seen_version: links.servers[srv].seen,
                learning_rate: Some(schedule.learning_rate(s, total)),
                tensors: held
                    .iter()
                    .map(|&i| to_msg(&compute.params()[i].name, &grads[i]))
                    .collect(),
                sparse: match &row_grads {
                    Some((table, split)) if !split[srv].ids.is_empty() => {
                        vec![to_rows_msg(table, &split[srv])]
                    }
                    _ => Vec::new(),
                },
            };
            if settings.sync {
                links.servers[srv].history.insert(s, request.clone());
            }
            links.push(srv, request).await?;
        }
        if settings.sync && config.train().max_grad_norm.is_some() {
            // Clipping: the step is applied once a worker hands the servers its global norm,
            // gathered here (before the next step, so that no server is left holding it).
            links
                .pull_all(
                    (s + 1, Want::VersionOnly),
                    &mut weights,
                    compute,
                    &mut pulled,
                )
                .await?;
        }
        beat.computed.fetch_add(1, Ordering::Relaxed);
        let ms = step_start.elapsed().as_secs_f64() * 1e3;
        step_start = Instant::now();
        if settings.sync {
            unreported = Some((s, ms));
        } else if let Some(rep) = reporter.as_mut() {
            report_step(rep, compute, (s, grad_norm), loss, ms, &mut losses)?;
            if evaluate && (s + 1).is_multiple_of(per_epoch) && s + 1 < total {
                links.pull_latest(&mut weights, compute).await?;
                let acc = compute.accuracy(&weights)?;
                accuracies.push(acc);
                rep.epoch(compute.epoch_of(s).0, s + 1, Some(acc))?;
            }
        }
        *step += 1;
    }
    // Sync: every worker waits for the last step to be applied (replaying if a server
    // restarted meanwhile); worker 0 reports it.
    if settings.sync {
        let loss = links
            .pull_all(
                (total, Want::Weights),
                &mut weights,
                compute,
                &mut PulledRows::none(),
            )
            .await?;
        if let (Some(rep), Some((done, ms))) = (reporter.as_mut(), unreported.take()) {
            report_step(
                rep,
                compute,
                (done, links.norms.norm(done)),
                loss,
                ms,
                &mut losses,
            )?;
        }
    }
    links
        .scheduler_call("WorkerDone", |mut c| async move {
            c.worker_done(WorkerDoneRequest { worker_id }).await
        })
        .await?;
    let mut ending = Ending {
        losses: Vec::new(),
        accuracies: Vec::new(),
        largest_table_bytes,
        finished_workers: 0,
        lost_workers: Vec::new(),
    };
    if let Some(rep) = reporter.as_mut() {
        // The final weights are there once every live worker has pushed its last step; the
        // job's status then says which workers finished it and which it lost.
        let status = loop {
            let status = links
                .scheduler_call("JobStatus", |mut c| async move {
                    c.job_status(JobStatusRequest { wait_ms: 500 }).await
                })
                .await?;
            if status.all_workers_done {
                break status;
            }
        };
        ending.finished_workers = status.done_workers.len();
        ending.lost_workers = status.lost.iter().map(|l| (l.worker_id, l.step)).collect();
        if !settings.sync {
            links.pull_latest(&mut weights, compute).await?;
        }
        let last = total.saturating_sub(1);
        if evaluate && total > 0 {
            let acc = compute.accuracy(&weights)?;
            accuracies.push(acc);
            rep.epoch(compute.epoch_of(last).0, total, Some(acc))?;
        }
        links
            .scheduler_call(
                "Finish",
                |mut c| async move { c.finish(FinishRequest {}).await },
            )
            .await?;
    }
    ending.losses = losses;
    ending.accuracies = accuracies;
    Ok(ending)
}

/// Checks worker `worker`'s loss and gradient of step `step` are finite; the error names the
/// worker, the step and the loss or the first tensor holding a NaN or an infinity.
fn check_step_finite(
    (worker, step): (u32, u64),
    loss: f32,
    compute: &Compute,
    grads: &[Tensor],
    table_rows: Option<&(crate::sparse::TableInfo, Rows)>,
) -> Result<(), PsError> {
    let diverged = |what: String| {
        PsError::job(
            format!("worker {worker}"),
            format!("step {step}: {what}: the training diverged, training stops (lower train.learning_rate or set train.max_grad_norm)"),
        )
    };
    if !loss.is_finite() {
        return Err(diverged(format!("invalid loss {loss}")));
    }
    let mut tensors: Vec<(String, &[f32])> = Vec::with_capacity(grads.len() + 1);
    for (p, g) in compute.params().iter().zip(grads) {
        let values = g
            .as_f32()
            .map_err(|e| PsError::tensor(format!("the gradient of {}", p.name), e))?;
        tensors.push((format!("the gradient of {}", p.name), values));
    }
    if let Some((table, rows)) = table_rows {
        tensors.push((
            format!("the row gradient of table {}", table.name),
            &rows.values,
        ));
    }
    for (what, values) in tensors {
        if let Some((i, v)) = crate::wire::first_non_finite(values) {
            return Err(diverged(format!("{what} holds {v} at index {i}")));
        }
    }
    Ok(())
}

/// Clips this worker's gradient (`grads` and the table rows `rows`) by its global norm in
/// place; returns the norm before clipping.
fn clip_worker_gradient(
    clip: MaxGradNorm,
    grads: &mut [Tensor],
    rows: Option<&mut Rows>,
) -> Result<f64, PsError> {
    let mut parts = Vec::with_capacity(grads.len() + 1);
    for g in grads.iter_mut() {
        parts.push(
            g.as_f32_mut()
                .map_err(|e| PsError::tensor("clipping the worker's gradient", e))?,
        );
    }
    if let Some(rows) = rows {
        parts.push(rows.values.as_mut_slice());
    }
    Ok(clip.clip_slices(&mut parts))
}

fn report_step(
    rep: &mut Reporter,
    compute: &Compute,
    (step, grad_norm): (u64, Option<f64>),
    loss: f32,
    ms: f64,
    losses: &mut Vec<f32>,
) -> Result<(), PsError> {
    losses.push(loss);
    rep.step(compute, (step, grad_norm), loss, ms)
}
