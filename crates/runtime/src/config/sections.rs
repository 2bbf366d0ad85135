//! The sections of a config file, each read into its struct, and the keys each may hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::clip::MaxGradNorm;
use exec::{LossScale, OptimizerConfig, OptimizerKind, Precision};
use layout::Layout;
use parallel::{DatasetStrategy, HsdpConfig, OptimizerLevel, ParallelConfig, ParallelMode};
use toml::{Table, Value};

use super::layouts::{read_mesh, read_strategy_entry, StrategyEntry};

use super::values::{
    check_grad_accumulation_steps, config_error, one_of, path_reader, read_at_most, read_bool,
    read_count, read_device_count, read_enum, read_float, read_positive, read_string, wrong_type,
    Section, MAX_EVAL_BATCHES, MAX_GRAD_ACCUMULATION_STEPS,
};
use super::{
    DataConfig, DataFormat, GptKeys, GptParallelKeys, ModelConfig, ModelName, OutputConfig,
    ResumeFrom, TextDataKeys, TrainConfig, TrainLoopConfig,
};
use crate::data::{Normalize, TokenDtype};
use crate::error::RuntimeError;

/// The sections of a config file, in file order.
pub(super) const SECTIONS: &[&str] = &["model", "data", "parallel", "train", "output", "ps"];
pub(super) const MODEL_KEYS: &[&str] = &[
    "name",
    "hidden",
    "classes",
    "layers",
    "heads",
    "seq_len",
    "ffn_hidden",
    "dropout",
    "tie_embeddings",
];
/// The keys only the GPT reads.
const GPT_MODEL_KEYS: &[&str] = &[
    "layers",
    "heads",
    "seq_len",
    "ffn_hidden",
    "dropout",
    "tie_embeddings",
];
pub(super) const DATA_KEYS: &[&str] = &[
    "format",
    "dir",
    "batch_size",
    "shuffle",
    "pixel_max",
    "normalize",
    "path",
    "tokenizer",
    "val_fraction",
    "dtype",
    "vocab_size",
    "steps_per_epoch",
    "eval_batches",
];
/// The keys only the text formats read.
const TEXT_DATA_KEYS: &[&str] = &[
    "path",
    "tokenizer",
    "val_fraction",
    "dtype",
    "vocab_size",
    "steps_per_epoch",
    "eval_batches",
];
/// The keys only the image format reads.
const IDX_DATA_KEYS: &[&str] = &["dir", "pixel_max", "normalize"];
pub(super) const PARALLEL_KEYS: &[&str] = &[
    "devices",
    "mode",
    "dataset_strategy",
    "gradients_mean",
    "loss_repeated_mean",
    "shard",
    "out_shard",
    "mesh",
    "strategy_file",
    "strategy_file_only_for_trainable_params",
    "manual_split",
    "deterministic_blocks",
    "hsdp",
    "pipeline",
    "recompute",
    "comm_fusion",
    "comm_reuse",
    "overlap",
    "enable_fp32_communication",
    "gradient_fp32_sync",
    "micro_batch_interleave",
    "data_parallel",
    "model_parallel",
    "vocab_emb_dp",
    "use_seq_parallel",
    "device_profile",
    "max_device_memory",
    "search_time_budget",
    "save_operator_strategy_file",
    "load_operator_strategy_file",
    "auto_pipeline",
];
/// `[parallel.hsdp]`'s keys: MindSpore's `AutoParallel.hsdp(shard_size, threshold,
/// optimizer_level)`.
pub(super) const HSDP_KEYS: &[&str] = &[
    "shard_size",
    "threshold",
    "optimizer_level",
    "gradient_accumulation_shard",
];
/// `[parallel]`'s MindFormers keys, read only for the GPT.
const GPT_PARALLEL_KEYS: &[&str] = &[
    "data_parallel",
    "model_parallel",
    "vocab_emb_dp",
    "use_seq_parallel",
];
pub(super) const TRAIN_KEYS: &[&str] = &[
    "epochs",
    "max_steps",
    "grad_accumulation_steps",
    "optimizer",
    "learning_rate",
    "weight_decay",
    "momentum",
    "use_nesterov",
    "beta1",
    "beta2",
    "eps",
    "no_weight_decay",
    "lr_schedule",
    "warmup_steps",
    "warmup_lr_init",
    "min_lr",
    "decay_steps",
    "num_cycles",
    "step_per_epoch",
    "warmup_epoch",
    "decay_epoch",
    "power",
    "update_decay_epoch",
    "decay_rate",
    "is_stair",
    "milestone",
    "learning_rates",
    "seed",
    "deterministic",
    "eval",
    "eval_interval",
    "per_print_times",
    "print_local_norm",
    "dump_local_norm",
    "dump_local_norm_path",
    "precision",
    "loss_scale",
    "parameter_broadcast",
    "lazy_init",
    "max_grad_norm",
];
pub(super) const OUTPUT_KEYS: &[&str] = &[
    "dir",
    "save_checkpoint",
    "save_checkpoint_steps",
    "save_checkpoint_seconds",
    "keep_checkpoint_max",
    "resume_from",
    "resume_strategy",
    "group_info_file",
];

/// Takes section `name` out of `root` (an empty table when absent and not `required`).
fn take_section(
    root: &mut Table,
    name: &str,
    valid: &[&str],
    required: bool,
) -> Result<Section, RuntimeError> {
    match root.remove(name) {
        Some(value) => Section::new(name, value, valid),
        None if required => Err(config_error(
            name,
            format!("missing required section [{name}]"),
        )),
        None => Section::new(name, Value::Table(Table::new()), valid),
    }
}

pub(super) fn from_root(mut root: Table, base: &Path) -> Result<TrainConfig, RuntimeError> {
    if let Some(unknown) = root.keys().find(|k| !SECTIONS.contains(&k.as_str())) {
        return Err(config_error(
            unknown,
            format!("unknown section (valid sections: {})", one_of(SECTIONS)),
        ));
    }
    let mut warnings = Vec::new();
    let model = read_model(
        take_section(&mut root, "model", MODEL_KEYS, true)?,
        &mut warnings,
    )?;
    let mut data = read_data(
        take_section(&mut root, "data", DATA_KEYS, true)?,
        base,
        &mut warnings,
    )?;
    check_model_data(&model, &data)?;
    let ps_mode = super::ps::take_ps_mode(&mut root);
    let ps_devices_given = ps_mode && super::ps::parallel_sets_devices(&root);
    let ps_section = root.remove("ps");
    let mut parallel_section = take_section(&mut root, "parallel", PARALLEL_KEYS, false)?;
    let gpt_parallel = read_gpt_parallel(&mut parallel_section, model.name, &mut warnings)?;
    let strategy_file_only_for_trainable_params =
        parallel_section.or("strategy_file_only_for_trainable_params", true, read_bool)?;
    let search = super::search::read_search_keys(&mut parallel_section, base)?;
    let micro_batch_interleave =
        parallel_section.or("micro_batch_interleave", 1, read_micro_batch_interleave)?;
    let (parallel, strategy_file) = read_parallel(parallel_section, base, &mut warnings)?;
    if search.auto_pipeline && !matches!(parallel.mode, parallel::ParallelMode::Auto(_)) {
        return Err(config_error(
            "parallel.auto_pipeline",
            format!(
                "applies only with a search mode (sharding_propagation, recursive_programming or dynamic_programming), not parallel.mode = \"{}\"",
                parallel.mode.name()
            ),
        ));
    }
    let output = read_output(take_section(&mut root, "output", OUTPUT_KEYS, true)?, base)?;
    let mut train_section = take_section(&mut root, "train", TRAIN_KEYS, true)?;
    let optimizer = read_optimizer(&mut train_section, &mut warnings)?;
    let lr_schedule =
        super::lr::read_lr_schedule(&mut train_section, optimizer.learning_rate, &mut warnings)?;
    let weight_decay_filter = super::lr::read_weight_decay_filter(&mut train_section)?;
    let mut train = read_train_loop(train_section, &output, base, &mut warnings)?;
    if ps_mode && train.deterministic {
        return Err(config_error(
            "train.deterministic",
            format!(
                "has no bitwise guarantee in mode \"{}\": the servers apply the workers' gradients in the order they arrive; use a collective mode (data_parallel, semi_auto, …) for deterministic training",
                super::ps::PARAMETER_SERVER_MODE
            ),
        ));
    }
    let ps = match (ps_mode, ps_section) {
        (true, section) => Some(super::ps::read_ps(
            section,
            model.name,
            ps_devices_given,
            train.grad_accumulation_steps,
            &mut warnings,
        )?),
        (false, Some(_)) => {
            return Err(config_error(
                "ps",
                "[ps] applies only with parallel.mode = \"parameter_server\"",
            ))
        }
        (false, None) => None,
    };
    // Pipeline micro-batches cut each step's batch: M micro-batches of batch / M, one update.
    if let Some(m) = parallel
        .pipeline
        .as_ref()
        .map(|p| p.micro_batches)
        .filter(|&m| m > 1)
    {
        if data.batch_size % m != 0 {
            return Err(config_error(
                "parallel.pipeline.micro_batches",
                format!(
                    "{m} micro-batches do not divide data.batch_size = {} (each micro-batch is an equal share of the step's batch)",
                    data.batch_size
                ),
            ));
        }
        data.batch_size /= m;
        train.grad_accumulation_steps = train
            .grad_accumulation_steps
            .checked_mul(m)
            .filter(|&k| k <= MAX_GRAD_ACCUMULATION_STEPS)
            .ok_or_else(|| {
                config_error(
                    "parallel.pipeline.micro_batches",
                    format!(
                        "{m} micro-batches × train.grad_accumulation_steps = {} exceed {MAX_GRAD_ACCUMULATION_STEPS} micro-steps per update",
                        train.grad_accumulation_steps
                    ),
                )
            })?;
    }
    if micro_batch_interleave > 1 {
        interleave_micro_batches(micro_batch_interleave, &parallel, &mut data, &mut train)?;
    }
    Ok(TrainConfig {
        micro_batch_interleave,
        source: None,
        model,
        data,
        parallel,
        strategy_file,
        strategy_file_only_for_trainable_params,
        gpt_parallel,
        search,
        optimizer,
        lr_schedule,
        weight_decay_filter,
        train,
        output,
        ps,
        warnings,
    })
}

/// Records a warning for every key of `keys` present in `s`, which has no effect because
/// `why`; the keys are removed.
fn discard_unused(
    s: &mut Section,
    section: &str,
    keys: &[&str],
    why: &str,
    warnings: &mut Vec<String>,
) {
    for key in keys {
        if s.discard(key) {
            warnings.push(format!("{section}.{key} has no effect {why}"));
        }
    }
}

fn read_model(mut s: Section, warnings: &mut Vec<String>) -> Result<ModelConfig, RuntimeError> {
    let name = s.or("name", ModelName::SeedMlp, |key, v| {
        read_enum(key, v, &["seed_mlp", "gpt", "embedding_bag"], |t| match t {
            "seed_mlp" => Some(ModelName::SeedMlp),
            "gpt" => Some(ModelName::Gpt),
            "embedding_bag" => Some(ModelName::EmbeddingBag),
            _ => None,
        })
    })?;
    let hidden = s.require("hidden", read_positive)?;
    if name != ModelName::Gpt {
        discard_unused(
            &mut s,
            "model",
            GPT_MODEL_KEYS,
            "unless model.name = \"gpt\"",
            warnings,
        );
        return Ok(ModelConfig {
            name,
            hidden,
            classes: s.require("classes", read_positive)?,
            gpt: None,
        });
    }
    discard_unused(
        &mut s,
        "model",
        &["classes"],
        "for the GPT (its classes are the vocabulary, from the data)",
        warnings,
    );
    let dropout = s.or("dropout", 0.0, read_float)?;
    if !(0.0..1.0).contains(&dropout) {
        return Err(config_error(
            "model.dropout",
            format!("{dropout} is out of range: it must be at least 0 and below 1"),
        ));
    }
    let gpt = GptKeys {
        layers: s.require("layers", read_positive)?,
        heads: s.require("heads", read_positive)?,
        seq_len: s.require("seq_len", read_positive)?,
        ffn_hidden: s.or("ffn_hidden", 4 * hidden, read_positive)?,
        dropout,
        tie_embeddings: s.or("tie_embeddings", true, read_bool)?,
    };
    if hidden % gpt.heads != 0 {
        return Err(config_error(
            "model.heads",
            format!("{} heads do not divide model.hidden = {hidden}", gpt.heads),
        ));
    }
    Ok(ModelConfig {
        name,
        hidden,
        classes: 0,
        gpt: Some(gpt),
    })
}

/// The GPT trains on the text formats, the MLP on images.
fn check_model_data(model: &ModelConfig, data: &DataConfig) -> Result<(), RuntimeError> {
    let text = data.text.is_some();
    match (model.name, text) {
        (ModelName::Gpt, false) => Err(config_error(
            "data.format",
            format!(
                "the GPT trains on text: set data.format = \"text\" or \"tokens\" (got \"{}\")",
                data.format.name()
            ),
        )),
        (ModelName::SeedMlp | ModelName::EmbeddingBag, true) => Err(config_error(
            "data.format",
            format!(
                "\"{}\" data needs model.name = \"gpt\" (the seed MLP and the embedding bag classify images)",
                data.format.name()
            ),
        )),
        _ => Ok(()),
    }
}

/// `[parallel]`'s MindFormers keys; they set the GPT's strategies and mean nothing to other
/// models.
fn read_gpt_parallel(
    s: &mut Section,
    model: ModelName,
    warnings: &mut Vec<String>,
) -> Result<GptParallelKeys, RuntimeError> {
    if model != ModelName::Gpt {
        discard_unused(
            s,
            "parallel",
            GPT_PARALLEL_KEYS,
            "unless model.name = \"gpt\"",
            warnings,
        );
        return Ok(GptParallelKeys::default());
    }
    Ok(GptParallelKeys {
        data_parallel: s.get("data_parallel", read_positive)?,
        model_parallel: s.or("model_parallel", 1, read_positive)?,
        vocab_emb_dp: s.or("vocab_emb_dp", true, read_bool)?,
        use_seq_parallel: s.or("use_seq_parallel", false, read_bool)?,
    })
}

fn read_data(
    mut s: Section,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<DataConfig, RuntimeError> {
    let format = s.or("format", DataFormat::Idx, |key, v| {
        read_enum(key, v, &["idx", "text", "tokens"], |t| match t {
            "idx" => Some(DataFormat::Idx),
            "text" => Some(DataFormat::Text),
            "tokens" => Some(DataFormat::Tokens),
            _ => None,
        })
    })?;
    if format != DataFormat::Idx {
        let why = format!("with data.format = \"{}\"", format.name());
        discard_unused(&mut s, "data", IDX_DATA_KEYS, &why, warnings);
        let text = read_text_keys(&mut s, format, base, warnings)?;
        return Ok(DataConfig {
            format,
            dir: PathBuf::new(),
            batch_size: s.require("batch_size", read_positive)?,
            shuffle: s.or("shuffle", true, read_bool)?,
            pixel_max: None,
            normalize: Normalize::Standardize,
            text: Some(text),
        });
    }
    discard_unused(
        &mut s,
        "data",
        TEXT_DATA_KEYS,
        "with data.format = \"idx\"",
        warnings,
    );
    let dir = s.require("dir", path_reader(base))?;
    let batch_size = s.require("batch_size", read_positive)?;
    let shuffle = s.or("shuffle", true, read_bool)?;
    let pixel_max = s.get("pixel_max", |key, v| {
        let x = read_float(key, v)?;
        if x.is_finite() && x > 0.0 && x <= f64::from(f32::MAX) {
            Ok(x as f32)
        } else {
            Err(config_error(
                key,
                format!("{x} is out of range: it must be finite and > 0"),
            ))
        }
    })?;
    let normalize = s.or("normalize", Normalize::Standardize, |key, v| {
        read_enum(key, v, &["standardize", "scale"], Normalize::parse)
    })?;
    Ok(DataConfig {
        format,
        dir,
        batch_size,
        shuffle,
        pixel_max,
        normalize,
        text: None,
    })
}

/// The text formats' keys of `[data]`.
fn read_text_keys(
    s: &mut Section,
    format: DataFormat,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<TextDataKeys, RuntimeError> {
    let path = s.require("path", path_reader(base))?;
    let char_tokens = s.or("tokenizer", false, |key, v| {
        read_enum(key, v, &["byte", "char"], |t| match t {
            "byte" => Some(false),
            "char" => Some(true),
            _ => None,
        })
    })?;
    let val_fraction = s.or("val_fraction", 0.1, read_float)?;
    if !(0.0..1.0).contains(&val_fraction) {
        return Err(config_error(
            "data.val_fraction",
            format!("{val_fraction} is out of range: it must be at least 0 and below 1"),
        ));
    }
    let dtype_given = s.has("dtype");
    let dtype = s.or("dtype", TokenDtype::U16, |key, v| {
        read_enum(key, v, &["u16", "u32"], TokenDtype::parse)
    })?;
    let vocab_size = s.get("vocab_size", read_positive)?;
    if format == DataFormat::Text {
        let unused = [("dtype", dtype_given), ("vocab_size", vocab_size.is_some())];
        for (key, _) in unused.iter().filter(|(_, given)| *given) {
            warnings.push(format!(
                "data.{key} has no effect with data.format = \"text\" (the tokenizer sets the tokens)"
            ));
        }
    } else if char_tokens {
        warnings.push(
            "data.tokenizer has no effect with data.format = \"tokens\" (the ids are given)"
                .to_string(),
        );
    }
    Ok(TextDataKeys {
        path,
        char_tokens,
        val_fraction,
        dtype,
        vocab_size: if format == DataFormat::Text {
            None
        } else {
            vocab_size
        },
        steps_per_epoch: s.or("steps_per_epoch", 100, |key, v| {
            read_positive(key, v).map(|n| n as u64)
        })?,
        eval_batches: s.or("eval_batches", 4, |key, v| {
            read_at_most(
                key,
                v,
                MAX_EVAL_BATCHES,
                "validation batches per evaluation",
            )
            .map(|n| n as u64)
        })?,
    })
}

fn read_dataset_strategy(
    key: &str,
    value: Value,
    mesh: Option<&Layout>,
) -> Result<DatasetStrategy, RuntimeError> {
    match value {
        Value::String(text) => match text.as_str() {
            "data_parallel" => Ok(DatasetStrategy::DataParallel),
            "full_batch" => Ok(DatasetStrategy::FullBatch),
            _ => Err(config_error(
                key,
                format!("unknown value \"{text}\" (valid: data_parallel, full_batch, or a list of per-input tuples like [[8, 1, 1], [8]] or layouts like [[\"dp\", \"None\", \"None\"], [\"dp\"]])"),
            )),
        },
        other => read_strategy_entry(key, other, mesh).map(StrategyEntry::into_dataset_strategy),
    }
}

/// `[parallel.shard]` or `[parallel.out_shard]`: op name → strategy (split tuples or layouts on
/// `mesh`).
fn read_strategy_table(
    key: &str,
    value: Value,
    mesh: Option<&Layout>,
) -> Result<BTreeMap<String, StrategyEntry>, RuntimeError> {
    let Value::Table(table) = value else {
        return Err(wrong_type(key, "a table of op name = strategy", &value));
    };
    table
        .into_iter()
        .map(|(op, strategy)| {
            read_strategy_entry(&format!("{key}.{op}"), strategy, mesh).map(|s| (op, s))
        })
        .collect()
}

/// `[parallel.manual_split]`: Embedding op or cell → rows per block of its table, as a list
/// (`[120, 56, 40, 40]`) or MindSpore's `(rows, offset)` pairs (`[[120, 0], [56, 120], …]`,
/// each offset the sum of the rows before it).
fn read_manual_split(
    key: &str,
    value: Value,
) -> Result<BTreeMap<String, Vec<usize>>, RuntimeError> {
    let Value::Table(table) = value else {
        return Err(wrong_type(
            key,
            "a table of embedding name = rows per block",
            &value,
        ));
    };
    let max_blocks = layout::limits::max_ranks();
    table
        .into_iter()
        .map(|(name, entry)| {
            let key = format!("{key}.{name}");
            let expected = "a list of rows per block, like [120, 56, 40, 40]";
            let Value::Array(items) = entry else {
                return Err(wrong_type(&key, expected, &entry));
            };
            if items.is_empty() || items.len() > max_blocks {
                return Err(config_error(
                    &key,
                    format!(
                        "{} block(s): a split needs 1 to {max_blocks} blocks (one per rank of the table's split)",
                        items.len()
                    ),
                ));
            }
            let mut rows = Vec::with_capacity(items.len());
            let mut next_offset = 0usize;
            for (i, item) in items.into_iter().enumerate() {
                let item_key = format!("{key}[{i}]");
                let n = match item {
                    Value::Array(pair) => {
                        let [size, offset]: [Value; 2] = pair.try_into().map_err(|p: Vec<Value>| {
                            config_error(
                                &item_key,
                                format!("a (rows, offset) pair has 2 entries, got {}", p.len()),
                            )
                        })?;
                        let size = read_positive(&item_key, size)?;
                        let offset = match offset {
                            Value::Integer(o) => usize::try_from(o).ok(),
                            _ => None,
                        };
                        if offset != Some(next_offset) {
                            return Err(config_error(
                                &item_key,
                                format!(
                                    "offset {} is not where the block must start: {next_offset}, the rows before it (blocks are contiguous and in order)",
                                    offset.map_or_else(|| "(not a non-negative integer)".to_string(), |o| o.to_string())
                                ),
                            ));
                        }
                        size
                    }
                    other => read_positive(&item_key, other)?,
                };
                next_offset = next_offset.checked_add(n).ok_or_else(|| {
                    config_error(&key, "the rows add up to more than usize::MAX".to_string())
                })?;
                rows.push(n);
            }
            Ok((name, rows))
        })
        .collect()
}

/// `[parallel.hsdp]` on `devices` devices. The errors of a bad value are MindSpore's
/// (`AutoParallel.hsdp`), prefixed by the key.
fn read_hsdp(key: &str, value: Value, devices: usize) -> Result<HsdpConfig, RuntimeError> {
    let mut s = Section::new(key, value, HSDP_KEYS)?;
    let defaults = HsdpConfig::default();
    let shard_size = s.or("shard_size", None, |key, v| match v {
        Value::Integer(-1) => Ok(None),
        Value::Integer(n) if n >= 1 => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > devices || !devices.is_multiple_of(n) {
                return Err(config_error(
                    key,
                    format!(
                        "{n} must be -1 or a positive divisor of the {devices} devices \
                         (parallel.devices): the shard group is a chunk of a parameter's \
                         data-parallel group"
                    ),
                ));
            }
            Ok(Some(n))
        }
        other => Err(config_error(
            key,
            format!("shard_size must be a positive integer or -1, but got {other}."),
        )),
    })?;
    let threshold_kb = s.or("threshold", defaults.threshold_kb, |key, v| match v {
        Value::Integer(n) if n >= 0 => {
            usize::try_from(n).map_err(|_| config_error(key, format!("{n} is too large")))
        }
        other => Err(config_error(
            key,
            format!("threshold must be a positive integer or 0, but got {other}."),
        )),
    })?;
    let level = s.or("optimizer_level", defaults.level, |key, v| {
        let parsed = match &v {
            Value::String(text) => OptimizerLevel::parse(text),
            _ => None,
        };
        parsed.ok_or_else(|| {
            let names: Vec<String> = OptimizerLevel::ALL
                .iter()
                .map(|l| format!("'{}'", l.name()))
                .collect();
            config_error(
                key,
                format!(
                    "Optimizer level should in [{}], but got {v}",
                    names.join(", ")
                ),
            )
        })
    })?;
    let gradient_accumulation_shard = s.get("gradient_accumulation_shard", |key, v| {
        let given = read_bool(key, v)?;
        // MindSpore's levels decide it themselves: only a value that agrees is accepted.
        match level.accumulation_shard() {
            Some(decided) if decided != given => Err(config_error(
                key,
                format!(
                    "{given} contradicts optimizer_level \"{}\", which accumulates {}; \
                     gradient_accumulation_shard chooses only under \"zero1\" (MindSpore: only \
                     level2 shards the accumulation)",
                    level.name(),
                    match decided {
                        true => "only each rank's piece of the gradient",
                        false => "the whole gradient (\"level2\" accumulates the pieces)",
                    }
                ),
            )),
            _ => Ok(given),
        }
    })?;
    Ok(HsdpConfig {
        shard_size,
        threshold_kb,
        level,
        gradient_accumulation_shard: gradient_accumulation_shard
            .unwrap_or(defaults.gradient_accumulation_shard),
        accumulates: false,
    })
}

/// `parallel.micro_batch_interleave`: an integer ≥ 1.
fn read_micro_batch_interleave(key: &str, value: Value) -> Result<usize, RuntimeError> {
    match value {
        Value::Integer(n) if n >= 1 => usize::try_from(n)
            .ok()
            .filter(|&n| n <= MAX_GRAD_ACCUMULATION_STEPS)
            .ok_or_else(|| {
                config_error(
                    key,
                    format!("{n} parts are too many (at most {MAX_GRAD_ACCUMULATION_STEPS})"),
                )
            }),
        Value::Integer(n) => Err(config_error(
            key,
            format!("{n} is out of range: it must be an integer ≥ 1 (1: no interleaving)"),
        )),
        other => Err(wrong_type(key, "an integer ≥ 1", &other)),
    }
}

/// `parallel.micro_batch_interleave = n > 1` (MindSpore's `MicroBatchInterleaved`): each
/// batch is cut into `n` equal parts, run as `n` micro-steps of one update (the runtime runs
/// a step's parts at once, so one part's communication overlaps another's computation).
fn interleave_micro_batches(
    n: usize,
    parallel: &ParallelConfig,
    data: &mut DataConfig,
    train: &mut TrainLoopConfig,
) -> Result<(), RuntimeError> {
    let key = "parallel.micro_batch_interleave";
    if parallel.pipeline.as_ref().is_some_and(|p| p.stages > 1) {
        return Err(config_error(
            key,
            format!("{n} applies without pipeline stages: [parallel.pipeline] already cuts each batch into micro-batches (use its micro_batches)"),
        ));
    }
    if !data.batch_size.is_multiple_of(n) {
        return Err(config_error(
            key,
            format!(
                "{n} parts do not divide data.batch_size = {} (each part is an equal share of the batch)",
                data.batch_size
            ),
        ));
    }
    data.batch_size /= n;
    train.grad_accumulation_steps = train
        .grad_accumulation_steps
        .checked_mul(n)
        .filter(|&k| k <= MAX_GRAD_ACCUMULATION_STEPS)
        .ok_or_else(|| {
            config_error(
                key,
                format!(
                    "{n} parts × train.grad_accumulation_steps = {} exceed {MAX_GRAD_ACCUMULATION_STEPS} micro-steps per update",
                    train.grad_accumulation_steps
                ),
            )
        })?;
    Ok(())
}

fn read_parallel(
    mut s: Section,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<(ParallelConfig, Option<PathBuf>), RuntimeError> {
    let modes = ParallelMode::NAMES;
    let mode = s.or("mode", ParallelMode::StandAlone, |key, v| {
        read_enum(key, v, &modes, ParallelMode::parse)
    })?;
    let devices_given = s.has("devices");
    let devices = s.or("devices", 1, read_device_count)?;
    let mesh = s.get("mesh", read_mesh)?;
    let dataset_strategy = s.or("dataset_strategy", DatasetStrategy::DataParallel, |k, v| {
        read_dataset_strategy(k, v, mesh.as_ref())
    })?;
    let gradients_mean = s.or("gradients_mean", true, read_bool)?;
    let loss_repeated_mean = s.or("loss_repeated_mean", true, read_bool)?;
    let strategy_table = |k: &str, v| read_strategy_table(k, v, mesh.as_ref());
    let shard = s.or("shard", BTreeMap::new(), strategy_table)?;
    let mut out_shard = s.or("out_shard", BTreeMap::new(), strategy_table)?;
    let strategy_file = s.get("strategy_file", path_reader(base))?;
    let manual_split = s.or("manual_split", BTreeMap::new(), read_manual_split)?;
    let pipeline = s.get("pipeline", super::pipeline::read_pipeline)?;
    let deterministic_blocks = s.or("deterministic_blocks", 16, |key, v| {
        let n = read_positive(key, v)?;
        if !n.is_power_of_two() || n > 1 << 20 {
            return Err(config_error(
                key,
                format!("{n} is not a power of two between 1 and 1048576"),
            ));
        }
        Ok(n)
    })?;
    let hsdp = s.get("hsdp", |key, v| read_hsdp(key, v, devices))?;
    let recompute = s.get("recompute", super::memory::read_recompute)?;
    let comm_fusion = s.get("comm_fusion", super::memory::read_comm_fusion)?;
    let comm_reuse = s.or("comm_reuse", None, super::memory::read_comm_reuse)?;
    let enable_fp32_communication = s.or("enable_fp32_communication", false, read_bool)?;
    let gradient_fp32_sync = s.or("gradient_fp32_sync", true, read_bool)?;
    let overlap = s.or(
        "overlap",
        parallel::fusion::OverlapConfig::default(),
        super::memory::read_overlap,
    )?;
    if overlap.grad_computation_allreduce_overlap && comm_fusion.is_none() {
        warnings.push(
            "parallel.overlap.grad_computation_allreduce_overlap has no effect without \
             [parallel.comm_fusion]: it overlaps the fused gradient buckets"
                .to_string(),
        );
    }
    if mode == ParallelMode::StandAlone && hsdp.is_some() {
        warnings.push(
            "[parallel.hsdp] has no effect in mode \"stand_alone\" (one device holds every \
             parameter whole)"
                .to_string(),
        );
    }
    if mode == ParallelMode::StandAlone && !manual_split.is_empty() {
        warnings.push(
            "[parallel.manual_split] has no effect in mode \"stand_alone\" (one device holds \
             every row)"
                .to_string(),
        );
    }
    if let Some(op) = out_shard.keys().find(|op| !shard.contains_key(*op)) {
        return Err(config_error(
            &format!("parallel.out_shard.{op}"),
            format!("an out_strategy needs an in_strategy: add parallel.shard.{op} (MindSpore's shard() takes out_strategy only with in_strategy)"),
        ));
    }
    if !mode.uses_strategies() && !shard.is_empty() {
        warnings.push(format!(
            "[parallel.shard] has no effect in mode \"{}\" (only semi_auto and the search modes use op strategies)",
            mode.name()
        ));
    }
    if mode == ParallelMode::StandAlone && devices_given && devices != 1 {
        warnings.push(format!(
            "parallel.devices = {devices} has no effect in mode \"stand_alone\" (it runs on 1 device)"
        ));
    }
    let is_layouts = |e: &StrategyEntry| matches!(e, StrategyEntry::Layouts(_));
    let uses_layouts = matches!(dataset_strategy, DatasetStrategy::Layouts(_))
        || shard.values().chain(out_shard.values()).any(is_layouts);
    if mesh.is_some() && !uses_layouts {
        warnings.push(
            "[parallel.mesh] has no effect: no entry of parallel.shard, parallel.out_shard or \
             parallel.dataset_strategy is a layout"
                .to_string(),
        );
    }
    let strategies = shard
        .into_iter()
        .map(|(op, inputs)| {
            let outputs = out_shard.remove(&op);
            (op, inputs.into_op_strategy(outputs))
        })
        .collect();
    let parallel = ParallelConfig {
        mode,
        devices,
        strategies,
        dataset_strategy,
        gradients_mean,
        loss_repeated_mean,
        manual_split,
        deterministic_blocks,
        deterministic: false,
        hsdp,
        pipeline,
        recompute,
        comm_fusion,
        overlap,
        enable_fp32_communication,
        gradient_fp32_sync,
        comm_reuse,
    };
    Ok((parallel, strategy_file))
}

/// The optimizer keys of `[train]`; keys of other optimizers are left in `s` and reported as
/// having no effect.
fn read_optimizer(
    s: &mut Section,
    warnings: &mut Vec<String>,
) -> Result<OptimizerConfig, RuntimeError> {
    let names = ["sgd", "momentum", "adam", "adamw", "mint_adamw"];
    let name = s.require("optimizer", |key, v| {
        read_enum(key, v, &names, |t| names.iter().copied().find(|n| *n == t))
    })?;
    let learning_rate = s.require("learning_rate", read_float)?;
    // mint.optim.AdamW's default weight decay is 1e-2; the MindSpore nn optimizers' is 0.
    let default_weight_decay = if name == "mint_adamw" { 1e-2 } else { 0.0 };
    let weight_decay = s.or("weight_decay", default_weight_decay, read_float)?;
    let kind = match name {
        "sgd" => OptimizerKind::Sgd,
        "momentum" => OptimizerKind::Momentum {
            momentum: s.require("momentum", read_float)?,
            use_nesterov: s.or("use_nesterov", false, read_bool)?,
        },
        _ => {
            // MindSpore's defaults: nn.Adam and mint.optim.AdamW eps 1e-8,
            // nn.AdamWeightDecay eps 1e-6.
            let default_eps = if name == "adamw" { 1e-6 } else { 1e-8 };
            let beta1 = s.or("beta1", 0.9, read_float)?;
            let beta2 = s.or("beta2", 0.999, read_float)?;
            let eps = s.or("eps", default_eps, read_float)?;
            match name {
                "adam" => OptimizerKind::Adam { beta1, beta2, eps },
                "adamw" => OptimizerKind::AdamW { beta1, beta2, eps },
                _ => OptimizerKind::MintAdamW { beta1, beta2, eps },
            }
        }
    };
    for key in ["momentum", "use_nesterov", "beta1", "beta2", "eps"] {
        if s.discard(key) {
            warnings.push(format!(
                "train.{key} has no effect with optimizer \"{name}\""
            ));
        }
    }
    let config = OptimizerConfig {
        kind,
        learning_rate,
        weight_decay,
    };
    config.validate()?;
    Ok(config)
}

fn read_train_loop(
    mut s: Section,
    output: &OutputConfig,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<TrainLoopConfig, RuntimeError> {
    let epochs = s.require("epochs", read_positive)?;
    let max_steps = s.or("max_steps", 0, read_count)?;
    let grad_accumulation_steps = s.or("grad_accumulation_steps", 1, |key, v| {
        let n = read_positive(key, v)?;
        check_grad_accumulation_steps(key, n)?;
        Ok(n)
    })?;
    let seed = s.or("seed", 1, read_count)?;
    let deterministic = s.or("deterministic", false, read_bool)?;
    let eval = s.or("eval", true, read_bool)?;
    let eval_interval = s.get("eval_interval", read_positive)?.map(|n| n as u64);
    let parameter_broadcast = s.or("parameter_broadcast", false, read_bool)?;
    let lazy_init = s.or("lazy_init", false, read_bool)?;
    let max_grad_norm = s.get("max_grad_norm", read_max_grad_norm)?;
    let per_print_times = s.or("per_print_times", 1, read_count)?;
    let print_local_norm = s.or("print_local_norm", false, read_bool)?;
    let dump = s.or("dump_local_norm", false, read_bool)?;
    let dump_path = s.get("dump_local_norm_path", path_reader(base))?;
    let dump_local_norm = match (dump, dump_path) {
        (true, Some(path)) => Some(path),
        (true, None) => Some(output.dir.join("local_norm")),
        (false, Some(_)) => {
            warnings.push(
                "train.dump_local_norm_path has no effect unless train.dump_local_norm = true"
                    .to_string(),
            );
            None
        }
        (false, None) => None,
    };
    let precision = s.or("precision", Precision::F32, |key, v| {
        read_enum(key, v, &["f32", "bf16", "f16"], Precision::parse)
    })?;
    let loss_scale = s.get("loss_scale", |key, v| match v {
        Value::String(text) if text == "dynamic" => Ok(LossScale::Dynamic),
        Value::Integer(n) if n >= 1 => Ok(LossScale::Static(n as f64)),
        Value::Float(x) if x.is_finite() && x >= 1.0 => Ok(LossScale::Static(x)),
        other => Err(wrong_type(key, "\"dynamic\" or a number ≥ 1", &other)),
    })?;
    let loss_scale = match (precision, loss_scale) {
        // f16's range needs a scale: dynamic unless one is given.
        (Precision::F16, None) => Some(LossScale::Dynamic),
        (Precision::F32, Some(_)) => {
            warnings
                .push("train.loss_scale has no effect with train.precision = \"f32\"".to_string());
            None
        }
        (_, given) => given,
    };
    Ok(TrainLoopConfig {
        epochs,
        max_steps: (max_steps > 0).then_some(max_steps),
        grad_accumulation_steps,
        seed,
        deterministic,
        eval,
        eval_interval,
        per_print_times,
        print_local_norm,
        dump_local_norm,
        precision,
        loss_scale,
        parameter_broadcast,
        lazy_init,
        max_grad_norm,
    })
}

/// `train.max_grad_norm`: a finite number > 0.
fn read_max_grad_norm(key: &str, value: Value) -> Result<MaxGradNorm, RuntimeError> {
    let norm = read_float(key, value)?;
    MaxGradNorm::new(norm).ok_or_else(|| {
        config_error(
            key,
            format!("{norm} is not a clipping norm: it must be a finite number > 0 (the global gradient norm is clipped to it)"),
        )
    })
}

fn read_output(mut s: Section, base: &Path) -> Result<OutputConfig, RuntimeError> {
    Ok(OutputConfig {
        dir: s.require("dir", path_reader(base))?,
        save_checkpoint: s.or("save_checkpoint", true, read_bool)?,
        save_checkpoint_steps: s
            .get("save_checkpoint_steps", read_positive)?
            .map(|n| n as u64),
        save_checkpoint_seconds: s
            .get("save_checkpoint_seconds", read_positive)?
            .map(|n| n as u64),
        keep_checkpoint_max: s.or("keep_checkpoint_max", 5, read_positive)?,
        resume_from: s.get("resume_from", |key, v| match v {
            Value::String(text) if text == "latest" => Ok(ResumeFrom::Latest),
            other => path_reader(base)(key, other).map(ResumeFrom::Dir),
        })?,
        resume_strategy: s.get("resume_strategy", path_reader(base))?,
        group_info_file: s.get("group_info_file", |key, v| {
            let text = read_string(key, v)?;
            match text.is_empty() {
                true => Err(config_error(key, "a file name, not the empty string")),
                false => Ok(text),
            }
        })?,
    })
}
