//! Node 0's side of a job spanning nodes: waits on `--master_addr:--master_port` for every other
//! node's launcher to join, then relays OpenMPI's daemon launches to them.
//!
//! `mpirun` on node 0 reaches the other nodes through its remote-shell agent, which is
//! `tessera launch-agent` ([`super::agent`]): each agent asks this relay, over a Unix socket in
//! a private directory, to run `mpirun`'s daemon command on node `tessera-node-<k>`; the relay
//! hands the command to node k's launcher and the daemon's exit code back to the agent. When the
//! agent goes away first (`mpirun` stopped it), the node is told to kill the daemon. A node
//! whose launcher went away can be replaced before the job starts again: the same command
//! started anew on it (or on another machine) joins in its place.

use std::collections::BTreeMap;
use std::io::{self, BufReader};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// The agent waiting for this node's daemon to end, with its launch's id.
    agent: Mutex<Option<(u64, UnixStream)>>,
    /// False once the node's launcher went away.
    alive: AtomicBool,
}

impl NodeLink {
    /// Whether the node's end of the connection is closed: the node shut it down (a FIN,
    /// reported even while its last messages still wait unread for the watcher) or it failed.
    /// Asked of the kernel without reading and without changing the socket's mode.
    fn closed(&self) -> bool {
        use std::os::fd::AsRawFd;
        let writer = lock(&self.writer);
        let mut poll = libc::pollfd {
            fd: writer.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd for the socket `writer` keeps open while the lock
        // is held; a timeout of 0 returns at once.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        ready > 0 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    fn new(stream: TcpStream) -> Arc<NodeLink> {
        Arc::new(NodeLink {
            writer: Mutex::new(stream),
            agent: Mutex::new(None),
            alive: AtomicBool::new(true),
        })
    }
}

/// The id of the next daemon launch.
static NEXT_LAUNCH: AtomicU64 = AtomicU64::new(1);

/// Node k's link under key k.
type Links = Arc<Mutex<BTreeMap<usize, Arc<NodeLink>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The joined nodes, and the relay's socket for the agents.
#[derive(Debug)]
pub struct Cluster {
    links: Links,
    listener: TcpListener,
    shape: Shape,
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
        let links: Links = Arc::new(Mutex::new(BTreeMap::new()));
        let dir = tempfile::Builder::new()
            .prefix("tessera-launch-")
            .tempdir()
            .context("cannot create the launcher's private directory")?;
        let socket = dir.path().join("agent.sock");
        let agents = UnixListener::bind(&socket)
            .with_context(|| format!("cannot listen on {}", socket.display()))?;
        let cluster = Cluster {
            links: links.clone(),
            listener,
            shape,
            dir,
            socket,
        };
        cluster.admit((1..shape.nodes).collect(), deadline, &|| None)?;
        std::thread::Builder::new()
            .name("launch-agents".into())
            .spawn(move || {
                for stream in agents.incoming().flatten() {
                    let links = links.clone();
                    let _ = std::thread::Builder::new()
                        .name("launch-agent".into())
                        .spawn(move || relay(stream, &links));
                }
            })?;
        Ok(cluster)
    }

    /// The node ranks whose launcher went away: marked so by their watcher, or found closed
    /// now (a launcher killed with its ranks has closed its connection before `mpirun` reports
    /// the job's failure, but its watcher thread may not have run yet).
    pub fn lost(&self) -> Vec<usize> {
        lock(&self.links)
            .iter()
            .filter(|(_, l)| {
                if l.alive.load(Ordering::SeqCst) && l.closed() {
                    l.alive.store(false, Ordering::SeqCst);
                }
                !l.alive.load(Ordering::SeqCst)
            })
            .map(|(k, _)| *k)
            .collect()
    }

    /// Waits (until `deadline`) for launchers to join in place of the lost nodes (the same
    /// command started again on those nodes, or on replacements).
    ///
    /// `interrupted` is polled while it waits: a signal it returns ends the wait at once with
    /// [`Interrupted`](crate::launch::Interrupted) (the launcher then exits 128 + the signal).
    pub fn replace_lost(
        &self,
        deadline: Instant,
        interrupted: &dyn Fn() -> Option<i32>,
    ) -> anyhow::Result<()> {
        let lost = self.lost();
        if lost.is_empty() {
            return Ok(());
        }
        eprintln!(
            "[launch] waiting for node(s) {} to join again (--cluster_time_out)",
            names(&lost)
        );
        self.admit(lost, deadline, interrupted)
    }

    /// Admits a launcher for each of the node ranks `open` until all joined, `deadline`, or a
    /// signal from `interrupted`.
    fn admit(
        &self,
        open: Vec<usize>,
        deadline: Instant,
        interrupted: &dyn Fn() -> Option<i32>,
    ) -> anyhow::Result<()> {
        let mut waiting = open;
        while !waiting.is_empty() {
            if let Some(signal) = interrupted() {
                eprintln!("[launch] got signal {signal}; no longer waiting for the nodes");
                return Err(crate::launch::Interrupted(signal).into());
            }
            if Instant::now() >= deadline {
                let message = format!(
                    "node rank(s) {} of {} did not join within --cluster_time_out",
                    names(&waiting),
                    self.shape.nodes
                );
                self.finish(false, &message);
                anyhow::bail!("{message}; the job was not started");
            }
            match self.listener.accept() {
                Ok((stream, peer)) => match admit_one(stream, self.shape, &waiting, deadline) {
                    Ok((rank, stream)) => {
                        waiting.retain(|&k| k != rank);
                        let link = NodeLink::new(stream);
                        watch_node(rank, link.clone())?;
                        lock(&self.links).insert(rank, link);
                        eprintln!(
                            "[launch] node {rank} joined ({} of {} nodes)",
                            self.shape.nodes - waiting.len(),
                            self.shape.nodes
                        );
                    }
                    Err(err) => eprintln!("[launch] refused a node launcher from {peer}: {err}"),
                },
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(err) => return Err(err).context("cannot accept a node launcher"),
            }
        }
        Ok(())
    }

    /// The Unix socket the agents connect to (`TESSERA_LAUNCH_AGENT_SOCKET`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The launcher's private directory (0700), where the host file goes.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Tells every joined node to stop its daemon (before the job starts again: a daemon of
    /// the attempt that failed must not outlive it).
    pub fn kill_daemons(&self) {
        for link in lock(&self.links).values() {
            lock(&link.agent).take();
            let _ = wire::send(&mut *lock(&link.writer), &Message::Kill);
        }
    }

    /// Tells every joined node the job is over.
    pub fn finish(&self, ok: bool, message: &str) {
        for link in lock(&self.links).values() {
            let done = Message::Done {
                ok,
                message: message.to_string(),
            };
            let _ = wire::send(&mut *lock(&link.writer), &done);
        }
    }
}

/// `1, 3`.
fn names(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads one node's hello and welcomes it as one of the `open` node ranks, or refuses it.
fn admit_one(
    mut stream: TcpStream,
    shape: Shape,
    open: &[usize],
    deadline: Instant,
) -> anyhow::Result<(usize, TcpStream)> {
    stream.set_nonblocking(false)?;
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(100), Duration::from_secs(10));
    stream.set_read_timeout(Some(wait))?;
    let hello = wire::receive(&mut BufReader::new(&stream))?;
    let verdict = match hello {
        Some(Message::Hello {
            protocol,
            node_rank,
            local_worker_num,
            worker_num,
        }) => check_hello(
            shape,
            open,
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
            let welcome = Message::Welcome {
                node_rank: rank,
                nodes: shape.nodes,
            };
            wire::send(&mut stream, &welcome)?;
            stream.set_read_timeout(None)?;
            Ok((rank, stream))
        }
        Err(reason) => {
            let refused = Message::Refused {
                reason: reason.clone(),
            };
            let _ = wire::send(&mut stream, &refused);
            anyhow::bail!("{reason}")
        }
    }
}

/// The node rank a hello gets (one of `open`), or why it is refused.
fn check_hello(
    shape: Shape,
    open: &[usize],
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
    match node_rank {
        None => open
            .first()
            .copied()
            .ok_or_else(|| "every node rank is taken".to_string()),
        Some(0) => Err("--node_rank 0 is node 0's own (the master's)".to_string()),
        Some(r) if r >= shape.nodes => Err(format!(
            "--node_rank {r} is not below the {} nodes of the job",
            shape.nodes
        )),
        Some(r) if !open.contains(&r) => Err(format!("node rank {r} has already joined")),
        Some(r) => Ok(r),
    }
}

/// Passes node `rank`'s daemon exits to the waiting agent; a lost node fails its agent and is
/// marked lost.
fn watch_node(rank: usize, link: Arc<NodeLink>) -> io::Result<()> {
    let stream = lock(&link.writer).try_clone()?;
    std::thread::Builder::new()
        .name(format!("launch-node {rank}"))
        .spawn(move || {
            let mut reader = BufReader::new(stream);
            loop {
                let (id, code, lost) = match wire::receive(&mut reader) {
                    Ok(Some(Message::Exited { id, code })) => (Some(id), code, false),
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => (None, 255, true),
                };
                if lost {
                    link.alive.store(false, Ordering::SeqCst);
                }
                let mut waiting = lock(&link.agent);
                // The exit of an earlier launch (a daemon of an attempt that ended) is not the
                // waiting agent's.
                if waiting
                    .as_ref()
                    .is_some_and(|(want, _)| id.is_none_or(|id| id == *want))
                {
                    let (_, mut agent) = waiting.take().expect("checked above");
                    drop(waiting);
                    if lost {
                        eprintln!("[launch] lost node {rank}'s launcher while its ranks ran");
                    }
                    let _ = wire::send(&mut agent, &Message::Exited { id: 0, code });
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
fn relay(agent: UnixStream, links: &Links) {
    let Ok(read_half) = agent.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let Ok(Some(Message::Launch { host, command })) = wire::receive(&mut reader) else {
        return;
    };
    let link = host_rank(&host).and_then(|r| lock(links).get(&r).cloned());
    let Some(link) = link.filter(|l| l.alive.load(Ordering::SeqCst)) else {
        let mut agent = agent;
        eprintln!("[launch] mpirun asked for node {host:?}, which has no launcher");
        let _ = wire::send(&mut agent, &Message::Exited { id: 0, code: 255 });
        return;
    };
    let id = NEXT_LAUNCH.fetch_add(1, Ordering::SeqCst);
    *lock(&link.agent) = Some((id, agent));
    if wire::send(&mut *lock(&link.writer), &Message::Run { id, command }).is_err() {
        if let Some((_, mut agent)) = lock(&link.agent).take() {
            let _ = wire::send(&mut agent, &Message::Exited { id: 0, code: 255 });
        }
        return;
    }
    // The agent says nothing more; its end (mpirun stopped it) closes the stream.
    let _ = wire::receive(&mut reader);
    let mut waiting = lock(&link.agent);
    if waiting.as_ref().is_some_and(|(want, _)| *want == id) {
        waiting.take();
        drop(waiting);
        let _ = wire::send(&mut *lock(&link.writer), &Message::Kill);
    }
}
