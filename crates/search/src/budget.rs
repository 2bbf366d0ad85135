//! The memory constraint: the least memory any plan needs, and the repair of a plan that
//! exceeds the budget.

use crate::problem::SearchProblem;

/// The least memory per device of any plan: memory adds up over ops, so each op at its
/// smallest.
pub fn min_memory(problem: &SearchProblem) -> f64 {
    (0..problem.nodes.len())
        .map(|n| {
            (0..problem.n_candidates(n))
                .map(|c| problem.node_memory(n, c))
                .fold(f64::INFINITY, f64::min)
        })
        .sum()
}

/// Time of `n` taking `c` with its edges to its neighbours' choices in `choice`.
fn local_time(problem: &SearchProblem, choice: &[usize], n: usize, c: usize) -> f64 {
    let mut t = problem.node_time(n, c);
    for &e in &problem.adjacency[n] {
        let edge = &problem.edges[e];
        t += if edge.u == n {
            problem.edge_time(e, c, choice[edge.v])
        } else {
            problem.edge_time(e, choice[edge.u], c)
        };
    }
    t
}

/// Brings `choice` under `budget` bytes by switching, one op at a time, to the candidate that
/// saves memory at the least added time per byte saved. The caller checks first that
/// [`min_memory`] fits, so this always ends under the budget.
pub fn repair(problem: &SearchProblem, choice: &mut [usize], budget: f64) {
    let mut memory = problem.memory(choice);
    while memory > budget {
        let mut best: Option<(f64, usize, usize, f64)> = None;
        for n in 0..problem.nodes.len() {
            let current = choice[n];
            let mem_now = problem.node_memory(n, current);
            let time_now = local_time(problem, choice, n, current);
            for c in 0..problem.n_candidates(n) {
                let saved = mem_now - problem.node_memory(n, c);
                if saved <= 0.0 {
                    continue;
                }
                let ratio = (local_time(problem, choice, n, c) - time_now) / saved;
                if best.is_none_or(|(r, ..)| ratio < r) {
                    best = Some((ratio, n, c, saved));
                }
            }
        }
        let Some((_, n, c, saved)) = best else { return };
        choice[n] = c;
        memory -= saved;
    }
}
