//! Tessera's parallel pass: per-op sharding rules, strategies, and lowering of a training graph
//! to the program every rank runs.
//!
//! # Brief overview
//! - [`ParallelConfig`]: the mode (`stand_alone`, `data_parallel`, `semi_auto`), the device
//!   count, per-op strategies (MindSpore's `shard(in_strategy, out_strategy)`, as split tuples
//!   or as `Layout`s on a named device matrix), the dataset strategy, `gradients_mean` and `loss_repeated_mean`.
//! - [`rules`]: for every op, MindSpore's rule from strategy tuples to the op's device matrix and
//!   input layouts, and the rule from input layouts to output layouts with pending sums.
//! - [`place`]: gives every node of a graph its placement ([`PlacedGraph`]); backward nodes run on
//!   the device matrix of the forward node they differentiate.
//! - [`lower`]: one [`Program`] every rank runs — kernel steps on local shapes and reshard steps
//!   (with their reasons and bytes) where a layout changes or a pending sum is consumed;
//!   [`Program::explain`] prints it and [`Program::summary`] gives it as data
//!   ([`ProgramSummary`], for `--explain --json` and Python). [`compile_training`] and
//!   [`compile_forward`] do all of it from a forward graph.
//! - [`hsdp`]: optimizer parallelism (`[parallel.hsdp]`, MindSpore's levels 1–3 and ZeRO-1/2):
//!   which parameters are cut along dim 0 over their replica group; the lowering then gathers,
//!   reduce-scatters and lists the post-update weight gathers ([`WeightGather`]).
//! - `recompute`: `[parallel.recompute]` — which forward values the backward pass computes
//!   again, and the backward pass's own copies (recomputed values, level-3 weights gathered
//!   again) the lowering makes.
//! - [`fusion`]: `[parallel.comm_fusion]` — the gradient reductions grouped into buckets, each
//!   run as one collective as soon as its last gradient is computed.
//! - [`memory`]: when each buffer of a program lives, and the bytes a rank holds by category
//!   (parameters, gradients, optimizer state, activations, communication), predicted before a
//!   run.
//! - [`pipeline`]: pipeline parallelism as data — the `[parallel.pipeline]` configuration, the
//!   assignment of cells to stages, schedules as per-stage action lists (GPipe, 1F1B,
//!   interleaved 1F1B, zero-bubble) and the simulator that proves them deadlock-free.
//!
//! # Architecture invariant
//! `parallel` plans; it never executes a kernel or talks to a communicator. Its output is data:
//! placements, reshard plans and programs that the runtime executes and `tessera train
//! --explain` prints.
#![deny(missing_docs)]

mod assign;
mod compile;
mod config;
mod deterministic;
mod error;
mod explain;
pub mod fusion;
mod given_layouts;
pub mod hsdp;
mod lower;
pub mod memory;
mod patterns;
pub mod pipeline;
mod rank_view;
mod recompute;
pub mod ring;
pub mod rules;
mod summary;

pub use crate::assign::{
    check_dataset_strategy, gradient_target, is_annotatable, place, NodePlacement, PlacedGraph,
    StrategySource,
};
pub use crate::compile::{compile_forward, compile_training};
pub use crate::config::{
    DatasetStrategy, HsdpConfig, OpStrategy, OptimizerLevel, ParallelConfig, ParallelMode,
    RecomputeConfig, SearchMode,
};
pub use crate::deterministic::{check_deterministic, check_deterministic_strategy};
pub use crate::error::{format_strategy, ParallelError};
pub use crate::explain::{describe_plan, describe_plan_with};
pub use crate::hsdp::{OptimizerShard, ShardDecision};
pub use crate::lower::{
    lower, BufferSpec, KernelStep, LowerRequest, PlanReuse, Program, ProgramInput, ProgramOutput,
    ProgramParam, ReshardStep, Step, WeightGather,
};
pub use crate::patterns::{glob_matches, resolve_op_patterns};
pub use crate::rank_view::{RankProgram, RankStep};
pub use crate::summary::{ParamSummary, ProgramSummary, StepSummary};
