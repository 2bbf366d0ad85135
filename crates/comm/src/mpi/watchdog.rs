//! The watchdog of [`OnTimeout::AbortJob`](super::OnTimeout::AbortJob) communicators.
//!
//! Their collectives are blocking MPI calls, which nothing can interrupt. Around each call the
//! caller *arms* and *disarms* the watchdog — an atomic increment each, plus an uncontended
//! lock to describe the call: the only per-call cost, tens of nanoseconds, and no clock read. A
//! thread of its own wakes every [`CHECK_EVERY`] and times the call it finds armed; once one
//! call has run past its timeout it prints which rank and call hung and ends the MPI job, as
//! NCCL's watchdog does with a stuck NCCL communicator. Nothing hangs, but nothing is returned
//! either: the job is over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often the watchdog thread checks the armed call. A call is timed from the first check
/// that sees it, so it is declared overdue between its timeout and its timeout plus twice
/// this — never early. Ten wake-ups a second cost nothing measurable.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The process's watchdog; see the module docs.
pub(super) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    /// Incremented when a call is armed and when it is disarmed: odd while a call runs.
    calls: AtomicU64,
    /// What the running call is, for the message. Written only by the (serialised) callers.
    current: Mutex<Watched>,
    world_rank: usize,
}

/// A call the watchdog watches.
#[derive(Clone, Default, PartialEq)]
pub(super) struct Watched {
    pub(super) op: &'static str,
    pub(super) group: Arc<str>,
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) timeout: Duration,
}

/// Disarms the watchdog when dropped (the call returned).
pub(super) struct Armed<'a> {
    shared: &'a Shared,
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.shared.calls.fetch_add(1, Ordering::Release);
    }
}

impl Watchdog {
    /// Starts the watchdog thread of this process (world rank `world_rank`, for messages).
    pub(super) fn start(world_rank: usize) -> Result<Watchdog, String> {
        let shared = Arc::new(Shared {
            calls: AtomicU64::new(0),
            current: Mutex::new(Watched::default()),
            world_rank,
        });
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("tessera-mpi-watchdog".to_string())
            .spawn(move || watch(&weak))
            .map_err(|err| format!("cannot start the MPI watchdog thread: {err}"))?;
        Ok(Watchdog { shared })
    }

    /// Arms the watchdog for one call; calls are serialised by the caller.
    pub(super) fn arm(&self, watched: &Watched) -> Armed<'_> {
        let shared = &*self.shared;
        {
            let mut current = shared.current.lock().unwrap_or_else(|e| e.into_inner());
            // Usually the same call as last time: skip the reference counting of a clone.
            if *current != *watched {
                current.clone_from(watched);
            }
        }
        // Release: the watchdog that sees the odd count sees the call's description.
        shared.calls.fetch_add(1, Ordering::Release);
        Armed { shared }
    }
}

/// The watchdog thread: ends when the process's MPI state is dropped.
fn watch(shared: &Weak<Shared>) {
    // The armed call seen last (its `calls` count) and when it was first seen.
    let mut seen: Option<(u64, Instant)> = None;
    loop {
        std::thread::sleep(CHECK_EVERY);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let calls = shared.calls.load(Ordering::Acquire);
        if calls.is_multiple_of(2) {
            seen = None;
            continue;
        }
        let first_seen = match seen {
            Some((seen_calls, at)) if seen_calls == calls => at,
            _ => {
                seen = Some((calls, Instant::now()));
                continue;
            }
        };
        let watched = shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Still the same call (the count has not moved), overdue.
        if first_seen.elapsed() >= watched.timeout && shared.calls.load(Ordering::Acquire) == calls
        {
            eprintln!(
                "tessera: MPI watchdog: world rank {}: {} on group {} (rank {} of {}) did not \
                 complete within {:?}; a blocking MPI collective cannot be cancelled, so the \
                 watchdog ends the MPI job (OnTimeout::AbortJob)",
                shared.world_rank,
                watched.op,
                watched.group,
                watched.rank,
                watched.size,
                watched.timeout
            );
            super::raw::abort_job(1);
        }
    }
}
