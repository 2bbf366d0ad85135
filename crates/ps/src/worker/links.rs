//! A worker's links: the scheduler client and one link per server of the partition map it
//! follows, with the calls over them (push, pull with replays, registration).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tensor::Tensor;

use crate::auth::JobSecret;
use crate::compute::Compute;
use crate::env::JobSettings;
use crate::error::PsError;
use crate::migrate::{tagged, STALE_ROUTE};
use crate::net::server_client;
use crate::net::JobChannel as Channel;
use crate::proto::parameter_server_client::ParameterServerClient;
use crate::proto::scheduler_client::SchedulerClient;
use crate::proto::*;
use crate::retry::{rpc_error, until_admitted, Attempt, RetryPolicy};
use crate::server::partition_of;
use crate::sparse::PulledRows;
use crate::wire::from_msg;

use super::norms::StepNorms;

/// One server as a worker sees it.
pub(super) struct ServerLink {
    pub(super) id: usize,
    pub(super) addr: String,
    pub(super) client: Option<ParameterServerClient<Channel>>,
    /// The parameters it holds: indices into the job's parameters.
    pub(super) held: Vec<usize>,
    /// Their bytes (the most a pull reply carries).
    pub(super) bytes: usize,
    /// The highest version seen.
    pub(super) seen: u64,
    /// Sync: this worker's pushes since the server's last snapshot, by step.
    pub(super) history: BTreeMap<u64, PushRequest>,
    /// Sync with clipping: the step whose global norm the server said it waits for.
    pub(super) awaiting: Option<u64>,
}

/// The worker's connections and settings.
pub(super) struct Links {
    pub(super) settings: JobSettings,
    pub(super) worker_id: u32,
    /// The job's secret (every server client carries it).
    pub(super) secret: JobSecret,
    /// This process's incarnation (see `RegisterWorkerRequest`).
    pub(super) incarnation: u64,
    pub(super) scheduler: SchedulerClient<Channel>,
    pub(super) scheduler_peer: String,
    pub(super) servers: Vec<ServerLink>,
    /// The epoch of the partition map `servers` follow (every pull and push is tagged with it).
    pub(super) epoch: u64,
    /// Payload bytes pulled and pushed.
    pub(super) pull_bytes: u64,
    pub(super) push_bytes: u64,
    /// Sync with clipping: the steps' global square sums.
    pub(super) norms: StepNorms,
}

/// What the scheduler says of a server a worker's calls no longer reach (the reason in each).
#[derive(Debug)]
enum Restart {
    /// It waits for the server to restart (or to be declared dead first): retry.
    Awaited(String),
    /// It gave up waiting for the server to restart.
    GaveUp(String),
    /// It still hears from the server (or does not know it): the worker's retries are spent.
    Alive(String),
}

/// What the scheduler's `reply` says of server `s`, which a worker's calls have failed to
/// reach for `failing` with the retries of `retry` spent (`dead_after`, `heartbeat`: the job's
/// `ps.dead_after_ms` and `ps.heartbeat_ms`).
fn restart_verdict(
    s: usize,
    reply: &GetServersReply,
    failing: Duration,
    (retry, dead_after, heartbeat): (&RetryPolicy, Duration, Duration),
) -> Restart {
    let wait = Duration::from_millis(reply.restart_wait_ms);
    let retries = retry.retries;
    if let Some(d) = reply.dead.iter().find(|d| d.server_id as usize == s) {
        let dead = Duration::from_millis(d.dead_for_ms);
        return match dead <= wait {
            true => Restart::Awaited(format!(
                "the scheduler declared server {s} dead {:.1} s ago and waits for it to restart, up to its restart wait of {:.1} s (ps.rpc_timeout_ms × (ps.rpc_retries + 1))",
                dead.as_secs_f64(),
                wait.as_secs_f64()
            )),
            false => Restart::GaveUp(format!(
                "server {s} was declared dead {:.1} s ago and did not restart within the scheduler's restart wait of {:.1} s (ps.rpc_timeout_ms × (ps.rpc_retries + 1))",
                dead.as_secs_f64(),
                wait.as_secs_f64()
            )),
        };
    }
    let silent = reply
        .servers
        .iter()
        .find(|a| a.server_id as usize == s)
        .map(|a| Duration::from_millis(a.silent_ms));
    // A server that died is declared dead ps.dead_after_ms after its last heartbeat, which
    // may reach the scheduler a little after this worker's first failure, plus a sweep of
    // the scheduler: until then, a server heard from recently may still be dead.
    let undecided = dead_after + heartbeat * 2;
    match silent {
        Some(silent) if silent >= failing || failing <= undecided => Restart::Awaited(format!(
            "the scheduler last heard from server {s} {} ms ago (it declares it dead after ps.dead_after_ms = {} ms, then waits for it to restart)",
            silent.as_millis(),
            dead_after.as_millis()
        )),
        Some(silent) => Restart::Alive(format!(
            "the scheduler heard from server {s} {} ms ago, {} ms after this worker's calls to it began failing, so it is alive but unreachable from this worker after ps.rpc_retries = {retries} retries",
            silent.as_millis(),
            failing.saturating_sub(silent).as_millis()
        )),
        None => Restart::Alive(format!(
            "the scheduler does not know server {s} (neither registered nor declared dead) after ps.rpc_retries = {retries} retries"
        )),
    }
}

/// What a pull asks for besides the version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    /// The weights and the rows asked for.
    Weights,
    /// Nothing: the version (and, clipping, the norm exchange) only.
    VersionOnly,
}

impl Links {
    /// Fetches the committed partition map from the scheduler and, when its epoch is not the
    /// one followed, routes by it from now: one link per server of the map, holding its
    /// partition, every address known (waiting, bounded, for all to register).
    pub(super) async fn follow_map(
        &mut self,
        compute: &Compute,
        first: bool,
    ) -> Result<(), PsError> {
        let reply = self.get_servers().await?;
        if !first && reply.map_epoch == self.epoch {
            return Ok(());
        }
        self.norms.forget_parts();
        let servers = (reply.map_servers as usize).max(1);
        self.servers = (0..servers)
            .map(|id| {
                let held = partition_of(compute.params(), servers, id);
                let bytes: usize = held.iter().map(|&i| compute.params()[i].bytes()).sum();
                // A pull reply carries at most this server's rows of every table too.
                let rows: usize = compute
                    .tables()
                    .iter()
                    .map(|t| t.block(servers, id).len() * t.width * 4)
                    .sum();
                let bytes = bytes.saturating_add(rows);
                ServerLink {
                    id,
                    addr: String::new(),
                    client: None,
                    held,
                    bytes,
                    seen: 0,
                    history: BTreeMap::new(),
                    awaiting: None,
                }
            })
            .collect();
        if !first {
            eprintln!(
                "[ps worker {}] routes by the partition map of epoch {} ({servers} servers) from now",
                self.worker_id, reply.map_epoch
            );
        }
        self.epoch = reply.map_epoch;
        self.resolve_servers(true).await
    }

    /// The scheduler's servers and committed partition map.
    pub(super) async fn get_servers(&self) -> Result<GetServersReply, PsError> {
        let c = self.scheduler.clone();
        Ok(self
            .settings
            .retry
            .run("GetServers", &self.scheduler_peer, |_| {
                let mut c = c.clone();
                async move { c.get_servers(GetServersRequest {}).await }
            })
            .await?
            .into_inner())
    }

    /// Fills in every server's address from the scheduler, waiting (bounded) for all to
    /// register.
    pub(super) async fn resolve_servers(&mut self, wait_for_all: bool) -> Result<(), PsError> {
        let limit = self.settings.retry.timeout * (self.settings.retry.retries + 1);
        let start = Instant::now();
        loop {
            let reply = self.get_servers().await?;
            for s in reply.servers {
                if let Some(link) = self.servers.get_mut(s.server_id as usize) {
                    if link.addr != s.addr {
                        link.addr = s.addr;
                        link.client = None;
                    }
                }
            }
            if !wait_for_all || self.servers.iter().all(|s| !s.addr.is_empty()) {
                return Ok(());
            }
            if start.elapsed() > limit {
                let missing: Vec<String> = self
                    .servers
                    .iter()
                    .filter(|s| s.addr.is_empty())
                    .map(|s| s.id.to_string())
                    .collect();
                return Err(PsError::job(
                    "waiting for the servers",
                    format!(
                        "server(s) {} did not register within {} s",
                        missing.join(", "),
                        limit.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Calls server `s` with `call`, retried with backoff; the address is asked again from the
    /// scheduler before each retry, so a restarted server is found, and a server found at a new
    /// address (a restarted process) gets a fresh `ps.rpc_retries`. Once the retries are spent
    /// the worker asks the scheduler: while the scheduler waits for the server to restart (it
    /// declared it dead, or may yet: it has not heard from it since the call began failing, or
    /// the call has failed for no more than `ps.dead_after_ms` + 2 × `ps.heartbeat_ms`), the
    /// call goes on being retried, every `ps.heartbeat_ms`; it fails when the
    /// scheduler gives up on the server (naming its restart wait) or still hears from it (then
    /// the server is unreachable from this worker alone: naming `ps.rpc_retries`).
    pub(super) async fn call_server<T, F, Fut>(
        &mut self,
        s: usize,
        name: &str,
        call: F,
    ) -> Result<T, PsError>
    where
        F: Fn(ParameterServerClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let policy = self.settings.retry;
        let mut last;
        // Attempts in all, and failed ones at the server's current address since when.
        let mut attempts = 0u32;
        let mut failures = 0u32;
        let mut failing_since: Option<Instant> = None;
        // What the scheduler last said while the worker waited for the server to restart.
        let mut awaited: Option<String> = None;
        loop {
            if failures > policy.retries {
                tokio::time::sleep(self.settings.heartbeat).await;
            } else if failures > 0 {
                tokio::time::sleep(policy.backoff(failures)).await;
            }
            if failures > 0 {
                // A server that died may be registered again elsewhere.
                let before = self.servers[s].addr.clone();
                let _ = self.resolve_servers(false).await;
                if self.servers[s].addr != before {
                    failures = 0;
                    failing_since = None;
                }
            }
            let link = &mut self.servers[s];
            if link.client.is_none() {
                link.client = Some(server_client(
                    &link.addr,
                    policy.timeout,
                    link.bytes,
                    &self.secret,
                )?);
            }
            let client = link.client.clone().ok_or_else(|| {
                PsError::invariant(format!("the client of server {s}"), "none was made")
            })?;
            let peer = |links: &Links| format!("server {s} at {}", links.servers[s].addr);
            attempts = attempts.saturating_add(1);
            match policy.attempt(call(client)).await {
                Attempt::Done(reply) => {
                    if awaited.is_some() {
                        eprintln!(
                            "[ps worker {}] server {s} answers again ({name}, attempt {attempts})",
                            self.worker_id
                        );
                    }
                    return Ok(reply.into_inner());
                }
                Attempt::Fatal(why) => return Err(rpc_error(name, &peer(self), attempts, why)),
                Attempt::Retry(why) => last = why,
            }
            failures = failures.saturating_add(1);
            let since = *failing_since.get_or_insert_with(Instant::now);
            if failures <= policy.retries {
                continue;
            }
            match self.restart_status(s, since).await {
                Ok(Restart::Awaited(why)) => {
                    if awaited.is_none() {
                        eprintln!(
                            "[ps worker {}] {name} to server {s} failed {attempts} time(s) ({last}); {why}: retrying until it is back",
                            self.worker_id
                        );
                    }
                    awaited = Some(why);
                }
                Ok(Restart::GaveUp(why)) | Ok(Restart::Alive(why)) => {
                    return Err(rpc_error(
                        name,
                        &peer(self),
                        attempts,
                        format!("{last}; {why}"),
                    ))
                }
                Err(e) => {
                    // The scheduler ends the job when it gives up on the server: say what it
                    // last said of it.
                    let why = match &awaited {
                        Some(why) => format!("{why}; then the scheduler stopped answering (it fails the job when server {s} does not restart within that wait)"),
                        None => format!("asking the scheduler whether server {s} restarts failed"),
                    };
                    return Err(rpc_error(
                        name,
                        &peer(self),
                        attempts,
                        format!("{last}; {why}: {e}"),
                    ));
                }
            }
        }
    }

    /// What the scheduler says of server `s`, which this worker's calls have failed to reach
    /// since `since` with `ps.rpc_retries` spent.
    async fn restart_status(&self, s: usize, since: Instant) -> Result<Restart, PsError> {
        let reply = self.get_servers().await?;
        Ok(restart_verdict(
            s,
            &reply,
            since.elapsed(),
            (
                &self.settings.retry,
                self.settings.dead_after,
                self.settings.heartbeat,
            ),
        ))
    }

    /// Pushes `request` to server `s` and notes its versions.
    pub(super) async fn push(&mut self, s: usize, request: PushRequest) -> Result<(), PsError> {
        let epoch = self.epoch;
        self.push_bytes += request
            .tensors
            .iter()
            .map(|t| t.data.len())
            .chain(request.sparse.iter().map(|r| r.data.len()))
            .sum::<usize>() as u64;
        let reply = self
            .call_server(s, "Push", |mut c| {
                let r = tagged(request.clone(), epoch);
                async move { c.push(r).await }
            })
            .await?;
        let link = &mut self.servers[s];
        link.history = link.history.split_off(&reply.snapshot_version);
        Ok(())
    }

    /// Asks server `s` once (the server holds the call up to its long-poll) for its weights at
    /// a version ≥ `min_version`; when they are there, writes them into `weights` and returns
    /// the server's mean loss of the step before its version. In sync mode, replays this
    /// worker's kept gradients when the server (restarted) waits for them. Returns the
    /// server's version too, for progress.
    pub(super) async fn pull_once(
        &mut self,
        (s, min_version, want): (usize, u64, Want),
        weights: &mut [Tensor],
        compute: &Compute,
        pulled: &mut PulledRows,
    ) -> Result<(Option<f32>, u64), PsError> {
        let (worker_id, epoch) = (self.worker_id, self.epoch);
        let sparse = match want {
            Want::Weights => pulled.request_for(self.servers.len(), s),
            Want::VersionOnly => Vec::new(),
        };
        // Clipping: the global norm of the step the server waits for, once this worker knows it.
        let norm = self.servers[s].awaiting.and_then(|step| {
            self.norms.sum_of(step).map(|sum| StepSquareSum {
                step,
                square_sum: sum.clone(),
            })
        });
        let reply = self
            .call_server(s, "Pull", |mut c| {
                let request = PullRequest {
                    worker_id,
                    min_version,
                    sparse: sparse.clone(),
                    norm: norm.clone(),
                    no_weights: want == Want::VersionOnly,
                };
                async move { c.pull(tagged(request, epoch)).await }
            })
            .await?;
        self.note_norms(s, &reply)?;
        let link = &mut self.servers[s];
        if reply.version < link.seen {
            eprintln!(
                "[ps worker {worker_id}] server {s} is at version {} after a restart (had reached {})",
                reply.version, link.seen
            );
        }
        link.seen = reply.version;
        link.history = link.history.split_off(&reply.snapshot_version);
        if reply.ready && want == Want::VersionOnly {
            return Ok((Some(reply.last_loss), reply.version));
        }
        if reply.ready {
            let held = link.held.clone();
            if reply.tensors.len() != held.len() {
                return Err(PsError::message(
                    format!("Pull reply of server {s}"),
                    format!(
                        "{} tensors, the server holds {}",
                        reply.tensors.len(),
                        held.len()
                    ),
                ));
            }
            for (msg, &i) in reply.tensors.iter().zip(&held) {
                let p = &compute.params()[i];
                weights[i] = from_msg(msg, &p.name, &p.shape)?;
            }
            let servers = self.servers.len();
            pulled.fill(servers, s, &reply.sparse)?;
            self.pull_bytes += reply
                .tensors
                .iter()
                .map(|t| t.data.len())
                .chain(reply.sparse.iter().map(|r| r.data.len()))
                .sum::<usize>() as u64;
            return Ok((Some(reply.last_loss), reply.version));
        }
        if reply.waiting_for_you && self.settings.sync {
            let replays: Vec<PushRequest> = link
                .history
                .range(reply.version..)
                .map(|(_, r)| PushRequest {
                    replay: true,
                    ..r.clone()
                })
                .collect();
            if !replays.is_empty() {
                eprintln!(
                    "[ps worker {worker_id}] replaying {} kept gradient(s) (steps {}..) to server {s}",
                    replays.len(),
                    reply.version
                );
            }
            for r in replays {
                self.push(s, r).await?;
            }
        }
        Ok((None, reply.version))
    }

    /// Notes what server `s`'s pull reply says of the global norms: the step it waits for
    /// with its part of the square sum, or the sum it applied its last step with.
    fn note_norms(&mut self, s: usize, reply: &PullReply) -> Result<(), PsError> {
        let servers = self.servers.len();
        self.servers[s].awaiting = reply.norm_step;
        if let Some(step) = reply.norm_step {
            self.norms.add_part(step, (s, servers), &reply.norm_part)?;
        }
        if let (true, Some(step)) = (
            !reply.applied_square_sum.is_empty(),
            reply.version.checked_sub(1),
        ) {
            self.norms.applied(step, reply.applied_square_sum.clone());
        }
        let oldest_kept = self
            .servers
            .iter()
            .filter_map(|l| l.history.keys().next().copied())
            .min();
        if let Some(oldest) = oldest_kept {
            self.norms.forget_before(oldest);
        }
        Ok(())
    }

    /// Pulls every server's weights (at a version ≥ `min_version`); returns server 0's loss.
    /// A server refusing the route as stale (a server was added) makes the worker follow the
    /// new map and pull again.
    pub(super) async fn pull_all(
        &mut self,
        (min_version, want): (u64, Want),
        weights: &mut [Tensor],
        compute: &Compute,
        pulled: &mut PulledRows,
    ) -> Result<f32, PsError> {
        let mut tries = 0;
        loop {
            match self
                .pull_each((min_version, want), weights, compute, pulled)
                .await
            {
                Err(PsError::Rpc { last, .. }) if last.contains(STALE_ROUTE) && tries < 3 => {
                    tries += 1;
                    eprintln!("[ps worker {}] {last}", self.worker_id);
                    self.follow_map(compute, false).await?;
                }
                other => return other,
            }
        }
    }

    /// Async: pulls every server's current weights into `weights` (no rows).
    pub(super) async fn pull_latest(
        &mut self,
        weights: &mut [Tensor],
        compute: &Compute,
    ) -> Result<f32, PsError> {
        self.pull_all(
            (0, Want::Weights),
            weights,
            compute,
            &mut PulledRows::none(),
        )
        .await
    }

    /// [`Links::pull_all`] under the map followed. The servers not yet there are asked in
    /// turn, so a restarted server waiting for this worker's replays is served while another
    /// server waits for a peer.
    pub(super) async fn pull_each(
        &mut self,
        (min_version, want): (u64, Want),
        weights: &mut [Tensor],
        compute: &Compute,
        pulled: &mut PulledRows,
    ) -> Result<f32, PsError> {
        let mut loss = f32::NAN;
        let mut waiting: Vec<usize> = (0..self.servers.len()).collect();
        // A restarted server makes no progress until it is declared dead, admitted again and
        // has loaded its snapshot: the patience covers the scheduler's whole restart window.
        let retry = self.settings.retry;
        let patience = (retry.timeout * 10)
            .max(self.settings.registration_patience() + retry.timeout * (retry.retries + 1));
        let mut progress = (Vec::new(), Instant::now());
        while !waiting.is_empty() {
            let mut versions = Vec::with_capacity(waiting.len());
            let mut still = Vec::with_capacity(waiting.len());
            for &s in &waiting {
                let (got, version) = self
                    .pull_once((s, min_version, want), weights, compute, pulled)
                    .await?;
                match got {
                    Some(l) if s == 0 => loss = l,
                    Some(_) => {}
                    None => still.push(s),
                }
                versions.push(version);
            }
            // Clipping: servers waiting for a norm answer at once; while a part is missing
            // (another server still waits for pushes, or restarted), ask again shortly.
            let norm_unknown = |s: &usize| {
                self.servers[*s]
                    .awaiting
                    .is_some_and(|step| self.norms.sum_of(step).is_none())
            };
            if !still.is_empty() && still.iter().all(norm_unknown) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if versions != progress.0 {
                progress = (versions, Instant::now());
            } else if progress.1.elapsed() > patience {
                return Err(PsError::job(
                    format!("waiting for server(s) {still:?}"),
                    format!(
                        "no progress towards version {min_version} for {} s",
                        patience.as_secs()
                    ),
                ));
            }
            waiting = still;
        }
        Ok(loss)
    }

    pub(super) async fn scheduler_call<T, F, Fut>(&self, name: &str, call: F) -> Result<T, PsError>
    where
        F: Fn(SchedulerClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let reply = self
            .settings
            .retry
            .run(name, &self.scheduler_peer, |_| call(self.scheduler.clone()))
            .await?;
        Ok(reply.into_inner())
    }

    /// Registers with the scheduler (waiting while a predecessor holds the id); the first step
    /// this worker takes part in.
    pub(super) async fn register(&self, restart_count: u32) -> Result<u64, PsError> {
        let (worker_id, incarnation) = (self.worker_id, self.incarnation);
        let settings = &self.settings;
        let reply = until_admitted(
            &settings.retry,
            ("RegisterWorker", &self.scheduler_peer),
            (settings.heartbeat, settings.registration_patience()),
            || {
                let mut c = self.scheduler.clone();
                async move {
                    c.register_worker(RegisterWorkerRequest {
                        worker_id,
                        restart_count,
                        incarnation,
                    })
                    .await
                }
            },
        )
        .await?;
        Ok(reply.into_inner().start_step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(servers: &[(u32, u64)], dead: &[(u32, u64)], wait_ms: u64) -> GetServersReply {
        GetServersReply {
            servers: servers
                .iter()
                .map(|&(server_id, silent_ms)| ServerAddr {
                    server_id,
                    addr: format!("127.0.0.1:{}", 9000 + server_id),
                    silent_ms,
                })
                .collect(),
            map_epoch: 0,
            map_servers: 2,
            dead: dead
                .iter()
                .map(|&(server_id, dead_for_ms)| DeadServer {
                    server_id,
                    dead_for_ms,
                })
                .collect(),
            restart_wait_ms: wait_ms,
        }
    }

    /// The retries spent, a worker waits for a server while the scheduler waits for its
    /// restart or may yet declare it dead, and gives up naming why otherwise.
    #[test]
    fn a_worker_waits_for_a_server_as_long_as_the_scheduler_does() {
        let ms = Duration::from_millis;
        let retry = RetryPolicy {
            timeout: ms(3000),
            retries: 3,
            first_backoff: ms(50),
            max_backoff: ms(2000),
        };
        // ps.dead_after_ms = 600, ps.heartbeat_ms = 50: undecided for 700 ms of failures.
        let job = (&retry, ms(600), ms(50));
        let verdict = |r: &GetServersReply, failing: u64| restart_verdict(1, r, ms(failing), job);
        // Declared dead, within the restart wait: wait; past it: give up naming the wait.
        assert!(matches!(
            verdict(&reply(&[(0, 10)], &[(1, 5000)], 12000), 400),
            Restart::Awaited(_)
        ));
        match verdict(&reply(&[(0, 10)], &[(1, 12001)], 12000), 13000) {
            Restart::GaveUp(why) => assert!(
                why.contains("server 1") && why.contains("restart wait of 12.0 s"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        // Listed, not heard from since the failures began: it may be dead, wait.
        assert!(matches!(
            verdict(&reply(&[(1, 5000)], &[], 12000), 4000),
            Restart::Awaited(_)
        ));
        // Heard from after the failures began, but within dead_after + 2 heartbeats (a late
        // heartbeat of a killed server): wait.
        assert!(matches!(
            verdict(&reply(&[(1, 300)], &[], 12000), 400),
            Restart::Awaited(_)
        ));
        // Heard from long after the failures began: alive but unreachable from this worker.
        match verdict(&reply(&[(1, 30)], &[], 12000), 800) {
            Restart::Alive(why) => assert!(
                why.contains("server 1") && why.contains("ps.rpc_retries = 3"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        // Unknown to the scheduler: give up.
        assert!(matches!(
            verdict(&reply(&[(0, 10)], &[], 12000), 100),
            Restart::Alive(_)
        ));
    }
}
