//! One rank's view of a program: its kernels on local shapes and, for every reshard, whom it
//! sends to and receives from.

use std::fmt;

use crate::explain::describe_reduce;
use crate::lower::{Program, Step};

/// What one rank does in one step of a [`Program`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankStep {
    /// A kernel on this rank's blocks.
    Kernel {
        /// The node's name.
        name: String,
        /// The op's kind.
        kind: &'static str,
        /// Local shapes of the inputs.
        inputs: Vec<Vec<usize>>,
        /// Local shapes of the outputs.
        outputs: Vec<Vec<usize>>,
    },
    /// This rank's part of a reshard.
    Reshard {
        /// The value moved.
        value: String,
        /// `all-reduce` or `reduce-scatter` with the group's ranks, when the value is a pending
        /// sum.
        reduce: Option<(String, Vec<usize>)>,
        /// Bytes sent to each peer.
        sends: Vec<(usize, usize)>,
        /// Bytes received from each peer.
        receives: Vec<(usize, usize)>,
        /// Bytes copied within this rank.
        local: usize,
    },
}

/// The program as one rank runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankProgram {
    /// The rank.
    pub rank: usize,
    /// Its steps, in order.
    pub steps: Vec<RankStep>,
}

impl Program {
    /// The program as `rank` runs it: every kernel with this rank's local shapes, and for every
    /// reshard the peers this rank exchanges bytes with.
    pub fn for_rank(&self, rank: usize) -> RankProgram {
        let graph = &self.placed.graph;
        let steps = self
            .steps
            .iter()
            .map(|step| match step {
                Step::Kernel(k) => RankStep::Kernel {
                    name: k.name.clone(),
                    kind: k.op.kind(),
                    inputs: k
                        .inputs
                        .iter()
                        .map(|&b| self.buffers[b].shape.clone())
                        .collect(),
                    outputs: k
                        .outputs
                        .iter()
                        .map(|&b| self.buffers[b].shape.clone())
                        .collect(),
                },
                Step::Reshard(r) => {
                    let plan = &r.plan;
                    let mesh = plan.src().layout().mesh();
                    let reduce = plan.reduce().and_then(|step| {
                        step.slot_groups
                            .iter()
                            .map(|g| {
                                g.iter()
                                    .map(|&s| mesh.device_of_slot(s))
                                    .collect::<Vec<_>>()
                            })
                            .find(|ranks| ranks.contains(&rank))
                            .map(|ranks| (describe_reduce(step), ranks))
                    });
                    let mut sends: Vec<(usize, usize)> = Vec::new();
                    let mut receives: Vec<(usize, usize)> = Vec::new();
                    let mut local = 0;
                    for t in plan.transfers() {
                        let bytes = plan.transfer_bytes(&t);
                        if t.is_local() {
                            if t.dst_rank == rank {
                                local += bytes;
                            }
                        } else if t.src_rank == rank {
                            add(&mut sends, t.dst_rank, bytes);
                        } else if t.dst_rank == rank {
                            add(&mut receives, t.src_rank, bytes);
                        }
                    }
                    RankStep::Reshard {
                        value: graph.values()[r.value.0].name.clone(),
                        reduce,
                        sends,
                        receives,
                        local,
                    }
                }
            })
            .collect();
        RankProgram { rank, steps }
    }
}

fn add(list: &mut Vec<(usize, usize)>, peer: usize, bytes: usize) {
    match list.iter_mut().find(|(p, _)| *p == peer) {
        Some((_, total)) => *total += bytes,
        None => list.push((peer, bytes)),
    }
}

impl fmt::Display for RankProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rank {}:", self.rank)?;
        for step in &self.steps {
            match step {
                RankStep::Kernel {
                    name,
                    kind,
                    inputs,
                    outputs,
                } => writeln!(f, "  {name} ({kind}) {inputs:?} -> {outputs:?}")?,
                RankStep::Reshard {
                    value,
                    reduce,
                    sends,
                    receives,
                    local,
                } => {
                    write!(f, "    reshard {value}:")?;
                    if let Some((kind, ranks)) = reduce {
                        write!(f, " {kind} with ranks {ranks:?};")?;
                    }
                    let list = |v: &[(usize, usize)]| {
                        v.iter()
                            .map(|(p, b)| format!("{p} ({b} B)"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    if !sends.is_empty() {
                        write!(f, " send to {};", list(sends))?;
                    }
                    if !receives.is_empty() {
                        write!(f, " receive from {};", list(receives))?;
                    }
                    writeln!(f, " local copy {local} B")?;
                }
            }
        }
        Ok(())
    }
}
