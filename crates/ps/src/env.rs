//! The process contract: what the launcher puts in every process's environment, and the job's
//! settings once the config and the environment agree.

use std::path::PathBuf;
use std::time::Duration;

use runtime::{PsKeys, TrainConfig, MAX_PS_PROCESSES};

use crate::auth::JobSecret;
use crate::error::PsError;
use crate::retry::RetryPolicy;

/// The variable that hands every role the job's secret (see [`JobSecret`]).
pub const JOB_SECRET_VAR: &str = "TESSERA_JOB_SECRET";

/// The three roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsRole {
    /// Registers everyone, tracks liveness, fixes each step's members.
    Scheduler,
    /// Holds a partition of the parameters and applies the optimizer.
    Server,
    /// Computes gradients.
    Worker,
}

impl PsRole {
    /// The spelling in `TESSERA_ROLE`.
    pub fn name(self) -> &'static str {
        match self {
            PsRole::Scheduler => "scheduler",
            PsRole::Server => "server",
            PsRole::Worker => "worker",
        }
    }

    fn parse(text: &str) -> Option<PsRole> {
        [PsRole::Scheduler, PsRole::Server, PsRole::Worker]
            .into_iter()
            .find(|r| r.name() == text)
    }
}

/// One process's environment (`TESSERA_*`, see `docs/PS.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleEnv {
    /// `TESSERA_ROLE`.
    pub role: PsRole,
    /// `TESSERA_RANK` (0 when unset).
    pub rank: usize,
    /// `TESSERA_WORLD_SIZE` (0 when unset).
    pub world_size: usize,
    /// `TESSERA_SERVER_ID` (servers).
    pub server_id: usize,
    /// `TESSERA_WORKER_ID` (workers).
    pub worker_id: usize,
    /// `TESSERA_NUM_SERVERS`, when set.
    pub num_servers: Option<usize>,
    /// `TESSERA_NUM_WORKERS`, when set.
    pub num_workers: Option<usize>,
    /// `TESSERA_SCHEDULER_ADDR` (`host:port`).
    pub scheduler_addr: String,
    /// `TESSERA_RESTART_COUNT` (0 when unset).
    pub restart_count: u32,
    /// `TESSERA_HOST`: the address the scheduler and the servers bind. Unset, a server binds
    /// 127.0.0.1 and the scheduler the address `TESSERA_SCHEDULER_ADDR` resolves to; in a pod,
    /// `0.0.0.0`.
    pub host: Option<String>,
    /// `TESSERA_SERVER_PORT`: the port a server binds (0, the default: any free port).
    pub server_port: u16,
    /// `TESSERA_ADVERTISE_HOST`: the name a server gives the scheduler for workers to reach it
    /// by (unset: the address it bound), e.g. its pod's DNS name.
    pub advertise_host: Option<String>,
    /// `TESSERA_SERVER_JOIN=1`: a server added to a running job (its id is the next one).
    pub added_server: bool,
    /// `TESSERA_JOB_SECRET`: the job's shared secret, sent with every call and checked on
    /// every call received (never printed: its `Debug` form is redacted).
    pub secret: JobSecret,
}

impl RoleEnv {
    /// Reads the process's environment; `None` when `TESSERA_ROLE` is unset.
    pub fn from_process() -> Result<Option<RoleEnv>, PsError> {
        RoleEnv::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the contract from `lookup` (a variable's value, if set); `None` when
    /// `TESSERA_ROLE` is unset.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<RoleEnv>, PsError> {
        let Some(role_text) = lookup("TESSERA_ROLE") else {
            return Ok(None);
        };
        let role = PsRole::parse(role_text.trim()).ok_or_else(|| PsError::Env {
            var: "TESSERA_ROLE".to_string(),
            reason: format!("\"{role_text}\" is not scheduler, server or worker"),
        })?;
        let number = |var: &str| -> Result<Option<usize>, PsError> {
            match lookup(var) {
                None => Ok(None),
                Some(text) => text
                    .trim()
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| PsError::Env {
                        var: var.to_string(),
                        reason: format!("\"{text}\" is not a non-negative integer"),
                    }),
            }
        };
        let needed = |var: &str| -> Result<usize, PsError> {
            number(var)?.ok_or_else(|| PsError::Env {
                var: var.to_string(),
                reason: format!("must be set for TESSERA_ROLE={}", role.name()),
            })
        };
        let scheduler_addr = lookup("TESSERA_SCHEDULER_ADDR").ok_or_else(|| PsError::Env {
            var: "TESSERA_SCHEDULER_ADDR".to_string(),
            reason: "must be set (host:port of the scheduler)".to_string(),
        })?;
        if !scheduler_addr.contains(':') {
            return Err(PsError::Env {
                var: "TESSERA_SCHEDULER_ADDR".to_string(),
                reason: format!("\"{scheduler_addr}\" is not host:port"),
            });
        }
        let restart_count = number("TESSERA_RESTART_COUNT")?.unwrap_or(0);
        let env = RoleEnv {
            role,
            rank: number("TESSERA_RANK")?.unwrap_or(0),
            world_size: number("TESSERA_WORLD_SIZE")?.unwrap_or(0),
            server_id: match role {
                PsRole::Server => needed("TESSERA_SERVER_ID")?,
                _ => 0,
            },
            worker_id: match role {
                PsRole::Worker => needed("TESSERA_WORKER_ID")?,
                _ => 0,
            },
            num_servers: number("TESSERA_NUM_SERVERS")?,
            num_workers: number("TESSERA_NUM_WORKERS")?,
            scheduler_addr,
            restart_count: u32::try_from(restart_count).unwrap_or(u32::MAX),
            host: lookup("TESSERA_HOST").filter(|h| !h.trim().is_empty()),
            server_port: match number("TESSERA_SERVER_PORT")? {
                None => 0,
                Some(port) => u16::try_from(port).map_err(|_| PsError::Env {
                    var: "TESSERA_SERVER_PORT".to_string(),
                    reason: format!("{port} is not a port (at most 65535)"),
                })?,
            },
            advertise_host: lookup("TESSERA_ADVERTISE_HOST").filter(|h| !h.trim().is_empty()),
            added_server: match lookup("TESSERA_SERVER_JOIN").as_deref().map(str::trim) {
                None | Some("" | "0" | "false") => false,
                Some("1" | "true") => true,
                Some(other) => {
                    return Err(PsError::Env {
                        var: "TESSERA_SERVER_JOIN".to_string(),
                        reason: format!("\"{other}\" is not 1 or 0"),
                    })
                }
            },
            secret: JobSecret::from_env_value(lookup(JOB_SECRET_VAR))?,
        };
        Ok(Some(env))
    }
}

/// A job's settings: `[ps]` and the environment's counts, checked against each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSettings {
    /// Servers in the job.
    pub servers: usize,
    /// Workers at the start of the job.
    pub workers: usize,
    /// `ps.sync`.
    pub sync: bool,
    /// `ps.staleness` (async).
    pub staleness: u64,
    /// `ps.checkpoint_every`.
    pub checkpoint_every: u64,
    /// `ps.heartbeat_ms`.
    pub heartbeat: Duration,
    /// `ps.dead_after_ms`.
    pub dead_after: Duration,
    /// Deadline and retries of every call.
    pub retry: RetryPolicy,
    /// The run's output directory (snapshots go in `<dir>/ps/`).
    pub output_dir: PathBuf,
}

impl JobSettings {
    /// The settings of `config` (which must be a parameter-server config) under `env`.
    pub fn new(config: &TrainConfig, env: &RoleEnv) -> Result<JobSettings, PsError> {
        let keys = config.ps().ok_or_else(|| PsError::Config {
            key: "parallel.mode".to_string(),
            reason:
                "TESSERA_ROLE is set but the config is not parallel.mode = \"parameter_server\""
                    .to_string(),
        })?;
        let servers = agree(
            "ps.servers",
            keys.servers,
            "TESSERA_NUM_SERVERS",
            env.num_servers,
            1,
        )?;
        let workers = agree(
            "ps.workers",
            keys.workers,
            "TESSERA_NUM_WORKERS",
            env.num_workers,
            2,
        )?;
        let role_id = match env.role {
            PsRole::Server => Some(("TESSERA_SERVER_ID", env.server_id, servers)),
            _ => None,
        };
        if let Some((var, id, count)) = role_id.filter(|_| !env.added_server) {
            if id >= count {
                return Err(PsError::Env {
                    var: var.to_string(),
                    reason: format!(
                        "{id} is not below the job's {count} servers (set TESSERA_SERVER_JOIN=1 to add a server)"
                    ),
                });
            }
        }
        Ok(JobSettings::from_keys(keys, servers, workers, config))
    }

    /// The settings of `keys` with these counts (no environment).
    pub fn from_keys(
        keys: &PsKeys,
        servers: usize,
        workers: usize,
        config: &TrainConfig,
    ) -> JobSettings {
        JobSettings {
            servers,
            workers,
            sync: keys.sync,
            staleness: keys.staleness,
            checkpoint_every: keys.checkpoint_every,
            heartbeat: Duration::from_millis(keys.heartbeat_ms),
            dead_after: Duration::from_millis(keys.dead_after_ms),
            retry: RetryPolicy {
                timeout: Duration::from_millis(keys.rpc_timeout_ms),
                retries: keys.rpc_retries,
                first_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_secs(2),
            },
            output_dir: config.output().dir.clone(),
        }
    }
}

impl JobSettings {
    /// How long a registration refused because its id is alive in another process is asked
    /// again: long enough for the scheduler to declare a killed predecessor dead.
    pub fn registration_patience(&self) -> Duration {
        self.dead_after * 2 + self.heartbeat * 4 + self.retry.timeout
    }
}

/// A count given by the config and/or the environment: they must agree when both are given.
fn agree(
    key: &str,
    from_config: Option<usize>,
    var: &str,
    from_env: Option<usize>,
    default: usize,
) -> Result<usize, PsError> {
    let n = match (from_config, from_env) {
        (Some(c), Some(e)) if c != e => {
            return Err(PsError::Config {
                key: key.to_string(),
                reason: format!("{c} disagrees with {var}={e} from the launcher"),
            })
        }
        (Some(c), _) => c,
        (None, Some(e)) => e,
        (None, None) => default,
    };
    if n == 0 || n > MAX_PS_PROCESSES {
        return Err(PsError::Env {
            var: var.to_string(),
            reason: format!("{n} is out of range: it must be between 1 and {MAX_PS_PROCESSES}"),
        });
    }
    Ok(n)
}
