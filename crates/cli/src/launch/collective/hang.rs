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
//! A rank looping outside MPI while the others wait inside a collective is not seen here (both
//! run); `tessera train --timeout` ends those (docs/LAUNCH.md).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The watchdog's rules for one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HangRules {
    /// `--hang_time_out`: how long a rank may stay stopped while others run (and, with
    /// `after_end`, run on after another rank's command ended).
    pub limit: Duration,
    /// The rule for ranks running on after another ended applies (`--hang_time_out` given).
    pub after_end: bool,
}

/// What the ranks of one attempt reported.
#[derive(Debug, Default)]
pub struct RankStates {
    /// Ranks whose command ended: when, and how (`exit code 0`).
    ended: BTreeMap<usize, (Instant, String)>,
    /// Ranks whose command is stopped: since when, and by which signal.
    stopped: BTreeMap<usize, (Instant, i32)>,
}

impl RankStates {
    /// Rank `rank`'s command ended (`how`: `exit code 0`, `signal 9`); its first end counts.
    pub fn ended(&mut self, rank: usize, at: Instant, how: String) {
        self.stopped.remove(&rank);
        self.ended.entry(rank).or_insert((at, how));
    }

    /// Rank `rank`'s command was stopped by `signal`.
    pub fn stopped(&mut self, rank: usize, at: Instant, signal: i32) {
        if !self.ended.contains_key(&rank) {
            self.stopped.entry(rank).or_insert((at, signal));
        }
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
        if !rules.after_end {
            return None;
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
    /// Both rules (`--hang_time_out 60`).
    const RULES: HangRules = HangRules {
        limit: LIMIT,
        after_end: true,
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
    fn ranks_running_past_the_limit_after_another_ended_are_hung() {
        let t0 = Instant::now();
        let mut states = RankStates::default();
        states.ended(0, t0, "exit code 0".into());
        states.ended(2, t0 + LIMIT / 2, "exit code 0".into());
        assert_eq!(states.hung(4, t0 + LIMIT / 2, RULES), None);
        // Without `--hang_time_out` the ranks may end apart: only a stopped rank is hung.
        let default = HangRules {
            after_end: false,
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
