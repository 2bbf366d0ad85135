//! The steps of a pipelined program sorted into the parts of a training step: what each stage
//! runs in a micro-batch's forward and backward pass, what crosses between stages, and what runs
//! once per step around the micro-batches.

use std::collections::HashMap;

use graph::NodeRole;
use layout::Mesh;

use crate::lower::{Program, Step};

/// Where one step of a program runs in a pipelined training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepPhase {
    /// Once per step, before the micro-batches, on every rank (constants on the whole mesh).
    Prologue,
    /// In every micro-batch's forward (`backward == false`) or backward pass of `stage`.
    Stage {
        /// The stage.
        stage: usize,
        /// The stage's model chunk (0 without virtual stages).
        chunk: usize,
        /// Whether it belongs to the backward pass.
        backward: bool,
    },
    /// A micro-batch's value sent from stage `from` to stage `to`: the sender runs it in its
    /// pass, the receiver in its own.
    Transfer {
        /// The sending stage.
        from: usize,
        /// The sending stage's model chunk.
        from_chunk: usize,
        /// The receiving stage.
        to: usize,
        /// The receiving stage's model chunk.
        to_chunk: usize,
        /// Whether both stages run it in their backward passes: it carries a gradient (or
        /// another value made in a backward pass). `false`: a value made in a forward pass, sent
        /// and received in the forward passes, also when only a backward pass reads it.
        backward: bool,
    },
    /// Once per step after every micro-batch: the reductions of the gradients (summed over the
    /// micro-batches) into the parameters' layouts, and the outputs gathered to every rank.
    Epilogue,
}

/// The pipeline stage `mesh`'s ranks belong to: its first rank over its size (stage `s` holds
/// ranks `s·n .. (s + 1)·n`; 0 for a mesh over every device).
pub fn stage_of_ranks(mesh: &Mesh) -> usize {
    mesh.rank_list().first().copied().unwrap_or(0) / mesh.n_slots().max(1)
}

/// The stage whose ranks `mesh` covers (`per_stage` ranks from `stage · per_stage`), or `None`
/// for a mesh over every device.
pub fn stage_of_mesh(mesh: &Mesh, per_stage: usize) -> Option<usize> {
    let ranks = mesh.rank_list();
    let first = *ranks.first()?;
    (mesh.n_slots() == per_stage && ranks.iter().all(|&r| r / per_stage == first / per_stage))
        .then_some(first / per_stage)
}

/// The phase of every step of `program`, whose stages hold `per_stage` ranks each.
pub fn step_phases(program: &Program, per_stage: usize) -> Vec<StepPhase> {
    let graph = &program.placed.graph;
    let stages = program
        .placed
        .config
        .pipeline
        .as_ref()
        .and_then(|p| super::node_stages(graph, p).ok());
    let node_chunk = |n: usize| stages.as_ref().map_or(0, |s| s.node_chunks[n]);
    let value_chunk = |v: usize| stages.as_ref().map_or(0, |s| s.value_chunks[v]);
    let grad_buffers: Vec<usize> = program
        .params
        .iter()
        .filter_map(|p| p.grad_buffer)
        .collect();
    let mut phases = vec![StepPhase::Epilogue; program.steps.len()];
    // Kernels first: their stage and pass.
    for (i, step) in program.steps.iter().enumerate() {
        if let Step::Kernel(k) = step {
            let mesh = program.buffers[k.outputs[0]].layout.layout().mesh();
            phases[i] = match stage_of_mesh(mesh, per_stage) {
                Some(stage) => StepPhase::Stage {
                    stage,
                    chunk: node_chunk(k.node.0),
                    backward: k.recompute || graph.nodes()[k.node.0].role != NodeRole::Forward,
                },
                None => StepPhase::Prologue,
            };
        }
    }
    // A reshard belongs to the pass of the first kernel that reads what it writes. A value
    // crossing stages is sent in the pass that made it: an activation a later stage's backward
    // pass reads (deterministic mode's whole input of a LayerNorm gradient under sequence
    // parallelism) travels in the forward passes, as the activations do. Sent in the sender's
    // backward pass instead, it could wait on a receiver whose backward runs first (interleaved
    // chunks: a later chunk's backward waiting for an earlier chunk's, a cycle).
    let mut written_in: HashMap<usize, StepPhase> = HashMap::new();
    for (i, step) in program.steps.iter().enumerate() {
        let r = match step {
            Step::Kernel(k) => {
                for &b in &k.outputs {
                    written_in.insert(b, phases[i]);
                }
                continue;
            }
            Step::Reshard(r) => r,
        };
        let made_forward = matches!(
            written_in.get(&r.from),
            Some(StepPhase::Stage {
                backward: false,
                ..
            }) | Some(StepPhase::Transfer {
                backward: false,
                ..
            })
        );
        let consumer = program.steps[i + 1..]
            .iter()
            .zip(&phases[i + 1..])
            .find(|(s, _)| matches!(s, Step::Kernel(k) if k.inputs.contains(&r.to)))
            .map(|(_, p)| *p);
        let from = stage_of_mesh(r.plan.src().layout().mesh(), per_stage);
        let to = stage_of_mesh(r.plan.dst().mesh(), per_stage);
        phases[i] = match (consumer, from, to) {
            _ if grad_buffers.contains(&r.to) => StepPhase::Epilogue,
            (
                Some(StepPhase::Stage {
                    stage,
                    chunk,
                    backward,
                }),
                Some(from),
                Some(to),
            ) if from != to => {
                debug_assert_eq!(stage, to);
                StepPhase::Transfer {
                    from,
                    from_chunk: value_chunk(r.value.0),
                    to,
                    to_chunk: chunk,
                    backward: backward && !made_forward,
                }
            }
            (Some(phase @ StepPhase::Stage { .. }), _, _) => phase,
            (Some(StepPhase::Prologue), _, _) => StepPhase::Prologue,
            _ => StepPhase::Epilogue,
        };
        written_in.insert(r.to, phases[i]);
    }
    phases
}
