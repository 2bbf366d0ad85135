//! Recursive bisection (MindSpore's double-recursive search) over a [`SearchProblem`].
//!
//! The device count is halved recursively: 1, 2, 4, … devices. Each halving is given, per op,
//! to a tensor dim (the batch or a model dim) by the symbolic cost: the op's own time plus the
//! redistribution to its neighbours' current choices. A round refines every op's strategy to
//! one using more devices, up to the round's count, whose split factors are multiples of the
//! current ones; a sweep in topological order makes the choices, then settling sweeps re-make
//! each op's choice among the same refinements against its neighbours' new choices, so an
//! early op does not commit against its neighbours' coarser strategies.
//!
//! Which halvings go to the batch before the model dims get theirs matters (per-op greed alone
//! commits to batch splits before it sees the model splits). So the recursion forks at every
//! level: after `k` batch-first rounds, one branch hands all the remaining halvings out at once
//! (the op picks among every refinement up to the whole device count, batch or model), the
//! other goes on with one more batch-first round. Each branch's plan is costed whole; the
//! cheapest that fits the memory budget is kept (the cheapest of all when none fits, which the
//! caller then repairs). The shared prefix is computed once, so the work is `O(log₂ devices)`
//! rounds of `ops × candidates × degree`.

use crate::greedy::best_local;
use crate::problem::SearchProblem;

/// Settling sweeps per round at most (they stop earlier when nothing changes).
const SETTLE_SWEEPS: usize = 3;

/// Whether strategy `finer` splits every dim by a multiple of `coarser`'s split.
fn refines(coarser: &[Vec<usize>], finer: &[Vec<usize>]) -> bool {
    coarser.len() == finer.len()
        && coarser
            .iter()
            .zip(finer)
            .all(|(c, f)| c.len() == f.len() && c.iter().zip(f).all(|(&a, &b)| a > 0 && b % a == 0))
}

/// Devices candidate `c` of node `n` computes on.
fn used(problem: &SearchProblem, n: usize, c: usize) -> usize {
    problem.nodes[n].candidates[c].devices_used
}

/// The candidates of `n` a round up to `round` devices may move it to from `from`: those using
/// more devices (at most `round`) whose splits refine `from`'s. Every round cuts, as in
/// MindSpore's double recursion: `from` stays only when nothing refines it.
fn refinements(problem: &SearchProblem, n: usize, from: usize, round: usize) -> Vec<usize> {
    let cands = &problem.nodes[n].candidates;
    let base = &cands[from].strategy;
    (0..cands.len())
        .filter(|&c| {
            used(problem, n, c) <= round
                && used(problem, n, c) > used(problem, n, from)
                && refines(base, &cands[c].strategy)
        })
        .collect()
}

/// Sweeps in topological order giving every op the candidate of `allowed` with the least local
/// time against its neighbours' current choices; returns whether any op moved.
fn sweep(problem: &SearchProblem, choice: &mut [Option<usize>], allowed: &[Vec<usize>]) -> bool {
    let mut changed = false;
    for n in 0..choice.len() {
        if let Some(c) = best_local(problem, choice, n, allowed[n].iter().copied()) {
            changed |= choice[n] != Some(c);
            choice[n] = Some(c);
        }
    }
    changed
}

/// Sweeps `first` once, then settles with `allowed` until nothing changes (at most
/// [`SETTLE_SWEEPS`] times), starting from `start`.
fn settle(
    problem: &SearchProblem,
    start: &[usize],
    first: &[Vec<usize>],
    allowed: &[Vec<usize>],
) -> Vec<usize> {
    let mut choice: Vec<Option<usize>> = start.iter().map(|&c| Some(c)).collect();
    sweep(problem, &mut choice, first);
    for _ in 0..SETTLE_SWEEPS {
        if !sweep(problem, &mut choice, allowed) {
            break;
        }
    }
    choice
        .into_iter()
        .zip(start)
        .map(|(c, &s)| c.unwrap_or(s))
        .collect()
}

/// A batch-first round: every op refines its strategy in `start` towards `round` devices.
fn batch_round(problem: &SearchProblem, start: &[usize], round: usize) -> Vec<usize> {
    let allowed: Vec<Vec<usize>> = (0..start.len())
        .map(|n| refinements(problem, n, start[n], round))
        .collect();
    settle(problem, start, &allowed, &allowed)
}

/// The branch handing every remaining halving out at once from `start`. Every op first takes
/// the remaining halvings on its model dims (the refinements of `start` that do not refine
/// `next`, the next batch-first round's choice), so repeated layers move together; then each
/// op settles among all refinements of `start` (its batch too) and `start` itself.
fn model_round(problem: &SearchProblem, start: &[usize], next: Option<&[usize]>) -> Vec<usize> {
    let devices = problem.devices.max(1);
    let all: Vec<Vec<usize>> = (0..start.len())
        .map(|n| {
            let mut list = refinements(problem, n, start[n], devices);
            list.push(start[n]);
            list
        })
        .collect();
    let first: Vec<Vec<usize>> = all
        .iter()
        .enumerate()
        .map(|(n, list)| {
            let Some(next) = next else {
                return list.clone();
            };
            let cands = &problem.nodes[n].candidates;
            let model: Vec<usize> = list
                .iter()
                .copied()
                .filter(|&c| {
                    c != start[n] && !refines(&cands[next[n]].strategy, &cands[c].strategy)
                })
                .collect();
            if model.is_empty() {
                list.clone()
            } else {
                model
            }
        })
        .collect();
    settle(problem, start, &first, &all)
}

/// Recursive bisection under `budget` bytes per device (see the module doc). The branches are
/// compared as they are, a plan that fits before one that does not (repairing every branch to
/// the budget would cost ops² per branch); the caller repairs the chosen plan.
pub fn recursive(problem: &SearchProblem, budget: f64) -> Vec<usize> {
    let n = problem.nodes.len();
    let devices = problem.devices.max(1);
    // Start from the candidate using the fewest devices (the unsplit one when valid).
    let mut state: Vec<usize> = (0..n)
        .map(|node| {
            (0..problem.n_candidates(node))
                .min_by_key(|&c| used(problem, node, c))
                .unwrap_or(0)
        })
        .collect();
    let mut best: Option<(f64, Vec<usize>)> = None;
    let mut target = 1;
    loop {
        // Recurse: one more halving to the batch-first rounds.
        let next_target = (target * 2).min(devices);
        let next = (target < devices).then(|| batch_round(problem, &state, next_target));
        // Branch: every remaining halving handed out now, to the model dims first.
        let plan = model_round(problem, &state, next.as_deref());
        let fits = problem.memory(&plan) <= budget;
        let time = problem.time(&plan);
        let better = match &best {
            None => true,
            Some((t, b)) => {
                let best_fits = problem.memory(b) <= budget;
                (fits && !best_fits) || (fits == best_fits && time < *t)
            }
        };
        if better {
            best = Some((time, plan));
        }
        match next {
            Some(next) => state = next,
            None => break,
        }
        target = next_target;
    }
    best.map(|(_, plan)| plan).unwrap_or(state)
}
