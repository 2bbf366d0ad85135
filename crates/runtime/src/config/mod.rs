//! The training configuration: a TOML file plus `--set section.key=value` overrides.
//!
//! `docs/CONFIG.md` documents every key (type, default, meaning). This module checks the
//! structure: every section and key is known (a misspelt key is an error listing the valid
//! ones), every value has the right type, required keys are present, sizes are positive, enum
//! values are known and hyperparameters are in range. Checks that need the model (strategies
//! dividing shapes, device counts matching strategies) belong to the parallel pass.
//!
//! # Overrides
//! `section.key=value` sets one key before the file is checked; `section.sub.key` reaches a
//! nested table (`parallel.shard.matmul1=[[2,4],[4,1]]`), creating it when absent. The value is
//! parsed as a TOML value; when it is not valid TOML it is taken as a plain string
//! (`data.dir=data/digits`), unless it starts as a TOML string, array or table (then it is an
//! error). The first component must be a known section.
//!
//! # Paths
//! Relative paths in the file (`data.dir`, `output.dir`, …) are relative to the directory the
//! command runs in, not to the file: [`TrainConfig::load`] resolves them against the current
//! directory, [`TrainConfig::parse`] against the directory it is given.

//!
//! # Modules
//! [`values`] reads typed values out of TOML tables; [`sections`] reads each section into its
//! config struct; [`layouts`] reads `[parallel.mesh]` and layout-valued strategy entries.

mod agreement;
mod layouts;
mod lr;
mod memory;
mod overrides;
mod pipeline;
mod ps;
mod search;
mod sections;
mod values;

use std::path::{Path, PathBuf};

use exec::OptimizerConfig;
pub use models::GptParallelKeys;
use parallel::{HsdpConfig, ParallelConfig, ParallelMode};
use toml::Table;

use crate::data::Normalize;
use crate::error::RuntimeError;

pub use self::agreement::check_same_config;
use self::overrides::{apply_override, origins};
pub use self::ps::{PsKeys, MAX_PS_PROCESSES, PARAMETER_SERVER_MODE};
pub(crate) use self::search::empty_profile;
pub use self::search::{ProfileChoice, SearchKeys};
use self::sections::from_root;
pub(crate) use self::sections::ShardSizeCover;
#[cfg(test)]
use self::sections::SECTIONS;

/// The built-in models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelName {
    /// `graph::models::seed_mlp`.
    SeedMlp,
    /// `models::gpt`, a decoder-only transformer trained on text.
    Gpt,
    /// `models::embedding_bag`, a bag of embedded pixel features over the images; trained in
    /// `parallel.mode = "parameter_server"` only (its table may live on the servers).
    EmbeddingBag,
    /// A network built in code and given to [`crate::Trainer`] (not available in files).
    Custom,
}

impl ModelName {
    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            ModelName::SeedMlp => "seed_mlp",
            ModelName::Gpt => "gpt",
            ModelName::EmbeddingBag => "embedding_bag",
            ModelName::Custom => "custom",
        }
    }
}

/// `[model]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The model.
    pub name: ModelName,
    /// Width of the hidden layers (the GPT's residual stream).
    pub hidden: usize,
    /// Number of classes (labels must be below it); 0 for the GPT, whose classes are the
    /// vocabulary.
    pub classes: usize,
    /// The GPT's keys, when `name = "gpt"`.
    pub gpt: Option<GptKeys>,
}

/// `[model]`'s keys of the GPT (`hidden` is [`ModelConfig::hidden`]).
#[derive(Debug, Clone, PartialEq)]
pub struct GptKeys {
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Width of the MLP's hidden layer (default `4·hidden`).
    pub ffn_hidden: usize,
    /// Dropout probability.
    pub dropout: f64,
    /// The LM head shares the embedding table.
    pub tie_embeddings: bool,
    /// Attention as the fused op (default: when there is no dropout).
    pub fused_attention: bool,
    /// `[model.moe]`: MoE blocks in place of the MLPs (`None`: dense MLPs).
    pub moe: Option<models::MoeConfig>,
}

/// The data formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFormat {
    /// MNIST's IDX files ([`crate::IdxDataset`]).
    Idx,
    /// A UTF-8 text file, plain or gzip ([`crate::TokenCorpus::open_text`]).
    Text,
    /// A flat binary file of token ids ([`crate::TokenCorpus::open_tokens`]).
    Tokens,
}

impl DataFormat {
    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            DataFormat::Idx => "idx",
            DataFormat::Text => "text",
            DataFormat::Tokens => "tokens",
        }
    }
}

/// `[data]`'s keys of the text formats.
#[derive(Debug, Clone, PartialEq)]
pub struct TextDataKeys {
    /// The text or token file (resolved).
    pub path: PathBuf,
    /// `data.tokenizer = "char"`: tokens are the file's distinct characters (else bytes).
    pub char_tokens: bool,
    /// The held-out fraction of the tokens (the end of the stream).
    pub val_fraction: f64,
    /// Width of a token id in a token file.
    pub dtype: crate::data::TokenDtype,
    /// The vocabulary of a token file (default: one more than its largest id).
    pub vocab_size: Option<usize>,
    /// Steps per epoch.
    pub steps_per_epoch: u64,
    /// Validation batches per evaluation.
    pub eval_batches: u64,
}

/// `[data]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DataConfig {
    /// The format.
    pub format: DataFormat,
    /// The data set's directory (resolved).
    pub dir: PathBuf,
    /// The **global** batch size (over all devices) of one micro-batch: the file's
    /// `data.batch_size`, divided by the settings of `batch_cuts`.
    pub batch_size: usize,
    /// Shuffle the training split each epoch.
    pub shuffle: bool,
    /// Pixels are divided by this; `None`: by the largest pixel of the image file.
    pub pixel_max: Option<f32>,
    /// Whether scaled pixels are then standardised with the training split's statistics.
    pub normalize: Normalize,
    /// The text formats' keys (`format = "text"` or `"tokens"`).
    pub text: Option<TextDataKeys>,
    /// The settings that cut each step's batch into micro-batches, in order, each with its
    /// count (`parallel.pipeline.micro_batches`, `parallel.micro_batch_interleave`).
    pub batch_cuts: Vec<(&'static str, usize)>,
}

impl DataConfig {
    /// Micro-batches each step's batch is cut into: the product of [`DataConfig::batch_cuts`]
    /// (1 when it is not cut).
    pub fn micro_batches(&self) -> usize {
        self.batch_cuts.iter().map(|&(_, n)| n).product()
    }

    /// `err`, explained when it quotes a cut batch: an error about `data.batch_size` or the
    /// dataset strategy then says that the batch it names is one micro-batch, and how the
    /// file's `data.batch_size` was cut into it.
    pub fn explain_batch_error(&self, err: RuntimeError) -> RuntimeError {
        if self.batch_cuts.is_empty() {
            return err;
        }
        let whole = self.micro_batches() * self.batch_size;
        let cuts: Vec<String> = self
            .batch_cuts
            .iter()
            .map(|(key, n)| format!("{key} = {n}"))
            .collect();
        let note = format!(
            " (the batch here is one micro-batch of {} rows: data.batch_size = {whole} cut by {})",
            self.batch_size,
            cuts.join(" and ")
        );
        match err {
            RuntimeError::Config { key, reason } if key == "data.batch_size" => {
                RuntimeError::Config {
                    key,
                    reason: reason + &note,
                }
            }
            RuntimeError::Parallel(parallel::ParallelError::Setting {
                setting: setting @ "dataset_strategy",
                reason,
            }) => RuntimeError::Parallel(parallel::ParallelError::Setting {
                setting,
                reason: reason + &note,
            }),
            other => other,
        }
    }
}

/// `[train]`, except the optimizer ([`TrainConfig::optimizer_config`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainLoopConfig {
    /// Epochs to run.
    pub epochs: usize,
    /// Stop after this many global steps (`None`: no limit).
    pub max_steps: Option<u64>,
    /// Micro-steps per optimizer step (`train.grad_accumulation_steps`, ≥ 1): each step runs
    /// the program on this many consecutive batches of `data.batch_size` and updates once with
    /// the mean of their gradients, the update one step on a batch this many times larger
    /// would make. Steps, epochs and `max_steps` count optimizer steps.
    pub grad_accumulation_steps: usize,
    /// Seed of parameter initialisation and data shuffling.
    pub seed: u64,
    /// Deterministic mode (`train.deterministic`): every sum over a dim a strategy may split is
    /// added in one canonical order, so losses and parameters are bitwise those of one device.
    pub deterministic: bool,
    /// Evaluate on the test split after each epoch.
    pub eval: bool,
    /// `train.eval_interval`: also evaluate after every global step that is a multiple of
    /// this (`None`: only per epoch, as `train.eval` says). Independent of `train.eval`.
    pub eval_interval: Option<u64>,
    /// Print the loss every this many steps (0: never).
    pub per_print_times: u64,
    /// Print every rank's local norms each step.
    pub print_local_norm: bool,
    /// Dump every rank's local norms each step under this directory (resolved).
    pub dump_local_norm: Option<PathBuf>,
    /// What the model computes in (`train.precision`).
    pub precision: exec::Precision,
    /// The loss scale (`train.loss_scale`; `None`: none).
    pub loss_scale: Option<exec::LossScale>,
    /// `train.parameter_broadcast`: after initialisation or a resume, every parameter is
    /// broadcast from the first rank of its replica group (MindSpore's `parameter_broadcast`).
    pub parameter_broadcast: bool,
    /// `train.lazy_init` (MindSpore's `no_init_parameters`): a parameter is allocated and
    /// filled only when first used or loaded, so a resumed run never initialises it first.
    pub lazy_init: bool,
    /// `train.threads_per_rank`: the threads a rank's large matrix products may use (1: a rank
    /// owns one core). Process-wide (`tensor::kernels::threads`); the results are bitwise the
    /// same on any count.
    pub threads_per_rank: usize,
    /// `train.max_grad_norm` (MindSpore's `clip_by_global_norm`): every step's gradient is
    /// clipped to this global L2 norm before the update (`None`: not clipped).
    pub max_grad_norm: Option<exec::clip::MaxGradNorm>,
    /// `train.elastic` with its `train.elastic_interval`: every this many steps each rank
    /// keeps its training state in its node's in-memory store and a copy in another node's,
    /// and a restarted job continues from the newest snapshot (`None`: off).
    pub elastic: Option<u64>,
}

/// `output.resume_from`: where a run continues from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeFrom {
    /// A checkpoint directory (resolved).
    Dir(PathBuf),
    /// `"latest"`: the newest committed checkpoint set Tessera wrote in `output.dir` (its
    /// final set or a periodic one), resolved when the run starts
    /// ([`crate::periodic_ckpt::latest_set`]).
    Latest,
}

/// `[output]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputConfig {
    /// The run directory (resolved): checkpoints, metrics, strategy files.
    pub dir: PathBuf,
    /// Save a checkpoint at the end of training.
    pub save_checkpoint: bool,
    /// `output.save_checkpoint_steps`: also save a checkpoint set every this many global steps
    /// into `<dir>/checkpoint_step_<N>/` (MindSpore's `CheckpointConfig.save_checkpoint_steps`).
    pub save_checkpoint_steps: Option<u64>,
    /// `output.save_checkpoint_seconds`: also save one when this many seconds have passed
    /// since the run started or last saved one.
    pub save_checkpoint_seconds: Option<u64>,
    /// `output.keep_checkpoint_max`: the periodic sets kept (the newest; ≥ 1, default 5).
    pub keep_checkpoint_max: usize,
    /// The checkpoint to resume from: a directory (resolved) or the newest set in
    /// [`OutputConfig::dir`] (`"latest"`).
    pub resume_from: Option<ResumeFrom>,
    /// The strategy file of the checkpoint resumed from, when it is not inside it (resolved).
    pub resume_strategy: Option<PathBuf>,
    /// `output.group_info_file`: every rank writes MindSpore's group-info file
    /// (`ParallelGroupMap`) here, `{rank}` replaced by its rank (without `{rank}`, `_<rank>`
    /// goes before the extension); a relative path lies under [`OutputConfig::dir`].
    pub group_info_file: Option<String>,
}

impl OutputConfig {
    /// The metrics log, `<dir>/metrics.jsonl`.
    pub fn metrics_file(&self) -> PathBuf {
        self.dir.join("metrics.jsonl")
    }
}

/// A validated training configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// `parallel.micro_batch_interleave` (1: off).
    micro_batch_interleave: usize,
    source: Option<PathBuf>,
    model: ModelConfig,
    data: DataConfig,
    parallel: ParallelConfig,
    strategy_file: Option<PathBuf>,
    strategy_file_only_for_trainable_params: bool,
    gpt_parallel: GptParallelKeys,
    search: SearchKeys,
    optimizer: OptimizerConfig,
    lr_schedule: crate::lr_schedule::LrSchedule,
    weight_decay_filter: exec::WeightDecayFilter,
    train: TrainLoopConfig,
    output: OutputConfig,
    ps: Option<PsKeys>,
    warnings: Vec<String>,
}

impl TrainConfig {
    /// Reads the TOML file `path`, applies `overrides` (`section.key=value` each) and checks
    /// the result. Relative paths are resolved against the current directory.
    pub fn load(path: &Path, overrides: &[String]) -> Result<TrainConfig, RuntimeError> {
        TrainConfig::load_on(path, overrides, None)
    }

    /// [`TrainConfig::load`] on `devices` devices when given (the command line's `--devices`,
    /// which replaces `parallel.devices` before any key is checked: see
    /// [`TrainConfig::parse_on`]).
    pub fn load_on(
        path: &Path,
        overrides: &[String],
        devices: Option<usize>,
    ) -> Result<TrainConfig, RuntimeError> {
        let text = layout::limits::read_text_bounded(path, layout::limits::MAX_TEXT_FILE_BYTES)
            .map_err(|source| RuntimeError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        let base = std::env::current_dir().map_err(|source| RuntimeError::Io {
            path: PathBuf::from("."),
            source,
        })?;
        TrainConfig::parse_on(&text, Some(path), overrides, devices, &base)
    }

    /// Parses config `text` (read from `source`, if from a file, for error messages), applies
    /// `overrides` and checks the result; relative paths are resolved against `base`.
    pub fn parse(
        text: &str,
        source: Option<&Path>,
        overrides: &[String],
        base: &Path,
    ) -> Result<TrainConfig, RuntimeError> {
        TrainConfig::parse_on(text, source, overrides, None, base)
    }

    /// [`TrainConfig::parse`] on `devices` devices when given: the count replaces
    /// `parallel.devices` after the overrides and before any key is read, so every key whose
    /// valid values depend on the device count (`parallel.hsdp.shard_size`) is checked against
    /// the count the run uses, and an error about it says the value comes from `--devices`.
    pub fn parse_on(
        text: &str,
        source: Option<&Path>,
        overrides: &[String],
        devices: Option<usize>,
        base: &Path,
    ) -> Result<TrainConfig, RuntimeError> {
        let mut root: Table = text.parse().map_err(|e: toml::de::Error| {
            let at = e
                .span()
                .map(|span| {
                    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                    format!(" (line {line})")
                })
                .unwrap_or_default();
            in_source(
                source,
                "(syntax)",
                format!("not valid TOML{at}: {}", e.message().trim()),
            )
        })?;
        // Each overridden key, and where its value comes from.
        let mut overridden = Vec::new();
        for text in overrides {
            overridden.push((apply_override(&mut root, text)?, format!("--set {text}")));
        }
        if let Some(n) = devices {
            check_devices_flag(n)?;
            let parallel = root
                .entry("parallel")
                .or_insert_with(|| toml::Value::Table(Table::new()));
            if let toml::Value::Table(parallel) = parallel {
                parallel.insert("devices".to_string(), toml::Value::Integer(n as i64));
            }
            overridden.push((
                vec!["parallel".to_string(), "devices".to_string()],
                format!("--devices {n}"),
            ));
        }
        let mut config = from_root(root, base).map_err(|e| match e {
            RuntimeError::Config { key, reason } => match origins(&overridden, &key) {
                Some(origin) => RuntimeError::Config {
                    reason: format!("{reason} ({origin})"),
                    key,
                },
                None => in_source(source, &key, reason),
            },
            other => other,
        })?;
        config.source = source.map(Path::to_path_buf);
        Ok(config)
    }

    /// Reads `root` (a parsed TOML document, or any `toml::Table` deserialised from JSON and
    /// the like) holding `[parallel]`, `[train]` and `[output]` for a network and data set built
    /// in code (`model`, `data`): every key a config file may hold, read and checked as a
    /// file's are (relative paths against `base`). A front end's one entry into the configuration (the Python
    /// package's `Model.train` and `AutoParallel` write these keys).
    pub fn for_network(
        root: Table,
        base: &Path,
        model: ModelConfig,
        data: DataConfig,
    ) -> Result<TrainConfig, RuntimeError> {
        sections::for_network(root, base, model, data)
    }

    /// A config from its sections, for programs that build one in code (see
    /// [`crate::Trainer`]); the optimizer's hyperparameters are checked as a file's would be.
    pub fn from_parts(
        model: ModelConfig,
        data: DataConfig,
        parallel: ParallelConfig,
        optimizer: OptimizerConfig,
        train: TrainLoopConfig,
        output: OutputConfig,
    ) -> Result<TrainConfig, RuntimeError> {
        optimizer.validate()?;
        if data.batch_size == 0 {
            return Err(RuntimeError::Config {
                key: "data.batch_size".to_string(),
                reason: "0 is out of range: it must be ≥ 1".to_string(),
            });
        }
        values::check_grad_accumulation_steps(
            "train.grad_accumulation_steps",
            train.grad_accumulation_steps,
        )?;
        Ok(TrainConfig {
            micro_batch_interleave: 1,
            source: None,
            model,
            data,
            parallel,
            strategy_file: None,
            strategy_file_only_for_trainable_params: true,
            gpt_parallel: GptParallelKeys::default(),
            search: SearchKeys::default(),
            lr_schedule: crate::lr_schedule::LrSchedule::constant(optimizer.learning_rate),
            weight_decay_filter: exec::WeightDecayFilter::default(),
            optimizer,
            train,
            output,
            ps: None,
            warnings: Vec::new(),
        })
    }

    /// The same config with learning-rate schedule `schedule` (checked; its peak becomes
    /// `train.learning_rate`).
    pub fn with_lr_schedule(
        mut self,
        schedule: crate::lr_schedule::LrSchedule,
    ) -> Result<TrainConfig, RuntimeError> {
        schedule.validate()?;
        self.optimizer.learning_rate = schedule.learning_rate;
        self.lr_schedule = schedule;
        Ok(self)
    }

    /// The same config with weight-decay filter `filter`.
    pub fn with_weight_decay_filter(mut self, filter: exec::WeightDecayFilter) -> TrainConfig {
        self.weight_decay_filter = filter;
        self
    }

    /// The same config on `devices` devices (the command line's `--devices`).
    ///
    /// Prefer [`TrainConfig::load_on`] or [`TrainConfig::parse_on`], which check every key
    /// against the count; this checks the keys that depend on it again.
    pub fn with_devices(mut self, devices: usize) -> Result<TrainConfig, RuntimeError> {
        check_devices_flag(devices)?;
        if let Some(hsdp) = &self.parallel.hsdp {
            sections::check_shard_size(hsdp.shard_size, devices, "--devices")?;
        }
        self.parallel.devices = devices;
        Ok(self)
    }

    /// The file the config was read from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// `[model]`.
    pub fn model(&self) -> &ModelConfig {
        &self.model
    }

    /// `[data]`.
    pub fn data(&self) -> &DataConfig {
        &self.data
    }

    /// `[train]` without the optimizer.
    pub fn train(&self) -> &TrainLoopConfig {
        &self.train
    }

    /// `[output]`.
    pub fn output(&self) -> &OutputConfig {
        &self.output
    }

    /// `parallel.micro_batch_interleave` (MindSpore's `MicroBatchInterleaved`, 1: off): each
    /// batch is cut into this many parts (`data.batch_size` and
    /// `train.grad_accumulation_steps` as read already account for them), run at once so one
    /// part's communication overlaps another's computation, and one update is made.
    pub fn micro_batch_interleave(&self) -> usize {
        self.micro_batch_interleave
    }

    /// The parallel settings of `[parallel]` (stand-alone on 1 device when the section is
    /// absent).
    pub fn parallel_config(&self) -> ParallelConfig {
        let accumulates = self.train.grad_accumulation_steps > 1;
        ParallelConfig {
            deterministic: self.train.deterministic,
            hsdp: self.parallel.hsdp.map(|h| HsdpConfig { accumulates, ..h }),
            ..self.parallel.clone()
        }
    }

    /// `parallel.strategy_file`: a strategy file whose op strategies (MindSpore's
    /// `parallel_strategy_item`) apply to the ops `[parallel.shard]` leaves unset —
    /// MindSpore's `load_param_strategy_file`.
    pub fn strategy_file(&self) -> Option<&Path> {
        self.strategy_file.as_deref()
    }

    /// `parallel.strategy_file_only_for_trainable_params` (MindSpore's
    /// `stra_file_only_trainable_params`, default `true`): the strategy file describes only the
    /// trainable parameters (and their optimizer state), so a checkpoint saves and a resume
    /// loads only those; `false` adds the non-trainable parameters.
    pub fn strategy_file_only_for_trainable_params(&self) -> bool {
        self.strategy_file_only_for_trainable_params
    }

    /// The same config with `parallel.strategy_file_only_for_trainable_params` set to `only`.
    pub fn with_strategy_file_only_for_trainable_params(mut self, only: bool) -> TrainConfig {
        self.strategy_file_only_for_trainable_params = only;
        self
    }

    /// `[parallel]`'s MindFormers keys (the GPT's strategies).
    pub fn gpt_parallel(&self) -> GptParallelKeys {
        self.gpt_parallel
    }

    /// `[parallel]`'s automatic-parallel keys (device profile, memory and time budgets,
    /// operator strategy files).
    pub fn search(&self) -> &SearchKeys {
        &self.search
    }

    /// The same config with `search` as its automatic-parallel keys (the command line's
    /// `--profile`).
    pub fn with_search(mut self, search: SearchKeys) -> TrainConfig {
        self.search = search;
        self
    }

    /// The same config with `parallel` as its parallel settings (after a search fills in
    /// strategies).
    pub fn with_parallel(mut self, parallel: ParallelConfig) -> TrainConfig {
        self.parallel = parallel;
        self
    }

    /// `[ps]` when `parallel.mode = "parameter_server"` (`None` in every other mode).
    pub fn ps(&self) -> Option<&PsKeys> {
        self.ps.as_ref()
    }

    /// The same config with `data.batch_size = batch` (a parameter-server worker's share of
    /// the global batch).
    pub fn with_batch_size(mut self, batch: usize) -> Result<TrainConfig, RuntimeError> {
        if batch == 0 {
            return Err(RuntimeError::Config {
                key: "data.batch_size".to_string(),
                reason: "0 is out of range: it must be ≥ 1".to_string(),
            });
        }
        self.data.batch_size = batch;
        Ok(self)
    }

    /// The optimizer of `[train]`.
    pub fn optimizer_config(&self) -> OptimizerConfig {
        self.optimizer
    }

    /// The learning-rate schedule (`train.lr_schedule` and its keys; `constant` by default).
    pub fn lr_schedule(&self) -> &crate::lr_schedule::LrSchedule {
        &self.lr_schedule
    }

    /// The weight-decay filter (`train.no_weight_decay` beside MindSpore's default).
    pub fn weight_decay_filter(&self) -> &exec::WeightDecayFilter {
        &self.weight_decay_filter
    }

    /// Keys that are valid but have no effect in this config (e.g. `train.momentum` with
    /// `optimizer = "adam"`), or whose value the run caps or skips (`parallel.hsdp.shard_size`
    /// of 1, above or not dividing a parameter's replicas), one sentence each, for the command
    /// line to print. Includes the ones that depend on the device count, which `--devices` may
    /// have changed.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = self.warnings.clone();
        out.extend(self.unused_data_parallel());
        out.extend(self.unused_hsdp());
        out.extend(self.shard_size_warning().map(|w| w.text));
        out
    }

    /// [`TrainConfig::warnings`]'s sentence about `parallel.hsdp.shard_size`, with what it
    /// covers (the session adds the caps only the compiled layout shows, `session::warnings`).
    pub(crate) fn shard_size_warning(&self) -> Option<sections::ShardSizeWarning> {
        if self.ps.is_some() {
            return None;
        }
        let gpt_mp = (self.model.name == ModelName::Gpt
            && self.parallel.mode == ParallelMode::SemiAuto)
            .then_some(self.gpt_parallel.model_parallel);
        sections::shard_size_warning(&self.parallel, gpt_mp)
    }

    /// `[parallel.hsdp]` on one device (outside `stand_alone`, which is reported when the file
    /// is read): no parameter has a replica to shard it with.
    fn unused_hsdp(&self) -> Option<String> {
        let applies = self.parallel.hsdp.is_some()
            && self.parallel.mode != ParallelMode::StandAlone
            && self.parallel.devices == 1;
        applies.then(|| {
            format!(
                "[parallel.hsdp] has no effect on 1 device (mode \"{}\"): no parameter has a \
                 replica to shard its optimizer state with",
                self.parallel.mode.name()
            )
        })
    }

    /// The search keys `tessera plan` reads in every mode but a training run reads only in a
    /// search mode (which plans before it trains): in another mode `tessera train` ignores
    /// them, one sentence each for it to print beside [`TrainConfig::warnings`].
    pub fn train_warnings(&self) -> Vec<String> {
        if matches!(self.parallel.mode, ParallelMode::Auto(_)) || self.ps.is_some() {
            return Vec::new();
        }
        let defaults = SearchKeys::default();
        let set = [
            (
                "device_profile",
                self.search.device_profile != defaults.device_profile,
            ),
            ("max_device_memory", self.search.max_device_memory.is_some()),
            (
                "save_operator_strategy_file",
                self.search.save_operator_strategy_file.is_some(),
            ),
        ];
        set.iter()
            .filter(|(_, given)| *given)
            .map(|(key, _)| {
                format!(
                    "parallel.{key} has no effect on training in mode \"{}\" (a search mode \
                     plans with it before training; `tessera plan` reads it in any mode)",
                    self.parallel.mode.name()
                )
            })
            .collect()
    }

    /// `parallel.data_parallel` when semi_auto does not use it: with model and context
    /// parallel 1, every device of a stage is a data-parallel shard, whatever the key says.
    fn unused_data_parallel(&self) -> Option<String> {
        let keys = self.gpt_parallel;
        let given = keys.data_parallel?;
        let devices = self.parallel.devices_per_stage();
        let staged = self
            .parallel
            .pipeline
            .as_ref()
            .is_some_and(|p| p.stages > 1);
        let applies = self.model.name == ModelName::Gpt
            && self.parallel.mode == ::parallel::ParallelMode::SemiAuto
            && keys.model_parallel == 1
            && keys.context_parallel == 1
            // More stages than devices leave none per stage: the pipeline check refuses that.
            && devices > 0
            && given != devices;
        applies.then(|| {
            format!(
                "parallel.data_parallel = {given} is not used: with model_parallel and context_parallel 1 every one of the {devices} devices{} is a data-parallel shard",
                if staged { " of a pipeline stage" } else { "" }
            )
        })
    }
}

/// A `Config` error, or a `ConfigFile` error when it comes from a file.
/// Checks the command line's `--devices` count.
fn check_devices_flag(devices: usize) -> Result<(), RuntimeError> {
    if devices == 0 {
        return Err(RuntimeError::Config {
            key: "--devices".to_string(),
            reason: "0 is out of range: it must be ≥ 1".to_string(),
        });
    }
    values::check_device_count("--devices", devices)
}

fn in_source(source: Option<&Path>, key: &str, reason: String) -> RuntimeError {
    match source {
        Some(path) => RuntimeError::ConfigFile {
            path: path.to_path_buf(),
            key: key.to_string(),
            reason,
        },
        None => RuntimeError::Config {
            key: key.to_string(),
            reason,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::sections::{
        DATA_KEYS, HSDP_KEYS, MODEL_KEYS, OUTPUT_KEYS, PARALLEL_KEYS, TRAIN_KEYS,
    };
    use super::*;

    /// Every key of every section is documented in docs/CONFIG.md as `section.key`.
    #[test]
    fn config_md_documents_every_key() {
        let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/CONFIG.md");
        let doc = std::fs::read_to_string(&doc_path).unwrap();
        let sections = [
            ("model", MODEL_KEYS),
            ("data", DATA_KEYS),
            ("parallel", PARALLEL_KEYS),
            ("train", TRAIN_KEYS),
            ("output", OUTPUT_KEYS),
        ];
        assert_eq!(sections.map(|(name, _)| name), SECTIONS[..5]);
        let sections = [
            sections[0],
            sections[1],
            sections[2],
            sections[3],
            sections[4],
            ("ps", super::ps::PS_KEYS),
        ];
        let subsections = [
            ("hsdp", HSDP_KEYS),
            ("recompute", super::memory::RECOMPUTE_KEYS),
            ("comm_fusion", super::memory::COMM_FUSION_KEYS),
            ("overlap", super::memory::OVERLAP_KEYS),
        ];
        for (subsection, keys) in subsections {
            for key in keys {
                let documented = format!("`parallel.{subsection}.{key}`");
                assert!(
                    doc.contains(&documented),
                    "docs/CONFIG.md lacks {documented}"
                );
            }
        }
        for (section, keys) in sections {
            for key in keys {
                let documented = format!("`{section}.{key}`");
                assert!(
                    doc.contains(&documented),
                    "docs/CONFIG.md lacks {documented}"
                );
            }
        }
    }
}
