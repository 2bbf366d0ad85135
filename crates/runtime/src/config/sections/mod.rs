//! The sections of a config file, each read into its struct, and the keys each may hold: one
//! module per section; this module takes the sections out of the file in order and applies
//! the checks that span sections.
//!
//! `[ps]` is read by `config::ps`; the shared value readers are `config::values`.

mod data;
mod hsdp;
mod model;
mod moe;
mod output;
mod parallel;
mod train;

use std::path::Path;

use ::parallel::ParallelConfig;
use toml::{Table, Value};

use self::data::read_data;
use self::model::{check_model_data, read_model};
use self::output::read_output;
use self::parallel::{
    check_gpt_parallel_keys, read_gpt_parallel, read_micro_batch_interleave, read_parallel,
};
use self::train::{read_optimizer, read_train_loop};
use super::values::{config_error, one_of, read_bool, Section, MAX_GRAD_ACCUMULATION_STEPS};
use super::{DataConfig, TrainConfig, TrainLoopConfig};
use crate::error::RuntimeError;

pub(super) use self::data::DATA_KEYS;
pub(super) use self::hsdp::check_shard_size;
#[cfg(test)]
pub(super) use self::hsdp::HSDP_KEYS;
pub(crate) use self::hsdp::{shard_size_warning, ShardSizeCover, ShardSizeWarning};
pub(super) use self::model::MODEL_KEYS;
pub(super) use self::output::OUTPUT_KEYS;
pub(super) use self::parallel::PARALLEL_KEYS;
pub(super) use self::train::TRAIN_KEYS;

/// The sections of a config file, in file order.
pub(super) const SECTIONS: &[&str] = &["model", "data", "parallel", "train", "output", "ps"];

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

/// Reads a parsed config file (paths resolved against `base`) into its config, section by
/// section.
pub(super) fn from_root(mut root: Table, base: &Path) -> Result<TrainConfig, RuntimeError> {
    if let Some(unknown) = root.keys().find(|k| !SECTIONS.contains(&k.as_str())) {
        return Err(config_error(
            unknown,
            format!("unknown section (valid sections: {})", one_of(SECTIONS)),
        ));
    }
    let mut warnings = Vec::new();
    let eval_batches_given = root
        .get("data")
        .and_then(|data| data.get("eval_batches"))
        .is_some();
    let model = read_model(
        take_section(&mut root, "model", MODEL_KEYS, true)?,
        &mut warnings,
    )?;
    let data = read_data(
        take_section(&mut root, "data", DATA_KEYS, true)?,
        base,
        &mut warnings,
    )?;
    check_model_data(&model, &data)?;
    let mut config = from_sections(root, base, model, data, warnings)?;
    let train = &config.train;
    if eval_batches_given
        && config.data.text.is_some()
        && !train.eval
        && train.eval_interval.is_none()
    {
        config.warnings.push(
            "data.eval_batches has no effect with train.eval = false and no \
             train.eval_interval: the run never evaluates"
                .to_string(),
        );
    }
    Ok(config)
}

/// Reads a parsed config holding `[parallel]`, `[train]`, `[output]` (and `[ps]`) for a network
/// and data set built in code (`model`, `data`): a front end's network (the Python package's
/// `Model.train`) trained with every key a file may hold. `[model]` and `[data]` are refused.
pub(super) fn for_network(
    mut root: Table,
    base: &Path,
    model: super::ModelConfig,
    data: DataConfig,
) -> Result<TrainConfig, RuntimeError> {
    if let Some(unknown) = root.keys().find(|k| !SECTIONS.contains(&k.as_str())) {
        return Err(config_error(
            unknown,
            format!("unknown section (valid sections: {})", one_of(SECTIONS)),
        ));
    }
    for given in ["model", "data"] {
        if root.remove(given).is_some() {
            return Err(config_error(
                given,
                format!("[{given}] comes from the network and data set built in code, not from the configuration"),
            ));
        }
    }
    from_sections(root, base, model, data, Vec::new())
}

/// The sections after `[model]` and `[data]`, and the checks that span sections.
fn from_sections(
    mut root: Table,
    base: &Path,
    model: super::ModelConfig,
    mut data: DataConfig,
    mut warnings: Vec<String>,
) -> Result<TrainConfig, RuntimeError> {
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
    // Keys whose effect depends on `[train]`, read after this section: whether each was given.
    let deterministic_blocks_given = parallel_section.has("deterministic_blocks");
    let fp32_keys_given = ["enable_fp32_communication", "gradient_fp32_sync"]
        .map(|key| (key, parallel_section.has(key)));
    let accumulation_shard_given = parallel_section.has_in("hsdp", "gradient_accumulation_shard");
    let batch_split_keys_given: Vec<&str> =
        ["dataset_strategy", "gradients_mean", "loss_repeated_mean"]
            .into_iter()
            .filter(|key| parallel_section.has(key))
            .collect();
    let (parallel, strategy_file) = read_parallel(parallel_section, base, ps_mode, &mut warnings)?;
    let mode_name = match ps_mode {
        true => super::ps::PARAMETER_SERVER_MODE,
        false => parallel.mode.name(),
    };
    let has_moe = model.gpt.as_ref().is_some_and(|g| g.moe.is_some());
    if parallel.mode == ::parallel::ParallelMode::StandAlone {
        // One device computes every step (a worker's, in parameter_server): the batch is not
        // split, and the loss is neither summed over shards nor repeated.
        for key in batch_split_keys_given {
            warnings.push(format!(
                "parallel.{key} has no effect in mode \"{mode_name}\" (one device computes \
                 each step: the batch is not split over devices)"
            ));
        }
    }
    check_gpt_parallel_keys(
        &gpt_parallel,
        (parallel.mode, mode_name),
        has_moe,
        &mut warnings,
    )?;
    if ps_mode && has_moe {
        return Err(config_error(
            "model.moe",
            format!(
                "mixture-of-experts blocks do not run in mode \"{mode_name}\": each worker would balance the experts over its own batch (the load-balancing loss is not separable over the batch, so the numbers would not be data parallel's) and no worker sees the job's dropped-token count; use mode \"data_parallel\" or \"semi_auto\" (with parallel.expert_parallel)"
            ),
        ));
    }
    warn_search_keys_unused(&search, parallel.mode, mode_name, &mut warnings);
    if search.auto_pipeline && !matches!(parallel.mode, ::parallel::ParallelMode::Auto(_)) {
        return Err(config_error(
            "parallel.auto_pipeline",
            format!(
                "applies only with a search mode (sharding_propagation, recursive_programming or dynamic_programming), not parallel.mode = \"{}\"",
                parallel.mode.name()
            ),
        ));
    }
    let output = read_output(
        take_section(&mut root, "output", OUTPUT_KEYS, true)?,
        base,
        &mut warnings,
    )?;
    let mut train_section = take_section(&mut root, "train", TRAIN_KEYS, true)?;
    let optimizer = read_optimizer(&mut train_section, &mut warnings)?;
    let lr_schedule =
        super::lr::read_lr_schedule(&mut train_section, optimizer.learning_rate, &mut warnings)?;
    let weight_decay_filter = super::lr::read_weight_decay_filter(&mut train_section)?;
    let mut train = read_train_loop(train_section, &output, base, &mut warnings)?;
    if data.text.as_ref().is_some_and(|t| t.val_fraction == 0.0)
        && (train.eval || train.eval_interval.is_some())
    {
        warnings.push(
            "train.eval and train.eval_interval have no effect with data.val_fraction = 0: \
             there is no validation split to evaluate on (no eval_loss is reported)"
                .to_string(),
        );
    }
    if ps_mode && optimizer.kind.needs_norms() {
        return Err(config_error(
            "train.optimizer",
            format!(
                "\"{}\" is not available in mode \"{}\": its trust ratio needs each parameter's norms over the whole parameter, and the servers update a table by the rows a push holds; use a collective mode (data_parallel, semi_auto, …)",
                optimizer.kind.name(),
                super::ps::PARAMETER_SERVER_MODE
            ),
        ));
    }
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
    if ps.is_some() {
        check_no_batch_cut_in_ps(micro_batch_interleave, &parallel)?;
    }
    // Pipeline micro-batches cut each step's batch: M micro-batches of batch / M, one update.
    if let Some(m) = parallel
        .pipeline
        .as_ref()
        .map(|p| p.micro_batches)
        .filter(|&m| m > 1)
    {
        cut_batch(
            m,
            "parallel.pipeline.micro_batches",
            (
                "micro-batches",
                "each micro-batch is an equal share of the step's batch",
            ),
            (&mut data, &mut train),
        )?;
    }
    if micro_batch_interleave > 1 {
        interleave_micro_batches(micro_batch_interleave, &parallel, &mut data, &mut train)?;
    }
    if deterministic_blocks_given && !train.deterministic {
        warnings.push(
            "parallel.deterministic_blocks has no effect unless train.deterministic = true \
             (it sizes deterministic mode's canonical blocks)"
                .to_string(),
        );
    }
    warn_fp32_keys_unused(&fp32_keys_given, &parallel, &train, &mut warnings);
    if accumulation_shard_given && train.grad_accumulation_steps == 1 {
        warnings.push(
            "parallel.hsdp.gradient_accumulation_shard has no effect without gradient \
             accumulation (train.grad_accumulation_steps, parallel.pipeline.micro_batches or \
             parallel.micro_batch_interleave above 1): no gradient is accumulated"
                .to_string(),
        );
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

/// In `parameter_server` mode a worker computes its rows of each global batch in one pass and
/// pushes that gradient: a setting that would cut the batch into micro-batches is refused
/// (the batch would otherwise shrink to one micro-batch, silently).
fn check_no_batch_cut_in_ps(
    micro_batch_interleave: usize,
    parallel: &ParallelConfig,
) -> Result<(), RuntimeError> {
    let mode = super::ps::PARAMETER_SERVER_MODE;
    if micro_batch_interleave > 1 {
        return Err(config_error(
            "parallel.micro_batch_interleave",
            format!("must be 1 in mode \"{mode}\" (a worker pushes the gradient of its whole share of each batch)"),
        ));
    }
    if let Some(p) = parallel
        .pipeline
        .as_ref()
        .filter(|p| p.stages > 1 || p.micro_batches > 1)
    {
        return Err(config_error(
            "parallel.pipeline",
            format!(
                "stages = {} and micro_batches = {} do not run in mode \"{mode}\" (each worker runs its share of each batch on one device, in one pass)",
                p.stages, p.micro_batches
            ),
        ));
    }
    Ok(())
}

/// `parallel.enable_fp32_communication` and `parallel.gradient_fp32_sync` (`given`: whether
/// each was in the file) act on half-precision sums only; in f32 training they are reported
/// in `warnings`, and so is `gradient_fp32_sync = false` that `enable_fp32_communication =
/// true` overrides.
fn warn_fp32_keys_unused(
    given: &[(&str, bool)],
    parallel: &ParallelConfig,
    train: &TrainLoopConfig,
    warnings: &mut Vec<String>,
) {
    if train.precision == exec::Precision::F32 {
        for (key, _) in given.iter().filter(|(_, given)| *given) {
            warnings.push(format!(
                "parallel.{key} has no effect with train.precision = \"f32\" (it decides how \
                 half-precision sums are added)"
            ));
        }
    } else if parallel.enable_fp32_communication && !parallel.gradient_fp32_sync {
        warnings.push(
            "parallel.gradient_fp32_sync = false has no effect with \
             parallel.enable_fp32_communication = true, which adds every half-precision sum \
             in f32"
                .to_string(),
        );
    }
}

/// The search keys only a search mode reads (`tessera train` and `tessera plan` alike) are
/// reported in `warnings` when set in any other mode: a strategy file to load instead of
/// searching, and the search's time budget. (`device_profile`, `max_device_memory` and
/// `save_operator_strategy_file` also serve `tessera plan` costing configured strategies.)
fn warn_search_keys_unused(
    search: &super::SearchKeys,
    mode: ::parallel::ParallelMode,
    mode_name: &str,
    warnings: &mut Vec<String>,
) {
    let defaults = super::SearchKeys::default();
    if let ::parallel::ParallelMode::Auto(algo) = mode {
        if algo != ::parallel::SearchMode::DynamicProgramming
            && search.search_time_budget != defaults.search_time_budget
        {
            warnings.push(format!(
                "parallel.search_time_budget has no effect in mode \"{mode_name}\" (only \
                 dynamic_programming's search is bounded by it)"
            ));
        }
        return;
    }
    let set = [
        (
            "load_operator_strategy_file",
            search.load_operator_strategy_file.is_some(),
        ),
        (
            "search_time_budget",
            search.search_time_budget != defaults.search_time_budget,
        ),
    ];
    for (key, _) in set.iter().filter(|(_, given)| *given) {
        warnings.push(format!(
            "parallel.{key} has no effect in mode \"{mode_name}\" (only the search modes \
             sharding_propagation, recursive_programming and dynamic_programming read it)"
        ));
    }
}

/// A key's reader whose value is only checked, not kept: see [`check_unused`].
pub(super) type Check<'a> = &'a dyn Fn(&str, Value) -> Result<(), RuntimeError>;

/// `read` as a [`Check`]: the value read, then dropped.
pub(super) fn checked<T>(
    read: impl Fn(&str, Value) -> Result<T, RuntimeError>,
) -> impl Fn(&str, Value) -> Result<(), RuntimeError> {
    move |key, value| read(key, value).map(drop)
}

/// Records a warning for every key of `keys` present in `s`, which has no effect because
/// `why`; the keys are removed. Each value is first read by its key's reader (the one that
/// reads it where it acts), so a value of the wrong type or out of the key's range is an error
/// naming the key and the rule, as it is where the key has an effect.
fn check_unused(
    s: &mut Section,
    section: &str,
    keys: &[(&str, Check<'_>)],
    why: &str,
    warnings: &mut Vec<String>,
) -> Result<(), RuntimeError> {
    for (key, check) in keys {
        if s.get(key, check)?.is_some() {
            warnings.push(format!("{section}.{key} has no effect {why}"));
        }
    }
    Ok(())
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
    cut_batch(
        n,
        key,
        ("parts", "each part is an equal share of the batch"),
        (data, train),
    )
}

/// Cuts each batch into `n` equal micro-steps of one update (`key` the setting that asks):
/// `data.batch_size` becomes the micro-step's, `train.grad_accumulation_steps` is multiplied
/// by `n`. `(parts, each)` name the micro-steps in the errors.
fn cut_batch(
    n: usize,
    key: &'static str,
    (parts, each): (&str, &str),
    (data, train): (&mut DataConfig, &mut TrainLoopConfig),
) -> Result<(), RuntimeError> {
    if !data.batch_size.is_multiple_of(n) {
        return Err(config_error(
            key,
            format!(
                "{n} {parts} do not divide data.batch_size = {} ({each})",
                data.batch_size
            ),
        ));
    }
    data.batch_size /= n;
    data.batch_cuts.push((key, n));
    train.grad_accumulation_steps = train
        .grad_accumulation_steps
        .checked_mul(n)
        .filter(|&k| k <= MAX_GRAD_ACCUMULATION_STEPS)
        .ok_or_else(|| {
            config_error(
                key,
                format!(
                    "{n} {parts} × train.grad_accumulation_steps = {} exceed {MAX_GRAD_ACCUMULATION_STEPS} micro-steps per update",
                    train.grad_accumulation_steps
                ),
            )
        })?;
    Ok(())
}
