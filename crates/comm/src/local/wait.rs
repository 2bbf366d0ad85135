//! Waiting with a deadline: spin, then yield, then sleep on a doorbell.
//!
//! The ranks of the local backend are threads; a wait is a poll of atomics written by peers.
//! A waiter spins briefly (a peer on another core usually answers within microseconds), then
//! yields its core (with more ranks than cores the peer it waits for needs that core), then
//! sleeps on the cluster's [`Doorbell`], which every arrival, message and failure rings.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Busy-poll iterations before the first clock read. About 2–5 µs on this class of CPU: long
/// enough to catch a peer running on another core, short enough not to starve one that shares
/// ours.
const SPIN_ITERS: u32 = 2_000;
/// How long a waiter yields its core between polls before it sleeps. With more ranks than
/// cores the peer being waited for needs this core; yielding hands it over without the
/// wake-up latency of a sleep (tens of microseconds), which would dominate small collectives.
const YIELD_FOR: Duration = Duration::from_micros(200);
/// Longest single sleep: a safety net so that even a missed ring only delays a waiter.
const MAX_NAP: Duration = Duration::from_millis(20);

/// A condition variable every state change rings, for waiters that went to sleep.
///
/// Futex-style: a waiter reads the generation, polls, and sleeps only if the generation has
/// not moved since; every ring bumps it. No state change between the poll and the sleep can be
/// missed, and polls never run under the lock.
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    lock: Mutex<()>,
    cv: Condvar,
    generation: AtomicU64,
    sleepers: AtomicUsize,
}

impl Doorbell {
    /// Wakes every sleeping waiter. Call after the state change is stored.
    pub(crate) fn ring(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Sleeps until rung or `until`, unless a ring came after `seen` was read.
    fn sleep(&self, seen: u64, until: Instant) {
        let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        if self.generation.load(Ordering::SeqCst) == seen {
            let nap = until.saturating_duration_since(Instant::now()).min(MAX_NAP);
            let _unused = self
                .cv
                .wait_timeout(guard, nap)
                .unwrap_or_else(|e| e.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one poll found.
pub(crate) enum Poll<T> {
    /// The condition holds.
    Ready(T),
    /// Not yet.
    Pending,
}

/// Polls until `poll` is ready (`Ok(Some(value))`), fails (`Err`), or `deadline` passes
/// (`Ok(None)`).
pub(crate) fn block_on<T, E>(
    doorbell: &Doorbell,
    deadline: Instant,
    mut poll: impl FnMut() -> Result<Poll<T>, E>,
) -> Result<Option<T>, E> {
    for _ in 0..SPIN_ITERS {
        if let Poll::Ready(v) = poll()? {
            return Ok(Some(v));
        }
        std::hint::spin_loop();
    }
    let yield_until = Instant::now() + YIELD_FOR;
    loop {
        let seen = doorbell.generation();
        if let Poll::Ready(v) = poll()? {
            return Ok(Some(v));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        if now < yield_until {
            std::thread::yield_now();
        } else {
            doorbell.sleep(seen, deadline);
        }
    }
}
