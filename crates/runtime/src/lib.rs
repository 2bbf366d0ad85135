//! Tessera's runtime: running per-rank programs, optimizers, datasets, the training loop and
//! its callbacks.
//!
//! # Architecture invariant
//! The runtime executes what `parallel` planned; it makes no sharding decision of its own.
#![deny(missing_docs)]

mod callbacks;
mod config;
mod data;
mod error;
mod executor;
mod launch;
mod optimizer;
mod session;
mod trainer;

pub use crate::callbacks::{
    l2_norm, Callback, CallbackList, EpochInfo, LocalNorm, LossMonitor, MetricsLog, ShardView,
    StepInfo, TrainEndInfo,
};
pub use crate::config::{
    DataConfig, DataFormat, ModelConfig, ModelName, OutputConfig, TrainConfig, TrainLoopConfig,
};
pub use crate::data::{Batch, BatchPlan, IdxDataset, Normalize, Split};
pub use crate::error::RuntimeError;
pub use crate::executor::RankExecutor;
#[cfg(feature = "mpi")]
pub use crate::launch::train_mpi;
pub use crate::launch::{run_rank, train_local, LaunchOptions, TrainReport};
pub use crate::optimizer::{
    applies_weight_decay, state_checkpoint_name, Optimizer, OptimizerConfig, OptimizerKind,
    ParamSpec,
};
pub use crate::session::{ParamShard, RankOutcome, Session, GLOBAL_STEP};
pub use crate::trainer::Trainer;
