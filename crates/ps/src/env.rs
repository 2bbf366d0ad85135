//! The process contract as the roles use it: the `TESSERA_*` variables themselves (their
//! names, parsing and errors) are `runtime::launch_env`'s; here are the job's settings once the
//! config and the environment agree.

use std::path::PathBuf;
use std::time::Duration;

use runtime::launch_env::{self, Role};
use runtime::{PsKeys, TrainConfig, MAX_PS_PROCESSES};

use crate::error::PsError;
use crate::retry::RetryPolicy;

pub use runtime::launch_env::{Role as PsRole, RoleEnv};

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
            reason: format!(
                "{} is set but the config is not parallel.mode = \"parameter_server\"",
                launch_env::ROLE
            ),
        })?;
        check_settings_the_mode_runs(config)?;
        let (servers, workers) = job_counts(config, keys, (env.num_servers, env.num_workers))?;
        let role_id = match env.role {
            Role::Server => Some((launch_env::SERVER_ID, env.server_id, servers)),
            _ => None,
        };
        if let Some((var, id, count)) = role_id.filter(|_| !env.added_server) {
            if id >= count {
                return Err(PsError::Env {
                    var: var.to_string(),
                    reason: format!(
                        "{id} is not below the job's {count} servers (set {}=1 to add a server)",
                        launch_env::SERVER_JOIN
                    ),
                });
            }
        }
        // A worker's id must name one of the global batch's blocks (workers joining mid-run
        // take ids past `ps.workers`): the scheduler refuses it at registration too, but a
        // worker checks before it builds its model and reads its data.
        let batch = config.data().batch_size;
        if env.role == Role::Worker && env.worker_id >= batch {
            return Err(PsError::Env {
                var: launch_env::WORKER_ID.to_string(),
                reason: format!(
                    "{} is not below the global batch's {batch} rows (data.batch_size): worker ids are 0..{batch}, one block of each step per worker",
                    env.worker_id
                ),
            });
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

/// The job's servers and workers: `ps.servers` / `ps.workers`, or the launcher's
/// `TESSERA_NUM_SERVERS` / `TESSERA_NUM_WORKERS` (`from_env`), which must agree with them when
/// both are given, else 1 and 2; each between 1 and `MAX_PS_PROCESSES`, and no more workers
/// than the global batch has rows.
pub fn job_counts(
    config: &TrainConfig,
    keys: &PsKeys,
    (env_servers, env_workers): (Option<usize>, Option<usize>),
) -> Result<(usize, usize), PsError> {
    let servers = agree(
        "ps.servers",
        keys.servers,
        launch_env::NUM_SERVERS,
        env_servers,
        1,
    )?;
    let workers = agree(
        "ps.workers",
        keys.workers,
        launch_env::NUM_WORKERS,
        env_workers,
        2,
    )?;
    // Each step splits the global batch's rows among the live workers: a worker beyond the
    // rows would never get one (it used to run 0 steps, counted as a worker of the job).
    let batch = config.data().batch_size;
    if workers > batch {
        return Err(PsError::Config {
            key: "ps.workers".to_string(),
            reason: format!(
                "{workers} workers for a global batch of {batch} rows (data.batch_size): a step gives each worker its own rows, so workers {batch}.. would never train; use at most {batch} workers or a larger batch"
            ),
        });
    }
    Ok((servers, workers))
}

/// The counts of a job `tessera train` starts on this machine (no `TESSERA_ROLE`): as
/// [`job_counts`] with `TESSERA_NUM_SERVERS` / `TESSERA_NUM_WORKERS` read through `lookup` (a
/// variable's value, if set), so that a count set there is used, or refused naming the
/// variable, before any process starts; and, with more than one server, no more servers than
/// the model has blocks to give them ([`crate::server::check_servers_hold_something`]).
pub fn local_job_counts(
    config: &TrainConfig,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<(usize, usize), PsError> {
    let keys = config.ps().ok_or_else(|| PsError::Config {
        key: "parallel.mode".to_string(),
        reason: "the config is not parallel.mode = \"parameter_server\"".to_string(),
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
    check_settings_the_mode_runs(config)?;
    let (servers, workers) = job_counts(
        config,
        keys,
        (
            number(launch_env::NUM_SERVERS)?,
            number(launch_env::NUM_WORKERS)?,
        ),
    )?;
    // A server beyond the model's blocks would hold nothing (1,024 idle processes made a job
    // of the seed MLP stall): refused before any process starts, by the servers' own rule.
    if servers > 1 {
        let compute = crate::compute::Compute::new(config)?;
        crate::server::check_servers_hold_something(compute.params(), compute.tables(), servers)
            .map_err(|reason| servers_error(keys, reason))?;
    }
    Ok((servers, workers))
}

/// Refuses the settings of collective training that parameter-server training does not run,
/// naming the key, rather than ignoring them: a resume (`output.resume_from`; a server resumes
/// from its own snapshot), periodic checkpoint sets (`output.save_checkpoint_steps` /
/// `_seconds`; the servers snapshot every `ps.checkpoint_every` steps), mixed precision
/// (`train.precision`; the wire carries f32), the local norms
/// (`train.print_local_norm`, `train.dump_local_norm`) and the elastic store
/// (`train.elastic`).
pub fn check_settings_the_mode_runs(config: &TrainConfig) -> Result<(), PsError> {
    let (output, train) = (config.output(), config.train());
    let snapshots = "the servers snapshot their parameters into <output.dir>/ps/ every ps.checkpoint_every steps instead";
    let refused = [
        (
            output.resume_from.is_some(),
            "output.resume_from",
            "a parameter-server job does not resume from a checkpoint set: a restarted server resumes from its own snapshot (docs/PS.md, Failures); remove the key".to_string(),
        ),
        (
            output.save_checkpoint_steps.is_some(),
            "output.save_checkpoint_steps",
            format!("parameter-server training writes no periodic checkpoint sets: {snapshots}; remove the key"),
        ),
        (
            output.save_checkpoint_seconds.is_some(),
            "output.save_checkpoint_seconds",
            format!("parameter-server training writes no periodic checkpoint sets: {snapshots}; remove the key"),
        ),
        (
            train.precision != runtime::Precision::F32,
            "train.precision",
            "mixed precision is not built for parameter-server training: the servers hold and send f32 parameters and gradients (docs/PS.md, Not covered); set train.precision = \"f32\"".to_string(),
        ),
        (
            train.print_local_norm,
            "train.print_local_norm",
            "parameter-server workers compute no local norms (docs/PS.md); remove the key".to_string(),
        ),
        (
            train.dump_local_norm.is_some(),
            "train.dump_local_norm",
            "parameter-server workers compute no local norms (docs/PS.md); remove the key".to_string(),
        ),
        (
            train.elastic.is_some(),
            "train.elastic",
            "the elastic in-memory store is collective training's: a parameter-server job survives a lost worker or a restarted server by itself (docs/PS.md, Failures); remove the key".to_string(),
        ),
    ];
    match refused.into_iter().find(|(given, _, _)| *given) {
        Some((_, key, reason)) => Err(PsError::Config {
            key: key.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// An error about the job's server count, naming where it came from: `ps.servers` when the
/// config sets it, else the launcher's `TESSERA_NUM_SERVERS`.
pub fn servers_error(keys: &PsKeys, reason: String) -> PsError {
    match keys.servers {
        Some(_) => PsError::Config {
            key: "ps.servers".to_string(),
            reason,
        },
        None => PsError::Env {
            var: launch_env::NUM_SERVERS.to_string(),
            reason,
        },
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
