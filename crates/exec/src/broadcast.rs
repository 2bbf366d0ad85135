//! MindSpore's `parameter_broadcast(net, layout, cur_rank, initial_rank)`: every parameter
//! shard is copied from the first rank of its replica group (the ranks holding the same box) to
//! the others, so ranks that loaded differing values — different checkpoint files, a file
//! rewritten after a failure — continue from one rank's values.

use std::collections::{BTreeMap, HashMap};

use comm::Communicator;
use layout::TensorLayout;
use parallel::Program;

use crate::error::ExecError;
use crate::executor::RankExecutor;

/// Broadcasts every parameter named in `layouts` (name → its layout, MindSpore's `layout`
/// dict) from the first rank of its replica group under that layout to the group's other
/// ranks, over sub-groups of `world`. `cur_rank` must be this rank and `initial_rank` the first
/// rank of this rank's pipeline stage (0 without stages), as MindSpore requires. Every rank of
/// `world` calls it with the same `layouts`. Returns the names of the parameters this rank
/// took part in broadcasting (those with more than one holder of its box).
pub fn parameter_broadcast(
    exec: &mut RankExecutor,
    world: &dyn Communicator,
    layouts: &BTreeMap<String, TensorLayout>,
    cur_rank: usize,
    initial_rank: usize,
) -> Result<Vec<String>, ExecError> {
    let rank = world.rank();
    if cur_rank != rank {
        return Err(mismatch(
            "cur_rank",
            format!("this rank, {rank}"),
            cur_rank.to_string(),
        ));
    }
    let first = stage_first_rank(exec.program(), rank);
    if initial_rank != first {
        return Err(mismatch(
            "initial_rank",
            format!("the first rank of rank {rank}'s stage, {first}"),
            initial_rank.to_string(),
        ));
    }
    let program = exec.program().clone();
    let mut targets = Vec::with_capacity(layouts.len());
    for (name, layout) in layouts {
        let index = program
            .params
            .iter()
            .position(|p| &p.name == name)
            .ok_or_else(|| {
                mismatch(
                    "layout",
                    "names of the network's parameters".to_string(),
                    format!("\"{name}\", which the network lacks"),
                )
            })?;
        targets.push((index, name, layout));
    }
    let mut groups: HashMap<Vec<usize>, Box<dyn Communicator>> = HashMap::new();
    let mut done = Vec::new();
    for (index, name, layout) in targets {
        let Some(holders) = layout.replica_ranks(rank).filter(|h| h.len() > 1) else {
            continue;
        };
        let shard = exec.param_mut(index);
        let expected = layout.rank_box(rank)?.shape;
        if shard.shape() != expected.as_slice() {
            return Err(mismatch(
                &format!("layout of \"{name}\""),
                format!("this rank's shard shape {:?}", shard.shape()),
                format!("a layout giving it {expected:?}"),
            ));
        }
        if !groups.contains_key(&holders) {
            let group = world.group(&holders)?;
            groups.insert(holders.clone(), group);
        }
        // The first holder is group rank 0.
        groups[&holders].broadcast(shard, 0)?;
        done.push(name.clone());
    }
    Ok(done)
}

/// The first rank of the pipeline stage `rank` trains in `program`: the smallest rank of the
/// meshes of the parameters it holds (0 without stages).
pub fn stage_first_rank(program: &Program, rank: usize) -> usize {
    program
        .params
        .iter()
        .map(|p| p.layout.mesh())
        .filter(|m| m.slot_of_rank(rank).is_some())
        .flat_map(|m| m.device_ranks().into_iter().min())
        .min()
        .unwrap_or(0)
}

fn mismatch(what: &str, expected: String, got: String) -> ExecError {
    ExecError::Mismatch {
        what: format!("parameter_broadcast {what}"),
        expected,
        got,
    }
}
