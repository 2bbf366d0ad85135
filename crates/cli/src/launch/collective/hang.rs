//! The launcher's watchdog over one `mpirun` attempt's ranks (`--hang_time_out`): which ranks'
//! commands ended and which are stopped by a signal, as their `tessera rank-env` reported, and
//! the verdict once a rank is taken as hung:
//! - a rank **stopped** (SIGSTOP, SIGTSTP, …) for the time out while another rank of the job
//!   runs: the others wait for it in their next collective and cannot end (every rank stopped
//!   is a paused job, not a hung one);
//! - ranks still **running** the time out after another rank's command ended: in one job the
//!   ranks end together (OpenMPI's `MPI_Finalize` waits for every rank), so one that goes on
//!   loops or sleeps outside MPI while the others have finished. Only when `--hang_time_out`
//!   is given ([`HangRules::after_end`]): a job's ranks may end apart on purpose (commands
//!   without MPI, or a rank's own work after MPI's end), which the default must not stop.
//!
//! - ranks **outside every MPI call** for the time out while others have waited **inside one**
//!   as long (the MPI backend's progress reports, [`MpiProgress`], passed on by rank-env): a
//!   rank looping or sleeping in its own code while the others wait for it in a collective.
//!   Only when `--hang_time_out` is given: a rank may also work alone on purpose (rank 0
//!   writing a large file while the others wait at a barrier). Without the flag a failure's
//!   report still names such a rank ([`RankStates::outside_while_others_wait`]): the rank that
//!   failed (a collective's time out) may only have been waiting for it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use runtime::launch_env::MpiProgress;

/// The watchdog's rules for one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HangRules {
    /// `--hang_time_out`: how long a rank may stay stopped while others run (and, with
    /// `after_end`, run on after another rank's command ended).
    pub limit: Duration,
    /// `--hang_time_out` was given: the rules for ranks running on after another ended, and
    /// for ranks outside MPI while others wait inside it, apply.
    pub strict: bool,
}

/// Where a rank's MPI progress stands, as last reported.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MpiPlace {
    /// Inside this call (`all_reduce on group world`).
    Inside(String),
    /// Outside every MPI call.
    Outside,
}

/// What the ranks of one attempt reported.
#[derive(Debug, Default)]
pub struct RankStates {
    /// Ranks whose command ended: when, and how (`exit code 0`).
    ended: BTreeMap<usize, (Instant, String)>,
    /// Ranks whose command is stopped: since when, and by which signal.
    stopped: BTreeMap<usize, (Instant, i32)>,
    /// Ranks that stood still inside one MPI call or outside every call: since when, where,
    /// and until when if they moved since (a rank never reported still has no entry).
    mpi: BTreeMap<usize, Stood>,
}

/// One rank's last still spell: since when, where, and when it moved on (if it did).
#[derive(Debug)]
struct Stood {
    since: Instant,
    place: MpiPlace,
    until: Option<Instant>,
}

/// How long after moving on a rank's wait inside MPI still counts for a failure's report: a
/// rank whose collective timed out leaves it (and reports so within a second) before its
/// failure is reported.
const RECENT_WAIT: Duration = Duration::from_secs(10);

impl RankStates {
    /// Rank `rank`'s command ended (`how`: `exit code 0`, `signal 9`); its first end counts.
    pub fn ended(&mut self, rank: usize, at: Instant, how: String) {
        self.stopped.remove(&rank);
        self.mpi.remove(&rank);
        self.ended.entry(rank).or_insert((at, how));
    }

    /// Rank `rank`'s command was stopped by `signal`.
    pub fn stopped(&mut self, rank: usize, at: Instant, signal: i32) {
        if !self.ended.contains_key(&rank) {
            self.stopped.entry(rank).or_insert((at, signal));
        }
    }

    /// Rank `rank`'s MPI backend reported `report` at `now`.
    pub fn progress(&mut self, rank: usize, now: Instant, report: MpiProgress) {
        if self.ended.contains_key(&rank) {
            return;
        }
        let since = |ms: u64| now.checked_sub(Duration::from_millis(ms)).unwrap_or(now);
        match report {
            MpiProgress::Inside { call, for_ms } => {
                let place = MpiPlace::Inside(call);
                self.mpi.insert(rank, Stood::still(since(for_ms), place));
            }
            MpiProgress::Outside { for_ms } => {
                let place = MpiPlace::Outside;
                self.mpi.insert(rank, Stood::still(since(for_ms), place));
            }
            MpiProgress::Moving => {
                if let Some(stood) = self.mpi.get_mut(&rank) {
                    stood.until.get_or_insert(now);
                }
            }
        }
    }

    /// The ranks outside every MPI call and the ranks inside one, each for at least `at_least`
    /// at `now` — still there, or, inside, having left less than `inside_until` before `now`;
    /// ranks stopped or ended are left out.
    fn standing(&self, now: Instant, at_least: Duration, inside_until: Duration) -> Standing<'_> {
        let mut standing = Standing::default();
        for (&rank, stood) in &self.mpi {
            let end = stood.until.unwrap_or(now);
            let held = end.saturating_duration_since(stood.since);
            let gone = now.saturating_duration_since(end);
            if held < at_least || self.stopped.contains_key(&rank) {
                continue;
            }
            match &stood.place {
                MpiPlace::Outside if stood.until.is_none() => standing.outside.push((rank, held)),
                MpiPlace::Outside => {}
                MpiPlace::Inside(_) if stood.until.is_some() && gone >= inside_until => {}
                MpiPlace::Inside(what) => {
                    standing.call.get_or_insert(what.as_str());
                    standing.inside.push((rank, held));
                }
            }
        }
        standing
    }

    /// `rank 1 had run outside every MPI call for 12 s while rank 0 waited inside all_reduce on
    /// group world for 10 s`, when at `now` some ranks stand outside MPI while others wait
    /// inside it (for a failure's report: the rank that failed may have waited for them).
    pub fn outside_while_others_wait(&self, now: Instant) -> Option<String> {
        let standing = self.standing(now, Duration::ZERO, RECENT_WAIT);
        if standing.outside.is_empty() || standing.inside.is_empty() {
            return None;
        }
        Some(format!(
            "{} had run outside every MPI call for {} s while {} waited inside {} for {} s",
            list(&ranks_of(&standing.outside)),
            longest(&standing.outside),
            list(&ranks_of(&standing.inside)),
            standing.call.unwrap_or("one"),
            longest(&standing.inside)
        ))
    }

    /// Rank `rank`'s command continued.
    pub fn continued(&mut self, rank: usize) {
        self.stopped.remove(&rank);
    }

    /// `rank 1's command is stopped (signal 19)`, for each rank stopped now (for a failure's
    /// report: the ranks that failed may have been waiting for it).
    pub fn stopped_now(&self) -> Vec<String> {
        self.stopped
            .iter()
            .map(|(rank, (_, signal))| {
                format!(
                    "rank {rank}'s command is stopped ({})",
                    signal_name(*signal)
                )
            })
            .collect()
    }

    /// Why the job of `ranks` ranks is hung at `now` under `rules`, if it is.
    pub fn hung(&self, ranks: usize, now: Instant, rules: HangRules) -> Option<String> {
        let limit = rules.limit;
        let running: Vec<usize> = (0..ranks)
            .filter(|r| !self.ended.contains_key(r) && !self.stopped.contains_key(r))
            .collect();
        let stuck: Vec<usize> = self
            .stopped
            .iter()
            .filter(|(_, (since, _))| now.saturating_duration_since(*since) >= limit)
            .map(|(rank, _)| *rank)
            .collect();
        if !stuck.is_empty() && !running.is_empty() {
            let signals: Vec<String> = stuck
                .iter()
                .map(|r| signal_name(self.stopped[r].1))
                .collect();
            return Some(format!(
                "{} stopped ({}) for {} s or more while {} kept running and would wait for {}: taken as hung (--hang_time_out {})",
                commands_of(&stuck),
                signals.join(", "),
                limit.as_secs(),
                list(&running),
                if stuck.len() == 1 { "it" } else { "them" },
                limit.as_secs()
            ));
        }
        if !rules.strict {
            return None;
        }
        let standing = self.standing(now, limit, Duration::ZERO);
        if !standing.outside.is_empty() && !standing.inside.is_empty() {
            return Some(format!(
                "{} ran outside every MPI call for {} s or more while {} waited inside {} as long: taken as hung (--hang_time_out {})",
                list(&ranks_of(&standing.outside)),
                limit.as_secs(),
                list(&ranks_of(&standing.inside)),
                standing.call.unwrap_or("one"),
                limit.as_secs()
            ));
        }
        let (first, (at, how)) = self.ended.iter().min_by_key(|(_, (at, _))| *at)?;
        let left: Vec<usize> = (0..ranks).filter(|r| !self.ended.contains_key(r)).collect();
        if left.is_empty() || now.saturating_duration_since(*at) < limit {
            return None;
        }
        Some(format!(
            "{} still running {} s after rank {first}'s command ended ({how}), while the ranks of one job end together: taken as hung (--hang_time_out {})",
            list(&left),
            limit.as_secs(),
            limit.as_secs()
        ))
    }
}

impl Stood {
    /// A spell still going on, from `since`, at `place`.
    fn still(since: Instant, place: MpiPlace) -> Stood {
        Stood {
            since,
            place,
            until: None,
        }
    }
}

/// The ranks standing still outside MPI and inside it (with the call of the first), with how
/// long each has.
#[derive(Default)]
struct Standing<'a> {
    outside: Vec<(usize, Duration)>,
    inside: Vec<(usize, Duration)>,
    call: Option<&'a str>,
}

/// The ranks of `standing` (rank, time) pairs.
fn ranks_of(standing: &[(usize, Duration)]) -> Vec<usize> {
    standing.iter().map(|(rank, _)| *rank).collect()
}

/// The longest time of `standing`, in whole seconds.
fn longest(standing: &[(usize, Duration)]) -> u64 {
    standing.iter().map(|(_, d)| d.as_secs()).max().unwrap_or(0)
}

/// `rank 1` or `ranks 0, 2`.
fn list(ranks: &[usize]) -> String {
    let shown: Vec<String> = ranks.iter().map(usize::to_string).collect();
    match shown.len() {
        1 => format!("rank {}", shown[0]),
        _ => format!("ranks {}", shown.join(", ")),
    }
}

/// `rank 1's command was` or `the commands of ranks 1, 2 were`.
fn commands_of(ranks: &[usize]) -> String {
    match ranks.len() {
        1 => format!("rank {}'s command was", ranks[0]),
        _ => format!("the commands of {} were", list(ranks)),
    }
}

/// `signal 19 (SIGSTOP)`.
fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        _ => return format!("signal {signal}"),
    };
    format!("signal {signal}, {name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(60);
    /// Every rule (`--hang_time_out 60`).
    const RULES: HangRules = HangRules {
        limit: LIMIT,
        strict: true,
    };

    #[test]
    fn a_rank_stopped_past_the_limit_while_others_run_is_hung() {
        let t0 = Instant::now();
        let mut states = RankStates::default();
        states.stopped(1, t0, libc::SIGSTOP);
        assert_eq!(states.hung(2, t0 + LIMIT / 2, RULES), None, "not yet");
        let verdict = states.hung(2, t0 + LIMIT, RULES).expect("hung");
        assert!(
            verdict.starts_with("rank 1's command was stopped (signal 19, SIGSTOP) for 60 s")
                && verdict.contains("while rank 0 kept running"),
            "{verdict}"
        );
        assert_eq!(states.stopped_now().len(), 1);
        // Continued in time: not hung.
        states.continued(1);
        assert_eq!(states.hung(2, t0 + LIMIT * 2, RULES), None);
        assert!(states.stopped_now().is_empty());
        // Every rank stopped is a paused job.
        states.stopped(0, t0, libc::SIGSTOP);
        states.stopped(1, t0, libc::SIGSTOP);
        assert_eq!(states.hung(2, t0 + LIMIT * 2, RULES), None);
    }

    #[test]
    fn a_rank_outside_mpi_past_the_limit_while_others_wait_inside_is_hung() {
        let t0 = Instant::now();
        let mut states = RankStates::default();
        let inside = |ms| MpiProgress::Inside {
            call: "all_reduce on group world".into(),
            for_ms: ms,
        };
        // Reports come after the state held a while: their times count from its start.
        states.progress(0, t0 + Duration::from_secs(2), inside(2000));
        states.progress(2, t0 + Duration::from_secs(3), inside(2000));
        states.progress(
            1,
            t0 + Duration::from_secs(2),
            MpiProgress::Outside { for_ms: 2000 },
        );
        let default = HangRules {
            strict: false,
            ..RULES
        };
        let at_failure = states.outside_while_others_wait(t0 + Duration::from_secs(12));
        assert_eq!(
            at_failure.as_deref(),
            Some("rank 1 had run outside every MPI call for 12 s while ranks 0, 2 waited inside all_reduce on group world for 12 s")
        );
        // Without `--hang_time_out`, nothing is stopped for it.
        assert_eq!(states.hung(3, t0 + LIMIT * 10, default), None);
        assert_eq!(
            states.hung(3, t0 + LIMIT - Duration::from_secs(1), RULES),
            None,
            "not yet"
        );
        let verdict = states
            .hung(3, t0 + LIMIT + Duration::from_secs(1), RULES)
            .expect("hung");
        assert_eq!(
            verdict,
            "rank 1 ran outside every MPI call for 60 s or more while ranks 0, 2 waited inside all_reduce on group world as long: taken as hung (--hang_time_out 60)"
        );
        // Rank 0's call timed out: it moved on, and its wait still counts for the report of
        // its failure a moment later (not for the watchdog, nor long after).
        states.progress(0, t0 + LIMIT * 2, MpiProgress::Moving);
        states.progress(2, t0 + LIMIT * 2, MpiProgress::Moving);
        let report = states.outside_while_others_wait(t0 + LIMIT * 2 + Duration::from_secs(3));
        assert!(
            report.as_deref().is_some_and(|r| r.starts_with(
                "rank 1 had run outside every MPI call for 123 s while ranks 0, 2 waited inside all_reduce on group world for 120 s"
            )),
            "{report:?}"
        );
        assert_eq!(states.hung(3, t0 + LIMIT * 2, RULES), None);
        assert_eq!(states.outside_while_others_wait(t0 + LIMIT * 3), None);
        // Rank 1 moved: the others' wait is no longer on it.
        states.progress(0, t0 + LIMIT * 3, inside(0));
        states.progress(1, t0 + LIMIT * 3, MpiProgress::Moving);
        assert_eq!(states.hung(3, t0 + LIMIT * 5, RULES), None);
        assert_eq!(states.outside_while_others_wait(t0 + LIMIT * 5), None);
        // Every rank outside (all computing) or every rank inside (all waiting on MPI) names
        // no one; nor does a rank outside that is stopped (the stopped rule names it) or ended.
        let mut all_out = RankStates::default();
        for rank in 0..2 {
            all_out.progress(rank, t0, MpiProgress::Outside { for_ms: 0 });
        }
        assert_eq!(all_out.hung(2, t0 + LIMIT * 2, RULES), None);
        let mut all_in = RankStates::default();
        for rank in 0..2 {
            all_in.progress(rank, t0, inside(0));
        }
        assert_eq!(all_in.hung(2, t0 + LIMIT * 2, RULES), None);
        all_in.progress(1, t0, MpiProgress::Outside { for_ms: 0 });
        all_in.ended(1, t0, "exit code 0".into());
        assert_eq!(all_in.outside_while_others_wait(t0 + LIMIT), None);
    }

    #[test]
    fn ranks_running_past_the_limit_after_another_ended_are_hung() {
        let t0 = Instant::now();
        let mut states = RankStates::default();
        states.ended(0, t0, "exit code 0".into());
        states.ended(2, t0 + LIMIT / 2, "exit code 0".into());
        assert_eq!(states.hung(4, t0 + LIMIT / 2, RULES), None);
        // Without `--hang_time_out` the ranks may end apart: only a stopped rank is hung.
        let default = HangRules {
            strict: false,
            ..RULES
        };
        assert_eq!(states.hung(4, t0 + LIMIT * 100, default), None);
        let verdict = states.hung(4, t0 + LIMIT, RULES).expect("hung");
        assert!(
            verdict.starts_with(
                "ranks 1, 3 still running 60 s after rank 0's command ended (exit code 0)"
            ),
            "{verdict}"
        );
        states.ended(1, t0, "exit code 0".into());
        states.ended(3, t0, "exit code 0".into());
        assert_eq!(
            states.hung(4, t0 + LIMIT * 2, RULES),
            None,
            "every rank ended"
        );
    }
}
