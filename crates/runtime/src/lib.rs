//! Tessera's training application: the configuration, datasets, the training loop and its
//! callbacks, over the executor of the `exec` crate.
//!
//! # Brief overview
//! - The executor, optimizers, mixed precision and pipeline execution live in `exec`;
//!   [`RankExecutor`], [`Optimizer`] and their companions are re-exported here under their old
//!   paths. [`LrSchedule`]: MindSpore's and MindFormers' learning-rate schedules per global
//!   step, which set the optimizer's rate.
//! - [`Dataset`]: what batches are read through — samples by index, each a row of every
//!   column (an input and a label by default, or any number of columns, each fed to the graph
//!   input bound to it: [`TrainSession::with_columns`], [`Trainer::columns`]). [`IdxDataset`] (MNIST-format data) and [`TokenWindows`] (a token split's windows)
//!   implement it, and so can any data set of the caller's. [`BatchPlan`]: global batches that
//!   are the same on every device count; each rank reads only its rows.
//! - [`Callback`]s: [`LossMonitor`] (MindSpore's `epoch: 1 step: 10, loss is …`), [`MetricsLog`]
//!   (JSON lines), [`LocalNorm`] (`print_local_norm` / `dump_local_norm`).
//! - [`TrainConfig`]: the TOML configuration of `tessera train` (see `docs/CONFIG.md`).
//! - [`TrainSession`]: a model, its training and evaluation programs and its data; its rank
//!   loop trains, evaluates, saves per-rank checkpoints and strategy files, and resumes from a
//!   checkpoint saved under any strategy. [`Session`] is one opened from a configuration's
//!   built-in model and data. [`train_local`] runs the ranks as threads ([`train_local_with`]
//!   adds the caller's callbacks), `train_mpi` (feature `mpi`) as the processes of an `mpirun`
//!   job; [`Trainer`] is the one-call Rust API for a network built with
//!   [`graph::GraphBuilder`] on any [`Dataset`], with the caller's callbacks.
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
//! The runtime executes what `parallel` planned; it makes no sharding decision of its own: a
//! search mode's strategies come from `search::plan`, asked with the run's configuration. It
//! runs programs only through `exec`.
#![deny(missing_docs)]

mod auto;
mod callbacks;
mod config;
mod data;
pub mod elastic;
mod error;
mod generate;
mod group_info;
mod hang_watch;
mod host_memory;
mod hybrid;
mod launch;
pub mod launch_env;
mod lm;
mod lr_schedule;
mod paths;
pub mod periodic_ckpt;
mod preflight;
mod resume_check;
mod session;
mod shard_fn;
mod trainer;

pub use crate::auto::{
    build_model, load_profile, load_profile_as, operator_strategy_records, plan, plan_model,
};
pub use crate::callbacks::{
    l2_norm, Callback, CallbackList, EpochInfo, EvalInfo, LocalNorm, LossMonitor, MetricsLog,
    ShardView, StepInfo, TrainEndInfo,
};
pub use crate::config::{
    check_same_config, DataConfig, DataFormat, ModelConfig, ModelName, OutputConfig, ProfileChoice,
    PsKeys, ResumeFrom, SearchKeys, TrainConfig, TrainLoopConfig, MAX_PS_PROCESSES,
    PARAMETER_SERVER_MODE,
};
pub use crate::data::{
    feed_rows, Batch, BatchPlan, Dataset, IdxDataset, Normalize, SampleSpec, Split, TokenCorpus,
    TokenDtype, TokenSplit, TokenWindows, Tokenizer, MAX_TEXT_BYTES,
};
pub use crate::error::RuntimeError;
pub use crate::generate::{generate, GenerateOptions, SavedModel, Vocabulary, MODEL_FILE};
pub use crate::group_info::{group_info_path, restore_ranks, write_group_info};
pub use crate::host_memory::{host_memory, HostMemory};
pub use crate::hybrid::{run_hybrid, HybridRank};
pub use crate::launch::{run_rank, train_local, train_local_with, LaunchOptions, TrainReport};
#[cfg(feature = "mpi")]
pub use crate::launch::{train_mpi, train_mpi_with};
pub use crate::lm::TextData;
pub use crate::lr_schedule::{LrDecay, LrSchedule, LR_SCHEDULE_NAMES};
pub use crate::paths::{check_idx_dir, check_input_path, check_output_path, PathKind};
pub use crate::preflight::{
    check_before_start, check_data_paths, check_output_file, check_parameter_server_output,
    RanksHere,
};
pub use crate::session::human_bytes;
pub use crate::session::{
    ParamMemory, ParamShard, RankFootprint, RankOutcome, Session, TrainData, TrainSession,
    GLOBAL_STEP, STAGE_STRATEGY_DIR,
};
pub use crate::shard_fn::{shard, ShardOptions, ShardedCell};
pub use crate::trainer::{Trainer, Training};
pub use exec::clip::{MaxGradNorm, SquareSum, SQUARE_SUM_BYTES};

// The executor's types, re-exported under their old paths so that users of `runtime` (the CLI,
// the parameter server, the Python package, examples) keep compiling; `exec` owns them.
pub use exec::{
    allocator, applies_weight_decay, calibrated_prediction, chrome_trace, measured_bubble,
    memory_json, memory_lines, parameter_broadcast, stage_first_rank, state_checkpoint_name,
    step_bubble, sync_pipeline_shared_parameters, ExecError, LossScale, Optimizer, OptimizerConfig,
    OptimizerKind, OptimizerPiece, ParamSpec, PassTimes, Precision, RankExecutor, SpanKind,
    StepProfile, StepTrace, Tally, TraceSpan, WeightDecayFilter,
};

// The plan types of `plan` and `plan_model`, from the crate that makes plans.
pub use search::{LoadedLayouts, PipelinePlan, PlanReport};
