//! Pipeline parallelism as data: the configuration, the assignment of layers to stages, the
//! schedules (one list of actions per stage) and a simulator that checks them.
//!
//! # Brief overview
//! - [`PipelineConfig`] and [`Scheduler`]: `[parallel.pipeline]` (`stages`, `micro_batches`,
//!   `scheduler`, `interleave`, `virtual_stages`, `output_broadcast`, `stage_config`), checked by
//!   [`PipelineConfig::validate`] before anything is allocated.
//! - [`assign_stages`] splits an ordered list of cells into stages (and model chunks, with virtual
//!   stages) by `stage_config` prefixes or evenly by parameter count; [`stage_ranks`] gives each
//!   stage its ranks in MindSpore's order.
//! - [`Schedule`]: per stage, the ordered list of [`Action`]s (forward, full backward,
//!   backward-input, backward-weight of one micro-batch on one model chunk). The generators
//!   ([`Schedule::gpipe`], [`Schedule::one_f_one_b`], [`Schedule::interleaved_1f1b`],
//!   [`Schedule::zero_bubble_h1`]) only build lists; the sends and receives follow from the
//!   dependencies ([`Schedule::dependencies`]) and [`Schedule::program`] places them in program
//!   order ([`ProgramStep`]), ready for blocking point-to-point execution.
//! - [`simulate`] runs a schedule with per-action durations, each action starting when its
//!   inputs are there; [`simulate_blocking`] runs a program with rendezvous sends and receives in
//!   program order, as the runtime does. Both report deadlock (naming each stage's stuck step) or
//!   a [`SimulationReport`]: makespan, busy time, bubble fraction and peak in-flight activations.
//!   [`check_communication`] matches every send with exactly one receive; [`check_schedule`]
//!   runs every check at once.
//! - [`split_shared_parameters`] gives every stage that reads a shared parameter (a tied
//!   embedding) its own copy; [`SharedParameter`] lists a program's owners and copies, whose
//!   gradients the runtime sums across their stages once per step.
//!
//! # Key design decision
//! A schedule is a list, not code (DESIGN.md rule 7): a new schedule is a new generator plus its
//! simulator check. Communication is never written in a schedule; it is derived from the data
//! dependencies, so a generator cannot forget a send or pair it wrongly. The order of the
//! blocking sends and receives is taken from one global linearization of the dependency-driven
//! simulation, which makes rendezvous execution deadlock-free by construction; the blocking
//! simulator then checks it independently.
//!
//! ```
//! use parallel::pipeline::{check_schedule, Durations, PipelineConfig, Schedule, Scheduler};
//!
//! let config = PipelineConfig::new(2, 8, Scheduler::OneFOneB);
//! config.validate(4).unwrap();
//! let schedule = Schedule::generate(&config).unwrap();
//! let report = check_schedule(&schedule, &Durations::uniform(1.0, 1.0, 1.0)).unwrap();
//! // (P − 1) / (M + P − 1) = 1 / 9
//! assert!((report.dependency.bubble_fraction - 1.0 / 9.0).abs() < 1e-12);
//! ```

mod buffers;
mod config;
mod error;
mod phases;
mod place;
mod schedule;
mod shared;
mod simulate;
mod stages;

pub use buffers::{
    frees_micro_batch, micro_batch_buffers, micro_batches_held, step_reads, step_writes,
    MicroBatchBuffers,
};
pub use config::{
    PipelineConfig, Scheduler, DEFAULT_VIRTUAL_STAGES, MAX_MICRO_BATCHES, MAX_STAGES,
    MAX_TOTAL_PASSES, MAX_VIRTUAL_STAGES,
};
pub use error::{PipelineError, StuckStage};
pub use phases::{stage_of_mesh, stage_of_ranks, step_phases, StepPhase};
pub use place::{
    layer_of, layers_of_stage, move_between_stages, node_stages, relocate, relocate_dist,
    staged_layer_of, NodeStages,
};
pub use schedule::{
    Action, ActionKind, CommEvent, CommOrder, Dependency, Direction, Payload, ProgramStep, Schedule,
};
pub use shared::{
    is_shared_copy, shared_copy_of, shared_parameters, split_shared_parameters, SharedParameter,
    SHARED_COPY_MARK,
};
pub use simulate::{
    check_communication, check_schedule, simulate, simulate_blocking, CheckReport, Durations,
    SimulationReport, TimedStep,
};
pub use stages::{assign_stages, stage_of_rank, stage_ranks, Layer, StageAssignment};
