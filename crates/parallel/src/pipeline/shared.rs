//! Parameters shared across pipeline stages (a GPT's tied embedding table and LM head):
//! every stage that reads one holds its own copy.
//!
//! [`split_shared_parameters`] rewrites a forward graph before autodiff: a parameter read by
//! nodes of several stages keeps its name and place on the first of them (its *owner* stage)
//! and, for every later stage, gets a copy named `<name>@stage<s>` that that stage's nodes read
//! instead. Autodiff then gives every copy its own gradient, accumulated over the micro-batches
//! on its own stage like any parameter's; the runtime sums the copies' gradients across their
//! stages once per step, before the optimizer update, so the copies (same initial values,
//! same summed gradient, same update) stay identical. No weight and no gradient crosses stages
//! in the micro-batches' passes. The placement lays every copy out as its owner is laid out,
//! moved onto the copy's stage, so slot `j` of every copy holds the same box and the sum is an
//! all-reduce over the ranks of slot `j` of each copy.

use graph::{Graph, NodeRole, Use, ValueId, ValueKind};

use crate::config::ParallelConfig;
use crate::error::ParallelError;

use super::place::node_stages;

/// What a copy's name adds to its owner's: `embedding.embedding_table@stage1`.
pub const SHARED_COPY_MARK: &str = "@stage";

/// The owner's name and the stage of a copy named `name` (`None` for any other name).
pub fn shared_copy_of(name: &str) -> Option<(&str, usize)> {
    let (owner, stage) = name.rsplit_once(SHARED_COPY_MARK)?;
    let stage = stage.parse().ok()?;
    (!owner.is_empty()).then_some((owner, stage))
}

/// A parameter shared by several pipeline stages: its owner and its copies, as indices into
/// a program's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedParameter {
    /// The owner's name (the name checkpoints and strategy files use).
    pub name: String,
    /// The owner (the first stage reading it) first, then one copy per later stage, by stage.
    pub params: Vec<usize>,
    /// The stage of each of `params`.
    pub stages: Vec<usize>,
}

/// `forward` with every parameter read on several pipeline stages split into one copy per
/// stage (see the module doc); `forward` itself without pipeline stages or shared parameters.
pub fn split_shared_parameters(
    forward: &Graph,
    config: &ParallelConfig,
) -> Result<Graph, ParallelError> {
    let Some(pipeline) = config.pipeline.as_ref().filter(|p| p.stages > 1) else {
        return Ok(forward.clone());
    };
    let stages = node_stages(forward, pipeline).map_err(|e| ParallelError::Setting {
        setting: "pipeline",
        reason: e.to_string(),
    })?;
    let mut graph = forward.clone();
    for p in forward.parameters() {
        let name = forward.values()[p.0].name.clone();
        let mut by_stage: Vec<(usize, Vec<Use>)> = Vec::new();
        for u in forward.consumers(p) {
            if forward.nodes()[u.node.0].role != NodeRole::Forward {
                continue;
            }
            let stage = stages.nodes[u.node.0];
            match by_stage.iter_mut().find(|(s, _)| *s == stage) {
                Some((_, uses)) => uses.push(*u),
                None => by_stage.push((stage, vec![*u])),
            }
        }
        // The first stage reading it owns it; the others get copies.
        for (stage, uses) in by_stage.into_iter().skip(1) {
            let copy = format!("{name}{SHARED_COPY_MARK}{stage}");
            graph = graph.with_parameter_copy(p, &copy, &uses)?.0;
        }
    }
    Ok(graph)
}

/// The shared parameters of a program whose parameters are `names` (in program order): each
/// owner with the copies [`split_shared_parameters`] made of it.
pub fn shared_parameters<'a>(
    names: impl IntoIterator<Item = &'a str>,
    stage_of: impl Fn(usize) -> usize,
) -> Vec<SharedParameter> {
    let names: Vec<&str> = names.into_iter().collect();
    let mut shared: Vec<SharedParameter> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let Some((owner, stage)) = shared_copy_of(name) else {
            continue;
        };
        let Some(o) = names.iter().position(|n| *n == owner) else {
            continue;
        };
        match shared.iter_mut().find(|s| s.name == owner) {
            Some(s) => {
                s.params.push(i);
                s.stages.push(stage);
            }
            None => shared.push(SharedParameter {
                name: owner.to_string(),
                params: vec![o, i],
                stages: vec![stage_of(o), stage],
            }),
        }
    }
    for s in &mut shared {
        // Owner first, then the copies by stage.
        let mut order: Vec<(usize, usize)> =
            s.stages.iter().copied().zip(s.params.clone()).collect();
        order[1..].sort_unstable();
        s.stages = order.iter().map(|o| o.0).collect();
        s.params = order.iter().map(|o| o.1).collect();
    }
    shared
}

/// Whether `value` of `graph` is a copy of a shared parameter.
pub fn is_shared_copy(graph: &Graph, value: ValueId) -> bool {
    let v = &graph.values()[value.0];
    matches!(v.kind, ValueKind::Parameter { .. }) && shared_copy_of(&v.name).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_names_give_their_owner_and_stage() {
        assert_eq!(
            shared_copy_of("embedding.embedding_table@stage3"),
            Some(("embedding.embedding_table", 3))
        );
        assert_eq!(shared_copy_of("embedding.embedding_table"), None);
        assert_eq!(shared_copy_of("x@stagex"), None);
        assert_eq!(shared_copy_of("@stage1"), None);
    }

    #[test]
    fn owners_come_first_then_copies_by_stage() {
        let names = ["a", "w", "w@stage3", "b", "w@stage1"];
        let shared = shared_parameters(names, |_| 0);
        assert_eq!(
            shared,
            vec![SharedParameter {
                name: "w".to_string(),
                params: vec![1, 4, 2],
                stages: vec![0, 1, 3],
            }]
        );
    }
}
