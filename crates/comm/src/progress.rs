//! The gauge behind the MPI backend's progress reports ([`MpiProgress`]): whether this process
//! is inside an MPI call, and for how long it has been inside one call or outside every call.
//!
//! Around each call the caller *enters* and *leaves* the gauge (an atomic increment each, plus
//! an uncontended lock to describe the call, as the watchdog does); a thread of its own looks at
//! the count every [`CHECK_EVERY`]. When it has not moved for [`STEADY_AFTER`] the thread writes
//! one report (inside the call, or outside every call, with the time so far), and
//! [`MpiProgress::Moving`] once it moves again: a few lines over a whole run, none while the
//! rank makes calls. A failed write (the reader is gone) ends the thread; so does dropping the
//! gauge.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::start_notice::MpiProgress;

/// How often the gauge's thread looks at the count.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(250);
/// How long the count must stand still before the state is reported.
pub(crate) const STEADY_AFTER: Duration = Duration::from_secs(2);

/// The process's gauge; see the module docs.
pub(crate) struct ProgressGauge {
    shared: Arc<Shared>,
}

struct Shared {
    /// Incremented when a call is entered and when it is left: odd while one runs.
    calls: AtomicU64,
    /// The call running (or run last): its operation and its group's label.
    current: Mutex<(&'static str, Arc<str>)>,
}

/// Leaves the gauge when dropped (the call returned).
pub(crate) struct InCall<'a> {
    shared: &'a Shared,
}

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        self.shared.calls.fetch_add(1, Ordering::Release);
    }
}

impl ProgressGauge {
    /// A gauge whose thread writes its reports to `out`.
    pub(crate) fn start(out: impl Write + Send + 'static) -> std::io::Result<ProgressGauge> {
        ProgressGauge::start_with(out, CHECK_EVERY, STEADY_AFTER)
    }

    /// [`ProgressGauge::start`] looking every `check_every`, reporting a state that held for
    /// `steady_after`.
    pub(crate) fn start_with(
        mut out: impl Write + Send + 'static,
        check_every: Duration,
        steady_after: Duration,
    ) -> std::io::Result<ProgressGauge> {
        let shared = Arc::new(Shared {
            calls: AtomicU64::new(0),
            current: Mutex::new(("", Arc::from(""))),
        });
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("tessera-mpi-progress".to_string())
            .spawn(move || watch(&weak, &mut out, check_every, steady_after))?;
        Ok(ProgressGauge { shared })
    }

    /// Enters the gauge for the call `op` on the group labelled `group`, until the guard is
    /// dropped; calls are serialised by the caller (they hold the MPI lock).
    pub(crate) fn enter(&self, op: &'static str, group: &str) -> InCall<'_> {
        let shared = &*self.shared;
        {
            let mut current = shared.current.lock().unwrap_or_else(|e| e.into_inner());
            // Usually the same call as last time: no allocation then.
            if current.0 != op || &*current.1 != group {
                *current = (op, Arc::from(group));
            }
        }
        // Release: the thread that sees the odd count sees the call's description.
        shared.calls.fetch_add(1, Ordering::Release);
        InCall { shared }
    }
}

/// The gauge's thread: ends when the gauge is dropped or a report cannot be written.
fn watch(shared: &Weak<Shared>, out: &mut dyn Write, check_every: Duration, steady: Duration) {
    let mut last = 0u64;
    let mut since = Instant::now();
    let mut reported = false;
    loop {
        std::thread::sleep(check_every);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let calls = shared.calls.load(Ordering::Acquire);
        let report = if calls != last {
            last = calls;
            since = Instant::now();
            std::mem::take(&mut reported).then_some(MpiProgress::Moving)
        } else if !reported && since.elapsed() >= steady {
            reported = true;
            let for_ms = since.elapsed().as_millis() as u64;
            Some(match calls % 2 {
                1 => {
                    let (op, group) = &*shared.current.lock().unwrap_or_else(|e| e.into_inner());
                    MpiProgress::Inside {
                        call: format!("{op} on group {group}"),
                        for_ms,
                    }
                }
                _ => MpiProgress::Outside { for_ms },
            })
        } else {
            None
        };
        drop(shared);
        if let Some(report) = report {
            if out
                .write_all(report.line().as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the gauge's thread wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn reports(&self) -> Vec<MpiProgress> {
            let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
            text.lines()
                .map(|l| MpiProgress::parse(l).expect(l))
                .collect()
        }

        /// Waits (at most 10 s, against a hang) until `n` reports were written.
        fn wait_for(&self, n: usize) -> Vec<MpiProgress> {
            let start = Instant::now();
            while self.reports().len() < n && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.reports()
        }
    }

    const CHECK: Duration = Duration::from_millis(5);
    const STEADY: Duration = Duration::from_millis(60);

    #[test]
    fn a_call_that_stands_still_is_reported_once_then_its_end() {
        let lines = Lines::default();
        let gauge = ProgressGauge::start_with(lines.clone(), CHECK, STEADY).unwrap();
        let call = gauge.enter("all_reduce", "world");
        let reports = lines.wait_for(1);
        let Some(MpiProgress::Inside { call: what, for_ms }) = reports.first() else {
            panic!("{reports:?}");
        };
        assert_eq!(what, "all_reduce on group world");
        assert!(*for_ms >= STEADY.as_millis() as u64, "{for_ms}");
        // Said once, however long it stays.
        std::thread::sleep(STEADY * 3);
        assert_eq!(lines.reports().len(), 1);
        drop(call);
        let reports = lines.wait_for(3);
        assert_eq!(reports[1], MpiProgress::Moving);
        assert!(
            matches!(reports[2], MpiProgress::Outside { for_ms } if for_ms >= STEADY.as_millis() as u64),
            "{reports:?}"
        );
    }

    #[test]
    fn a_rank_making_calls_reports_nothing_and_a_dropped_gauge_stops() {
        let lines = Lines::default();
        let gauge = ProgressGauge::start_with(lines.clone(), CHECK, STEADY).unwrap();
        let start = Instant::now();
        while start.elapsed() < STEADY * 4 {
            drop(gauge.enter("barrier", "dp"));
            std::thread::sleep(CHECK / 2);
        }
        assert!(lines.reports().is_empty(), "{:?}", lines.reports());
        let weak = Arc::downgrade(&gauge.shared);
        drop(gauge);
        std::thread::sleep(STEADY * 2);
        assert!(weak.upgrade().is_none());
        assert!(lines.reports().is_empty(), "{:?}", lines.reports());
    }
}
