//! Ending a local run that a hung rank would keep alive forever.
//!
//! The local backend runs every rank on a thread of one process, and a thread cannot be
//! stopped: when one rank hangs (a deadlock, an endless kernel, `TESSERA_FAULT=…,at=hang`) its
//! peers' collectives time out and they return their errors, but joining the hung thread never
//! ends. [`HangWatch`] records when the first rank failed, the failure that explains the most
//! (the root cause, by the same [`Blame`] order as the run's own report) and the ranks still
//! running; its watchdog, armed for the command line
//! ([`crate::LaunchOptions::exit_on_hung_rank`]), prints that cause and exits the process when
//! ranks are still running `grace` after the first failure.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::launch::Blame;

/// When a local run first failed, its root cause so far, and the ranks still running.
#[derive(Debug)]
pub(crate) struct HangWatch {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    running: BTreeSet<usize>,
    /// The failure that explains the most so far, from the first failure on.
    cause: Option<Cause>,
    done: bool,
}

/// A run's root cause so far.
#[derive(Debug)]
struct Cause {
    /// When the first rank failed (whichever failure that was).
    since: Instant,
    /// How much the failure explains, and the rank (the lowest among equals).
    blame: Blame,
    rank: usize,
    message: String,
}

impl HangWatch {
    /// A watch over ranks `0..ranks`, all running.
    pub(crate) fn new(ranks: usize) -> Arc<HangWatch> {
        Arc::new(HangWatch {
            state: Mutex::new(State {
                running: (0..ranks).collect(),
                cause: None,
                done: false,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Rank `rank` has ended, with `failure` (how much it explains, its message) when it
    /// failed. A peer's "peer exited" can end before the timeout that caused it: the report
    /// keeps the failure that explains the most, whatever order they came in.
    pub(crate) fn ended(&self, rank: usize, failure: Option<(Blame, String)>) {
        let mut s = self.state();
        s.running.remove(&rank);
        let Some((blame, message)) = failure else {
            return;
        };
        match &mut s.cause {
            None => {
                s.cause = Some(Cause {
                    since: Instant::now(),
                    blame,
                    rank,
                    message,
                })
            }
            Some(held) if (blame, rank) < (held.blame, held.rank) => {
                (held.blame, held.rank, held.message) = (blame, rank, message);
            }
            Some(_) => {}
        }
    }

    /// The run returned: the watchdog stands down.
    pub(crate) fn finish(&self) {
        self.state().done = true;
    }

    /// When a rank failed more than `grace` ago and ranks are still running: the message
    /// naming the failure and the hung ranks.
    pub(crate) fn hung(&self, grace: Duration) -> Option<String> {
        let s = self.state();
        let Cause {
            since,
            rank,
            message,
            ..
        } = s.cause.as_ref()?;
        if s.done || s.running.is_empty() || since.elapsed() < grace {
            return None;
        }
        Some(format!(
            "rank {rank}: {message}\nerror: rank(s) {:?} did not end within {} s after that failure: they are hung, and a thread cannot be stopped, so the process exits",
            s.running,
            grace.as_secs()
        ))
    }

    /// Starts the watchdog thread: it polls [`HangWatch::hung`] and, when ranks hang, prints
    /// the error and exits the process with status 1 (the command line's error exit).
    pub(crate) fn exit_when_hung(self: &Arc<HangWatch>, grace: Duration) {
        let watch = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("tessera-hang-watch".to_string())
            .spawn(move || loop {
                if watch.state().done {
                    return;
                }
                if let Some(message) = watch.hung(grace) {
                    eprintln!("error: {message}");
                    std::process::exit(1);
                }
                std::thread::sleep(Duration::from_millis(100));
            });
        // Without the thread the run behaves as before (joins every rank).
        drop(spawned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hung ranks are reported only after a failure, once the grace has passed and while the
    /// run has not returned; ranks that all end clear it.
    #[test]
    fn a_failure_with_ranks_still_running_past_the_grace_is_a_hang() {
        let watch = HangWatch::new(3);
        assert_eq!(watch.hung(Duration::ZERO), None, "no failure yet");
        watch.ended(2, None);
        watch.ended(
            0,
            Some((Blame::Timeout, "collective timed out".to_string())),
        );
        assert_eq!(
            watch.hung(Duration::from_secs(3600)),
            None,
            "within the grace"
        );
        let message = watch.hung(Duration::ZERO).expect("rank 1 hangs");
        assert!(
            message.starts_with("rank 0: collective timed out"),
            "{message}"
        );
        assert!(message.contains("rank(s) {1}"), "{message}");
        watch.ended(1, Some((Blame::Consequence, "peer failed".to_string())));
        assert_eq!(watch.hung(Duration::ZERO), None, "every rank ended");
        let finished = HangWatch::new(2);
        finished.ended(0, Some((Blame::OwnFault, "x".to_string())));
        finished.finish();
        assert_eq!(finished.hung(Duration::ZERO), None, "the run returned");
    }

    /// A peer's "peer exited" that ends before the timeout which caused it does not take the
    /// report: the timeout explains more, whatever order the ranks ended in.
    #[test]
    fn the_report_names_the_root_cause_not_the_first_to_end() {
        let watch = HangWatch::new(8);
        for rank in [0, 2, 3, 5, 6, 7] {
            watch.ended(rank, None);
        }
        watch.ended(
            4,
            Some((
                Blame::Consequence,
                "peer rank 0 exited without joining".to_string(),
            )),
        );
        let message = watch.hung(Duration::ZERO).expect("rank 1 hangs");
        assert!(message.starts_with("rank 4: peer rank 0"), "{message}");
        let watch = HangWatch::new(3);
        watch.ended(2, Some((Blame::Consequence, "peer exited".to_string())));
        watch.ended(0, Some((Blame::Timeout, "timed out after 2s".to_string())));
        let message = watch.hung(Duration::ZERO).expect("rank 1 hangs");
        assert!(
            message.starts_with("rank 0: timed out after 2s"),
            "{message}"
        );
        assert!(message.contains("rank(s) {1}"), "{message}");
    }
}
