//! A training session: the model, its training and evaluation programs, the data (read through
//! [`Dataset`]), and the loop every rank runs.
//!
//! The session is split by phase of a run:
//! - `build`: the session from a configuration or a network ([`Session::new`],
//!   [`Session::with_model`], [`TrainSession::with_dataset`]) and its programs;
//! - `strategy`: the strategy files describing how the programs place every checkpointed
//!   tensor;
//! - `feed`: an epoch's batches and feeding a micro-batch into an executor;
//! - `run`: [`TrainSession::run_rank`], one rank's run from its start through every epoch to
//!   its end;
//! - `step`: the body of one optimizer step: the one micro-step loop (plain or interleaved
//!   gradient accumulation), pipelined steps, and the parameter update;
//! - `checkpoint`: saving checkpoint sets, and resuming from one;
//! - `elastic`: `train.elastic`'s in-memory snapshots and the recovery from them;
//! - `eval`: evaluation after an epoch or every `train.eval_interval` steps;
//! - `memory`: the memory the ranks will hold, per rank and per pipeline stage's fullest rank,
//!   and a searched plan's peak against `parallel.max_device_memory`;
//! - `warnings`: what the compiled program caps or skips that the configuration's warnings
//!   cannot tell ([`TrainSession::warnings`]).

mod build;
mod checkpoint;
mod elastic;
mod eval;
mod feed;
mod memory;
mod run;
mod step;
mod strategy;
mod warnings;

pub use self::build::RankFootprint;
pub(crate) use self::build::{name_shard_key, parallel_config};
pub use self::memory::human_bytes;

use std::path::PathBuf;
use std::sync::Arc;

use exec::{Optimizer, RankExecutor, StepTrace};
use graph::models::Model;
use layout::{SliceBox, TensorLayout};
use parallel::memory::MemoryReport;
use parallel::Program;
use tensor::Tensor;

use crate::config::TrainConfig;
use crate::data::{Dataset, IdxDataset};
use crate::error::RuntimeError;
use crate::lm::TextData;

/// The name of the step counter stored in every rank's checkpoint (outside the strategy, so
/// conversions copy it as MindSpore copies its `global_step`).
pub const GLOBAL_STEP: &str = "global_step";

/// Everything a rank needs to train any network on any [`Dataset`]: the model, its training
/// and evaluation programs, and the data its batches are read from. Built once, shared by every
/// rank of a local run. [`TrainSession::with_dataset`] builds one for a network and data set of
/// the caller's; [`Session`] is one opened from a configuration's built-in data.
#[derive(Debug)]
pub struct TrainSession {
    /// The configuration.
    pub config: TrainConfig,
    /// The model.
    pub model: Model,
    /// The training program (forward, backward, gradients in the parameters' layouts, the loss
    /// replicated).
    pub train: Arc<Program>,
    /// The evaluation program (forward, the logits replicated); of a session built by
    /// [`Session::for_planning`], the training program (the evaluation one is not compiled).
    pub eval: Arc<Program>,
    /// What the feed and evaluation phases read.
    data: SessionData,
    /// The checkpoint set this process writes (rank 0's process only), opened by
    /// [`TrainSession::open_checkpoint_set`] before the ranks start.
    checkpoint_set: std::sync::Mutex<Option<ckpt::SetWriter>>,
    /// `output.resume_from = "latest"` resolved once, so every rank resumes from the same set.
    latest: std::sync::OnceLock<Option<PathBuf>>,
    /// Deterministic mode's most canonical blocks per summed dim (`None`: off).
    deterministic: Option<usize>,
    /// In a search mode: the plan the programs were placed by, checked against
    /// `parallel.max_device_memory` and saved to `parallel.save_operator_strategy_file` before
    /// the ranks start ([`crate::check_before_start`]), not while the session is built.
    pub(crate) searched: Option<SearchedPlan>,
    /// Built by [`Session::for_planning`]: the evaluation program is not compiled (`eval` is
    /// the training program), and the session cannot train.
    pub(crate) planning_only: bool,
    /// [`TrainSession::predict_memory_per_stage`] once worked out: the build's re-search, the
    /// run's preflight and `tessera plan` each read it.
    per_stage_memory: std::sync::OnceLock<Vec<(usize, parallel::memory::MemoryReport)>>,
}

/// What a search mode's plan leaves for the run to check and write before its ranks start.
#[derive(Debug, Clone)]
pub(crate) struct SearchedPlan {
    /// The strategies were searched (not loaded from `parallel.load_operator_strategy_file`):
    /// the search kept them to its memory budget, by its own estimate.
    pub(crate) searched: bool,
    /// The search's own memory estimate per device of the plan, in bytes.
    pub(crate) estimate: f64,
    /// What `parallel.save_operator_strategy_file` receives.
    pub(crate) records: Vec<ckpt::OpStrategyRecord>,
    /// The plan whole, what `tessera plan` prints ([`TrainSession::searched_plan`]).
    pub(crate) report: search::PlanReport,
}

/// What a session reads its batches from.
#[derive(Debug, Clone)]
enum SessionData {
    /// Samples by index through [`Dataset`] (the IDX images, or a caller's data set): the
    /// training set, and the test set whose accuracy is evaluated (if any).
    Samples {
        /// The training set.
        train: Arc<dyn Dataset>,
        /// The test set.
        test: Option<Arc<dyn Dataset>>,
        /// The graph input each column feeds (column `j` into `columns[j]`).
        columns: Vec<graph::ValueId>,
    },
    /// Text (the GPT): random windows of the training split, the validation loss.
    Text(Arc<TextData>),
}

/// A [`TrainSession`] opened from a configuration's built-in model and data
/// ([`Session::new`]), or a network of the caller's on the configured IDX data
/// ([`Session::with_model`]); it also keeps the data sets it opened. Everything else is the
/// [`TrainSession`]'s, reached through `Deref`.
#[derive(Debug)]
pub struct Session {
    /// The session.
    session: TrainSession,
    /// What it trains and evaluates on.
    pub data: TrainData,
}

impl std::ops::Deref for Session {
    type Target = TrainSession;

    fn deref(&self) -> &TrainSession {
        &self.session
    }
}

impl Session {
    /// The session, without the built-in data sets' handles.
    pub fn into_train_session(self) -> TrainSession {
        self.session
    }
}

/// What a session trains on.
#[derive(Debug, Clone)]
pub enum TrainData {
    /// Images and labels (the seed MLP): the training and test splits.
    Images {
        /// The training split.
        train: Arc<IdxDataset>,
        /// The test split.
        test: Arc<IdxDataset>,
    },
    /// Text (the GPT).
    Text(Arc<TextData>),
}

/// What one rank ends a run with.
#[derive(Debug, Clone, Default)]
pub struct RankOutcome {
    /// The loss of every step run, in order (every rank sees the same value).
    pub losses: Vec<f32>,
    /// The test accuracy after every epoch (when evaluated; images).
    pub accuracies: Vec<f64>,
    /// The validation loss after every epoch (when evaluated; text).
    pub eval_losses: Vec<f64>,
    /// Wall time of each step in milliseconds.
    pub step_ms: Vec<f64>,
    /// This rank's shard of every parameter at the end.
    pub params: Vec<ParamShard>,
    /// The global step reached.
    pub global_step: u64,
    /// With pipeline micro-batches: this rank's timeline of every step.
    pub pipeline: Vec<StepTrace>,
    /// With ring attention, when traced ([`TrainSession::run_rank_traced`]): this rank's ring
    /// passes of every step.
    pub ring_trace: Vec<StepTrace>,
    /// The bytes this rank holds for its trainable parameters at the end.
    pub memory: ParamMemory,
    /// Every rank's peak bytes over the run, by category and by rank (see
    /// [`parallel::memory`]); empty for pipelined runs.
    pub memory_by_rank: Vec<MemoryReport>,
    /// With `parallel.pipeline.output_broadcast`: per step, the loss of each micro-batch as
    /// this rank received it from the last stage (empty without it).
    pub micro_batch_losses: Vec<Vec<f32>>,
    /// This rank's shard of every copy of a parameter shared by pipeline stages
    /// (`embedding.embedding_table@stage1`) at the end; `params` holds only the owners.
    pub shared_copies: Vec<ParamShard>,
    /// With `train.parameter_broadcast`: the parameters this rank took part in broadcasting
    /// from the first rank of their replica group, before its first step.
    pub broadcast: Vec<String>,
    /// The evaluations every `train.eval_interval` steps, in order.
    pub step_evals: Vec<crate::callbacks::EvalInfo>,
    /// Steps whose update was skipped because their gradients overflowed under the loss
    /// scale (`train.loss_scale`, mixed precision); they count in `losses`.
    pub skipped_steps: u64,
    /// Bytes of parameter values this rank filled by their initialisers
    /// ([`RankExecutor::initialised_bytes`]): none that a resume then overwrote under
    /// `train.lazy_init`.
    pub initialised_bytes: usize,
    /// With `train.max_grad_norm`: every step's global gradient norm before clipping, in
    /// order (`None` for a step skipped for overflowing under the loss scale); empty without.
    pub grad_norms: Vec<Option<f64>>,
    /// With mixture-of-experts routing: the token choices every step dropped (chosen, given no
    /// capacity slot), over every rank, MoE layer and micro-batch.
    pub moe_dropped: Vec<f64>,
}

/// The bytes one rank holds for its trainable parameters, by category: what ZeRO's formulas
/// count. Working buffers of a step (a weight gathered for its consumers, a gradient before
/// its data-parallel sum) are not counted: they are the step's, like its activations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParamMemory {
    /// The parameters' own buffers (the slice, or under `hsdp`'s MindSpore levels the piece).
    pub parameters: usize,
    /// The gradients as the optimizer reads them (after their data-parallel sum).
    pub gradients: usize,
    /// The optimizer state.
    pub optimizer: usize,
}

impl ParamMemory {
    /// The sum of the three.
    pub fn total(&self) -> usize {
        self.parameters + self.gradients + self.optimizer
    }

    /// What `exec` and `optimizer` hold for the trainable parameters `trainable` (indices into
    /// the program's parameters, in the optimizer's order).
    fn measure(
        exec: &RankExecutor,
        optimizer: &Optimizer,
        trainable: &[usize],
    ) -> Result<ParamMemory, RuntimeError> {
        let mut memory = ParamMemory::default();
        for (k, &i) in trainable.iter().enumerate() {
            memory.parameters += exec.param(i).as_bytes().len();
            memory.gradients += exec.grad(i).map_or(0, |g| g.as_bytes().len());
            for (_, state) in optimizer.state(k)? {
                memory.optimizer += state.as_bytes().len();
            }
        }
        Ok(memory)
    }
}

/// The checkpoint name of mixed precision's f32 master weight of a parameter, laid out like its
/// optimizer state: `master_weight.<param>`.
pub const MASTER_WEIGHT: &str = "master_weight";

/// Where a pipelined run's per-stage MindSpore strategy files go, inside the run directory.
pub const STAGE_STRATEGY_DIR: &str = "pipeline_stages";

/// One rank's shard of a parameter.
#[derive(Debug, Clone)]
pub struct ParamShard {
    /// The parameter's name.
    pub name: String,
    /// Its layout.
    pub layout: TensorLayout,
    /// The part of the global tensor this shard is.
    pub region: SliceBox,
    /// The values.
    pub values: Tensor,
}

impl TrainSession {
    /// The text the session trains on, when it trains the GPT.
    pub(crate) fn text(&self) -> Option<&TextData> {
        match &self.data {
            SessionData::Text(text) => Some(text),
            SessionData::Samples { .. } => None,
        }
    }

    /// Deterministic mode's most canonical blocks per summed dim, when `train.deterministic`.
    pub fn deterministic_blocks(&self) -> Option<usize> {
        self.deterministic
    }

    /// Number of devices the programs run on.
    pub fn devices(&self) -> usize {
        self.train.devices()
    }
}
