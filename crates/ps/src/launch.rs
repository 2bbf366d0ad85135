//! `tessera train ps.toml` without a launcher: this process starts the scheduler, the servers
//! and the workers as child processes of the same command line, with the process contract's
//! environment, on 127.0.0.1.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command};

use crate::error::PsError;

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
/// workers: rank 0 is the scheduler, then the servers, then the workers.
pub fn role_env(
    rank: usize,
    servers: usize,
    workers: usize,
    scheduler_addr: &str,
) -> Vec<(String, String)> {
    let (role, id_var, id) = if rank == 0 {
        ("scheduler", None, 0)
    } else if rank <= servers {
        ("server", Some("TESSERA_SERVER_ID"), rank - 1)
    } else {
        ("worker", Some("TESSERA_WORKER_ID"), rank - 1 - servers)
    };
    let mut env = vec![
        ("TESSERA_ROLE".to_string(), role.to_string()),
        ("TESSERA_RANK".to_string(), rank.to_string()),
        (
            "TESSERA_WORLD_SIZE".to_string(),
            (1 + servers + workers).to_string(),
        ),
        ("TESSERA_NUM_SERVERS".to_string(), servers.to_string()),
        ("TESSERA_NUM_WORKERS".to_string(), workers.to_string()),
        (
            "TESSERA_SCHEDULER_ADDR".to_string(),
            scheduler_addr.to_string(),
        ),
        ("TESSERA_RESTART_COUNT".to_string(), "0".to_string()),
    ];
    if let Some(var) = id_var {
        env.push((var.to_string(), id.to_string()));
    }
    env
}

/// Starts every role of a `servers` × `workers` job as a child running `program` with `args`,
/// and waits for all; fails naming the first role that failed.
pub fn run_local_job(
    program: &Path,
    args: &[String],
    servers: usize,
    workers: usize,
) -> Result<(), PsError> {
    let addr = format!("127.0.0.1:{}", free_local_port()?);
    let mut children: Vec<(String, Child)> = Vec::new();
    for rank in 0..1 + servers + workers {
        let env = role_env(rank, servers, workers, &addr);
        let name = format!(
            "{} (rank {rank})",
            env.first().map(|(_, v)| v.as_str()).unwrap_or("?")
        );
        let child = Command::new(program)
            .args(args)
            .envs(env)
            .spawn()
            .map_err(|e| PsError::io(format!("starting {name} ({})", program.display()), e))?;
        children.push((name, child));
    }
    let mut failed = Vec::new();
    for (name, mut child) in children {
        match child.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => failed.push(format!("{name} exited with {status}")),
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(PsError::io("the parameter-server job", failed.join("; "))),
    }
}
