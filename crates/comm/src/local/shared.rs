//! The memory the ranks of one local cluster share: per-group slots, publications and leases.
//!
//! # The publication protocol
//! A collective never copies a buffer into a staging area. Each rank *publishes* a raw pointer
//! to its own buffer in its slot, tagged with the collective's step number; peers take a
//! [`Lease`] on the publication, read from (or, for all-reduce, write their own chunk into)
//! the buffer, and drop the lease. Before the owner returns from the call it *revokes* the
//! publication and waits until no lease is held. Leases are held only while copying, never
//! while waiting, so revocation is bounded by one chunk's copy time even when the call fails:
//! no peer can touch a buffer after the call that lent it has returned.
//!
//! Leases use the Dekker pattern on two sequentially consistent atomics: a reader increments
//! `readers` then checks `pub_step`; the owner clears `pub_step` then waits for `readers == 0`.
//! One of the two always sees the other.

use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tensor::DType;

use super::wait::Doorbell;
use crate::communicator::Tag;
use crate::error::PeerFailure;
use crate::op::ReduceOp;

/// State shared by all ranks of a [`crate::LocalCluster`] run.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) timeout: Duration,
    pub(crate) doorbell: Doorbell,
    pub(crate) registry: Mutex<Registry>,
    /// Every world rank's presence: a rank that dropped all its communicators has left every
    /// group, including the groups it never joined (whose slots alone would wait for it until
    /// the timeout).
    pub(crate) ranks: Vec<RankPresence>,
}

/// Whether a world rank still holds a communicator.
#[derive(Debug, Default)]
pub(crate) struct RankPresence {
    /// Its live communicators (the world's and every group's).
    comms: AtomicUsize,
    liveness: Liveness,
}

impl RankPresence {
    /// Counts a new communicator of this rank.
    pub(crate) fn enter(&self) {
        self.comms.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts a dropped communicator; the last one marks the rank gone (exited or panicked).
    pub(crate) fn leave(&self, panicking: bool, doorbell: &Doorbell) {
        if self.comms.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.liveness.close(panicking);
            doorbell.ring();
        }
    }

    /// Why the rank can no longer take part, once it has dropped every communicator.
    pub(crate) fn failure(&self) -> Option<PeerFailure> {
        self.liveness.failure()
    }
}

/// Groups being created: the first member to call `group` creates the shared state, the others
/// find it here under the same key.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(crate) next_id: u64,
    /// (parent group id, members as world ranks, how many times those members were grouped
    /// before on that parent) → the group and how many members have yet to fetch it.
    pub(crate) pending: HashMap<GroupKey, (std::sync::Arc<GroupShared>, usize)>,
}

/// (parent group id, members as world ranks, instance).
pub(crate) type GroupKey = (u64, Vec<usize>, u64);

/// Queued messages by (sender's group rank, tag), oldest first.
pub(crate) type Mailbox = HashMap<(usize, Tag), VecDeque<Vec<u8>>>;

/// The shared half of one group: a slot per member.
#[derive(Debug)]
pub(crate) struct GroupShared {
    pub(crate) id: u64,
    pub(crate) label: String,
    /// Members as world ranks, in group-rank order.
    pub(crate) members: Vec<usize>,
    pub(crate) slots: Vec<Slot>,
}

impl GroupShared {
    pub(crate) fn new(id: u64, members: Vec<usize>) -> GroupShared {
        let label = if id == 0 {
            "world".to_string()
        } else {
            let list: Vec<String> = members.iter().map(|m| m.to_string()).collect();
            format!("world[{}]", list.join(","))
        };
        GroupShared {
            id,
            label,
            slots: members.iter().map(|_| Slot::default()).collect(),
            members,
        }
    }
}

/// Which collective a rank is in; arrivals and publications carry it, so peers detect
/// mismatched calls instead of pairing steps of different collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum OpKind {
    Barrier,
    Broadcast,
    AllReduce,
    /// The canonical-tree all-reduce of deterministic mode.
    AllReduceDeterministic,
    ReduceScatter,
    AllGather,
    AllToAll,
    /// Send and receive (which never arrive at steps).
    PointToPoint,
}

impl OpKind {
    const ALL: [OpKind; 8] = [
        OpKind::Barrier,
        OpKind::Broadcast,
        OpKind::AllReduce,
        OpKind::AllReduceDeterministic,
        OpKind::ReduceScatter,
        OpKind::AllGather,
        OpKind::AllToAll,
        OpKind::PointToPoint,
    ];
}

/// Whether a member reached a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// It reached the step in the same collective, or went past it.
    Arrived,
    /// Not yet.
    NotYet,
    /// It reached the step in another collective.
    Elsewhere(OpKind),
}

/// What a rank lends to its peers for one step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Publication {
    pub(crate) kind: OpKind,
    pub(crate) dtype: Option<DType>,
    pub(crate) reduce: Option<ReduceOp>,
    pub(crate) ptr: *mut u8,
    /// Bytes at `ptr`.
    pub(crate) len: usize,
    /// Per-rank counts that go with the buffer (reduce-scatter, all-to-all-v), or empty.
    pub(crate) counts: *const usize,
    pub(crate) n_counts: usize,
}

impl Publication {
    pub(crate) fn new(kind: OpKind, ptr: *mut u8, len: usize) -> Publication {
        Publication {
            kind,
            dtype: None,
            reduce: None,
            ptr,
            len,
            counts: std::ptr::null(),
            n_counts: 0,
        }
    }

    /// The counts published with the buffer.
    ///
    /// # Safety
    /// Only while a lease on the publication is held.
    pub(crate) unsafe fn counts(&self) -> &[usize] {
        if self.n_counts == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(self.counts, self.n_counts)
        }
    }
}

const OPEN: u8 = 0;
const EXITED: u8 = 1;
const PANICKED: u8 = 2;
const ABORTED: u8 = 3;

/// One member's slot. Aligned to two cache lines so members do not false-share.
#[repr(align(128))]
#[derive(Debug)]
pub(crate) struct Slot {
    /// The last step this member reached (high 56 bits) and the collective it was in (low 8).
    arrived: AtomicU64,
    /// The step whose publication is valid, or 0.
    pub_step: AtomicU64,
    readers: AtomicUsize,
    publication: UnsafeCell<Publication>,
    liveness: Liveness,
    /// Point-to-point messages for this member, by (sender's group rank, tag).
    pub(crate) mailbox: Mutex<Mailbox>,
}

// SAFETY: `publication` is written only by the owner while `pub_step == 0` and no lease is held,
// and read only under a lease (see the module docs); every other field is atomic or locked.
unsafe impl Sync for Slot {}
// SAFETY: the raw pointers in `publication` are plain data; they are dereferenced only under the
// lease protocol.
unsafe impl Send for Slot {}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            arrived: AtomicU64::new(0),
            pub_step: AtomicU64::new(0),
            readers: AtomicUsize::new(0),
            publication: UnsafeCell::new(Publication::new(
                OpKind::Broadcast,
                std::ptr::null_mut(),
                0,
            )),
            liveness: Liveness::default(),
            mailbox: Mutex::new(HashMap::new()),
        }
    }
}

impl Slot {
    /// Records that the owner reached `step` of a `kind` collective.
    pub(crate) fn arrive(&self, step: u64, kind: OpKind, doorbell: &Doorbell) {
        self.arrived
            .store((step << 8) | kind as u64, Ordering::SeqCst);
        doorbell.ring();
    }

    /// Whether the owner reached `step` of a `kind` collective.
    pub(crate) fn arrival(&self, step: u64, kind: OpKind) -> Arrival {
        let word = self.arrived.load(Ordering::Acquire);
        let (theirs, their_kind) = (word >> 8, (word & 0xff) as u8);
        if theirs > step || (theirs == step && their_kind == kind as u8) {
            Arrival::Arrived
        } else if theirs < step {
            Arrival::NotYet
        } else {
            Arrival::Elsewhere(OpKind::ALL[usize::from(their_kind)])
        }
    }

    /// Lends a buffer for `step`. The returned guard revokes it when dropped.
    ///
    /// # Safety
    /// The buffer must stay valid for the guard's life, and the owner must not hold a Rust
    /// reference to the parts peers may write while the guard lives.
    pub(crate) unsafe fn publish<'a>(
        &'a self,
        publication: Publication,
        step: u64,
        doorbell: &'a Doorbell,
    ) -> PublishGuard<'a> {
        // No lease is held and `pub_step == 0` (the previous guard revoked): nobody reads it.
        *self.publication.get() = publication;
        self.pub_step.store(step, Ordering::SeqCst);
        PublishGuard {
            slot: self,
            doorbell,
        }
    }

    /// A lease on the publication for `step`, if the owner published one and has not revoked it.
    pub(crate) fn lease(&self, step: u64) -> Option<Lease<'_>> {
        self.readers.fetch_add(1, Ordering::SeqCst);
        if self.pub_step.load(Ordering::SeqCst) != step {
            self.readers.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        // SAFETY: `pub_step == step` was seen after registering as a reader, so the owner
        // finished writing the publication and cannot rewrite it before we deregister.
        let publication = unsafe { *self.publication.get() };
        Some(Lease {
            slot: self,
            publication,
        })
    }

    /// Why the owner can no longer take part, if so.
    pub(crate) fn failure(&self) -> Option<PeerFailure> {
        self.liveness.failure()
    }

    /// Marks the owner as gone after an error.
    pub(crate) fn abort(&self, reason: String, doorbell: &Doorbell) {
        self.liveness.abort(reason);
        doorbell.ring();
    }

    /// Marks the owner as gone because its communicator was dropped (while panicking or not).
    pub(crate) fn close(&self, panicking: bool, doorbell: &Doorbell) {
        self.liveness.close(panicking);
        doorbell.ring();
    }
}

/// Whether a member can still take part: open, or gone (exited, panicked, aborted with a
/// reason). Callers ring the doorbell after a change.
#[derive(Debug)]
struct Liveness {
    state: AtomicU8,
    abort_reason: Mutex<Option<String>>,
}

impl Default for Liveness {
    fn default() -> Liveness {
        Liveness {
            state: AtomicU8::new(OPEN),
            abort_reason: Mutex::new(None),
        }
    }
}

impl Liveness {
    fn failure(&self) -> Option<PeerFailure> {
        match self.state.load(Ordering::SeqCst) {
            OPEN => None,
            EXITED => Some(PeerFailure::Exited),
            PANICKED => Some(PeerFailure::Panicked),
            _ => Some(PeerFailure::Aborted(
                self.abort_reason
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_default(),
            )),
        }
    }

    fn abort(&self, reason: String) {
        *self.abort_reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
        self.state.store(ABORTED, Ordering::SeqCst);
    }

    /// Gone, unless already gone for another reason.
    fn close(&self, panicking: bool) {
        let state = if panicking { PANICKED } else { EXITED };
        let _ = self
            .state
            .compare_exchange(OPEN, state, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// A peer's permission to use a publication; see the module docs.
pub(crate) struct Lease<'a> {
    slot: &'a Slot,
    pub(crate) publication: Publication,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.slot.readers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Revokes a publication when dropped, waiting for the (bounded) leases still held.
pub(crate) struct PublishGuard<'a> {
    slot: &'a Slot,
    doorbell: &'a Doorbell,
}

impl Drop for PublishGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Say so before revoking, so a peer that finds the buffer gone knows why.
            self.slot.close(true, self.doorbell);
        }
        self.slot.pub_step.store(0, Ordering::SeqCst);
        // Leases last one chunk's copy: spin, unless the reader may be waiting for this core.
        let mut spins = if self.doorbell.oversubscribed() {
            1_000
        } else {
            0u32
        };
        while self.slot.readers.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 1_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}
