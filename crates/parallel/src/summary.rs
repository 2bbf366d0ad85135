//! A program as data: the figures, parameters and steps `tessera train --explain` prints, for
//! `--explain --json` and the Python package's `tessera.plan`, so every caller reads one
//! projection of a [`Program`] instead of walking it.

use crate::explain::describe_plan;
use crate::lower::{Program, ProgramParam, Step};

/// A [`Program`] as data ([`Program::summary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramSummary {
    /// The parallel mode's name (`semi_auto`, `data_parallel`, …).
    pub mode: &'static str,
    /// Number of devices.
    pub devices: usize,
    /// Bytes every step moves over the network ([`Program::bytes_per_step`]).
    pub bytes_per_step: usize,
    /// Reshard steps among [`ProgramSummary::steps`].
    pub reshards: usize,
    /// Every parameter, in program order.
    pub params: Vec<ParamSummary>,
    /// Every step, in order.
    pub steps: Vec<StepSummary>,
}

/// A parameter as `--explain` shows it: in the layout its consumers need
/// ([`ProgramParam::strategy_layout`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSummary {
    /// Its name.
    pub name: String,
    /// Its global shape.
    pub shape: Vec<usize>,
    /// Its layout's map, as [`layout::Layout::describe_map`] writes it.
    pub layout: String,
    /// The mesh it is laid out on, as its `Display` writes it.
    pub mesh: String,
    /// The shape of one rank's slice.
    pub slice_shape: Vec<usize>,
    /// How many ranks hold each slice.
    pub replicas: usize,
    /// Whether the optimizer updates it.
    pub trainable: bool,
    /// Whether `hsdp` shards its optimizer state.
    pub optimizer_sharded: bool,
}

/// A step of the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepSummary {
    /// A kernel.
    Kernel {
        /// The node's name.
        name: String,
    },
    /// An inserted communication.
    Reshard {
        /// The value moved.
        value: String,
        /// Its collectives ([`describe_plan`]).
        communication: String,
        /// Bytes it moves per step.
        bytes: usize,
        /// Why the move is needed.
        reason: String,
    },
}

impl ParamSummary {
    fn of(p: &ProgramParam) -> ParamSummary {
        let layout = p.strategy_layout();
        ParamSummary {
            name: p.name.clone(),
            shape: layout.shape().to_vec(),
            layout: layout.layout().describe_map(),
            mesh: layout.mesh().to_string(),
            slice_shape: layout.slice_shape().to_vec(),
            replicas: layout.replica_count(),
            trainable: p.trainable,
            optimizer_sharded: p.optimizer_shard().is_some(),
        }
    }
}

impl Program {
    /// The program as data: its figures, every parameter and every step.
    pub fn summary(&self) -> ProgramSummary {
        let values = self.placed.graph.values();
        let steps = self
            .steps
            .iter()
            .map(|step| match step {
                Step::Kernel(k) => StepSummary::Kernel {
                    name: k.name.clone(),
                },
                Step::Reshard(r) => StepSummary::Reshard {
                    value: values[r.value.0].name.clone(),
                    communication: describe_plan(&r.plan),
                    bytes: r.plan.bytes_total(),
                    reason: r.reason.clone(),
                },
            })
            .collect();
        ProgramSummary {
            mode: self.placed.config.mode.name(),
            devices: self.devices(),
            bytes_per_step: self.bytes_per_step(),
            reshards: self.reshard_count(),
            params: self.params.iter().map(ParamSummary::of).collect(),
            steps,
        }
    }

    /// The number of reshard steps.
    pub fn reshard_count(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Reshard(_)))
            .count()
    }
}
