//! The job a launch starts, worked out from the validated arguments before anything runs: every
//! process's role, id and global rank, and the environment contract it is started with.
//!
//! Pure data: no processes, no files, no signals.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use runtime::launch_env::{self, Role};

/// Most workers (`--nproc`) one launch starts.
pub const MAX_WORKERS: usize = 1024;
/// Most parameter servers (`--ps-servers`) one launch starts.
pub const MAX_SERVERS: usize = 1024;
/// Most restarts (`--restarts`) of one process.
pub const MAX_RESTARTS: u32 = 1000;
/// Longest grace period (`--grace-period`, seconds) between SIGTERM and SIGKILL.
pub const MAX_GRACE_SECS: u64 = 3600;

/// One process of the job: its role, its index within the role and its global rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessSpec {
    /// What the process does.
    pub role: Role,
    /// Its index within its role (`TESSERA_SERVER_ID`, `TESSERA_WORKER_ID`; 0 for the scheduler).
    pub id: usize,
    /// Its global index, `0..world_size` (`TESSERA_RANK`).
    pub rank: usize,
}

impl fmt::Display for ProcessSpec {
    /// `worker 1`: the name used in console prefixes and messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.role.name(), self.id)
    }
}

impl ProcessSpec {
    /// The process's log file name inside the log directory, `<role>_<id>.log`.
    pub fn log_file_name(&self) -> String {
        format!("{}_{}.log", self.role.name(), self.id)
    }
}

/// A launch argument that is out of range or malformed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// `--nproc` is 0 or above [`MAX_WORKERS`].
    Workers(usize),
    /// `--ps-servers` is 0 or above [`MAX_SERVERS`].
    Servers(usize),
    /// `--restarts` is above [`MAX_RESTARTS`].
    Restarts(u32),
    /// `--grace-period` is above [`MAX_GRACE_SECS`].
    Grace(u64),
    /// `--scheduler-addr` was given without `--ps-servers` (no scheduler runs).
    AddressWithoutServers,
    /// `--scheduler-addr` is not `HOST:PORT` with a port in 1..=65535.
    Address(String),
    /// No command after `--`.
    NoCommand,
    /// A parameter-server job without its secret (a bug of the caller, not of the arguments).
    NoSecret,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Workers(n) => {
                write!(f, "--nproc must be between 1 and {MAX_WORKERS}, got {n}")
            }
            PlanError::Servers(n) => {
                write!(
                    f,
                    "--ps-servers must be between 1 and {MAX_SERVERS}, got {n}"
                )
            }
            PlanError::Restarts(n) => {
                write!(f, "--restarts must be at most {MAX_RESTARTS}, got {n}")
            }
            PlanError::Grace(n) => {
                write!(
                    f,
                    "--grace-period must be at most {MAX_GRACE_SECS} seconds, got {n}"
                )
            }
            PlanError::AddressWithoutServers => write!(
                f,
                "--scheduler-addr needs --ps-servers: without parameter servers no scheduler runs"
            ),
            PlanError::Address(text) => write!(
                f,
                "--scheduler-addr must be HOST:PORT with a port between 1 and 65535, got {text:?}"
            ),
            PlanError::NoCommand => write!(f, "no command to launch: give it after `--`"),
            PlanError::NoSecret => write!(
                f,
                "a parameter-server job needs its secret ({})",
                launch_env::JOB_SECRET
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// The launch request as given, before validation.
#[derive(Debug, Clone)]
pub struct LaunchRequest {
    /// Workers to start (`--nproc`).
    pub workers: usize,
    /// Parameter servers (`--ps-servers`); `None` for a job of workers only.
    pub servers: Option<usize>,
    /// Restarts allowed per worker or server (`--restarts`).
    pub restarts: u32,
    /// Where the per-process logs go (`--log-dir`).
    pub log_dir: PathBuf,
    /// The scheduler's address if given (`--scheduler-addr`).
    pub scheduler_addr: Option<String>,
    /// Seconds between SIGTERM and SIGKILL when the job is stopped (`--grace-period`).
    pub grace_secs: u64,
    /// The program and its arguments.
    pub command: Vec<OsString>,
    /// The parameter-server job's secret (`TESSERA_JOB_SECRET`), handed to every process of a
    /// PS job; unused without `--ps-servers`.
    pub secret: Option<ps::auth::JobSecret>,
}

/// A validated job: every process to start and how.
#[derive(Debug, Clone)]
pub struct JobPlan {
    /// Every process in rank order: the scheduler, the servers, then the workers.
    pub processes: Vec<ProcessSpec>,
    /// Parameter servers in the job (0 without `--ps-servers`).
    pub num_servers: usize,
    /// Workers in the job.
    pub num_workers: usize,
    /// Restarts allowed per worker or server.
    pub restarts: u32,
    /// Where the per-process logs go.
    pub log_dir: PathBuf,
    /// The scheduler's `HOST:PORT` in a PS job; `None` in a job of workers only.
    pub scheduler_addr: Option<String>,
    /// Time between SIGTERM and SIGKILL when the job is stopped.
    pub grace: Duration,
    /// The program (first element) and its arguments.
    pub command: Vec<OsString>,
    /// The PS job's secret, given to every process; `None` in a job of workers only.
    pub secret: Option<ps::auth::JobSecret>,
}

impl JobPlan {
    /// Validates a request. `free_port` is asked for the scheduler's port only in a PS job
    /// without `--scheduler-addr`.
    pub fn new(
        request: LaunchRequest,
        free_port: impl FnOnce() -> std::io::Result<u16>,
    ) -> Result<JobPlan, anyhow::Error> {
        if request.workers == 0 || request.workers > MAX_WORKERS {
            return Err(PlanError::Workers(request.workers).into());
        }
        if let Some(servers) = request.servers {
            if servers == 0 || servers > MAX_SERVERS {
                return Err(PlanError::Servers(servers).into());
            }
        }
        if request.restarts > MAX_RESTARTS {
            return Err(PlanError::Restarts(request.restarts).into());
        }
        if request.grace_secs > MAX_GRACE_SECS {
            return Err(PlanError::Grace(request.grace_secs).into());
        }
        if request.command.is_empty() {
            return Err(PlanError::NoCommand.into());
        }
        let secret = match request.servers {
            Some(_) => Some(request.secret.ok_or(PlanError::NoSecret)?),
            None => None,
        };
        let scheduler_addr = match (request.servers, request.scheduler_addr) {
            (None, Some(_)) => return Err(PlanError::AddressWithoutServers.into()),
            (None, None) => None,
            (Some(_), Some(addr)) => Some(check_address(addr)?),
            (Some(_), None) => {
                let port = free_port().map_err(|err| {
                    anyhow::anyhow!("cannot find a free port for the scheduler: {err}")
                })?;
                Some(format!("127.0.0.1:{port}"))
            }
        };
        let num_servers = request.servers.unwrap_or(0);
        let mut processes = Vec::with_capacity(request.workers + num_servers + 1);
        if request.servers.is_some() {
            processes.push(ProcessSpec {
                role: Role::Scheduler,
                id: 0,
                rank: 0,
            });
        }
        for id in 0..num_servers {
            let rank = processes.len();
            processes.push(ProcessSpec {
                role: Role::Server,
                id,
                rank,
            });
        }
        for id in 0..request.workers {
            let rank = processes.len();
            processes.push(ProcessSpec {
                role: Role::Worker,
                id,
                rank,
            });
        }
        Ok(JobPlan {
            processes,
            num_servers,
            num_workers: request.workers,
            restarts: request.restarts,
            log_dir: request.log_dir,
            scheduler_addr,
            grace: Duration::from_secs(request.grace_secs),
            command: request.command,
            secret,
        })
    }

    /// The processes in the job.
    pub fn world_size(&self) -> usize {
        self.processes.len()
    }

    /// The contract variables for `spec` on its `restart_count`-th start, as (name, value)
    /// pairs; the [`launch_env::LAUNCHER_VARS`] not listed are to be removed.
    pub fn environment(
        &self,
        spec: &ProcessSpec,
        restart_count: u32,
    ) -> Vec<(&'static str, String)> {
        launch_env::ProcessVars {
            role: spec.role,
            id: spec.id,
            rank: spec.rank,
            world_size: self.world_size(),
            // One host: the rank on this host is the global rank, and a worker's device its
            // index among the workers.
            local_rank: Some(spec.rank),
            device_id: Some(spec.id),
            num_servers: self.num_servers,
            num_workers: self.num_workers,
            scheduler_addr: self.scheduler_addr.as_deref(),
            restart_count,
            secret: self.secret.as_ref(),
        }
        .vars()
    }
}

/// Checks `HOST:PORT` (the host is not resolved: it may be a name only the children can resolve).
fn check_address(addr: String) -> Result<String, PlanError> {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(PlanError::Address(addr));
    };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    if host.is_empty() || !port_ok || host.chars().any(char::is_whitespace) {
        return Err(PlanError::Address(addr));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(workers: usize, servers: Option<usize>) -> LaunchRequest {
        LaunchRequest {
            workers,
            servers,
            restarts: 0,
            log_dir: PathBuf::from("logs"),
            scheduler_addr: None,
            grace_secs: 5,
            command: vec![OsString::from("true")],
            secret: Some(ps::auth::JobSecret::new("s".repeat(32)).unwrap()),
        }
    }

    fn plan(request: LaunchRequest) -> Result<JobPlan, PlanError> {
        JobPlan::new(request, || Ok(4242))
            .map_err(|err| err.downcast::<PlanError>().expect("a PlanError"))
    }

    fn value<'a>(env: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
        env.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn workers_only_have_ranks_in_order_and_no_scheduler() {
        let plan = plan(request(3, None)).unwrap();
        assert_eq!(plan.world_size(), 3);
        assert!(plan.processes.iter().all(|p| p.role == Role::Worker));
        let env = plan.environment(&plan.processes[2], 0);
        assert_eq!(value(&env, "TESSERA_RANK"), Some("2"));
        assert_eq!(value(&env, "TESSERA_WORKER_ID"), Some("2"));
        assert_eq!(value(&env, "TESSERA_NUM_SERVERS"), Some("0"));
        assert_eq!(value(&env, "TESSERA_SCHEDULER_ADDR"), None);
        assert_eq!(value(&env, "TESSERA_SERVER_ID"), None);
        assert_eq!(value(&env, "TESSERA_JOB_SECRET"), None);
    }

    #[test]
    fn a_ps_job_is_scheduler_then_servers_then_workers() {
        let plan = plan(request(2, Some(2))).unwrap();
        let names: Vec<String> = plan.processes.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            names,
            [
                "scheduler 0",
                "server 0",
                "server 1",
                "worker 0",
                "worker 1"
            ]
        );
        let ranks: Vec<usize> = plan.processes.iter().map(|p| p.rank).collect();
        assert_eq!(ranks, [0, 1, 2, 3, 4]);
        let env = plan.environment(&plan.processes[2], 3);
        assert_eq!(value(&env, "TESSERA_ROLE"), Some("server"));
        assert_eq!(value(&env, "TESSERA_SERVER_ID"), Some("1"));
        assert_eq!(value(&env, "TESSERA_WORKER_ID"), None);
        assert_eq!(value(&env, "TESSERA_RESTART_COUNT"), Some("3"));
        assert_eq!(value(&env, "TESSERA_WORLD_SIZE"), Some("5"));
        assert_eq!(
            value(&env, "TESSERA_SCHEDULER_ADDR"),
            Some("127.0.0.1:4242")
        );
        let secret = "s".repeat(32);
        for spec in &plan.processes {
            let env = plan.environment(spec, 0);
            assert_eq!(value(&env, "TESSERA_JOB_SECRET"), Some(secret.as_str()));
        }
    }

    #[test]
    fn out_of_range_arguments_are_refused() {
        assert_eq!(plan(request(0, None)).unwrap_err(), PlanError::Workers(0));
        assert_eq!(
            plan(request(MAX_WORKERS + 1, None)).unwrap_err(),
            PlanError::Workers(MAX_WORKERS + 1)
        );
        assert_eq!(
            plan(request(1, Some(0))).unwrap_err(),
            PlanError::Servers(0)
        );
        let mut no_command = request(1, None);
        no_command.command.clear();
        assert_eq!(plan(no_command).unwrap_err(), PlanError::NoCommand);
        let mut addr = request(1, None);
        addr.scheduler_addr = Some("h:1".into());
        assert_eq!(plan(addr).unwrap_err(), PlanError::AddressWithoutServers);
    }

    #[test]
    fn scheduler_addresses_need_a_host_and_a_port() {
        for bad in ["nohost", ":80", "h:0", "h:65536", "h:x", "a b:1"] {
            let mut r = request(1, Some(1));
            r.scheduler_addr = Some(bad.into());
            assert_eq!(
                plan(r).unwrap_err(),
                PlanError::Address(bad.into()),
                "{bad}"
            );
        }
        for good in ["sched.tessera.svc:50051", "[::1]:7000", "10.0.0.1:1"] {
            let mut r = request(1, Some(1));
            r.scheduler_addr = Some(good.into());
            assert_eq!(plan(r).unwrap().scheduler_addr.as_deref(), Some(good));
        }
    }
}
