//! One collective job of N ranks, one process each, on the MPI backend: `tessera launch --nproc
//! N -- COMMAND` runs `mpirun` over `tessera rank-env -- COMMAND` (OpenMPI does the wiring).
//!
//! On one node the launcher runs `mpirun` on this host (or on the hosts of `--hostfile`). Across
//! nodes in msrun's model (`--worker_num`, `--local_worker_num`, `--master_addr`,
//! `--master_port`, `--node_rank`) the same command runs on every node: node 0's launcher
//! listens on the master address, waits for the other nodes ([`master`]), and runs `mpirun`
//! with a host file of the joined nodes and `tessera launch-agent` ([`agent`]) as its remote
//! shell, which has each node's launcher ([`node`]) start OpenMPI's daemon there.
//!
//! The ranks' output reaches node 0's `mpirun` tagged by rank and goes to
//! `worker_<rank>.log` and the console ([`tagged`]). A failed rank ends the job (`mpirun`
//! stops the others); `--restarts K` starts the whole job again up to K times, with
//! `TESSERA_RESTART_COUNT` counting.

pub mod agent;
mod hang;
mod master;
mod mpi_start;
mod mpirun;
mod node;
mod store;
mod tagged;
mod wire;

use std::ffi::OsString;
use std::net::{IpAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use runtime::elastic::STORE_VAR;
use runtime::launch_env::{FAILURE_TOKEN, LAUNCHER_VARS, RESTART_COUNT};

use super::child::{self, Event, StartRequest};
use super::output;
use super::plan::{PlanError, MAX_GRACE_SECS, MAX_RESTARTS, MAX_WORKERS};
use super::{supervise, Interrupted, TAIL_LINES};
use master::{Cluster, Shape};
use mpirun::{Hosts, MpirunJob};
use tagged::{RankOutput, TaggedRouter};

/// Longest `--cluster_time_out` (a day).
pub const MAX_CLUSTER_SECS: u64 = 86_400;

/// `--hang_time_out` when not given, seconds (as `tessera train --timeout`'s default).
pub const DEFAULT_HANG_SECS: u64 = 300;

/// How often the watchdog (`--hang_time_out`) looks at the ranks' states.
const HANG_CHECK_EVERY: Duration = Duration::from_secs(1);

/// How long to wait for `mpirun` to be reaped after SIGKILL.
const AFTER_KILL_WAIT: Duration = Duration::from_secs(5);

/// A collective launch as given.
#[derive(Debug, Clone)]
pub struct CollectiveRequest {
    /// `--nproc` / `--worker_num`: ranks in the whole job.
    pub worker_num: usize,
    /// `--local_worker_num`: ranks on this node (default: all of them).
    pub local_worker_num: Option<usize>,
    /// `--master_addr`.
    pub master_addr: String,
    /// `--master_port`.
    pub master_port: u16,
    /// `--node_rank` (default: 0 on a single node; across nodes, the node that can listen on
    /// the master address is node 0 and the others are numbered as they join).
    pub node_rank: Option<usize>,
    /// `--hostfile`.
    pub hostfile: Option<PathBuf>,
    /// `--cluster_time_out`, seconds.
    pub cluster_secs: u64,
    /// `--hang_time_out`, seconds (0: no watchdog).
    pub hang_secs: u64,
    /// `--hang_time_out` was given: ranks running on after another rank's command ended are
    /// taken as hung too, and ranks outside MPI while others wait inside it
    /// ([`hang::HangRules::strict`]).
    pub hang_strict: bool,
    /// `--restarts`: whole-job restarts.
    pub restarts: u32,
    /// `--grace-period`, seconds.
    pub grace_secs: u64,
    /// `--log-dir`.
    pub log_dir: PathBuf,
    /// Every rank's command.
    pub command: Vec<OsString>,
}

impl CollectiveRequest {
    /// Nodes in the job, after checking the flags' rules.
    fn nodes(&self) -> anyhow::Result<(usize, usize)> {
        let n = self.worker_num;
        anyhow::ensure!(
            (1..=MAX_WORKERS).contains(&n),
            "--nproc (--worker_num) must be between 1 and {MAX_WORKERS}, got {n}"
        );
        let local = self.local_worker_num.unwrap_or(n);
        anyhow::ensure!(
            (1..=n).contains(&local) && n.is_multiple_of(local),
            "--local_worker_num must divide --worker_num {n} (every node runs as many ranks), got {local}"
        );
        let nodes = n / local;
        if let Some(rank) = self.node_rank {
            anyhow::ensure!(
                rank < nodes,
                "--node_rank {rank} must be below the job's {nodes} node(s) (--worker_num {n} / --local_worker_num {local})"
            );
        }
        anyhow::ensure!(
            self.hostfile.is_none() || nodes == 1,
            "--hostfile names the hosts of one mpirun; it cannot be combined with --local_worker_num below --worker_num (msrun's model)"
        );
        if let Some(path) = &self.hostfile {
            runtime::check_input_path(
                "--hostfile",
                path,
                runtime::PathKind::File,
                "a file (the MPI host file: one host a line, HOST [slots=N])",
            )?;
            mpirun::check_hostfile(path)?;
        }
        // Before anything starts (the logs are opened once the nodes have joined).
        runtime::check_output_path(
            "--log-dir",
            &self.log_dir,
            runtime::PathKind::Directory,
            output::LOG_DIR_EXPECTED,
        )?;
        if self.restarts > MAX_RESTARTS {
            return Err(PlanError::Restarts(self.restarts).into());
        }
        if self.grace_secs > MAX_GRACE_SECS {
            return Err(PlanError::Grace(self.grace_secs).into());
        }
        anyhow::ensure!(
            (1..=MAX_CLUSTER_SECS).contains(&self.cluster_secs),
            "--cluster_time_out must be between 1 and {MAX_CLUSTER_SECS} seconds, got {}",
            self.cluster_secs
        );
        anyhow::ensure!(
            self.hang_secs <= MAX_CLUSTER_SECS,
            "--hang_time_out must be at most {MAX_CLUSTER_SECS} seconds (0: never), got {}",
            self.hang_secs
        );
        if self.command.is_empty() {
            return Err(PlanError::NoCommand.into());
        }
        Ok((nodes, local))
    }

    fn master(&self) -> String {
        if self.master_addr.contains(':') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

/// Runs the collective job (this node's part of it).
pub fn run(request: &CollectiveRequest) -> anyhow::Result<()> {
    let (nodes, local) = request.nodes()?;
    require_mpi_build()?;
    let deadline = Instant::now() + Duration::from_secs(request.cluster_secs);
    let listener = match (nodes, request.node_rank) {
        (1, _) | (_, Some(0)) => None,
        (_, Some(_)) => {
            return join_as_node(request, local, deadline);
        }
        (_, None) => match TcpListener::bind(request.master()) {
            Ok(listener) => Some(listener),
            // Someone else is node 0 (or the master address is not this host's).
            Err(_) => return join_as_node(request, local, deadline),
        },
    };
    let mpirun = mpirun::on_path("mpirun").context(
        "OpenMPI's `mpirun` is not on PATH; a collective job needs it: install it (`apt-get install openmpi-bin libopenmpi-dev`)",
    )?;
    let listener = match listener {
        Some(l) => Some(l),
        None if nodes > 1 => Some(TcpListener::bind(request.master()).with_context(|| {
            format!(
                "node 0 cannot listen on {} (--master_addr, --master_port)",
                request.master()
            )
        })?),
        None => None,
    };
    let token = runtime::launch_env::JobSecret::generate()
        .context("cannot make the job's failure token")?;
    let router = Arc::new(open_logs(
        &request.log_dir,
        request.worker_num,
        token.expose(),
    )?);
    let store = store::create()?;
    let cluster = match listener {
        Some(listener) => {
            eprintln!(
                "[launch] node 0 of {nodes}: waiting at {} for the other nodes (--cluster_time_out {} s)",
                request.master(),
                request.cluster_secs
            );
            Some(Cluster::gather(
                listener,
                Shape {
                    worker_num: request.worker_num,
                    local_worker_num: local,
                    nodes,
                },
                deadline,
            )?)
        }
        None => None,
    };
    let hosts = match &cluster {
        None => request.hostfile.clone().map_or(Hosts::Local, Hosts::File),
        Some(cluster) => {
            let path = cluster.dir().join("hostfile");
            std::fs::write(&path, mpirun::joined_hostfile(nodes, local))
                .with_context(|| format!("cannot write {}", path.display()))?;
            Hosts::Joined {
                hostfile: path,
                nodes,
                loopback: is_loopback(&request.master()),
            }
        }
    };
    let tessera = std::env::current_exe().context("cannot find this tessera's path")?;
    // OpenMPI's scratch in a directory of this launcher's, for a job on this host only: ranks
    // on other hosts cannot reach it, and the daemons of joined nodes keep their session
    // directories in their own nodes' stores (`node.rs`), which a command-line setting here
    // would override.
    let scratch = matches!(hosts, Hosts::Local)
        .then(store::create_mpi_scratch)
        .transpose()?;
    let job = MpirunJob {
        mpirun: &mpirun,
        tessera: &tessera,
        ranks: request.worker_num,
        hosts: &hosts,
        // SAFETY: geteuid(2) reads a process attribute and cannot fail.
        as_root: unsafe { libc::geteuid() } == 0,
        command: &request.command,
        scratch: scratch.as_ref().map(|dir| dir.path()),
    };
    let events = supervise::channel();
    let signals = super::forward_signals(events.0.clone())?;
    eprintln!(
        "[launch] starting one job of {} ranks on {nodes} node(s) under {}, logs in {}",
        request.worker_num,
        mpirun.display(),
        request.log_dir.display()
    );
    let result = supervise_job(
        &job,
        request,
        &router,
        cluster.as_ref(),
        store.path(),
        events,
    );
    signals.close();
    if let Some(cluster) = &cluster {
        let message = match &result {
            Ok(()) => "every rank finished".to_string(),
            Err(err) => err.to_string(),
        };
        cluster.finish(result.is_ok(), &message);
    }
    result
}

/// This node's part when it is not node 0.
fn join_as_node(
    request: &CollectiveRequest,
    local: usize,
    deadline: Instant,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        mpirun::on_path("orted").is_some(),
        "OpenMPI's daemon `orted` is not on PATH; every node of a collective job needs it (`apt-get install openmpi-bin`)"
    );
    node::run(
        &node::Joining {
            master: request.master(),
            node_rank: request.node_rank,
            local_worker_num: local,
            worker_num: request.worker_num,
        },
        deadline,
    )
}

/// Refuses a build without the MPI backend, saying how to get one.
fn require_mpi_build() -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg!(feature = "mpi"),
        "this tessera was built without the MPI backend, which one collective job across processes needs: build it with `cargo build --release -p tessera-cli --features mpi` (after `apt-get install libopenmpi-dev openmpi-bin libclang-dev`), or start N independent processes with --independent"
    );
    Ok(())
}

/// Whether `HOST:PORT` resolves to loopback addresses only.
fn is_loopback(master: &str) -> bool {
    master
        .to_socket_addrs()
        .map(|addrs| {
            let ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
            !ips.is_empty() && ips.iter().all(IpAddr::is_loopback)
        })
        .unwrap_or(false)
}

/// Opens `worker_<rank>.log` for every rank and `mpirun.log` (appended to, as every launch
/// log); the ranks' rank-env get `token` as their failure token.
fn open_logs(dir: &Path, ranks: usize, token: &str) -> anyhow::Result<TaggedRouter> {
    let mut names: Vec<String> = (0..ranks)
        .map(|rank| format!("worker_{rank}.log"))
        .collect();
    names.push("mpirun.log".into());
    let mut logs = output::open_logs(dir, &names)?;
    let own = RankOutput {
        log: logs.pop().context("internal error: no mpirun.log")?,
        prefix: "[mpirun] ".into(),
    };
    let outputs = logs
        .into_iter()
        .enumerate()
        .map(|(rank, log)| RankOutput {
            log,
            prefix: format!("[worker {rank}] "),
        })
        .collect();
    Ok(TaggedRouter::new(outputs, own, token))
}

/// Runs `mpirun` until the job succeeds, fails with no restarts left, or a signal stops it.
fn supervise_job(
    job: &MpirunJob<'_>,
    request: &CollectiveRequest,
    router: &Arc<TaggedRouter>,
    cluster: Option<&Cluster>,
    store: &Path,
    (sender, receiver): (Sender<Event>, Receiver<Event>),
) -> anyhow::Result<()> {
    let argv = job.argv();
    let grace = Duration::from_secs(request.grace_secs);
    router.stop_through(sender.clone());
    for attempt in 0..=request.restarts {
        router.reset();
        for (rank, log) in router.rank_logs().enumerate() {
            log.write_line(
                output::attempt_header(&format!("worker {rank}"), rank, attempt).as_bytes(),
            );
        }
        let mut set = vec![
            (RESTART_COUNT, attempt.to_string()),
            (STORE_VAR, store.to_string_lossy().into_owned()),
            (FAILURE_TOKEN, router.failure_token().to_string()),
        ];
        if let Some(cluster) = cluster {
            set.push((
                agent::SOCKET_VAR,
                cluster.socket().to_string_lossy().into_owned(),
            ));
        }
        let remove: Vec<&'static str> = LAUNCHER_VARS.to_vec();
        let start = StartRequest {
            command: &argv,
            set: &set,
            remove: &remove,
            output: router.clone(),
            name: "mpirun".into(),
            slot: 0,
        };
        let running = child::start(start, &sender)
            .with_context(|| format!("cannot start {}", job.mpirun.display()))?;
        let hang = (request.hang_secs > 0).then(|| hang::HangRules {
            limit: Duration::from_secs(request.hang_secs),
            strict: request.hang_strict,
        });
        let status = wait(
            running.pid,
            &receiver,
            grace,
            hang.map(|rules| (&**router, rules)),
        );
        router.flush();
        let status = status?;
        if status.success() {
            return Ok(());
        }
        let failed = describe_failure(router, &status);
        if attempt < request.restarts {
            eprintln!(
                "[launch] {failed}; starting the job again ({} of {} restarts)",
                attempt + 1,
                request.restarts
            );
            if let Some(cluster) = cluster {
                // No daemon of the failed attempt may outlive it, and a node whose launcher
                // went away must be replaced first.
                cluster.kill_daemons();
                let deadline = Instant::now() + Duration::from_secs(request.cluster_secs);
                let interrupted = || match receiver.try_recv() {
                    Ok(Event::Signal(signal)) => Some(signal),
                    _ => None,
                };
                cluster.replace_lost(deadline, &interrupted)?;
            }
            continue;
        }
        return Err(anyhow::anyhow!("{failed}; the job was stopped"));
    }
    Err(anyhow::anyhow!(
        "internal error in tessera launch: no attempt ran"
    ))
}

/// Waits for `mpirun` (process group `pid`) to end; a signal to the launcher is passed to it,
/// with SIGKILL after `grace`. A job its ranks showed cannot complete ([`Event::Stop`]), or
/// that the watchdog takes as hung (`hang`: the ranks' router and `--hang_time_out`), is
/// stopped the same way, and its status returned.
fn wait(
    pid: libc::pid_t,
    events: &Receiver<Event>,
    grace: Duration,
    hang: Option<(&TaggedRouter, hang::HangRules)>,
) -> anyhow::Result<ExitStatus> {
    // (the signal that stops it, if one does; the deadline; whether SIGKILL was sent)
    let mut stopping: Option<(Option<i32>, Instant, bool)> = None;
    loop {
        let event = match &mut stopping {
            None => match hang {
                None => events
                    .recv()
                    .map_err(|_| anyhow::anyhow!("internal error: the event channel closed"))?,
                Some((router, rules)) => match events.recv_timeout(HANG_CHECK_EVERY) {
                    Ok(event) => event,
                    Err(RecvTimeoutError::Timeout) => match router.check_hung(rules) {
                        Some(verdict) => Event::Stop(verdict),
                        None => continue,
                    },
                    Err(RecvTimeoutError::Disconnected) => {
                        anyhow::bail!("internal error: the event channel closed")
                    }
                },
            },
            Some((_, deadline, killed)) => {
                match events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(event) => event,
                    Err(RecvTimeoutError::Timeout) if !*killed => {
                        eprintln!("[launch] mpirun still running {} s after it was told to stop; sending SIGKILL", grace.as_secs());
                        child::signal_group(pid, libc::SIGKILL);
                        *deadline = Instant::now() + AFTER_KILL_WAIT;
                        *killed = true;
                        continue;
                    }
                    Err(_) => anyhow::bail!("mpirun (process {pid}) could not be stopped"),
                }
            }
        };
        match event {
            Event::Signal(signal) => match &mut stopping {
                None => {
                    eprintln!("[launch] got signal {signal}; stopping the job");
                    child::signal_group(pid, libc::SIGTERM);
                    stopping = Some((Some(signal), Instant::now() + grace, false));
                }
                // Already stopping: the signal is what the launcher ends with.
                Some((by, _, _)) => {
                    by.get_or_insert(signal);
                }
            },
            Event::Stop(reason) => {
                if stopping.is_none() {
                    eprintln!("[launch] {reason}; stopping the job");
                    child::signal_group(pid, libc::SIGTERM);
                    stopping = Some((None, Instant::now() + grace, false));
                }
            }
            Event::Exited { status, .. } => {
                if let Some((Some(signal), _, _)) = stopping {
                    return Err(Interrupted(signal).into());
                }
                return status.context("cannot wait for mpirun");
            }
        }
    }
}

/// `worker 2 (rank 2) failed (signal 9; mpirun: exit code 1)`, with its log's last lines
/// printed, when the rank's rank-env or `mpirun` named the rank (how the rank's command ended
/// when its rank-env said so); why the job could not complete, when its ranks showed it
/// ([`TaggedRouter::cannot_complete`]); otherwise what `mpirun` returned.
fn describe_failure(router: &TaggedRouter, status: &ExitStatus) -> String {
    let shown = supervise::describe(&Ok(*status));
    if let Some(verdict) = router.cannot_complete() {
        return format!("{verdict} (mpirun: {shown})");
    }
    // A rank stopped by a signal makes the others fail waiting for it (a collective's time out
    // names no peer): say so beside the rank that failed.
    let stopped = router.stopped_at_failure();
    let mut stopped = match stopped.is_empty() {
        true => String::new(),
        false => format!(
            "; {}, and the others may have waited for it",
            stopped.join(", ")
        ),
    };
    // So does a rank running outside MPI (looping in its own code) while others wait in it.
    if let Some(outside) = router.outside_at_failure() {
        stopped.push_str(&format!("; {outside}"));
    }
    let Some(rank) = router.failed_rank() else {
        return format!(
            "the job failed (mpirun: {shown}){stopped}; see mpirun.log and the workers' logs"
        );
    };
    if let Some(log) = router.rank_logs().nth(rank) {
        if let Ok(lines) = output::tail(log.path(), TAIL_LINES) {
            eprintln!("[launch] last lines of {}:", log.path().display());
            for line in lines {
                eprintln!("[worker {rank}] {line}");
            }
        }
    }
    match router.failed_status() {
        Some(status) => {
            format!("worker {rank} (rank {rank}) failed ({status}; mpirun: {shown}){stopped}")
        }
        None => format!("worker {rank} (rank {rank}) failed (mpirun: {shown}){stopped}"),
    }
}
