//! Tessera's executor: running the per-rank programs and pipeline schedules that `parallel`
//! planned, and updating parameters.
//!
//! # Brief overview
//! - [`RankExecutor`]: one rank's buffers (its block of every value of a [`parallel::Program`]);
//!   [`RankExecutor::run`] evaluates the kernel steps with [`graph::eval_op`] and the reshard
//!   steps with a [`reshard_exec::ReshardRunner`] over the world [`comm::Communicator`], optionally
//!   timing them ([`StepProfile`]) and counting the bytes held ([`parallel::memory::MemoryMeter`]).
//! - [`PipelineRunner`]: a pipelined training step, running the action list
//!   `parallel::pipeline::Schedule` gives a rank's stage; [`StepTrace`] is its timeline
//!   ([`chrome_trace`], [`measured_bubble`]).
//! - [`Optimizer`]: SGD, Momentum, Adam, AdamW with MindSpore's update rules and mint AdamW
//!   (PyTorch's), on one rank's parameter shards, so its state is sharded like its parameter.
//! - Around the update: [`Accumulation`] (gradient accumulation's buffers), [`LossScaler`] and
//!   [`MasterWeights`] (mixed precision), [`SharedGradients`] (pipeline shared parameters),
//!   [`parameter_broadcast`], [`gather_reports`] (every rank's memory peaks).
//!
//! # Example
//! One training pass of the seed MLP, data parallel on two ranks (threads of this process):
//! ```
//! use std::sync::Arc;
//!
//! use comm::{Communicator, LocalCluster};
//! use parallel::{compile_training, ParallelConfig, ParallelMode};
//! use tensor::Tensor;
//!
//! let model = graph::models::seed_mlp(4, &[2, 2], 8, 3)?;
//! let config = ParallelConfig::new(ParallelMode::DataParallel, 2);
//! let program = Arc::new(compile_training(&model.graph, model.loss, &config)?);
//! let x = Tensor::from_vec(&[4, 2, 2], (0..16).map(|i| i as f32 / 16.0).collect())?;
//! let labels = Tensor::from_vec(&[4], vec![0i32, 1, 2, 0])?;
//! let losses = LocalCluster::new(2)?.run(|comm| -> Result<f32, exec::ExecError> {
//!     let world: Arc<dyn Communicator> = Arc::new(comm);
//!     let mut exec = exec::RankExecutor::new(program.clone(), world)?;
//!     exec.init_parameters(7)?;
//!     for (i, global) in [&x, &labels].into_iter().enumerate() {
//!         let block = exec.box_of(&program.inputs[i].layout)?;
//!         exec.set_input(i, &global.extract_box(&block)?)?;
//!     }
//!     exec.run()?; // forward, backward, gradients all-reduced
//!     Ok(exec.output(0).as_f32()?[0])
//! });
//! let losses: Vec<f32> = losses.into_iter().map(|r| r.unwrap().unwrap()).collect();
//! assert_eq!(losses[0], losses[1]); // every rank holds the global loss
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Architecture invariant
//! `exec` executes what `parallel` planned and makes no sharding decision of its own. It knows
//! nothing about the training configuration (TOML), datasets, files or checkpoints: `runtime`
//! reads those and hands it programs, tensors and settings.
#![deny(missing_docs)]

mod accumulate;
pub mod allocator;
mod broadcast;
mod bubble;
pub mod clip;
mod error;
mod executor;
mod memory;
mod optimizer;
mod pipeline;
mod precision;
mod profile;
mod progress;
mod recycle;
pub mod ring;
mod shared;
mod update;

pub use crate::accumulate::Accumulation;
pub use crate::broadcast::{parameter_broadcast, stage_first_rank};
pub use crate::bubble::{calibrated_prediction, measured_bubble, step_bubble};
pub use crate::error::ExecError;
pub use crate::executor::{bias_epilogues, bias_grad_fusions, OptimizerPiece, RankExecutor};
pub use crate::memory::{gather_reports, memory_json, memory_lines};
pub use crate::optimizer::{
    applies_weight_decay, state_checkpoint_name, trust_ratio, Optimizer, OptimizerConfig,
    OptimizerKind, ParamSpec, PieceSquares, WeightDecayFilter, STATE_NAMES_OF_EVERY_RULE,
};
pub use crate::pipeline::{
    chrome_trace, MicroBatchReduced, PassTimes, PipelineRunner, SpanKind, StepTrace, TraceSpan,
};
pub use crate::precision::{
    all_finite, any_rank_overflowed, check_some_update, f32_piece, write_piece, LossScale,
    LossScaleState, LossScaler, MasterWeights, Precision, GROWTH_INTERVAL,
};
pub use crate::profile::{StepProfile, Tally};
pub use crate::shared::{sync_pipeline_shared_parameters, SharedGradients};
pub use crate::update::{update_parameters, StepUpdate, UpdateContext};
