//! The `local` backend: ranks are threads of one process that exchange through shared memory.
//!
//! [`LocalCluster`] starts the ranks and hands each its [`LocalComm`]. The collectives are in
//! `algo`, the shared state and the zero-copy publication protocol in `shared`, waiting with
//! deadlines in `wait`.

mod algo;
mod shared;
mod stream_copy;
mod wait;

pub use self::wait::thread_wait_time;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use self::shared::{
    Arrival, Cluster, GroupShared, Lease, OpKind, Publication, PublishGuard, RankPresence,
    Registry, Slot,
};
use self::wait::{block_on, Doorbell, Poll};
use crate::buf::{Buf, BufMut};
use crate::communicator::{Communicator, Tag, MAX_TAG};
use crate::error::{CommError, PeerFailure, Site};
use crate::op::ReduceOp;

const BACKEND: &str = "local";

/// Starts `n` ranks as threads of this process, each with a [`LocalComm`] over the world group.
///
/// ```
/// use comm::{Communicator, CommunicatorExt, LocalCluster, ReduceOp};
/// let results = LocalCluster::new(3)?.run(|comm| {
///     let mut x = vec![comm.rank() as f32; 4];
///     comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
///     Ok::<_, comm::CommError>(x)
/// });
/// for r in results {
///     assert_eq!(r??, vec![3.0; 4]);
/// }
/// # Ok::<(), comm::CommError>(())
/// ```
#[derive(Debug, Clone)]
pub struct LocalCluster {
    n_ranks: usize,
    timeout: Duration,
}

impl LocalCluster {
    /// The timeout unless [`with_timeout`](LocalCluster::with_timeout) sets another.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

    /// A cluster of `n_ranks` ranks (at least one).
    pub fn new(n_ranks: usize) -> Result<LocalCluster, CommError> {
        if n_ranks == 0 {
            return Err(CommError::Setup {
                backend: BACKEND,
                reason: "a cluster needs at least one rank".to_string(),
            });
        }
        Ok(LocalCluster {
            n_ranks,
            timeout: LocalCluster::DEFAULT_TIMEOUT,
        })
    }

    /// Sets how long any single wait may last before the call fails with
    /// [`CommError::Timeout`].
    pub fn with_timeout(mut self, timeout: Duration) -> LocalCluster {
        self.timeout = timeout;
        self
    }

    /// The number of ranks.
    pub fn n_ranks(&self) -> usize {
        self.n_ranks
    }

    /// One world communicator per rank, for callers that run the ranks on threads of their own
    /// (each must go to a different thread).
    pub fn comms(&self) -> Vec<LocalComm> {
        let cluster = Arc::new(Cluster {
            timeout: self.timeout,
            doorbell: Doorbell::new(self.n_ranks),
            registry: Mutex::new(Registry {
                next_id: 1,
                ..Default::default()
            }),
            ranks: (0..self.n_ranks).map(|_| RankPresence::default()).collect(),
        });
        let world = Arc::new(GroupShared::new(0, (0..self.n_ranks).collect()));
        (0..self.n_ranks)
            .map(|rank| LocalComm::new(cluster.clone(), world.clone(), rank))
            .collect()
    }

    /// Runs `f` on every rank, each on its own thread with its world communicator, and returns
    /// each rank's result in rank order; a rank whose closure panicked gets
    /// [`CommError::RankPanicked`]. When a closure returns or panics its communicator is
    /// dropped, and peers still waiting on that rank fail with [`CommError::PeerFailed`].
    pub fn run<R, F>(&self, f: F) -> Vec<Result<R, CommError>>
    where
        R: Send,
        F: Fn(LocalComm) -> R + Sync,
    {
        let f = &f;
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .comms()
                .into_iter()
                .enumerate()
                .map(|(rank, comm)| {
                    std::thread::Builder::new()
                        .name(format!("tessera-rank-{rank}"))
                        .spawn_scoped(scope, move || f(comm))
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(rank, handle)| match handle {
                    Err(err) => Err(CommError::Setup {
                        backend: BACKEND,
                        reason: format!("cannot start the thread of rank {rank}: {err}"),
                    }),
                    Ok(handle) => handle.join().map_err(|payload| CommError::RankPanicked {
                        rank,
                        message: panic_message(payload.as_ref()),
                    }),
                })
                .collect()
        })
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a non-string panic payload)".to_string()
    }
}

/// One rank's communicator over one group of a local cluster.
///
/// Calls on one `LocalComm` are serialised (a second thread calling concurrently waits for the
/// first call to finish). Dropping it tells the peers this rank has left the group.
pub struct LocalComm {
    cluster: Arc<Cluster>,
    group: Arc<GroupShared>,
    rank: usize,
    state: Mutex<EndpointState>,
}

#[derive(Debug, Default)]
struct EndpointState {
    /// The last step this rank used; every collective advances it by the same amount on
    /// every member.
    step: u64,
    poisoned: Option<String>,
    /// How many groups with these members (world ranks) were created from this one.
    groups_made: HashMap<Vec<usize>, u64>,
}

impl fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalComm")
            .field("group", &self.group.label)
            .field("rank", &self.rank)
            .field("size", &self.group.members.len())
            .finish()
    }
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        self.slot().close(panicking, &self.cluster.doorbell);
        self.presence().leave(panicking, &self.cluster.doorbell);
    }
}

impl LocalComm {
    fn new(cluster: Arc<Cluster>, group: Arc<GroupShared>, rank: usize) -> LocalComm {
        cluster.ranks[group.members[rank]].enter();
        LocalComm {
            cluster,
            group,
            rank,
            state: Mutex::new(EndpointState::default()),
        }
    }

    fn slot(&self) -> &Slot {
        &self.group.slots[self.rank]
    }

    /// This rank's presence in the cluster.
    fn presence(&self) -> &RankPresence {
        &self.cluster.ranks[self.group.members[self.rank]]
    }

    fn lock(&self) -> MutexGuard<'_, EndpointState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one call: refuses it on a poisoned communicator, and poisons it (telling the peers)
    /// when the call fails after communicating.
    fn call<R>(
        &self,
        op: &'static str,
        kind: OpKind,
        body: impl FnOnce(&mut Ctx<'_>) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        let mut state = self.lock();
        if let Some(first_error) = &state.poisoned {
            return Err(CommError::Poisoned {
                site: self.site(op),
                first_error: first_error.clone(),
            });
        }
        let mut ctx = Ctx {
            comm: self,
            op,
            kind,
            step: state.step,
        };
        let result = body(&mut ctx);
        state.step = ctx.step;
        if let Err(err) = &result {
            if err.poisons() {
                state.poisoned = Some(err.to_string());
                self.slot().abort(err.to_string(), &self.cluster.doorbell);
            }
        }
        result
    }
}

/// One call in progress: the site for errors, the collective and the step counter.
struct Ctx<'a> {
    comm: &'a LocalComm,
    op: &'static str,
    kind: OpKind,
    step: u64,
}

impl<'a> Ctx<'a> {
    fn size(&self) -> usize {
        self.comm.group.members.len()
    }

    fn rank(&self) -> usize {
        self.comm.rank
    }

    fn site(&self) -> Site {
        self.comm.site(self.op)
    }

    fn invalid(&self, reason: String) -> CommError {
        CommError::InvalidArgument {
            site: self.site(),
            reason,
        }
    }

    fn mismatch(&self, peer: usize, reason: String) -> CommError {
        CommError::Mismatch {
            site: self.site(),
            peer,
            reason,
        }
    }

    fn slot(&self, rank: usize) -> &'a Slot {
        &self.comm.group.slots[rank]
    }

    /// Why `peer` (a group rank) can no longer take part: it left or abandoned this group, or
    /// it dropped every communicator it had, so it will never join this group's calls even
    /// when it never joined the group itself.
    fn peer_failure(&self, peer: usize) -> Option<PeerFailure> {
        let world_rank = self.comm.group.members[peer];
        self.slot(peer)
            .failure()
            .or_else(|| self.comm.cluster.ranks[world_rank].failure())
    }

    /// Reserves the next step number.
    fn next_step(&mut self) -> u64 {
        self.step += 1;
        self.step
    }

    fn arrive(&self, step: u64) {
        self.slot(self.rank())
            .arrive(step, self.kind, &self.comm.cluster.doorbell);
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.comm.cluster.timeout
    }

    fn peer_failed(&self, peer: usize, cause: PeerFailure) -> CommError {
        CommError::PeerFailed {
            site: self.site(),
            peer,
            cause,
        }
    }

    /// Waits until every rank in `peers` reached `step` of this collective. Fails at once when
    /// one of them failed (naming a peer that panicked or left in preference to one that only
    /// gave up because of another) or is in a different collective.
    fn wait_for(&self, peers: &[usize], step: u64) -> Result<(), CommError> {
        let done = block_on(&self.comm.cluster.doorbell, self.deadline(), || {
            let mut pending = false;
            let mut failed: Option<(usize, PeerFailure)> = None;
            for &peer in peers {
                let slot = self.slot(peer);
                let arrival = slot.arrival(step, self.kind);
                if arrival == Arrival::Arrived {
                    continue;
                }
                match self.peer_failure(peer) {
                    // A peer that arrived and then left is fine: check arrival again.
                    Some(_) if slot.arrival(step, self.kind) == Arrival::Arrived => {}
                    Some(cause) => {
                        let root_cause = !matches!(cause, PeerFailure::Aborted(_));
                        if failed.is_none() || root_cause {
                            failed = Some((peer, cause));
                        }
                        if root_cause {
                            break;
                        }
                    }
                    None => match arrival {
                        Arrival::Elsewhere(theirs) => {
                            return Err(self.mismatch(
                                peer,
                                format!(
                                    "it is in {theirs:?} while this rank is in {:?}",
                                    self.kind
                                ),
                            ))
                        }
                        _ => pending = true,
                    },
                }
            }
            match failed {
                Some((peer, cause)) => Err(self.peer_failed(peer, cause)),
                None if pending => Ok(Poll::Pending),
                None => Ok(Poll::Ready(())),
            }
        })?;
        done.ok_or_else(|| CommError::Timeout {
            site: self.site(),
            timeout: self.comm.cluster.timeout,
            waiting_for: peers
                .iter()
                .copied()
                .filter(|&p| self.slot(p).arrival(step, self.kind) != Arrival::Arrived)
                .collect(),
        })
    }

    /// Waits until every member reached `step`.
    fn wait_all(&self, step: u64) -> Result<(), CommError> {
        let peers: Vec<usize> = (0..self.size()).filter(|&p| p != self.rank()).collect();
        self.wait_for(&peers, step)
    }

    /// Lends `publication` to the peers for `step` and announces arrival at `step`.
    ///
    /// # Safety
    /// As [`Slot::publish`].
    unsafe fn publish(&self, publication: Publication, step: u64) -> PublishGuard<'a> {
        let guard = self
            .slot(self.rank())
            .publish(publication, step, &self.comm.cluster.doorbell);
        self.arrive(step);
        guard
    }

    /// A lease on `peer`'s publication for `step` (which the caller saw it reach in this
    /// collective, so it lent a buffer). A publication already revoked means the peer's call is
    /// failing: wait (briefly) for it to say why.
    fn lease(&self, peer: usize, step: u64) -> Result<Lease<'a>, CommError> {
        let slot = self.slot(peer);
        if let Some(lease) = slot.lease(step) {
            return Ok(lease);
        }
        let cause = block_on(&self.comm.cluster.doorbell, self.deadline(), || {
            Ok::<_, CommError>(self.peer_failure(peer).map_or(Poll::Pending, Poll::Ready))
        })?;
        Err(match cause {
            Some(cause) => self.peer_failed(peer, cause),
            None => CommError::Timeout {
                site: self.site(),
                timeout: self.comm.cluster.timeout,
                waiting_for: vec![peer],
            },
        })
    }

    /// A lease on `peer`'s publication, checked to come from the same kind of call with the
    /// same dtype and reduction.
    fn lease_matching(
        &self,
        peer: usize,
        step: u64,
        mine: &Publication,
    ) -> Result<Lease<'a>, CommError> {
        let lease = self.lease(peer, step)?;
        let theirs = &lease.publication;
        if theirs.kind != mine.kind || theirs.dtype != mine.dtype || theirs.reduce != mine.reduce {
            return Err(self.mismatch(
                peer,
                format!(
                    "it called {:?} ({:?}, {:?}) but this rank {:?} ({:?}, {:?})",
                    theirs.kind, theirs.dtype, theirs.reduce, mine.kind, mine.dtype, mine.reduce
                ),
            ));
        }
        Ok(lease)
    }
}

impl Communicator for LocalComm {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.group.members.len()
    }

    fn label(&self) -> &str {
        &self.group.label
    }

    fn timeout(&self) -> Duration {
        self.cluster.timeout
    }

    fn group(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        let mut state = self.lock();
        let site = || self.site("group");
        if let Some(first_error) = &state.poisoned {
            return Err(CommError::Poisoned {
                site: site(),
                first_error: first_error.clone(),
            });
        }
        let invalid = |reason: String| CommError::InvalidArgument {
            site: site(),
            reason,
        };
        if let Some(&bad) = ranks.iter().find(|&&r| r >= self.size()) {
            return Err(invalid(format!(
                "rank {bad} in {ranks:?} is outside the group (size {})",
                self.size()
            )));
        }
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid(format!("ranks {ranks:?} repeat a rank")));
        }
        let new_rank = ranks
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| invalid(format!("this rank is not in {ranks:?}")))?;
        let members: Vec<usize> = ranks.iter().map(|&r| self.group.members[r]).collect();
        let instance = state.groups_made.entry(members.clone()).or_insert(0);
        let key = (self.group.id, members.clone(), *instance);
        *instance += 1;
        let mut registry = self
            .cluster
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let registry = &mut *registry;
        let entry = registry.pending.entry(key.clone()).or_insert_with(|| {
            registry.next_id += 1;
            (
                Arc::new(GroupShared::new(registry.next_id, members.clone())),
                members.len(),
            )
        });
        let group = entry.0.clone();
        entry.1 -= 1;
        if entry.1 == 0 {
            registry.pending.remove(&key);
        }
        Ok(Box::new(LocalComm::new(
            self.cluster.clone(),
            group,
            new_rank,
        )))
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.call("barrier", OpKind::Barrier, |ctx| {
            let step = ctx.next_step();
            ctx.arrive(step);
            ctx.wait_all(step)
        })
    }

    fn broadcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<(), CommError> {
        self.call("broadcast", OpKind::Broadcast, |ctx| {
            algo::broadcast(ctx, buf, root)
        })
    }

    fn all_reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        self.call("all_reduce", OpKind::AllReduce, |ctx| {
            algo::all_reduce(ctx, buf, op, algo::Order::RankOrder)
        })
    }

    fn all_reduce_deterministic_buf(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        self.call(
            "all_reduce_deterministic",
            OpKind::AllReduceDeterministic,
            |ctx| algo::all_reduce(ctx, buf, op, algo::Order::CanonicalTree),
        )
    }

    fn reduce_scatter_v(
        &self,
        send: Buf<'_>,
        recv: BufMut<'_>,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.call("reduce_scatter", OpKind::ReduceScatter, |ctx| {
            algo::reduce_scatter(ctx, send, recv, counts, op)
        })
    }

    fn reduce_scatter_rows(
        &self,
        send: Buf<'_>,
        recv: BufMut<'_>,
        rows: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.call("reduce_scatter_rows", OpKind::ReduceScatter, |ctx| {
            algo::reduce_scatter_rows(ctx, send, recv, rows, op)
        })
    }

    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        self.call("all_gather", OpKind::AllGather, |ctx| {
            if recv.len() != send.len() * ctx.size() {
                return Err(ctx.invalid(format!(
                    "recv has {} bytes but {} ranks × {} bytes sent need {}",
                    recv.len(),
                    ctx.size(),
                    send.len(),
                    send.len() * ctx.size()
                )));
            }
            algo::all_gather(ctx, send, recv, &vec![send.len(); ctx.size()])
        })
    }

    fn all_gather_visit(
        &self,
        send: &[u8],
        visit: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), CommError> {
        self.call("all_gather_visit", OpKind::AllGather, |ctx| {
            algo::all_gather_visit(ctx, send, visit)
        })
    }

    fn all_gather_v_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
    ) -> Result<(), CommError> {
        self.call("all_gather_v", OpKind::AllGather, |ctx| {
            algo::all_gather(ctx, send, recv, counts)
        })
    }

    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        self.call("all_to_all", OpKind::AllToAll, |ctx| {
            let n = ctx.size();
            if !send.len().is_multiple_of(n) || recv.len() != send.len() {
                return Err(ctx.invalid(format!(
                    "send ({} bytes) must divide into {n} equal chunks and recv ({} bytes) \
                     match it",
                    send.len(),
                    recv.len()
                )));
            }
            let counts = vec![send.len() / n; n];
            algo::all_to_all(ctx, send, &counts, recv, &counts)
        })
    }

    fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        self.call("all_to_all_v", OpKind::AllToAll, |ctx| {
            algo::all_to_all(ctx, send, send_counts, recv, recv_counts)
        })
    }

    fn send_bytes(&self, dst: usize, tag: Tag, data: &[u8]) -> Result<(), CommError> {
        self.call("send", OpKind::PointToPoint, |ctx| {
            check_p2p(ctx, dst, tag)?;
            let slot = ctx.slot(dst);
            if let Some(cause) = ctx.peer_failure(dst) {
                return Err(ctx.peer_failed(dst, cause));
            }
            slot.mailbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry((ctx.rank(), tag))
                .or_default()
                .push_back(data.to_vec());
            self.cluster.doorbell.ring();
            Ok(())
        })
    }

    fn recv_bytes(&self, src: usize, tag: Tag) -> Result<Vec<u8>, CommError> {
        self.call("recv", OpKind::PointToPoint, |ctx| {
            check_p2p(ctx, src, tag)?;
            let mailbox = &ctx.slot(ctx.rank()).mailbox;
            let take = || {
                mailbox
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(&(src, tag))
                    .and_then(|queue| queue.pop_front())
            };
            let got = block_on(&self.cluster.doorbell, ctx.deadline(), || {
                if let Some(message) = take() {
                    return Ok(Poll::Ready(message));
                }
                match ctx.peer_failure(src) {
                    // A sender that sent and then left: its message may have landed meanwhile.
                    Some(cause) => take()
                        .map(Poll::Ready)
                        .ok_or_else(|| ctx.peer_failed(src, cause)),
                    None => Ok(Poll::Pending),
                }
            })?;
            got.ok_or_else(|| CommError::Timeout {
                site: ctx.site(),
                timeout: self.cluster.timeout,
                waiting_for: vec![src],
            })
        })
    }
}

fn check_p2p(ctx: &Ctx<'_>, peer: usize, tag: Tag) -> Result<(), CommError> {
    if peer >= ctx.size() {
        return Err(ctx.invalid(format!(
            "peer rank {peer} is outside the group (size {})",
            ctx.size()
        )));
    }
    if tag > MAX_TAG {
        return Err(ctx.invalid(format!("tag {tag} is above the maximum {MAX_TAG}")));
    }
    Ok(())
}
