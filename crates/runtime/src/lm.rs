//! Language modelling: the GPT built from `[model]`, its strategies from `[parallel]`, and its
//! text data (batches of random windows, the validation loss).

use std::collections::BTreeMap;

use exec::RankExecutor;
use graph::models::Model;
use models::{GptConfig, GptParallel};
use parallel::{DatasetStrategy, OpStrategy, ParallelConfig, ParallelMode};

use crate::config::{DataFormat, TextDataKeys, TrainConfig};
use crate::data::{feed_rows, TokenCorpus, TokenSplit, TokenWindows};
use crate::error::RuntimeError;
use crate::generate::{SavedModel, Vocabulary};

/// A tokenised text and how a run reads it.
#[derive(Debug)]
pub struct TextData {
    /// The token stream, split into training and validation parts.
    pub corpus: TokenCorpus,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Sequences per global batch (of one micro-batch when the step's batch is cut).
    pub batch: usize,
    /// Micro-batches each step's batch is cut into (`data.batch_size` is `batch` times this).
    pub micro_batches: usize,
    /// Steps per epoch.
    pub steps_per_epoch: u64,
    /// Validation batches per evaluation.
    pub eval_batches: u64,
}

impl TextData {
    /// Opens `data.path` as `[data]` says.
    pub fn open(config: &TrainConfig, keys: &TextDataKeys) -> Result<TextData, RuntimeError> {
        let data = config.data();
        let corpus = match data.format {
            DataFormat::Tokens => TokenCorpus::open_tokens(
                &keys.path,
                keys.dtype,
                keys.vocab_size,
                keys.val_fraction,
            )?,
            _ => TokenCorpus::open_text(&keys.path, keys.char_tokens, keys.val_fraction)?,
        };
        let seq_len = config.model().gpt.as_ref().map_or(1, |g| g.seq_len);
        for (name, split) in [("training", &corpus.train), ("validation", &corpus.val)] {
            if split.len() <= seq_len as u64 && !(name == "validation" && split.is_empty()) {
                return Err(RuntimeError::Data {
                    path: keys.path.clone(),
                    reason: format!(
                        "the {name} split holds {} tokens, fewer than one window of model.seq_len + 1 = {}",
                        split.len(),
                        seq_len + 1
                    ),
                });
            }
        }
        Ok(TextData {
            corpus,
            seq_len,
            batch: data.batch_size,
            micro_batches: data.micro_batches(),
            steps_per_epoch: keys.steps_per_epoch,
            eval_batches: keys.eval_batches,
        })
    }

    /// The GPT's shape: `[model]` plus the vocabulary.
    pub fn gpt_config(&self, config: &TrainConfig) -> Result<GptConfig, RuntimeError> {
        let model = config.model();
        let keys = model.gpt.as_ref().ok_or_else(|| RuntimeError::Config {
            key: "model.name".to_string(),
            reason: "text data trains the GPT: set model.name = \"gpt\"".to_string(),
        })?;
        let gpt = GptConfig {
            vocab_size: self.corpus.train.vocab_size(),
            layers: keys.layers,
            heads: keys.heads,
            hidden: model.hidden,
            seq_len: keys.seq_len,
            ffn_hidden: keys.ffn_hidden,
            dropout: keys.dropout,
            tie_embeddings: keys.tie_embeddings,
            fused_attention: keys.fused_attention,
            // The ring runs FlashAttention on the split sequence, and so does the search,
            // whose candidates include the ring (it weighs the packed graph too:
            // `auto::packed_alternative`); everything else (Ulysses too, which moves `qkv` to
            // the head split whole) reads the QKV layout in place.
            packed_attention: {
                let split = config.gpt_parallel();
                split
                    .context_parallel_algo
                    .keeps_the_sequence_whole(split.context_parallel)
            } && !matches!(config.parallel_config().mode, ParallelMode::Auto(_)),
            batch: self.batch,
            // Logits split on the vocabulary are reduced where they lie, never gathered. In
            // deterministic mode every run builds that loss, one device's included, so that
            // all of them compute one formula in one order.
            vocab_parallel_loss: config.train().deterministic
                || (config.parallel_config().mode == ParallelMode::SemiAuto
                    && !config.gpt_parallel().vocab_emb_dp
                    && config.gpt_parallel().model_parallel > 1),
            moe: keys.moe.clone(),
        };
        gpt.validate()
            .map_err(|e| self.name_a_scanned_vocabulary(config, &gpt, e.into()))?;
        Ok(gpt)
    }

    /// `error` about the model `gpt`, naming the token file when the vocabulary causes it
    /// (the model with a vocabulary of 1 is valid) and was not configured but scanned from the
    /// file (one more than its largest id): a stray huge id otherwise reads as a model setting.
    fn name_a_scanned_vocabulary(
        &self,
        config: &TrainConfig,
        gpt: &GptConfig,
        error: RuntimeError,
    ) -> RuntimeError {
        let data = config.data();
        let scanned = data.format == DataFormat::Tokens
            && data.text.as_ref().is_some_and(|t| t.vocab_size.is_none());
        let tiny = GptConfig {
            vocab_size: 1,
            ..gpt.clone()
        };
        let caused_by_the_vocabulary = tiny.validate().is_ok();
        match data.text.as_ref() {
            Some(keys) if scanned && caused_by_the_vocabulary => RuntimeError::Data {
                path: keys.path.clone(),
                reason: format!(
                    "{error}; the vocabulary of {} is one more than the largest token id in this \
                     file, as data.vocab_size is not set: set data.vocab_size to the tokenizer's \
                     vocabulary (ids at or above it are then refused, naming the token)",
                    self.corpus.train.vocab_size()
                ),
            },
            _ => error,
        }
    }

    /// The description `tessera generate` reads: the model's shape (batch 1) and vocabulary.
    pub fn saved_model(&self, config: &TrainConfig) -> Result<SavedModel, RuntimeError> {
        let gpt = GptConfig {
            batch: 1,
            ..self.gpt_config(config)?
        };
        let vocabulary = match config.data().format {
            DataFormat::Tokens => Vocabulary::Ids,
            _ => Vocabulary::Text(self.corpus.tokenizer.clone()),
        };
        Ok(SavedModel { gpt, vocabulary })
    }

    /// Feeds this rank's rows of the global batch whose windows start at `starts` (of `split`)
    /// into `exec`: `input_ids` the windows' first `seq_len` tokens, `labels` their last (the
    /// samples of [`TokenWindows`]).
    pub fn feed(
        &self,
        exec: &mut RankExecutor,
        model: &Model,
        split: &TokenSplit,
        starts: &[u64],
    ) -> Result<(), RuntimeError> {
        let starts: Vec<usize> = starts.iter().map(|&s| s as usize).collect();
        let windows = TokenWindows::new(split, self.seq_len);
        feed_rows(exec, &[model.input, model.labels], &windows, &starts)
    }

    /// The window starts of micro-batch `micro` (from 0) of training step `step` (from 0) of
    /// `epoch`: rows `micro · batch .. (micro + 1) · batch` of the step's windows. A window's
    /// start depends on its row, never on the batch size, so with
    /// `train.grad_accumulation_steps = K` the K micro-batches of a step are exactly the rows
    /// of the step's batch of `K · batch` windows (with K = 1, micro-batch 0 is the batch).
    pub fn train_starts(
        &self,
        seed: u64,
        epoch: u64,
        step: u64,
        micro: usize,
    ) -> Result<Vec<u64>, RuntimeError> {
        let batch = self.batch as u64;
        let first = (micro as u64).saturating_mul(batch);
        self.corpus
            .train
            .window_starts_of_rows(
                seed,
                epoch,
                step,
                first..first.saturating_add(batch),
                self.seq_len,
            )
            .map_err(|reason| RuntimeError::Config {
                key: "model.seq_len".to_string(),
                reason,
            })
    }

    /// The mean loss over the validation batches (the same windows at every evaluation), run
    /// with `eval`, a program whose output 0 is the loss. `None` when the validation split is
    /// shorter than a window. A validation batch is the file's `data.batch_size` windows, as in
    /// a run whose batch is not cut into micro-batches: when it is, each validation batch runs
    /// as its micro-batches (equal shares, so the mean of their mean losses is the batch's).
    pub fn validation_loss(
        &self,
        eval: &mut RankExecutor,
        model: &Model,
        seed: u64,
    ) -> Result<Option<f64>, RuntimeError> {
        let val = &self.corpus.val;
        if val.len() <= self.seq_len as u64 || self.eval_batches == 0 {
            return Ok(None);
        }
        let whole = self.batch.saturating_mul(self.micro_batches);
        let mut total = 0.0;
        for step in 0..self.eval_batches {
            // Epoch 0 is never a training epoch: the validation windows are their own stream.
            let starts = window_starts(val, seed, 0, step, whole, self.seq_len)?;
            for micro in starts.chunks(self.batch.max(1)) {
                self.feed(eval, model, val, micro)?;
                eval.run()?;
                total += eval.output(0).to_f64_vec()[0];
            }
        }
        Ok(Some(
            total / (self.eval_batches as f64 * self.micro_batches.max(1) as f64),
        ))
    }
}

fn window_starts(
    split: &TokenSplit,
    seed: u64,
    epoch: u64,
    step: u64,
    batch: usize,
    seq_len: usize,
) -> Result<Vec<u64>, RuntimeError> {
    split
        .window_starts(seed, epoch, step, batch, seq_len)
        .map_err(|reason| RuntimeError::Config {
            key: "model.seq_len".to_string(),
            reason,
        })
}

/// An error of [`GptParallel::resolve`] on `per_stage` devices, which with pipeline stages
/// says that the device count its keys must match or divide is one stage's: `parallel.devices`
/// over `parallel.pipeline.stages`.
fn per_stage_error(
    e: models::ModelsError,
    parallel: &ParallelConfig,
    per_stage: usize,
) -> RuntimeError {
    let stages = parallel.pipeline.as_ref().map_or(1, |p| p.stages);
    match e {
        models::ModelsError::Config { key, reason }
            if stages > 1
                && per_stage > 0
                && [
                    "parallel.data_parallel",
                    "parallel.model_parallel",
                    "parallel.context_parallel",
                ]
                .contains(&key.as_str()) =>
        {
            let stage = format!(
                "the devices per pipeline stage (parallel.devices {} / parallel.pipeline.stages \
                 {stages} = {per_stage})",
                parallel.effective_devices()
            );
            let whole = format!("the {per_stage} devices");
            let reason = if reason.contains(&whole) {
                reason.replacen(&whole, &stage, 1)
            } else {
                format!("{reason} ({stage})")
            };
            RuntimeError::Config { key, reason }
        }
        other => other.into(),
    }
}

/// The parallel config of a GPT run: in `semi_auto`, the GPT cells' strategies from
/// `[parallel]`'s MindFormers keys for every op `[parallel.shard]` (patterns included) leaves
/// unset, and the dataset split over `data_parallel` unless `dataset_strategy` is given.
pub fn gpt_parallel_config(
    config: &TrainConfig,
    gpt: &GptConfig,
    model: &Model,
    mut parallel: ParallelConfig,
) -> Result<ParallelConfig, RuntimeError> {
    let keys = config.gpt_parallel();
    // With pipeline stages, `data_parallel × model_parallel` is each stage's devices.
    let devices = parallel.devices_per_stage();
    if parallel.mode != ParallelMode::SemiAuto {
        return Ok(parallel);
    }
    let split =
        GptParallel::resolve(devices, &keys).map_err(|e| per_stage_error(e, &parallel, devices))?;
    split.check(gpt)?;
    let user = parallel::resolve_op_patterns(&model.graph, &parallel.strategies)?;
    let mut strategies: BTreeMap<String, OpStrategy> = split.strategies(&model.graph)?;
    strategies.extend(user);
    parallel.strategies = strategies;
    if parallel.dataset_strategy == DatasetStrategy::DataParallel {
        parallel.dataset_strategy = DatasetStrategy::PerInput(split.dataset_strategy());
    }
    Ok(parallel)
}
