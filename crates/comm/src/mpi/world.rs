//! [`MpiComm`], one rank's communicator: its world constructor (which initialises MPI), the
//! lock every call takes, failure announcements, and what dropping it frees.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use super::call::Call;
use super::p2p;
use super::raw::{self, MpiError, Raw, Request};
use super::runtime::{
    this_thread, Runtime, MAX_NOTICE_BYTES, NOTICE_WAIT, PREFERRED_LEVEL, RUNTIME,
};
use super::watchdog::Watchdog;
use super::{OnTimeout, ThreadLevel, BACKEND};
use crate::communicator::Communicator;
use crate::error::CommError;
use crate::progress::ProgressGauge;

/// One rank's communicator over one MPI group.
pub struct MpiComm {
    pub(super) runtime: Arc<Runtime>,
    pub(super) comm: raw::Comm,
    /// A duplicate of `comm` for the point-to-point collectives ([`p2p`]), so their messages
    /// never meet the application's `send`/`recv`.
    pub(super) coll: raw::Comm,
    pub(super) rank: usize,
    pub(super) size: usize,
    /// Members as world ranks, in group-rank order.
    pub(super) members: Vec<usize>,
    pub(super) label: Arc<str>,
    pub(super) timeout: Duration,
    /// Whether collectives are polled or blocking under the process's watchdog.
    pub(super) on_timeout: OnTimeout,
    pub(super) state: Mutex<EndpointState>,
}

#[derive(Default)]
/// What one communicator keeps between calls.
pub(super) struct EndpointState {
    /// Sends still in flight, with the buffers they read.
    pub(super) pending_sends: Vec<(Request, Vec<u8>)>,
    /// How many groups with these members were created from this communicator.
    pub(super) groups_made: std::collections::HashMap<Vec<usize>, u64>,
    /// The point-to-point collectives' receive buffers, kept across calls (8-byte aligned).
    pub(super) scratch: Vec<u64>,
    /// The point-to-point collectives' step bookkeeping, kept across calls.
    pub(super) step: p2p::Step,
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
                    // Reports are a diagnosis: a gauge that cannot start leaves the run as it is.
                    progress: crate::start_notice::take_progress_pipe()
                        .and_then(|pipe| ProgressGauge::start(pipe).ok()),
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
    pub(super) fn enter(&self, op: &'static str) -> Result<Call<'_>, CommError> {
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
            _in_call: self.runtime.enter_progress(op, &self.label),
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
