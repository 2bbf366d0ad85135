//! Anchors: strategies fixed by the layouts of an op's operands rather than by the op itself
//! (MindSpore's functional `shard(fn, in_strategy, parameter_plan)`, whose strategies reach the
//! ops reading the sub-network's inputs and parameters). Each anchored op takes the cheapest of
//! its candidate strategies that splits every anchored operand as asked; sharding propagation
//! then starts from those ops.

use std::collections::BTreeMap;

use graph::{Graph, NodeRole, ValueId};
use parallel::ParallelError;

use crate::candidates::candidates;
use crate::error::SearchError;
use crate::evaluate::{evaluate, EvalSettings};

/// The split tuple a value must have wherever an op reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    /// The value (a graph input or a parameter).
    pub value: ValueId,
    /// Its split per dim.
    pub split: Vec<usize>,
}

/// The strategy of every forward op reading an anchored value: among its candidates on
/// `settings.devices` devices that split each anchored operand as its anchor says, the one of
/// least time under the cost model. An error names the op and anchor no candidate serves.
pub fn anchored_strategies(
    graph: &Graph,
    anchors: &[Anchor],
    settings: &EvalSettings<'_>,
) -> Result<BTreeMap<String, Vec<Vec<usize>>>, SearchError> {
    let mut wanted: BTreeMap<usize, Vec<(usize, &Anchor)>> = BTreeMap::new();
    for anchor in anchors {
        let value = &graph.values()[anchor.value.0];
        if anchor.split.len() != value.shape.len() {
            return Err(SearchError::from(ParallelError::Setting {
                setting: "shard",
                reason: format!(
                    "{} has {} dims but its strategy {:?} has {}",
                    value.name,
                    value.shape.len(),
                    anchor.split,
                    anchor.split.len()
                ),
            }));
        }
        for u in graph.consumers(anchor.value) {
            wanted.entry(u.node.0).or_default().push((u.input, anchor));
        }
    }
    let mut out = BTreeMap::new();
    for (node_id, operands) in wanted {
        let node = &graph.nodes()[node_id];
        if node.role != NodeRole::Forward {
            continue;
        }
        let best = candidates(graph, node, settings.devices)
            .into_iter()
            .filter(|s| {
                operands
                    .iter()
                    .all(|(input, a)| s.get(*input).is_some_and(|t| t == &a.split))
            })
            .filter_map(|s| evaluate(graph, node, &s, settings).ok())
            .min_by(|a, b| a.time().total_cmp(&b.time()));
        let Some(best) = best else {
            let asked: Vec<String> = operands
                .iter()
                .map(|(input, a)| {
                    let name = &graph.values()[a.value.0].name;
                    format!("input {input} ({name}) split {:?}", a.split)
                })
                .collect();
            return Err(SearchError::from(ParallelError::Unsupported {
                op: node.name.clone(),
                kind: node.op.kind(),
                reason: format!(
                    "no strategy on {} devices has {}",
                    settings.devices,
                    asked.join(" and ")
                ),
            }));
        };
        out.insert(node.name.clone(), best.strategy);
    }
    Ok(out)
}
