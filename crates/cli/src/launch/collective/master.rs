//! Node 0's side of a job spanning nodes: waits on `--master_addr:--master_port` for every other
//! node's launcher to join, then relays OpenMPI's daemon launches to them.
//!
//! `mpirun` on node 0 reaches the other nodes through its remote-shell agent, which is
//! `tessera launch-agent` ([`super::agent`]): each agent asks this relay, over a Unix socket in
//! a private directory, to run `mpirun`'s daemon command on node `tessera-node-<k>`; the relay
//! hands the command to node k's launcher and the daemon's exit code back to the agent. When the
//! agent goes away first (`mpirun` stopped it), the node is told to kill the daemon.

use std::collections::BTreeSet;
use std::io::{self, BufReader};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::wire::{self, Message, PROTOCOL};

/// The host name `mpirun` is given for node `rank` (`rank` ≥ 1; node 0 is `localhost`).
pub fn node_host(rank: usize) -> String {
    format!("tessera-node-{rank}")
}

/// The node rank in a host name of [`node_host`]'s form.
fn host_rank(host: &str) -> Option<usize> {
    host.strip_prefix("tessera-node-")?.parse().ok()
}

/// What node 0 expects of every node.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// `--worker_num`.
    pub worker_num: usize,
    /// `--local_worker_num` (the same on every node).
    pub local_worker_num: usize,
    /// Nodes in the job (`worker_num / local_worker_num`).
    pub nodes: usize,
}

/// One joined node's connection.
#[derive(Debug)]
struct NodeLink {
    writer: Mutex<TcpStream>,
    /// The agent waiting for this node's daemon to end.
    agent: Mutex<Option<UnixStream>>,
}

/// The joined nodes, and the relay's socket for the agents.
#[derive(Debug)]
pub struct Cluster {
    /// Node k's link at index k - 1.
    links: Vec<Arc<NodeLink>>,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Cluster {
    /// Waits (until `deadline`) on `listener` for nodes 1..nodes to join, then starts relaying.
    /// A hello that breaks the job's shape is refused with the reason (and the wait goes on);
    /// nodes missing at the deadline are named in the error, and the joined ones are told.
    pub fn gather(
        listener: TcpListener,
        shape: Shape,
        deadline: Instant,
    ) -> anyhow::Result<Cluster> {
        listener.set_nonblocking(true)?;
        let mut joined: Vec<Option<TcpStream>> = (1..shape.nodes).map(|_| None).collect();
        while joined.iter().any(Option::is_none) {
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<String> = joined
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.is_none())
                    .map(|(i, _)| (i + 1).to_string())
                    .collect();
                let message = format!(
                    "node rank(s) {} of {} did not join within --cluster_time_out",
                    missing.join(", "),
                    shape.nodes
                );
                for stream in joined.iter_mut().flatten() {
                    let done = Message::Done {
                        ok: false,
                        message: message.clone(),
                    };
                    let _ = wire::send(stream, &done);
                }
                anyhow::bail!("{message}; the job was not started");
            }
            match listener.accept() {
                Ok((stream, peer)) => {
                    if let Err(err) = admit(stream, shape, &mut joined, deadline) {
                        eprintln!("[launch] refused a node launcher from {peer}: {err}");
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(err) => return Err(err).context("cannot accept a node launcher"),
            }
        }
        let links: Vec<Arc<NodeLink>> = joined
            .into_iter()
            .flatten()
            .map(|stream| {
                Arc::new(NodeLink {
                    writer: Mutex::new(stream),
                    agent: Mutex::new(None),
                })
            })
            .collect();
        for (index, link) in links.iter().enumerate() {
            watch_node(index + 1, link.clone())?;
        }
        let dir = tempfile::Builder::new()
            .prefix("tessera-launch-")
            .tempdir()
            .context("cannot create the launcher's private directory")?;
        let socket = dir.path().join("agent.sock");
        let agents = UnixListener::bind(&socket)
            .with_context(|| format!("cannot listen on {}", socket.display()))?;
        let relay_links = links.clone();
        std::thread::Builder::new()
            .name("launch-agents".into())
            .spawn(move || {
                for stream in agents.incoming().flatten() {
                    let links = relay_links.clone();
                    let _ = std::thread::Builder::new()
                        .name("launch-agent".into())
                        .spawn(move || relay(stream, &links));
                }
            })?;
        Ok(Cluster { links, dir, socket })
    }

    /// The Unix socket the agents connect to (`TESSERA_LAUNCH_AGENT_SOCKET`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The launcher's private directory (0700), where the host file goes.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Tells every node the job is over.
    pub fn finish(&self, ok: bool, message: &str) {
        for link in &self.links {
            let mut writer = link.writer.lock().unwrap_or_else(|p| p.into_inner());
            let _ = wire::send(
                &mut *writer,
                &Message::Done {
                    ok,
                    message: message.to_string(),
                },
            );
        }
    }
}

/// Reads one node's hello and welcomes or refuses it.
fn admit(
    mut stream: TcpStream,
    shape: Shape,
    joined: &mut [Option<TcpStream>],
    deadline: Instant,
) -> anyhow::Result<()> {
    stream.set_nonblocking(false)?;
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    stream.set_read_timeout(Some(wait.min(Duration::from_secs(10))))?;
    let hello = wire::receive(&mut BufReader::new(&stream))?;
    let verdict = match hello {
        Some(Message::Hello {
            protocol,
            node_rank,
            local_worker_num,
            worker_num,
        }) => check_hello(
            shape,
            joined,
            protocol,
            node_rank,
            local_worker_num,
            worker_num,
        ),
        Some(other) => Err(format!("expected a hello, got {other:?}")),
        None => Err("the connection closed before a hello".to_string()),
    };
    match verdict {
        Ok(rank) => {
            wire::send(
                &mut stream,
                &Message::Welcome {
                    node_rank: rank,
                    nodes: shape.nodes,
                },
            )?;
            stream.set_read_timeout(None)?;
            eprintln!(
                "[launch] node {rank} joined ({} of {} nodes)",
                joined.iter().filter(|s| s.is_some()).count() + 2,
                shape.nodes
            );
            joined[rank - 1] = Some(stream);
            Ok(())
        }
        Err(reason) => {
            let _ = wire::send(
                &mut stream,
                &Message::Refused {
                    reason: reason.clone(),
                },
            );
            anyhow::bail!("{reason}")
        }
    }
}

/// The node rank a hello gets, or why it is refused.
fn check_hello(
    shape: Shape,
    joined: &[Option<TcpStream>],
    protocol: u32,
    node_rank: Option<usize>,
    local_worker_num: usize,
    worker_num: usize,
) -> Result<usize, String> {
    if protocol != PROTOCOL {
        return Err(format!(
            "launcher protocol {protocol}, node 0 speaks {PROTOCOL}: use the same tessera on every node"
        ));
    }
    if worker_num != shape.worker_num {
        return Err(format!(
            "--worker_num {worker_num}, node 0 has {}",
            shape.worker_num
        ));
    }
    if local_worker_num != shape.local_worker_num {
        return Err(format!(
            "--local_worker_num {local_worker_num}, node 0 has {} (every node runs the same number)",
            shape.local_worker_num
        ));
    }
    let free: BTreeSet<usize> = joined
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_none())
        .map(|(i, _)| i + 1)
        .collect();
    match node_rank {
        None => free
            .first()
            .copied()
            .ok_or_else(|| "every node rank is taken".to_string()),
        Some(0) => Err("--node_rank 0 is node 0's own (the master's)".to_string()),
        Some(r) if r >= shape.nodes => Err(format!(
            "--node_rank {r} is not below the {} nodes of the job",
            shape.nodes
        )),
        Some(r) if !free.contains(&r) => Err(format!("node rank {r} has already joined")),
        Some(r) => Ok(r),
    }
}

/// Passes node `rank`'s daemon exits to the waiting agent; a lost node fails its agent.
fn watch_node(rank: usize, link: Arc<NodeLink>) -> io::Result<()> {
    let stream = link
        .writer
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .try_clone()?;
    std::thread::Builder::new()
        .name(format!("launch-node {rank}"))
        .spawn(move || {
            let mut reader = BufReader::new(stream);
            loop {
                let (code, lost) = match wire::receive(&mut reader) {
                    Ok(Some(Message::Exited { code })) => (code, false),
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => (255, true),
                };
                let agent = link.agent.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(mut agent) = agent {
                    if lost {
                        eprintln!("[launch] lost node {rank}'s launcher while its ranks ran");
                    }
                    let _ = wire::send(&mut agent, &Message::Exited { code });
                }
                if lost {
                    return;
                }
            }
        })?;
    Ok(())
}

/// Serves one agent: hands its daemon command to the node it names and, if the agent goes away
/// before the daemon ended, tells the node to kill it.
fn relay(agent: UnixStream, links: &[Arc<NodeLink>]) {
    let Ok(read_half) = agent.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let Ok(Some(Message::Launch { host, command })) = wire::receive(&mut reader) else {
        return;
    };
    let link = match host_rank(&host).and_then(|r| links.get(r.checked_sub(1)?)) {
        Some(link) => link,
        None => {
            let mut agent = agent;
            eprintln!("[launch] mpirun asked for an unknown node {host:?}");
            let _ = wire::send(&mut agent, &Message::Exited { code: 255 });
            return;
        }
    };
    *link.agent.lock().unwrap_or_else(|p| p.into_inner()) = Some(agent);
    {
        let mut writer = link.writer.lock().unwrap_or_else(|p| p.into_inner());
        if wire::send(&mut *writer, &Message::Run { command }).is_err() {
            drop(writer);
            if let Some(mut agent) = link.agent.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let _ = wire::send(&mut agent, &Message::Exited { code: 255 });
            }
            return;
        }
    }
    // The agent says nothing more; its end (mpirun stopped it) closes the stream.
    let _ = wire::receive(&mut reader);
    let still_waiting = link.agent.lock().unwrap_or_else(|p| p.into_inner()).take();
    if still_waiting.is_some() {
        let mut writer = link.writer.lock().unwrap_or_else(|p| p.into_inner());
        let _ = wire::send(&mut *writer, &Message::Kill);
    }
}
