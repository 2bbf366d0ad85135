//! Which forward values a training program recomputes (`[parallel.recompute]`).
//!
//! - A **cell glob** (`blocks.*`) matches a cell: the shortest dotted prefix of an op's name it
//!   matches (`blocks.3` for `blocks.3.attn.qkv.matmul`). Every value an op of a matched cell
//!   produces is recomputed, except the cell's outputs — values a forward op outside the cell
//!   reads (or the graph's outputs) — which are kept: they are the next cell's checkpoint, as
//!   in MindSpore's `cell.recompute()` and PyTorch's activation checkpointing.
//! - An **op glob** matches an op by node name (`blocks.*.attn.softmax`) or by kind
//!   (`Softmax`): each of its outputs is recomputed.
//!
//! The lowering ([`crate::lower`]) then gives the backward pass its own copies of those values:
//! each is computed again, from kept values, just before its first backward use.

use std::collections::HashMap;

use graph::{Graph, NodeId, NodeRole, ValueId};
use layout::TensorLayout;

use crate::assign::PlacedGraph;
use crate::config::{OptimizerLevel, RecomputeConfig};
use crate::error::ParallelError;
use crate::hsdp::ShardDecision;
use crate::lower::{local_op, KernelStep, Lowering, Step};
use crate::patterns::glob_matches;

/// Which pass a backward copy serves: the backward ops, or (for a weight gathered again under
/// `parallel_optimizer_comm_recompute`) the recomputed ops alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Pass {
    Backward,
    Recompute,
}

/// The backward pass's own copies of forward values, made while lowering: recomputed values,
/// weights gathered again under `hsdp` level 3 (ZeRO-3 gathers for the forward and again for
/// the backward pass, so no whole weight lives between them), and the communication feeding
/// recomputed ops (a sharded weight's gather only with `parallel_optimizer_comm_recompute`).
#[derive(Debug, Default)]
pub(crate) struct BackwardCopies {
    config: RecomputeConfig,
    /// By value id: recomputed under `[parallel.recompute]`.
    recomputed: Vec<bool>,
    /// By value id: a weight that `hsdp` keeps in pieces (MindSpore's levels), gathered before
    /// use.
    sharded_weight: Vec<bool>,
    /// By value id: a weight gathered again for the backward pass (`hsdp` level 3).
    regathered: Vec<bool>,
    /// Copies made for the backward pass, by value and pass: buffers, in order made.
    copies: HashMap<(ValueId, Pass), Vec<usize>>,
    /// The output buffers of each recomputed node.
    recomputed_nodes: HashMap<NodeId, Vec<usize>>,
}

impl BackwardCopies {
    /// What `placed` rematerialises in its backward pass.
    pub(crate) fn new(placed: &PlacedGraph) -> Result<BackwardCopies, ParallelError> {
        let graph = &placed.graph;
        let config = placed.config.recompute.clone().unwrap_or_default();
        let recomputed = recomputed_values(graph, &config)?;
        let levels: Vec<Option<OptimizerLevel>> = placed
            .optimizer_shards
            .iter()
            .map(|s| s.as_ref().and_then(ShardDecision::shard).map(|s| s.level))
            .collect();
        let by_level = |f: fn(OptimizerLevel) -> bool| -> Vec<bool> {
            levels.iter().map(|l| l.is_some_and(f)).collect()
        };
        Ok(BackwardCopies {
            config,
            recomputed,
            sharded_weight: by_level(OptimizerLevel::shards_weights),
            regathered: by_level(OptimizerLevel::regathers_for_backward),
            ..BackwardCopies::default()
        })
    }

    /// Whether a backward op reads `v` from the backward pass's own copies.
    pub(crate) fn rematerialised(&self, v: ValueId) -> bool {
        self.recomputed.get(v.0).copied().unwrap_or(false)
            || self.regathered.get(v.0).copied().unwrap_or(false)
    }
}

/// Whether the two layouts' meshes hold the same ranks (one pipeline stage).
fn same_ranks(a: &TensorLayout, b: &TensorLayout) -> bool {
    let ranks = |l: &TensorLayout| {
        let mut r = l.mesh().rank_list().to_vec();
        r.sort_unstable();
        r
    };
    ranks(a) == ranks(b)
}

impl Lowering<'_> {
    /// The first of `buffers` holding its value whole (no pending sum) in `need`.
    fn find_copy(&self, buffers: &[usize], need: &TensorLayout) -> Option<usize> {
        buffers.iter().copied().find(|&b| {
            let l = &self.buffers[b].layout;
            !l.is_partial() && l.layout().same_placement(need)
        })
    }

    /// A buffer holding `v` in `need` for a backward op (`for_recompute`: for a recomputed
    /// op): a copy the backward pass already made; else `v` recomputed (or, for a level-3
    /// weight and for the inputs of recomputed ops, taken from where it was produced) and
    /// resharded into `need` by the backward pass itself. Communication results of the forward
    /// pass are kept instead where `mp_comm_recompute` is off, and always across pipeline
    /// stages (a stage never asks an earlier one to send again during its backward pass).
    pub(crate) fn need_backward(
        &mut self,
        v: ValueId,
        need: &TensorLayout,
        for_recompute: bool,
        reason: impl FnOnce() -> String,
    ) -> Result<usize, ParallelError> {
        let bw = &self.backward;
        let (recomputed, sharded_weight, regathered) = (
            bw.recomputed[v.0],
            bw.sharded_weight[v.0],
            bw.regathered[v.0],
        );
        // A recomputed op communicates again what feeds it: a sharded weight's gather as
        // `parallel_optimizer_comm_recompute` says, other communication as `mp_comm_recompute`.
        let comm_recompute = match sharded_weight {
            true => bw.config.parallel_optimizer_comm_recompute,
            false => bw.config.mp_comm_recompute,
        };
        let pass = if for_recompute && sharded_weight && bw.config.parallel_optimizer_comm_recompute
        {
            Pass::Recompute
        } else {
            Pass::Backward
        };
        if let Some(b) = bw
            .copies
            .get(&(v, pass))
            .and_then(|c| self.find_copy(c, need))
        {
            return Ok(b);
        }
        let origin = *self.versions[&v]
            .first()
            .expect("a value is produced before it is used");
        let origin_layout = self.buffers[origin].layout.layout().clone();
        let keep_forward = !same_ranks(&origin_layout, need)
            || !(regathered || recomputed || (for_recompute && comm_recompute))
            || (recomputed
                && !bw.config.mp_comm_recompute
                && self.find_copy(&self.versions[&v][1..], need).is_some());
        if keep_forward {
            return self.need(v, need, reason);
        }
        let base = if recomputed {
            self.recompute(v)?
        } else {
            origin
        };
        if let Some(b) = self.find_copy(&[base], need) {
            return Ok(b);
        }
        let why = if regathered {
            "hsdp level3: gathered again for the backward pass"
        } else if sharded_weight {
            "hsdp: gathered again for a recomputed op (parallel_optimizer_comm_recompute)"
        } else if recomputed {
            "recomputed"
        } else {
            "communicated again for a recomputed op (mp_comm_recompute)"
        };
        let reason = format!("{} ({why})", reason());
        let to = self.push_reshard(v, base, need, Some("backward"), reason)?;
        self.backward.copies.entry((v, pass)).or_default().push(to);
        Ok(to)
    }

    /// The buffer of recomputed value `v`, computing its producer again (once per step) from
    /// kept values and other recomputed ones.
    fn recompute(&mut self, v: ValueId) -> Result<usize, ParallelError> {
        let placed = self.placed;
        let (node_id, j) = placed.graph.values()[v.0]
            .producer
            .expect("recomputed values have a producer");
        if let Some(outs) = self.backward.recomputed_nodes.get(&node_id) {
            return Ok(outs[j]);
        }
        let node = &placed.graph.nodes()[node_id.0];
        let place = &placed.nodes[node_id.0];
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for (i, (&u, need)) in node.inputs.iter().zip(&place.inputs).enumerate() {
            inputs.push(self.need_backward(u, need, true, || {
                format!(
                    "recomputing {} needs input {i} ({}) as {}",
                    node.name,
                    placed.graph.values()[u.0].name,
                    need.layout().describe_map()
                )
            })?);
        }
        let outputs: Vec<usize> = node
            .outputs
            .iter()
            .zip(&place.outputs)
            .map(|(&o, layout)| self.add_buffer(o, layout.clone(), "recompute"))
            .collect();
        let local_out = self.buffers[outputs[0]].shape.clone();
        self.steps.push(Step::Kernel(KernelStep {
            node: node_id,
            name: node.name.clone(),
            op: local_op(&node.op, &local_out),
            inputs,
            outputs: outputs.clone(),
            recompute: true,
        }));
        self.backward
            .recomputed_nodes
            .insert(node_id, outputs.clone());
        Ok(outputs[j])
    }
}

/// The cell of `name` that one of `cells` matches: its shortest dotted prefix a glob matches.
fn matched_cell<'a>(cells: &[String], name: &'a str) -> Option<&'a str> {
    name.char_indices()
        .filter(|&(_, c)| c == '.')
        .map(|(i, _)| &name[..i])
        .find(|prefix| cells.iter().any(|g| glob_matches(g, prefix)))
}

/// Whether node name `name` lies inside cell `cell`.
fn inside(cell: &str, name: &str) -> bool {
    name.strip_prefix(cell)
        .is_some_and(|rest| rest.starts_with('.'))
}

/// For every value of `graph` (by id), whether the backward pass recomputes it under `config`.
/// A glob that matches no forward op is an error naming it: a typo would silently recompute
/// nothing.
pub fn recomputed_values(
    graph: &Graph,
    config: &RecomputeConfig,
) -> Result<Vec<bool>, ParallelError> {
    let mut recomputed = vec![false; graph.values().len()];
    let forward = || graph.nodes().iter().filter(|n| n.role == NodeRole::Forward);
    let op_matches = |pattern: &str, node: &graph::Node| {
        glob_matches(pattern, &node.name) || node.op.answers_to(pattern)
    };
    for (setting, globs) in [
        ("recompute.cells", &config.cells),
        ("recompute.ops", &config.ops),
    ] {
        let cells = setting == "recompute.cells";
        for glob in globs {
            let hit = forward().any(|n| match cells {
                true => matched_cell(std::slice::from_ref(glob), &n.name).is_some(),
                false => op_matches(glob, n),
            });
            if !hit {
                return Err(ParallelError::Setting {
                    setting,
                    reason: format!(
                        "\"{glob}\" matches no {} of the model",
                        if cells {
                            "cell"
                        } else {
                            "op (by name or kind)"
                        }
                    ),
                });
            }
        }
    }
    let outputs = graph.outputs();
    for node in forward() {
        let by_op = config.ops.iter().any(|g| op_matches(g, node));
        let cell = matched_cell(&config.cells, &node.name);
        for &v in &node.outputs {
            let kept_as_checkpoint = |cell: &str| {
                outputs.contains(&v)
                    || graph.consumers(v).iter().any(|u| {
                        let consumer = &graph.nodes()[u.node.0];
                        consumer.role == NodeRole::Forward && !inside(cell, &consumer.name)
                    })
            };
            recomputed[v.0] = by_op || cell.is_some_and(|c| !kept_as_checkpoint(c));
        }
    }
    Ok(recomputed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_the_shortest_prefix_a_glob_matches() {
        let cells = vec!["blocks.*".to_string()];
        assert_eq!(
            matched_cell(&cells, "blocks.3.attn.qkv.matmul"),
            Some("blocks.3")
        );
        assert_eq!(matched_cell(&cells, "head.matmul"), None);
        assert!(inside("blocks.3", "blocks.3.attn"));
        assert!(!inside("blocks.3", "blocks.30.attn"));
    }
}
