//! Parameters shared across pipeline stages (the GPT's tied embedding table and LM head): every
//! stage that reads one holds its own copy (`parallel::pipeline::split_shared_parameters`).
//!
//! - [`SharedGradients`] sums the copies' gradients once per step, after the micro-batches'
//!   accumulation and the data-parallel reductions, before the optimizer update: an all-reduce
//!   over the ranks that hold slot `j` of each copy (every copy is laid out alike, moved onto
//!   its stage). Same initial values, same summed gradient, same update: the copies stay
//!   identical, bit for bit.
//! - [`sync_pipeline_shared_parameters`] (MindSpore's name) broadcasts every shared parameter
//!   from its owner (the first stage holding it) to its copies, for inference after the copies
//!   were set apart (a checkpoint loaded into one stage, values edited by hand).

use std::collections::HashMap;

use comm::{Communicator, ReduceOp};
use parallel::pipeline::SharedParameter;
use parallel::Program;

use crate::accumulate::Accumulation;
use crate::error::ExecError;
use crate::executor::RankExecutor;

/// The ranks holding slot `j` of each of `shared`'s parameters, owner first, where `j` is
/// `rank`'s slot in the one of them it holds (`None` when it holds none of them).
fn slot_group(
    program: &Program,
    shared: &SharedParameter,
    rank: usize,
) -> Result<Option<(usize, Vec<usize>)>, ExecError> {
    let layouts: Vec<_> = shared
        .params
        .iter()
        .map(|&i| &program.params[i].layout)
        .collect();
    let Some((mine, slot)) = layouts
        .iter()
        .enumerate()
        .find_map(|(k, l)| l.mesh().slot_of_rank(rank).map(|s| (k, s)))
    else {
        return Ok(None);
    };
    let mut group = Vec::with_capacity(layouts.len());
    for l in &layouts {
        let same_box = l.slot_box(slot) == layouts[mine].slot_box(slot);
        match l.mesh().rank_list().get(slot) {
            Some(&r) if same_box && l.mesh().n_slots() == layouts[mine].mesh().n_slots() => {
                group.push(r)
            }
            _ => {
                return Err(ExecError::Mismatch {
                    what: format!(
                        "the copies of the shared parameter {} (stages {:?})",
                        shared.name, shared.stages
                    ),
                    expected: "every copy laid out as its owner, moved onto its stage".to_string(),
                    got: format!("{} and {}", layouts[mine], l),
                })
            }
        }
    }
    Ok(Some((shared.params[mine], group)))
}

/// The sub-groups of one rank for summing and syncing shared parameters, created on first use
/// (in the program's order of shared parameters on every rank, so creation never races).
#[derive(Default)]
pub struct SharedGradients {
    groups: HashMap<Vec<usize>, Box<dyn Communicator>>,
}

impl SharedGradients {
    /// Adds up, over the stages holding them, the gradients of every shared parameter's copies
    /// this rank holds: in `accumulated` (by position in `trainable`) when the step
    /// accumulated micro-batches, else in the executor's gradient buffers.
    pub fn sum(
        &mut self,
        exec: &mut RankExecutor,
        mut accumulated: Option<&mut Accumulation>,
        trainable: &[usize],
        world: &dyn Communicator,
    ) -> Result<(), ExecError> {
        let program = exec.program().clone();
        for shared in &program.shared {
            let Some((index, ranks)) = slot_group(&program, shared, world.rank())? else {
                continue;
            };
            let group = self.group(world, ranks)?;
            let grad = match (
                accumulated.as_deref_mut(),
                trainable.iter().position(|&t| t == index),
            ) {
                (Some(acc), Some(k)) => Some(acc.buffer_mut(k)),
                (None, Some(_)) => exec.grad_mut(index),
                (_, None) => None,
            };
            let Some(grad) = grad else {
                return Err(ExecError::Mismatch {
                    what: format!("the gradient of {}", program.params[index].name),
                    expected: "a gradient on every stage holding a copy".to_string(),
                    got: "none".to_string(),
                });
            };
            match crate::precision::half_sum(&program.placed.config, true)
                .rounds_every_addition(grad.dtype())
            {
                true => group.all_reduce_in_element_type(grad, ReduceOp::Sum)?,
                false => group.all_reduce(grad, ReduceOp::Sum)?,
            }
        }
        Ok(())
    }

    fn group(
        &mut self,
        world: &dyn Communicator,
        ranks: Vec<usize>,
    ) -> Result<&dyn Communicator, ExecError> {
        if !self.groups.contains_key(&ranks) {
            let group = world.group(&ranks)?;
            self.groups.insert(ranks.clone(), group);
        }
        Ok(self.groups[&ranks].as_ref())
    }
}

/// MindSpore's `sync_pipeline_shared_parameters`: copies every parameter shared by several
/// pipeline stages from the stage that owns it (the first one reading it) into every other
/// stage's copy, slot by slot over sub-groups of `world`. Every rank of `world` calls it.
/// Returns the names of the shared parameters this rank took part in syncing; nothing happens
/// (an empty list) when the executor's program has no shared parameters.
pub fn sync_pipeline_shared_parameters(
    exec: &mut RankExecutor,
    world: &dyn Communicator,
) -> Result<Vec<String>, ExecError> {
    exec.materialize_parameters()?;
    let program = exec.program().clone();
    let mut groups = SharedGradients::default();
    let mut synced = Vec::new();
    for shared in &program.shared {
        let Some((index, ranks)) = slot_group(&program, shared, world.rank())? else {
            continue;
        };
        let group = groups.group(world, ranks)?;
        // The owner is group rank 0.
        group.broadcast(exec.param_mut(index), 0)?;
        synced.push(shared.name.clone());
    }
    Ok(synced)
}
