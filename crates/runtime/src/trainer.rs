//! [`Trainer`]: training a network built in code on any [`Dataset`], MindSpore's
//! `Model(net, loss, opt).train(…, callbacks=[…])`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use exec::{OptimizerConfig, OptimizerKind};
use graph::models::Model;
use parallel::ParallelConfig;

use crate::callbacks::{Callback, CallbackList};
use crate::config::{
    DataConfig, DataFormat, ModelConfig, ModelName, OutputConfig, TrainConfig, TrainLoopConfig,
};
use crate::data::{Dataset, Normalize};
use crate::error::RuntimeError;
use crate::launch::{train_local_with, LaunchOptions, TrainReport};
use crate::session::{Session, TrainSession};

/// Trains a [`Model`] built with [`graph::GraphBuilder`] on any [`Dataset`] (or an IDX data set
/// by its directory), on the devices and with the strategies of a [`ParallelConfig`]: the
/// settings a config file would hold, with defaults (Momentum 0.9, learning rate 0.05, one
/// epoch, seed 1, checkpoints saved). The caller's [`Callback`]s see every step on rank 0.
///
/// ```no_run
/// # use runtime::{OptimizerConfig, Trainer};
/// # fn demo(model: graph::models::Model) -> Result<(), runtime::RuntimeError> {
/// let parallel = parallel::ParallelConfig::new(parallel::ParallelMode::SemiAuto, 8)
///     .shard("fc1.matmul", &[&[2, 4], &[1, 4]]);
/// let report = Trainer::new(model, parallel, "data/digits").epochs(3).train()?;
/// println!("accuracy {:?}", report.accuracies().last());
/// # Ok(()) }
/// ```
pub struct Trainer {
    model: Model,
    parallel: ParallelConfig,
    data: TrainerData,
    classes: usize,
    optimizer: OptimizerConfig,
    train: TrainLoopConfig,
    output: OutputConfig,
    shuffle: bool,
    print_loss: bool,
    callbacks: CallbackList,
    columns: Option<Vec<graph::ValueId>>,
}

/// What a [`Trainer`] trains on.
#[derive(Debug, Clone)]
enum TrainerData {
    /// The IDX training and test splits in this directory.
    Idx(PathBuf),
    /// A caller's data sets.
    Samples {
        /// The training set.
        train: Arc<dyn Dataset>,
        /// The test set, evaluated after every epoch.
        test: Option<Arc<dyn Dataset>>,
    },
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("model", &self.model)
            .field("parallel", &self.parallel)
            .field("data", &self.data)
            .field("classes", &self.classes)
            .field("optimizer", &self.optimizer)
            .field("train", &self.train)
            .field("output", &self.output)
            .field("shuffle", &self.shuffle)
            .field("print_loss", &self.print_loss)
            .field("callbacks", &self.callbacks.len())
            .field("columns", &self.columns)
            .finish()
    }
}

impl Trainer {
    /// A trainer of `model` under `parallel` on the IDX data set in `data_dir` (its training
    /// split, and its test split for the accuracy after every epoch).
    pub fn new(model: Model, parallel: ParallelConfig, data_dir: impl AsRef<Path>) -> Trainer {
        Trainer::on(
            model,
            parallel,
            TrainerData::Idx(data_dir.as_ref().to_path_buf()),
        )
    }

    /// A trainer of `model` under `parallel` on `train`, any [`Dataset`] whose samples the
    /// model's data input takes (its batch: the input's first dim). Without a
    /// [`Trainer::test_dataset`] nothing is evaluated.
    pub fn with_dataset(
        model: Model,
        parallel: ParallelConfig,
        train: impl Dataset + 'static,
    ) -> Trainer {
        let data = TrainerData::Samples {
            train: Arc::new(train),
            test: None,
        };
        Trainer::on(model, parallel, data)
    }

    fn on(model: Model, parallel: ParallelConfig, data: TrainerData) -> Trainer {
        let classes = model.graph.values()[model.logits.0]
            .shape
            .last()
            .copied()
            .unwrap_or(1);
        Trainer {
            model,
            parallel,
            data,
            classes,
            optimizer: OptimizerConfig {
                kind: OptimizerKind::Momentum {
                    momentum: 0.9,
                    use_nesterov: false,
                },
                learning_rate: 0.05,
                weight_decay: 0.0,
            },
            train: TrainLoopConfig {
                epochs: 1,
                max_steps: None,
                grad_accumulation_steps: 1,
                seed: 1,
                deterministic: false,
                eval: true,
                eval_interval: None,
                per_print_times: 1,
                print_local_norm: false,
                dump_local_norm: None,
                precision: exec::Precision::F32,
                loss_scale: None,
                parameter_broadcast: false,
                lazy_init: false,
                threads_per_rank: 1,
                max_grad_norm: None,
                elastic: None,
            },
            output: OutputConfig {
                dir: PathBuf::from("runs/custom"),
                save_checkpoint: true,
                save_checkpoint_steps: None,
                save_checkpoint_seconds: None,
                keep_checkpoint_max: 5,
                resume_from: None,
                resume_strategy: None,
                group_info_file: None,
            },
            shuffle: true,
            print_loss: true,
            callbacks: CallbackList::new(),
            columns: None,
        }
    }

    /// The test set whose accuracy is evaluated after every epoch (of a trainer
    /// [`Trainer::with_dataset`]; an IDX trainer evaluates on its test split).
    pub fn test_dataset(mut self, test: impl Dataset + 'static) -> Trainer {
        if let TrainerData::Samples { test: slot, .. } = &mut self.data {
            *slot = Some(Arc::new(test));
        }
        self
    }

    /// The graph input each column of the data set feeds, positionally: column `j` into
    /// `columns[j]` (of a trainer [`Trainer::with_dataset`] on a data set of any number of
    /// columns, [`Dataset::columns`]; by default its two columns feed the model's data input
    /// and labels). Every graph input must be bound to one column ([`TrainSession::with_columns`]).
    pub fn columns(mut self, columns: Vec<graph::ValueId>) -> Trainer {
        self.columns = Some(columns);
        self
    }

    /// Adds `callback`, which sees every step, evaluation and epoch of the run and its end
    /// (on rank 0, after the loss lines), as MindSpore's `Model.train(…, callbacks=[…])`.
    pub fn callback(mut self, callback: impl Callback + 'static) -> Trainer {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Whether each epoch visits the training samples in a seeded shuffled order (default
    /// yes) or in order.
    pub fn shuffle(mut self, shuffle: bool) -> Trainer {
        self.shuffle = shuffle;
        self
    }

    /// The optimizer (default: Momentum 0.9 at learning rate 0.05).
    pub fn optimizer(mut self, optimizer: OptimizerConfig) -> Trainer {
        self.optimizer = optimizer;
        self
    }

    /// Passes over the training set (default 1).
    pub fn epochs(mut self, epochs: usize) -> Trainer {
        self.train.epochs = epochs;
        self
    }

    /// Stop after this many steps in all.
    pub fn max_steps(mut self, steps: u64) -> Trainer {
        self.train.max_steps = Some(steps);
        self
    }

    /// Micro-batches per optimizer step (`train.grad_accumulation_steps`, default 1): each step
    /// updates once with the mean gradient of this many consecutive batches.
    pub fn grad_accumulation_steps(mut self, steps: usize) -> Trainer {
        self.train.grad_accumulation_steps = steps;
        self
    }

    /// The seed of the initial values and the shuffles (default 1).
    pub fn seed(mut self, seed: u64) -> Trainer {
        self.train.seed = seed;
        self
    }

    /// Deterministic mode (`train.deterministic`, default off): every sum in a canonical
    /// order, so a run on any number of devices is bitwise one device's.
    pub fn deterministic(mut self, deterministic: bool) -> Trainer {
        self.train.deterministic = deterministic;
        self
    }

    /// Where checkpoints, strategy files and the metrics log go (default `runs/custom`).
    pub fn output_dir(mut self, dir: impl AsRef<Path>) -> Trainer {
        self.output.dir = dir.as_ref().to_path_buf();
        self
    }

    /// Whether to print MindSpore's loss lines (default yes).
    pub fn print_loss(mut self, print: bool) -> Trainer {
        self.print_loss = print;
        self
    }

    /// The equivalent configuration (of a trainer on a caller's data set, `[data]` names no
    /// directory).
    pub fn config(&self) -> Result<TrainConfig, RuntimeError> {
        let batch_size = self.model.graph.values()[self.model.input.0]
            .shape
            .first()
            .copied()
            .unwrap_or(1);
        TrainConfig::from_parts(
            ModelConfig {
                name: ModelName::Custom,
                hidden: 0,
                classes: self.classes,
                gpt: None,
            },
            DataConfig {
                format: DataFormat::Idx,
                dir: match &self.data {
                    TrainerData::Idx(dir) => dir.clone(),
                    TrainerData::Samples { .. } => PathBuf::new(),
                },
                batch_size,
                shuffle: self.shuffle,
                pixel_max: None,
                normalize: Normalize::Standardize,
                text: None,
                batch_cuts: Vec::new(),
            },
            self.parallel.clone(),
            self.optimizer,
            self.train.clone(),
            self.output.clone(),
        )
    }

    /// The run these settings describe, ready to train: its session built (the network
    /// compiled for the devices, the data opened) and its launch options.
    pub fn build(self) -> Result<Training, RuntimeError> {
        // `train_local` creates the output directory (`check_before_start`).
        let config = self.config()?;
        let session = match self.data {
            TrainerData::Idx(_) if self.columns.is_some() => {
                return Err(RuntimeError::Config {
                    key: "columns".to_string(),
                    reason: "Trainer::columns binds the columns of a data set given to \
                             Trainer::with_dataset; the IDX data set's two columns feed the \
                             model's data input and labels"
                        .to_string(),
                })
            }
            TrainerData::Idx(_) => Session::with_model(&config, self.model)?.into_train_session(),
            TrainerData::Samples { train, test } => match self.columns {
                None => TrainSession::with_dataset(&config, self.model, train, test)?,
                Some(columns) => {
                    TrainSession::with_columns(&config, self.model, columns, train, test)?
                }
            },
        };
        let options = LaunchOptions {
            print_loss: self.print_loss,
            metrics_log: Some(config.output().metrics_file()),
            ..LaunchOptions::default()
        };
        Ok(Training {
            session,
            options,
            callbacks: self.callbacks,
        })
    }

    /// Trains on the local backend (one thread per device) and reports every step.
    pub fn train(self) -> Result<TrainReport, RuntimeError> {
        self.build()?.train_local()
    }
}

/// A run ready to train: a [`TrainSession`], how the run reports ([`LaunchOptions`]) and the
/// caller's callbacks. [`Trainer::build`] makes one for a network built in code,
/// [`Training::from_config`] for a configuration's built-in model and data (what `tessera
/// train` runs): both train through [`Training::train_local`] (or `train_mpi`).
pub struct Training {
    session: TrainSession,
    options: LaunchOptions,
    callbacks: CallbackList,
}

impl std::fmt::Debug for Training {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Training")
            .field("session", &self.session)
            .field("options", &self.options)
            .field("callbacks", &self.callbacks.len())
            .finish()
    }
}

impl Training {
    /// The run of `config`'s built-in model on its data ([`Session::new`]), with the default
    /// launch options and its metrics log in `output.dir`.
    pub fn from_config(config: &TrainConfig) -> Result<Training, RuntimeError> {
        Ok(Training {
            session: Session::new(config)?.into_train_session(),
            options: LaunchOptions {
                metrics_log: Some(config.output().metrics_file()),
                ..LaunchOptions::default()
            },
            callbacks: CallbackList::new(),
        })
    }

    /// The session it trains (its programs, for explaining the run before training it).
    pub fn session(&self) -> &TrainSession {
        &self.session
    }

    /// How the run reports and how long a collective may wait.
    pub fn options(mut self, options: LaunchOptions) -> Training {
        self.options = options;
        self
    }

    /// Adds `callback` (see [`Trainer::callback`]).
    pub fn callback(mut self, callback: impl Callback + 'static) -> Training {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Trains with one thread per device (the `local` backend); the callbacks run on rank 0.
    pub fn train_local(self) -> Result<TrainReport, RuntimeError> {
        train_local_with(&self.session, &self.options, self.callbacks)
    }

    /// Trains this process's rank of an `mpirun` job (the `mpi` backend); the callbacks run on
    /// this process's rank.
    #[cfg(feature = "mpi")]
    pub fn train_mpi(self) -> Result<TrainReport, RuntimeError> {
        crate::launch::train_mpi_with(&self.session, &self.options, self.callbacks)
    }
}
