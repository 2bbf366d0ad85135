//! The `TESSERA_*` environment contract: every variable a launcher hands a process, its
//! spelling and its parsing, in one place.
//!
//! Launchers write it: `tessera launch` (every process), `tessera rank-env` (each rank of an
//! `mpirun` job, from the MPI launcher's rank: [`mpi_launcher_rank`], [`mpi_rank_vars`]), a
//! plain `tessera train` of a parameter-server config (`ps::launch`, one child per role) and
//! the Kubernetes pod entrypoint
//! (`deploy/k8s/tessera-pod-env.sh`, which cannot call Rust and spells the same names). Every
//! parameter-server role reads it ([`RoleEnv`]). A process of `tessera launch` without
//! parameter servers is a worker, whose rank the variables give to the program it runs.
//!
//! | variable | value | set by |
//! |---|---|---|
//! | [`ROLE`] | `scheduler`, `server`, `worker` ([`Role`]) | every launcher |
//! | [`RANK`] | the process's global index, `0..world size` | every launcher |
//! | [`WORLD_SIZE`] | processes in the job | every launcher |
//! | [`LOCAL_RANK`] | the index on this host | `tessera launch`, `tessera rank-env` |
//! | [`SERVER_ID`], [`WORKER_ID`] | the index within the role | every launcher |
//! | [`NUM_SERVERS`], [`NUM_WORKERS`] | the job's counts | every launcher |
//! | [`SCHEDULER_ADDR`] | the scheduler's `host:port` | every launcher of a PS job |
//! | [`RESTART_COUNT`] | how many times this process was restarted | every launcher |
//! | [`JOB_SECRET`] | the job's shared secret ([`JobSecret`]) | every launcher of a PS job |
//! | [`HOST`], [`SERVER_PORT`], [`ADVERTISE_HOST`] | what a role binds and advertises | the pod entrypoint |
//! | [`SERVER_JOIN`] | `1`: a server added to a running job | the user |
//! | [`BACKEND`] | `mpi` for the ranks of an `mpirun` job (`tessera train`'s `--backend` default) | `tessera rank-env` |
//!
//! Beside them every launcher sets MindSpore's names for the same facts ([`MS_ROLE`],
//! [`MS_WORKER_NUM`], [`MS_SERVER_NUM`], [`MS_SCHED_HOST`], [`MS_SCHED_PORT`], and for workers
//! [`RANK_ID`], [`RANK_SIZE`], [`MS_NODE_ID`], [`DEVICE_ID`]) for scripts written for `msrun`;
//! Tessera reads none of them.
//!
//! [`MAX_RANKS`] is not part of the contract but a resource setting of the `tessera` binary;
//! its name is here so that every `TESSERA_*` name a Tessera crate reads is. (The pod
//! entrypoint's own inputs, `TESSERA_POD_INDEX` and `TESSERA_STATE_DIR`, and the scripts'
//! `TESSERA_*_VENV` never reach a Tessera process.)
//!
//! Every error names the variable and the rule it breaks ([`EnvError`]).

use std::fmt;
use std::io::Read as _;

/// The role a process plays (`scheduler`, `server`, `worker`).
pub const ROLE: &str = "TESSERA_ROLE";
/// The process's global rank (`0..world size`; scheduler, then servers, then workers).
pub const RANK: &str = "TESSERA_RANK";
/// The number of processes in the job.
pub const WORLD_SIZE: &str = "TESSERA_WORLD_SIZE";
/// The process's index on its host.
pub const LOCAL_RANK: &str = "TESSERA_LOCAL_RANK";
/// A server's index among the servers.
pub const SERVER_ID: &str = "TESSERA_SERVER_ID";
/// A worker's index among the workers.
pub const WORKER_ID: &str = "TESSERA_WORKER_ID";
/// The job's parameter servers.
pub const NUM_SERVERS: &str = "TESSERA_NUM_SERVERS";
/// The job's workers.
pub const NUM_WORKERS: &str = "TESSERA_NUM_WORKERS";
/// The scheduler's `host:port`.
pub const SCHEDULER_ADDR: &str = "TESSERA_SCHEDULER_ADDR";
/// How many times this process was restarted (0 on its first start).
pub const RESTART_COUNT: &str = "TESSERA_RESTART_COUNT";
/// The job's shared secret, which admits a process to the job ([`JobSecret`]).
pub const JOB_SECRET: &str = "TESSERA_JOB_SECRET";
/// The address the scheduler and the servers bind.
pub const HOST: &str = "TESSERA_HOST";
/// The port a server binds.
pub const SERVER_PORT: &str = "TESSERA_SERVER_PORT";
/// The name a server gives the scheduler for workers to reach it by.
pub const ADVERTISE_HOST: &str = "TESSERA_ADVERTISE_HOST";
/// `1`: this server joins a running job.
pub const SERVER_JOIN: &str = "TESSERA_SERVER_JOIN";
/// The communicator backend `tessera train` uses when its `--backend` is not given: `local` or
/// `mpi` (set by `tessera rank-env` for the ranks of an `mpirun` job).
pub const BACKEND: &str = "TESSERA_BACKEND";
/// The ceiling on ranks per mesh (`layout::limits`), read by the `tessera` binary at start.
pub const MAX_RANKS: &str = "TESSERA_MAX_RANKS";
/// This node's in-memory store of `train.elastic`'s snapshots (set by `tessera launch` for the
/// ranks of a collective job; `crate::elastic`).
pub const ELASTIC_DIR: &str = "TESSERA_ELASTIC_DIR";
/// A fault to inject, for tests: `rank=R,step=S,at=POINT` (`crate::elastic::fault`).
pub const FAULT: &str = "TESSERA_FAULT";
/// Node 0's relay socket, in `mpirun`'s environment, for `tessera launch-agent`.
pub const LAUNCH_AGENT_SOCKET: &str = "TESSERA_LAUNCH_AGENT_SOCKET";

/// MindSpore's names, which a launcher sets beside the `TESSERA_*` contract for scripts written
/// for `msrun` (and MindSpore's parameter-server roles): the process's role, `MS_SCHED`,
/// `MS_PSERVER` or `MS_WORKER`.
pub const MS_ROLE: &str = "MS_ROLE";
/// MindSpore's worker count (every role).
pub const MS_WORKER_NUM: &str = "MS_WORKER_NUM";
/// MindSpore's server count (every role of a parameter-server job).
pub const MS_SERVER_NUM: &str = "MS_SERVER_NUM";
/// MindSpore's scheduler host (the host of [`SCHEDULER_ADDR`]).
pub const MS_SCHED_HOST: &str = "MS_SCHED_HOST";
/// MindSpore's scheduler port (the port of [`SCHEDULER_ADDR`]).
pub const MS_SCHED_PORT: &str = "MS_SCHED_PORT";
/// MindSpore's node id: a worker's index (workers only).
pub const MS_NODE_ID: &str = "MS_NODE_ID";
/// MindSpore's rank: a worker's index (workers only; what `get_rank()` answers).
pub const RANK_ID: &str = "RANK_ID";
/// MindSpore's rank count: the workers (workers only; what `get_group_size()` answers).
pub const RANK_SIZE: &str = "RANK_SIZE";
/// MindSpore's device index on the host: a worker's index among its host's workers (workers
/// only, when the launcher knows the host's workers).
pub const DEVICE_ID: &str = "DEVICE_ID";

/// How `tessera rank-env` starts the line it writes to its stderr when the rank's command
/// failed: `tessera rank-env: the command failed (exit code 3)`. `tessera launch` names the
/// first rank whose output carries it, which `mpirun`'s own report does not always do.
pub const RANK_FAILED_LINE: &str = "tessera rank-env: the command failed";

/// The MPI backend's progress reports that `tessera rank-env` passes on to `tessera launch`.
pub use comm::start_notice::MpiProgress;
/// The variable naming the pipe through which the MPI backend tells `tessera rank-env` that the
/// rank's command is starting MPI (`comm::start_notice`).
pub use comm::start_notice::MPI_START_FD_VAR as MPI_START_FD;

/// The line `tessera rank-env` writes to its stderr (ending with the job's token, as
/// [`RANK_FAILED_LINE`]) when the rank's command is starting MPI (the MPI backend's notice,
/// `comm::start_notice`).
pub const RANK_MPI_STARTING_LINE: &str = "tessera rank-env: the command is starting MPI";

/// How `tessera rank-env` starts the line it writes when the rank's command ended with exit
/// code 0 without starting MPI: `tessera rank-env: the command ended before starting MPI (exit
/// code 0)`. Under `tessera launch`, a rank that did start MPI then waits for this one forever,
/// so the launcher stops the job, naming both.
pub const RANK_ENDED_BEFORE_MPI_LINE: &str =
    "tessera rank-env: the command ended before starting MPI";

/// A token `tessera launch` gives the ranks of its `mpirun` job (never their commands):
/// `tessera rank-env` ends its [`RANK_FAILED_LINE`] with ` [TOKEN]`, so that the launcher takes
/// only rank-env's own line, never a program's output that looks like it, as a rank's failure.
pub const FAILURE_TOKEN: &str = "TESSERA_FAILURE_TOKEN";

/// What ends rank-env's [`RANK_FAILED_LINE`] under a launcher that gave `token`: ` [<token>]`
/// (the one spelling rank-env writes and `tessera launch` looks for).
pub fn failure_token_suffix(token: &str) -> String {
    format!(" [{token}]")
}

/// The variables a launcher sets or removes for every process it starts, so that nothing of
/// its own environment leaks into a process's contract.
pub const LAUNCHER_VARS: [&str; 22] = [
    ROLE,
    RANK,
    WORLD_SIZE,
    LOCAL_RANK,
    SERVER_ID,
    WORKER_ID,
    NUM_SERVERS,
    NUM_WORKERS,
    SCHEDULER_ADDR,
    RESTART_COUNT,
    JOB_SECRET,
    FAILURE_TOKEN,
    BACKEND,
    MS_ROLE,
    MS_WORKER_NUM,
    MS_SERVER_NUM,
    MS_SCHED_HOST,
    MS_SCHED_PORT,
    MS_NODE_ID,
    RANK_ID,
    RANK_SIZE,
    DEVICE_ID,
];

/// A variable of the contract with a value that breaks its rule, or missing where it is
/// needed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment {var}: {reason}")]
pub struct EnvError {
    /// The variable (`TESSERA_ROLE`).
    pub var: &'static str,
    /// The rule broken.
    pub reason: String,
}

impl EnvError {
    fn new(var: &'static str, reason: impl Into<String>) -> EnvError {
        EnvError {
            var,
            reason: reason.into(),
        }
    }
}

/// The three roles of a job, after ms-operator's replica types (Scheduler, PS, Worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Registers everyone, tracks liveness, fixes each step's members (one per PS job).
    Scheduler,
    /// A parameter server: holds a partition of the parameters and applies the optimizer.
    Server,
    /// Computes gradients: the process that trains.
    Worker,
}

impl Role {
    /// The spelling in [`ROLE`], log file names and console prefixes.
    pub fn name(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Server => "server",
            Role::Worker => "worker",
        }
    }

    /// The role spelled `text`, if any.
    pub fn parse(text: &str) -> Option<Role> {
        [Role::Scheduler, Role::Server, Role::Worker]
            .into_iter()
            .find(|r| r.name() == text)
    }

    /// The role and the index within it of process `rank` of a parameter-server job with
    /// `servers` servers: rank 0 is the scheduler, then the servers, then the workers.
    pub fn of_rank(rank: usize, servers: usize) -> (Role, usize) {
        match rank {
            0 => (Role::Scheduler, 0),
            r if r <= servers => (Role::Server, r - 1),
            r => (Role::Worker, r - 1 - servers),
        }
    }

    /// The variable that holds the index within this role ([`SERVER_ID`], [`WORKER_ID`]; the
    /// scheduler has none).
    pub fn id_var(self) -> Option<&'static str> {
        match self {
            Role::Scheduler => None,
            Role::Server => Some(SERVER_ID),
            Role::Worker => Some(WORKER_ID),
        }
    }
}

/// The fewest characters of a job secret (a generated one has 64).
pub const MIN_SECRET_CHARS: usize = 16;

/// The most characters of a job secret (it travels in every call's metadata).
pub const MAX_SECRET_CHARS: usize = 1024;

/// A job's shared secret ([`JOB_SECRET`]): visible ASCII, [`MIN_SECRET_CHARS`] to
/// [`MAX_SECRET_CHARS`] characters. Compared in constant time; its `Debug` form does not show
/// it. How it admits calls is `ps::auth`'s business.
#[derive(Clone)]
pub struct JobSecret(String);

impl JobSecret {
    /// A fresh secret: 32 bytes from the operating system's random source, as hex.
    pub fn generate() -> std::io::Result<JobSecret> {
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("reading random bytes from /dev/urandom: {e}"),
                )
            })?;
        Ok(JobSecret(
            bytes.iter().map(|b| format!("{b:02x}")).collect(),
        ))
    }

    /// The secret [`JOB_SECRET`] holds (`None`: unset), checked.
    pub fn from_env_value(value: Option<String>) -> Result<JobSecret, EnvError> {
        let text = value.ok_or_else(|| {
            EnvError::new(
                JOB_SECRET,
                "must be set: the job's secret, the same in every role (tessera train and tessera launch make one; see docs/PS.md)",
            )
        })?;
        JobSecret::new(text).map_err(|reason| EnvError::new(JOB_SECRET, reason))
    }

    /// `text` as a secret, or the rule it breaks (the text itself is never quoted).
    pub fn new(text: String) -> Result<JobSecret, String> {
        let chars = text.chars().count();
        if !(MIN_SECRET_CHARS..=MAX_SECRET_CHARS).contains(&chars) {
            return Err(format!(
                "the secret has {chars} characters; it must have {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS}"
            ));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "the secret must be visible ASCII characters only (no spaces or control characters)"
                    .to_string(),
            );
        }
        Ok(JobSecret(text))
    }

    /// The secret's text, for handing it to a child process's environment only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `given` is this secret, in time independent of where they differ (the length
    /// is not hidden: a generated secret's length is public).
    pub fn matches(&self, given: &[u8]) -> bool {
        let secret = self.0.as_bytes();
        if secret.len() != given.len() {
            return false;
        }
        let diff = secret
            .iter()
            .zip(given)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y));
        std::hint::black_box(diff) == 0
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(<redacted>)")
    }
}

impl PartialEq for JobSecret {
    fn eq(&self, other: &JobSecret) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl Eq for JobSecret {}

/// What a launcher sets for one process: the contract's variables as (name, value) pairs,
/// [`ProcessVars::vars`]; those of [`LAUNCHER_VARS`] not listed are to be removed.
#[derive(Debug, Clone, Copy)]
pub struct ProcessVars<'a> {
    /// [`ROLE`].
    pub role: Role,
    /// The index within the role ([`SERVER_ID`] or [`WORKER_ID`]; unset for the scheduler).
    pub id: usize,
    /// [`RANK`].
    pub rank: usize,
    /// [`WORLD_SIZE`].
    pub world_size: usize,
    /// [`LOCAL_RANK`], when the launcher knows the host's processes.
    pub local_rank: Option<usize>,
    /// A worker's [`DEVICE_ID`]: its index among its host's workers, when the launcher knows
    /// them (ignored for the other roles).
    pub device_id: Option<usize>,
    /// [`NUM_SERVERS`].
    pub num_servers: usize,
    /// [`NUM_WORKERS`].
    pub num_workers: usize,
    /// [`SCHEDULER_ADDR`], in a parameter-server job.
    pub scheduler_addr: Option<&'a str>,
    /// [`RESTART_COUNT`].
    pub restart_count: u32,
    /// [`JOB_SECRET`], in a parameter-server job.
    pub secret: Option<&'a JobSecret>,
}

impl ProcessVars<'_> {
    /// The variables, as (name, value) pairs.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (ROLE, self.role.name().to_string()),
            (RANK, self.rank.to_string()),
            (WORLD_SIZE, self.world_size.to_string()),
        ];
        if let Some(local_rank) = self.local_rank {
            env.push((LOCAL_RANK, local_rank.to_string()));
        }
        env.extend([
            (NUM_SERVERS, self.num_servers.to_string()),
            (NUM_WORKERS, self.num_workers.to_string()),
            (RESTART_COUNT, self.restart_count.to_string()),
        ]);
        if let Some(var) = self.role.id_var() {
            env.push((var, self.id.to_string()));
        }
        if let Some(addr) = self.scheduler_addr {
            env.push((SCHEDULER_ADDR, addr.to_string()));
        }
        if let Some(secret) = self.secret {
            env.push((JOB_SECRET, secret.expose().to_string()));
        }
        env.extend(self.mindspore_vars());
        env
    }

    /// MindSpore's names for the same facts ([`MS_ROLE`] … [`DEVICE_ID`]).
    fn mindspore_vars(&self) -> Vec<(&'static str, String)> {
        let role = match self.role {
            Role::Scheduler => "MS_SCHED",
            Role::Server => "MS_PSERVER",
            Role::Worker => "MS_WORKER",
        };
        let mut env = vec![
            (MS_ROLE, role.to_string()),
            (MS_WORKER_NUM, self.num_workers.to_string()),
        ];
        if self.num_servers > 0 {
            env.push((MS_SERVER_NUM, self.num_servers.to_string()));
        }
        if let Some((host, port)) = self.scheduler_addr.and_then(|a| a.rsplit_once(':')) {
            env.push((MS_SCHED_HOST, host.to_string()));
            env.push((MS_SCHED_PORT, port.to_string()));
        }
        if self.role == Role::Worker {
            env.extend([
                (RANK_ID, self.id.to_string()),
                (RANK_SIZE, self.num_workers.to_string()),
                (MS_NODE_ID, self.id.to_string()),
            ]);
            if let Some(device) = self.device_id {
                env.push((DEVICE_ID, device.to_string()));
            }
        }
        env
    }
}

/// The rank, world size and rank on its host that an MPI launcher gave this process: OpenMPI's
/// `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`, or the PMI
/// names MPICH's Hydra sets (`PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`). `None` outside an MPI
/// launcher (no rank variable set).
pub fn mpi_launcher_rank(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<(usize, usize, usize)>, EnvError> {
    let names = [
        (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ];
    let Some((rank_var, size_var, local_var)) = names
        .into_iter()
        .find(|(rank, _, _)| lookup(rank).is_some())
    else {
        return Ok(None);
    };
    let count = |var: &'static str, value: Option<String>| -> Result<usize, EnvError> {
        let value = value.ok_or(EnvError {
            var,
            reason: "is not set, though the MPI launcher's rank is".to_string(),
        })?;
        value.trim().parse().map_err(|_| EnvError {
            var,
            reason: format!("expected a count, got '{value}'"),
        })
    };
    let rank = count(rank_var, lookup(rank_var))?;
    let size = count(size_var, lookup(size_var))?;
    // Without a local rank the launcher put one rank per host.
    let local = match lookup(local_var) {
        Some(v) => count(local_var, Some(v))?,
        None => 0,
    };
    if size == 0 {
        return Err(EnvError {
            var: size_var,
            reason: "is 0: a world has at least one rank".to_string(),
        });
    }
    if rank >= size {
        return Err(EnvError {
            var: rank_var,
            reason: format!("rank {rank} is not below the world size {size}"),
        });
    }
    let max = layout::limits::max_ranks();
    if size > max {
        return Err(EnvError {
            var: size_var,
            reason: format!(
                "a world of {size} ranks is above the limit of {max} ranks (set TESSERA_MAX_RANKS to change it)"
            ),
        });
    }
    // A host's ranks are numbered from 0, so a rank's local number cannot exceed its rank.
    if local > rank {
        return Err(EnvError {
            var: local_var,
            reason: format!("local rank {local} is above the rank {rank} (local ranks count a host's ranks from 0)"),
        });
    }
    Ok(Some((rank, size, local)))
}

/// The contract of worker `rank` of a collective job of `size` ranks, `local` on its host, run
/// by an MPI launcher, on the job's `restart_count`-th start: what `tessera rank-env` sets
/// before it runs the rank's command (with [`BACKEND`] `mpi`).
pub fn mpi_rank_vars(
    rank: usize,
    size: usize,
    local: usize,
    restart_count: u32,
) -> Vec<(&'static str, String)> {
    let mut vars = ProcessVars {
        role: Role::Worker,
        id: rank,
        rank,
        world_size: size,
        local_rank: Some(local),
        device_id: Some(local),
        num_servers: 0,
        num_workers: size,
        scheduler_addr: None,
        restart_count,
        secret: None,
    }
    .vars();
    vars.push((BACKEND, "mpi".to_string()));
    vars
}

/// A parameter-server role's environment, as it reads the contract (see `docs/PS.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleEnv {
    /// [`ROLE`].
    pub role: Role,
    /// [`RANK`] (0 when unset).
    pub rank: usize,
    /// [`WORLD_SIZE`] (0 when unset).
    pub world_size: usize,
    /// [`SERVER_ID`] (servers).
    pub server_id: usize,
    /// [`WORKER_ID`] (workers).
    pub worker_id: usize,
    /// [`NUM_SERVERS`], when set.
    pub num_servers: Option<usize>,
    /// [`NUM_WORKERS`], when set.
    pub num_workers: Option<usize>,
    /// [`SCHEDULER_ADDR`] (`host:port`).
    pub scheduler_addr: String,
    /// [`RESTART_COUNT`] (0 when unset).
    pub restart_count: u32,
    /// [`HOST`]: the address the scheduler and the servers bind. Unset, a server binds
    /// 127.0.0.1 and the scheduler the address [`SCHEDULER_ADDR`] resolves to; in a pod,
    /// `0.0.0.0`.
    pub host: Option<String>,
    /// [`SERVER_PORT`]: the port a server binds (0, the default: any free port).
    pub server_port: u16,
    /// [`ADVERTISE_HOST`]: the name a server gives the scheduler for workers to reach it
    /// by (unset: the address it bound), e.g. its pod's DNS name.
    pub advertise_host: Option<String>,
    /// [`SERVER_JOIN`]`=1`: a server added to a running job (its id is the next one).
    pub added_server: bool,
    /// [`JOB_SECRET`]: the job's shared secret, sent with every call and checked on
    /// every call received (never printed: its `Debug` form is redacted).
    pub secret: JobSecret,
}

impl RoleEnv {
    /// Reads the process's environment; `None` when [`ROLE`] is unset.
    pub fn from_process() -> Result<Option<RoleEnv>, EnvError> {
        RoleEnv::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the contract from `lookup` (a variable's value, if set); `None` when [`ROLE`] is
    /// unset.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<RoleEnv>, EnvError> {
        let Some(role_text) = lookup(ROLE) else {
            return Ok(None);
        };
        let role = Role::parse(role_text.trim()).ok_or_else(|| {
            EnvError::new(
                ROLE,
                format!("\"{role_text}\" is not scheduler, server or worker"),
            )
        })?;
        let number = |var: &'static str| -> Result<Option<usize>, EnvError> {
            match lookup(var) {
                None => Ok(None),
                Some(text) => text.trim().parse::<usize>().map(Some).map_err(|_| {
                    EnvError::new(var, format!("\"{text}\" is not a non-negative integer"))
                }),
            }
        };
        let needed = |var: &'static str| -> Result<usize, EnvError> {
            number(var)?.ok_or_else(|| {
                EnvError::new(var, format!("must be set for {ROLE}={}", role.name()))
            })
        };
        // A process's id: below the most processes a job may have (a larger one used to be
        // cut to 32 bits, taking another process's id).
        let id = |var: &'static str| -> Result<usize, EnvError> {
            let id = needed(var)?;
            match id < crate::config::MAX_PS_PROCESSES {
                true => Ok(id),
                false => Err(EnvError::new(
                    var,
                    format!(
                        "{id} is not an id of a parameter-server job (at most {} processes of a role)",
                        crate::config::MAX_PS_PROCESSES
                    ),
                )),
            }
        };
        let scheduler_addr = lookup(SCHEDULER_ADDR).ok_or_else(|| {
            EnvError::new(SCHEDULER_ADDR, "must be set (host:port of the scheduler)")
        })?;
        let port = scheduler_addr.rsplit_once(':').map(|(_, port)| port);
        if port.is_none_or(|p| p.trim().parse::<u16>().is_err()) {
            return Err(EnvError::new(
                SCHEDULER_ADDR,
                format!("\"{scheduler_addr}\" is not host:port (a port is at most 65535)"),
            ));
        }
        let restart_count = number(RESTART_COUNT)?.unwrap_or(0);
        let env = RoleEnv {
            role,
            rank: number(RANK)?.unwrap_or(0),
            world_size: number(WORLD_SIZE)?.unwrap_or(0),
            server_id: match role {
                Role::Server => id(SERVER_ID)?,
                _ => 0,
            },
            worker_id: match role {
                Role::Worker => id(WORKER_ID)?,
                _ => 0,
            },
            num_servers: number(NUM_SERVERS)?,
            num_workers: number(NUM_WORKERS)?,
            scheduler_addr,
            restart_count: u32::try_from(restart_count).unwrap_or(u32::MAX),
            host: lookup(HOST).filter(|h| !h.trim().is_empty()),
            server_port: match number(SERVER_PORT)? {
                None => 0,
                Some(port) => u16::try_from(port).map_err(|_| {
                    EnvError::new(SERVER_PORT, format!("{port} is not a port (at most 65535)"))
                })?,
            },
            advertise_host: lookup(ADVERTISE_HOST).filter(|h| !h.trim().is_empty()),
            added_server: match lookup(SERVER_JOIN).as_deref().map(str::trim) {
                None | Some("" | "0" | "false") => false,
                Some("1" | "true") => true,
                Some(other) => {
                    return Err(EnvError::new(
                        SERVER_JOIN,
                        format!("\"{other}\" is not 1 or 0"),
                    ))
                }
            },
            secret: JobSecret::from_env_value(lookup(JOB_SECRET))?,
        };
        Ok(Some(env))
    }
}

#[cfg(test)]
mod tests;
