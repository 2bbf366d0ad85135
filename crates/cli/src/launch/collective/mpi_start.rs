//! Which ranks of one `mpirun` attempt started MPI and which ended (exit code 0) without: once
//! both kinds exist the job cannot complete (a rank that started MPI waits in `MPI_Init` for
//! the others, and OpenMPI takes a clean exit for a finished rank), so the launcher stops it.
//! `tessera rank-env` reports both (`RANK_MPI_STARTING_LINE`, `RANK_ENDED_BEFORE_MPI_LINE`).

use std::collections::BTreeSet;

/// The reports of one attempt.
#[derive(Debug, Default)]
pub struct MpiStarts {
    started: BTreeSet<usize>,
    ended: BTreeSet<usize>,
    verdict: Option<String>,
}

impl MpiStarts {
    /// Rank `rank`'s command is starting MPI. Returns why the job cannot complete, the first
    /// time it becomes so.
    pub fn started(&mut self, rank: usize) -> Option<String> {
        self.started.insert(rank);
        self.judge()
    }

    /// Rank `rank`'s command ended with exit code 0 without starting MPI. Returns why the job
    /// cannot complete, the first time it becomes so.
    pub fn ended_without(&mut self, rank: usize) -> Option<String> {
        self.ended.insert(rank);
        self.judge()
    }

    /// Why the job cannot complete, once it is known.
    pub fn verdict(&self) -> Option<&str> {
        self.verdict.as_deref()
    }

    fn judge(&mut self) -> Option<String> {
        if self.verdict.is_some() || self.started.is_empty() || self.ended.is_empty() {
            return None;
        }
        let verdict = format!(
            "{} ended (exit code 0) without starting MPI, while {} started MPI and would wait for {} in MPI_Init forever: the job cannot complete",
            ranks(&self.ended),
            ranks(&self.started),
            if self.ended.len() == 1 { "it" } else { "them" }
        );
        self.verdict = Some(verdict.clone());
        Some(verdict)
    }
}

/// `rank 1` or `ranks 0, 2`.
fn ranks(set: &BTreeSet<usize>) -> String {
    let list: Vec<String> = set.iter().map(usize::to_string).collect();
    match list.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_is_judged_once_both_kinds_are_seen_in_either_order() {
        let mut starts = MpiStarts::default();
        assert_eq!(starts.ended_without(1), None, "no rank started MPI yet");
        let verdict = starts.started(0).expect("now it cannot complete");
        assert!(
            verdict.starts_with(
                "rank 1 ended (exit code 0) without starting MPI, while rank 0 started MPI"
            ),
            "{verdict}"
        );
        assert_eq!(starts.started(2), None, "said once");
        assert_eq!(starts.verdict(), Some(verdict.as_str()));

        let mut starts = MpiStarts::default();
        assert_eq!(starts.started(0), None);
        assert_eq!(starts.started(2), None, "every rank may start MPI");
        let verdict = starts.ended_without(1).unwrap();
        assert!(
            verdict.contains("while ranks 0, 2 started MPI"),
            "{verdict}"
        );

        // Commands that never start MPI may end at any time.
        let mut plain = MpiStarts::default();
        assert_eq!(plain.ended_without(0), None);
        assert_eq!(plain.ended_without(1), None);
        assert_eq!(plain.verdict(), None);
    }
}
