//! Waiting with a deadline: spin, then yield, then sleep on a doorbell.
//!
//! The ranks of the local backend are threads; a wait is a poll of atomics written by peers.
//! When every rank has a core of its own, a waiter spins briefly (a peer on another core usually
//! answers within microseconds), then yields, then sleeps on the cluster's [`Doorbell`], which
//! every arrival, message and failure rings. When there are more ranks than cores
//! (*oversubscribed*), the peer being waited for is likely queued behind the waiter on the same
//! core, so spinning only delays it: the waiter yields at once.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a waiter with a core of its own busy-polls before it yields. Measured by the clock
/// (read every [`POLLS_PER_CLOCK`] polls), not by iterations: a poll of three peers plus a
/// `pause` costs 20–60 ns here, so the 2 000-iteration spin this replaced lasted 40–120 µs.
const SPIN_FOR: Duration = Duration::from_micros(20);
/// Polls between clock reads while spinning (a clock read costs ~35 ns in this VM).
const POLLS_PER_CLOCK: u32 = 32;
/// How long a waiter yields its core between polls before it sleeps. Yielding hands the core
/// to a runnable peer without the wake-up latency of a sleep (tens of microseconds), which
/// would dominate small collectives; oversubscribed, the peer waited for may need a whole
/// scheduler slice of another rank to pass first, hence milliseconds rather than microseconds.
const YIELD_FOR: Duration = Duration::from_millis(2);
/// Longest single sleep: a safety net so that even a missed ring only delays a waiter.
const MAX_NAP: Duration = Duration::from_millis(20);

/// A condition variable every state change rings, for waiters that went to sleep.
///
/// Futex-style: a waiter reads the generation, polls, and sleeps only if the generation has
/// not moved since; every ring bumps it. No state change between the poll and the sleep can be
/// missed, and polls never run under the lock.
#[derive(Debug)]
pub(crate) struct Doorbell {
    /// Every ring writes here, so these share no cache line with what waiters only read.
    counters: Counters,
    lock: Mutex<()>,
    cv: Condvar,
    /// More ranks than cores: waiters yield at once instead of spinning.
    oversubscribed: bool,
}

/// The doorbell's written fields, alone in their cache lines (two, against the adjacent-line
/// prefetcher): with the flag read by every wait on the same line, each wait missed in cache
/// on a line the peers had just rung, which cost 4–16 KiB collectives up to a third of their
/// bandwidth.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Counters {
    generation: AtomicU64,
    sleepers: AtomicUsize,
}

impl Doorbell {
    /// The doorbell of a cluster of `n_ranks` threads.
    pub(crate) fn new(n_ranks: usize) -> Doorbell {
        let n_cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Doorbell {
            counters: Counters::default(),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            oversubscribed: n_ranks > n_cores,
        }
    }

    /// Whether the cluster has more ranks than cores.
    pub(crate) fn oversubscribed(&self) -> bool {
        self.oversubscribed
    }

    /// Wakes every sleeping waiter. Call after the state change is stored.
    pub(crate) fn ring(&self) {
        self.counters.generation.fetch_add(1, Ordering::SeqCst);
        if self.counters.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }

    fn generation(&self) -> u64 {
        self.counters.generation.load(Ordering::SeqCst)
    }

    /// Sleeps until rung or `until`, unless a ring came after `seen` was read.
    fn sleep(&self, seen: u64, until: Instant) {
        let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.counters.sleepers.fetch_add(1, Ordering::SeqCst);
        if self.counters.generation.load(Ordering::SeqCst) == seen {
            let nap = until.saturating_duration_since(Instant::now()).min(MAX_NAP);
            let _unused = self
                .cv
                .wait_timeout(guard, nap)
                .unwrap_or_else(|e| e.into_inner());
        }
        self.counters.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one poll found.
pub(crate) enum Poll<T> {
    /// The condition holds.
    Ready(T),
    /// Not yet.
    Pending,
}

thread_local! {
    /// Time this thread has spent blocked in [`block_on`].
    static WAITED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// Time the calling thread has spent blocked waiting for its peers in the local backend
/// (collectives, messages, failures) since it started: from the first poll that found a peer
/// not ready until the wait ended. A rank's communication time less the growth of this is the
/// time it spent moving and summing bytes.
pub fn thread_wait_time() -> Duration {
    WAITED.with(Cell::get)
}

/// Polls until `poll` is ready (`Ok(Some(value))`), fails (`Err`), or `deadline` passes
/// (`Ok(None)`). The time from the first poll that is not ready to the end of the wait is added
/// to [`thread_wait_time`].
pub(crate) fn block_on<T, E>(
    doorbell: &Doorbell,
    deadline: Instant,
    mut poll: impl FnMut() -> Result<Poll<T>, E>,
) -> Result<Option<T>, E> {
    if let Poll::Ready(v) = poll()? {
        return Ok(Some(v));
    }
    let since = Instant::now();
    let result = wait_until_ready(doorbell, deadline, poll);
    WAITED.with(|waited| waited.set(waited.get() + since.elapsed()));
    result
}

/// [`block_on`]'s wait: spin, then yield, then sleep on the doorbell, polling in between.
fn wait_until_ready<T, E>(
    doorbell: &Doorbell,
    deadline: Instant,
    mut poll: impl FnMut() -> Result<Poll<T>, E>,
) -> Result<Option<T>, E> {
    if !doorbell.oversubscribed {
        let spin_until = Instant::now() + SPIN_FOR;
        loop {
            for _ in 0..POLLS_PER_CLOCK {
                if let Poll::Ready(v) = poll()? {
                    return Ok(Some(v));
                }
                std::hint::spin_loop();
            }
            if Instant::now() >= spin_until {
                break;
            }
        }
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
