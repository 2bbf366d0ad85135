//! A training session: the model, its training and evaluation programs, the data, and the loop
//! every rank runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ckpt::{OpStrategyRecord, ParamLayout, ResolvedParam, ResolvedStrategy, StrategyFlavour};
use comm::Communicator;
use exec::{
    parameter_broadcast, state_checkpoint_name, Accumulation, LossScaler, MasterWeights, Optimizer,
    ParamSpec, PipelineRunner, Precision, RankExecutor, StepTrace,
};
use graph::models::{seed_mlp, Model};
use layout::{SliceBox, TensorLayout};
use parallel::memory::{MemoryCategory, MemoryReport, TrainingState};
use parallel::{check_deterministic, compile_forward, compile_training, ParallelConfig, Program};
use tensor::Tensor;

use crate::callbacks::EvalInfo;
use crate::callbacks::{Callback, EpochInfo, ShardView, StepInfo, TrainEndInfo};
use crate::config::ResumeFrom;
use crate::config::{ModelName, TrainConfig};
use crate::data::{BatchPlan, IdxDataset};
use crate::error::RuntimeError;
use crate::generate::MODEL_FILE;
use crate::lm::{gpt_parallel_config, TextData};
use crate::periodic_ckpt::{periodic_set_dir, LossScaleState, SaveSchedule, TrainState};

/// The name of the step counter stored in every rank's checkpoint (outside the strategy, so
/// conversions copy it as MindSpore copies its `global_step`).
pub const GLOBAL_STEP: &str = "global_step";

/// Everything a rank needs to train: built once, shared by every rank of a local run.
#[derive(Debug)]
pub struct Session {
    /// The configuration.
    pub config: TrainConfig,
    /// The model.
    pub model: Model,
    /// The training program (forward, backward, gradients in the parameters' layouts, the loss
    /// replicated).
    pub train: Arc<Program>,
    /// The evaluation program (forward, the logits replicated).
    pub eval: Arc<Program>,
    /// What it trains and evaluates on.
    pub data: TrainData,
    /// The checkpoint set this process writes (rank 0's process only), opened by
    /// [`Session::open_checkpoint_set`] before the ranks start.
    checkpoint_set: std::sync::Mutex<Option<ckpt::SetWriter>>,
    /// `output.resume_from = "latest"` resolved once, so every rank resumes from the same set.
    latest: std::sync::OnceLock<Option<PathBuf>>,
    /// Deterministic mode's most canonical blocks per summed dim (`None`: off).
    deterministic: Option<usize>,
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

/// The batches of one epoch, one per optimizer step (each of `train.grad_accumulation_steps`
/// micro-batches).
enum EpochPlan {
    /// A shuffled pass over the images, in batches of every micro-batch of a step.
    Images(BatchPlan),
    /// `steps` batches of random windows.
    Text {
        /// Steps in the epoch.
        steps: u64,
    },
}

impl EpochPlan {
    fn len(&self) -> u64 {
        match self {
            EpochPlan::Images(plan) => plan.len() as u64,
            EpochPlan::Text { steps } => *steps,
        }
    }
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

/// What a rank saves at the end of a run.
struct SavedState<'a> {
    exec: &'a RankExecutor,
    optimizer: &'a Optimizer,
    /// Mixed precision's f32 master pieces, saved beside the half-precision weights.
    master: Option<&'a MasterWeights>,
    trainable: &'a [usize],
    global_step: u64,
    /// The loss scaler, continued by a resume.
    scaler: Option<&'a LossScaler>,
}

/// What a resume restores besides the parameters and optimizer state: the global step, the
/// mixed-precision master pieces and the loss scaler's state.
type Resumed = (u64, Vec<Option<Tensor>>, Option<LossScaleState>);

/// Which checkpoint set a save writes.
#[derive(Debug, Clone, Copy)]
enum SetTarget<'p> {
    /// The run's set in `output.dir`, opened before the ranks start.
    Final,
    /// A periodic set at this directory (`output.save_checkpoint_steps` / `_seconds`).
    Periodic(&'p Path),
}

/// The checkpoint name of mixed precision's f32 master weight of a parameter, laid out like its
/// optimizer state: `master_weight.<param>`.
pub const MASTER_WEIGHT: &str = "master_weight";

/// Where a pipelined run's per-stage MindSpore strategy files go, inside the run directory.
pub const STAGE_STRATEGY_DIR: &str = "pipeline_stages";

/// `<id>\n<staging path>` as bytes.
fn encode_staging(staging: &Path, id: &str) -> Vec<u8> {
    let mut out = id.as_bytes().to_vec();
    out.push(b'\n');
    out.extend_from_slice(std::os::unix::ffi::OsStrExt::as_bytes(staging.as_os_str()));
    out
}

fn decode_staging(bytes: &[u8]) -> Option<(PathBuf, String)> {
    use std::os::unix::ffi::OsStrExt;
    let cut = bytes.iter().position(|&b| b == b'\n')?;
    let id = std::str::from_utf8(&bytes[..cut]).ok()?;
    // The path may be any bytes (Unix paths need not be UTF-8).
    let path = std::ffi::OsStr::from_bytes(&bytes[cut + 1..]);
    Some((PathBuf::from(path), id.to_string()))
}

/// Broadcasts `bytes` from rank 0 to every rank (its length first).
fn share_bytes(world: &dyn Communicator, bytes: &mut Vec<u8>) -> Result<(), RuntimeError> {
    let mut len = (bytes.len() as u64).to_le_bytes();
    world.broadcast_bytes(&mut len, 0)?;
    let len = u64::from_le_bytes(len);
    if len > 1 << 20 {
        return Err(RuntimeError::CheckpointSet {
            rank: world.rank(),
            reason: format!("a {len}-byte staging path is not plausible"),
        });
    }
    bytes.resize(len as usize, 0);
    world.broadcast_bytes(bytes, 0)?;
    Ok(())
}

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

/// A global batch larger than the training set is refused before anything batch-sized is
/// built or allocated.
fn check_batch_fits(config: &TrainConfig, train_data: &IdxDataset) -> Result<(), RuntimeError> {
    let batch_size = config.data().batch_size;
    if batch_size > train_data.len() {
        return Err(RuntimeError::Config {
            key: "data.batch_size".to_string(),
            reason: format!(
                "{batch_size} is larger than the training set ({} samples in {}); the global batch must fit in the data",
                train_data.len(),
                train_data.images_path().display()
            ),
        });
    }
    let micro_steps = config.train().grad_accumulation_steps;
    if batch_size.saturating_mul(micro_steps) > train_data.len() {
        return Err(RuntimeError::Config {
            key: "train.grad_accumulation_steps".to_string(),
            reason: format!(
                "{micro_steps} micro-batches of data.batch_size = {batch_size} take more samples per step than the training set holds ({} in {}); an optimizer step's samples must fit in the data",
                train_data.len(),
                train_data.images_path().display()
            ),
        });
    }
    Ok(())
}

impl Session {
    /// Builds the configured built-in model and its programs for `config`, reading the data's
    /// headers (for text, the whole text; token files are indexed).
    pub fn new(config: &TrainConfig) -> Result<Session, RuntimeError> {
        if config.model().name == ModelName::Gpt {
            return Session::new_gpt(config);
        }
        if config.model().name == ModelName::EmbeddingBag {
            return Err(RuntimeError::Config {
                key: "model.name".to_string(),
                reason: "\"embedding_bag\" trains in parallel.mode = \"parameter_server\" only \
                         (the ps crate builds its programs)"
                    .to_string(),
            });
        }
        if config.train().precision != Precision::F32 {
            return Err(RuntimeError::Config {
                key: "train.precision".to_string(),
                reason: "mixed precision is built for the GPT (model.name = \"gpt\"); the seed \
                         MLP trains in f32"
                    .to_string(),
            });
        }
        let data = config.data();
        let (train_data, test_data) =
            IdxDataset::open_train_and_test(&data.dir, data.pixel_max, data.normalize)?;
        check_batch_fits(config, &train_data)?;
        let model = seed_mlp(
            data.batch_size,
            &train_data.image_shape(),
            config.model().hidden,
            config.model().classes,
        )?;
        Session::build(config, model, train_data, test_data)
    }

    /// A session training `model` (a network built with [`graph::GraphBuilder`], its data and
    /// labels inputs, logits and loss) under `config`; the model's data input must take the
    /// data set's images (`[batch, rows, cols]`) and its batch must be `data.batch_size`.
    pub fn with_model(config: &TrainConfig, model: Model) -> Result<Session, RuntimeError> {
        let data = config.data();
        let (train_data, test_data) =
            IdxDataset::open_train_and_test(&data.dir, data.pixel_max, data.normalize)?;
        check_batch_fits(config, &train_data)?;
        let input = &model.graph.values()[model.input.0];
        let mut expected = vec![data.batch_size];
        expected.extend(train_data.image_shape());
        if input.shape != expected {
            return Err(RuntimeError::Mismatch {
                what: format!("the model's data input {}", input.name),
                expected: format!("shape {expected:?} (data.batch_size and the images)"),
                got: format!("shape {:?}", input.shape),
            });
        }
        Session::build(config, model, train_data, test_data)
    }

    fn build(
        config: &TrainConfig,
        model: Model,
        train_data: IdxDataset,
        test_data: IdxDataset,
    ) -> Result<Session, RuntimeError> {
        let classes = config.model().classes;
        train_data.validate_labels(classes)?;
        test_data.validate_labels(classes)?;
        let mut parallel = parallel_config(config, &model)?;
        crate::auto::apply_search(config, &model, None, &mut parallel)?;
        let train = compile_training(&model.graph, model.loss, &parallel)?;
        let eval = compile_forward(&model.graph, &[model.logits], &parallel)?;
        let data = TrainData::Images {
            train: Arc::new(train_data),
            test: Arc::new(test_data),
        };
        Session::assemble(config, &parallel, model, train, eval, data)
    }

    /// The GPT of `[model]` on the text of `[data]`, with its cells' strategies.
    fn new_gpt(config: &TrainConfig) -> Result<Session, RuntimeError> {
        let (text, gpt, model) = crate::auto::open_gpt(config)?;
        let mut parallel = parallel_config(config, &model)?;
        crate::auto::apply_search(config, &model, Some(&gpt), &mut parallel)?;
        let parallel = gpt_parallel_config(config, &gpt, &model, parallel)?;
        let train = compile_training(&model.graph, model.loss, &parallel)?;
        let eval = compile_forward(&model.graph, &[model.loss], &parallel)?;
        let data = TrainData::Text(Arc::new(text));
        Session::assemble(config, &parallel, model, train, eval, data)
    }

    fn assemble(
        config: &TrainConfig,
        parallel: &ParallelConfig,
        model: Model,
        train: Program,
        eval: Program,
        data: TrainData,
    ) -> Result<Session, RuntimeError> {
        let deterministic = config
            .train()
            .deterministic
            .then_some(parallel.deterministic_blocks);
        if deterministic.is_some()
            && config.train().precision.has_master_weights()
            && train.devices() > 1
        {
            // Half-precision partial sums are rounded to the half type where a rank's part
            // ends, which one device never does: only one device's runs are bitwise.
            return Err(RuntimeError::Config {
                key: "train.precision".to_string(),
                reason: format!(
                    "train.deterministic = true with a half precision is bitwise on one device only (each rank's partial sums round to the half type); this run has {} devices: use train.precision = \"f32\" or one device",
                    train.devices()
                ),
            });
        }
        if let Some(blocks) = deterministic {
            // Refused before any rank starts: a sum whose split the canonical blocks can't serve.
            check_deterministic(&train, blocks)?;
            check_deterministic(&eval, blocks)?;
        }
        Ok(Session {
            config: config.clone(),
            model,
            train: Arc::new(train),
            eval: Arc::new(eval),
            data,
            checkpoint_set: std::sync::Mutex::new(None),
            latest: std::sync::OnceLock::new(),
            deterministic,
        })
    }

    /// Deterministic mode's most canonical blocks per summed dim, when `train.deterministic`.
    pub fn deterministic_blocks(&self) -> Option<usize> {
        self.deterministic
    }

    /// Micro-batches per optimizer step (`train.grad_accumulation_steps`).
    fn micro_steps(&self) -> usize {
        self.config.train().grad_accumulation_steps.max(1)
    }

    /// Samples an optimizer step trains on: every micro-batch of `data.batch_size`.
    fn step_batch_size(&self) -> usize {
        self.config
            .data()
            .batch_size
            .saturating_mul(self.micro_steps())
    }

    /// Optimizer steps in every epoch.
    /// The global step this run ends at: `train.epochs` epochs, or `train.max_steps` if fewer.
    pub(crate) fn planned_steps(&self) -> u64 {
        let train = self.config.train();
        let epochs = self.batches_per_epoch().saturating_mul(train.epochs as u64);
        train.max_steps.map_or(epochs, |m| m.min(epochs))
    }

    /// Optimizer steps per epoch.
    pub(crate) fn steps_per_epoch(&self) -> u64 {
        self.batches_per_epoch()
    }

    fn batches_per_epoch(&self) -> u64 {
        match &self.data {
            TrainData::Images { train, .. } => (train.len() / self.step_batch_size()).max(1) as u64,
            TrainData::Text(text) => text.steps_per_epoch,
        }
    }

    /// The batches of `epoch`, one per optimizer step: the images in batches of
    /// `micro_steps · batch_size`, the order a run with that batch size would have, so
    /// micro-batch `j` of a step is rows `j · batch_size ..` of that run's batch.
    fn epoch_plan(&self, epoch: usize) -> Result<EpochPlan, RuntimeError> {
        Ok(match &self.data {
            TrainData::Images { train, .. } => EpochPlan::Images(BatchPlan::train(
                train.len(),
                self.step_batch_size(),
                self.config.data().shuffle,
                self.config.train().seed,
                epoch as u64,
            )?),
            TrainData::Text(text) => EpochPlan::Text {
                steps: text.steps_per_epoch,
            },
        })
    }

    /// Feeds micro-batch `micro` of batch `index` of `plan` (of `epoch`) into `exec`: rows
    /// `micro · batch_size .. (micro + 1) · batch_size` of the step's batch.
    fn feed_step(
        &self,
        exec: &mut RankExecutor,
        plan: &EpochPlan,
        epoch: usize,
        index: u64,
        micro: usize,
    ) -> Result<(), RuntimeError> {
        match (&self.data, plan) {
            (TrainData::Images { train, .. }, EpochPlan::Images(plan)) => {
                let batch = plan
                    .batch(index as usize)
                    .ok_or_else(|| RuntimeError::Mismatch {
                        what: format!("batch {index} of epoch {epoch}"),
                        expected: format!("below {}", plan.len()),
                        got: index.to_string(),
                    })?;
                let batch_size = self.config.data().batch_size;
                let rows = batch.rows(micro * batch_size, batch_size)?;
                let micro_batch = crate::data::Batch {
                    index: batch.index,
                    indices: rows,
                    n_real: rows.len(),
                };
                self.feed(exec, train, &micro_batch)
            }
            (TrainData::Text(text), _) => {
                let seed = self.config.train().seed;
                let starts = text.train_starts(seed, epoch as u64, index, micro)?;
                text.feed(exec, &self.model, &text.corpus.train, &starts)
            }
            (TrainData::Images { .. }, EpochPlan::Text { .. }) => Err(RuntimeError::Mismatch {
                what: "the epoch's batches".to_string(),
                expected: "image batches".to_string(),
                got: "text steps".to_string(),
            }),
        }
    }

    /// Number of devices the programs run on.
    pub fn devices(&self) -> usize {
        self.train.devices()
    }

    /// Opens the checkpoint set of the run, when it saves one: takes the output directory's
    /// lock (a second run into the same directory fails here, naming this one) and creates the
    /// staging directory beside it, so an unwritable output fails before any rank starts. The
    /// process that runs rank 0 calls this; [`Session::run_rank`] opens it late otherwise.
    pub fn open_checkpoint_set(&self) -> Result<(), RuntimeError> {
        let Some(dir) = self.checkpoint_dir() else {
            return Ok(());
        };
        let mut slot = self.set_slot();
        if slot.is_none() {
            *slot = Some(ckpt::SetWriter::begin(dir, "train", true)?);
        }
        Ok(())
    }

    fn set_slot(&self) -> std::sync::MutexGuard<'_, Option<ckpt::SetWriter>> {
        self.checkpoint_set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Where checkpoints and strategy files go, when saving is on.
    fn checkpoint_dir(&self) -> Option<&Path> {
        let out = self.config.output();
        out.save_checkpoint.then_some(out.dir.as_path())
    }

    /// Whether checkpoints (and the strategy file describing them) hold parameter `p`: every
    /// trainable parameter, and the non-trainable ones when
    /// `parallel.strategy_file_only_for_trainable_params` is false (MindSpore's
    /// `stra_file_only_trainable_params`: its strategy file lists trainable parameters only
    /// unless told otherwise). A tensor the strategy file does not describe cannot be converted
    /// or resumed, so the rank files hold exactly what the strategy file lists.
    /// A shared parameter's copies on later pipeline stages are never checkpointed: its owner
    /// is, and a resume loads the owner's tensor into every copy.
    fn checkpointed(&self, p: &parallel::ProgramParam) -> bool {
        (p.trainable || !self.config.strategy_file_only_for_trainable_params())
            && parallel::pipeline::shared_copy_of(&p.name).is_none()
    }

    /// The strategy of everything a checkpoint holds: the checkpointed parameters (every
    /// trainable one; the others only with `strategy_file_only_for_trainable_params = false`)
    /// and every optimizer state (laid out like its parameter), with global shapes and dtypes.
    pub fn strategy(&self) -> Result<ResolvedStrategy, RuntimeError> {
        let states = self.config.optimizer_config().kind.state_names();
        let mut params = Vec::new();
        for p in self.train.params.iter().filter(|p| self.checkpointed(p)) {
            let dtype = self.train.buffers[p.buffer].dtype;
            // A pipeline stage's parameters live on its ranks, `stage · n ..`.
            let stage = parallel::pipeline::stage_of_ranks(p.layout.mesh());
            let bind = |mp: &TensorLayout, opt_shard: usize| {
                ParamLayout::new(stage, mp.clone(), opt_shard).map_err(|e| RuntimeError::Mismatch {
                    what: format!("layout of {}", p.name),
                    expected: "a valid layout".to_string(),
                    got: e.to_string(),
                })
            };
            // hsdp: the optimizer state is held in optimizer-shard pieces at every level, the
            // weights at MindSpore's levels (zero1 and zero2 keep them whole on every rank).
            let (weights, state) = match p.optimizer_shard() {
                Some(shard) => {
                    let sharded = bind(&shard.strategy_layout, shard.size)?;
                    let weights = if shard.level.shards_weights() {
                        sharded.clone()
                    } else {
                        bind(&p.layout, 1)?
                    };
                    (weights, sharded)
                }
                None => {
                    let whole = bind(&p.layout, 1)?;
                    (whole.clone(), whole)
                }
            };
            // Under mixed precision the optimizer state is f32 (beside f32 master weights).
            let state_dtype = match self.config.train().precision.has_master_weights() {
                true => tensor::DType::F32,
                false => dtype,
            };
            let mut entries = vec![(p.name.clone(), weights, dtype)];
            if p.trainable {
                let master = self.config.train().precision.has_master_weights();
                let names = states.iter().chain(master.then_some(&MASTER_WEIGHT));
                entries.extend(names.map(|s| {
                    (
                        state_checkpoint_name(s, &p.name),
                        state.clone(),
                        state_dtype,
                    )
                }));
            }
            for (name, placement, dtype) in entries {
                params.push(ResolvedParam {
                    name,
                    shape: p.layout.shape().to_vec(),
                    dtype: Some(dtype),
                    placements: vec![placement],
                });
            }
        }
        Ok(ResolvedStrategy::new(params)?)
    }

    /// Writes the strategy as Tessera JSON (`strategy.json`: every tensor's global shape, dtype
    /// and layout) and MindSpore protobuf (`strategy.ckpt`: the parameter layouts) into `dir`,
    /// each with every forward op's strategy, as MindSpore's `save_param_strategy_file` does
    /// (only the JSON has room for output strategies).
    pub fn save_strategy_files(&self, dir: &Path) -> Result<(PathBuf, PathBuf), RuntimeError> {
        let strategy = self.strategy()?;
        let ops = self.op_strategies();
        let save = |name: &str, flavour| {
            ckpt::save_param_strategy_file(&dir.join(name), &strategy, &ops, flavour, true)
        };
        let json = save("strategy.json", StrategyFlavour::Tessera)?;
        let ms = save("strategy.ckpt", StrategyFlavour::MsProtobuf)?;
        if strategy.n_stages() > 1 {
            self.save_stage_strategy_files(&dir.join(STAGE_STRATEGY_DIR), &strategy, &ops)?;
        }
        Ok((json, ms))
    }

    /// With pipeline stages, also one MindSpore strategy file per stage, as each stage's ranks
    /// save it in MindSpore (`<dir>/stage_<s>.ckpt`, plain names): `tessera strategy
    /// merge-stages` (MindSpore's `merge_pipeline_strategys`) turns them into the merged file.
    fn save_stage_strategy_files(
        &self,
        dir: &Path,
        strategy: &ResolvedStrategy,
        ops: &[OpStrategyRecord],
    ) -> Result<(), RuntimeError> {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::Mismatch {
            what: format!("the directory {}", dir.display()),
            expected: "a directory for the per-stage strategy files".to_string(),
            got: e.to_string(),
        })?;
        for stage in 0..strategy.n_stages() {
            let params: Vec<ResolvedParam> = strategy
                .params()
                .iter()
                .filter(|p| p.placements.iter().any(|pl| pl.stage == stage))
                .cloned()
                .collect();
            let stage_ops: Vec<OpStrategyRecord> =
                ops.iter().filter(|o| o.stage == stage).cloned().collect();
            ckpt::save_param_strategy_file(
                &dir.join(format!("stage_{stage}.ckpt")),
                &ResolvedStrategy::new(params)?,
                &stage_ops,
                StrategyFlavour::MsProtobuf,
                true,
            )?;
        }
        Ok(())
    }

    /// Every forward op's strategy, in graph order: its input tuples and, when its outputs
    /// are brought to a set layout (an `out_strategy`), their split factors.
    pub fn op_strategies(&self) -> Vec<OpStrategyRecord> {
        let placed = &self.train.placed;
        placed
            .graph
            .nodes()
            .iter()
            .zip(&placed.nodes)
            .filter_map(|(node, place)| match (&node.role, &place.strategy) {
                (graph::NodeRole::Forward, Some(inputs)) => Some(OpStrategyRecord {
                    name: node.name.clone(),
                    stage: place
                        .inputs
                        .first()
                        .map_or(0, |l| parallel::pipeline::stage_of_ranks(l.mesh())),
                    inputs: inputs.clone(),
                    outputs: place
                        .out_layouts
                        .as_ref()
                        .map(|outs| outs.iter().map(|l| l.split_factors()).collect()),
                    in_layouts: None,
                    out_layouts: None,
                }),
                _ => None,
            })
            .collect()
    }

    /// Feeds this rank's block of `batch` of `data` into `exec`'s inputs.
    fn feed(
        &self,
        exec: &mut RankExecutor,
        data: &IdxDataset,
        batch: &crate::data::Batch<'_>,
    ) -> Result<(), RuntimeError> {
        let program = exec.program().clone();
        for (i, input) in program.inputs.iter().enumerate() {
            if !exec.holds(&input.layout) {
                continue;
            }
            let region = exec.box_of(&input.layout)?;
            let (start, len) = match (region.offset.first(), region.shape.first()) {
                (Some(&s), Some(&l)) => (s, l),
                _ => (0, batch.indices.len()),
            };
            let rows = batch.rows(start, len)?;
            let block = if input.value == self.model.labels {
                data.read_labels(rows)?
            } else {
                data.read_images(rows)?
            };
            exec.set_input_rows(i, block)?;
        }
        Ok(())
    }

    /// Runs the whole schedule on this rank of `world`. `callbacks` see every step, epoch and the
    /// end; `want_shards` makes the loop hand them the parameter and gradient shards.
    pub fn run_rank(
        &self,
        world: Arc<dyn Communicator>,
        callbacks: &mut dyn Callback,
        want_shards: bool,
    ) -> Result<RankOutcome, RuntimeError> {
        let rank = world.rank();
        let mut exec = match self.config.train().lazy_init {
            true => RankExecutor::with_lazy_parameters(self.train.clone(), world.clone())?,
            false => RankExecutor::new(self.train.clone(), world.clone())?,
        };
        let mut eval = RankExecutor::new(self.eval.clone(), world.clone())?;
        let deterministic = self.deterministic_blocks();
        exec.set_deterministic(deterministic);
        eval.set_deterministic(deterministic);
        exec.init_parameters(self.config.train().seed)?;
        let trainable: Vec<usize> = (0..self.train.params.len())
            .filter(|&i| {
                self.train.params[i].trainable
                    && self.train.params[i].grad_buffer.is_some()
                    && exec.holds_param(i)
            })
            .collect();
        let precision = self.config.train().precision;
        let specs: Vec<ParamSpec> = trainable
            .iter()
            .map(|&i| ParamSpec {
                name: self.train.params[i].name.clone(),
                // This rank's optimizer piece: the whole shard, or its hsdp piece; its state in
                // f32 under mixed precision (beside f32 master weights).
                shape: exec.optimizer_piece(i).shape.clone(),
                dtype: match precision.has_master_weights() {
                    true => tensor::DType::F32,
                    false => exec.param_dtype(i),
                },
            })
            .collect();
        let mut optimizer = Optimizer::new(self.config.optimizer_config(), &specs)?;
        optimizer.set_weight_decay_filter(self.config.weight_decay_filter());
        // With `train.grad_accumulation_steps` > 1, the mean gradient of a step's micro-batches.
        let accumulation_sharded = self.accumulation_sharded();
        let mut accumulated = (self.micro_steps() > 1)
            .then(|| Accumulation::new(&exec, &trainable, accumulation_sharded));
        let optimizer_bytes: usize = (0..trainable.len())
            .map(|k| optimizer.state(k))
            .collect::<Result<Vec<_>, _>>()?
            .iter()
            .flatten()
            .map(|(_, t)| t.as_bytes().len())
            .sum();
        exec.memory()
            .hold(MemoryCategory::Optimizer, optimizer_bytes);
        if let Some(acc) = &accumulated {
            exec.memory().hold(MemoryCategory::Gradients, acc.bytes());
        }
        let pipelined = self.pipeline_runner(rank)?;
        if pipelined.is_some() {
            exec.allocate_all();
        }
        let mut partners = self.interleave_partners(&world)?;
        let mut global_step = 0u64;
        let mut resumed_masters = Vec::new();
        let mut resumed_scale = None;
        if let Some(from) = self.resume_dir()? {
            (global_step, resumed_masters, resumed_scale) =
                self.resume(&mut exec, &mut optimizer, &trainable, &from, rank)?;
        }
        let mut broadcast = Vec::new();
        if self.config.train().parameter_broadcast {
            exec.materialize_parameters()?;
            let layouts = self
                .train
                .params
                .iter()
                .map(|p| (p.name.clone(), p.layout.clone()))
                .collect();
            let first = exec::stage_first_rank(&self.train, rank);
            broadcast = parameter_broadcast(&mut exec, world.as_ref(), &layouts, rank, first)?;
        }
        // Mixed precision: f32 master pieces (after a resume, of the weights it loaded).
        let mut master = match precision.has_master_weights() {
            true => {
                exec.materialize_parameters()?;
                let mut master = MasterWeights::new(&exec, &trainable)?;
                // A resume continues from the saved f32 masters (or f32 weights), not from the
                // half-precision weights rounded from them.
                for (k, piece) in resumed_masters.into_iter().enumerate() {
                    if let Some(piece) = piece {
                        *master.piece_mut(k) = piece;
                    }
                }
                Some(master)
            }
            false => None,
        };
        if let Some(m) = &master {
            exec.memory().hold(MemoryCategory::Optimizer, m.bytes());
        }
        let mut scaler = LossScaler::new(self.config.train().loss_scale);
        if let (Some(scaler), Some(saved)) = (scaler.as_mut(), resumed_scale) {
            scaler.restore(saved);
        }
        let out = self.config.output();
        let mut save_schedule =
            SaveSchedule::new(out.save_checkpoint_steps, out.save_checkpoint_seconds);
        let cfg = self.config.train();
        let max_steps = cfg.max_steps.unwrap_or(u64::MAX);
        let mut outcome = RankOutcome {
            broadcast,
            ..RankOutcome::default()
        };
        let mut group_info_written = false;
        let mut epochs_run = 0;
        // Copies of parameters shared by pipeline stages: their gradients summed every step.
        let mut shared_grads = exec::SharedGradients::default();
        let batches_per_epoch = self.batches_per_epoch();
        // The schedule is a function of the global step alone: every rank, and a resumed run,
        // takes the same rate at the same step.
        let schedule = self.config.lr_schedule();
        let run_steps = (cfg.epochs as u64)
            .saturating_mul(batches_per_epoch)
            .min(max_steps);
        schedule.check_run_steps(run_steps)?;
        let first_epoch = (global_step / batches_per_epoch) as usize + 1;
        for epoch in first_epoch..=cfg.epochs {
            let epoch_start = Instant::now();
            epochs_run = epoch;
            let plan = self.epoch_plan(epoch)?;
            for index in 0..plan.len() {
                // A resumed run skips the batches its checkpoint already trained on.
                if (epoch as u64 - 1) * batches_per_epoch + index < global_step {
                    continue;
                }
                if global_step >= max_steps {
                    break;
                }
                let start = Instant::now();
                let lr = schedule.learning_rate(global_step, run_steps);
                optimizer.set_learning_rate(lr)?;
                exec.set_loss_scale(scaler.as_ref().map_or(1.0, LossScaler::scale));
                for p in &mut partners {
                    p.set_loss_scale(scaler.as_ref().map_or(1.0, LossScaler::scale));
                }
                let update;
                let loss = if let Some(accumulated) = accumulated.as_mut() {
                    let at = (&plan, epoch, index);
                    let loss = match &pipelined {
                        Some(runner) => {
                            let (loss, trace) = self.pipelined_step(
                                &mut exec,
                                runner,
                                accumulated,
                                &trainable,
                                at,
                                global_step,
                                (&mut shared_grads, world.as_ref()),
                            )?;
                            if self.output_broadcast() {
                                outcome
                                    .micro_batch_losses
                                    .push(trace.micro_batch_losses.clone());
                            }
                            outcome.pipeline.push(trace);
                            loss
                        }
                        None if !partners.is_empty() => self.interleaved_step(
                            &mut exec,
                            &mut partners,
                            accumulated,
                            &trainable,
                            at,
                            global_step,
                        )?,
                        None => self.accumulate_step(
                            &mut exec,
                            accumulated,
                            &trainable,
                            at,
                            global_step,
                        )?,
                    };
                    if pipelined.is_none() {
                        shared_grads.sum(
                            &mut exec,
                            Some(accumulated),
                            &trainable,
                            world.as_ref(),
                        )?;
                    }
                    update = update_parameters(
                        &mut exec,
                        &mut optimizer,
                        UpdateContext {
                            trainable: &trainable,
                            accumulated: Some(accumulated),
                            master: master.as_mut(),
                            scaler: scaler.as_mut(),
                            world: world.as_ref(),
                            clip: cfg.max_grad_norm,
                        },
                    )?;
                    loss
                } else {
                    self.feed_step(&mut exec, &plan, epoch, index, 0)?;
                    exec.set_step(global_step);
                    exec.run()?;
                    shared_grads.sum(&mut exec, None, &trainable, world.as_ref())?;
                    update = update_parameters(
                        &mut exec,
                        &mut optimizer,
                        UpdateContext {
                            trainable: &trainable,
                            accumulated: None,
                            master: master.as_mut(),
                            scaler: scaler.as_mut(),
                            world: world.as_ref(),
                            clip: cfg.max_grad_norm,
                        },
                    )?;
                    exec.output(0).to_f64_vec()[0] as f32
                };
                let step_ms = start.elapsed().as_secs_f64() * 1e3;
                if self.output_broadcast() && pipelined.is_none() {
                    // One batch per step: the loss every rank holds is the last stage's.
                    outcome.micro_batch_losses.push(vec![loss]);
                }
                global_step += 1;
                outcome.skipped_steps += u64::from(!update.applied);
                if cfg.max_grad_norm.is_some() {
                    outcome.grad_norms.push(update.grad_norm);
                }
                if !group_info_written {
                    // Every group a step creates exists after the first one.
                    self.write_group_info(&exec, rank)?;
                    group_info_written = true;
                }
                outcome.losses.push(loss);
                outcome.step_ms.push(step_ms);
                let shards: Vec<ShardView<'_>> = if want_shards {
                    self.train
                        .params
                        .iter()
                        .enumerate()
                        .map(|(i, p)| ShardView {
                            name: &p.name,
                            param: exec.param(i),
                            // With accumulation, the gradient the update applied: the mean.
                            grad: match (&accumulated, trainable.iter().position(|&t| t == i)) {
                                (Some(accumulated), Some(k)) => Some(accumulated.buffer(k)),
                                _ => exec.grad(i),
                            },
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                callbacks.on_step_end(&StepInfo {
                    rank,
                    epoch,
                    step_in_epoch: index as usize + 1,
                    global_step,
                    loss,
                    step_ms,
                    lr,
                    grad_norm: update.grad_norm,
                    shards: &shards,
                })?;
                if cfg
                    .eval_interval
                    .is_some_and(|n| global_step.is_multiple_of(n))
                {
                    let (eval_accuracy, eval_loss) = self.evaluate_now(&mut exec, &mut eval)?;
                    let info = EvalInfo {
                        rank,
                        global_step,
                        eval_accuracy,
                        eval_loss,
                    };
                    callbacks.on_eval(&info)?;
                    outcome.step_evals.push(info);
                }
                if let Some(save_schedule) = save_schedule.as_mut() {
                    if save_schedule.due(global_step, world.as_ref())? {
                        exec.materialize_parameters()?;
                        let saved = SavedState {
                            exec: &exec,
                            optimizer: &optimizer,
                            master: master.as_ref(),
                            trainable: &trainable,
                            global_step,
                            scaler: scaler.as_ref(),
                        };
                        let dir = periodic_set_dir(&out.dir, global_step);
                        let target = SetTarget::Periodic(&dir);
                        self.save_checkpoint_set(world.as_ref(), &saved, target)?;
                        save_schedule.saved();
                    }
                }
            }
            let (eval_accuracy, eval_loss) = if cfg.eval {
                self.evaluate_now(&mut exec, &mut eval)?
            } else {
                (None, None)
            };
            outcome.accuracies.extend(eval_accuracy);
            outcome.eval_losses.extend(eval_loss);
            callbacks.on_epoch_end(&EpochInfo {
                rank,
                epoch,
                global_step,
                eval_accuracy,
                eval_loss,
                epoch_ms: epoch_start.elapsed().as_secs_f64() * 1e3,
            })?;
            // `max_steps` cuts the run short after evaluating the epoch it ends in.
            if global_step >= max_steps {
                break;
            }
        }
        if !group_info_written {
            self.write_group_info(&exec, rank)?;
        }
        exec::check_some_update(
            outcome.losses.len() as u64,
            outcome.skipped_steps,
            scaler.as_ref(),
        )?;
        // A run of no step still ends with every parameter (saved, reported).
        exec.materialize_parameters()?;
        let memory = exec::gather_reports(world.as_ref(), &exec.memory().report())?;
        callbacks.on_train_end(&TrainEndInfo {
            rank,
            epochs: epochs_run,
            global_step,
            last_loss: outcome.losses.last().copied(),
            memory: &memory,
        })?;
        outcome.memory_by_rank = memory;
        if self.checkpoint_dir().is_some() {
            let saved = SavedState {
                exec: &exec,
                optimizer: &optimizer,
                master: master.as_ref(),
                trainable: &trainable,
                global_step,
                scaler: scaler.as_ref(),
            };
            self.save_checkpoint_set(world.as_ref(), &saved, SetTarget::Final)?;
        }
        for (i, p) in self.train.params.iter().enumerate() {
            if !exec.holds_param(i) {
                continue;
            }
            let shard = ParamShard {
                name: p.name.clone(),
                layout: p.layout.clone(),
                region: exec.box_of(&p.layout)?,
                values: exec.param(i).clone(),
            };
            match parallel::pipeline::shared_copy_of(&p.name) {
                Some(_) => outcome.shared_copies.push(shard),
                None => outcome.params.push(shard),
            }
        }
        outcome.global_step = global_step;
        outcome.initialised_bytes = exec.initialised_bytes();
        outcome.memory = ParamMemory::measure(&exec, &optimizer, &trainable)?;
        Ok(outcome)
    }

    /// The forward and backward passes of one optimizer step with gradient accumulation:
    /// runs `exec` on each of the step's micro-batches (`at`: the epoch's plan, the epoch and
    /// the step's index in it) and leaves in `accumulated[k]` the mean of trainable parameter
    /// `trainable[k]`'s gradients over them — the gradient of the mean loss over all the
    /// step's samples, what one run on the `micro_steps` times larger batch computes. Returns
    /// the mean of the micro-batches' losses, that batch's loss.
    ///
    /// Each micro-batch's gradient is reduced over the ranks by the program, as without
    /// accumulation; the sum here is local to each rank's shard. Dropout draws micro-batch
    /// `j` of optimizer step `s` at step `s · micro_steps + j`, so no two micro-batches share a
    /// mask (the masks are not those of the larger batch: they are keyed by element position).
    ///
    /// The gradients of parameters shared by several stages are summed over their copies
    /// (`shared`: the sums and the world) before the update. In deterministic mode every
    /// micro-batch's gradients are reduced, summed over the copies and added into
    /// `accumulated` one micro-batch at a time, in the order and with the arithmetic of
    /// [`Session::accumulate_step`], so a pipelined step is bitwise one device's step with
    /// `train.grad_accumulation_steps` = `micro_batches` (what the pipeline's micro-batches
    /// are); otherwise the rank sums its micro-batches first and reduces once.
    #[allow(clippy::too_many_arguments)]
    fn pipelined_step(
        &self,
        exec: &mut RankExecutor,
        runner: &PipelineRunner,
        accumulated: &mut Accumulation,
        trainable: &[usize],
        at: (&EpochPlan, usize, u64),
        global_step: u64,
        shared: (&mut exec::SharedGradients, &dyn Communicator),
    ) -> Result<(f32, StepTrace), RuntimeError> {
        let (plan, epoch, index) = at;
        let (shared_grads, world) = shared;
        let micro_steps = self.micro_steps() as u64;
        let feed = |exec: &mut RankExecutor, mb| self.feed_step(exec, plan, epoch, index, mb);
        let step = |mb| {
            global_step
                .wrapping_mul(micro_steps)
                .wrapping_add(mb as u64)
        };
        if self.deterministic.is_none() {
            let trace = runner.run_step(exec, feed, step, None)?;
            accumulated.copy(exec, trainable)?;
            shared_grads.sum(exec, Some(accumulated), trainable, world)?;
            return Ok((exec.output(0).to_f64_vec()[0] as f32, trace));
        }
        let share = 1.0 / micro_steps as f64;
        accumulated.zero();
        let mut loss_sum = 0.0f64;
        let mut each = |exec: &mut RankExecutor, _mb: usize| {
            shared_grads.sum(exec, None, trainable, world)?;
            loss_sum += exec.output(0).to_f64_vec()[0];
            Ok(accumulated.add(exec, trainable, share)?)
        };
        let trace = runner.run_step(exec, feed, step, Some(&mut each))?;
        Ok(((loss_sum / micro_steps as f64) as f32, trace))
    }

    /// Writes `rank`'s group-info file when `output.group_info_file` asks for one.
    fn write_group_info(&self, exec: &RankExecutor, rank: usize) -> Result<(), RuntimeError> {
        let out = self.config.output();
        let Some(template) = &out.group_info_file else {
            return Ok(());
        };
        let path = crate::group_info::group_info_path(&out.dir, template, rank);
        crate::group_info::write_group_info(&path, &self.train, rank, &exec.created_groups())
    }

    /// The memory `rank` will hold training this session (see [`parallel::memory`]); for
    /// pipelined steps, with as many micro-batches in flight as its stage's schedule holds.
    /// `None` only when the pipeline's schedule cannot be built (the run would fail first).
    pub fn predict_memory(&self, rank: usize) -> Option<MemoryReport> {
        let accumulation_sharded = self.accumulation_sharded();
        let state = TrainingState {
            optimizer_tensors: self.config.optimizer_config().kind.state_names().len(),
            accumulation_sharded: (self.micro_steps() > 1).then_some(accumulation_sharded),
            master_weights: self.config.train().precision.has_master_weights(),
        };
        match self.pipeline_schedule().ok()? {
            None => Some(parallel::memory::predict(&self.train, rank, state)),
            Some((schedule, per_stage)) => {
                let stage = rank / per_stage.max(1);
                let held = schedule
                    .per_stage()
                    .get(stage)
                    .map_or(0, |actions| parallel::pipeline::micro_batches_held(actions));
                let buffers = parallel::pipeline::micro_batch_buffers(&self.train, per_stage);
                Some(parallel::memory::predict_pipelined(
                    &self.train,
                    rank,
                    state,
                    &buffers,
                    held,
                ))
            }
        }
    }

    /// Whether gradient accumulation keeps only each rank's optimizer piece (`hsdp` level 2
    /// and 3, zero2, or zero1 with `parallel.hsdp.gradient_accumulation_shard`).
    fn accumulation_sharded(&self) -> bool {
        self.config
            .parallel_config()
            .hsdp
            .is_some_and(|h| h.accumulation_sharded())
    }

    /// Whether the steps are pipelined: more than one stage and more than one micro-batch.
    pub fn is_pipelined(&self) -> bool {
        self.micro_steps() > 1
            && self
                .config
                .parallel_config()
                .pipeline
                .is_some_and(|p| p.stages > 1)
    }

    /// This rank's plan for pipelined steps, when the run has pipeline stages and more than one
    /// micro-batch per step.
    fn pipeline_runner(&self, rank: usize) -> Result<Option<PipelineRunner>, RuntimeError> {
        let Some((schedule, per_stage)) = self.pipeline_schedule()? else {
            return Ok(None);
        };
        let runner = PipelineRunner::new(&self.train, &schedule, rank, per_stage)?;
        Ok(Some(match self.output_broadcast() {
            true => runner.broadcast_outputs(&self.train, per_stage)?,
            false => runner,
        }))
    }

    /// The schedule of a pipelined session and the ranks per stage (`None` when steps are not
    /// pipelined).
    fn pipeline_schedule(
        &self,
    ) -> Result<Option<(parallel::pipeline::Schedule, usize)>, RuntimeError> {
        let parallel = self.config.parallel_config();
        let Some(p) = parallel.pipeline.filter(|p| p.stages > 1) else {
            return Ok(None);
        };
        if self.micro_steps() < 2 {
            return Ok(None);
        }
        let config = parallel::pipeline::PipelineConfig {
            micro_batches: self.micro_steps(),
            ..p.clone()
        };
        let schedule =
            parallel::pipeline::Schedule::generate(&config).map_err(|e| RuntimeError::Config {
                key: "parallel.pipeline".to_string(),
                reason: e.to_string(),
            })?;
        Ok(Some((schedule, self.devices() / p.stages)))
    }

    /// `parallel.pipeline.output_broadcast`: every micro-batch's loss goes from the last stage
    /// to every rank.
    fn output_broadcast(&self) -> bool {
        self.config
            .parallel_config()
            .pipeline
            .is_some_and(|p| p.stages > 1 && p.output_broadcast)
    }

    /// With `parallel.micro_batch_interleave = n` on the local backend: `n − 1` more executors
    /// of the training program for this rank, each over its own communicator of every rank
    /// (so their messages and collectives never mix with the first one's). None otherwise:
    /// under MPI a process's calls hold one lock for a whole collective, so the parts run
    /// one after the other there.
    fn interleave_partners(
        &self,
        world: &Arc<dyn Communicator>,
    ) -> Result<Vec<RankExecutor>, RuntimeError> {
        let n = self.config.micro_batch_interleave();
        if n < 2 || world.backend() != "local" {
            return Ok(Vec::new());
        }
        let all: Vec<usize> = (0..world.size()).collect();
        (1..n)
            .map(|_| {
                let own: Arc<dyn Communicator> = Arc::from(world.group(&all)?);
                let mut exec = RankExecutor::new(self.train.clone(), own)?;
                exec.set_deterministic(self.deterministic_blocks());
                exec.init_parameters(self.config.train().seed)?;
                Ok(exec)
            })
            .collect()
    }

    /// One optimizer step of `parallel.micro_batch_interleave`: the step's micro-steps in
    /// groups of `1 + partners.len()` parts, the parts of a group run at once (part 0 on
    /// `exec`, part `j` on `partners[j − 1]`, each on its own thread and communicators), so
    /// while one part waits in a collective another computes. Losses and gradients are then
    /// added in part order, exactly as [`Session::accumulate_step`] adds them.
    fn interleaved_step(
        &self,
        exec: &mut RankExecutor,
        partners: &mut [RankExecutor],
        accumulated: &mut Accumulation,
        trainable: &[usize],
        at: (&EpochPlan, usize, u64),
        global_step: u64,
    ) -> Result<f32, RuntimeError> {
        let (plan, epoch, index) = at;
        let micro_steps = self.micro_steps();
        let share = 1.0 / micro_steps as f64;
        accumulated.zero();
        exec.materialize_parameters()?;
        for p in partners.iter_mut() {
            p.materialize_parameters()?;
            for i in 0..exec.program().params.len() {
                if exec.holds_param(i) {
                    p.param_mut(i)
                        .as_bytes_mut()
                        .copy_from_slice(exec.param(i).as_bytes());
                }
            }
        }
        let step_of = |micro: usize| {
            global_step
                .wrapping_mul(micro_steps as u64)
                .wrapping_add(micro as u64)
        };
        let mut loss_sum = 0.0f64;
        let n = partners.len() + 1;
        for first in (0..micro_steps).step_by(n) {
            let others = &mut partners[..(micro_steps - first).min(n) - 1];
            self.feed_step(exec, plan, epoch, index, first)?;
            exec.set_step(step_of(first));
            for (j, p) in others.iter_mut().enumerate() {
                self.feed_step(p, plan, epoch, index, first + 1 + j)?;
                p.set_step(step_of(first + 1 + j));
            }
            let (mine, theirs) = std::thread::scope(|s| {
                let handles: Vec<_> = others
                    .iter_mut()
                    .map(|p| s.spawn(move || p.run()))
                    .collect();
                let mine = exec.run();
                let theirs: Vec<Result<(), RuntimeError>> = handles
                    .into_iter()
                    .map(|h| match h.join() {
                        Ok(run) => run.map_err(RuntimeError::from),
                        Err(_) => Err(RuntimeError::Mismatch {
                            what: "an interleaved part of the batch".to_string(),
                            expected: "its run to finish".to_string(),
                            got: "its thread panicked".to_string(),
                        }),
                    })
                    .collect();
                (mine, theirs)
            });
            mine?;
            theirs.into_iter().collect::<Result<Vec<()>, _>>()?;
            loss_sum += exec.output(0).to_f64_vec()[0];
            accumulated.add(exec, trainable, share)?;
            for p in others.iter() {
                loss_sum += p.output(0).to_f64_vec()[0];
                accumulated.add(p, trainable, share)?;
            }
        }
        Ok((loss_sum / micro_steps as f64) as f32)
    }

    fn accumulate_step(
        &self,
        exec: &mut RankExecutor,
        accumulated: &mut Accumulation,
        trainable: &[usize],
        at: (&EpochPlan, usize, u64),
        global_step: u64,
    ) -> Result<f32, RuntimeError> {
        let (plan, epoch, index) = at;
        let micro_steps = self.micro_steps();
        let share = 1.0 / micro_steps as f64;
        accumulated.zero();
        let mut loss_sum = 0.0f64;
        for micro in 0..micro_steps {
            self.feed_step(exec, plan, epoch, index, micro)?;
            exec.set_step(
                global_step
                    .wrapping_mul(micro_steps as u64)
                    .wrapping_add(micro as u64),
            );
            exec.run()?;
            loss_sum += exec.output(0).to_f64_vec()[0];
            accumulated.add(exec, trainable, share)?;
        }
        Ok((loss_sum / micro_steps as f64) as f32)
    }

    /// Saves the run's checkpoint as one set: rank 0 shares the staging directory, every rank
    /// writes `rank_<r>/checkpoint_<r>.safetensors` into it (rank 0 also the strategy files),
    /// the ranks agree that every write succeeded, and rank 0 commits the set. A rank that
    /// fails to write makes every rank fail, and nothing is committed.
    fn save_checkpoint_set(
        &self,
        world: &dyn Communicator,
        saved: &SavedState<'_>,
        target: SetTarget<'_>,
    ) -> Result<(), RuntimeError> {
        let rank = world.rank();
        let mut shared = Vec::new();
        let mut writer = None;
        if rank == 0 {
            let opened = match target {
                SetTarget::Final => self.open_checkpoint_set().map(|()| self.set_slot().take()),
                SetTarget::Periodic(dir) => ckpt::SetWriter::begin(dir, "train", true)
                    .map(Some)
                    .map_err(RuntimeError::from),
            };
            if let Ok(Some(set)) = &opened {
                shared = encode_staging(set.staging(), set.id());
            }
            // An empty message tells the other ranks that rank 0 could not open the set.
            share_bytes(world, &mut shared)?;
            writer = opened?;
        } else {
            share_bytes(world, &mut shared)?;
        }
        let Some((staging, id)) = decode_staging(&shared) else {
            return Err(RuntimeError::CheckpointSet {
                rank: 0,
                reason: "could not open the checkpoint set".to_string(),
            });
        };
        let written = self.save_rank(saved, &staging, &id, rank);
        let mut failed = Tensor::from_vec(&[1], vec![f32::from(u8::from(written.is_err()))])?;
        world.all_reduce(&mut failed, comm::ReduceOp::Max)?;
        written?;
        if failed.to_f64_vec().first().copied().unwrap_or(1.0) > 0.0 {
            // Dropping the writer removes the staging directory.
            drop(writer);
            return Err(RuntimeError::CheckpointSet {
                rank,
                reason: "another rank failed to write its checkpoint; the set was not committed (the previous checkpoint is unchanged)".to_string(),
            });
        }
        if let Some(set) = writer {
            set.commit()?;
            if let SetTarget::Periodic(dir) = target {
                let out = self.config.output();
                crate::periodic_ckpt::prune(&out.dir, out.keep_checkpoint_max, dir)?;
            }
        }
        Ok(())
    }

    /// Writes this rank's checkpoint `rank_<r>/checkpoint_<r>.safetensors` into the staging
    /// directory: its shards of the checkpointed parameters, its optimizer state shards and the
    /// step counter; rank 0 also writes the strategy files.
    fn save_rank(
        &self,
        saved: &SavedState<'_>,
        staging: &Path,
        set_id: &str,
        rank: usize,
    ) -> Result<(), RuntimeError> {
        let step = Tensor::from_vec(&[1], vec![saved.global_step as i32])?;
        let mut names: Vec<String> = Vec::new();
        let mut tensors: Vec<&Tensor> = Vec::new();
        for (i, p) in self.train.params.iter().enumerate() {
            if self.checkpointed(p) && saved.exec.holds_param(i) {
                names.push(p.name.clone());
                tensors.push(saved.exec.param(i));
            }
        }
        for (k, &i) in saved.trainable.iter().enumerate() {
            // A shared parameter's owner saves its state; its copies hold the same.
            if !self.checkpointed(&self.train.params[i]) {
                continue;
            }
            for (state, t) in saved.optimizer.state(k)? {
                names.push(state_checkpoint_name(state, &self.train.params[i].name));
                tensors.push(t);
            }
            if let Some(master) = saved.master {
                names.push(state_checkpoint_name(
                    MASTER_WEIGHT,
                    &self.train.params[i].name,
                ));
                tensors.push(master.piece(k));
            }
        }
        names.push(GLOBAL_STEP.to_string());
        tensors.push(&step);
        let pairs: Vec<(&str, &Tensor)> = names.iter().map(String::as_str).zip(tensors).collect();
        ckpt::save_rank_checkpoint_in_set(staging, set_id, rank, &pairs)?;
        if rank == 0 {
            self.save_strategy_files(staging)?;
            let state = crate::periodic_ckpt::TrainState::new(
                saved.global_step,
                saved.optimizer.step_count(),
                saved.scaler.map(LossScaler::state),
                crate::periodic_ckpt::next_sequence(&self.config.output().dir),
            );
            ckpt::save_side_file(
                &staging.join(crate::periodic_ckpt::TRAIN_STATE_FILE),
                &state.to_json_bytes(),
                true,
            )?;
            if let TrainData::Text(text) = &self.data {
                let saved = text.saved_model(&self.config)?;
                let mut bytes = serde_json::to_vec_pretty(&saved.to_json()).map_err(|e| {
                    RuntimeError::Mismatch {
                        what: "the model description".to_string(),
                        expected: "JSON".to_string(),
                        got: e.to_string(),
                    }
                })?;
                bytes.push(b'\n');
                ckpt::save_side_file(&staging.join(MODEL_FILE), &bytes, true)?;
            }
        }
        Ok(())
    }

    /// Loads this rank's checkpointed parameters (non-trainable ones only with
    /// `strategy_file_only_for_trainable_params = false`; otherwise they keep their
    /// initialisation) and optimizer state from the checkpoint in `from`, saved under any
    /// strategy (converted on load); returns the step it was saved at. The optimizer's step
    /// count is the set's [`TrainState`]'s (the global step when it has none), and its loss
    /// scaler state is returned for the run's scaler to continue.
    ///
    /// Under mixed precision it also returns, by trainable parameter, the f32 master piece to
    /// continue from: the saved `master_weight.<name>`, or the piece of a weight saved in f32.
    fn resume(
        &self,
        exec: &mut RankExecutor,
        optimizer: &mut Optimizer,
        trainable: &[usize],
        from: &Path,
        rank: usize,
    ) -> Result<Resumed, RuntimeError> {
        let strategy_file = self
            .config
            .output()
            .resume_strategy
            .clone()
            .unwrap_or_else(|| from.join("strategy.json"));
        let states = self.config.optimizer_config().kind.state_names();
        let mut targets: Vec<(String, TensorLayout)> = Vec::new();
        for (i, p) in self.train.params.iter().enumerate() {
            let copy = parallel::pipeline::shared_copy_of(&p.name).is_some();
            if (copy || self.checkpointed(p)) && exec.holds_param(i) {
                targets.push((checkpoint_name(p).to_string(), p.layout.clone()));
            }
        }
        let masters_wanted = self.config.train().precision.has_master_weights();
        let saved_names: Vec<String> = match masters_wanted {
            true => ckpt::Strategy::load(&strategy_file)?
                .params
                .into_iter()
                .map(|p| p.name)
                .collect(),
            false => Vec::new(),
        };
        for &i in trainable {
            let p = &self.train.params[i];
            let state_layout = p.optimizer_shard().map_or(&p.layout, |shard| &shard.layout);
            for s in states {
                targets.push((
                    state_checkpoint_name(s, checkpoint_name(p)),
                    state_layout.clone(),
                ));
            }
            let master = state_checkpoint_name(MASTER_WEIGHT, checkpoint_name(p));
            if saved_names.contains(&master) {
                targets.push((master, state_layout.clone()));
            }
        }
        let mut masters: Vec<Option<Tensor>> = vec![None; trainable.len()];
        let asked: Vec<(&str, &TensorLayout)> =
            targets.iter().map(|(n, l)| (n.as_str(), l)).collect();
        let loaded = ckpt::load_rank_tensors(from, &strategy_file, rank, &asked)?;
        for (name, tensor) in loaded {
            let held = |(i, p): &(usize, &parallel::ProgramParam)| {
                checkpoint_name(p) == name && exec.holds_param(*i)
            };
            if let Some((i, _)) = self.train.params.iter().enumerate().find(held) {
                let want = exec.param_dtype(i);
                // Weights saved in f32 are the masters of a mixed-precision resume.
                if let Some(k) = trainable.iter().position(|&t| t == i) {
                    if masters_wanted && tensor.dtype() == tensor::DType::F32 {
                        let piece = exec.optimizer_piece(i);
                        masters[k] = Some(exec::f32_piece(
                            &tensor,
                            piece.param_offset,
                            &piece.shape,
                            1.0,
                        )?);
                    }
                }
                let values = match tensor.dtype() == want {
                    true => tensor,
                    false => tensor.to_dtype(want),
                };
                exec.set_param(i, values)?;
                continue;
            }
            for (k, &i) in trainable.iter().enumerate() {
                let param = checkpoint_name(&self.train.params[i]);
                for s in states {
                    if state_checkpoint_name(s, param) == name {
                        optimizer.load_state(k, s, &tensor)?;
                    }
                }
                if state_checkpoint_name(MASTER_WEIGHT, param) == name {
                    masters[k] = Some(tensor.to_dtype(tensor::DType::F32));
                }
            }
        }
        let step_file = ckpt::rank_file_path(from, 0, "checkpoint_", ckpt::Format::Safetensors);
        let step = ckpt::CheckpointFile::open(&step_file)
            .and_then(|f| f.read_tensor(GLOBAL_STEP))
            .map(|t| t.to_f64_vec().first().copied().unwrap_or(0.0) as u64)
            .unwrap_or(0);
        let state = TrainState::read(from)?;
        optimizer.set_step_count(state.as_ref().map_or(step, |s| s.optimizer_steps));
        Ok((step, masters, state.and_then(|s| s.loss_scale)))
    }

    /// Evaluates the parameters `exec` holds now (copied into `eval`).
    fn evaluate_now(
        &self,
        exec: &mut RankExecutor,
        eval: &mut RankExecutor,
    ) -> Result<(Option<f64>, Option<f64>), RuntimeError> {
        exec.materialize_parameters()?;
        copy_params(exec, eval)?;
        self.evaluate(eval)
    }

    /// The checkpoint directory this run resumes from: `output.resume_from`'s, or for
    /// `"latest"` the set of `output.dir` committed last
    /// ([`crate::periodic_ckpt::latest_set`], resolved once per process); an error naming the
    /// key when `"latest"` finds none.
    pub fn resume_dir(&self) -> Result<Option<PathBuf>, RuntimeError> {
        let out = self.config.output();
        let dir = match &out.resume_from {
            None => return Ok(None),
            Some(ResumeFrom::Dir(dir)) => return Ok(Some(dir.clone())),
            Some(ResumeFrom::Latest) => self
                .latest
                .get_or_init(|| crate::periodic_ckpt::latest_set(&out.dir)),
        };
        match dir {
            Some(dir) => Ok(Some(dir.clone())),
            None => Err(RuntimeError::Config {
                key: "output.resume_from".to_string(),
                reason: format!(
                    "\"latest\": {} holds no committed checkpoint set of a training run (its final set or a `{}<N>/` set, each with {}); name a checkpoint directory, or train without output.resume_from first",
                    out.dir.display(),
                    crate::periodic_ckpt::PERIODIC_PREFIX,
                    crate::periodic_ckpt::TRAIN_STATE_FILE
                ),
            }),
        }
    }

    /// The evaluation after an epoch: the test accuracy (images) or the validation loss
    /// (text).
    fn evaluate(
        &self,
        eval: &mut RankExecutor,
    ) -> Result<(Option<f64>, Option<f64>), RuntimeError> {
        match &self.data {
            TrainData::Images { test, .. } => Ok((Some(self.accuracy(eval, test)?), None)),
            TrainData::Text(text) => {
                let seed = self.config.train().seed;
                Ok((None, text.validation_loss(eval, &self.model, seed)?))
            }
        }
    }

    /// Test accuracy: every test sample once, the last batch padded and its padding ignored.
    fn accuracy(&self, eval: &mut RankExecutor, test: &IdxDataset) -> Result<f64, RuntimeError> {
        let plan = BatchPlan::eval(test.len(), self.config.data().batch_size)?;
        let mut correct = 0usize;
        for batch in plan.iter() {
            self.feed(eval, test, &batch)?;
            eval.run()?;
            correct += batch.correct_predictions(&eval.output(0).to_f64_vec(), test.labels());
        }
        Ok(correct as f64 / plan.n_real().max(1) as f64)
    }
}

/// The parallel settings of `config`, with the op strategies of `parallel.strategy_file` (if
/// any) for the ops `[parallel.shard]` leaves unset.
fn parallel_config(
    config: &TrainConfig,
    model: &Model,
) -> Result<parallel::ParallelConfig, RuntimeError> {
    let mut parallel = config.parallel_config();
    let Some(path) = config.strategy_file() else {
        return Ok(parallel);
    };
    let loaded = ckpt::Strategy::load(path)?;
    if loaded.ops.is_empty() {
        return Err(RuntimeError::Config {
            key: "parallel.strategy_file".to_string(),
            reason: format!(
                "{} holds no op strategies (Tessera JSON \"ops\", MindSpore parallel_strategy_item); save one with a training run's strategy.json or strategy.ckpt",
                path.display()
            ),
        });
    }
    for op in loaded.ops {
        if model.graph.node_by_name(&op.name).is_none() {
            return Err(RuntimeError::Config {
                key: "parallel.strategy_file".to_string(),
                reason: format!(
                    "{} has a strategy for op {:?}, which the model does not have",
                    path.display(),
                    op.name
                ),
            });
        }
        parallel
            .strategies
            .entry(op.name)
            .or_insert_with(|| parallel::OpStrategy::from_tuples(op.inputs, op.outputs));
    }
    Ok(parallel)
}

/// What an optimizer step needs besides the executor and the optimizer.
struct UpdateContext<'a> {
    /// The trainable parameters (indices into the program's), in the optimizer's order.
    trainable: &'a [usize],
    /// With gradient accumulation, the step's mean gradients (else the program's).
    accumulated: Option<&'a mut Accumulation>,
    /// Under mixed precision, the f32 master pieces the optimizer updates.
    master: Option<&'a mut MasterWeights>,
    /// The loss scale, when the gradients carry one.
    scaler: Option<&'a mut LossScaler>,
    /// Every rank (to agree on skipping a step whose gradients overflowed, and to add up the
    /// global gradient norm).
    world: &'a dyn Communicator,
    /// `train.max_grad_norm`: the global norm the gradients are clipped to.
    clip: Option<crate::clip::MaxGradNorm>,
}

/// What an optimizer step did.
struct StepUpdate {
    /// Whether the parameters were updated (`false`: skipped for overflowing gradients).
    applied: bool,
    /// With `train.max_grad_norm`, the global gradient norm before clipping (`None` when
    /// the step was skipped, or without clipping).
    grad_norm: Option<f64>,
}

/// Parameter `i`'s (`trainable[k]`) gradient — accumulated, or the program's — and where its
/// optimizer piece starts in it.
fn gradient_of<'e>(
    exec: &'e RankExecutor,
    accumulated: Option<&'e Accumulation>,
    k: usize,
    i: usize,
) -> Option<(&'e Tensor, usize)> {
    let piece = exec.optimizer_piece(i);
    match accumulated {
        Some(acc) => Some((acc.buffer(k), acc.piece_offset(k, piece.grad_offset))),
        None => exec.grad(i).map(|g| (g, piece.grad_offset)),
    }
}

/// The optimizer step: every trainable parameter's piece (its shard, or with `hsdp` the rows
/// of its optimizer shard) updated with its gradient — the program's gradient buffer, or with
/// gradient accumulation the accumulated mean — then the updated pieces gathered into whole
/// weights where `hsdp` keeps weights whole (`zero1` and `zero2`). Under mixed precision the update
/// applies to the f32 master piece, with the gradient widened and unscaled, and the result is
/// rounded into the weights; a step whose gradients overflowed on any rank is skipped.
/// With `train.max_grad_norm` the gradients (unscaled, under mixed precision) are first
/// clipped by their global norm ([`crate::clip`]).
fn update_parameters(
    exec: &mut RankExecutor,
    optimizer: &mut Optimizer,
    mut ctx: UpdateContext<'_>,
) -> Result<StepUpdate, RuntimeError> {
    let Some(master) = ctx.master else {
        let grad_norm = match ctx.clip {
            Some(clip) => {
                let accumulated = ctx.accumulated.as_deref_mut();
                Some(clip.clip_in_place(exec, accumulated, ctx.trainable, ctx.world)?)
            }
            None => None,
        };
        optimizer.begin_step();
        for (k, &i) in ctx.trainable.iter().enumerate() {
            let piece = exec.optimizer_piece(i).clone();
            match ctx.accumulated.as_deref() {
                Some(accumulated) => optimizer.update_piece(
                    k,
                    exec.param_mut(i),
                    piece.param_offset,
                    accumulated.buffer(k),
                    accumulated.piece_offset(k, piece.grad_offset),
                )?,
                None => {
                    if let Some((param, grad)) = exec.param_and_grad(i) {
                        optimizer.update_piece(
                            k,
                            param,
                            piece.param_offset,
                            grad,
                            piece.grad_offset,
                        )?;
                    }
                }
            }
        }
        exec.gather_updated_weights()?;
        return Ok(StepUpdate {
            applied: true,
            grad_norm,
        });
    };
    let unscale = ctx.scaler.as_ref().map_or(1.0, |s| 1.0 / s.scale());
    let mut grads = Vec::with_capacity(ctx.trainable.len());
    for (k, &i) in ctx.trainable.iter().enumerate() {
        let shape = exec.optimizer_piece(i).shape.clone();
        let grad = match gradient_of(exec, ctx.accumulated.as_deref(), k, i) {
            Some((g, offset)) => exec::f32_piece(g, offset, &shape, unscale)?,
            None => Tensor::zeros(tensor::DType::F32, &shape),
        };
        grads.push(grad);
    }
    if let Some(scaler) = ctx.scaler {
        let mine = !grads.iter().all(exec::all_finite);
        let overflow = exec::any_rank_overflowed(ctx.world, mine)?;
        scaler.record(overflow);
        if overflow {
            return Ok(StepUpdate {
                applied: false,
                grad_norm: None,
            });
        }
    }
    let grad_norm = match ctx.clip {
        Some(clip) => Some(clip.clip_pieces(exec, &mut grads, ctx.trainable, ctx.world)?),
        None => None,
    };
    optimizer.begin_step();
    for (k, &i) in ctx.trainable.iter().enumerate() {
        optimizer.update_piece(k, master.piece_mut(k), 0, &grads[k], 0)?;
        let offset = exec.optimizer_piece(i).param_offset;
        exec::write_piece(exec.param_mut(i), offset, master.piece(k))?;
    }
    exec.gather_updated_weights()?;
    Ok(StepUpdate {
        applied: true,
        grad_norm,
    })
}

/// Copies the training program's parameter shards into the evaluation program's (the layouts
/// agree: both programs place the forward graph alike).
/// The name `p`'s values are saved and resumed under: its own, or for a copy of a parameter
/// shared by pipeline stages its owner's.
fn checkpoint_name(p: &parallel::ProgramParam) -> &str {
    parallel::pipeline::shared_copy_of(&p.name).map_or(p.name.as_str(), |c| c.0)
}

fn copy_params(from: &RankExecutor, to: &mut RankExecutor) -> Result<(), RuntimeError> {
    let eval_params = to.program().params.clone();
    for (j, p) in eval_params.iter().enumerate() {
        let i = from
            .program()
            .params
            .iter()
            .position(|q| q.name == p.name)
            .ok_or_else(|| RuntimeError::Mismatch {
                what: format!("parameter {}", p.name),
                expected: "a parameter of the training program".to_string(),
                got: "none".to_string(),
            })?;
        let src = &from.program().params[i];
        if !src.layout.same_placement(&p.layout) {
            return Err(RuntimeError::Mismatch {
                what: format!("parameter {} in the evaluation program", p.name),
                expected: format!("{}", src.layout),
                got: format!("{}", p.layout),
            });
        }
        to.param_mut(j)
            .as_bytes_mut()
            .copy_from_slice(from.param(i).as_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_paths_cross_ranks_whatever_their_bytes() {
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(
            b"/tmp/r\xffun/.x.tessera-staging-1",
        ));
        let bytes = encode_staging(path, "0123456789abcdef");
        assert_eq!(
            decode_staging(&bytes),
            Some((path.to_path_buf(), "0123456789abcdef".to_string()))
        );
        assert_eq!(decode_staging(b""), None);
    }
}
