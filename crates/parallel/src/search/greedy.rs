//! The two fast searches over a [`SearchProblem`]'s candidates.
//!
//! - [`propagate`]: sharding propagation (MindSpore's BFS from the configured ops). Seeded ops
//!   keep their candidate; from them, every op reached takes the candidate minimising its own
//!   time plus the redistribution to the ops already decided around it; ops never reached are
//!   seeded with their cheapest candidate in turn.
//! - [`recursive`]: recursive bisection. The devices are doubled round by round (1, 2, 4, …);
//!   in each round every op, in topological order, refines its strategy to one that uses more
//!   devices, up to the round's count (every split factor a multiple of the current one),
//!   choosing by its own time plus the redistribution to its neighbours' current choices. As
//!   in MindSpore's double recursion, every round cuts: an op keeps its strategy only when no
//!   refinement is valid.

use std::collections::VecDeque;

use crate::search::problem::SearchProblem;

/// Time of node `n` taking `c` plus its edges to the neighbours whose choice is known.
fn local_time(problem: &SearchProblem, choice: &[Option<usize>], n: usize, c: usize) -> f64 {
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
fn best_local(
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

/// Whether strategy `finer` splits every dim by a multiple of `coarser`'s split.
fn refines(coarser: &[Vec<usize>], finer: &[Vec<usize>]) -> bool {
    coarser.len() == finer.len()
        && coarser
            .iter()
            .zip(finer)
            .all(|(c, f)| c.len() == f.len() && c.iter().zip(f).all(|(&a, &b)| a > 0 && b % a == 0))
}

/// Recursive bisection (see the module doc).
pub fn recursive(problem: &SearchProblem) -> Vec<usize> {
    let n = problem.nodes.len();
    let used = |node: usize, c: usize| problem.nodes[node].candidates[c].devices_used;
    // Start from the candidate using the fewest devices (the unsplit one when valid).
    let mut choice: Vec<Option<usize>> = (0..n)
        .map(|node| (0..problem.n_candidates(node)).min_by_key(|&c| used(node, c)))
        .collect();
    let mut target = 2;
    while target <= problem.devices.next_power_of_two() {
        let round = target.min(problem.devices);
        for node in 0..n {
            let current = choice[node].unwrap_or(0);
            let cands = &problem.nodes[node].candidates;
            let from = &cands[current].strategy;
            // Every round cuts: the op keeps its strategy only when none refines it.
            let allowed = (0..cands.len()).filter(|&c| {
                used(node, c) <= round
                    && used(node, c) > used(node, current)
                    && refines(from, &cands[c].strategy)
            });
            choice[node] = best_local(problem, &choice, node, allowed).or(Some(current));
        }
        target *= 2;
    }
    choice.into_iter().map(|c| c.unwrap_or(0)).collect()
}
