//! Where a rank's step time goes: kernels by op kind, and reshards (communication), as
//! [`crate::RankExecutor::run`] records them when profiling is on.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Accumulated time of one kind of step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Total time.
    pub time: Duration,
    /// Of `time`, how long the rank's thread was blocked waiting for its peers (the local
    /// backend's waits, [`comm::thread_wait_time`]; zero for kernels and for backends that do
    /// not report waits).
    pub waited: Duration,
    /// Steps counted.
    pub count: u64,
}

impl Tally {
    fn add(&mut self, time: Duration, waited: Duration) {
        self.time += time;
        self.waited += waited.min(time);
        self.count += 1;
    }
}

/// When a profiled step began: the clock, and the rank thread's time blocked on its peers so
/// far.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpanStart {
    at: Instant,
    waited: Duration,
}

impl SpanStart {
    /// Now.
    pub(crate) fn now() -> SpanStart {
        SpanStart {
            at: Instant::now(),
            waited: comm::thread_wait_time(),
        }
    }

    /// Time since the start.
    pub(crate) fn elapsed(&self) -> Duration {
        self.at.elapsed()
    }

    /// Time since the start that this thread spent blocked waiting for its peers.
    pub(crate) fn waited(&self) -> Duration {
        comm::thread_wait_time().saturating_sub(self.waited)
    }
}

/// The time a rank spent in each kind of program step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepProfile {
    /// Kernel time by op kind (`MatMul`, `LayerNormGrad`, …).
    pub kernels: BTreeMap<&'static str, Tally>,
    /// Reshard time (collectives and local copies).
    pub reshards: Tally,
    /// Reshard time by what the reshard runs on this rank (`all-reduce`, `all-gather`, …: see
    /// [`reshard::ReshardPlan::collective_on`]).
    pub reshard_kinds: BTreeMap<&'static str, Tally>,
    /// Program runs recorded.
    pub runs: u64,
}

impl StepProfile {
    /// Records a kernel of `kind` that took `time`.
    pub fn kernel(&mut self, kind: &'static str, time: Duration) {
        self.kernels
            .entry(kind)
            .or_default()
            .add(time, Duration::ZERO);
    }

    /// Records a reshard of `kind` ([`reshard::ReshardPlan::collective_on`], or one of the kinds
    /// below) that took `time`, `waited` of it blocked on the peers.
    pub fn reshard(&mut self, kind: &'static str, time: Duration, waited: Duration) {
        self.reshards.add(time, waited);
        self.reshard_kinds
            .entry(kind)
            .or_default()
            .add(time, waited);
    }

    /// Total kernel time.
    pub fn kernel_time(&self) -> Duration {
        self.kernels.values().map(|t| t.time).sum()
    }

    /// A table of the time per run: every op kind, the kernels' total and the reshards, each
    /// in milliseconds per run and as a share of `step` (the whole step's time per run); the
    /// reshards' lines also say how much of their time was spent waiting for the peers.
    pub fn table(&self, step: Duration) -> String {
        let runs = self.runs.max(1) as f64;
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / runs;
        let share = |d: Duration| 100.0 * d.as_secs_f64() / (step.as_secs_f64() * runs).max(1e-12);
        let mut kinds: Vec<(&&str, &Tally)> = self.kernels.iter().collect();
        kinds.sort_by_key(|k| std::cmp::Reverse(k.1.time));
        let mut out = String::new();
        for (kind, t) in kinds {
            let _ = writeln!(
                out,
                "  {kind:<32} {:>8.3} ms {:>5.1}%",
                ms(t.time),
                share(t.time)
            );
        }
        let kernels = self.kernel_time();
        let _ = writeln!(
            out,
            "  {:<32} {:>8.3} ms {:>5.1}%",
            "= kernels",
            ms(kernels),
            share(kernels)
        );
        let waiting = |t: &Tally| format!("  (waiting for peers {:.3} ms)", ms(t.waited));
        let _ = writeln!(
            out,
            "  {:<32} {:>8.3} ms {:>5.1}%{}",
            "reshards (communication)",
            ms(self.reshards.time),
            share(self.reshards.time),
            waiting(&self.reshards)
        );
        let mut kinds: Vec<(&&str, &Tally)> = self.reshard_kinds.iter().collect();
        kinds.sort_by_key(|k| std::cmp::Reverse(k.1.time));
        for (kind, t) in kinds {
            let label = format!("{kind} ×{}", t.count as f64 / runs);
            let _ = writeln!(
                out,
                "    {label:<30} {:>8.3} ms {:>5.1}%{}",
                ms(t.time),
                share(t.time),
                waiting(t)
            );
        }
        out
    }
}

/// The kind ring attention's waits for key/value blocks are profiled as.
pub const RING_WAITS: &str = "ring waits";
/// The kind gradient buckets (`[parallel.comm_fusion]`) are profiled as, run or collected.
pub const FUSED_BUCKETS: &str = "fused buckets";
/// The kind prefetched weight gathers are profiled as, when taken.
pub const PREFETCHED_GATHERS: &str = "prefetched gathers";

#[cfg(test)]
mod tests {
    use super::*;

    /// The table lists each kind of reshard's time and count per run under the reshards'
    /// total.
    #[test]
    fn reshards_are_tallied_by_what_they_run() {
        let mut profile = StepProfile {
            runs: 2,
            ..StepProfile::default()
        };
        for _ in 0..4 {
            profile.reshard(
                "all-reduce",
                Duration::from_millis(3),
                Duration::from_millis(1),
            );
        }
        profile.reshard(
            RING_WAITS,
            Duration::from_millis(2),
            Duration::from_millis(2),
        );
        assert_eq!(profile.reshards.count, 5);
        let table = profile.table(Duration::from_millis(100));
        let lines: Vec<&str> = table.lines().collect();
        let total = lines
            .iter()
            .position(|l| l.contains("reshards (communication)"))
            .unwrap();
        assert!(lines[total].contains("7.000 ms"), "{table}");
        assert!(
            lines[total].contains("waiting for peers 3.000 ms"),
            "{table}"
        );
        let line = lines[total + 1];
        assert!(
            line.contains("all-reduce ×2")
                && line.contains("6.000 ms")
                && line.contains("waiting for peers 2.000 ms"),
            "{table}"
        );
        let line = lines[total + 2];
        assert!(
            line.contains("ring waits ×0.5")
                && line.contains("1.000 ms")
                && line.contains("waiting for peers 1.000 ms"),
            "{table}"
        );
    }
}
