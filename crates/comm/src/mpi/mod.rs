//! The `mpi` backend (cargo feature `mpi`): one rank per process over the system's MPI library
//! (OpenMPI or MPICH), started by `mpirun`.
//!
//! ```no_run
//! use comm::{Communicator, CommunicatorExt, ReduceOp};
//! // Run as `mpirun -np 4 ./program`.
//! let world = comm::mpi::MpiComm::world(comm::mpi::DEFAULT_TIMEOUT)?;
//! let mut grads = vec![1.0f32; 1024];
//! world.all_reduce_in_place(&mut grads, ReduceOp::Mean)?;
//! # Ok::<(), comm::CommError>(())
//! ```
//!
//! # How calls map to MPI
//! Collectives run in one of two modes ([`OnTimeout`]). In the default, polled mode,
//! all-reduce, reduce-scatter and all-gather(v) are Tessera's own algorithms over
//! `MPI_Isend`/`MPI_Irecv` (recursive doubling for small buffers, rings for large ones; see
//! the `p2p` module), on a duplicate of the group's communicator reserved for them; broadcast,
//! all-to-all(v) and barrier are the nonblocking MPI collectives (`MPI_Ibcast`,
//! `MPI_Ialltoallv`, `MPI_Ibarrier`). Every wait is an `MPI_Test` loop with a deadline, so a
//! call can give up. Under [`OnTimeout::AbortJob`] every collective is the blocking MPI call.
//! Mean is a sum divided locally; f16 and bf16, which MPI has no type for, are reduced as f32
//! copies.
//! `send` copies the message and starts an `MPI_Isend` that completes in the background (so,
//! as on the local backend, a send never waits for its receive); `recv` is `MPI_Improbe` and
//! `MPI_Imrecv`, polled. Groups are `MPI_Comm_create_group` over the parent's communicator; the
//! world communicator is a duplicate of `MPI_COMM_WORLD`, so Tessera's traffic never mixes
//! with the application's. Only rsmpi's raw `ffi` layer is used: its safe request scopes panic
//! when a request is abandoned, and abandoning one is exactly what a timeout must do.
//!
//! # Failure, and its limits
//! - A peer that **never joins** a call: every waiting rank gets [`CommError::Timeout`] after
//!   the timeout (MPI does not say which rank is missing, so `waiting_for` is empty).
//! - A peer that **panics**: while unwinding, its communicator sends a failure notice to every
//!   world rank on a private control communicator; waiting peers poll for notices and return
//!   [`CommError::PeerFailed`] at once. The panicking process then exits and `mpirun`
//!   terminates the job, as OpenMPI does for any rank that exits abnormally.
//! - A peer whose work **returns an error** sends a notice with its error message when it calls
//!   [`MpiComm::announce_failure`] before it exits, as `runtime::train_mpi` does: the waiting
//!   peers' [`CommError::PeerFailed`] carries that message. Without it, its peers would wait
//!   for it until the timeout.
//! - Ranks that call all-reduce, reduce-scatter or all-gather with **different lengths**
//!   (polled mode): a rank whose messages do not have the lengths its schedule expects gets
//!   [`CommError::Mismatch`] naming the peer; a rank whose own messages happen to fit then
//!   waits for a peer that gave up and gets [`CommError::Timeout`]. None completes with a
//!   wrong result.
//! - A peer **killed** by a signal cannot send a notice: `mpirun` (OpenMPI's default) tears the
//!   job down. Nothing hangs, but the surviving ranks see no error either.
//! - MPI cannot cancel a started collective. After any error the process's MPI state is
//!   poisoned: every communicator of the process refuses further calls
//!   ([`CommError::Poisoned`]), the abandoned operation is never progressed again (so it cannot
//!   write into a buffer that was returned to the caller, as long as the transport only moves
//!   data inside MPI calls, which is true of OpenMPI's shared-memory and TCP transports), and
//!   `MPI_Finalize` is skipped (it could wait for the abandoned operation). The process should
//!   report its error and exit; `mpirun` then ends the job.
//! - Group creation (`MPI_Comm_create_group`) has no nonblocking form: a member that never calls
//!   [`group`](Communicator::group) blocks the others in it.
//! - Calls are serialised per process: MPI is initialised with `MPI_THREAD_SERIALIZED`, or
//!   `MPI_THREAD_SINGLE` when the application asks for it ([`prefer_thread_level`]; calls from
//!   other threads are then refused).

mod p2p;
mod pending;
mod raw;
mod watchdog;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::ThreadId;
use std::time::Duration;

use tensor::DType;

use self::raw::{Datatype, MpiError, Raw, Request};
use self::watchdog::{Watchdog, Watched};
use crate::buf::{Buf, BufMut};
use crate::communicator::{Communicator, Tag, MAX_TAG};
use crate::error::{CommError, Site};
use crate::op::ReduceOp;

/// The timeout [`MpiComm::world`] callers usually pass.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

const BACKEND: &str = "mpi";

/// What a collective does when it cannot complete within the timeout: the choice between
/// errors that every rank can handle and OpenMPI's fastest algorithms. Point-to-point calls
/// (`send`/`recv`) and group creation behave the same under both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnTimeout {
    /// The call returns [`CommError::Timeout`] (or [`CommError::PeerFailed`] when a peer
    /// announced a panic) on every waiting rank. All-reduce, reduce-scatter and all-gather are
    /// Tessera's algorithms over point-to-point messages (as fast as OpenMPI's blocking calls
    /// or faster: docs/PERFORMANCE.md), the other collectives MPI's nonblocking ones, all
    /// polled against the deadline. The default.
    #[default]
    ReturnError,
    /// The call cannot time out: collectives are the blocking MPI calls (OpenMPI's `tuned`
    /// algorithms), and a watchdog thread ends the whole MPI job (`MPI_Abort`)
    /// when one runs past the timeout, after printing which rank and call hung — the
    /// semantics of NCCL's watchdog. A peer that panics ends the job too (its process exits
    /// and `mpirun` tears the job down). Nothing hangs, but no error is returned either.
    AbortJob,
}

/// The thread support Tessera asks for when it is the one to initialise MPI (see
/// [`prefer_thread_level`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThreadLevel {
    /// `MPI_THREAD_SERIALIZED`: communicators may be used from any thread (Tessera's lock lets
    /// one call through at a time). The default.
    #[default]
    Serialized,
    /// `MPI_THREAD_SINGLE`: only the thread that initialises MPI (the one creating the first
    /// communicator) may use Tessera's MPI communicators; a call from any other thread is
    /// refused with [`CommError::InvalidArgument`], and a communicator dropped there is leaked
    /// rather than freed. OpenMPI then skips its own thread safety, which makes calls of a few
    /// kilobytes about 20 % faster (docs/PERFORMANCE.md). Under [`OnTimeout::AbortJob`] the
    /// watchdog still calls `MPI_Abort` from its own thread to end a hung job.
    Single,
}

impl fmt::Display for ThreadLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ThreadLevel::Serialized => "MPI_THREAD_SERIALIZED",
            ThreadLevel::Single => "MPI_THREAD_SINGLE",
        })
    }
}

/// The level the next initialisation of MPI asks for.
static PREFERRED_LEVEL: Mutex<ThreadLevel> = Mutex::new(ThreadLevel::Serialized);

/// Asks for `level` when Tessera initialises MPI, and returns the level in force: `level` if
/// MPI is not initialised yet, otherwise what it was initialised with (which this call cannot
/// change). Call it before the first communicator.
pub fn prefer_thread_level(level: ThreadLevel) -> ThreadLevel {
    let global = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    match global.as_ref().and_then(Weak::upgrade) {
        Some(runtime) => runtime.level,
        None => {
            *PREFERRED_LEVEL.lock().unwrap_or_else(|e| e.into_inner()) = level;
            level
        }
    }
}

/// The process's MPI state, shared by all its communicators.
struct Runtime {
    raw: Mutex<Raw>,
    /// The thread support MPI gives.
    level: ThreadLevel,
    /// Which threads may call MPI. `None`: any (one at a time). `Some(Some(t))`: only `t`, the
    /// thread that initialised MPI at less than `MPI_THREAD_SERIALIZED`. `Some(None)`: none —
    /// the application initialised it so, and the first communicator came from another thread.
    owner: Option<Option<ThreadId>>,
    /// Set by the first failed call: no more MPI calls, no `MPI_Finalize`.
    poisoned: Mutex<Option<String>>,
    /// Whether `poisoned` is set: what every call checks, without taking that lock.
    is_poisoned: AtomicBool,
    /// Set once this process has announced its own panic.
    announced: AtomicBool,
    /// Started by the first [`OnTimeout::AbortJob`] communicator.
    watchdog: OnceLock<Watchdog>,
}

static RUNTIME: Mutex<Option<Weak<Runtime>>> = Mutex::new(None);

/// The longest a failing process waits for its failure notices to leave.
const NOTICE_WAIT: Duration = Duration::from_secs(2);
/// The longest error message a failure notice carries (longer ones are cut).
const MAX_NOTICE_BYTES: usize = 2048;

/// The error for a wait at `site` that ended without completion (`waiting_for`: the peer
/// waited for, when known).
fn wait_error(
    err: raw::WaitError,
    site: Site,
    timeout: Duration,
    waiting_for: Vec<usize>,
) -> CommError {
    match err {
        raw::WaitError::Mpi(code, message) => CommError::Mpi {
            site,
            code,
            message,
        },
        raw::WaitError::Timeout => CommError::Timeout {
            site,
            timeout,
            waiting_for,
        },
        raw::WaitError::PeerFailed(peer, cause) => CommError::PeerFailed { site, peer, cause },
        raw::WaitError::Mismatch { peer, reason } => CommError::Mismatch { site, peer, reason },
    }
}

impl Runtime {
    /// Poisons the process's MPI state with `err` (unless it is an argument error): no more
    /// MPI calls, no `MPI_Finalize`.
    fn fail(&self, err: CommError) -> CommError {
        if err.poisons() {
            let mut poisoned = self.poisoned.lock().unwrap_or_else(|e| e.into_inner());
            poisoned.get_or_insert_with(|| err.to_string());
            self.is_poisoned.store(true, Ordering::Release);
        }
        err
    }

    /// Whether this thread may call MPI.
    fn on_owner_thread(&self) -> bool {
        match self.owner {
            None => true,
            Some(owner) => owner == Some(this_thread()),
        }
    }
}

/// This thread's id, read from thread-local storage (cheaper than `thread::current()`).
fn this_thread() -> ThreadId {
    thread_local! {
        static ID: ThreadId = std::thread::current().id();
    }
    ID.with(|id| *id)
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let poisoned = self
            .poisoned
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        let foreign = !self.on_owner_thread();
        let raw = self.raw.get_mut().unwrap_or_else(|e| e.into_inner());
        if !poisoned && !std::thread::panicking() && !foreign {
            raw.finalize();
        }
    }
}

/// One rank's communicator over one MPI group.
pub struct MpiComm {
    runtime: Arc<Runtime>,
    comm: raw::Comm,
    /// A duplicate of `comm` for the point-to-point collectives ([`p2p`]), so their messages
    /// never meet the application's `send`/`recv`.
    coll: raw::Comm,
    rank: usize,
    size: usize,
    /// Members as world ranks, in group-rank order.
    members: Vec<usize>,
    label: Arc<str>,
    timeout: Duration,
    /// Whether collectives are polled or blocking under the process's watchdog.
    on_timeout: OnTimeout,
    state: Mutex<EndpointState>,
}

#[derive(Default)]
struct EndpointState {
    /// Sends still in flight, with the buffers they read.
    pending_sends: Vec<(Request, Vec<u8>)>,
    /// How many groups with these members were created from this communicator.
    groups_made: std::collections::HashMap<Vec<usize>, u64>,
    /// The point-to-point collectives' receive buffers, kept across calls (8-byte aligned).
    scratch: Vec<u64>,
    /// The point-to-point collectives' step bookkeeping, kept across calls.
    step: p2p::Step,
}

// SAFETY: the MPI handles inside are used only under the runtime lock (MPI_THREAD_SERIALIZED),
// and the send buffers are owned.
unsafe impl Send for MpiComm {}
// SAFETY: as above; every method takes the runtime lock before touching MPI.
unsafe impl Sync for MpiComm {}

impl fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiComm")
            .field("group", &self.label)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl MpiComm {
    /// The world communicator (a duplicate of `MPI_COMM_WORLD`); initialises MPI on first use.
    /// Every wait of every call on it, and on the groups made from it, ends after `timeout`
    /// with an error ([`OnTimeout::ReturnError`]).
    pub fn world(timeout: Duration) -> Result<MpiComm, CommError> {
        MpiComm::world_with(timeout, OnTimeout::ReturnError)
    }

    /// The world communicator, with the choice of what a collective that runs past `timeout`
    /// does ([`OnTimeout`]); the groups made from it inherit the choice.
    pub fn world_with(timeout: Duration, on_timeout: OnTimeout) -> Result<MpiComm, CommError> {
        let mut global = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let runtime = match global.as_ref().and_then(Weak::upgrade) {
            Some(runtime) => runtime,
            None => {
                let preferred = *PREFERRED_LEVEL.lock().unwrap_or_else(|e| e.into_inner());
                let raw = Raw::init(preferred == ThreadLevel::Serialized).map_err(|reason| {
                    CommError::Setup {
                        backend: BACKEND,
                        reason,
                    }
                })?;
                let (level, owner) = if raw.any_thread {
                    (ThreadLevel::Serialized, None)
                } else {
                    let me = this_thread();
                    (ThreadLevel::Single, Some(raw.main_thread.then_some(me)))
                };
                let runtime = Arc::new(Runtime {
                    raw: Mutex::new(raw),
                    level,
                    owner,
                    poisoned: Mutex::new(None),
                    is_poisoned: AtomicBool::new(false),
                    announced: AtomicBool::new(false),
                    watchdog: OnceLock::new(),
                });
                *global = Some(Arc::downgrade(&runtime));
                runtime
            }
        };
        let (comm, coll, rank, size) = {
            let raw = runtime.raw.lock().unwrap_or_else(|e| e.into_inner());
            if on_timeout == OnTimeout::AbortJob && runtime.watchdog.get().is_none() {
                let watchdog =
                    Watchdog::start(raw.world_rank()).map_err(|reason| CommError::Setup {
                        backend: BACKEND,
                        reason,
                    })?;
                // Only this thread sets it: it holds the MPI lock.
                let _ = runtime.watchdog.set(watchdog);
            }
            let setup = |(code, message): MpiError| CommError::Setup {
                backend: BACKEND,
                reason: format!("MPI_Comm_dup(MPI_COMM_WORLD) failed with {code}: {message}"),
            };
            let (comm, rank, size) = raw.dup_world().map_err(setup)?;
            let coll = raw.dup(&comm).map_err(setup)?;
            (comm, coll, rank, size)
        };
        Ok(MpiComm {
            runtime,
            comm,
            coll,
            rank,
            size,
            members: (0..size).collect(),
            label: Arc::from("world"),
            timeout,
            on_timeout,
            state: Mutex::new(EndpointState::default()),
        })
    }

    /// Locks MPI for one call, refusing it if the process's MPI state is poisoned or this
    /// thread may not call MPI.
    fn enter(&self, op: &'static str) -> Result<Call<'_>, CommError> {
        if !self.runtime.on_owner_thread() {
            return Err(CommError::InvalidArgument {
                site: self.site(op),
                reason: format!(
                    "MPI runs with {} and this call comes from a thread other than the one \
                     that initialised it",
                    self.runtime.level
                ),
            });
        }
        let raw = self.runtime.raw.lock().unwrap_or_else(|e| e.into_inner());
        if self.runtime.is_poisoned.load(Ordering::Acquire) {
            let first_error = self
                .runtime
                .poisoned
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            return Err(CommError::Poisoned {
                site: self.site(op),
                first_error: first_error.clone().unwrap_or_default(),
            });
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Reap the sends that completed meanwhile.
        let mut failed = None;
        state
            .pending_sends
            .retain_mut(|(request, _)| match raw.test(request) {
                Ok(done) => !done,
                Err(err) => {
                    failed = Some(err);
                    true
                }
            });
        let call = Call {
            comm: self,
            raw,
            state,
            op,
        };
        match failed {
            Some((code, message)) => Err(call.fail(CommError::Mpi {
                site: self.site(op),
                code,
                message,
            })),
            None => Ok(call),
        }
    }
}

/// The MPI library's own blocking collectives on a communicator's group, bypassing Tessera's
/// algorithms, timeouts and checks: the baseline `tessera bench collectives --backend mpi`
/// measures the backend against, in the same process, run and buffers.
impl MpiComm {
    /// Tells every other rank of the job that this process is failing with `reason` (its run
    /// returned an error), as a panicking process does while it unwinds: their waits end at
    /// once with [`CommError::PeerFailed`] carrying `reason` (its first 2 KiB), instead of at
    /// the timeout, so whichever process reports first names the root cause. Poisons this process's
    /// MPI state, so later calls are refused and `MPI_Finalize`, which would wait for the
    /// peers, is skipped: the process should report its error and exit. Only a process's first
    /// announcement (or panic) sends notices; on a thread that may not call MPI this only
    /// poisons.
    pub fn announce_failure(&self, reason: &str) {
        {
            let mut poisoned = self
                .runtime
                .poisoned
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            poisoned.get_or_insert_with(|| format!("this rank failed: {reason}"));
            self.runtime.is_poisoned.store(true, Ordering::Release);
        }
        if !self.runtime.on_owner_thread() || self.runtime.announced.swap(true, Ordering::SeqCst) {
            return;
        }
        // The peers report the message: keep it short enough to travel as one eager message.
        let mut end = reason.len().min(MAX_NOTICE_BYTES);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let notice = raw::Notice::Failed(reason[..end].to_string());
        let raw = self.runtime.raw.lock().unwrap_or_else(|e| e.into_inner());
        raw.announce_failure(&notice, self.timeout.min(NOTICE_WAIT));
    }

    /// `MPI_Allreduce(MPI_IN_PLACE, buf, …, MPI_FLOAT, MPI_SUM, …)`.
    pub fn library_all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let call = self.enter("library_all_reduce")?;
        let elems = (
            buf.as_mut_ptr().cast::<u8>(),
            call.count(buf.len())?,
            Datatype::F32,
        );
        // SAFETY: `buf` is borrowed for the whole blocking call.
        let done = unsafe { call.raw.allreduce(&self.comm, elems, ReduceOp::Sum) };
        call.check(done)
    }

    /// `MPI_Allgather` of `send` into `recv` (`send.len() × size` elements).
    pub fn library_all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        let call = self.enter("library_all_gather")?;
        call.check_gather(send.len(), recv.len(), "elements")?;
        let count = call.count(std::mem::size_of_val(send))?;
        call.count(std::mem::size_of_val(recv))?;
        // SAFETY: both buffers are borrowed for the whole blocking call.
        let done = unsafe {
            call.raw.allgather(
                &self.comm,
                send.as_ptr().cast(),
                count,
                recv.as_mut_ptr().cast(),
            )
        };
        call.check(done)
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        if !self.runtime.on_owner_thread() {
            // This thread may not call MPI: the handles are leaked.
            return;
        }
        let raw = self.runtime.raw.lock().unwrap_or_else(|e| e.into_inner());
        if std::thread::panicking() && !self.runtime.announced.swap(true, Ordering::SeqCst) {
            raw.announce_failure(&raw::Notice::Panicked, self.timeout.min(NOTICE_WAIT));
            return;
        }
        let poisoned = self
            .runtime
            .poisoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if poisoned || std::thread::panicking() {
            return;
        }
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (mut request, buffer) in state.pending_sends.drain(..) {
            if raw.wait(&mut request, self.timeout).is_err() {
                // Never completed: keep the buffer alive for MPI rather than free it under it.
                std::mem::forget(buffer);
            }
        }
        raw.free(&mut self.coll);
        raw.free(&mut self.comm);
    }
}

/// One call in progress: holds the MPI lock and poisons the process on failure.
struct Call<'a> {
    comm: &'a MpiComm,
    raw: MutexGuard<'a, Raw>,
    state: MutexGuard<'a, EndpointState>,
    op: &'static str,
}

impl Call<'_> {
    fn site(&self) -> Site {
        self.comm.site(self.op)
    }

    fn invalid(&self, reason: String) -> CommError {
        CommError::InvalidArgument {
            site: self.site(),
            reason,
        }
    }

    /// Poisons the process's MPI state with `err` (unless it is an argument error).
    fn fail(&self, err: CommError) -> CommError {
        self.comm.runtime.fail(err)
    }

    fn check<T>(&self, rc: Result<T, (i32, String)>) -> Result<T, CommError> {
        rc.map_err(|(code, message)| {
            self.fail(CommError::Mpi {
                site: self.site(),
                code,
                message,
            })
        })
    }

    /// A count as MPI's `int`.
    fn count(&self, n: usize) -> Result<i32, CommError> {
        i32::try_from(n).map_err(|_| {
            self.invalid(format!(
                "{n} items is more than MPI can address in one call"
            ))
        })
    }

    fn counts(&self, counts: &[usize]) -> Result<(Vec<i32>, Vec<i32>), CommError> {
        let mut displs = Vec::with_capacity(counts.len());
        let mut total = 0usize;
        for &c in counts {
            displs.push(self.count(total)?);
            total += c;
        }
        self.count(total)?;
        let counts = counts
            .iter()
            .map(|&c| self.count(c))
            .collect::<Result<_, _>>()?;
        Ok((counts, displs))
    }

    /// The error for a wait that ended without completion (`waiting_for`: the peer waited
    /// for, when known), poisoning the process.
    fn wait_error(&self, err: raw::WaitError, waiting_for: Vec<usize>) -> CommError {
        self.fail(wait_error(err, self.site(), self.comm.timeout, waiting_for))
    }

    /// Polls `request` to completion, watching for failure notices and the deadline. On
    /// failure the request is abandoned, never freed: MPI may still own its buffers.
    fn wait(&mut self, request: Request) -> Result<(), CommError> {
        let members = &self.comm.members;
        let polled = self.raw.poll(request, self.comm.timeout, |world_rank| {
            members.iter().position(|&m| m == world_rank)
        });
        polled.map_err(|err| self.wait_error(err, Vec::new()))
    }

    /// Runs one collective: under [`OnTimeout::AbortJob`] the blocking MPI call, watched by
    /// the process's watchdog; otherwise `polled`.
    fn run(
        &mut self,
        blocking: impl FnOnce(&Raw) -> Result<(), MpiError>,
        polled: impl FnOnce(&mut Self) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let comm = self.comm;
        match (comm.on_timeout, comm.runtime.watchdog.get()) {
            (OnTimeout::AbortJob, Some(watchdog)) => {
                let armed = watchdog.arm(&Watched {
                    op: self.op,
                    group: comm.label.clone(),
                    rank: comm.rank,
                    size: comm.size,
                    timeout: comm.timeout,
                });
                let done = blocking(&self.raw);
                drop(armed);
                self.check(done)
            }
            _ => polled(self),
        }
    }

    /// A collective that MPI serves in both modes: blocking (see [`Call::run`]) or
    /// nonblocking, polled against the deadline.
    fn collective(
        &mut self,
        blocking: impl FnOnce(&Raw) -> Result<(), MpiError>,
        nonblocking: impl FnOnce(&mut Raw) -> Result<Request, MpiError>,
    ) -> Result<(), CommError> {
        self.run(blocking, |call| {
            let request = nonblocking(&mut call.raw);
            let request = call.check(request)?;
            call.wait(request)
        })
    }

    /// Runs one of the [`p2p`] collectives on the communicator's collective twin, with the
    /// call's deadline and the endpoint's scratch space.
    fn point_to_point(
        &mut self,
        collective: impl FnOnce(&mut p2p::Peers<'_>, &mut Vec<u64>) -> Result<(), raw::WaitError>,
    ) -> Result<(), CommError> {
        let comm = self.comm;
        let member = |world_rank: usize| comm.members.iter().position(|&m| m == world_rank);
        let state = &mut *self.state;
        let mut peers = p2p::Peers {
            raw: &mut self.raw,
            comm: &comm.coll,
            rank: comm.rank,
            size: comm.size,
            timeout: comm.timeout,
            started: None,
            step: &mut state.step,
            piece: p2p::MAX_MESSAGE,
            member: &member,
        };
        let done = collective(&mut peers, &mut state.scratch);
        done.map_err(|err| {
            // MPI may still own the scratch space: leak it rather than free it.
            std::mem::forget(std::mem::take(&mut self.state.scratch));
            self.wait_error(err, Vec::new())
        })
    }

    /// Refuses an all-gather whose receive length is not the group size times the send length
    /// (both counted in `unit`).
    fn check_gather(&self, send: usize, recv: usize, unit: &str) -> Result<(), CommError> {
        let size = self.comm.size;
        if recv == send * size {
            return Ok(());
        }
        Err(self.invalid(format!(
            "recv has {recv} {unit} but {size} ranks × {send} {unit} sent need {}",
            send * size
        )))
    }

    fn check_peer(&self, peer: usize, tag: Tag) -> Result<(), CommError> {
        if peer >= self.comm.size {
            return Err(self.invalid(format!(
                "peer rank {peer} is outside the group (size {})",
                self.comm.size
            )));
        }
        if tag > MAX_TAG {
            return Err(self.invalid(format!("tag {tag} is above the maximum {MAX_TAG}")));
        }
        Ok(())
    }
}

fn datatype(dtype: DType) -> Datatype {
    match dtype {
        DType::F64 => Datatype::F64,
        DType::F32 | DType::F16 | DType::BF16 => Datatype::F32,
        DType::I64 => Datatype::I64,
        DType::I32 => Datatype::I32,
        DType::I16 => Datatype::I16,
        DType::I8 => Datatype::I8,
        DType::U64 => Datatype::U64,
        DType::U32 => Datatype::U32,
        DType::U16 => Datatype::U16,
        DType::U8 | DType::Bool => Datatype::U8,
    }
}

impl MpiComm {
    /// Whether a started collective of `dtype` and `op` runs in the background: under polled
    /// collectives, on the types and operations MPI reduces natively.
    fn runs_in_background(&self, dtype: DType, op: ReduceOp) -> bool {
        self.on_timeout == OnTimeout::ReturnError
            && matches!(dtype, DType::F32 | DType::F64)
            && matches!(op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min)
    }

    /// A started request, whose result MPI writes into `data`, as a pending collective.
    fn in_flight(
        &self,
        request: raw::Request,
        data: tensor::Tensor,
        kept: pending::Kept,
        site: Site,
    ) -> crate::PendingCollective {
        crate::PendingCollective::in_flight(Box::new(pending::MpiInFlight {
            runtime: self.runtime.clone(),
            request: Some(request),
            data: Some(data),
            kept,
            members: self.members.clone(),
            timeout: self.timeout,
            site,
        }))
    }
}

impl Communicator for MpiComm {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn label(&self) -> &str {
        &self.label
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn group(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        let mut call = self.enter("group")?;
        if let Some(&bad) = ranks.iter().find(|&&r| r >= self.size) {
            return Err(call.invalid(format!(
                "rank {bad} in {ranks:?} is outside the group (size {})",
                self.size
            )));
        }
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(call.invalid(format!("ranks {ranks:?} repeat a rank")));
        }
        let Some(new_rank) = ranks.iter().position(|&r| r == self.rank) else {
            return Err(call.invalid(format!("this rank is not in {ranks:?}")));
        };
        let members: Vec<usize> = ranks.iter().map(|&r| self.members[r]).collect();
        let instance = call.state.groups_made.entry(members.clone()).or_insert(0);
        // Distinguishes concurrent creations on one parent by different member lists.
        let tag = (members
            .iter()
            .fold(*instance as usize, |h, &m| h * 31 + m + 1)
            % (MAX_TAG as usize + 1)) as i32;
        *instance += 1;
        let ranks_i32: Vec<i32> = ranks
            .iter()
            .map(|&r| call.count(r))
            .collect::<Result<_, _>>()?;
        let created = call.raw.create_group(&self.comm, &ranks_i32, tag);
        let comm = call.check(created)?;
        let coll = call.raw.dup(&comm);
        let coll = call.check(coll)?;
        let list: Vec<String> = members.iter().map(|m| m.to_string()).collect();
        Ok(Box::new(MpiComm {
            runtime: self.runtime.clone(),
            comm,
            coll,
            rank: new_rank,
            size: ranks.len(),
            label: Arc::from(format!("world[{}]", list.join(","))),
            members,
            timeout: self.timeout,
            on_timeout: self.on_timeout,
            state: Mutex::new(EndpointState::default()),
        }))
    }

    fn barrier(&self) -> Result<(), CommError> {
        let mut call = self.enter("barrier")?;
        call.collective(
            |raw| raw.barrier(&self.comm),
            |raw| raw.ibarrier(&self.comm),
        )
    }

    fn broadcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<(), CommError> {
        let mut call = self.enter("broadcast")?;
        if root >= self.size {
            return Err(call.invalid(format!(
                "root {root} is outside the group (size {})",
                self.size
            )));
        }
        let count = call.count(buf.len())?;
        let ptr = buf.as_mut_ptr();
        // SAFETY: `buf` outlives the call (or the wait; on failure the process never calls MPI
        // again).
        call.collective(
            |raw| unsafe { raw.bcast(&self.comm, ptr, count, root) },
            |raw| unsafe { raw.ibcast(&self.comm, ptr, count, root) },
        )
    }

    /// MPI's nonblocking all-reduce for f32 and f64 sums, maxima and minima under polled
    /// collectives ([`OnTimeout::ReturnError`]); the blocking path otherwise.
    fn start_all_reduce(
        &self,
        mut tensor: tensor::Tensor,
        op: ReduceOp,
    ) -> Result<crate::PendingCollective, CommError> {
        if !self.runs_in_background(tensor.dtype(), op) {
            self.all_reduce(&mut tensor, op)?;
            return Ok(crate::PendingCollective::done(tensor));
        }
        let call = self.enter("start_all_reduce")?;
        let count = call.count(tensor.n_elements())?;
        let ptr = tensor.as_bytes_mut().as_mut_ptr();
        // SAFETY: the tensor's heap buffer moves into the pending reduction with it and is
        // neither read, written nor freed until the request completes (it is leaked if the
        // request is abandoned).
        let started = unsafe {
            call.raw
                .iallreduce(&self.comm, (ptr, count, datatype(tensor.dtype())), op)
        };
        let request = call.check(started)?;
        let site = call.site();
        drop(call);
        Ok(self.in_flight(request, tensor, pending::Kept::default(), site))
    }

    /// MPI's nonblocking reduce-scatter for f32 and f64 sums, maxima and minima under polled
    /// collectives ([`OnTimeout::ReturnError`]); the blocking path otherwise.
    fn start_reduce_scatter_v(
        &self,
        send: tensor::Tensor,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<crate::PendingCollective, CommError> {
        let dtype = send.dtype();
        let valid = counts.len() == self.size && counts.iter().sum::<usize>() == send.n_elements();
        if !valid || !self.runs_in_background(dtype, op) {
            // The blocking call checks the counts and names what is wrong.
            let mine = counts.get(self.rank).copied().unwrap_or(0);
            let mut recv = tensor::Tensor::zeros(dtype, &[mine]);
            self.reduce_scatter_v(
                Buf::from_tensor(&send),
                BufMut::from_tensor(&mut recv),
                counts,
                op,
            )?;
            return Ok(crate::PendingCollective::done(recv));
        }
        let call = self.enter("start_reduce_scatter")?;
        let (mpi_counts, _) = call.counts(counts)?;
        let mut recv = tensor::Tensor::zeros(dtype, &[counts[self.rank]]);
        let (send_ptr, recv_ptr) = (send.as_bytes().as_ptr(), recv.as_bytes_mut().as_mut_ptr());
        // SAFETY: both tensors' heap buffers and the counts move into the pending reduction
        // and are neither read, written nor freed until the request completes (they are leaked
        // if the request is abandoned).
        let started = unsafe {
            call.raw.ireduce_scatter(
                &self.comm,
                (send_ptr, recv_ptr),
                &mpi_counts,
                datatype(dtype),
                op,
            )
        };
        let request = call.check(started)?;
        let site = call.site();
        drop(call);
        let kept = pending::Kept {
            send: Some(send),
            counts: mpi_counts,
        };
        Ok(self.in_flight(request, recv, kept, site))
    }

    /// MPI's nonblocking all-gather under polled collectives ([`OnTimeout::ReturnError`]); the
    /// blocking path otherwise.
    fn start_all_gather_bytes(&self, send: Vec<u8>) -> Result<crate::PendingCollective, CommError> {
        let len = send.len();
        let send = tensor::Tensor::from_vec(&[len], send).expect("the length is the shape");
        if self.on_timeout != OnTimeout::ReturnError {
            let mut recv = vec![0u8; len * self.size];
            self.all_gather_bytes(send.as_bytes(), &mut recv)?;
            let gathered = tensor::Tensor::from_vec(&[recv.len()], recv).expect("shape");
            return Ok(crate::PendingCollective::done(gathered));
        }
        let call = self.enter("start_all_gather")?;
        let count = call.count(len)?;
        call.count(len * self.size)?;
        let mut recv = tensor::Tensor::zeros(DType::U8, &[len * self.size]);
        let (send_ptr, recv_ptr) = (send.as_bytes().as_ptr(), recv.as_bytes_mut().as_mut_ptr());
        // SAFETY: both tensors' heap buffers move into the pending collective and are neither
        // read, written nor freed until the request completes (they are leaked if the request
        // is abandoned).
        let started = unsafe { call.raw.iallgather(&self.comm, send_ptr, count, recv_ptr) };
        let request = call.check(started)?;
        let site = call.site();
        drop(call);
        let kept = pending::Kept {
            send: Some(send),
            counts: Vec::new(),
        };
        Ok(self.in_flight(request, recv, kept, site))
    }

    fn all_reduce_buf(&self, mut buf: BufMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        let mut call = self.enter("all_reduce")?;
        let dtype = buf.dtype();
        if !op.supports(dtype) {
            return Err(CommError::UnsupportedReduction {
                site: call.site(),
                reduce: op,
                dtype,
            });
        }
        // MPI has no 16-bit float type: reduce an f32 copy.
        let mut widened = widen(&buf);
        let storage = if widened.is_some() { DType::F32 } else { dtype };
        let bytes: &mut [u8] = match &mut widened {
            Some(wide) => bytemuck::cast_slice_mut(wide.as_mut_slice()),
            None => buf.bytes_mut(),
        };
        let elem = storage.size_in_bytes();
        let elems = (
            bytes.as_mut_ptr(),
            call.count(bytes.len() / elem)?,
            datatype(dtype),
        );
        let combine = |dst: &mut [u8], src: &[u8], src_first: bool| {
            crate::op::combine_bytes(storage, op, dst, src, src_first)
        };
        // SAFETY: the buffer outlives the call (on failure the process never calls MPI again,
        // and a widened copy is leaked rather than freed).
        let done = call.run(
            |raw| unsafe { raw.allreduce(&self.comm, elems, op) },
            |call| {
                call.point_to_point(|peers, scratch| {
                    p2p::all_reduce(peers, bytes, elem, scratch, &combine)
                })
            },
        );
        if let Err(err) = done {
            std::mem::forget(widened);
            return Err(err);
        }
        match widened {
            Some(wide) => narrow(&wide, &mut buf, op, self.size),
            None if op == ReduceOp::Mean => crate::op::divide_in_place(&mut buf, self.size),
            None => {}
        }
        Ok(())
    }

    fn reduce_scatter_v(
        &self,
        send: Buf<'_>,
        mut recv: BufMut<'_>,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let mut call = self.enter("reduce_scatter")?;
        let dtype = send.dtype();
        if recv.dtype() != dtype {
            return Err(call.invalid(format!("send is {dtype} but recv is {}", recv.dtype())));
        }
        if !op.supports(dtype) {
            return Err(CommError::UnsupportedReduction {
                site: call.site(),
                reduce: op,
                dtype,
            });
        }
        if counts.len() != self.size
            || counts.iter().sum::<usize>() != send.len()
            || recv.len() != counts[self.rank]
        {
            return Err(call.invalid(format!(
                "counts {counts:?} must have {} entries summing to the send length {} and entry \
                 {} equal to the recv length {}",
                self.size,
                send.len(),
                self.rank,
                recv.len()
            )));
        }
        let (mpi_counts, _) = call.counts(counts)?;
        let wide_send = widen_read(&send);
        let mut wide_recv = widen(&recv);
        let storage = if wide_send.is_some() {
            DType::F32
        } else {
            dtype
        };
        let send_bytes: &[u8] = wide_send
            .as_ref()
            .map_or(send.bytes(), |w| bytemuck::cast_slice(w.as_slice()));
        let recv_bytes: &mut [u8] = match &mut wide_recv {
            Some(w) => bytemuck::cast_slice_mut(w.as_mut_slice()),
            None => recv.bytes_mut(),
        };
        let (send_ptr, recv_ptr) = (send_bytes.as_ptr(), recv_bytes.as_mut_ptr());
        let mpi_dtype = datatype(dtype);
        let combine = |dst: &mut [u8], src: &[u8], src_first: bool| {
            crate::op::combine_bytes(storage, op, dst, src, src_first)
        };
        let elem = storage.size_in_bytes();
        // SAFETY: buffers and counts outlive the call, or are leaked on failure.
        let done = call.run(
            |raw| unsafe {
                raw.reduce_scatter(&self.comm, (send_ptr, recv_ptr), &mpi_counts, mpi_dtype, op)
            },
            |call| {
                call.point_to_point(|peers, scratch| {
                    let buffers = (send_bytes, recv_bytes);
                    p2p::reduce_scatter(peers, buffers, (counts, elem), scratch, &combine)
                })
            },
        );
        if let Err(err) = done {
            std::mem::forget((wide_send, wide_recv, mpi_counts));
            return Err(err);
        }
        match wide_recv {
            Some(wide) => narrow(&wide, &mut recv, op, self.size),
            None if op == ReduceOp::Mean => crate::op::divide_in_place(&mut recv, self.size),
            None => {}
        }
        Ok(())
    }

    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        let mut call = self.enter("all_gather")?;
        call.check_gather(send.len(), recv.len(), "bytes")?;
        let count = call.count(send.len())?;
        call.count(recv.len())?;
        let (send_ptr, recv_ptr) = (send.as_ptr(), recv.as_mut_ptr());
        let chunks = crate::schedule::balanced_chunks(recv.len(), self.size, 1);
        // SAFETY: buffers outlive the call (on failure the process never calls MPI again).
        call.run(
            |raw| unsafe { raw.allgather(&self.comm, send_ptr, count, recv_ptr) },
            |call| call.point_to_point(|peers, _| p2p::all_gather(peers, send, recv, &chunks)),
        )
    }

    fn all_gather_v_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
    ) -> Result<(), CommError> {
        let mut call = self.enter("all_gather_v")?;
        if counts.len() != self.size
            || counts[self.rank] != send.len()
            || counts.iter().sum::<usize>() != recv.len()
        {
            return Err(call.invalid(format!(
                "counts {counts:?} must have {} entries, entry {} equal to the send length {} \
                 and sum to the recv length {}",
                self.size,
                self.rank,
                send.len(),
                recv.len()
            )));
        }
        let (mpi_counts, displs) = call.counts(counts)?;
        let sent = (send.as_ptr(), mpi_counts[self.rank]);
        let recv_ptr = recv.as_mut_ptr();
        let chunks = crate::schedule::chunks_of(counts, 1);
        // SAFETY: buffers and counts outlive the call, or are leaked on failure.
        call.run(
            |raw| unsafe { raw.allgatherv(&self.comm, sent, recv_ptr, &mpi_counts, &displs) },
            |call| call.point_to_point(|peers, _| p2p::all_gather(peers, send, recv, &chunks)),
        )
        .inspect_err(|_| {
            std::mem::forget((mpi_counts, displs));
        })
    }

    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        let n = self.size;
        if !send.len().is_multiple_of(n) || recv.len() != send.len() {
            let call = self.enter("all_to_all")?;
            return Err(call.invalid(format!(
                "send ({} bytes) must divide into {n} equal chunks and recv ({} bytes) match it",
                send.len(),
                recv.len()
            )));
        }
        let counts = vec![send.len() / n; n];
        self.all_to_all_v_bytes(send, &counts, recv, &counts)
    }

    fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        let mut call = self.enter("all_to_all_v")?;
        let n = self.size;
        if send_counts.len() != n
            || recv_counts.len() != n
            || send_counts.iter().sum::<usize>() != send.len()
            || recv_counts.iter().sum::<usize>() != recv.len()
            || send_counts[self.rank] != recv_counts[self.rank]
        {
            return Err(call.invalid(format!(
                "send counts {send_counts:?} and recv counts {recv_counts:?} must have {n} \
                 entries each, sum to the buffer lengths ({} and {}) and agree on this rank's \
                 own piece",
                send.len(),
                recv.len()
            )));
        }
        let (scounts, sdispls) = call.counts(send_counts)?;
        let (rcounts, rdispls) = call.counts(recv_counts)?;
        let (send_ptr, recv_ptr) = (send.as_ptr(), recv.as_mut_ptr());
        // SAFETY: buffers and counts outlive the call (or the wait), or are leaked on failure.
        call.collective(
            |raw| unsafe {
                raw.alltoallv(
                    &self.comm,
                    (send_ptr, &scounts, &sdispls),
                    (recv_ptr, &rcounts, &rdispls),
                )
            },
            |raw| unsafe {
                raw.ialltoallv(
                    &self.comm,
                    (send_ptr, &scounts, &sdispls),
                    (recv_ptr, &rcounts, &rdispls),
                )
            },
        )
        .inspect_err(|_| {
            std::mem::forget((scounts, sdispls, rcounts, rdispls));
        })
    }

    fn send_bytes(&self, dst: usize, tag: Tag, data: &[u8]) -> Result<(), CommError> {
        let mut call = self.enter("send")?;
        call.check_peer(dst, tag)?;
        let count = call.count(data.len())?;
        let buffer = data.to_vec();
        // SAFETY: the buffer moves into `pending_sends` with its request and lives until the
        // request completes (or forever, if it never does).
        let request = unsafe {
            call.raw
                .isend(&self.comm, buffer.as_ptr(), count, dst, tag as i32)
        };
        let request = call.check(request)?;
        call.state.pending_sends.push((request, buffer));
        Ok(())
    }

    fn recv_bytes(&self, src: usize, tag: Tag) -> Result<Vec<u8>, CommError> {
        let mut call = self.enter("recv")?;
        call.check_peer(src, tag)?;
        let members = &self.members;
        let probed = call
            .raw
            .probe(&self.comm, src, tag as i32, self.timeout, |w| {
                members.iter().position(|&m| m == w)
            });
        let (message, len) = probed.map_err(|err| call.wait_error(err, vec![src]))?;
        let mut data = vec![0u8; len];
        let count = call.count(len)?;
        // SAFETY: `data` outlives the wait, or is leaked on failure.
        let request = unsafe { call.raw.imrecv(message, data.as_mut_ptr(), count) };
        let request = call.check(request)?;
        match call.wait(request) {
            Ok(()) => Ok(data),
            Err(err) => {
                std::mem::forget(data);
                Err(err)
            }
        }
    }
}

/// An f32 copy of a 16-bit float buffer, or `None` for other dtypes.
fn widen(buf: &BufMut<'_>) -> Option<Vec<f32>> {
    widen_read(&buf.as_buf())
}

fn widen_read(buf: &Buf<'_>) -> Option<Vec<f32>> {
    let bytes = buf.bytes();
    match buf.dtype() {
        DType::F16 => Some(
            bytemuck::cast_slice::<u8, half::f16>(bytes)
                .iter()
                .map(|x| x.to_f32())
                .collect(),
        ),
        DType::BF16 => Some(
            bytemuck::cast_slice::<u8, half::bf16>(bytes)
                .iter()
                .map(|x| x.to_f32())
                .collect(),
        ),
        _ => None,
    }
}

/// Writes a reduced f32 copy back into a 16-bit float buffer (dividing first for `Mean`).
fn narrow(wide: &[f32], buf: &mut BufMut<'_>, op: ReduceOp, n: usize) {
    let scale = if op == ReduceOp::Mean { n as f32 } else { 1.0 };
    let dtype = buf.dtype();
    let bytes = buf.bytes_mut();
    match dtype {
        DType::F16 => {
            for (d, &w) in bytemuck::cast_slice_mut::<u8, half::f16>(bytes)
                .iter_mut()
                .zip(wide)
            {
                *d = half::f16::from_f32(w / scale);
            }
        }
        _ => {
            for (d, &w) in bytemuck::cast_slice_mut::<u8, half::bf16>(bytes)
                .iter_mut()
                .zip(wide)
            {
                *d = half::bf16::from_f32(w / scale);
            }
        }
    }
}
