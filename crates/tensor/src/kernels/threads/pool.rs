//! The kernel threads' pool: `n − 1` helper threads and the calling rank thread, each running
//! its own fixed share of a split kernel's parts.
//!
//! Why not rayon's pool: a rayon split hands its parts to whichever worker comes first while the
//! caller sleeps on a latch. On a rank with as many threads as cores that is one thread more
//! than the cores, the caller must be woken and scheduled after every split op, and the band of
//! rows one op wrote lands on either core for the next op. Here the caller computes part 0 (and
//! every `n`-th part after it) itself, helper `k` always part `k` (mod `n`), and a helper spins
//! briefly between ops before it sleeps, so a chain of split ops keeps each band on one core.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, TryLockError};
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before it sleeps: longer than the unsplit ops
/// between two split ones usually take, short enough not to hold a core from other ranks.
const SPIN: Duration = Duration::from_micros(200);

/// A job's shares: `run(k)` computes the parts of thread `k`.
type Share<'a> = dyn Fn(usize) + Sync + 'a;

/// What the helpers share with the caller.
struct Shared {
    /// Bumped once per job; a helper runs the job when it sees a new value.
    generation: AtomicU64,
    /// The current job, valid while `pending > 0` (its lifetime erased; see [`Pool::run`]).
    job: Mutex<Option<&'static Share<'static>>>,
    /// Helpers still running the current job.
    pending: AtomicUsize,
    /// The first panic of a helper in the current job.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// Sleeping helpers wait here for a new generation.
    wake: Condvar,
    /// The lock the sleepers wait under.
    sleep: Mutex<()>,
}

/// A pool of `threads − 1` helpers; one job at a time (see [`Pool::run`]).
pub(super) struct Pool {
    threads: usize,
    shared: Arc<Shared>,
    /// Held by the caller whose job is running.
    busy: Mutex<()>,
}

impl Pool {
    /// The process's pool of `threads` threads (the caller and `threads − 1` helpers), started
    /// on first use; `None` if its helpers could not be started.
    pub(super) fn get(threads: usize) -> Option<&'static Pool> {
        static POOLS: Mutex<Vec<&'static Pool>> = Mutex::new(Vec::new());
        static FAILED: OnceLock<()> = OnceLock::new();
        if FAILED.get().is_some() {
            return None;
        }
        let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pool) = pools.iter().find(|p| p.threads == threads) {
            return Some(pool);
        }
        match Pool::start(threads) {
            Some(pool) => {
                // One pool per thread count a process asks for, kept for its life (the
                // helpers sleep when idle).
                let pool: &'static Pool = Box::leak(Box::new(pool));
                pools.push(pool);
                Some(pool)
            }
            None => {
                let _ = FAILED.set(());
                None
            }
        }
    }

    fn start(threads: usize) -> Option<Pool> {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            pending: AtomicUsize::new(0),
            panic: Mutex::new(None),
            wake: Condvar::new(),
            sleep: Mutex::new(()),
        });
        for k in 1..threads {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("tessera-kernel-{k}"))
                .spawn(move || helper(&shared, k))
                .ok()?;
        }
        Some(Pool {
            threads,
            shared,
            busy: Mutex::new(()),
        })
    }

    /// Runs `share(k)` for every thread `k` of the pool, `share(0)` on the caller; returns when
    /// all have finished, re-raising the first panic. `false` (nothing run) when another caller's
    /// job holds the pool: the caller then computes every share itself.
    pub(super) fn run(&self, share: &Share<'_>) -> bool {
        // A panic re-raised below poisons the lock; the pool itself is whole again by then.
        let _busy = match self.busy.try_lock() {
            Ok(busy) => busy,
            Err(TryLockError::Poisoned(busy)) => busy.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let shared = &*self.shared;
        // SAFETY: the erased borrow is stored only until every helper has decremented
        // `pending` below, which this function waits for on every path (the caller's own
        // share runs under `catch_unwind`), and is cleared before returning.
        let job: &'static Share<'static> = unsafe { std::mem::transmute(share) };
        *shared.job.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
        shared.pending.store(self.threads - 1, Ordering::SeqCst);
        shared.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _sleep = shared.sleep.lock().unwrap_or_else(PoisonError::into_inner);
            shared.wake.notify_all();
        }
        let own = catch_unwind(AssertUnwindSafe(|| share(0)));
        wait_until(|| shared.pending.load(Ordering::Acquire) == 0);
        *shared.job.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let helper_panic = shared
            .panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Err(payload) = own {
            resume_unwind(payload);
        }
        if let Some(payload) = helper_panic {
            resume_unwind(payload);
        }
        true
    }
}

/// Helper `k`'s loop: wait for a new generation, run share `k`, report done.
fn helper(shared: &Shared, k: usize) {
    let mut seen = 0;
    loop {
        let spin_until = Instant::now() + SPIN;
        let mut spins = 0u32;
        let generation = loop {
            let g = shared.generation.load(Ordering::Acquire);
            if g != seen {
                break g;
            }
            spins += 1;
            if !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            if Instant::now() < spin_until {
                continue;
            }
            let sleep = shared.sleep.lock().unwrap_or_else(PoisonError::into_inner);
            if shared.generation.load(Ordering::Acquire) == seen {
                drop(
                    shared
                        .wake
                        .wait(sleep)
                        .unwrap_or_else(PoisonError::into_inner),
                );
            }
        };
        seen = generation;
        let job = *shared.job.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(job) = job {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| job(k))) {
                let mut first = shared.panic.lock().unwrap_or_else(PoisonError::into_inner);
                first.get_or_insert(payload);
            }
        }
        shared.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Spins, then yields, until `done()`.
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        spins = spins.saturating_add(1);
        if spins < 1 << 14 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
