//! The exact optimum by enumerating every combination of candidates: the reference the other
//! searches are tested against, usable on small problems only.

use crate::problem::SearchProblem;

/// The most combinations [`brute_force`] enumerates.
pub const MAX_COMBINATIONS: u128 = 50_000_000;

/// The cheapest choice whose memory is at most `budget` bytes, with its time; `None` when no
/// choice fits or the problem has more than [`MAX_COMBINATIONS`] combinations.
pub fn brute_force(problem: &SearchProblem, budget: f64) -> Option<(Vec<usize>, f64)> {
    let n = problem.nodes.len();
    let sizes: Vec<usize> = (0..n).map(|i| problem.n_candidates(i)).collect();
    let total: u128 = sizes.iter().map(|&s| s as u128).product();
    if total > MAX_COMBINATIONS {
        return None;
    }
    let mut choice = vec![0usize; n];
    let mut best: Option<(Vec<usize>, f64)> = None;
    loop {
        if problem.memory(&choice) <= budget {
            let t = problem.time(&choice);
            if best.as_ref().is_none_or(|(_, bt)| t < *bt) {
                best = Some((choice.clone(), t));
            }
        }
        let mut i = 0;
        loop {
            if i == n {
                return best;
            }
            choice[i] += 1;
            if choice[i] < sizes[i] {
                break;
            }
            choice[i] = 0;
            i += 1;
        }
    }
}
