//! A sync worker's side of clipping by the global norm (see the server's `clip` module): the
//! servers' parts of each step's square sum, gathered from their pull replies and added once
//! every server's is in, and the global sums known, to hand to a server that waits for one
//! (again after a restart, when it replays the step).

use std::collections::BTreeMap;

use runtime::SquareSum;

use crate::error::PsError;

/// Global sums kept beyond the oldest step a server may still replay.
const KEPT_RECENT: usize = 4;

/// The global square sums a worker knows, and the parts it is gathering.
#[derive(Debug, Default)]
pub(super) struct StepNorms {
    /// Global square sums (encoded), by step.
    known: BTreeMap<u64, Vec<u8>>,
    /// Servers' parts (decoded), by step and server.
    parts: BTreeMap<u64, BTreeMap<usize, SquareSum>>,
}

impl StepNorms {
    /// The global square sum of `step`, encoded, when known.
    pub(super) fn sum_of(&self, step: u64) -> Option<&Vec<u8>> {
        self.known.get(&step)
    }

    /// The global norm of `step`, when known.
    pub(super) fn norm(&self, step: u64) -> Option<f64> {
        let sum = SquareSum::decode(self.known.get(&step)?)?;
        Some(sum.to_f64().sqrt())
    }

    /// Notes server `server`'s part `part` of step `step`'s square sum; once all `servers`
    /// parts are in, their sum becomes the step's global sum.
    pub(super) fn add_part(
        &mut self,
        step: u64,
        (server, servers): (usize, usize),
        part: &[u8],
    ) -> Result<(), PsError> {
        if self.known.contains_key(&step) {
            return Ok(());
        }
        let part = SquareSum::decode(part).ok_or_else(|| {
            PsError::message(
                format!("Pull reply of server {server}: the square sum of step {step} (norm_part)"),
                format!(
                    "{} bytes, expected an encoded square sum of {} bytes",
                    part.len(),
                    runtime::SQUARE_SUM_BYTES
                ),
            )
        })?;
        let parts = self.parts.entry(step).or_default();
        parts.insert(server, part);
        if parts.len() == servers && (0..servers).all(|s| parts.contains_key(&s)) {
            let mut total = SquareSum::default();
            parts.values().for_each(|p| total.merge(p));
            self.parts.remove(&step);
            self.known.insert(step, total.to_bytes());
        }
        Ok(())
    }

    /// Notes the global sum `sum` a server applied step `step` with.
    pub(super) fn applied(&mut self, step: u64, sum: Vec<u8>) {
        self.parts.remove(&step);
        self.known.entry(step).or_insert(sum);
    }

    /// Forgets the steps before `step` (no server can replay them), keeping the last few.
    pub(super) fn forget_before(&mut self, step: u64) {
        self.parts = self.parts.split_off(&step);
        while self.known.len() > KEPT_RECENT
            && self.known.first_key_value().is_some_and(|(&s, _)| s < step)
        {
            self.known.pop_first();
        }
    }

    /// Forgets the parts gathered (the servers were re-partitioned: parts of different maps
    /// do not add up).
    pub(super) fn forget_parts(&mut self) {
        self.parts.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum_of_squares(xs: &[f32]) -> SquareSum {
        let mut s = SquareSum::default();
        s.add_f32(xs);
        s
    }

    #[test]
    fn the_global_sum_is_known_once_every_servers_part_is_in() {
        let mut norms = StepNorms::default();
        let a = sum_of_squares(&[3.0]);
        let b = sum_of_squares(&[4.0]);
        norms.add_part(7, (1, 2), &b.to_bytes()).unwrap();
        assert_eq!(norms.norm(7), None);
        norms.add_part(7, (0, 2), &a.to_bytes()).unwrap();
        assert_eq!(norms.norm(7), Some(5.0));
        assert_eq!(
            norms.sum_of(7),
            Some(&sum_of_squares(&[3.0, 4.0]).to_bytes())
        );
    }

    #[test]
    fn a_part_that_is_not_a_square_sum_is_refused() {
        let mut norms = StepNorms::default();
        let err = norms.add_part(1, (0, 2), &[1, 2, 3]).unwrap_err();
        assert!(err.to_string().contains("norm_part"), "{err}");
        assert!(err.is_bad_request());
    }

    #[test]
    fn old_steps_are_forgotten_but_the_last_few_kept() {
        let mut norms = StepNorms::default();
        for step in 0..10 {
            norms.applied(step, sum_of_squares(&[step as f32]).to_bytes());
        }
        norms.forget_before(100);
        assert_eq!(norms.known.len(), KEPT_RECENT);
        assert_eq!(norms.norm(9), Some(9.0));
        assert_eq!(norms.norm(0), None);
    }
}
