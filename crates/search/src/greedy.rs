//! Sharding propagation over a [`SearchProblem`]'s candidates (MindSpore's BFS from the
//! configured ops), and the per-op local choice it shares with the recursive search.
//!
//! Seeded ops keep their candidate; from them, every op reached takes the candidate minimising
//! its own time plus the redistribution to the ops already decided around it; ops never reached
//! are seeded with their cheapest candidate in turn.

use std::collections::VecDeque;

use crate::problem::SearchProblem;

/// Time of node `n` taking `c` plus its edges to the neighbours whose choice is known.
pub(crate) fn local_time(
    problem: &SearchProblem,
    choice: &[Option<usize>],
    n: usize,
    c: usize,
) -> f64 {
    let mut t = problem.node_time(n, c);
    for &e in &problem.adjacency[n] {
        let edge = &problem.edges[e];
        if edge.u == n {
            if let Some(b) = choice[edge.v] {
                t += problem.edge_time(e, c, b);
            }
        } else if let Some(a) = choice[edge.u] {
            t += problem.edge_time(e, a, c);
        }
    }
    t
}

/// The candidate of `n` with the least [`local_time`] among `allowed`.
pub(crate) fn best_local(
    problem: &SearchProblem,
    choice: &[Option<usize>],
    n: usize,
    allowed: impl Iterator<Item = usize>,
) -> Option<usize> {
    allowed
        .map(|c| (c, local_time(problem, choice, n, c)))
        .fold(None, |best: Option<(usize, f64)>, (c, t)| match best {
            Some((_, bt)) if bt <= t => best,
            _ => Some((c, t)),
        })
        .map(|(c, _)| c)
}

/// Sharding propagation from `seeds` (node, candidate), in order.
pub fn propagate(problem: &SearchProblem, seeds: &[(usize, usize)]) -> Vec<usize> {
    let n = problem.nodes.len();
    let mut choice: Vec<Option<usize>> = vec![None; n];
    let mut queue = VecDeque::new();
    for &(node, c) in seeds {
        choice[node] = Some(c);
        queue.push_back(node);
    }
    let mut next_unreached = 0;
    loop {
        while let Some(w) = queue.pop_front() {
            for &e in &problem.adjacency[w] {
                let edge = &problem.edges[e];
                let x = if edge.u == w { edge.v } else { edge.u };
                if choice[x].is_some() {
                    continue;
                }
                choice[x] = best_local(problem, &choice, x, 0..problem.n_candidates(x));
                queue.push_back(x);
            }
        }
        while next_unreached < n && choice[next_unreached].is_some() {
            next_unreached += 1;
        }
        if next_unreached == n {
            break;
        }
        let w = next_unreached;
        choice[w] = best_local(problem, &choice, w, 0..problem.n_candidates(w));
        queue.push_back(w);
    }
    choice.into_iter().map(|c| c.unwrap_or(0)).collect()
}
