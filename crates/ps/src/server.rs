//! A parameter server: one partition of the parameters, the optimizer over it, sync barriers
//! or async updates, snapshots, and recovery from a snapshot plus replayed gradients.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use runtime::launch_env;
use runtime::{MaxGradNorm, Optimizer, ParamSpec, TrainConfig};
use tensor::{DType, Tensor};
use tokio::sync::Notify;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::auth::CheckSecret;
use crate::compute::{Compute, ParamInfo};
use crate::env::{JobSettings, RoleEnv};
use crate::error::PsError;
use crate::net::{message_limit, scheduler_client};
use crate::partition::{partition, ParamSize};
use crate::proto::parameter_server_server::{ParameterServer, ParameterServerServer};
use crate::proto::*;
use crate::retry::until_admitted;
use crate::snapshot::{self, PartitionState};
use crate::sparse::{Rows, TableInfo};
use crate::table::ServerTable;
use crate::wire::{check_finite, from_msg, to_msg};

mod clip;
mod mean;
mod migrate;
mod rows;
use clip::{AwaitingNorm, StepMean};
use mean::{mean_of, step_learning_rate, Pushed};
pub use migrate::{current_map, handover_limit};
use rows::{sparse_grads, sparse_mean_of, sparse_request_ok, sparse_rows};

/// The longest a pull waits for the version it asks for before answering "not ready".
const LONGEST_PULL: Duration = Duration::from_millis(500);

/// How many steps past its version a server buffers pushes (workers replaying, or ahead).
const MAX_STEPS_AHEAD: u64 = 4096;

/// The parameters server `server_id` of `servers` holds, in program order: indices into
/// `params`.
pub fn partition_of(params: &[ParamInfo], servers: usize, server_id: usize) -> Vec<usize> {
    let sizes: Vec<ParamSize> = params
        .iter()
        .map(|p| ParamSize {
            name: p.name.clone(),
            bytes: p.bytes(),
        })
        .collect();
    partition(&sizes, servers)
        .into_iter()
        .enumerate()
        .filter(|&(_, s)| s == server_id)
        .map(|(i, _)| i)
        .collect()
}

/// The servers of a job of `servers` servers that would hold nothing, ascending: no parameter
/// under the partition every server computes ([`crate::partition::partition`], through
/// [`crate::migrate::owners`]) and no row of any server-resident table ([`TableInfo::block`]).
pub fn idle_servers(params: &[ParamInfo], tables: &[TableInfo], servers: usize) -> Vec<usize> {
    let mut holds = vec![false; servers];
    for owner in crate::migrate::owners(params, servers) {
        if let Some(held) = holds.get_mut(owner) {
            *held = true;
        }
    }
    (0..servers)
        .filter(|&s| !holds[s] && tables.iter().all(|t| t.block(servers, s).is_empty()))
        .collect()
}

/// Whether every one of `servers` servers would hold something of the model ([`idle_servers`]);
/// if not, the rule broken (the caller names the setting): how many blocks the model has, how
/// the servers share them, and which servers would hold nothing.
pub fn check_servers_hold_something(
    params: &[ParamInfo],
    tables: &[TableInfo],
    servers: usize,
) -> Result<(), String> {
    let idle = idle_servers(params, tables, servers);
    let Some(&first) = idle.first() else {
        return Ok(());
    };
    let holding = servers - idle.len();
    let mut blocks = format!(
        "its {} parameter(s), each held whole by one server (the byte-balanced partition, docs/PS.md)",
        params.len()
    );
    for t in tables {
        blocks.push_str(&format!(
            ", and server-resident table {} of {} rows, cut into one block of rows per server",
            t.name, t.rows
        ));
    }
    Err(format!(
        "{servers} servers, but the model has only {holding} block(s) to spread over them: {blocks}; \
         {} server(s) would hold nothing (the first: server {first}): use at most {holding} servers",
        idle.len()
    ))
}

/// What a restarted server reports once it has caught up.
struct Recovery {
    /// The snapshot's version.
    from: u64,
    /// Steps applied from replayed gradients.
    replayed: u64,
    /// The highest version workers had seen before the restart.
    seen: u64,
    /// Sync: a step of live (not replayed) gradients has been applied, so the replay is over.
    live: bool,
    reported: bool,
}

impl Recovery {
    /// Sync: notes a step applied at version `before`, `replay` when a replayed push was among
    /// its pushes (`seen` counts only what the workers saw before the restart). A step below the highest version the workers had seen before the restart
    /// was applied before it too, so it is applied again — a replay — whichever pushes made it
    /// up: a worker's last replay can cross with the live pushes of the same step, which then
    /// complete it (it used to be counted as live, and the recovery line then said `lost 1
    /// step(s)` of a run whose losses were the uninterrupted run's).
    fn note_step(&mut self, before: u64, replay: bool) {
        match replay || before < self.seen {
            true => self.replayed += 1,
            false => self.live = true,
        }
    }

    /// Notes what push `r` says the workers had seen of this server. Sync: a live push of step
    /// k was computed on version k, so only a replay, or a push whose worker saw past its step
    /// (before the restart), tells how far the server had gone; the versions the workers see of
    /// the restarted server itself say nothing (counting them reported `lost 1 step(s)` of a
    /// restart that had lost nothing).
    fn note_push(&mut self, sync: bool, r: &PushRequest) {
        if !sync || r.replay || r.seen_version > r.step {
            self.seen = self.seen.max(r.seen_version);
        }
    }

    /// Sync: the steps the workers had seen that the server neither replayed nor has.
    fn lost(&self) -> u64 {
        self.seen
            .saturating_sub(self.from)
            .saturating_sub(self.replayed)
    }
}

/// The server's state.
struct State {
    server_id: usize,
    sync: bool,
    checkpoint_every: u64,
    /// `data.batch_size`: the most rows a push's gradient was computed on.
    batch_size: u64,
    snapshot_file: PathBuf,
    names: Vec<String>,
    shapes: Vec<Vec<usize>>,
    weights: Vec<Tensor>,
    optimizer: Optimizer,
    version: u64,
    snapshot_version: u64,
    last_loss: f32,
    /// Sync: pushes by step and worker.
    pending: BTreeMap<u64, BTreeMap<u32, Pushed>>,
    /// Sync: each pending step's members, as its pushes say.
    members: BTreeMap<u64, Vec<u32>>,
    /// Sync: the step's members still alive, from the scheduler.
    alive: Option<(u64, Vec<u32>)>,
    recovery: Option<Recovery>,
    /// The partition map's epoch this server serves (`None`: being added, not serving yet).
    epoch: Option<u64>,
    /// Handing parameters over when a server is added.
    migration: migrate::Migration,
    /// This server's blocks of the server-resident tables.
    tables: Vec<ServerTable>,
    /// Sync: `train.max_grad_norm` (see [`clip`]).
    clip: Option<MaxGradNorm>,
    /// Sync with clipping: the step whose mean waits for the global norm.
    awaiting: Option<AwaitingNorm>,
    /// Sync with clipping: the global square sums of the last steps applied, by step.
    applied_norms: BTreeMap<u64, Vec<u8>>,
}

impl State {
    /// Applies `grad` (one per parameter) and `sparse` (one per table) with the optimizer at
    /// `learning_rate`: one step.
    fn apply(
        &mut self,
        grads: &[Tensor],
        sparse: &[Rows],
        learning_rate: f64,
    ) -> Result<(), PsError> {
        self.optimizer.begin_step();
        self.optimizer.set_learning_rate(learning_rate)?;
        for (k, g) in grads.iter().enumerate() {
            self.optimizer.update(k, &mut self.weights[k], g)?;
        }
        let step = self.optimizer.step_count();
        for (table, rows) in self.tables.iter_mut().zip(sparse) {
            table.apply(step, learning_rate, rows)?;
        }
        self.version += 1;
        if self.version.is_multiple_of(self.checkpoint_every) {
            self.snapshot()?;
        }
        Ok(())
    }

    fn snapshot(&mut self) -> Result<(), PsError> {
        snapshot::save(
            &self.snapshot_file,
            &PartitionState {
                names: &self.names,
                weights: &self.weights,
                optimizer: &self.optimizer,
                version: self.version,
            },
        )?;
        self.snapshot_version = self.version;
        Ok(())
    }

    /// Sync: completes every step whose live members have all pushed.
    fn complete_steps(&mut self) -> Result<bool, PsError> {
        let mut any = false;
        while self.awaiting.is_none() {
            let step = self.version;
            let (Some(pushed), Some(members)) = (self.pending.get(&step), self.members.get(&step))
            else {
                break;
            };
            let needed: Vec<u32> = match &self.alive {
                Some((s, alive)) if *s == step => alive.clone(),
                _ => members.clone(),
            };
            if pushed.is_empty() || !needed.iter().all(|w| pushed.contains_key(w)) {
                break;
            }
            let pushed = self.pending.remove(&step).unwrap_or_default();
            self.members.remove(&step);
            let (loss, grads) = mean_of(&pushed, (&self.names, &self.shapes))?;
            let mean = StepMean {
                step,
                loss,
                replay: pushed.values().any(|p| p.replay),
                learning_rate: step_learning_rate(step, &pushed)?,
                grads,
                sparse: sparse_mean_of(&pushed, &self.tables),
            };
            any = true;
            if self.clip.is_some() {
                // Applied once a worker brings the global norm (`commit_norm`).
                self.awaiting = Some(AwaitingNorm::new(mean)?);
                break;
            }
            self.finish_step(mean)?;
        }
        self.report_recovery();
        Ok(any)
    }

    /// Applies one sync step's mean and notes its loss (and, recovering, a replayed step).
    fn finish_step(&mut self, mean: StepMean) -> Result<(), PsError> {
        let before = self.version;
        self.apply(&mean.grads, &mean.sparse, mean.learning_rate)?;
        self.last_loss = mean.loss;
        if let Some(r) = self.recovery.as_mut() {
            r.note_step(before, mean.replay);
        }
        Ok(())
    }

    /// Sync: the first step this server still takes pushes of (a step waiting for its norm
    /// has all of them).
    fn open_step(&self) -> u64 {
        self.version + u64::from(self.awaiting.is_some())
    }

    /// Logs, once, how a restarted server caught up: steps replayed and lost.
    fn report_recovery(&mut self) {
        let (sync, id, version) = (self.sync, self.server_id, self.version);
        let Some(r) = self.recovery.as_mut() else {
            return;
        };
        // Sync workers replay every kept gradient before any live one, so the first live step
        // ends the replay; the versions workers report seeing may lag what they replay.
        let caught_up = match sync {
            true => r.live,
            false => version >= r.seen,
        };
        // Async: nothing to say before a push tells what the workers had seen.
        if r.reported || !caught_up || (!sync && r.seen <= r.from) {
            return;
        }
        r.reported = true;
        let behind = r.seen.saturating_sub(r.from);
        if sync {
            eprintln!(
                "[ps server {id}] recovered: restarted from the snapshot at step {}; replayed {} step(s) ({}..{}) from the workers' kept gradients; lost {} step(s)",
                r.from,
                r.replayed,
                r.from,
                r.from + r.replayed,
                r.lost()
            );
        } else {
            eprintln!(
                "[ps server {id}] recovered: restarted from the snapshot at update {}; lost {behind} update(s) (async mode does not replay)",
                r.from
            );
        }
    }
}

/// The answer to pull `r` from a server in state `s`: the weights and rows asked for when
/// `ready` (and not `r.no_weights`); else whether the server waits for this worker's push, or
/// (clipping) for the global norm of the step it holds.
fn pull_reply(s: &State, r: &PullRequest, ready: bool) -> Result<PullReply, Status> {
    let awaiting = if ready { None } else { s.awaiting_norm() };
    let waiting_for_you = !ready
        && s.sync
        && awaiting.is_none()
        && !s
            .pending
            .get(&s.version)
            .is_some_and(|p| p.contains_key(&r.worker_id));
    let send = ready && !r.no_weights;
    let tensors = match send {
        true => s
            .names
            .iter()
            .zip(&s.weights)
            .map(|(n, w)| to_msg(n, w))
            .collect(),
        false => Vec::new(),
    };
    let sparse = match send {
        true => sparse_rows(s, &r.sparse).map_err(status)?,
        false => Vec::new(),
    };
    let applied_square_sum = match ready {
        true => s
            .version
            .checked_sub(1)
            .and_then(|step| s.applied_norms.get(&step))
            .cloned()
            .unwrap_or_default(),
        false => Vec::new(),
    };
    let (norm_step, norm_part) = match awaiting {
        Some((step, part)) => (Some(step), part),
        None => (None, Vec::new()),
    };
    Ok(PullReply {
        ready,
        version: s.version,
        snapshot_version: s.snapshot_version,
        waiting_for_you,
        last_loss: s.last_loss,
        tensors,
        sparse,
        norm_step,
        norm_part,
        applied_square_sum,
    })
}

/// A push refused for `e` (the caller sent something wrong): `InvalidArgument` naming the step
/// and the worker.
fn refused_push(r: &PushRequest, e: PsError) -> Status {
    Status::invalid_argument(format!(
        "push of step {} by worker {}: {e}",
        r.step, r.worker_id
    ))
}

/// The server's gRPC service.
#[derive(Clone)]
pub struct ServerService {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

/// The answer to a call that failed with `e`: `InvalidArgument` when the caller sent something
/// wrong ([`PsError::is_bad_request`]), `Internal` otherwise.
fn status(e: PsError) -> Status {
    match e.is_bad_request() {
        true => Status::invalid_argument(e.to_string()),
        false => Status::internal(e.to_string()),
    }
}

impl ServerService {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A server of `settings`'s job holding the parameters `held` of `compute`, starting from
    /// `initial` (one tensor per held parameter) or, when `restart` and a snapshot exists,
    /// from the snapshot.
    pub fn new(
        settings: &JobSettings,
        config: &TrainConfig,
        server_id: usize,
        held: &[ParamInfo],
        initial: Vec<Tensor>,
        restart: bool,
    ) -> Result<ServerService, PsError> {
        let names: Vec<String> = held.iter().map(|p| p.name.clone()).collect();
        let specs: Vec<ParamSpec> = held
            .iter()
            .map(|p| ParamSpec {
                name: p.name.clone(),
                shape: p.shape.clone(),
                dtype: DType::F32,
            })
            .collect();
        let mut optimizer = Optimizer::new(config.optimizer_config(), &specs)?;
        optimizer.set_weight_decay_filter(config.weight_decay_filter());
        let mut weights = initial;
        let snapshot_file = snapshot::snapshot_path(&settings.output_dir, server_id);
        let mut version = 0;
        let mut recovery = None;
        if !restart {
            // A server that is not a restart begins its job at version 0: a snapshot at its
            // path is an earlier job's (the same `output.dir`), and a restart of this one must
            // not resume from it (it would apply this job's kept gradients to that job's
            // weights).
            remove_stale_snapshot(&snapshot_file, server_id)?;
        }
        if restart {
            if snapshot_file.exists() {
                version = snapshot::load(&snapshot_file, &names, &mut weights, &mut optimizer)?;
                eprintln!(
                    "[ps server {server_id}] restarted from the snapshot at version {version} ({})",
                    snapshot_file.display()
                );
            } else {
                eprintln!(
                    "[ps server {server_id}] restarted with no snapshot yet: from the initial weights"
                );
            }
            recovery = Some(Recovery {
                from: version,
                replayed: 0,
                seen: 0,
                live: false,
                reported: false,
            });
        }
        Ok(ServerService {
            state: Arc::new(Mutex::new(State {
                server_id,
                sync: settings.sync,
                checkpoint_every: settings.checkpoint_every.max(1),
                batch_size: config.data().batch_size as u64,
                snapshot_file,
                names,
                shapes: held.iter().map(|p| p.shape.clone()).collect(),
                weights,
                optimizer,
                version,
                snapshot_version: version,
                last_loss: f32::NAN,
                pending: BTreeMap::new(),
                members: BTreeMap::new(),
                alive: None,
                recovery,
                epoch: Some(0),
                migration: migrate::Migration::default(),
                tables: Vec::new(),
                clip: config.train().max_grad_norm.filter(|_| settings.sync),
                awaiting: None,
                applied_norms: BTreeMap::new(),
            })),
            changed: Arc::new(Notify::new()),
        })
    }

    /// This server with its blocks of the server-resident tables (`ps.embedding_on_server`).
    pub fn with_tables(self, tables: Vec<ServerTable>) -> ServerService {
        self.lock().tables = tables;
        self
    }

    /// Sync: the step the server waits on, when some pushes for it arrived.
    pub fn waiting_step(&self) -> Option<u64> {
        let s = self.lock();
        (s.sync && s.pending.contains_key(&s.version)).then_some(s.version)
    }

    /// Sync: the scheduler says `alive` of step `step`'s members live; completes the step when
    /// they all pushed.
    pub fn set_alive(&self, step: u64, alive: Vec<u32>) -> Result<(), PsError> {
        let done = {
            let mut s = self.lock();
            s.alive = Some((step, alive));
            s.complete_steps()?
        };
        if done {
            self.changed.notify_waiters();
        }
        Ok(())
    }

    /// Writes a snapshot when steps were applied since the last one.
    pub fn final_snapshot(&self) -> Result<(), PsError> {
        let mut s = self.lock();
        if s.version > s.snapshot_version {
            s.snapshot()?;
        }
        Ok(())
    }

    /// The version (steps or pushes applied).
    pub fn version(&self) -> u64 {
        self.lock().version
    }
}

#[tonic::async_trait]
impl ParameterServer for ServerService {
    async fn pull(&self, request: Request<PullRequest>) -> Result<Response<PullReply>, Status> {
        let routed = crate::migrate::epoch_of(&request);
        let r = request.into_inner();
        let committed = {
            // Rows asked for are checked before waiting: a bad id is refused at once.
            let mut s = self.lock();
            sparse_request_ok(&s, &r.sparse).map_err(status)?;
            match &r.norm {
                Some(norm) => {
                    crate::migrate::stale_route("Pull", s.server_id, s.epoch, routed)?;
                    s.commit_norm(norm).map_err(status)?
                }
                None => false,
            }
        };
        if committed {
            self.changed.notify_waiters();
        }
        let deadline = Instant::now() + LONGEST_PULL;
        loop {
            let notified = self.changed.notified();
            {
                let s = self.lock();
                crate::migrate::stale_route("Pull", s.server_id, s.epoch, routed)?;
                let ready = s.version >= r.min_version;
                // A step waiting for its norm is answered at once: the worker brings it.
                if ready || s.awaiting.is_some() || Instant::now() >= deadline {
                    return pull_reply(&s, &r, ready).map(Response::new);
                }
            }
            let _ =
                tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), notified)
                    .await;
        }
    }

    async fn push(&self, request: Request<PushRequest>) -> Result<Response<PushReply>, Status> {
        let routed = crate::migrate::epoch_of(&request);
        let r = request.into_inner();
        let changed = {
            let mut s = self.lock();
            crate::migrate::stale_route("Push", s.server_id, s.epoch, routed)?;
            if r.tensors.len() != s.names.len() {
                return Err(Status::invalid_argument(format!(
                    "push of step {}: {} tensors, server {} holds {}",
                    r.step,
                    r.tensors.len(),
                    s.server_id,
                    s.names.len()
                )));
            }
            let grads = r
                .tensors
                .iter()
                .zip(s.names.iter().zip(&s.shapes))
                .map(|(m, (n, shape))| from_msg(m, n, shape))
                .collect::<Result<Vec<_>, _>>()
                .map_err(status)?;
            let sparse = sparse_grads(&s, &r.sparse).map_err(status)?;
            // A non-finite gradient is refused before it reaches the optimizer (it would make
            // the parameters NaN for good, and every later step with them).
            let dense = grads.iter().zip(&s.names).map(|(g, n)| (n.as_str(), g));
            for (name, g) in dense {
                let values = g.as_f32().map_err(|e| status(PsError::tensor(name, e)))?;
                check_finite(&format!("the gradient of {name}"), values)
                    .map_err(|e| refused_push(&r, e))?;
            }
            // The rows weigh the push in the step's mean: a worker's block of the global
            // batch, never empty (their sum would overflow, or a zero weight drop the push).
            if r.rows == 0 || r.rows > s.batch_size {
                return Err(refused_push(
                    &r,
                    PsError::message(
                        "rows",
                        format!(
                            "{} rows, expected 1 to {} (data.batch_size, the global batch)",
                            r.rows, s.batch_size
                        ),
                    ),
                ));
            }
            if !r.loss.is_finite() {
                return Err(refused_push(
                    &r,
                    PsError::message(
                        "the loss",
                        format!("is {}: the training diverged (lower train.learning_rate or set train.max_grad_norm)", r.loss),
                    ),
                ));
            }
            for (table, rows) in s.tables.iter().zip(&sparse) {
                check_finite(
                    &format!("the row gradient of table {}", table.info().name),
                    &rows.values,
                )
                .map_err(|e| refused_push(&r, e))?;
            }
            let learning_rate = match r.learning_rate {
                Some(lr) if lr.is_finite() && lr >= 0.0 => lr,
                other => {
                    return Err(Status::invalid_argument(format!(
                        "push of step {} by worker {}: learning_rate {other:?}, expected a finite rate >= 0",
                        r.step, r.worker_id
                    )))
                }
            };
            if r.members.len() > runtime::MAX_PS_PROCESSES || !r.members.contains(&r.worker_id) {
                return Err(Status::invalid_argument(format!(
                    "push of step {} by worker {}: {} members, which must include the worker and number at most {}",
                    r.step,
                    r.worker_id,
                    r.members.len(),
                    runtime::MAX_PS_PROCESSES
                )));
            }
            let sync = s.sync;
            if let Some(rec) = s.recovery.as_mut() {
                rec.note_push(sync, &r);
            }
            if s.sync {
                if r.step >= s.open_step() {
                    if r.step > s.version + MAX_STEPS_AHEAD {
                        return Err(Status::failed_precondition(format!(
                            "push of step {} is more than {MAX_STEPS_AHEAD} steps ahead of server {}'s step {}",
                            r.step, s.server_id, s.version
                        )));
                    }
                    s.members.insert(r.step, r.members.clone());
                    s.pending.entry(r.step).or_default().insert(
                        r.worker_id,
                        Pushed {
                            rows: r.rows,
                            loss: r.loss,
                            replay: r.replay,
                            learning_rate,
                            grads,
                            sparse,
                        },
                    );
                }
                // A push of a step already applied, or whose mean waits for its norm (a replay
                // that crossed), is dropped.
                s.complete_steps().map_err(status)?
            } else {
                s.apply(&grads, &sparse, learning_rate).map_err(status)?;
                s.last_loss = r.loss;
                s.report_recovery();
                true
            }
        };
        if changed {
            self.changed.notify_waiters();
        }
        let s = self.lock();
        Ok(Response::new(PushReply {
            version: s.version,
            snapshot_version: s.snapshot_version,
        }))
    }

    async fn handover(
        &self,
        request: Request<HandoverRequest>,
    ) -> Result<Response<HandoverReply>, Status> {
        self.receive(request.into_inner())
    }
}

/// The address a server bound at `bound` gives the scheduler for workers to reach it:
/// `TESSERA_ADVERTISE_HOST` with the bound port, else the bound address, which must then be one
/// a worker can connect to (not `0.0.0.0` or `::`).
fn advertised_addr(env: &RoleEnv, bound: std::net::SocketAddr) -> Result<String, PsError> {
    match &env.advertise_host {
        Some(host) => Ok(format!("{host}:{}", bound.port())),
        None if bound.ip().is_unspecified() => Err(PsError::Env {
            var: launch_env::ADVERTISE_HOST.to_string(),
            reason: format!(
                "server {} binds every interface ({bound}), so it needs the name workers reach it by",
                env.server_id
            ),
        }),
        None => Ok(bound.to_string()),
    }
}

/// Removes the snapshot an earlier job left at `path` (`<output.dir>/ps/server_<id>.safetensors`)
/// when server `server_id` starts fresh, saying so; none there is fine.
fn remove_stale_snapshot(path: &std::path::Path, server_id: usize) -> Result<(), PsError> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            eprintln!(
                "[ps server {server_id}] removed {}, an earlier job's snapshot: this job's restarts resume from its own",
                path.display()
            );
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(PsError::SnapshotIo {
            path: path.to_path_buf(),
            what:
                "removing an earlier job's snapshot (a restart of this server would resume from it)"
                    .to_string(),
            source: Box::new(e),
        }),
    }
}

/// Runs server `env.server_id`: binds `env.host` (127.0.0.1 unset) at `env.server_port` (0: any), registers with the
/// scheduler, serves until the scheduler says the job is over, and writes a last snapshot.
pub fn run(config: &TrainConfig, settings: &JobSettings, env: &RoleEnv) -> Result<(), PsError> {
    let compute = Compute::new(config)?;
    // A job with more servers than the model has blocks is refused by every server of it
    // (under a launcher that did not check, e.g. `tessera launch --ps-servers`), not run
    // with servers holding nothing.
    if !env.added_server {
        check_servers_hold_something(compute.params(), compute.tables(), settings.servers)
            .map_err(|reason| {
                crate::env::servers_error(
                    config.ps().unwrap_or(&runtime::PsKeys::default()),
                    reason,
                )
            })?;
    }
    let rt = crate::scheduler::runtime(2)?;
    // The committed partition map (servers may have been added since the job started).
    let map = rt.block_on(current_map(settings, env))?;
    let joining = env.server_id >= map.servers;
    if joining {
        check_servers_hold_something(compute.params(), compute.tables(), map.servers + 1)
            .map_err(|reason| PsError::Env {
                var: launch_env::SERVER_JOIN.to_string(),
                reason: format!(
                    "server {} cannot be added to a job of {} server(s): the new map would have {reason}",
                    env.server_id, map.servers
                ),
            })?;
    }
    if joining && !env.added_server {
        return Err(PsError::Env {
            var: launch_env::SERVER_ID.to_string(),
            reason: format!(
                "{} is not below the job's {} servers (set {}=1 to add a server)",
                env.server_id,
                map.servers,
                launch_env::SERVER_JOIN
            ),
        });
    }
    let held_index = match joining {
        true => Vec::new(),
        false => partition_of(compute.params(), map.servers, env.server_id),
    };
    let initial_all = compute.initial_params()?;
    let held: Vec<ParamInfo> = held_index
        .iter()
        .map(|&i| compute.params()[i].clone())
        .collect();
    let initial: Vec<Tensor> = held_index.iter().map(|&i| initial_all[i].clone()).collect();
    let all = compute.params().to_vec();
    if (joining || map.servers != settings.servers) && !compute.tables().is_empty() {
        return Err(PsError::Config {
            key: "ps.embedding_on_server".to_string(),
            reason: "a server cannot be added to a job with server-resident tables: their row \
                     blocks are not migrated"
                .to_string(),
        });
    }
    let tables = crate::table::server_tables(&compute, config, settings.servers, env)?;
    drop(compute);
    let service = ServerService::new(
        settings,
        config,
        env.server_id,
        &held,
        initial,
        env.restart_count > 0,
    )?;
    // A push carries the partition's gradients (and at most this server's table rows), a
    // handover (adding a server) at most every parameter with its optimizer state; nothing
    // larger is read.
    let states = config.optimizer_config().kind.state_names().len();
    let table_bytes: usize = tables.iter().map(ServerTable::bytes).sum();
    let mut names: Vec<String> = held.iter().map(|p| p.name.clone()).collect();
    names.extend(tables.iter().map(|t| {
        let b = t.block();
        format!("rows {}..{} of {}", b.start, b.end, t.info().name)
    }));
    let service = service.with_tables(tables);
    let limit = message_limit(
        held.iter()
            .map(ParamInfo::bytes)
            .sum::<usize>()
            .saturating_add(table_bytes),
    )
    .max(handover_limit(&all, states));
    service.enable_migration(all, (!joining).then_some(map.epoch));
    match joining {
        true => eprintln!(
            "[ps server {}] is being added to a job of {} server(s): it holds nothing until the handover",
            env.server_id, map.servers
        ),
        false => eprintln!("[ps server {}] holds {}", env.server_id, names.join(", ")),
    }
    let settings = settings.clone();
    let env = env.clone();
    rt.block_on(async move {
        let bind = format!(
            "{}:{}",
            env.host.as_deref().unwrap_or("127.0.0.1"),
            env.server_port
        );
        let listener = tokio::net::TcpListener::bind(&bind)
            .await
            .map_err(|e| PsError::io(format!("binding server {} to {bind}", env.server_id), e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| PsError::io("the server's address", e))?;
        let addr = advertised_addr(&env, bound)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let admission = CheckSecret::new(&env.secret, format!("server {}", env.server_id));
        let serving = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(InterceptedService::new(
                    ParameterServerServer::new(service.clone())
                        .max_decoding_message_size(limit)
                        .max_encoding_message_size(limit),
                    admission,
                ))
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                    async {
                        let _ = stop_rx.await;
                    },
                ),
        );
        let outcome = serve(&service, &settings, &env, &addr).await;
        let _ = stop_tx.send(());
        crate::net::stop_serving(serving, &format!("server {}", env.server_id)).await;
        outcome?;
        service.final_snapshot()
    })
}

/// Registers, then heartbeats (and, in sync mode, asks which of a waiting step's members are
/// alive) until the scheduler ends the job.
async fn serve(
    service: &ServerService,
    settings: &JobSettings,
    env: &RoleEnv,
    addr: &str,
) -> Result<(), PsError> {
    let policy = settings.retry;
    let peer = format!("the scheduler at {}", env.scheduler_addr);
    let client = scheduler_client(&env.scheduler_addr, policy.timeout, &env.secret)?;
    let register = RegisterServerRequest {
        server_id: env.server_id as u32,
        addr: addr.to_string(),
        restart_count: env.restart_count,
        incarnation: crate::auth::new_incarnation()?,
    };
    let waits = (settings.heartbeat, settings.registration_patience());
    let register_now = || {
        until_admitted(&policy, ("RegisterServer", &peer), waits, || {
            let mut c = client.clone();
            let r = register.clone();
            async move { c.register_server(r).await }
        })
    };
    register_now().await?;
    eprintln!("[ps server {}] serving at {addr}", env.server_id);
    let tick = (settings.heartbeat / 2).max(Duration::from_millis(5));
    let mut last_beat = Instant::now() - settings.heartbeat;
    loop {
        tokio::time::sleep(tick).await;
        if last_beat.elapsed() >= settings.heartbeat {
            last_beat = Instant::now();
            let beat = HeartbeatRequest {
                role: Role::Server as i32,
                id: env.server_id as u32,
                step: service.version(),
            };
            let reply = policy
                .run("Heartbeat", &peer, |_| {
                    let mut c = client.clone();
                    let b = beat;
                    async move { c.heartbeat(b).await }
                })
                .await?
                .into_inner();
            if reply.shutdown {
                eprintln!(
                    "[ps server {}] the job is over at version {}",
                    env.server_id,
                    service.version()
                );
                return Ok(());
            }
            if reply.rejoin {
                register_now().await?;
            }
        }
        migrate::tick(service, &client, &policy, &env.secret).await?;
        if let Some(step) = service.waiting_step() {
            // One attempt per tick: the heartbeat is what fails the server when the
            // scheduler is gone.
            let mut c = client.clone();
            if let crate::retry::Attempt::Done(reply) = policy
                .attempt(c.step_members(StepMembersRequest { step }))
                .await
            {
                let reply = reply.into_inner();
                if reply.known {
                    service.set_alive(step, reply.alive)?;
                }
            }
        }
    }
}

#[cfg(test)]
mod recovery_tests {
    use super::*;

    /// A restarted server at snapshot version 8 whose workers had seen version 9: step 8
    /// completed by live pushes (a replay crossed with them) is a step applied again, not a
    /// live one, so nothing is lost; step 9 then ends the replay.
    #[test]
    fn a_step_below_what_the_workers_saw_counts_as_replayed_whichever_pushes_made_it() {
        let mut r = Recovery {
            from: 8,
            replayed: 0,
            seen: 9,
            live: false,
            reported: false,
        };
        r.note_step(8, false);
        assert_eq!((r.replayed, r.live, r.lost()), (1, false, 0));
        r.note_step(9, false);
        assert_eq!((r.replayed, r.live, r.lost()), (1, true, 0));
        // A replayed push counts as ever; steps never brought back are lost.
        let mut r = Recovery {
            from: 4,
            replayed: 0,
            seen: 7,
            live: false,
            reported: false,
        };
        r.note_step(4, true);
        assert_eq!(r.lost(), 2);
    }

    /// A restarted server at snapshot version 4 whose workers had seen only version 4 before
    /// the restart: the live pushes of step 4 and then of step 5 (which saw version 5 of the
    /// restarted server) lose nothing; a replayed push, or one that saw past its step, counts.
    #[test]
    fn only_what_the_workers_saw_before_the_restart_counts() {
        let push = |step: u64, seen_version: u64, replay: bool| PushRequest {
            step,
            seen_version,
            replay,
            ..PushRequest::default()
        };
        let mut r = Recovery {
            from: 4,
            replayed: 0,
            seen: 0,
            live: false,
            reported: false,
        };
        r.note_push(true, &push(4, 4, false));
        r.note_step(4, false);
        r.note_push(true, &push(5, 5, false));
        r.note_step(5, false);
        assert_eq!((r.seen, r.replayed, r.lost()), (0, 0, 0));
        r.note_push(true, &push(5, 7, false));
        assert_eq!(r.seen, 7);
        r.note_push(true, &push(2, 3, true));
        assert_eq!(r.seen, 7);
        // Async counts every push's.
        let mut r = Recovery { seen: 0, ..r };
        r.note_push(false, &push(5, 5, false));
        assert_eq!(r.seen, 5);
    }
}

#[cfg(test)]
mod advertise_tests {
    use super::*;

    fn server_env(host: Option<&str>, advertise: Option<&str>) -> RoleEnv {
        let mut env = RoleEnv::from_lookup(|name| match name {
            "TESSERA_ROLE" => Some("server".to_string()),
            "TESSERA_SERVER_ID" => Some("1".to_string()),
            "TESSERA_SCHEDULER_ADDR" => Some("127.0.0.1:1".to_string()),
            "TESSERA_JOB_SECRET" => Some("a-job-secret-of-enough-length".to_string()),
            _ => None,
        })
        .unwrap()
        .unwrap();
        env.host = host.map(str::to_string);
        env.advertise_host = advertise.map(str::to_string);
        env
    }

    #[test]
    fn a_server_advertises_its_name_or_a_reachable_bound_address() {
        let any: std::net::SocketAddr = "0.0.0.0:50052".parse().unwrap();
        let local: std::net::SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let named = server_env(Some("0.0.0.0"), Some("tessera-server-1.tessera-server"));
        assert_eq!(
            advertised_addr(&named, any).unwrap(),
            "tessera-server-1.tessera-server:50052"
        );
        assert_eq!(
            advertised_addr(&server_env(None, None), local).unwrap(),
            "127.0.0.1:40000"
        );
        let err = advertised_addr(&server_env(Some("0.0.0.0"), None), any)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("TESSERA_ADVERTISE_HOST") && err.contains("server 1"),
            "{err}"
        );
    }
}
