//! Building a session: the model (a built-in one, or a network built in code) and its data,
//! the parallel configuration and search, and the training and evaluation programs.

use std::sync::Arc;

use exec::Precision;
use graph::models::{seed_mlp, Model};
use parallel::memory::TrainingState;
use parallel::{check_deterministic, compile_forward, compile_training, ParallelConfig, Program};

use super::{Session, SessionData, TrainData, TrainSession};
use crate::config::{ModelName, TrainConfig};
use crate::data::{Dataset, IdxDataset, SampleSpec};
use crate::error::RuntimeError;
use crate::lm::gpt_parallel_config;

/// Deterministic mode's refusal `error` of a strategy in a search mode: the searches choose
/// only splits the canonical blocks (`blocks`) can serve, so the split refused is one they
/// kept as given (`[parallel.shard]`, or loaded from `parallel.load_operator_strategy_file`);
/// the advice is that strategy or the blocks' count, naming `parallel.deterministic_blocks`.
fn searched_split_refused(
    config: &TrainConfig,
    blocks: usize,
    error: parallel::ParallelError,
) -> RuntimeError {
    let mode = config.parallel_config().mode;
    if !matches!(mode, parallel::ParallelMode::Auto(_)) {
        return name_default_strategy(config, error).into();
    }
    RuntimeError::Config {
        key: "parallel.deterministic_blocks".to_string(),
        reason: format!(
            "{error}; in deterministic mode the search (parallel.mode = \"{}\") chooses only \
             splits the canonical blocks can serve, so this split is one it kept as given \
             ([parallel.shard], or parallel.load_operator_strategy_file): change that strategy, \
             or raise parallel.deterministic_blocks (now {blocks}) to a multiple of the split",
            mode.name()
        ),
    }
}

/// A global batch larger than the training set (of `n_samples`, `what`: where they are) is
/// refused before anything batch-sized is built or allocated.
fn check_batch_fits(
    config: &TrainConfig,
    n_samples: usize,
    what: &dyn std::fmt::Display,
) -> Result<(), RuntimeError> {
    let batch_size = config.data().batch_size;
    if batch_size > n_samples {
        return Err(RuntimeError::Config {
            key: "data.batch_size".to_string(),
            reason: format!(
                "{batch_size} is larger than the training set ({n_samples} samples in {what}); the global batch must fit in the data",
            ),
        });
    }
    let micro_steps = config.train().grad_accumulation_steps;
    if batch_size.saturating_mul(micro_steps) > n_samples {
        return Err(RuntimeError::Config {
            key: "train.grad_accumulation_steps".to_string(),
            reason: format!(
                "{micro_steps} micro-batches of data.batch_size = {batch_size} take more samples per step than the training set holds ({n_samples} in {what}); an optimizer step's samples must fit in the data",
            ),
        });
    }
    Ok(())
}

/// The IDX training and test splits of `[data]`, the batch checked against the training split.
fn open_idx(config: &TrainConfig) -> Result<(IdxDataset, IdxDataset), RuntimeError> {
    let data = config.data();
    let (train_data, test_data) =
        IdxDataset::open_train_and_test(&data.dir, data.pixel_max, data.normalize)?;
    check_batch_fits(
        config,
        train_data.len(),
        &train_data.images_path().display(),
    )?;
    Ok((train_data, test_data))
}

/// Checks that `model`'s data input takes `data.batch_size` samples of `input` (`what`: what
/// the samples are, for the message).
fn check_model_input(
    config: &TrainConfig,
    model: &Model,
    input: &SampleSpec,
    what: &str,
) -> Result<(), RuntimeError> {
    let value = &model.graph.values()[model.input.0];
    let mut expected = vec![config.data().batch_size];
    expected.extend(&input.shape);
    if value.shape != expected {
        return Err(RuntimeError::Mismatch {
            what: format!("the model's data input {}", value.name),
            expected: format!("shape {expected:?} (data.batch_size and {what})"),
            got: format!("shape {:?}", value.shape),
        });
    }
    Ok(())
}

/// Checks that `columns` binds every graph input of `model` to one column of `data` (`what`:
/// the data set, for the messages): as many bound inputs as the data set has columns, each a
/// graph input bound once, and each taking `data.batch_size` samples of its column's shape and
/// dtype. Column 0 bound to the model's data input is checked as [`check_model_input`] does.
fn check_columns(
    config: &TrainConfig,
    model: &Model,
    columns: &[graph::ValueId],
    data: &dyn Dataset,
    what: &str,
) -> Result<(), RuntimeError> {
    let graph = &model.graph;
    let name = |v: graph::ValueId| {
        graph
            .values()
            .get(v.0)
            .map_or_else(|| format!("value {}", v.0), |value| value.name.clone())
    };
    if columns.len() != data.columns() {
        return Err(RuntimeError::Mismatch {
            what: format!("the graph inputs bound to the columns of {what}"),
            expected: format!("{} (one per column of {what})", data.columns()),
            got: format!(
                "{} ({:?})",
                columns.len(),
                columns.iter().map(|&v| name(v)).collect::<Vec<_>>()
            ),
        });
    }
    for (j, &v) in columns.iter().enumerate() {
        if !graph.inputs().contains(&v) {
            return Err(RuntimeError::Mismatch {
                what: format!("column {j} of {what}"),
                expected: "bound to an input of the model's graph".to_string(),
                got: format!("{}, not a graph input", name(v)),
            });
        }
        if let Some(k) = columns[..j].iter().position(|&u| u == v) {
            return Err(RuntimeError::Mismatch {
                what: format!("the graph input {}", name(v)),
                expected: "one column bound to it".to_string(),
                got: format!("columns {k} and {j} of {what}"),
            });
        }
    }
    if let Some(&free) = graph.inputs().iter().find(|v| !columns.contains(v)) {
        return Err(RuntimeError::Mismatch {
            what: format!("the graph input {}", name(free)),
            expected: format!("a column of {what} bound to it"),
            got: format!(
                "none (the {} column(s) feed {:?})",
                columns.len(),
                columns.iter().map(|&v| name(v)).collect::<Vec<_>>()
            ),
        });
    }
    for (j, &v) in columns.iter().enumerate() {
        let spec = data.column_spec(j).ok_or_else(|| RuntimeError::Mismatch {
            what: format!("column {j} of {what}"),
            expected: "its sample shape and dtype (Dataset::column_spec)".to_string(),
            got: "none".to_string(),
        })?;
        if j == 0 && v == model.input {
            check_model_input(config, model, &spec, what)?;
        }
        let value = &graph.values()[v.0];
        let mut expected = vec![config.data().batch_size];
        expected.extend(&spec.shape);
        if value.shape != expected || value.dtype != spec.dtype {
            return Err(RuntimeError::Mismatch {
                what: format!("the graph input {} (column {j} of {what})", value.name),
                expected: format!(
                    "shape {expected:?} and dtype {} (data.batch_size and the column's samples)",
                    spec.dtype
                ),
                got: format!("shape {:?} and dtype {}", value.shape, value.dtype),
            });
        }
    }
    Ok(())
}

impl Session {
    /// Builds the configured built-in model and its programs for `config`, reading the data's
    /// headers (for text, the whole text; token files are indexed).
    pub fn new(config: &TrainConfig) -> Result<Session, RuntimeError> {
        Session::open(config, true)
    }

    /// [`Session::new`] for planning (`tessera plan`'s memory prediction): the same model,
    /// search and training program, with the same errors, but the evaluation program is not
    /// compiled (at thousands of devices a third of the compile). The session predicts memory
    /// ([`TrainSession::predict_memory_per_stage`]) and describes its placement; it cannot
    /// train ([`crate::check_before_start`] refuses it), and its `eval` is the training program.
    pub fn for_planning(config: &TrainConfig) -> Result<Session, RuntimeError> {
        Session::open(config, false)
    }

    /// [`Session::new`], the evaluation program compiled only `with_eval`.
    fn open(config: &TrainConfig, with_eval: bool) -> Result<Session, RuntimeError> {
        let session = Session::new_built_in(config, with_eval)
            .map_err(|e| config.data().explain_batch_error(e))?;
        // The schedule against the run's length, known now that the data is open: before any
        // rank starts (and in `--explain`), not from rank 0 once the run has begun.
        config
            .lr_schedule()
            .check_run_steps(session.planned_steps())?;
        Ok(session)
    }

    /// [`Session::new`], its errors as they come.
    fn new_built_in(config: &TrainConfig, with_eval: bool) -> Result<Session, RuntimeError> {
        // Before any model is built: a GPT's strategies divide each stage's devices.
        config.parallel_config().validate_pipeline()?;
        crate::preflight::check_config_paths(config, true)?;
        if config.model().name == ModelName::Gpt {
            return Session::new_gpt(config, with_eval);
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
        let (train_data, test_data) = open_idx(config)?;
        let data = config.data();
        let model = seed_mlp(
            data.batch_size,
            &train_data.image_shape(),
            config.model().hidden,
            config.model().classes,
        )?;
        Session::build(config, model, train_data, test_data, with_eval)
    }

    /// A session training `model` (a network built with [`graph::GraphBuilder`], its data and
    /// labels inputs, logits and loss) under `config`; the model's data input must take the
    /// data set's images (`[batch, rows, cols]`) and its batch must be `data.batch_size`.
    pub fn with_model(config: &TrainConfig, model: Model) -> Result<Session, RuntimeError> {
        crate::preflight::check_config_paths(config, true)?;
        let (train_data, test_data) = open_idx(config)?;
        check_model_input(config, &model, &train_data.input_spec(), "the images")?;
        Session::build(config, model, train_data, test_data, true)
    }

    fn build(
        config: &TrainConfig,
        model: Model,
        train_data: IdxDataset,
        test_data: IdxDataset,
        with_eval: bool,
    ) -> Result<Session, RuntimeError> {
        let classes = config.model().classes;
        train_data.validate_labels(classes)?;
        test_data.validate_labels(classes)?;
        let (train_data, test_data) = (Arc::new(train_data), Arc::new(test_data));
        let samples = SessionData::Samples {
            train: train_data.clone(),
            test: Some(test_data.clone()),
            columns: vec![model.input, model.labels],
        };
        Ok(Session {
            session: TrainSession::compile_samples(config, model, samples, with_eval)?,
            data: TrainData::Images {
                train: train_data,
                test: test_data,
            },
        })
    }

    /// The GPT of `[model]` on the text of `[data]`, with its cells' strategies (its
    /// evaluation program only `with_eval`).
    fn new_gpt(config: &TrainConfig, with_eval: bool) -> Result<Session, RuntimeError> {
        let (text, gpt, model) = crate::auto::open_gpt(config)?;
        let packed = crate::auto::packed_alternative(config, &gpt)?;
        let text = Arc::new(text);
        let session = within_memory_budget(|search_budget| {
            let packed = packed.as_ref().map(|(gpt, model)| (gpt, model));
            let (gpt, model, parallel, searched) =
                search_gpt(config, (&gpt, &model), packed, search_budget)?;
            let model = model.clone();
            let parallel = gpt_parallel_config(config, gpt, &model, parallel)?;
            let named = |e| name_shard_key(config, e);
            let train = compile_training(&model.graph, model.loss, &parallel).map_err(named)?;
            let eval = match with_eval {
                true => {
                    Some(compile_forward(&model.graph, &[model.loss], &parallel).map_err(named)?)
                }
                false => None,
            };
            let data = SessionData::Text(text.clone());
            let mut session = TrainSession::assemble(config, &parallel, model, train, eval, data)?;
            session.searched = searched;
            Ok(session)
        })?;
        Ok(Session {
            session,
            data: TrainData::Text(text),
        })
    }
}

impl TrainSession {
    /// A session training `model` (a network built with [`graph::GraphBuilder`], or any other
    /// [`Model`]: its data and labels inputs, logits and loss) on `train` under `config`,
    /// evaluating the accuracy on `test` after every epoch when given (and `train.eval`).
    /// The model's data input must take `data.batch_size` samples of `train`'s input shape;
    /// `config`'s `[data]` section is read for the batch size and the shuffle only.
    pub fn with_dataset(
        config: &TrainConfig,
        model: Model,
        train: Arc<dyn Dataset>,
        test: Option<Arc<dyn Dataset>>,
    ) -> Result<TrainSession, RuntimeError> {
        let columns = vec![model.input, model.labels];
        TrainSession::with_columns(config, model, columns, train, test)
    }

    /// A session training `model` on `train`, a data set of any number of columns fed
    /// positionally (MindSpore's datasets of `k` columns given to a network's
    /// `construct(c1, ..., ck)`): column `j` of each sample into the graph input `columns[j]`.
    /// Every graph input must be bound to exactly one column, and take `data.batch_size`
    /// samples of its column's shape and dtype; the loss is any scalar of the graph (the
    /// model's labels and logits are not needed to train). A test set (its accuracy after
    /// every epoch) needs the model's labels input among `columns` and the same columns as
    /// `train`.
    pub fn with_columns(
        config: &TrainConfig,
        model: Model,
        columns: Vec<graph::ValueId>,
        train: Arc<dyn Dataset>,
        test: Option<Arc<dyn Dataset>>,
    ) -> Result<TrainSession, RuntimeError> {
        crate::preflight::check_config_paths(config, false)?;
        check_batch_fits(config, train.len(), &"the training data set")?;
        check_columns(
            config,
            &model,
            &columns,
            train.as_ref(),
            "the data set's samples",
        )?;
        if let Some(test) = &test {
            if !columns.contains(&model.labels) {
                return Err(RuntimeError::Mismatch {
                    what: "the test data set's accuracy".to_string(),
                    expected: format!(
                        "the model's labels input {} bound to a column",
                        model.graph.values()[model.labels.0].name
                    ),
                    got: "no column bound to it".to_string(),
                });
            }
            let two = train.columns() == 2 && test.columns() == 2;
            if two
                && (test.input_spec() != train.input_spec()
                    || test.label_spec() != train.label_spec())
            {
                return Err(RuntimeError::Mismatch {
                    what: "the test data set's samples".to_string(),
                    expected: format!(
                        "the training set's: inputs {:?}, labels {:?}",
                        train.input_spec(),
                        train.label_spec()
                    ),
                    got: format!(
                        "inputs {:?}, labels {:?}",
                        test.input_spec(),
                        test.label_spec()
                    ),
                });
            }
            let specs = |d: &dyn Dataset| {
                (0..d.columns())
                    .map(|j| d.column_spec(j))
                    .collect::<Vec<_>>()
            };
            if specs(test.as_ref()) != specs(train.as_ref()) {
                return Err(RuntimeError::Mismatch {
                    what: "the test data set's columns".to_string(),
                    expected: format!("the training set's: {:?}", specs(train.as_ref())),
                    got: format!("{:?}", specs(test.as_ref())),
                });
            }
        }
        let data = SessionData::Samples {
            train,
            test,
            columns,
        };
        TrainSession::compile_samples(config, model, data, true)
    }

    /// The programs of a classifier trained on samples: the training program of its loss,
    /// the evaluation program of its logits (only `with_eval`).
    fn compile_samples(
        config: &TrainConfig,
        model: Model,
        data: SessionData,
        with_eval: bool,
    ) -> Result<TrainSession, RuntimeError> {
        within_memory_budget(|search_budget| {
            let model = model.clone();
            let mut parallel = parallel_config(config, &model)?;
            let searched =
                crate::auto::apply_search(config, (&model, None), &mut parallel, search_budget)?;
            let named = |e| name_shard_key(config, e);
            let train = compile_training(&model.graph, model.loss, &parallel).map_err(named)?;
            let eval = match with_eval {
                true => {
                    Some(compile_forward(&model.graph, &[model.logits], &parallel).map_err(named)?)
                }
                false => None,
            };
            let data = data.clone();
            let mut session = TrainSession::assemble(config, &parallel, model, train, eval, data)?;
            session.searched = searched;
            Ok(session)
        })
    }

    /// The session of its compiled programs; without `eval` (planning only) its `eval` is the
    /// training program.
    fn assemble(
        config: &TrainConfig,
        parallel: &ParallelConfig,
        model: Model,
        train: Program,
        eval: Option<Program>,
        data: SessionData,
    ) -> Result<TrainSession, RuntimeError> {
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
            let searched = |e| searched_split_refused(config, blocks, e);
            check_deterministic(&train, blocks).map_err(searched)?;
            if let Some(eval) = &eval {
                check_deterministic(eval, blocks).map_err(searched)?;
            }
        }
        let train = Arc::new(train);
        let planning_only = eval.is_none();
        let eval = eval.map_or_else(|| train.clone(), Arc::new);
        Ok(TrainSession {
            config: config.clone(),
            model,
            train,
            eval,
            data,
            checkpoint_set: std::sync::Mutex::new(None),
            latest: std::sync::OnceLock::new(),
            per_stage_memory: std::sync::OnceLock::new(),
            deterministic,
            searched: None,
            planning_only,
        })
    }

    /// Everything `rank`'s run allocates beside the training program's buffers, and those: the
    /// figure the memory available is checked against before a run starts
    /// ([`crate::check_before_start`]). `local_backend`: the ranks are threads of this process,
    /// which runs `parallel.micro_batch_interleave`'s other parts on executors of their own.
    /// `None` when [`TrainSession::predict_memory`] is.
    pub fn predict_footprint(&self, rank: usize, local_backend: bool) -> Option<RankFootprint> {
        let training = self.predict_memory(rank)?.peak;
        let bare = TrainingState {
            optimizer_tensors: 0,
            accumulation_sharded: None,
            master_weights: false,
        };
        // The evaluation executor is built, with its own copy of every parameter, when the
        // rank starts, whether or not the run evaluates; its step's buffers come only with an
        // evaluation.
        let train = self.config.train();
        let evaluation = match train.eval || train.eval_interval.is_some() {
            true => parallel::memory::predict(&self.eval, rank, bare).peak,
            false => persistent_bytes(&self.eval, rank),
        };
        // Each other interleaved part runs on an executor of its own: parameters, gradients
        // and its step's buffers, no optimizer state.
        let partners = match local_backend {
            true => self.config.micro_batch_interleave().saturating_sub(1),
            false => 0,
        };
        let interleave_parts = match partners {
            0 => 0,
            n => n.saturating_mul(parallel::memory::predict(&self.train, rank, bare).peak),
        };
        // A finished rank copies its parameters out into its outcome while its executors
        // still hold theirs.
        let returned_parameters = self
            .train
            .params
            .iter()
            .map(|p| parallel::memory::buffer_bytes(&self.train, p.buffer, rank))
            .fold(0, usize::saturating_add);
        // The matrix kernels (the `gemm` crate) keep a packing buffer of the L2 cache's size
        // on every thread that has run one, for the thread's life.
        let kernel_workspace = train
            .threads_per_rank
            .saturating_mul(tensor::kernels::l2_cache_bytes());
        // On the local backend a rank runs on a thread of its own, and the process starts a
        // watchdog thread (counted for every rank); kernel threads come on top.
        let threads = match local_backend {
            true => train.threads_per_rank.saturating_add(1),
            false => train.threads_per_rank.saturating_sub(1),
        };
        let thread_stacks = threads.saturating_mul(thread_stack_bytes());
        let executors = [(&self.eval, 1), (&self.train, 1 + partners)];
        let bookkeeping = executors
            .iter()
            .map(|(program, n)| (program.buffers.len() + program.steps.len()).saturating_mul(*n))
            .fold(0, usize::saturating_add)
            .saturating_mul(BOOKKEEPING_PER_ENTRY);
        Some(RankFootprint {
            training,
            evaluation,
            interleave_parts,
            returned_parameters,
            kernel_workspace,
            thread_stacks,
            bookkeeping,
        })
    }

    /// Whether gradient accumulation keeps only each rank's optimizer piece (`hsdp` level 2
    /// and 3, zero2, or zero1 with `parallel.hsdp.gradient_accumulation_shard`).
    pub(super) fn accumulation_sharded(&self) -> bool {
        self.config
            .parallel_config()
            .hsdp
            .is_some_and(|h| h.accumulation_sharded())
    }

    /// Whether the training program runs ring attention (a `FlashAttention` whose sequence
    /// dim is split: `parallel.context_parallel_algo = "ring"`).
    pub fn runs_ring_attention(&self) -> bool {
        self.has_kernel(|k| parallel::ring::ring_traffic(&self.train, k).is_some())
    }

    /// Whether the training program routes tokens to experts (a `MoeRoute` step).
    pub(super) fn routes_experts(&self) -> bool {
        self.has_kernel(|k| matches!(k.op, graph::Op::MoeRoute { .. }))
    }

    /// Whether some kernel step of the training program satisfies `wanted`.
    fn has_kernel(&self, wanted: impl Fn(&parallel::KernelStep) -> bool) -> bool {
        self.train.steps.iter().any(|step| match step {
            parallel::Step::Kernel(k) => wanted(k),
            parallel::Step::Reshard(_) => false,
        })
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

    /// The schedule of a pipelined session and the ranks per stage (`None` when steps are not
    /// pipelined).
    pub(super) fn pipeline_schedule(
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
    pub(super) fn output_broadcast(&self) -> bool {
        self.config
            .parallel_config()
            .pipeline
            .is_some_and(|p| p.stages > 1 && p.output_broadcast)
    }
}

/// Re-searches at most this many times for a plan within `parallel.max_device_memory`.
const RE_SEARCHES: usize = 8;

/// A GPT graph with its parallel settings and, in a search mode, its searched plan.
type SearchedGpt<'a> = (
    &'a models::GptConfig,
    &'a Model,
    ParallelConfig,
    Option<crate::session::SearchedPlan>,
);

/// `built`'s parallel settings, searched in a search mode within `search_budget`; where a
/// `packed` graph is given too ([`crate::auto::packed_alternative`]), that graph is searched as
/// well and the one whose plan predicts the shorter step is taken — `built` on a tie, or when
/// the packed graph's search fails (a `[parallel.shard]` key naming an op only `built` has);
/// its `search_ms` is both searches' time. A search mode gave plans up to 10 % slower than
/// plain data parallel's on the packed graph.
fn search_gpt<'a>(
    config: &TrainConfig,
    built: (&'a models::GptConfig, &'a Model),
    packed: Option<(&'a models::GptConfig, &'a Model)>,
    search_budget: Option<u64>,
) -> Result<SearchedGpt<'a>, RuntimeError> {
    let search = |(gpt, model): (&'a models::GptConfig, &'a Model)| {
        let mut parallel = parallel_config(config, model)?;
        let searched =
            crate::auto::apply_search(config, (model, Some(gpt)), &mut parallel, search_budget)?;
        Ok::<_, RuntimeError>((gpt, model, parallel, searched))
    };
    crate::auto::faster_plan(search(built), packed.map(search), |plan| {
        plan.3.as_mut().map(|s| &mut s.report)
    })
}

/// The session `build` makes (`build(None)`: the search kept to `parallel.max_device_memory`),
/// and, in a search mode whose plan's predicted peak exceeds that budget, the session of a
/// search kept to a tighter budget of its own estimate ([`TrainSession::tighter_search_budget`]),
/// at most [`RE_SEARCHES`] times: the search ranks strategies by an estimate that misses what
/// the compiled step adds, so a plan it found may not fit where another does. The last
/// session is returned when no tighter search finds a plan (the run's preflight then refuses
/// it, naming the key: [`TrainSession::over_memory_budget`]).
fn within_memory_budget(
    mut build: impl FnMut(Option<u64>) -> Result<TrainSession, RuntimeError>,
) -> Result<TrainSession, RuntimeError> {
    let mut session = build(None)?;
    for _ in 0..RE_SEARCHES {
        let Some(tighter) = session.tighter_search_budget()? else {
            break;
        };
        match build(Some(tighter)) {
            Ok(next) => session = next,
            // No plan's estimate fits the tighter budget: the last plan stands (refused).
            Err(_) => break,
        }
    }
    Ok(session)
}

/// `error`, when it is a strategy an op was given by a `[parallel.shard]` key, with that key
/// named (a pattern or cell key stands for ops the error names one by one); when it is one
/// `parallel.strategy_file` gave the op, with that key and file named.
pub(crate) fn name_shard_key(config: &TrainConfig, error: parallel::ParallelError) -> RuntimeError {
    let parallel::ParallelError::InvalidStrategy {
        op,
        kind,
        strategy,
        rule,
    } = error
    else {
        return error.into();
    };
    let table = config.parallel_config().strategies;
    let cell = op.strip_suffix(".matmul");
    // The most specific key naming the op, as the parallel pass picks it: its name, its
    // cell's name, a pattern over either.
    let exact = table.get_key_value(op.as_str());
    let by_cell = || cell.and_then(|c| table.get_key_value(c));
    let by_pattern = || {
        table.iter().find(|(key, _)| {
            key.contains(['*', '?'])
                && (parallel::glob_matches(key, &op)
                    || cell.is_some_and(|c| parallel::glob_matches(key, c)))
        })
    };
    let key = exact
        .or_else(by_cell)
        .or_else(by_pattern)
        // The strategy is the key's (not one a strategy file or a search gave the op).
        .filter(|(_, given)| parallel::format_strategy(&given.inputs) == strategy);
    let rule = match key {
        // An out_strategy's rule broken: the out strategy is `[parallel.out_shard]`'s.
        Some((key, given))
            if rule.starts_with("out_strategy")
                && (given.outputs.is_some() || given.out_layouts.is_some()) =>
        {
            let key = toml_key(key);
            format!(
                "{rule}; the strategy comes from parallel.shard.{key}, its out_strategy from \
                 parallel.out_shard.{key}"
            )
        }
        Some((key, _)) => format!(
            "{rule}; the strategy comes from parallel.shard.{}",
            toml_key(key)
        ),
        None => match from_strategy_file(config, &op, &strategy) {
            Some(path) => format!(
                "{rule}; the strategy comes from parallel.strategy_file {}",
                path.display()
            ),
            None => match from_operator_strategy_file(config, &op, &strategy) {
                Some((path, true)) if rule.starts_with("out_strategy") => format!(
                    "{rule}; the strategy and its out_strategy come from \
                     parallel.load_operator_strategy_file {}",
                    path.display()
                ),
                Some((path, _)) => format!(
                    "{rule}; the strategy comes from parallel.load_operator_strategy_file {}",
                    path.display()
                ),
                None => rule,
            },
        },
    };
    parallel::ParallelError::InvalidStrategy {
        op,
        kind,
        strategy,
        rule,
    }
    .into()
}

/// `error`, when deterministic mode refuses the strategy of an op no key gave one (outside
/// the GPT, whose cells take theirs from the MindFormers keys, and the search modes, whose
/// refusals name their own choice), with where that strategy comes from: the data-parallel
/// default, the batch split over the run's devices — a split the user never wrote, made by
/// the device count alone.
fn name_default_strategy(
    config: &TrainConfig,
    error: parallel::ParallelError,
) -> parallel::ParallelError {
    let parallel::ParallelError::Unsupported { op, kind, reason } = error else {
        return error;
    };
    let parallel = config.parallel_config();
    let keyed = parallel.strategies.iter().any(|(key, _)| {
        key == &op
            || op.strip_suffix(".matmul") == Some(key.as_str())
            || (key.contains(['*', '?']) && parallel::glob_matches(key, &op))
    });
    let defaulted = reason.starts_with("deterministic mode:")
        && config.model().name != ModelName::Gpt
        && matches!(
            parallel.mode,
            parallel::ParallelMode::DataParallel | parallel::ParallelMode::SemiAuto
        )
        && !keyed
        && config.strategy_file().is_none();
    let reason = match defaulted {
        true => format!(
            "{reason}; the strategy is the op's default, its batch split over the run's {} \
             devices (parallel.devices or --devices), not one a key gave it: give the op a \
             strategy in [parallel.shard], or run on another device count",
            parallel.effective_devices()
        ),
        false => reason,
    };
    parallel::ParallelError::Unsupported { op, kind, reason }
}

/// `parallel.strategy_file`, when its entry for `op` is `strategy` (as
/// [`parallel::format_strategy`] writes it): the strategy the op was given came from the file.
/// The file is read again (only on this error's path); one that cannot be read names nothing.
fn from_strategy_file<'a>(
    config: &'a TrainConfig,
    op: &str,
    strategy: &str,
) -> Option<&'a std::path::Path> {
    let path = config.strategy_file()?;
    let loaded = ckpt::Strategy::load(path).ok()?;
    loaded
        .ops
        .iter()
        .any(|o| o.name == op && parallel::format_strategy(&o.inputs) == strategy)
        .then_some(path)
}

/// The file of `parallel.load_operator_strategy_file`, in a search mode, when its entry for
/// `op` is `strategy`, and whether that entry gives an out_strategy.
fn from_operator_strategy_file<'a>(
    config: &'a TrainConfig,
    op: &str,
    strategy: &str,
) -> Option<(&'a std::path::Path, bool)> {
    if !matches!(
        config.parallel_config().mode,
        parallel::ParallelMode::Auto(_)
    ) {
        return None;
    }
    let path = config.search().load_operator_strategy_file.as_deref()?;
    let records = ckpt::read_operator_strategy_file(path).ok()?;
    records
        .iter()
        .find(|r| r.name == op && parallel::format_strategy(&r.inputs) == strategy)
        .map(|r| (path, r.outputs.is_some()))
}

/// `key` as a TOML key segment: bare when it can be, else quoted.
fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}

/// The parallel settings of `config`, with the op strategies of `parallel.strategy_file` (if
/// any) for the ops `[parallel.shard]` leaves unset.
pub(crate) fn parallel_config(
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
    // The ops `[parallel.shard]` sets, by name, cell or pattern: the file's entries apply to
    // the others only (its exact op names would otherwise win over a key's cell or pattern).
    let set_by_shard = parallel::resolve_op_patterns(&model.graph, &parallel.strategies)
        .map_err(|e| name_shard_key(config, e))?;
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
        if set_by_shard.contains_key(&op.name) {
            continue;
        }
        parallel
            .strategies
            .entry(op.name)
            .or_insert_with(|| parallel::OpStrategy::from_tuples(op.inputs, op.outputs));
    }
    Ok(parallel)
}

/// What one rank's run allocates at most, by what holds it ([`TrainSession::predict_footprint`]):
/// the training program's predicted peak, which the memory meter measures byte for byte, and
/// what lives beside it, which the meter does not count. The parts may peak at different
/// times; their sum bounds the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankFootprint {
    /// The training program's predicted peak ([`TrainSession::predict_memory`]).
    pub training: usize,
    /// The evaluation executor: its copy of the parameters and its inputs and outputs (built
    /// when the rank starts), and its step's buffers when the run evaluates.
    pub evaluation: usize,
    /// The executors of `parallel.micro_batch_interleave`'s other parts (local backend):
    /// each its parameters, gradients and step buffers.
    pub interleave_parts: usize,
    /// The copy of the rank's parameters a finished run returns
    /// ([`crate::RankOutcome::params`]).
    pub returned_parameters: usize,
    /// The matrix kernels' packing buffers: the L2 cache's size per thread of the rank.
    pub kernel_workspace: usize,
    /// The stacks of the threads the rank runs on, beyond the process's main thread.
    pub thread_stacks: usize,
    /// The executors' own tables, per buffer and step of their programs
    /// (`BOOKKEEPING_PER_ENTRY` bytes each).
    pub bookkeeping: usize,
}

/// Bytes allowed per buffer and per step of each executor a rank builds, for the executor's
/// own tables (its buffer slots, each step's input boxes and release lists: 310–320 bytes an
/// entry measured on the GPT's programs, whatever their size) and the page a buffer mapped on
/// its own is rounded up to.
pub const BOOKKEEPING_PER_ENTRY: usize = 4 << 10;

/// The address space of a thread's stack: `RUST_MIN_STACK` when set (what `std` gives a
/// thread), else `std`'s 2 MiB, and its guard page.
fn thread_stack_bytes() -> usize {
    let stack = std::env::var("RUST_MIN_STACK")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(2 << 20);
    stack + (4 << 10)
}

impl RankFootprint {
    /// The sum of the parts (saturating at `u64::MAX`).
    pub fn total(&self) -> u64 {
        [
            self.training,
            self.evaluation,
            self.interleave_parts,
            self.returned_parameters,
            self.kernel_workspace,
            self.thread_stacks,
            self.bookkeeping,
        ]
        .iter()
        .fold(0u64, |sum, &b| sum.saturating_add(b as u64))
    }
}

/// The bytes of `program`'s buffers that live across steps (parameters, gradients, inputs,
/// outputs) on `rank`: what an executor allocates when it is built.
fn persistent_bytes(program: &Program, rank: usize) -> usize {
    let lifetimes = parallel::memory::lifetimes(program);
    lifetimes
        .persistent
        .iter()
        .enumerate()
        .filter(|(_, &persistent)| persistent)
        .map(|(b, _)| parallel::memory::buffer_bytes(program, b, rank))
        .fold(0, usize::saturating_add)
}
