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
//! Every collective is the matching *nonblocking* MPI collective (`MPI_Iallreduce`,
//! `MPI_Ireduce_scatter`, `MPI_Iallgather(v)`, `MPI_Ialltoall(v)`, `MPI_Ibcast`,
//! `MPI_Ibarrier`) completed by an `MPI_Test` loop with a deadline, so a call can give up. Mean is
//! a sum divided locally; f16 and bf16, which MPI has no type for, are reduced as f32 copies.
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
//! - Calls are serialised per process (MPI is initialised with `MPI_THREAD_SERIALIZED`).

mod raw;
mod watchdog;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tensor::DType;

use self::raw::{Datatype, MpiError, Raw, Request};
use self::watchdog::{Watchdog, Watched};
use crate::buf::{Buf, BufMut};
use crate::communicator::{Communicator, Tag, MAX_TAG};
use crate::error::{CommError, PeerFailure, Site};
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
    /// announced a panic) on every waiting rank. Collectives are nonblocking MPI collectives
    /// polled against the deadline, served by OpenMPI's `libnbc`, with the algorithm chosen per
    /// call by buffer size and rank count (on OpenMPI, unless the user chose one). The default.
    #[default]
    ReturnError,
    /// The call cannot time out: collectives are the blocking MPI calls (OpenMPI's `tuned`
    /// algorithms, the fastest), and a watchdog thread ends the whole MPI job (`MPI_Abort`)
    /// when one runs past the timeout, after printing which rank and call hung — the
    /// semantics of NCCL's watchdog. A peer that panics ends the job too (its process exits
    /// and `mpirun` tears the job down). Nothing hangs, but no error is returned either.
    AbortJob,
}

/// The process's MPI state, shared by all its communicators.
struct Runtime {
    raw: Mutex<Raw>,
    /// Set by the first failed call: no more MPI calls, no `MPI_Finalize`.
    poisoned: Mutex<Option<String>>,
    /// Set once this process has announced its own panic.
    announced: AtomicBool,
    /// Started by the first [`OnTimeout::AbortJob`] communicator.
    watchdog: OnceLock<Watchdog>,
}

static RUNTIME: Mutex<Option<Weak<Runtime>>> = Mutex::new(None);

impl Drop for Runtime {
    fn drop(&mut self) {
        let poisoned = self
            .poisoned
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        let raw = self.raw.get_mut().unwrap_or_else(|e| e.into_inner());
        if !poisoned && !std::thread::panicking() {
            raw.finalize();
        }
    }
}

/// One rank's communicator over one MPI group.
pub struct MpiComm {
    runtime: Arc<Runtime>,
    comm: raw::Comm,
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
                let raw = Raw::init().map_err(|reason| CommError::Setup {
                    backend: BACKEND,
                    reason,
                })?;
                let runtime = Arc::new(Runtime {
                    raw: Mutex::new(raw),
                    poisoned: Mutex::new(None),
                    announced: AtomicBool::new(false),
                    watchdog: OnceLock::new(),
                });
                *global = Some(Arc::downgrade(&runtime));
                runtime
            }
        };
        let (comm, rank, size) = {
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
            raw.dup_world()
                .map_err(|(code, message)| CommError::Setup {
                    backend: BACKEND,
                    reason: format!("MPI_Comm_dup(MPI_COMM_WORLD) failed with {code}: {message}"),
                })?
        };
        Ok(MpiComm {
            runtime,
            comm,
            rank,
            size,
            members: (0..size).collect(),
            label: Arc::from("world"),
            timeout,
            on_timeout,
            state: Mutex::new(EndpointState::default()),
        })
    }

    /// Locks MPI for one call, refusing it if the process's MPI state is poisoned.
    fn enter(&self, op: &'static str) -> Result<Call<'_>, CommError> {
        let raw = self.runtime.raw.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(first_error) = self
            .runtime
            .poisoned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(CommError::Poisoned {
                site: self.site(op),
                first_error,
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

impl Drop for MpiComm {
    fn drop(&mut self) {
        let raw = self.runtime.raw.lock().unwrap_or_else(|e| e.into_inner());
        if std::thread::panicking() && !self.runtime.announced.swap(true, Ordering::SeqCst) {
            raw.announce_failure(self.timeout.min(Duration::from_secs(2)));
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
        if err.poisons() {
            let mut poisoned = self
                .comm
                .runtime
                .poisoned
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            poisoned.get_or_insert_with(|| err.to_string());
        }
        err
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

    /// Polls `request` to completion, watching for failure notices and the deadline. On
    /// failure the request is abandoned, never freed: MPI may still own its buffers.
    fn wait(&mut self, request: Request) -> Result<(), CommError> {
        let members = &self.comm.members;
        match self.raw.poll(request, self.comm.timeout, |world_rank| {
            members.iter().position(|&m| m == world_rank)
        }) {
            Ok(()) => Ok(()),
            Err(raw::WaitError::Mpi(code, message)) => Err(self.fail(CommError::Mpi {
                site: self.site(),
                code,
                message,
            })),
            Err(raw::WaitError::Timeout) => Err(self.fail(CommError::Timeout {
                site: self.site(),
                timeout: self.comm.timeout,
                waiting_for: Vec::new(),
            })),
            Err(raw::WaitError::PeerPanicked(peer)) => Err(self.fail(CommError::PeerFailed {
                site: self.site(),
                peer,
                cause: PeerFailure::Panicked,
            })),
        }
    }

    /// Runs one collective: under [`OnTimeout::AbortJob`] the blocking MPI call, watched by
    /// the process's watchdog; otherwise the nonblocking one, polled against the deadline.
    fn collective(
        &mut self,
        blocking: impl FnOnce(&Raw) -> Result<(), MpiError>,
        nonblocking: impl FnOnce(&mut Raw) -> Result<Request, MpiError>,
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
            _ => {
                let request = nonblocking(&mut self.raw);
                let request = self.check(request)?;
                self.wait(request)
            }
        }
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
        let comm = created.map_err(|(code, message)| {
            call.fail(CommError::Mpi {
                site: call.site(),
                code,
                message,
            })
        })?;
        let list: Vec<String> = members.iter().map(|m| m.to_string()).collect();
        Ok(Box::new(MpiComm {
            runtime: self.runtime.clone(),
            comm,
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
        let (ptr, count) = match &mut widened {
            Some(wide) => (wide.as_mut_ptr().cast::<u8>(), wide.len()),
            None => (buf.bytes_mut().as_mut_ptr(), buf.len()),
        };
        let elems = (ptr, call.count(count)?, datatype(dtype));
        // SAFETY: the buffer outlives the call (or the wait; on failure the process never calls
        // MPI again, and a widened copy is leaked rather than freed).
        let done = call.collective(
            |raw| unsafe { raw.allreduce(&self.comm, elems, op) },
            |raw| unsafe { raw.iallreduce(&self.comm, elems, op, self.size) },
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
        let send_ptr = wide_send
            .as_ref()
            .map_or(send.bytes().as_ptr(), |w| w.as_ptr().cast::<u8>());
        let recv_ptr = match &mut wide_recv {
            Some(w) => w.as_mut_ptr().cast::<u8>(),
            None => recv.bytes_mut().as_mut_ptr(),
        };
        let mpi_dtype = datatype(dtype);
        // SAFETY: buffers and counts outlive the call (or the wait), or are leaked on failure.
        let done = call.collective(
            |raw| unsafe {
                raw.reduce_scatter(&self.comm, (send_ptr, recv_ptr), &mpi_counts, mpi_dtype, op)
            },
            |raw| unsafe {
                raw.ireduce_scatter(&self.comm, send_ptr, recv_ptr, &mpi_counts, mpi_dtype, op)
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
        if recv.len() != send.len() * self.size {
            return Err(call.invalid(format!(
                "recv has {} bytes but {} ranks × {} bytes sent need {}",
                recv.len(),
                self.size,
                send.len(),
                send.len() * self.size
            )));
        }
        let count = call.count(send.len())?;
        call.count(recv.len())?;
        let (send_ptr, recv_ptr) = (send.as_ptr(), recv.as_mut_ptr());
        // SAFETY: buffers outlive the call (or the wait; on failure the process never calls MPI
        // again).
        call.collective(
            |raw| unsafe { raw.allgather(&self.comm, send_ptr, count, recv_ptr) },
            |raw| unsafe { raw.iallgather(&self.comm, send_ptr, count, recv_ptr) },
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
        // SAFETY: buffers and counts outlive the call (or the wait), or are leaked on failure.
        call.collective(
            |raw| unsafe { raw.allgatherv(&self.comm, sent, recv_ptr, &mpi_counts, &displs) },
            |raw| unsafe {
                raw.iallgatherv(&self.comm, sent.0, sent.1, recv_ptr, &mpi_counts, &displs)
            },
        )
        .inspect_err(|_| {
            std::mem::forget((mpi_counts, displs));
        })
    }

    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        let n = self.size;
        if send.len() % n != 0 || recv.len() != send.len() {
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
        let (message, len) = match probed {
            Ok(found) => found,
            Err(raw::WaitError::Mpi(code, message)) => {
                return Err(call.fail(CommError::Mpi {
                    site: call.site(),
                    code,
                    message,
                }))
            }
            Err(raw::WaitError::Timeout) => {
                return Err(call.fail(CommError::Timeout {
                    site: call.site(),
                    timeout: self.timeout,
                    waiting_for: vec![src],
                }))
            }
            Err(raw::WaitError::PeerPanicked(peer)) => {
                return Err(call.fail(CommError::PeerFailed {
                    site: call.site(),
                    peer,
                    cause: PeerFailure::Panicked,
                }))
            }
        };
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
