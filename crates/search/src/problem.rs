//! The search problem: the forward ops with their costed candidates, and the edges between
//! ops whose redistribution costs depend on both choices.
//!
//! Ops with the same kind, shapes and operand kinds (every block of a GPT) share one candidate
//! list, and edges between such classes share one cost matrix, so memory and time grow with
//! the ops and the distinct classes' candidates, not with the devices.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use graph::{Graph, NodeId, NodeRole, ValueId, ValueKind};
use parallel::rules::strategy::PipelineStage;
use parallel::rules::OpContext;
use parallel::ParallelError;

use crate::candidates::candidates;
use crate::error::SearchError;
use crate::evaluate::{
    evaluate, evaluate_on_stage, redistribution, EvalSettings, Evaluated, Split,
};
use crate::footprint::{plan_memory, MemoryEstimate};
use crate::held::HeldValues;

/// One op to choose a strategy for.
#[derive(Debug, Clone)]
pub struct SearchNode {
    /// The graph node.
    pub node: NodeId,
    /// Its candidates, costed.
    pub candidates: Arc<Vec<Evaluated>>,
    /// Per candidate, seconds and bytes to bring the graph inputs it reads to its layouts
    /// (empty when it reads none).
    pub unary: Vec<(f64, f64)>,
    /// Whether the user fixed its strategy (one candidate).
    pub fixed: bool,
    /// Index of its class (ops alike share one).
    pub class: usize,
}

/// Which tensor an edge moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum EdgeKind {
    /// Output `out` of the first op is input `input` of the second.
    Value { out: usize, input: usize },
    /// A parameter read by both ops (input `first` of the first, `second` of the second): the
    /// second op's copy is redistributed from the first's.
    SharedParam { first: usize, second: usize },
}

/// An edge's time and bytes matrices.
type EdgeCosts = (Arc<Vec<f64>>, Arc<Vec<f64>>);

/// Two ops whose choices interact.
#[derive(Debug, Clone)]
pub struct SearchEdge {
    /// Index of the first op in [`SearchProblem::nodes`].
    pub u: usize,
    /// Index of the second.
    pub v: usize,
    /// Seconds per (u candidate, v candidate), row-major.
    pub time: Arc<Vec<f64>>,
    /// Bytes per device per (u candidate, v candidate), row-major.
    pub bytes: Arc<Vec<f64>>,
}

impl SearchEdge {
    /// Seconds of the redistribution when `u` takes candidate `a` and `v` candidate `b`.
    pub fn time_of(&self, a: usize, b: usize, n_v: usize) -> f64 {
        self.time[a * n_v + b]
    }
}

/// The problem every search solves: minimise the step time (node costs plus edge costs) with
/// the memory per device under the budget.
#[derive(Debug, Clone)]
pub struct SearchProblem {
    /// The ops, in topological order.
    pub nodes: Vec<SearchNode>,
    /// The edges.
    pub edges: Vec<SearchEdge>,
    /// Edge indices per node.
    pub adjacency: Vec<Vec<usize>>,
    /// Devices.
    pub devices: usize,
}

/// A choice of candidate per node and what it costs.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanCost {
    /// Seconds of compute per step.
    pub compute: f64,
    /// Seconds of communication per step.
    pub comm: f64,
    /// Bytes each device receives per step.
    pub comm_bytes: f64,
    /// Memory per device.
    pub memory: MemoryEstimate,
}

impl PlanCost {
    /// Compute plus communication.
    pub fn time(&self) -> f64 {
        self.compute + self.comm
    }
}

/// Deterministic mode's rule for the candidates (`train.deterministic`): the graph with its
/// backward nodes, whose summing ops the candidates must keep to the canonical blocks too, and
/// the most canonical blocks per summed dim (`parallel.deterministic_blocks`).
#[derive(Debug, Clone)]
pub(crate) struct Deterministic {
    training: Graph,
    max_blocks: usize,
}

impl Deterministic {
    /// The rule for the forward ops of `graph` with at most `max_blocks` canonical blocks per
    /// summed dim: `graph` itself when it holds backward nodes, otherwise differentiated with
    /// respect to its trainable parameters (its loss its first floating-point scalar output, as
    /// [`HeldValues::of`] finds it); a graph with nothing to train is checked forward only.
    pub(crate) fn of(graph: &Graph, max_blocks: usize) -> Deterministic {
        let has_backward = graph.nodes().iter().any(|n| n.role != NodeRole::Forward);
        let loss = graph.outputs().iter().copied().find(|&v| {
            let value = &graph.values()[v.0];
            value.shape.is_empty() && value.dtype.is_float()
        });
        let params = graph.trainable_parameters();
        let training = match loss {
            Some(loss) if !has_backward && !params.is_empty() => {
                graph::grad(graph, loss, &params).map_or_else(|_| graph.clone(), |t| t.graph)
            }
            _ => graph.clone(),
        };
        Deterministic {
            training,
            max_blocks,
        }
    }

    /// Whether the canonical blocks can serve `node` under `strategy` on `devices` devices (its
    /// forward op and its backward ops).
    fn serves(&self, node: &graph::Node, strategy: &[Vec<usize>], devices: usize) -> bool {
        self.check(node, strategy, devices).is_ok()
    }

    fn check(
        &self,
        node: &graph::Node,
        strategy: &[Vec<usize>],
        devices: usize,
    ) -> Result<(), ParallelError> {
        let Some(id) = self.training.node_by_name(&node.name) else {
            return Ok(());
        };
        parallel::check_deterministic_strategy(
            &self.training,
            id,
            strategy,
            devices,
            self.max_blocks,
        )
    }

    /// The error of an op none of whose candidates the canonical blocks can serve: why its
    /// unsplit strategy is refused (or, when that one is valid, that no candidate was).
    fn no_candidate(&self, graph: &Graph, node: &graph::Node, devices: usize) -> SearchError {
        let unsplit = parallel::rules::strategy::unsplit_strategy(&OpContext::of(graph, node));
        let why = match self.check(node, &unsplit, devices) {
            Err(e) => e.to_string(),
            Ok(()) => "its rule accepts none of its strategies".to_string(),
        };
        SearchError::Config {
            key: "parallel.deterministic_blocks".to_string(),
            reason: format!(
                "no strategy of op {} on {devices} devices keeps to deterministic mode's {} \
                 canonical blocks per summed dim: {why}",
                node.name, self.max_blocks
            ),
        }
    }
}

/// Key of a class: the op, its operands' shapes and kinds, and what its activations count:
/// which outputs are held for the backward, which inputs' gradients are written at the peak,
/// and which parameters and fed inputs it is not the first reader of (a tied embedding table's
/// later reader: [`crate::evaluate`] counts such an operand's memory and gradient sum at its
/// first use only, so two ops differing there cost differently).
fn class_key(graph: &Graph, node: &graph::Node, held: Option<&HeldValues>) -> String {
    let kinds: Vec<String> = node
        .inputs
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let value = &graph.values()[v.0];
            let kind = match value.kind {
                ValueKind::Parameter { trainable, .. } => {
                    if trainable {
                        "P"
                    } else {
                        "F"
                    }
                }
                ValueKind::Input => "I",
                ValueKind::Intermediate if held.is_some_and(|h| !h.has_gradient(v)) => "C",
                ValueKind::Intermediate => "T",
            };
            let first = held.is_some_and(|h| h.gradient_written_at_peak(v));
            let mark = if first { "!" } else { "" };
            let later_reader = matches!(value.kind, ValueKind::Parameter { .. } | ValueKind::Input)
                && graph
                    .consumers(v)
                    .first()
                    .is_some_and(|u| u.input != k || graph.nodes()[u.node.0].name != node.name);
            let reader = if later_reader { "^" } else { "" };
            format!("{mark}{reader}{kind}{:?}{:?}", value.shape, value.dtype)
        })
        .collect();
    let outs: Vec<String> = node
        .outputs
        .iter()
        .map(|&v| {
            let mark = if held.is_none_or(|h| h.is_held(v)) {
                ""
            } else {
                "~"
            };
            format!("{mark}{:?}", graph.values()[v.0].shape)
        })
        .collect();
    format!("{:?}|{}|{}", node.op, kinds.join(","), outs.join(","))
}

/// The layout the dataset strategy gives a graph input: dim 0 split over the devices when it
/// divides, otherwise whole.
fn input_split(shape: &[usize], devices: usize) -> Vec<usize> {
    let mut f = vec![1; shape.len()];
    if let Some(first) = shape.first() {
        if first % devices == 0 {
            f[0] = devices;
        }
    }
    f
}

impl SearchProblem {
    /// The problem of the forward ops of `graph` on `settings.devices` devices. Ops named in
    /// `fixed` keep that strategy; `hints` adds candidate strategies per op name.
    pub fn build(
        graph: &Graph,
        settings: &EvalSettings<'_>,
        fixed: &BTreeMap<String, Vec<Vec<usize>>>,
        hints: &BTreeMap<String, Vec<Vec<Vec<usize>>>>,
    ) -> Result<SearchProblem, SearchError> {
        SearchProblem::build_only(graph, settings, fixed, hints, None)
    }

    /// [`SearchProblem::build`] over the forward ops named in `only` (every one when `None`):
    /// a pipeline stage's ops. Values from ops outside come in as they are (no edge).
    pub fn build_only(
        graph: &Graph,
        settings: &EvalSettings<'_>,
        fixed: &BTreeMap<String, Vec<Vec<usize>>>,
        hints: &BTreeMap<String, Vec<Vec<Vec<usize>>>>,
        only: Option<&BTreeSet<String>>,
    ) -> Result<SearchProblem, SearchError> {
        SearchProblem::build_filtered(graph, settings, fixed, hints, only, None, None)
    }

    /// [`SearchProblem::build_only`] for a run in deterministic mode when `deterministic` is
    /// given: every op not fixed keeps only the candidates whose summed-dim splits the
    /// canonical blocks can serve ([`parallel::check_deterministic_strategy`]). The ops are
    /// those of pipeline `stage` when given (`settings.devices` are the stage's): a fixed
    /// strategy that does not fit them is refused naming the stage ([`evaluate_on_stage`]).
    pub(crate) fn build_filtered(
        graph: &Graph,
        settings: &EvalSettings<'_>,
        fixed: &BTreeMap<String, Vec<Vec<usize>>>,
        hints: &BTreeMap<String, Vec<Vec<Vec<usize>>>>,
        only: Option<&BTreeSet<String>>,
        deterministic: Option<&Deterministic>,
        stage: Option<PipelineStage>,
    ) -> Result<SearchProblem, SearchError> {
        let devices = settings.devices;
        let mut classes: HashMap<String, (usize, Arc<Vec<Evaluated>>)> = HashMap::new();
        let mut nodes: Vec<SearchNode> = Vec::new();
        let mut index_of: HashMap<usize, usize> = HashMap::new();
        for (id, node) in graph.nodes().iter().enumerate() {
            if node.role != NodeRole::Forward
                || node.inputs.is_empty()
                || only.is_some_and(|o| !o.contains(&node.name))
            {
                continue;
            }
            let (candidates, class, is_fixed) = if let Some(s) = fixed.get(&node.name) {
                let one = evaluate_on_stage(graph, node, s, settings, stage)?;
                let class = usize::MAX - nodes.len();
                (Arc::new(vec![one]), class, true)
            } else {
                let key = class_key(graph, node, settings.held);
                let hint = hints.get(&node.name);
                let key = match hint {
                    Some(h) => format!("{key}|{h:?}"),
                    None => key,
                };
                let next = classes.len();
                let entry = classes.entry(key).or_insert_with(|| {
                    let mut list: Vec<Vec<Vec<usize>>> = candidates(graph, node, devices);
                    for h in hint.into_iter().flatten() {
                        if !list.contains(h) {
                            list.push(h.clone());
                        }
                    }
                    let evaluated: Vec<Evaluated> = list
                        .iter()
                        .filter_map(|s| evaluate(graph, node, s, settings).ok())
                        .filter(|e| {
                            deterministic.is_none_or(|d| d.serves(node, &e.strategy, devices))
                        })
                        .collect();
                    (next, Arc::new(evaluated))
                });
                (entry.1.clone(), entry.0, false)
            };
            if candidates.is_empty() {
                if let Some(d) = deterministic {
                    return Err(d.no_candidate(graph, node, devices));
                }
                return Err(SearchError::from(ParallelError::Unsupported {
                    op: node.name.clone(),
                    kind: node.op.kind(),
                    reason: format!(
                        "no strategy of this op is valid on {}",
                        parallel::rules::strategy::describe_devices(devices, stage)
                    ),
                }));
            }
            let unary = unary_costs(graph, node, &candidates, settings);
            index_of.insert(id, nodes.len());
            nodes.push(SearchNode {
                node: NodeId(id),
                candidates,
                unary,
                fixed: is_fixed,
                class,
            });
        }
        let mut problem = SearchProblem {
            adjacency: vec![Vec::new(); nodes.len()],
            nodes,
            edges: Vec::new(),
            devices,
        };
        problem.add_edges(graph, settings, &index_of);
        problem.check_finite(graph, &settings.profile.name)?;
        Ok(problem)
    }

    /// Refuses a problem holding a cost that is not a finite number (profile `profile`): every
    /// candidate's compute, communication and memory, every cost of bringing graph inputs to a
    /// candidate, every redistribution of an edge. No search then ranks candidates on an
    /// infinite or NaN time, where ties would choose among them arbitrarily.
    fn check_finite(&self, graph: &Graph, profile: &str) -> Result<(), SearchError> {
        let name = |n: usize| graph.nodes()[self.nodes[n].node.0].name.as_str();
        let refuse = |what: String, value: f64| SearchError::NonFiniteCost {
            profile: profile.to_string(),
            what,
            value,
        };
        for (n, node) in self.nodes.iter().enumerate() {
            for (c, cand) in node.candidates.iter().enumerate() {
                let figures = [
                    ("compute time", cand.compute),
                    ("communication time", cand.comm),
                    ("communication bytes", cand.comm_bytes),
                    ("memory", cand.memory.total()),
                ];
                let unary = node.unary.get(c).into_iter().flat_map(|&(t, b)| {
                    [
                        ("time to bring the graph inputs to", t),
                        ("bytes to bring the graph inputs to", b),
                    ]
                });
                for (what, value) in figures.into_iter().chain(unary) {
                    if !value.is_finite() {
                        return Err(refuse(
                            format!(
                                "the {what} of op {} under strategy {:?}",
                                name(n),
                                cand.strategy
                            ),
                            value,
                        ));
                    }
                }
            }
        }
        for edge in &self.edges {
            let n_v = self.n_candidates(edge.v);
            let bad = edge
                .time
                .iter()
                .zip(edge.bytes.iter())
                .position(|(t, b)| !(t.is_finite() && b.is_finite()));
            if let Some(i) = bad {
                let (a, b) = (i / n_v, i % n_v);
                let (what, value) = if edge.time[i].is_finite() {
                    ("bytes", edge.bytes[i])
                } else {
                    ("time", edge.time[i])
                };
                return Err(refuse(
                    format!(
                        "the redistribution {what} from op {} under strategy {:?} to op {} \
                         under strategy {:?}",
                        name(edge.u),
                        self.nodes[edge.u].candidates[a].strategy,
                        name(edge.v),
                        self.nodes[edge.v].candidates[b].strategy
                    ),
                    value,
                ));
            }
        }
        Ok(())
    }

    /// Adds an edge for every value passed between two ops and every parameter two ops share.
    fn add_edges(
        &mut self,
        graph: &Graph,
        settings: &EvalSettings<'_>,
        index_of: &HashMap<usize, usize>,
    ) {
        let mut matrices: HashMap<(usize, usize, EdgeKind, bool), EdgeCosts> = HashMap::new();
        let mut first_reader: HashMap<ValueId, (usize, usize)> = HashMap::new();
        for v in 0..self.nodes.len() {
            let node = &graph.nodes()[self.nodes[v].node.0];
            for (input, &value) in node.inputs.iter().enumerate() {
                let val = &graph.values()[value.0];
                let edge = match (&val.kind, val.producer) {
                    (ValueKind::Intermediate, Some((p, out))) => index_of
                        .get(&p.0)
                        .map(|&u| (u, EdgeKind::Value { out, input })),
                    (ValueKind::Parameter { .. }, _) => match first_reader.get(&value) {
                        Some(&(u, first)) if u != v => Some((
                            u,
                            EdgeKind::SharedParam {
                                first,
                                second: input,
                            },
                        )),
                        Some(_) => None,
                        None => {
                            first_reader.insert(value, (v, input));
                            None
                        }
                    },
                    _ => None,
                };
                let Some((u, kind)) = edge else { continue };
                let (cu, cv) = (self.nodes[u].class, self.nodes[v].class);
                let cacheable = !self.nodes[u].fixed && !self.nodes[v].fixed;
                // The gradient comes back along the edge only when the backward computes one
                // (not for a value computed from the data alone).
                let with_gradient =
                    val.dtype.is_float() && settings.held.is_none_or(|h| h.has_gradient(value));
                let build = || {
                    edge_matrices(
                        &self.nodes[u].candidates,
                        &self.nodes[v].candidates,
                        kind,
                        &val.shape,
                        val.dtype.size_in_bytes() as f64,
                        with_gradient,
                        settings,
                    )
                };
                let (time, bytes) = if cacheable {
                    matrices
                        .entry((cu, cv, kind, with_gradient))
                        .or_insert_with(build)
                        .clone()
                } else {
                    build()
                };
                let e = self.edges.len();
                self.edges.push(SearchEdge { u, v, time, bytes });
                self.adjacency[u].push(e);
                self.adjacency[v].push(e);
            }
        }
    }

    /// Number of candidates of node `n`.
    pub fn n_candidates(&self, n: usize) -> usize {
        self.nodes[n].candidates.len()
    }

    /// Seconds of node `n` under candidate `c` (its own cost and its graph inputs').
    pub fn node_time(&self, n: usize, c: usize) -> f64 {
        let node = &self.nodes[n];
        node.candidates[c].time() + node.unary.get(c).map_or(0.0, |u| u.0)
    }

    /// Bytes of memory per device of node `n` under candidate `c`.
    pub fn node_memory(&self, n: usize, c: usize) -> f64 {
        self.nodes[n].candidates[c].memory.total()
    }

    /// Seconds of edge `e` under the endpoints' choices `a` and `b`.
    pub fn edge_time(&self, e: usize, a: usize, b: usize) -> f64 {
        let edge = &self.edges[e];
        edge.time_of(a, b, self.n_candidates(edge.v))
    }

    /// The cost of `choice` (a candidate index per node).
    pub fn cost(&self, choice: &[usize]) -> PlanCost {
        let mut compute = 0.0;
        let mut comm = 0.0;
        let mut comm_bytes = 0.0;
        for (n, &c) in choice.iter().enumerate() {
            let cand = &self.nodes[n].candidates[c];
            compute += cand.compute;
            comm += cand.comm;
            comm_bytes += cand.comm_bytes;
            if let Some(&(t, b)) = self.nodes[n].unary.get(c) {
                comm += t;
                comm_bytes += b;
            }
        }
        for (e, edge) in self.edges.iter().enumerate() {
            let (a, b) = (choice[edge.u], choice[edge.v]);
            comm += self.edge_time(e, a, b);
            comm_bytes += edge.bytes[a * self.n_candidates(edge.v) + b];
        }
        let memory = plan_memory(
            choice
                .iter()
                .enumerate()
                .map(|(n, &c)| &self.nodes[n].candidates[c].memory),
        );
        PlanCost {
            compute,
            comm,
            comm_bytes,
            memory,
        }
    }

    /// Step time of `choice` (the objective).
    pub fn time(&self, choice: &[usize]) -> f64 {
        let nodes: f64 = choice
            .iter()
            .enumerate()
            .map(|(n, &c)| self.node_time(n, c))
            .sum();
        let edges: f64 = self
            .edges
            .iter()
            .enumerate()
            .map(|(e, edge)| self.edge_time(e, choice[edge.u], choice[edge.v]))
            .sum();
        nodes + edges
    }

    /// Memory per device of `choice`.
    pub fn memory(&self, choice: &[usize]) -> f64 {
        choice
            .iter()
            .enumerate()
            .map(|(n, &c)| self.node_memory(n, c))
            .sum()
    }

    /// Per node, its time under `choice` with half of every edge it has, and its memory: the
    /// shares that add up to [`SearchProblem::time`] and [`SearchProblem::cost`]'s memory.
    pub fn node_shares(&self, choice: &[usize]) -> Vec<(f64, MemoryEstimate)> {
        let mut time: Vec<f64> = choice
            .iter()
            .enumerate()
            .map(|(n, &c)| self.node_time(n, c))
            .collect();
        for (e, edge) in self.edges.iter().enumerate() {
            let t = self.edge_time(e, choice[edge.u], choice[edge.v]);
            time[edge.u] += 0.5 * t;
            time[edge.v] += 0.5 * t;
        }
        time.into_iter()
            .zip(choice)
            .enumerate()
            .map(|(n, (t, &c))| (t, self.nodes[n].candidates[c].memory))
            .collect()
    }

    /// Per node, the memory of its candidate needing the least (what any plan needs at least).
    pub fn least_memory(&self) -> Vec<MemoryEstimate> {
        self.nodes
            .iter()
            .map(|node| {
                node.candidates
                    .iter()
                    .map(|c| c.memory)
                    .min_by(|a, b| a.total().total_cmp(&b.total()))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// A lower bound of any plan's step time: every node and edge at its cheapest.
    pub fn lower_bound(&self) -> f64 {
        let nodes: f64 = (0..self.nodes.len())
            .map(|n| {
                (0..self.n_candidates(n))
                    .map(|c| self.node_time(n, c))
                    .fold(f64::INFINITY, f64::min)
            })
            .sum();
        let edges: f64 = self
            .edges
            .iter()
            .map(|e| e.time.iter().copied().fold(f64::INFINITY, f64::min))
            .sum();
        nodes + edges
    }
}

/// Per candidate of `node`, the cost of bringing the graph inputs it reads from the dataset
/// strategy's layout to the candidate's.
fn unary_costs(
    graph: &Graph,
    node: &graph::Node,
    candidates: &[Evaluated],
    settings: &EvalSettings<'_>,
) -> Vec<(f64, f64)> {
    let inputs: Vec<(usize, &graph::Value)> = node
        .inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| (i, &graph.values()[v.0]))
        .filter(|(_, v)| v.kind == ValueKind::Input)
        .collect();
    if inputs.is_empty() {
        return Vec::new();
    }
    candidates
        .iter()
        .map(|cand| {
            let mut total = (0.0, 0.0);
            for &(i, value) in &inputs {
                let from = Split {
                    factors: input_split(&value.shape, settings.devices),
                    partial: 1,
                };
                let (t, b) = redistribution(
                    settings.profile,
                    &value.shape,
                    value.dtype.size_in_bytes() as f64,
                    &from,
                    &cand.inputs[i].factors,
                    false,
                );
                total.0 += t;
                total.1 += b;
            }
            total
        })
        .collect()
}

/// The time and bytes matrices of an edge between candidates `us` and `vs`.
fn edge_matrices(
    us: &[Evaluated],
    vs: &[Evaluated],
    kind: EdgeKind,
    shape: &[usize],
    elem: f64,
    with_gradient: bool,
    settings: &EvalSettings<'_>,
) -> EdgeCosts {
    let mut time = Vec::with_capacity(us.len() * vs.len());
    let mut bytes = Vec::with_capacity(us.len() * vs.len());
    for a in us {
        for b in vs {
            let (from, to) = match kind {
                EdgeKind::Value { out, input } => (a.outputs[out].clone(), &b.inputs[input]),
                EdgeKind::SharedParam { first, second } => {
                    (a.inputs[first].clone(), &b.inputs[second])
                }
            };
            let (t, by) = redistribution(
                settings.profile,
                shape,
                elem,
                &from,
                &to.factors,
                with_gradient,
            );
            time.push(t);
            bytes.push(by);
        }
    }
    (Arc::new(time), Arc::new(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluate::redistribution;

    /// The seed MLP's first product reads the flattened data, which depends on no parameter:
    /// the backward computes no gradient of it (`tessera train --explain` lists no
    /// `matmul1.grad0`), so neither a pending sum of that gradient nor its way back to `flatten`
    /// is costed. Only the weight's gradient all-reduce is; before, the plan predicted 42 % more
    /// bytes than the program on 12 devices moved (205 440 against 144 096).
    #[test]
    fn a_value_computed_from_the_data_alone_costs_no_gradient_communication() {
        let model = graph::models::seed_mlp(60, &[8, 8], 30, 10).unwrap();
        let graph = &model.graph;
        let profile = crate::profiles::built_in("h100-nvlink-ib").unwrap();
        let held = HeldValues::of(graph);
        let settings = EvalSettings {
            profile: &profile,
            devices: 12,
            optimizer_states: 2,
            held: Some(&held),
        };
        let fixed: BTreeMap<String, Vec<Vec<usize>>> = [
            ("flatten", vec![vec![12, 1, 1]]),
            ("matmul1", vec![vec![4, 1], vec![1, 3]]),
            ("relu1", vec![vec![4, 3]]),
            ("matmul2", vec![vec![4, 3], vec![3, 1]]),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .collect();
        let problem = SearchProblem::build(graph, &settings, &fixed, &BTreeMap::new()).unwrap();
        let index = |name: &str| {
            problem
                .nodes
                .iter()
                .position(|n| graph.nodes()[n.node.0].name == name)
                .unwrap()
        };
        let (flatten, matmul1, relu1) = (index("flatten"), index("matmul1"), index("relu1"));
        // matmul1: the weight [64, 30] split (1, 3) is summed over the 4 ranks sharing each
        // column block; nothing for its input.
        let weight_local = 64.0 * 10.0 * 4.0;
        assert_eq!(
            problem.nodes[matmul1].candidates[0].comm_bytes,
            2.0 * weight_local * 3.0 / 4.0
        );
        // flatten -> matmul1: the all-gather of the rows, forward only.
        let edge = problem
            .edges
            .iter()
            .find(|e| e.u == flatten && e.v == matmul1)
            .unwrap();
        let split = |f: &[usize]| crate::evaluate::Split {
            factors: f.to_vec(),
            partial: 1,
        };
        let forward = redistribution(&profile, &[60, 64], 4.0, &split(&[12, 1]), &[4, 1], false);
        assert!(forward.1 > 0.0);
        assert_eq!(edge.bytes[0], forward.1);
        // relu1's output depends on fc1_weight: its gradient does come back to matmul2's input.
        let edge = problem
            .edges
            .iter()
            .find(|e| e.u == relu1 && e.v == index("matmul2"))
            .unwrap();
        let both = redistribution(&profile, &[60, 30], 4.0, &split(&[4, 3]), &[4, 3], true);
        assert_eq!(edge.bytes[0], both.1);
        assert!(held.has_gradient(model.logits) && !held.has_gradient(model.input));
    }
}
