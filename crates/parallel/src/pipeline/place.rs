//! Pipeline stages in the parallel pass: which stage every node runs on, and moving a layout
//! computed for one stage's devices onto that stage's ranks.
//!
//! A layer (cell) is a node name's leading components up to and including the first numeric one
//! (`blocks.3.attn.qkv` → `blocks.3`), or its first component (`embedding.gather` →
//! `embedding`). A `stage_config` key naming a cell below such a layer (`net.fc1` inside the
//! layer `net` of a loss cell of one's own) splits it ([`staged_layer_of`]). Layers are ordered
//! by their first forward node; [`assign_stages`] cuts them into stages. A forward node runs on
//! its layer's stage, raised to the latest stage of the forward nodes it reads; a backward node
//! runs on its forward node's stage; a gradient sum on the stage of the value it is the gradient
//! of.

use std::collections::{HashMap, HashSet};

use graph::{Graph, NodeRole, ValueId, ValueKind};
use layout::{Layout, LayoutError, Mesh, TensorLayout};
use reshard::DistLayout;

use super::config::PipelineConfig;
use super::error::PipelineError;
use super::stages::{assign_stages, Layer, StageAssignment};

/// The layer (cell) a node named `name` belongs to.
pub fn layer_of(name: &str) -> &str {
    let mut end = 0;
    for (i, part) in name.split('.').enumerate() {
        end += part.len() + usize::from(i > 0);
        if i > 0 && part.chars().all(|c| c.is_ascii_digit()) {
            return &name[..end];
        }
    }
    name.split('.').next().unwrap_or(name)
}

/// The layer (cell) a node named `name` belongs to under `stage_config` (cell-name prefix →
/// stage): [`layer_of`], unless a key names a cell below that layer (MindSpore assigns stages to
/// cells at any depth). Then the layer is cut along the keys: the node's layer is the deepest of
/// the longest key that is a `.`-separated prefix of `name`, and, for every other key below the
/// layer, the component of `name` where it leaves that key's path (`net.relu` for
/// `net.relu.relu` under the key `net.fc1`). So every key is an ancestor of (or equal to) a
/// layer, or shares no layer with it, and a layer never straddles a key.
pub fn staged_layer_of<'a>(name: &'a str, stage_config: &[(String, usize)]) -> &'a str {
    let base = layer_of(name);
    let mut end = base.len();
    for (key, _) in stage_config {
        if key.len() <= base.len() || !dotted_prefix(base, key) {
            continue;
        }
        let cut = if dotted_prefix(key, name) {
            key.len()
        } else {
            // The end of `name`'s first component that `key` does not share.
            let common = common_components(key, name);
            let rest = &name[common..];
            let rest = rest.strip_prefix('.').unwrap_or(rest);
            name.len() - rest.len() + rest.find('.').unwrap_or(rest.len())
        };
        end = end.max(cut);
    }
    &name[..end]
}

/// True when `prefix` is `name` or a `.`-separated ancestor of it.
fn dotted_prefix(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// The length of the longest `.`-separated prefix `a` and `b` share (0 if none).
fn common_components(a: &str, b: &str) -> usize {
    let mut end = 0;
    let mut pos = 0;
    for (x, y) in a.split('.').zip(b.split('.')) {
        if x != y {
            break;
        }
        pos += x.len();
        end = pos;
        pos += 1;
    }
    end
}

/// The names of the layers on `stage`, in model order, from a `(layer, stage)` list such as
/// [`NodeStages::layers`] (where a cell with a call raised to a later stage is listed under
/// both stages).
pub fn layers_of_stage(layers: &[(String, usize)], stage: usize) -> Vec<&str> {
    layers
        .iter()
        .filter(|(_, s)| *s == stage)
        .map(|(name, _)| name.as_str())
        .collect()
}

/// The stage of every node and of every value that no node produces (inputs, parameters: the
/// stage of their first forward consumer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStages {
    /// Per node (by id).
    pub nodes: Vec<usize>,
    /// Per value (by id); produced values take their producer's stage.
    pub values: Vec<usize>,
    /// Per node, its model chunk within its stage (0 without virtual stages).
    pub node_chunks: Vec<usize>,
    /// Per value, the model chunk of its producer (or first consumer).
    pub value_chunks: Vec<usize>,
    /// The layers with the stage their forward ops run on, as each stage runs them: a layer
    /// (cell) once per stage running some of its forward ops, in the order of its first such
    /// op. A cell whose call reads a later stage's output has that call raised to the later
    /// stage, so it is listed under its own stage and again under the later one (`net.act` on
    /// stages 0 and 1 when it is called after `net.fc1` and again after `net.fc2`); a cell all
    /// of whose calls are raised only under the later stage. `nodes` gives each node's stage.
    pub layers: Vec<(String, usize)>,
}

/// Assigns every node of `graph` to a stage of `config`.
pub fn node_stages(graph: &Graph, config: &PipelineConfig) -> Result<NodeStages, PipelineError> {
    let mut order: Vec<String> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut params: Vec<u64> = Vec::new();
    // Per layer, whether it reads a trainable parameter (what a checkpoint holds).
    let mut trains: Vec<bool> = Vec::new();
    let mut counted = vec![false; graph.values().len()];
    let keys = &config.stage_config;
    for node in graph.nodes().iter().filter(|n| n.role == NodeRole::Forward) {
        let layer = staged_layer_of(&node.name, keys).to_string();
        let i = *index.entry(layer.clone()).or_insert_with(|| {
            order.push(layer);
            params.push(0);
            trains.push(false);
            order.len() - 1
        });
        for &v in &node.inputs {
            // A shared parameter's copies (`shared`) are not counted again: the stages are
            // those of the graph before the copies were made.
            if matches!(graph.values()[v.0].kind, ValueKind::Parameter { .. })
                && !counted[v.0]
                && !super::shared::is_shared_copy(graph, v)
            {
                counted[v.0] = true;
                params[i] += graph.values()[v.0].shape.iter().product::<usize>() as u64;
                if let ValueKind::Parameter {
                    trainable: true, ..
                } = graph.values()[v.0].kind
                {
                    trains[i] = true;
                }
            }
        }
    }
    let layers: Vec<Layer> = order
        .iter()
        .zip(&params)
        .map(|(name, &n)| Layer::new(name.clone(), n))
        .collect();
    let assignment = assign_stages(&layers, config)?;
    check_stages_hold_parameters(&layers, &trains, &assignment, config)?;
    // Groups `chunk · P + stage`, then split into stages and chunks.
    let layer_group = |name: &str| -> usize {
        index
            .get(staged_layer_of(name, keys))
            .and_then(|&i| assignment.group_of_layer.get(i).copied())
            .unwrap_or(0)
    };
    let mut groups = vec![0; graph.nodes().len()];
    let mut values: Vec<Option<usize>> = vec![None; graph.values().len()];
    for (id, node) in graph.nodes().iter().enumerate() {
        let group = match &node.role {
            NodeRole::Forward => {
                raised_to_inputs(graph, id, layer_group(&node.name), &groups, keys)?
            }
            NodeRole::Backward(g) => groups[g.forward.0],
            NodeRole::Accumulate { value } | NodeRole::Seed { value } => {
                stage_of_value(graph, *value, &groups, &values)
            }
        };
        groups[id] = group;
        for &v in &node.inputs {
            if graph.values()[v.0].producer.is_none() && values[v.0].is_none() {
                values[v.0] = Some(group);
            }
        }
        for &v in &node.outputs {
            values[v.0] = Some(group);
        }
    }
    let p = assignment.stages.max(1);
    let values: Vec<usize> = values.into_iter().map(|g| g.unwrap_or(0)).collect();
    let nodes: Vec<usize> = groups.iter().map(|g| g % p).collect();
    Ok(NodeStages {
        layers: layers_as_run(graph, &nodes, keys),
        nodes,
        values: values.iter().map(|g| g % p).collect(),
        node_chunks: groups.iter().map(|g| g / p).collect(),
        value_chunks: values.iter().map(|g| g / p).collect(),
    })
}

/// [`NodeStages::layers`]: every `(cell, stage)` pair of a forward node of `graph` (its cell by
/// [`staged_layer_of`] under `keys`, its stage from `stage_of_node`), once, in the order of its
/// first node.
fn layers_as_run(
    graph: &Graph,
    stage_of_node: &[usize],
    keys: &[(String, usize)],
) -> Vec<(String, usize)> {
    let mut seen: HashSet<(&str, usize)> = HashSet::new();
    graph
        .nodes()
        .iter()
        .zip(stage_of_node)
        .filter(|(node, _)| node.role == NodeRole::Forward)
        .map(|(node, &stage)| (staged_layer_of(&node.name, keys), stage))
        .filter(|&pair| seen.insert(pair))
        .map(|(cell, stage)| (cell.to_string(), stage))
        .collect()
}

/// Every stage up to the last one holding trainable parameters holds some (`trains`: per layer,
/// whether it reads one; [`PipelineError::StageWithoutParameters`] otherwise, naming the first
/// that holds none and its cells): a strategy numbers the stages by the parameters their
/// checkpoints hold (trainable ones), so a gap would leave the run's checkpoints unreadable.
fn check_stages_hold_parameters(
    layers: &[Layer],
    trains: &[bool],
    assignment: &StageAssignment,
    config: &PipelineConfig,
) -> Result<(), PipelineError> {
    let held = |s: usize| {
        trains
            .iter()
            .enumerate()
            .any(|(i, &t)| t && assignment.stage_of(i) == Some(s))
    };
    let Some(later) = (0..assignment.stages).rev().find(|&s| held(s)) else {
        return Ok(());
    };
    let Some(stage) = (0..later).find(|&s| !held(s)) else {
        return Ok(());
    };
    let cells = layers
        .iter()
        .enumerate()
        .filter(|(i, _)| assignment.stage_of(*i) == Some(stage))
        .map(|(_, layer)| layer.name.clone())
        .collect();
    Err(PipelineError::StageWithoutParameters {
        stage,
        later,
        cells,
        by_stage_config: !config.stage_config.is_empty(),
    })
}

/// The group of forward node `id`, `group` by its cell, raised to the highest group of the
/// forward nodes it reads (MindSpore's stage colouring: a user whose producer has a larger stage
/// is raised to it, so stages never decrease along the data flow). A cell called again after a
/// later stage's cell (one activation cell used after `fc1` and after `fc2`) would otherwise
/// read, on the earlier stage, what the later stage computes in the same micro-batch's forward
/// pass: data flowing back, which deadlocks 1F1B. A node whose cell a `stage_config` key names
/// is not raised but refused ([`PipelineError::CellSplitBetweenStages`], naming it, its cell
/// and the input): the key would be silently overridden.
fn raised_to_inputs(
    graph: &Graph,
    id: usize,
    group: usize,
    groups: &[usize],
    keys: &[(String, usize)],
) -> Result<usize, PipelineError> {
    let node = &graph.nodes()[id];
    let highest = node
        .inputs
        .iter()
        .filter_map(|v| graph.values()[v.0].producer)
        .filter(|(n, _)| graph.nodes()[n.0].role == NodeRole::Forward)
        .max_by_key(|(n, _)| groups[n.0]);
    let Some((input, _)) = highest else {
        return Ok(group);
    };
    let input_group = groups[input.0];
    if input_group <= group {
        return Ok(group);
    }
    let cell = staged_layer_of(&node.name, keys);
    if keys.iter().any(|(key, _)| dotted_prefix(key, cell)) {
        return Err(PipelineError::CellSplitBetweenStages {
            node: node.name.clone(),
            cell: cell.to_string(),
            stage: group,
            input: graph.nodes()[input.0].name.clone(),
            input_stage: input_group,
        });
    }
    Ok(input_group)
}

/// The group of `value`: its producer's, or for a leaf the group it was first used in.
fn stage_of_value(
    graph: &Graph,
    value: ValueId,
    nodes: &[usize],
    values: &[Option<usize>],
) -> usize {
    match graph.values()[value.0].producer {
        Some((n, _)) => nodes[n.0],
        None => values[value.0].unwrap_or(0),
    }
}

/// `layout` (on ranks `0..n` of one stage's mesh) moved onto ranks `offset..offset + n`.
pub fn relocate(layout: &TensorLayout, offset: usize) -> Result<TensorLayout, LayoutError> {
    if offset == 0 {
        return Ok(layout.clone());
    }
    let mesh = layout.mesh();
    let moved = Mesh::from_axes(
        mesh.axes().to_vec(),
        Some(mesh.rank_list().iter().map(|&r| r + offset).collect()),
    )?;
    let bound = Layout::from_mesh(moved, layout.dims().to_vec())?;
    match layout.row_split() {
        Some(rows) => TensorLayout::with_rows(bound, layout.shape(), rows),
        None => bound.bind(layout.shape()),
    }
}

/// `layout` (on a stage whose ranks start at `from`) moved onto the stage whose ranks start at
/// `to`: every rank `r` of its mesh becomes `r − from + to`.
pub fn move_between_stages(
    layout: &TensorLayout,
    from: usize,
    to: usize,
) -> Result<TensorLayout, LayoutError> {
    if from == to {
        return Ok(layout.clone());
    }
    let mesh = layout.mesh();
    let moved = Mesh::from_axes(
        mesh.axes().to_vec(),
        Some(mesh.rank_list().iter().map(|&r| r + to - from).collect()),
    )?;
    let bound = Layout::from_mesh(moved, layout.dims().to_vec())?;
    match layout.row_split() {
        Some(rows) => TensorLayout::with_rows(bound, layout.shape(), rows),
        None => bound.bind(layout.shape()),
    }
}

/// [`relocate`] for a layout with pending sums.
pub fn relocate_dist(layout: &DistLayout, offset: usize) -> Result<DistLayout, LayoutError> {
    let moved = relocate(layout.layout(), offset)?;
    let partial = DistLayout::partial(moved, layout.sum_order())
        .expect("the same axes stay unused on the moved mesh");
    Ok(partial.with_op(layout.pending_op()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_end_at_the_first_numeric_component() {
        assert_eq!(layer_of("blocks.3.attn.qkv.matmul"), "blocks.3");
        assert_eq!(layer_of("embedding.gather"), "embedding");
        assert_eq!(layer_of("loss"), "loss");
        assert_eq!(layer_of("matmul1"), "matmul1");
        assert_eq!(layer_of("a.b.12.c"), "a.b.12");
    }

    #[test]
    fn keys_below_a_layer_cut_it_along_their_paths() {
        let keys = |k: &[&str]| k.iter().map(|k| (k.to_string(), 0)).collect::<Vec<_>>();
        let two = keys(&["net.fc1", "net.fc2"]);
        assert_eq!(staged_layer_of("net.fc1.matmul", &two), "net.fc1");
        assert_eq!(staged_layer_of("net.fc2.bias_add", &two), "net.fc2");
        assert_eq!(staged_layer_of("net.relu.relu_1", &two), "net.relu");
        assert_eq!(staged_layer_of("net.fc10.matmul", &two), "net.fc10");
        assert_eq!(staged_layer_of("net", &two), "net");
        assert_eq!(staged_layer_of("loss.mean", &two), "loss");
        // Keys at or above the layer leave it whole.
        let whole = keys(&["blocks", "blocks.3", "net"]);
        assert_eq!(staged_layer_of("blocks.3.attn.qkv", &whole), "blocks.3");
        assert_eq!(staged_layer_of("net.fc1.matmul", &whole), "net");
        // Nested keys: the deepest cut wins; a key two levels down cuts at its branch.
        let nested = keys(&["net.a", "net.a.b.c"]);
        assert_eq!(staged_layer_of("net.a.b.c.d", &nested), "net.a.b.c");
        assert_eq!(staged_layer_of("net.a.b.x", &nested), "net.a.b.x");
        assert_eq!(staged_layer_of("net.a.y", &nested), "net.a.y");
        assert_eq!(staged_layer_of("net.z.q", &nested), "net.z");
        assert_eq!(
            staged_layer_of("blocks.3.attn.qkv", &keys(&["blocks.3.attn"])),
            "blocks.3.attn"
        );
    }

    #[test]
    fn relocation_moves_the_rank_list_only() {
        let t = Layout::new(&[2, 2], &["dp", "mp"], None)
            .unwrap()
            .apply(&["dp".into(), "mp".into()])
            .unwrap()
            .bind(&[4, 4])
            .unwrap();
        let moved = relocate(&t, 4).unwrap();
        assert_eq!(moved.mesh().rank_list(), &[4, 5, 6, 7]);
        assert_eq!(moved.rank_box(5).unwrap(), t.rank_box(1).unwrap());
        assert!(moved.rank_box(1).is_err());
    }
}
