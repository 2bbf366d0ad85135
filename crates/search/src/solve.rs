//! One strategy search over a graph's forward ops ([`search`]) and the costing of given
//! strategies ([`evaluate_strategies`]): the problem built, the algorithm of the request's
//! [`SearchMode`] run, the memory budget kept.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use graph::Graph;
use parallel::rules::strategy::PipelineStage;
use parallel::rules::{strategy, OpContext};
use parallel::SearchMode;

use crate::cost::DeviceProfile;
use crate::error::SearchError;
use crate::evaluate::EvalSettings;
use crate::footprint::MemoryEstimate;
use crate::held::HeldValues;
use crate::problem::{Deterministic, PlanCost, SearchProblem};
use crate::{budget, elimination, greedy, recursive};

/// What a search is asked.
#[derive(Debug, Clone)]
pub struct SearchRequest<'a> {
    /// The algorithm.
    pub mode: SearchMode,
    /// The device profile.
    pub profile: &'a DeviceProfile,
    /// Devices.
    pub devices: usize,
    /// Memory per device, bytes (the profile's when `None`).
    pub memory_budget: Option<u64>,
    /// Optimizer state per trainable parameter, in parameter copies (Adam: 2, momentum: 1).
    pub optimizer_states: usize,
    /// Ops whose strategy is fixed (the user's `[parallel.shard]`), by name.
    pub fixed: BTreeMap<String, Vec<Vec<usize>>>,
    /// Extra candidate strategies by op name (a model's own, e.g. the GPT's Megatron layouts).
    pub hints: BTreeMap<String, Vec<Vec<Vec<usize>>>>,
    /// How long dynamic programming may run before it fixes the remaining ops greedily.
    pub time_budget: Option<Duration>,
    /// Search only these forward ops (a pipeline stage's), by name; every one when `None`.
    pub only: Option<BTreeSet<String>>,
}

/// What a search found.
#[derive(Debug, Clone)]
pub struct SearchResult {
    /// The strategy of every forward op, in graph order.
    pub strategies: Vec<(String, Vec<Vec<usize>>)>,
    /// The predicted cost.
    pub cost: PlanCost,
    /// Wall time of the search (problem building included), milliseconds.
    pub search_ms: f64,
    /// A lower bound of the step time under the cost model (every op and edge at its cheapest).
    pub lower_bound: f64,
    /// Whether dynamic programming had to fix ops greedily (deadline or an irreducible graph):
    /// then `gap` bounds how far from optimal the result may be.
    pub approximate: bool,
    /// `(time − lower_bound) / time` when the result is not proven optimal.
    pub gap: Option<f64>,
    /// Ops searched.
    pub n_ops: usize,
    /// Distinct op classes (ops with the same kind and shapes share their candidates).
    pub n_classes: usize,
    /// Per op of `strategies`, its share of the step time (its own time and half of each of
    /// its redistributions, seconds) and its memory per device.
    pub op_shares: Vec<(f64, MemoryEstimate)>,
    /// Per op of `strategies`, the least memory per device any of its candidates needs.
    pub op_least_memory: Vec<MemoryEstimate>,
}

/// The settings of `request` for costing ops, activations counted for the `held` values.
fn settings<'a>(request: &SearchRequest<'a>, held: &'a HeldValues) -> EvalSettings<'a> {
    EvalSettings {
        profile: request.profile,
        devices: request.devices,
        optimizer_states: request.optimizer_states,
        held: Some(held),
    }
}

/// Searches strategies for the forward ops of `graph`.
///
/// Sharding propagation and recursive programming are heuristics, and dynamic programming is
/// one once it fixes ops greedily (`approximate`): their plan is kept only when it predicts no
/// longer a step than every op's data-parallel strategy (within the memory budget); otherwise
/// that plan is returned.
pub fn search(graph: &Graph, request: &SearchRequest<'_>) -> Result<SearchResult, SearchError> {
    search_with(graph, request, None, None, &[])
}

/// [`search`] for a run in deterministic mode (`train.deterministic`, `docs/DETERMINISM.md`):
/// the searched ops consider only the candidates whose summed-dim splits, forward and backward,
/// the canonical blocks (at most `max_blocks` per summed dim, `parallel.deterministic_blocks`)
/// can serve, so the plan passes [`parallel::check_deterministic`] unless a fixed strategy
/// breaks the rule. An op every candidate of which breaks it (its unsplit strategy keeps to it
/// always) fails naming `parallel.deterministic_blocks`, as does a `max_blocks` that is not a
/// power of two.
pub fn search_deterministic(
    graph: &Graph,
    request: &SearchRequest<'_>,
    max_blocks: usize,
) -> Result<SearchResult, SearchError> {
    search_with(graph, request, Some(max_blocks), None, &[])
}

/// [`search`] (in deterministic mode with at most `deterministic` canonical blocks per summed
/// dim when given, as [`search_deterministic`]) of the ops of pipeline `stage` when given:
/// `request.devices` are that stage's, and a fixed strategy that does not fit them is refused
/// naming the stage and where its device count comes from.
///
/// The guard against a heuristic's miss: unless dynamic programming proved its plan optimal,
/// the plan found is compared with the plans a user could write without searching — every op
/// data parallel, and each of `references` (whole plans by op name, e.g. the GPT's Megatron
/// splits, the data-parallel default for the ops one leaves out) — and the one predicting the
/// shortest step within the memory budget is kept (the plan found on a tie). A fixed op keeps
/// its strategy in every reference; a reference giving an op a strategy that is not among its
/// candidates (deterministic mode removed it, it does not fit the devices) is skipped.
pub(crate) fn search_with(
    graph: &Graph,
    request: &SearchRequest<'_>,
    deterministic: Option<usize>,
    stage: Option<PipelineStage>,
    references: &[BTreeMap<String, Vec<Vec<usize>>>],
) -> Result<SearchResult, SearchError> {
    let start = Instant::now();
    if let Some(max_blocks) = deterministic.filter(|b| *b == 0 || !b.is_power_of_two()) {
        return Err(SearchError::Config {
            key: "parallel.deterministic_blocks".to_string(),
            reason: format!("{max_blocks} is not a power of two of at least 1"),
        });
    }
    check_profile(request.profile)?;
    let held = HeldValues::of(graph);
    let settings = settings(request, &held);
    let deterministic = deterministic.map(|blocks| Deterministic::of(graph, blocks));
    let problem = SearchProblem::build_filtered(
        graph,
        &settings,
        &request.fixed,
        &request.hints,
        request.only.as_ref(),
        deterministic.as_ref(),
        stage,
    )?;
    let budget = request
        .memory_budget
        .unwrap_or(request.profile.memory_bytes) as f64;
    let least = budget::min_memory(&problem);
    if least > budget {
        return Err(SearchError::MemoryExceeded {
            needed: least.ceil() as u64,
            available: budget as u64,
            profile: request.profile.name.clone(),
        });
    }
    let deadline = request.time_budget.map(|d| start + d);
    let (mut choice, approximate) = match request.mode {
        SearchMode::ShardingPropagation => {
            (greedy::propagate(&problem, &seeds(graph, &problem)), false)
        }
        SearchMode::RecursiveProgramming => (recursive::recursive(&problem, budget), false),
        SearchMode::DynamicProgramming => lagrangian(&problem, budget, deadline),
    };
    budget::repair(&problem, &mut choice, budget);
    if request.mode != SearchMode::DynamicProgramming || approximate {
        keep_the_fastest(graph, &problem, &mut choice, budget, references);
    }
    let cost = finite_cost(problem.cost(&choice), request.profile)?;
    let lower_bound = problem.lower_bound();
    let proven = request.mode == SearchMode::DynamicProgramming && !approximate;
    let gap = (!proven).then(|| {
        let t = cost.time();
        if t > 0.0 {
            ((t - lower_bound) / t).max(0.0)
        } else {
            0.0
        }
    });
    let strategies = problem
        .nodes
        .iter()
        .zip(&choice)
        .map(|(node, &c)| {
            (
                graph.nodes()[node.node.0].name.clone(),
                node.candidates[c].strategy.clone(),
            )
        })
        .collect();
    let mut classes: Vec<usize> = problem.nodes.iter().map(|n| n.class).collect();
    classes.sort_unstable();
    classes.dedup();
    Ok(SearchResult {
        strategies,
        cost,
        search_ms: start.elapsed().as_secs_f64() * 1e3,
        lower_bound,
        approximate,
        gap,
        n_ops: problem.nodes.len(),
        n_classes: classes.len(),
        op_shares: problem.node_shares(&choice),
        op_least_memory: problem.least_memory(),
    })
}

/// Replaces `choice` by the fastest of the plans a user could write without searching when one
/// predicts a shorter step within `budget` bytes (by [`SearchProblem::time`] and
/// [`SearchProblem::memory`], what the searches rank by): every op data parallel, then each of
/// `references` (the ops it leaves out data parallel).
fn keep_the_fastest(
    graph: &Graph,
    problem: &SearchProblem,
    choice: &mut Vec<usize>,
    budget: f64,
    references: &[BTreeMap<String, Vec<Vec<usize>>>],
) {
    let data_parallel = BTreeMap::new();
    let mut best = problem.time(choice);
    for reference in std::iter::once(&data_parallel).chain(references) {
        let Some(plan) = choice_of(graph, problem, reference) else {
            continue;
        };
        let time = problem.time(&plan);
        if time < best && problem.memory(&plan) <= budget {
            best = time;
            *choice = plan;
        }
    }
}

/// The candidate of every node of `problem` that `plan` gives its op (the data-parallel default
/// on the problem's devices for an op `plan` leaves out; a fixed op its fixed strategy), or
/// `None` when one is not among the node's candidates.
fn choice_of(
    graph: &Graph,
    problem: &SearchProblem,
    plan: &BTreeMap<String, Vec<Vec<usize>>>,
) -> Option<Vec<usize>> {
    problem
        .nodes
        .iter()
        .map(|node| {
            if node.fixed {
                return Some(0);
            }
            let op = &graph.nodes()[node.node.0];
            let wanted = match plan.get(&op.name) {
                Some(s) => s.clone(),
                None => strategy::default_strategy(&OpContext::of(graph, op), problem.devices),
            };
            node.candidates.iter().position(|c| c.strategy == wanted)
        })
        .collect()
}

/// The predicted cost of given strategies for every forward op of `graph` (ops without one
/// take the data-parallel default).
pub fn evaluate_strategies(
    graph: &Graph,
    request: &SearchRequest<'_>,
    strategies: &BTreeMap<String, Vec<Vec<usize>>>,
) -> Result<PlanCost, SearchError> {
    check_profile(request.profile)?;
    let fixed = with_default_strategies(graph, strategies.clone(), request.devices, None);
    let held = HeldValues::of(graph);
    let problem = SearchProblem::build(graph, &settings(request, &held), &fixed, &BTreeMap::new())?;
    finite_cost(problem.cost(&vec![0; problem.nodes.len()]), request.profile)
}

/// Refuses a profile the cost model cannot use ([`DeviceProfile::validate_usable`]).
fn check_profile(profile: &DeviceProfile) -> Result<(), SearchError> {
    profile
        .validate_usable()
        .map_err(|source| SearchError::InvalidProfile {
            profile: profile.name.clone(),
            source,
        })
}

/// `cost` when its totals are finite (each op's are, but their sums may not be), else the
/// error naming the profile and the total.
fn finite_cost(cost: PlanCost, profile: &DeviceProfile) -> Result<PlanCost, SearchError> {
    let totals = [
        ("the plan's compute time", cost.compute),
        ("the plan's communication time", cost.comm),
        ("the plan's communication bytes", cost.comm_bytes),
        ("the plan's memory per device", cost.memory.total()),
    ];
    match totals.into_iter().find(|(_, v)| !v.is_finite()) {
        Some((what, value)) => Err(SearchError::NonFiniteCost {
            profile: profile.name.clone(),
            what: what.to_string(),
            value,
        }),
        None => Ok(cost),
    }
}

/// `strategies` with the data-parallel default on `devices` for every forward op of `graph`
/// (of `only` when given) without one.
pub(crate) fn with_default_strategies(
    graph: &Graph,
    mut strategies: BTreeMap<String, Vec<Vec<usize>>>,
    devices: usize,
    only: Option<&BTreeSet<String>>,
) -> BTreeMap<String, Vec<Vec<usize>>> {
    for node in graph.nodes() {
        if node.role == graph::NodeRole::Forward
            && !node.inputs.is_empty()
            && only.is_none_or(|o| o.contains(&node.name))
            && !strategies.contains_key(&node.name)
        {
            let ctx = OpContext::of(graph, node);
            strategies.insert(node.name.clone(), strategy::default_strategy(&ctx, devices));
        }
    }
    strategies
}

/// Where propagation starts: every fixed op; with none, the data-parallel strategy of the
/// op with the most compute.
fn seeds(graph: &Graph, problem: &SearchProblem) -> Vec<(usize, usize)> {
    let fixed: Vec<(usize, usize)> = (0..problem.nodes.len())
        .filter(|&n| problem.nodes[n].fixed)
        .map(|n| (n, 0))
        .collect();
    if !fixed.is_empty() {
        return fixed;
    }
    let largest = (0..problem.nodes.len()).max_by(|&a, &b| {
        let work = |n: usize| {
            problem.nodes[n]
                .candidates
                .iter()
                .map(|c| c.compute * c.devices_used as f64)
                .fold(0.0, f64::max)
        };
        work(a).total_cmp(&work(b))
    });
    let Some(n) = largest else {
        return Vec::new();
    };
    let node = &graph.nodes()[problem.nodes[n].node.0];
    let dp = strategy::default_strategy(&OpContext::of(graph, node), problem.devices);
    let c = problem.nodes[n]
        .candidates
        .iter()
        .position(|c| c.strategy == dp)
        .unwrap_or(0);
    vec![(n, c)]
}

/// Dynamic programming under the memory budget: elimination on time + λ·memory, with λ raised
/// by bisection until the plan fits (λ = 0 when the fastest plan fits already).
fn lagrangian(
    problem: &SearchProblem,
    budget: f64,
    deadline: Option<Instant>,
) -> (Vec<usize>, bool) {
    let first = elimination::solve(problem, 0.0, deadline);
    if problem.memory(&first.choice) <= budget {
        return (first.choice, first.approximate);
    }
    // λ in seconds per byte: raise it until the plan fits, then bisect for the fastest that does.
    let mut lo = 0.0;
    let mut hi = 1e-15;
    let mut best = None;
    for _ in 0..60 {
        let s = elimination::solve(problem, hi, deadline);
        if problem.memory(&s.choice) <= budget {
            best = Some(s);
            break;
        }
        lo = hi;
        hi *= 4.0;
    }
    let Some(mut best) = best else {
        return (first.choice, true);
    };
    for _ in 0..12 {
        if deadline.is_some_and(|d| Instant::now() > d) {
            break;
        }
        let mid = 0.5 * (lo + hi);
        let s = elimination::solve(problem, mid, deadline);
        if problem.memory(&s.choice) <= budget {
            hi = mid;
            if problem.time(&s.choice) <= problem.time(&best.choice) {
                best = s;
            }
        } else {
            lo = mid;
        }
    }
    // A Lagrangian optimum is optimal only for the memory it lands on.
    (best.choice, true)
}
