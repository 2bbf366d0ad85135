//! What a pipelined step keeps per micro-batch: the buffers each micro-batch in flight has its
//! own copy of, those summed over the micro-batches, and how many micro-batches a stage holds
//! at once under a schedule. The runtime runs by these; the memory model predicts from them.

use std::collections::BTreeSet;

use crate::lower::{Program, Step};
use crate::pipeline::phases::{step_phases, StepPhase};
use crate::pipeline::schedule::{Action, ActionKind};

/// The buffers of a pipelined step, by role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicroBatchBuffers {
    /// Buffers a micro-batch writes (and the fed inputs): each micro-batch in flight has its
    /// own, ascending.
    pub local: Vec<usize>,
    /// Of `local`, those summed over the micro-batches (gradients before their reduction, the
    /// loss) and divided by their count before the epilogue, ascending.
    pub summed: Vec<usize>,
}

/// The buffers step `i` reads.
pub fn step_reads(program: &Program, i: usize) -> Vec<usize> {
    match &program.steps[i] {
        Step::Kernel(k) => k.inputs.clone(),
        Step::Reshard(r) => vec![r.from],
    }
}

/// The buffers step `i` writes.
pub fn step_writes(program: &Program, i: usize) -> Vec<usize> {
    match &program.steps[i] {
        Step::Kernel(k) => k.outputs.clone(),
        Step::Reshard(r) => vec![r.to],
    }
}

/// The micro-batch buffers of `program` split into stages of `per_stage` ranks.
pub fn micro_batch_buffers(program: &Program, per_stage: usize) -> MicroBatchBuffers {
    let phases = step_phases(program, per_stage);
    let mut local: Vec<usize> = program.inputs.iter().map(|i| i.buffer).collect();
    let mut epilogue_sources = Vec::new();
    for (i, phase) in phases.iter().enumerate() {
        match phase {
            StepPhase::Prologue => {}
            StepPhase::Epilogue => {
                if let Step::Reshard(r) = &program.steps[i] {
                    epilogue_sources.push(r.from);
                }
            }
            StepPhase::Stage { .. } | StepPhase::Transfer { .. } => {
                local.extend(step_writes(program, i))
            }
        }
    }
    local.sort_unstable();
    local.dedup();
    let mut summed: Vec<usize> = epilogue_sources
        .into_iter()
        .chain(program.params.iter().filter_map(|p| p.grad_buffer))
        .chain(program.outputs.iter().map(|o| o.buffer))
        .filter(|b| local.binary_search(b).is_ok())
        .collect();
    summed.sort_unstable();
    summed.dedup();
    MicroBatchBuffers { local, summed }
}

/// Whether `action` is a micro-batch's last on its stage, after which its buffers are freed:
/// chunk 0's backward (whole, or its weight half).
pub fn frees_micro_batch(action: &Action) -> bool {
    action.chunk == 0
        && matches!(
            action.kind,
            ActionKind::Backward | ActionKind::BackwardWeight
        )
}

/// The most micro-batches a stage running `actions` in order holds at once: each from its
/// first action to the one that [frees it](frees_micro_batch).
pub fn micro_batches_held(actions: &[Action]) -> usize {
    let mut held = BTreeSet::new();
    let mut peak = 0;
    for a in actions {
        held.insert(a.micro_batch);
        peak = peak.max(held.len());
        if frees_micro_batch(a) {
            held.remove(&a.micro_batch);
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{PipelineConfig, Schedule, Scheduler};

    /// GPipe holds every micro-batch; 1F1B holds P − s on stage s.
    #[test]
    fn held_micro_batches_follow_the_schedule() {
        let held = |scheduler| {
            let schedule = Schedule::generate(&PipelineConfig::new(4, 8, scheduler)).unwrap();
            schedule
                .per_stage()
                .iter()
                .map(|a| micro_batches_held(a))
                .collect::<Vec<_>>()
        };
        assert_eq!(held(Scheduler::GPipe), vec![8, 8, 8, 8]);
        assert_eq!(held(Scheduler::OneFOneB), vec![4, 3, 2, 1]);
    }
}
