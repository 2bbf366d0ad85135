//! A node's side of a job spanning nodes (node rank ≥ 1): joins node 0's launcher at
//! `--master_addr:--master_port`, then runs the OpenMPI daemon commands node 0's `mpirun` sends
//! (the daemon starts this node's ranks and carries their output back to node 0), until node 0
//! says the job is over.
//!
//! The daemon runs in its own process group and is killed when this launcher ends (SIGKILL
//! included), when node 0 asks, when node 0 goes away, and on SIGINT or SIGTERM.

use std::io::{self, BufReader};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::wire::{self, Message, PROTOCOL};
use crate::launch::child::{signal_group, Event};
use crate::launch::Interrupted;

/// How long between attempts to reach node 0.
const RETRY: Duration = Duration::from_millis(200);

/// What this node tells node 0.
#[derive(Debug, Clone)]
pub struct Joining {
    /// `HOST:PORT` of node 0's launcher.
    pub master: String,
    /// `--node_rank`, if given.
    pub node_rank: Option<usize>,
    /// `--local_worker_num`.
    pub local_worker_num: usize,
    /// `--worker_num`.
    pub worker_num: usize,
}

/// Joins node 0 (trying until `deadline`), then serves its daemon commands; Ok when node 0
/// reports the job finished.
pub fn run(joining: &Joining, deadline: Instant) -> anyhow::Result<()> {
    let (stream, rank, nodes) = join(joining, deadline)?;
    eprintln!(
        "[launch] joined the job at {} as node {rank} of {nodes}; node 0 collects the ranks' logs",
        joining.master
    );
    serve(stream, rank)
}

/// Connects and says hello; the node rank and node count node 0 answered.
fn join(joining: &Joining, deadline: Instant) -> anyhow::Result<(TcpStream, usize, usize)> {
    let master = &joining.master;
    let mut last_error: Option<io::Error> = None;
    let mut stream = loop {
        let now = Instant::now();
        if now >= deadline {
            let why = last_error.map_or_else(|| "no answer".to_string(), |e| e.to_string());
            anyhow::bail!(
                "could not reach node 0's launcher at {master} within --cluster_time_out: {why}"
            );
        }
        let addrs: Vec<_> = match master.to_socket_addrs() {
            Ok(addrs) => addrs.collect(),
            Err(err) => {
                last_error = Some(err);
                std::thread::sleep(RETRY);
                continue;
            }
        };
        let attempt = addrs.iter().find_map(|addr| {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            match TcpStream::connect_timeout(addr, wait.min(Duration::from_secs(5))) {
                Ok(stream) => Some(stream),
                Err(err) => {
                    last_error = Some(err);
                    None
                }
            }
        });
        match attempt {
            Some(stream) => break stream,
            None => std::thread::sleep(RETRY),
        }
    };
    let hello = Message::Hello {
        protocol: PROTOCOL,
        node_rank: joining.node_rank,
        local_worker_num: joining.local_worker_num,
        worker_num: joining.worker_num,
    };
    wire::send(&mut stream, &hello).with_context(|| format!("cannot say hello to {master}"))?;
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    stream.set_read_timeout(Some(wait))?;
    let answer = wire::receive(&mut BufReader::new(&stream)).map_err(|err| match err.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => anyhow::anyhow!(
            "node 0's launcher at {master} did not answer within --cluster_time_out"
        ),
        _ => anyhow::anyhow!("{master} did not answer as node 0's launcher: {err}"),
    })?;
    stream.set_read_timeout(None)?;
    match answer {
        Some(Message::Welcome { node_rank, nodes }) => Ok((stream, node_rank, nodes)),
        Some(Message::Refused { reason }) => {
            anyhow::bail!("node 0's launcher at {master} refused this node: {reason}")
        }
        Some(Message::Done { message, .. }) => {
            anyhow::bail!("node 0's launcher at {master}: {message}")
        }
        Some(other) => anyhow::bail!("{master} answered {other:?} to a hello"),
        None => anyhow::bail!("{master} closed the connection without an answer"),
    }
}

/// The store's subdirectory under which this node's OpenMPI daemons keep their session files.
const SESSION_DIR: &str = "ompi-session";
/// OpenMPI's parameter naming the base of the session directories.
const SESSION_BASE_VAR: &str = "OMPI_MCA_orte_tmpdir_base";

/// The daemon this node runs, if any (its process id, which leads its process group).
type Daemon = Arc<Mutex<Option<libc::pid_t>>>;

/// Runs node 0's commands until it says the job is over.
fn serve(stream: TcpStream, rank: usize) -> anyhow::Result<()> {
    let daemon: Daemon = Arc::new(Mutex::new(None));
    // This node's in-memory store of elastic snapshots, kept over the job's attempts.
    let store = super::store::create()?;
    let signals = stop_on_signals(daemon.clone())?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let writer = Arc::new(Mutex::new(stream));
    let outcome = loop {
        match wire::receive(&mut reader) {
            Ok(Some(Message::Run { id, command })) => {
                // A daemon of an earlier launch still running is stopped first.
                kill_daemon(&daemon);
                if let Err(err) = start_daemon(id, &command, store.path(), &daemon, &writer) {
                    eprintln!("[launch] node {rank}: cannot start OpenMPI's daemon: {err}");
                    let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = wire::send(&mut *w, &Message::Exited { id, code: 127 });
                }
            }
            Ok(Some(Message::Kill)) => kill_daemon(&daemon),
            Ok(Some(Message::Done { ok, message })) => {
                break if ok {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!(
                        "the job failed (node 0 reports: {message})"
                    ))
                };
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                break Err(anyhow::anyhow!(
                    "lost node 0's launcher before the job ended; this node's ranks were stopped"
                ))
            }
        }
    };
    kill_daemon(&daemon);
    signals.close();
    outcome
}

/// Starts `command` (OpenMPI's daemon) under `sh -c`, with this node's elastic store in its
/// environment (its ranks inherit it), and a thread reporting its exit.
fn start_daemon(
    id: u64,
    command: &str,
    store: &std::path::Path,
    daemon: &Daemon,
    writer: &Arc<Mutex<TcpStream>>,
) -> io::Result<()> {
    if !command.split_whitespace().any(|w| w.ends_with("orted")) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "node 0 asked for a command that is not OpenMPI's daemon (orted)",
        ));
    }
    // OpenMPI's session directory (`<base>/ompi.<host>.<uid>/jf.<job family>`) is per host,
    // and daemons of several nodes on one machine race to create it ("File exists"): each node
    // keeps its own under its store, which a later launcher removes if this one is killed.
    let session = store.join(SESSION_DIR);
    std::fs::create_dir_all(&session)?;
    let mut child = Command::new("/bin/sh");
    child
        .arg("-c")
        .arg(command)
        .env(runtime::elastic::STORE_VAR, store)
        .env(SESSION_BASE_VAR, &session)
        .stdin(Stdio::null())
        .process_group(0);
    ps::launch::die_with_parent(&mut child);
    let mut child = child.spawn()?;
    let pid = libc::pid_t::try_from(child.id()).map_err(io::Error::other)?;
    *daemon.lock().unwrap_or_else(|p| p.into_inner()) = Some(pid);
    let daemon = daemon.clone();
    let writer = writer.clone();
    std::thread::Builder::new()
        .name("launch-daemon".into())
        .spawn(move || {
            let code = match child.wait() {
                Ok(status) => exit_code(status),
                Err(_) => 255,
            };
            let mut slot = daemon.lock().unwrap_or_else(|p| p.into_inner());
            if *slot == Some(pid) {
                *slot = None;
            }
            drop(slot);
            let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
            let _ = wire::send(&mut *w, &Message::Exited { id, code });
        })?;
    Ok(())
}

/// The shell's convention: the exit code, or 128 + the signal.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255)
}

/// SIGTERM to the daemon's group, SIGKILL after a second if it is still there.
fn kill_daemon(daemon: &Daemon) {
    let Some(pid) = *daemon.lock().unwrap_or_else(|p| p.into_inner()) else {
        return;
    };
    signal_group(pid, libc::SIGTERM);
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        if daemon.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_group(pid, libc::SIGKILL);
}

/// On SIGINT or SIGTERM: stops the daemon and exits with 128 + the signal.
fn stop_on_signals(daemon: Daemon) -> anyhow::Result<signal_hook::iterator::Handle> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let handle = crate::launch::forward_signals(sender)?;
    std::thread::Builder::new()
        .name("launch-stop".into())
        .spawn(move || {
            if let Ok(Event::Signal(signal)) = receiver.recv() {
                kill_daemon(&daemon);
                eprintln!("error: {}", Interrupted(signal));
                std::process::exit(128 + signal);
            }
        })
        .context("cannot start the signal thread")?;
    Ok(handle)
}
