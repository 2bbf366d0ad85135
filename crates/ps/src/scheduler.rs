//! The scheduler: registration, liveness, each step's members and rows, async staleness, and
//! the end of the job.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tonic::{Request, Response, Status};

use crate::auth::CheckSecret;
use crate::env::{JobSettings, RoleEnv};
use crate::error::PsError;
use crate::liveness::Liveness;
use crate::proto::scheduler_server::{Scheduler, SchedulerServer};
use crate::proto::*;

mod map;

/// Step assignments kept for replays after a server restart (older ones are dropped).
const KEPT_ASSIGNMENTS: u64 = 100_000;

/// The longest a long-polling call (`BeginStep` waiting on staleness, `JobStatus`) is held.
const LONGEST_POLL: Duration = Duration::from_millis(500);

/// The scheduler's state.
struct State {
    batch_size: usize,
    sync: bool,
    staleness: u64,
    servers: BTreeMap<u32, String>,
    server_live: Liveness,
    worker_live: Liveness,
    /// The step each worker last began.
    worker_step: BTreeMap<u32, u64>,
    /// Workers that ran their last step.
    done: BTreeSet<u32>,
    /// Members of every step begun, in row order.
    assignments: BTreeMap<u64, Vec<u32>>,
    /// Whether any worker ever registered.
    had_workers: bool,
    /// The job's workers at the start (`ps.workers`).
    expected_workers: usize,
    /// Workers that ever registered.
    registered: BTreeSet<u32>,
    /// By worker, the first step its current incarnation takes part in: a worker restarted
    /// before it was declared dead is not a member of the steps its old incarnation left
    /// unfinished.
    joined_from: BTreeMap<u32, u64>,
    /// When the scheduler started, and how long step 0 waits for the expected workers.
    started: Instant,
    startup_grace: Duration,
    /// Servers that heard the job is over.
    servers_told: BTreeSet<u32>,
    /// Worker 0 (or, when it died, the scheduler) declared the job over.
    finished: bool,
    /// The partition map and a server being added.
    map: map::MapState,
    /// By worker and by server, the incarnation (a random number each process draws) of the
    /// process that holds the id: a second process cannot register a live id.
    worker_incarnation: BTreeMap<u32, u64>,
    server_incarnation: BTreeMap<u32, u64>,
    /// Incarnations refused so far (each refusal is logged once).
    refused: BTreeSet<u64>,
    /// Workers declared dead and not registered since, with the last step each had begun.
    lost: BTreeMap<u32, u64>,
}

impl State {
    /// Whether every live worker ran its last step (and one did).
    fn all_done(&self) -> bool {
        !self.done.is_empty()
            && self
                .worker_live
                .alive()
                .iter()
                .all(|w| self.done.contains(w))
    }

    /// The slowest live, unfinished worker's step.
    fn slowest_step(&self) -> Option<u64> {
        self.worker_live
            .alive()
            .iter()
            .filter(|w| !self.done.contains(w))
            .filter_map(|w| self.worker_step.get(w).copied())
            .min()
    }

    /// The first step not yet begun.
    fn next_step(&self) -> u64 {
        self.assignments
            .keys()
            .next_back()
            .map_or(0, |&last| last.saturating_add(1))
    }

    /// The members of `step`, fixing them (the live unfinished workers, at most one per row)
    /// when it is new.
    fn members(&mut self, step: u64) -> Vec<u32> {
        if let Some(m) = self.assignments.get(&step) {
            return m.clone();
        }
        let members: Vec<u32> = self
            .worker_live
            .alive()
            .into_iter()
            .filter(|w| !self.done.contains(w))
            .take(self.batch_size)
            .collect();
        self.assignments.insert(step, members.clone());
        let keep_from = step.saturating_sub(KEPT_ASSIGNMENTS);
        self.assignments = self.assignments.split_off(&keep_from);
        members
    }
}

/// `d` in whole milliseconds (saturating).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Rows `offset, count` of a `batch`-row batch for the member at `position` of `members`:
/// contiguous blocks, the first `batch % members` one row larger.
pub fn rows_of(batch: usize, members: usize, position: usize) -> (usize, usize) {
    let members = members.max(1);
    let (base, extra) = (batch / members, batch % members);
    let offset = position * base + position.min(extra);
    (offset, base + usize::from(position < extra))
}

/// The scheduler's gRPC service.
#[derive(Clone)]
pub struct SchedulerService {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

impl SchedulerService {
    /// A scheduler for a job of `settings` with global batch `batch_size`.
    pub fn new(settings: &JobSettings, batch_size: usize) -> SchedulerService {
        SchedulerService {
            state: Arc::new(Mutex::new(State {
                batch_size: batch_size.max(1),
                sync: settings.sync,
                staleness: settings.staleness,
                servers: BTreeMap::new(),
                server_live: Liveness::new(settings.dead_after),
                worker_live: Liveness::new(settings.dead_after),
                worker_step: BTreeMap::new(),
                done: BTreeSet::new(),
                assignments: BTreeMap::new(),
                had_workers: false,
                expected_workers: settings.workers,
                registered: BTreeSet::new(),
                joined_from: BTreeMap::new(),
                started: Instant::now(),
                startup_grace: settings.retry.timeout * (settings.retry.retries + 1),
                servers_told: BTreeSet::new(),
                finished: false,
                map: map::MapState::new(settings.servers),
                worker_incarnation: BTreeMap::new(),
                server_incarnation: BTreeMap::new(),
                refused: BTreeSet::new(),
                lost: BTreeMap::new(),
            })),
            changed: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Declares dead every silent process (logging each); ends the job when every live
    /// worker is done and worker 0 is gone. Returns an error when every worker died.
    pub fn sweep(&self) -> Result<(), PsError> {
        let now = Instant::now();
        let mut s = self.lock();
        let mut changed = false;
        for (id, silent) in s.worker_live.sweep(now) {
            let step = s.worker_step.get(&id).copied().unwrap_or(0);
            if !s.done.contains(&id) {
                s.lost.insert(id, step);
            }
            eprintln!(
                "[ps scheduler] worker {id} declared dead at step {step}: no heartbeat for {} ms; its rows go to the live workers from the next step",
                silent.as_millis()
            );
            changed = true;
        }
        for (id, silent) in s.server_live.sweep(now) {
            eprintln!(
                "[ps scheduler] server {id} declared dead: no heartbeat for {} ms; workers wait for it to restart",
                silent.as_millis()
            );
            s.servers.remove(&id);
            changed = true;
        }
        if s.all_done() && !s.worker_live.is_alive(0) && !s.finished {
            eprintln!(
                "[ps scheduler] every live worker is done and worker 0 is gone: the job ends{}",
                lost_text(&s.lost)
            );
            s.finished = true;
            changed = true;
        }
        let all_dead = s.had_workers && s.worker_live.alive().is_empty() && !s.finished;
        let migration = s.map.failed(&s.server_live.dead(), now, s.startup_grace);
        // The job cannot go on without a server: one declared dead must register again (a
        // restart) within the time a process may take to start, else nothing restarted it (a
        // plain `tessera train`, restarts exhausted, or a hung process) and the job would wait
        // for it forever.
        let unrestarted = match s.finished {
            true => None,
            false => s
                .server_live
                .dead_for(now)
                .into_iter()
                .find(|&(_, dead)| dead > s.startup_grace),
        };
        let grace = s.startup_grace;
        drop(s);
        if let Some(why) = migration {
            return Err(PsError::job("the job", why));
        }
        if let Some((id, _)) = unrestarted {
            return Err(PsError::job(
                "the job",
                format!(
                    "server {id} was declared dead (no heartbeat) and did not register again within {} s (ps.rpc_timeout_ms × (ps.rpc_retries + 1), the time a restarted process may take to start): nothing restarted it (`tessera launch --restarts K` restarts a server that ended; a hung one is not ended by it)",
                    grace.as_secs_f64()
                ),
            ));
        }
        if changed {
            self.changed.notify_waiters();
        }
        if all_dead {
            return Err(PsError::job(
                "the job",
                "every worker died before the job ended",
            ));
        }
        Ok(())
    }

    /// Whether the job is over.
    pub fn finished(&self) -> bool {
        self.lock().finished
    }

    /// Whether every live server has heard that the job is over.
    pub fn servers_told(&self) -> bool {
        let s = self.lock();
        s.server_live
            .alive()
            .iter()
            .all(|id| s.servers_told.contains(id))
    }

    /// The live workers, ascending.
    pub fn live_workers(&self) -> Vec<u32> {
        self.lock().worker_live.alive()
    }

    /// The workers declared dead, ascending.
    pub fn dead_workers(&self) -> Vec<u32> {
        self.lock().worker_live.dead()
    }

    /// The workers the job lost (declared dead, not registered since), with the last step each
    /// had begun, by id.
    pub fn lost_workers(&self) -> Vec<(u32, u64)> {
        self.lock()
            .lost
            .iter()
            .map(|(&id, &step)| (id, step))
            .collect()
    }

    /// Waits (at most `limit`) for a change of state.
    async fn wait_change(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.changed.notified()).await;
    }
}

#[tonic::async_trait]
impl Scheduler for SchedulerService {
    async fn register_server(
        &self,
        request: Request<RegisterServerRequest>,
    ) -> Result<Response<RegisterServerReply>, Status> {
        let r = request.into_inner();
        {
            let mut s = self.lock();
            let s = &mut *s;
            admit(
                ("server", r.server_id, r.incarnation),
                &s.server_live,
                &mut s.server_incarnation,
                &mut s.refused,
            )?;
            // A server joining a job that is over would open a partition map no step will use.
            let joining = r.server_id as usize >= s.map.current.servers;
            if s.finished && joining {
                return Err(Status::failed_precondition(format!(
                    "server {} cannot be added: the job is over",
                    r.server_id
                )));
            }
            let next_step = s.next_step();
            let opened = s
                .map
                .register(r.server_id, next_step)
                .map_err(Status::failed_precondition)?;
            if opened {
                eprintln!(
                    "[ps scheduler] server {} is being added: the partition map of epoch {} over {} servers takes effect at step {next_step}; workers wait there for the handover",
                    r.server_id,
                    s.map.current.epoch + 1,
                    r.server_id + 1
                );
            }
            s.servers.insert(r.server_id, r.addr.clone());
            s.server_live.register(r.server_id, Instant::now());
        }
        eprintln!(
            "[ps scheduler] server {} registered at {} (restart {})",
            r.server_id, r.addr, r.restart_count
        );
        self.changed.notify_waiters();
        Ok(Response::new(RegisterServerReply {}))
    }

    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerReply>, Status> {
        let r = request.into_inner();
        let start_step = {
            let mut s = self.lock();
            // Worker ids are 0..data.batch_size: a step gives each member its own rows, so a
            // worker beyond the rows would never train (the rule `ps.workers` follows; workers
            // joining mid-run take the next ids up to it).
            if r.worker_id as usize >= s.batch_size {
                return Err(Status::invalid_argument(format!(
                    "RegisterWorker by worker {}: worker ids are 0..{batch} (a step splits the global batch of {batch} rows, data.batch_size, one block per worker)",
                    r.worker_id,
                    batch = s.batch_size
                )));
            }
            let state = &mut *s;
            admit(
                ("worker", r.worker_id, r.incarnation),
                &state.worker_live,
                &mut state.worker_incarnation,
                &mut state.refused,
            )?;
            s.lost.remove(&r.worker_id);
            s.had_workers = true;
            s.registered.insert(r.worker_id);
            s.done.remove(&r.worker_id);
            s.worker_live.register(r.worker_id, Instant::now());
            // A worker joining a running job takes part from the first step not yet begun.
            let start = s.next_step();
            s.joined_from.insert(r.worker_id, start);
            start
        };
        eprintln!(
            "[ps scheduler] worker {} registered (restart {}), from step {start_step}",
            r.worker_id, r.restart_count
        );
        self.changed.notify_waiters();
        Ok(Response::new(RegisterWorkerReply { start_step }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        let r = request.into_inner();
        let now = Instant::now();
        let mut s = self.lock();
        let alive = match Role::try_from(r.role) {
            Ok(Role::Server) => {
                if s.finished {
                    s.servers_told.insert(r.id);
                }
                s.server_live.beat(r.id, now)
            }
            Ok(Role::Worker) => {
                let alive = s.worker_live.beat(r.id, now);
                if alive {
                    let step = s.worker_step.entry(r.id).or_insert(r.step);
                    *step = (*step).max(r.step);
                }
                alive
            }
            _ => {
                return Err(Status::invalid_argument(
                    "heartbeat: role must be server or worker",
                ))
            }
        };
        Ok(Response::new(HeartbeatReply {
            shutdown: s.finished,
            rejoin: !alive && !s.finished,
        }))
    }

    async fn get_servers(
        &self,
        _request: Request<GetServersRequest>,
    ) -> Result<Response<GetServersReply>, Status> {
        let s = self.lock();
        let now = Instant::now();
        let servers = s
            .servers
            .iter()
            .map(|(&server_id, addr)| ServerAddr {
                server_id,
                addr: addr.clone(),
                silent_ms: millis(s.server_live.silent_for(server_id, now).unwrap_or_default()),
            })
            .collect();
        // While the job goes on, the scheduler waits `startup_grace` for each dead server to
        // register again (`sweep`); the workers wait for it as long.
        let dead = match s.finished {
            true => Vec::new(),
            false => s
                .server_live
                .dead_for(now)
                .into_iter()
                .map(|(server_id, dead)| DeadServer {
                    server_id,
                    dead_for_ms: millis(dead),
                })
                .collect(),
        };
        Ok(Response::new(GetServersReply {
            servers,
            map_epoch: s.map.current.epoch,
            map_servers: s.map.current.servers as u32,
            dead,
            restart_wait_ms: millis(s.startup_grace),
        }))
    }

    async fn begin_step(
        &self,
        request: Request<BeginStepRequest>,
    ) -> Result<Response<BeginStepReply>, Status> {
        let r = request.into_inner();
        let reply = |status: StepStatus| BeginStepReply {
            status: status as i32,
            ..BeginStepReply::default()
        };
        let deadline = Instant::now() + LONGEST_POLL;
        loop {
            {
                let mut s = self.lock();
                if !s.worker_live.is_alive(r.worker_id) {
                    return Ok(Response::new(reply(StepStatus::Rejoin)));
                }
                // Steps are begun in order (a worker goes on from a step begun, or from the
                // step its registration gave it): a step past the next one would fix members
                // of a step no one reaches and drop the assignments kept for replays.
                let next = s.next_step();
                if r.step > next {
                    return Err(Status::invalid_argument(format!(
                        "BeginStep of step {} by worker {}: the job's next step is {next} (steps are begun in order)",
                        r.step, r.worker_id
                    )));
                }
                s.worker_step.insert(r.worker_id, r.step);
                let too_far = !s.sync
                    && !s.assignments.contains_key(&r.step)
                    && s.slowest_step()
                        .is_some_and(|slowest| r.step > slowest + s.staleness);
                // The first step waits (a bounded time) for the job's workers to register,
                // so its members, and every rank's rows, are those of the full job.
                let starting = s.assignments.is_empty()
                    && s.registered.len() < s.expected_workers
                    && s.started.elapsed() < s.startup_grace;
                let migrating = s.map.holds(r.step);
                if !too_far && !starting && !migrating {
                    let members = s.members(r.step);
                    let Some(position) = members.iter().position(|&m| m == r.worker_id) else {
                        return Ok(Response::new(reply(StepStatus::Skip)));
                    };
                    let (offset, count) = rows_of(s.batch_size, members.len(), position);
                    let map_epoch = s.map.current.epoch;
                    drop(s);
                    self.changed.notify_waiters();
                    return Ok(Response::new(BeginStepReply {
                        status: StepStatus::Go as i32,
                        members,
                        row_offset: offset as u64,
                        row_count: count as u64,
                        map_epoch,
                    }));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Response::new(reply(StepStatus::Wait)));
            }
            self.wait_change(deadline - now).await;
        }
    }

    async fn step_members(
        &self,
        request: Request<StepMembersRequest>,
    ) -> Result<Response<StepMembersReply>, Status> {
        let step = request.into_inner().step;
        let s = self.lock();
        let reply = match s.assignments.get(&step) {
            Some(members) => StepMembersReply {
                alive: members
                    .iter()
                    .copied()
                    .filter(|&w| s.worker_live.is_alive(w))
                    .filter(|w| s.joined_from.get(w).is_none_or(|&from| from <= step))
                    .collect(),
                known: true,
            },
            None => StepMembersReply {
                alive: Vec::new(),
                known: false,
            },
        };
        Ok(Response::new(reply))
    }

    async fn worker_done(
        &self,
        request: Request<WorkerDoneRequest>,
    ) -> Result<Response<WorkerDoneReply>, Status> {
        let id = request.into_inner().worker_id;
        {
            let mut s = self.lock();
            // Only a worker of the job ends: an id that never registered (any u32 a client
            // sends) would count as a finished worker and could end the job.
            if !s.registered.contains(&id) {
                return Err(Status::invalid_argument(format!(
                    "WorkerDone by worker {id}: no worker {id} has registered (worker ids are 0..{}, each registered before its last step)",
                    s.batch_size
                )));
            }
            s.done.insert(id);
        }
        eprintln!("[ps scheduler] worker {id} ran its last step");
        self.changed.notify_waiters();
        Ok(Response::new(WorkerDoneReply {}))
    }

    async fn job_status(
        &self,
        request: Request<JobStatusRequest>,
    ) -> Result<Response<JobStatusReply>, Status> {
        let wait = Duration::from_millis(u64::from(request.into_inner().wait_ms)).min(LONGEST_POLL);
        let deadline = Instant::now() + wait;
        loop {
            {
                let s = self.lock();
                let all_workers_done = s.all_done();
                if all_workers_done || Instant::now() >= deadline {
                    return Ok(Response::new(JobStatusReply {
                        all_workers_done,
                        live_workers: s.worker_live.alive(),
                        dead_workers: s.worker_live.dead(),
                        lost: s
                            .lost
                            .iter()
                            .map(|(&worker_id, &step)| LostWorker { worker_id, step })
                            .collect(),
                        done_workers: s.done.iter().copied().collect(),
                    }));
                }
            }
            self.wait_change(deadline.saturating_duration_since(Instant::now()))
                .await;
        }
    }

    async fn finish(
        &self,
        _request: Request<FinishRequest>,
    ) -> Result<Response<FinishReply>, Status> {
        let lost = {
            let mut s = self.lock();
            s.finished = true;
            lost_text(&s.lost)
        };
        eprintln!("[ps scheduler] the job is over{lost}");
        self.changed.notify_waiters();
        Ok(Response::new(FinishReply {}))
    }

    async fn partition_map(
        &self,
        request: Request<PartitionMapRequest>,
    ) -> Result<Response<PartitionMapReply>, Status> {
        let r = request.into_inner();
        let mut s = self.lock();
        let committed = match r.ready_epoch > s.map.current.epoch {
            true => s.map.ready(r.server_id, r.ready_epoch),
            false => None,
        };
        if let Some((map, step)) = committed {
            eprintln!(
                "[ps scheduler] partition map of epoch {} committed: {} servers from step {step}",
                map.epoch, map.servers
            );
        }
        // The step each live, unfinished worker waits at (or is on).
        let steps: Vec<Option<u64>> = s
            .worker_live
            .alive()
            .iter()
            .filter(|w| !s.done.contains(w))
            .map(|w| s.worker_step.get(w).copied())
            .collect();
        let go = !s.finished && s.map.go(&steps, Instant::now());
        let pending = s.map.pending.clone();
        let reply = PartitionMapReply {
            epoch: s.map.current.epoch,
            servers: s.map.current.servers as u32,
            next_epoch: pending.as_ref().map_or(0, |p| p.map.epoch),
            next_servers: pending.as_ref().map_or(0, |p| p.map.servers as u32),
            switch_step: pending.as_ref().map_or(0, |p| p.switch_step),
            go,
            servers_addrs: s
                .servers
                .iter()
                .map(|(&server_id, addr)| ServerAddr {
                    server_id,
                    addr: addr.clone(),
                    silent_ms: 0,
                })
                .collect(),
        };
        drop(s);
        if committed.is_some() {
            self.changed.notify_waiters();
        }
        Ok(Response::new(reply))
    }
}

/// Admits the process `incarnation` to `role` `id`: refused (`AlreadyExists`) when the id is
/// alive and held by another process (logged once per process, in `refused`); a repeated
/// registration of the same process (the same non-zero incarnation) is accepted.
fn admit(
    (role, id, incarnation): (&str, u32, u64),
    live: &Liveness,
    incarnations: &mut BTreeMap<u32, u64>,
    refused: &mut BTreeSet<u64>,
) -> Result<(), Status> {
    // Incarnation 0 is "unspecified": never taken for the same process again.
    let same_process = incarnation != 0 && incarnations.get(&id) == Some(&incarnation);
    if live.is_alive(id) && !same_process {
        if refused.insert(incarnation) {
            eprintln!(
                "[ps scheduler] refused a second registration of {role} {id}: the id is alive in another process (a restarted one is admitted once its predecessor is declared dead)"
            );
        }
        return Err(Status::already_exists(format!(
            "{role} {id} is alive: a second process cannot register its id; a restarted {role} is admitted once the scheduler declares its predecessor dead (ps.dead_after_ms)"
        )));
    }
    incarnations.insert(id, incarnation);
    Ok(())
}

/// `; lost: worker 2 at step 40, …` (empty when no worker was lost).
fn lost_text(lost: &BTreeMap<u32, u64>) -> String {
    if lost.is_empty() {
        return String::new();
    }
    let each: Vec<String> = lost
        .iter()
        .map(|(id, step)| format!("worker {id} at step {step}"))
        .collect();
    format!("; lost: {}", each.join(", "))
}

/// The socket address of `host:port`.
pub fn resolve(addr: &str) -> Result<SocketAddr, PsError> {
    addr.to_socket_addrs()
        .map_err(|e| PsError::io(format!("resolving {addr}"), e))?
        .next()
        .ok_or_else(|| {
            let none = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
            PsError::io(format!("resolving {addr}"), none)
        })
}

/// The address the scheduler binds: `TESSERA_HOST` with `TESSERA_SCHEDULER_ADDR`'s port (in a
/// pod, `0.0.0.0`: its own DNS name may not resolve before it is ready), else the address
/// `TESSERA_SCHEDULER_ADDR` resolves to.
fn bind_addr(env: &RoleEnv) -> Result<SocketAddr, PsError> {
    match &env.host {
        Some(host) => {
            let port = env
                .scheduler_addr
                .rsplit_once(':')
                .map_or("", |(_, port)| port);
            resolve(&format!("{host}:{port}"))
        }
        None => resolve(&env.scheduler_addr),
    }
}

/// A tokio runtime for one role.
pub fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, PsError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| PsError::io("starting the tokio runtime", e))
}

/// Runs the scheduler at `env.scheduler_addr` until the job is over (then waits a few
/// heartbeats so servers and workers see it), or fails when every worker died.
pub fn run(settings: &JobSettings, env: &RoleEnv, batch_size: usize) -> Result<(), PsError> {
    let rt = runtime(2)?;
    let service = SchedulerService::new(settings, batch_size);
    let addr = bind_addr(env)?;
    let heartbeat = settings.heartbeat;
    let admission = CheckSecret::new(&env.secret, "the scheduler");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| PsError::io(format!("binding the scheduler to {addr}"), e))?;
        eprintln!("[ps scheduler] listening on {addr}");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(SchedulerServer::with_interceptor(
                    service.clone(),
                    admission,
                ))
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                    async {
                        let _ = stop_rx.await;
                    },
                ),
        );
        let outcome = loop {
            tokio::time::sleep(heartbeat / 2).await;
            if let Err(e) = service.sweep() {
                break Err(e);
            }
            if service.finished() {
                // Serve until every live server has heard it (bounded), so none is left
                // calling a scheduler that is gone.
                let deadline = Instant::now() + heartbeat * 20;
                while !service.servers_told() && Instant::now() < deadline {
                    tokio::time::sleep(heartbeat / 2).await;
                    let _ = service.sweep();
                }
                tokio::time::sleep(heartbeat).await;
                break Ok(());
            }
        };
        let _ = stop_tx.send(());
        crate::net::stop_serving(server, "scheduler").await;
        outcome
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_contiguously_and_cover_the_batch() {
        assert_eq!(rows_of(32, 2, 0), (0, 16));
        assert_eq!(rows_of(32, 2, 1), (16, 16));
        let blocks: Vec<_> = (0..3).map(|p| rows_of(32, 3, p)).collect();
        assert_eq!(blocks, vec![(0, 11), (11, 11), (22, 10)]);
    }
}
