//! `parallel.mode = "parameter_server"` and its `[ps]` section (issue 19): the roles' counts,
//! sync or async updates, bounded staleness, server snapshots, heartbeats and call retries.

use toml::{Table, Value};

use super::values::{config_error, read_bool, read_count, read_positive, Section};
use super::ModelName;
use crate::error::RuntimeError;

/// The config spelling of the parameter-server mode.
pub const PARAMETER_SERVER_MODE: &str = "parameter_server";

/// The keys of `[ps]`.
pub(super) const PS_KEYS: &[&str] = &[
    "servers",
    "workers",
    "sync",
    "staleness",
    "checkpoint_every",
    "heartbeat_ms",
    "dead_after_ms",
    "rpc_timeout_ms",
    "rpc_retries",
    "embedding_on_server",
    "worker_max_param_bytes",
];

/// The most servers or workers a job may have.
pub const MAX_PS_PROCESSES: usize = 1024;

/// `[ps]`: parameter-server training's settings (see `docs/PS.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsKeys {
    /// `ps.servers`: parameter servers (`None`: from the launcher's environment, else 1).
    pub servers: Option<usize>,
    /// `ps.workers`: workers (`None`: from the launcher's environment, else 2).
    pub workers: Option<usize>,
    /// `ps.sync`: synchronous SGD (every step averages its live workers' gradients) or
    /// asynchronous (each push applied as it comes).
    pub sync: bool,
    /// `ps.staleness`: async only, how many steps a worker may run ahead of the slowest.
    pub staleness: u64,
    /// `ps.checkpoint_every`: servers snapshot their partition every this many steps (≥ 1).
    pub checkpoint_every: u64,
    /// `ps.heartbeat_ms`: how often servers and workers tell the scheduler they live.
    pub heartbeat_ms: u64,
    /// `ps.dead_after_ms`: a process silent this long is declared dead.
    pub dead_after_ms: u64,
    /// `ps.rpc_timeout_ms`: the deadline of every call.
    pub rpc_timeout_ms: u64,
    /// `ps.rpc_retries`: how many times a failed call is tried again (with backoff).
    pub rpc_retries: u32,
    /// `ps.embedding_on_server`: the embedding tables that live on the servers, row-partitioned
    /// across them (MindSpore's `nn.EmbeddingLookup(target="CPU")` with `set_param_ps()`):
    /// workers pull only their batch's rows and push row-sparse gradients.
    pub embedding_on_server: Vec<String>,
    /// `ps.worker_max_param_bytes`: the largest parameter buffer a worker may hold (`None`: no
    /// limit); a worker refuses a larger one, naming it.
    pub worker_max_param_bytes: Option<u64>,
}

impl Default for PsKeys {
    fn default() -> Self {
        PsKeys {
            servers: None,
            workers: None,
            sync: true,
            staleness: 2,
            checkpoint_every: 10,
            heartbeat_ms: 200,
            dead_after_ms: 2000,
            rpc_timeout_ms: 10_000,
            rpc_retries: 8,
            embedding_on_server: Vec::new(),
            worker_max_param_bytes: None,
        }
    }
}

/// Takes `parallel.mode = "parameter_server"` out of the raw `[parallel]` table (the parallel
/// pass knows no such mode: each worker runs stand-alone); whether it was there.
pub(super) fn take_ps_mode(root: &mut Table) -> bool {
    let Some(Value::Table(parallel)) = root.get_mut("parallel") else {
        return false;
    };
    match parallel.get("mode") {
        Some(Value::String(mode)) if mode == PARAMETER_SERVER_MODE => {
            parallel.remove("mode");
            true
        }
        _ => false,
    }
}

/// Whether `[parallel]` sets `devices` (which the parameter-server mode refuses).
pub(super) fn parallel_sets_devices(root: &Table) -> bool {
    matches!(root.get("parallel"), Some(Value::Table(t)) if t.contains_key("devices"))
}

fn read_process_count(key: &str, value: Value) -> Result<usize, RuntimeError> {
    let n = read_positive(key, value)?;
    if n > MAX_PS_PROCESSES {
        return Err(config_error(
            key,
            format!("{n} is out of range: it must be ≤ {MAX_PS_PROCESSES}"),
        ));
    }
    Ok(n)
}

fn read_bounded(key: &str, value: Value, low: u64, high: u64) -> Result<u64, RuntimeError> {
    let n = read_count(key, value)?;
    if n < low || n > high {
        return Err(config_error(
            key,
            format!("{n} is out of range: it must be between {low} and {high}"),
        ));
    }
    Ok(n)
}

/// A list of distinct, non-empty tensor names.
fn read_names(key: &str, value: Value) -> Result<Vec<String>, RuntimeError> {
    let Value::Array(items) = value else {
        return Err(config_error(
            key,
            format!("{value} is not a list of parameter names"),
        ));
    };
    let mut names: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::String(name) if !name.is_empty() && !names.contains(&name) => names.push(name),
            Value::String(name) if name.is_empty() => {
                return Err(config_error(key, "holds an empty parameter name"))
            }
            Value::String(name) => return Err(config_error(key, format!("names {name:?} twice"))),
            other => {
                return Err(config_error(
                    key,
                    format!("{other} is not a parameter name (a string)"),
                ))
            }
        }
    }
    Ok(names)
}

/// Reads `[ps]` (an empty table when absent) for a parameter-server run.
pub(super) fn read_ps(
    value: Option<Value>,
    model: ModelName,
    devices_given: bool,
    grad_accumulation_steps: usize,
    warnings: &mut Vec<String>,
) -> Result<PsKeys, RuntimeError> {
    if !matches!(
        model,
        ModelName::SeedMlp | ModelName::Gpt | ModelName::EmbeddingBag
    ) {
        return Err(config_error(
            "parallel.mode",
            format!(
                "\"{PARAMETER_SERVER_MODE}\" trains the seed MLP, the GPT or the embedding bag (model.name = \"seed_mlp\", \"gpt\" or \"embedding_bag\"), not model.name = \"{}\"",
                model.name()
            ),
        ));
    }
    if devices_given {
        return Err(config_error(
            "parallel.devices",
            format!("has no meaning in mode \"{PARAMETER_SERVER_MODE}\": each worker runs on one device; set ps.workers"),
        ));
    }
    if grad_accumulation_steps > 1 {
        return Err(config_error(
            "train.grad_accumulation_steps",
            format!("must be 1 in mode \"{PARAMETER_SERVER_MODE}\" (a worker pushes every batch's gradient)"),
        ));
    }
    let mut s = Section::new(
        "ps",
        value.unwrap_or_else(|| Value::Table(Table::new())),
        PS_KEYS,
    )?;
    let d = PsKeys::default();
    let staleness_given = s.has("staleness");
    let keys = PsKeys {
        servers: s.get("servers", read_process_count)?,
        workers: s.get("workers", read_process_count)?,
        sync: s.or("sync", d.sync, read_bool)?,
        staleness: s.or("staleness", d.staleness, |k, v| {
            read_bounded(k, v, 0, 1_000_000)
        })?,
        checkpoint_every: s.or("checkpoint_every", d.checkpoint_every, |k, v| {
            read_bounded(k, v, 1, 1_000_000_000)
        })?,
        heartbeat_ms: s.or("heartbeat_ms", d.heartbeat_ms, |k, v| {
            read_bounded(k, v, 10, 60_000)
        })?,
        dead_after_ms: s.or("dead_after_ms", d.dead_after_ms, |k, v| {
            read_bounded(k, v, 20, 3_600_000)
        })?,
        rpc_timeout_ms: s.or("rpc_timeout_ms", d.rpc_timeout_ms, |k, v| {
            read_bounded(k, v, 1, 3_600_000)
        })?,
        rpc_retries: s.or("rpc_retries", d.rpc_retries, |k, v| {
            read_bounded(k, v, 0, 100).map(|n| n as u32)
        })?,
        embedding_on_server: s.or("embedding_on_server", Vec::new(), read_names)?,
        worker_max_param_bytes: s.get("worker_max_param_bytes", |k, v| {
            read_bounded(k, v, 1, u64::MAX)
        })?,
    };
    if keys.dead_after_ms <= keys.heartbeat_ms {
        return Err(config_error(
            "ps.dead_after_ms",
            format!(
                "{} must be longer than ps.heartbeat_ms = {} (a live process would be declared dead between two heartbeats)",
                keys.dead_after_ms, keys.heartbeat_ms
            ),
        ));
    }
    if keys.sync && staleness_given {
        warnings.push(
            "ps.staleness has no effect with ps.sync = true (every step waits for all live workers)"
                .to_string(),
        );
    }
    Ok(keys)
}
