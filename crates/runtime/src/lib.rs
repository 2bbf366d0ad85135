//! Tessera's runtime: running per-rank programs, optimizers, datasets, the training loop and
//! its callbacks.
//!
//! # Brief overview
//! - [`RankExecutor`]: one rank's buffers (its block of every value of a [`parallel::Program`]);
//!   [`RankExecutor::run`] evaluates the kernel steps with [`graph::eval_op`] and the reshard
//!   steps with a [`reshard::ReshardRunner`] over the world [`comm::Communicator`].
//! - [`Optimizer`]: SGD, Momentum, Adam, AdamW with MindSpore's update rules and mint AdamW
//!   (PyTorch's), on one rank's parameter shards, so its state is sharded like its parameter;
//!   [`LrSchedule`]: MindSpore's and MindFormers' learning-rate schedules per global step.
//! - [`IdxDataset`] and [`BatchPlan`]: MNIST-format data, global batches that are the same on
//!   every device count; each rank reads only its rows.
//! - [`Callback`]s: [`LossMonitor`] (MindSpore's `epoch: 1 step: 10, loss is …`), [`MetricsLog`]
//!   (JSON lines), [`LocalNorm`] (`print_local_norm` / `dump_local_norm`).
//! - [`TrainConfig`]: the TOML configuration of `tessera train` (see `docs/CONFIG.md`).
//! - [`Session`]: a model, its training and evaluation programs and its data; its rank loop
//!   trains, evaluates, saves per-rank checkpoints and strategy files, and resumes from a
//!   checkpoint saved under any strategy. [`train_local`] runs the ranks as threads,
//!   `train_mpi` (feature `mpi`) as the processes of an `mpirun` job; [`Trainer`] is the
//!   one-call Rust API for a network built with [`graph::GraphBuilder`].
//!
//! # Example
//! ```no_run
//! use runtime::{LaunchOptions, Session, TrainConfig};
//! let config = TrainConfig::load("examples/seed_semi_auto.toml".as_ref(), &[])?;
//! let session = Session::new(&config)?;
//! let report = runtime::train_local(&session, &LaunchOptions::default())?;
//! println!("final loss {:?}", report.losses().last());
//! # Ok::<(), runtime::RuntimeError>(())
//! ```
//!
//! # Architecture invariant
//! The runtime executes what `parallel` planned; it makes no sharding decision of its own.
#![deny(missing_docs)]

mod accumulate;
pub mod allocator;
mod auto;
mod auto_pipeline;
mod broadcast;
mod bubble;
mod callbacks;
mod clip;
mod config;
mod data;
pub mod device_profile;
mod error;
mod executor;
mod generate;
mod group_info;
mod host_memory;
mod hybrid;
mod launch;
pub mod launch_env;
mod lm;
mod lr_schedule;
mod memory;
mod optimizer;
pub mod periodic_ckpt;
mod pipeline;
mod precision;
mod preflight;
mod profile;
mod progress;
mod resume_check;
mod session;
mod shard_fn;
mod shared;
mod trainer;

pub use crate::auto::{build_model, load_profile, plan, plan_model, LoadedLayouts, PlanReport};
pub use crate::auto_pipeline::PipelinePlan;
pub use crate::broadcast::{parameter_broadcast, stage_first_rank};
pub use crate::bubble::{calibrated_prediction, measured_bubble, step_bubble};
pub use crate::callbacks::{
    l2_norm, Callback, CallbackList, EpochInfo, EvalInfo, LocalNorm, LossMonitor, MetricsLog,
    ShardView, StepInfo, TrainEndInfo,
};
pub use crate::clip::MaxGradNorm;
pub use crate::config::{
    DataConfig, DataFormat, ModelConfig, ModelName, OutputConfig, ProfileChoice, PsKeys,
    ResumeFrom, SearchKeys, TrainConfig, TrainLoopConfig, MAX_PS_PROCESSES, PARAMETER_SERVER_MODE,
};
pub use crate::data::{
    Batch, BatchPlan, IdxDataset, Normalize, Split, TokenCorpus, TokenDtype, TokenSplit, Tokenizer,
    MAX_TEXT_BYTES,
};
pub use crate::error::RuntimeError;
pub use crate::executor::{OptimizerPiece, RankExecutor};
pub use crate::generate::{generate, GenerateOptions, SavedModel, Vocabulary, MODEL_FILE};
pub use crate::group_info::{group_info_path, restore_ranks, write_group_info};
pub use crate::host_memory::{host_memory, HostMemory};
pub use crate::hybrid::{run_hybrid, HybridRank};
#[cfg(feature = "mpi")]
pub use crate::launch::train_mpi;
pub use crate::launch::{run_rank, train_local, LaunchOptions, TrainReport};
pub use crate::lm::TextData;
pub use crate::lr_schedule::{LrDecay, LrSchedule, LR_SCHEDULE_NAMES};
pub use crate::memory::{memory_json, memory_lines};
pub use crate::optimizer::{
    applies_weight_decay, state_checkpoint_name, Optimizer, OptimizerConfig, OptimizerKind,
    ParamSpec, WeightDecayFilter,
};
pub use crate::pipeline::{chrome_trace, PassTimes, SpanKind, StepTrace, TraceSpan};
pub use crate::precision::{LossScale, Precision};
pub use crate::preflight::{check_before_start, check_output_file, RanksHere};
pub use crate::profile::{StepProfile, Tally};
pub use crate::session::{
    ParamMemory, ParamShard, RankOutcome, Session, TrainData, GLOBAL_STEP, STAGE_STRATEGY_DIR,
};
pub use crate::shard_fn::{shard, ShardOptions, ShardedCell};
pub use crate::shared::sync_pipeline_shared_parameters;
pub use crate::trainer::Trainer;
