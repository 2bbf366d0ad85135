//! `tessera train ps.toml` without a launcher: this process starts the scheduler, the servers
//! and the workers as child processes of the same command line, with the process contract's
//! environment (a fresh job secret included), on 127.0.0.1, and supervises them.
//!
//! Every child dies with this process: a signal to it is forwarded to every child (then
//! SIGKILL after [`STOP_GRACE`]), and each child asks the kernel for SIGKILL when this process
//! ends in any other way, SIGKILL included ([`die_with_parent`]). The job's end follows what
//! parameter-server training survives (docs/PS.md): a lost worker is reported and the job goes
//! on while any worker is left; a lost scheduler or server, or every worker, stops the job with
//! an error naming it.

use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use runtime::launch_env::ProcessVars;

use crate::auth::JobSecret;
use crate::env::PsRole;
use crate::error::PsError;

/// How long children have after the forwarded signal (or SIGTERM) before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// How often the supervisor looks at its children and at the stop signal.
const POLL: Duration = Duration::from_millis(50);

/// A free port on 127.0.0.1 (bound, then released for the scheduler to take).
pub fn free_local_port() -> Result<u16, PsError> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| PsError::io("finding a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| PsError::io("finding a free port", e))?
        .port();
    Ok(port)
}

/// The environment of process `rank` of a local job with `servers` servers and `workers`
/// workers: rank 0 is the scheduler, then the servers, then the workers; every one gets the
/// job's `secret` (`runtime::launch_env::ProcessVars`).
pub fn role_env(
    rank: usize,
    servers: usize,
    workers: usize,
    scheduler_addr: &str,
    secret: &JobSecret,
) -> Vec<(String, String)> {
    let (role, id) = PsRole::of_rank(rank, servers);
    let vars = ProcessVars {
        role,
        id,
        rank,
        world_size: 1 + servers + workers,
        local_rank: None,
        // Every role of this job runs on this host: a worker's device is its index.
        device_id: Some(id),
        num_servers: servers,
        num_workers: workers,
        scheduler_addr: Some(scheduler_addr),
        restart_count: 0,
        secret: Some(secret),
    };
    vars.vars()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// Makes the process `command` starts receive SIGKILL when the thread that starts it ends
/// (with the whole starting process, SIGKILL included), and not start at all when its parent
/// is already gone. Linux's `PR_SET_PDEATHSIG`; it survives `exec` of a normal binary.
pub fn die_with_parent(command: &mut Command) {
    // SAFETY: getpid(2) takes nothing and touches no memory.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec and calls only the
    // async-signal-safe prctl(2) and getppid(2).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the request took effect: its signal will never come.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the parent process has ended"));
            }
            Ok(())
        });
    }
}

/// How a local job ended, when the job itself finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalJobEnd {
    /// Workers that ran to their end.
    pub finished_workers: usize,
    /// The workers lost on the way: `worker 1 (rank 3)` and how it ended.
    pub lost_workers: Vec<String>,
}

impl LocalJobEnd {
    /// What to tell the user about a job that survived its faults (empty: none).
    pub fn report(&self) -> String {
        self.lost_workers
            .iter()
            .map(|lost| {
                format!(
                    "{lost} was lost; the job finished on {} worker(s)\n",
                    self.finished_workers
                )
            })
            .collect()
    }
}

/// One child of the job.
struct RoleChild {
    /// `worker 1 (rank 3)`.
    name: String,
    role: PsRole,
    child: Child,
    status: Option<ExitStatus>,
}

/// Starts every role of a `servers` × `workers` job as a child running `program` with `args`
/// (each with [`role_env`] under `secret`) and supervises them to the job's end. `stop` holds
/// a signal number once the caller received one (0: none): it is forwarded to every child,
/// which are then waited for (SIGKILL after [`STOP_GRACE`]), and the job fails with
/// [`PsError::Stopped`].
pub fn run_local_job(
    program: &Path,
    args: &[String],
    (servers, workers): (usize, usize),
    secret: &JobSecret,
    stop: &AtomicI32,
) -> Result<LocalJobEnd, PsError> {
    let addr = format!("127.0.0.1:{}", free_local_port()?);
    let mut children: Vec<RoleChild> = Vec::new();
    for rank in 0..1 + servers + workers {
        let env = role_env(rank, servers, workers, &addr, secret);
        let (role, id) = PsRole::of_rank(rank, servers);
        let name = format!("{} {id} (rank {rank})", role.name());
        let mut command = Command::new(program);
        command.args(args).envs(env);
        die_with_parent(&mut command);
        match command.spawn() {
            Ok(child) => children.push(RoleChild {
                name,
                role,
                child,
                status: None,
            }),
            Err(e) => {
                stop_all(&mut children, libc::SIGTERM);
                return Err(PsError::io(
                    format!("starting {name} ({})", program.display()),
                    e,
                ));
            }
        }
    }
    supervise(&mut children, stop)
}

impl RoleChild {
    /// Whether it ended with a failure.
    fn failed(&self) -> bool {
        self.status.is_some_and(|s| !s.success())
    }

    /// `worker 1 (rank 3) (signal: 9 (SIGKILL))`.
    fn ending(&self) -> String {
        match self.status {
            Some(status) => format!("{} ({status})", self.name),
            None => self.name.clone(),
        }
    }
}

/// Waits for the job's end (see the module's doc).
fn supervise(children: &mut [RoleChild], stop: &AtomicI32) -> Result<LocalJobEnd, PsError> {
    let workers = children.iter().filter(|c| c.role == PsRole::Worker).count();
    loop {
        let signal = stop.load(Ordering::Relaxed);
        if signal != 0 {
            eprintln!(
                "[tessera] received signal {signal}; forwarded to every process of the job, stopping it"
            );
            stop_all(children, signal);
            return Err(PsError::Stopped { signal });
        }
        for c in children.iter_mut().filter(|c| c.status.is_none()) {
            match c.child.try_wait() {
                Ok(Some(status)) => {
                    c.status = Some(status);
                    if !status.success() && c.role == PsRole::Worker {
                        eprintln!(
                            "[tessera] {} ended ({status}); the job goes on without it",
                            c.name
                        );
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let what = format!("waiting for {}", c.name);
                    stop_all(children, libc::SIGTERM);
                    return Err(PsError::io(what, e));
                }
            }
        }
        let lost: Vec<String> = children
            .iter()
            .filter(|c| c.role == PsRole::Worker && c.failed())
            .map(RoleChild::ending)
            .collect();
        if lost.len() == workers {
            stop_all(children, libc::SIGTERM);
            return Err(PsError::job(
                "the parameter-server job",
                format!(
                    "every worker was lost: {}; every process was stopped",
                    lost.join(", ")
                ),
            ));
        }
        // A scheduler or a server is not restarted here: the job cannot go on without it.
        if let Some(c) = children
            .iter()
            .find(|c| c.role != PsRole::Worker && c.failed())
        {
            let why = lost_role(c.role, &c.ending());
            stop_all(children, libc::SIGTERM);
            return Err(PsError::job("the parameter-server job", why));
        }
        if children.iter().all(|c| c.status.is_some()) {
            return Ok(LocalJobEnd {
                finished_workers: workers - lost.len(),
                lost_workers: lost,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Why a plain `tessera train` stopped the job when `ending` (a scheduler or a server) was
/// lost: only a server can be restarted (`tessera launch --restarts`), never the scheduler.
fn lost_role(role: PsRole, ending: &str) -> String {
    let hint = match role {
        PsRole::Scheduler => "the scheduler is never restarted: start the job again".to_string(),
        _ => "`tessera launch --restarts K` restarts a lost server".to_string(),
    };
    format!(
        "{ending} was lost; the job cannot go on without it ({hint}), so every process was stopped"
    )
}

/// Sends `signal` to every child still running, SIGKILL to those left after [`STOP_GRACE`],
/// and reaps them all.
fn stop_all(children: &mut [RoleChild], signal: i32) {
    let signal_running = |children: &mut [RoleChild], signal: i32| {
        for c in children.iter_mut().filter(|c| c.status.is_none()) {
            if let Ok(pid) = libc::pid_t::try_from(c.child.id()) {
                // SAFETY: kill(2) on our own unreaped child; touches no memory.
                unsafe {
                    libc::kill(pid, signal);
                }
            }
        }
    };
    signal_running(children, signal);
    let mut deadline = Instant::now() + STOP_GRACE;
    let mut killed = false;
    loop {
        for c in children.iter_mut().filter(|c| c.status.is_none()) {
            match c.child.try_wait() {
                Ok(Some(status)) => c.status = Some(status),
                Ok(None) => {}
                // Not ours to wait for any more: nothing left to stop.
                Err(_) => c.status = Some(ExitStatus::default()),
            }
        }
        if children.iter().all(|c| c.status.is_some()) {
            return;
        }
        if Instant::now() >= deadline {
            if killed {
                // Survived SIGKILL (stuck in the kernel): nothing more to do.
                return;
            }
            signal_running(children, libc::SIGKILL);
            killed = true;
            deadline = Instant::now() + STOP_GRACE;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lost scheduler is not said to be restartable; a lost server's hint names the flag.
    #[test]
    fn a_lost_scheduler_is_not_said_to_be_restartable() {
        let scheduler = lost_role(
            PsRole::Scheduler,
            "scheduler 0 (rank 0) (signal: 9 (SIGKILL))",
        );
        assert!(scheduler.starts_with("scheduler 0 (rank 0)"), "{scheduler}");
        assert!(scheduler.contains("never restarted"), "{scheduler}");
        assert!(!scheduler.contains("--restarts"), "{scheduler}");
        let server = lost_role(PsRole::Server, "server 1 (rank 2) (signal: 9 (SIGKILL))");
        assert!(
            server.contains("--restarts K` restarts a lost server"),
            "{server}"
        );
    }
}
