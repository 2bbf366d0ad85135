//! The process's MPI state, shared by all its communicators: initialisation at the thread
//! level asked for, which threads may call MPI, and the poisoning that follows a failed call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, Weak};
use std::thread::ThreadId;
use std::time::Duration;

use super::raw::{self, Raw};
use super::watchdog::Watchdog;
use super::ThreadLevel;
use crate::error::{CommError, Site};
use crate::progress::{InCall, ProgressGauge};

/// The level the next initialisation of MPI asks for.
pub(super) static PREFERRED_LEVEL: Mutex<ThreadLevel> = Mutex::new(ThreadLevel::Serialized);

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
pub(super) struct Runtime {
    pub(super) raw: Mutex<Raw>,
    /// The thread support MPI gives.
    pub(super) level: ThreadLevel,
    /// Which threads may call MPI. `None`: any (one at a time). `Some(Some(t))`: only `t`, the
    /// thread that initialised MPI at less than `MPI_THREAD_SERIALIZED`. `Some(None)`: none —
    /// the application initialised it so, and the first communicator came from another thread.
    pub(super) owner: Option<Option<ThreadId>>,
    /// Set by the first failed call: no more MPI calls, no `MPI_Finalize`.
    pub(super) poisoned: Mutex<Option<String>>,
    /// Whether `poisoned` is set: what every call checks, without taking that lock.
    pub(super) is_poisoned: AtomicBool,
    /// Set once this process has announced its own panic.
    pub(super) announced: AtomicBool,
    /// Started by the first [`OnTimeout::AbortJob`](super::OnTimeout::AbortJob) communicator.
    pub(super) watchdog: OnceLock<Watchdog>,
    /// The progress reports to `tessera rank-env`, under `tessera launch` (the pipe of its
    /// start notice, [`crate::start_notice`]).
    pub(super) progress: Option<ProgressGauge>,
}

/// The process's MPI state while any communicator holds it.
pub(super) static RUNTIME: Mutex<Option<Weak<Runtime>>> = Mutex::new(None);

/// The longest a failing process waits for its failure notices to leave.
pub(super) const NOTICE_WAIT: Duration = Duration::from_secs(2);
/// The longest error message a failure notice carries (longer ones are cut).
pub(super) const MAX_NOTICE_BYTES: usize = 2048;

/// The error for a wait at `site` that ended without completion (`waiting_for`: the peer
/// waited for, when known).
pub(super) fn wait_error(
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
    pub(super) fn fail(&self, err: CommError) -> CommError {
        if err.poisons() {
            let mut poisoned = self.poisoned.lock().unwrap_or_else(|e| e.into_inner());
            poisoned.get_or_insert_with(|| err.to_string());
            self.is_poisoned.store(true, Ordering::Release);
        }
        err
    }

    /// Enters the progress gauge (when there is one) for the call `op` on `group`, until the
    /// guard is dropped: taken while the MPI lock is held.
    pub(super) fn enter_progress(&self, op: &'static str, group: &str) -> Option<InCall<'_>> {
        self.progress.as_ref().map(|gauge| gauge.enter(op, group))
    }

    /// Whether this thread may call MPI.
    pub(super) fn on_owner_thread(&self) -> bool {
        match self.owner {
            None => true,
            Some(owner) => owner == Some(this_thread()),
        }
    }
}

/// This thread's id, read from thread-local storage (cheaper than `thread::current()`).
pub(super) fn this_thread() -> ThreadId {
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
