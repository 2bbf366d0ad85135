//! `[parallel]`: the parallel mode, devices, op strategies, dataset strategy, manual
//! embedding splits, and the GPT's MindFormers keys; its sub-tables are read by
//! `sections::hsdp`, `config::pipeline`, `config::memory` and `config::search`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use layout::Layout;
use models::ContextParallelAlgo;
use parallel::{DatasetStrategy, ParallelConfig, ParallelMode};
use toml::Value;

use super::hsdp::read_hsdp;
use crate::config::layouts::{read_mesh, read_strategy_entry, StrategyEntry};
use crate::config::values::{
    config_error, path_reader, read_bool, read_device_count, read_enum, read_positive, wrong_type,
    Section, MAX_GRAD_ACCUMULATION_STEPS,
};
use crate::config::{GptParallelKeys, ModelName};
use crate::error::RuntimeError;

/// `[parallel]`'s keys.
pub(in crate::config) const PARALLEL_KEYS: &[&str] = &[
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
    "context_parallel",
    "context_parallel_algo",
    "vocab_emb_dp",
    "use_seq_parallel",
    "expert_parallel",
    "device_profile",
    "max_device_memory",
    "search_time_budget",
    "save_operator_strategy_file",
    "load_operator_strategy_file",
    "auto_pipeline",
];

/// `[parallel]`'s MindFormers keys, read only for the GPT.
const GPT_PARALLEL_KEYS: &[&str] = &[
    "data_parallel",
    "model_parallel",
    "context_parallel",
    "context_parallel_algo",
    "vocab_emb_dp",
    "use_seq_parallel",
    "expert_parallel",
];

/// `[parallel]`'s MindFormers keys; they set the GPT's strategies and mean nothing to other
/// models, for which they are read all the same (a bad value is an error naming the key), then
/// reported in `warnings`.
pub(super) fn read_gpt_parallel(
    s: &mut Section,
    model: ModelName,
    warnings: &mut Vec<String>,
) -> Result<GptParallelKeys, RuntimeError> {
    let given: Vec<&str> = GPT_PARALLEL_KEYS
        .iter()
        .copied()
        .filter(|key| s.has(key))
        .collect();
    let keys = read_gpt_parallel_keys(s)?;
    if model != ModelName::Gpt {
        for key in given {
            warnings.push(format!(
                "parallel.{key} has no effect unless model.name = \"gpt\""
            ));
        }
        return Ok(GptParallelKeys::default());
    }
    Ok(keys)
}

/// Reads `[parallel]`'s MindFormers keys.
fn read_gpt_parallel_keys(s: &mut Section) -> Result<GptParallelKeys, RuntimeError> {
    Ok(GptParallelKeys {
        data_parallel: s.get("data_parallel", read_positive)?,
        model_parallel: s.or("model_parallel", 1, read_positive)?,
        context_parallel: s.or("context_parallel", 1, read_positive)?,
        context_parallel_algo: s.or(
            "context_parallel_algo",
            ContextParallelAlgo::Ulysses,
            |k, v| {
                read_enum(
                    k,
                    v,
                    &ContextParallelAlgo::NAMES,
                    ContextParallelAlgo::parse,
                )
            },
        )?,
        vocab_emb_dp: s.or("vocab_emb_dp", true, read_bool)?,
        use_seq_parallel: s.or("use_seq_parallel", false, read_bool)?,
        expert_parallel: s.or("expert_parallel", 1, read_positive)?,
    })
}

/// The MindFormers keys set the GPT's strategies in `semi_auto` only. `expert_parallel` above 1
/// without MoE blocks is refused in every mode; in any mode but `semi_auto` each key set away
/// from its default is reported in `warnings` as having no effect (`mode` is the run's mode,
/// `mode_name` its config name: `parameter_server` runs its workers as `mode`).
pub(super) fn check_gpt_parallel_keys(
    keys: &GptParallelKeys,
    (mode, mode_name): (ParallelMode, &str),
    has_moe: bool,
    warnings: &mut Vec<String>,
) -> Result<(), RuntimeError> {
    if keys.expert_parallel > 1 && !has_moe {
        return Err(config_error(
            "parallel.expert_parallel",
            format!(
                "{} expert-parallel shards need MoE blocks: set [model.moe]",
                keys.expert_parallel
            ),
        ));
    }
    if mode == ParallelMode::SemiAuto && mode_name == mode.name() {
        // Keys that split over an axis of size 1 split nothing.
        let one_axis = [
            (
                keys.use_seq_parallel,
                "use_seq_parallel = true",
                keys.model_parallel,
                "model_parallel",
                "the residual stream's sequence is split over model_parallel",
            ),
            (
                !keys.vocab_emb_dp,
                "vocab_emb_dp = false",
                keys.model_parallel,
                "model_parallel",
                "the vocabulary is split over model_parallel",
            ),
            (
                keys.context_parallel_algo != ContextParallelAlgo::Ulysses,
                "context_parallel_algo = \"ring\"",
                keys.context_parallel,
                "context_parallel",
                "the algorithm runs attention over the context_parallel shards",
            ),
        ];
        for (set, what, axis, axis_key, why) in one_axis {
            if set && axis == 1 {
                warnings.push(format!(
                    "parallel.{what} has no effect with parallel.{axis_key} = 1 ({why})"
                ));
            }
        }
        return Ok(());
    }
    let default = GptParallelKeys::default();
    let set = [
        ("data_parallel", keys.data_parallel != default.data_parallel),
        (
            "model_parallel",
            keys.model_parallel != default.model_parallel,
        ),
        (
            "context_parallel",
            keys.context_parallel != default.context_parallel,
        ),
        (
            "context_parallel_algo",
            keys.context_parallel_algo != default.context_parallel_algo,
        ),
        ("vocab_emb_dp", keys.vocab_emb_dp != default.vocab_emb_dp),
        (
            "use_seq_parallel",
            keys.use_seq_parallel != default.use_seq_parallel,
        ),
        (
            "expert_parallel",
            keys.expert_parallel != default.expert_parallel,
        ),
    ];
    let why = match mode {
        ParallelMode::Auto(_) => "(the search chooses every op's split itself)",
        _ => "(only semi_auto splits the GPT by these keys)",
    };
    for (key, _) in set.iter().filter(|(_, differs)| *differs) {
        warnings.push(format!(
            "parallel.{key} has no effect in mode \"{mode_name}\" {why}"
        ));
    }
    Ok(())
}

/// `parallel.micro_batch_interleave`: an integer ≥ 1.
pub(super) fn read_micro_batch_interleave(key: &str, value: Value) -> Result<usize, RuntimeError> {
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

/// Reads the rest of `[parallel]` (after [`read_gpt_parallel`] and the search keys) into the
/// parallel config and the strategy file to load, if any. `ps_mode`: the file's mode is
/// `parameter_server` (taken out already: each worker runs stand-alone), which the warnings
/// name.
pub(super) fn read_parallel(
    mut s: Section,
    base: &Path,
    ps_mode: bool,
    warnings: &mut Vec<String>,
) -> Result<(ParallelConfig, Option<PathBuf>), RuntimeError> {
    let modes = ParallelMode::NAMES;
    let mode = s.or("mode", ParallelMode::StandAlone, |key, v| {
        read_enum(key, v, &modes, ParallelMode::parse)
    })?;
    let mode_name = match ps_mode {
        true => crate::config::PARAMETER_SERVER_MODE,
        false => mode.name(),
    };
    let devices_given = s.has("devices");
    let pipeline_given: Vec<&str> = [
        "scheduler",
        "interleave",
        "virtual_stages",
        "output_broadcast",
        "stage_config",
    ]
    .into_iter()
    .filter(|key| s.has_in("pipeline", key))
    .collect();
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
    let pipeline = s
        .get("pipeline", crate::config::pipeline::read_pipeline)?
        .map(|(pipeline, unused)| {
            warnings.extend(unused);
            pipeline
        });
    let comm_reuse_given = s.has("comm_reuse");
    let fusion_given: Vec<&str> = ["allreduce", "reducescatter", "allgather"]
        .into_iter()
        .filter(|key| s.has_in("comm_fusion", key))
        .collect();
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
    let recompute = s.get("recompute", crate::config::memory::read_recompute)?;
    let comm_fusion = s.get("comm_fusion", crate::config::memory::read_comm_fusion)?;
    let comm_reuse = s.or("comm_reuse", None, crate::config::memory::read_comm_reuse)?;
    let enable_fp32_communication = s.or("enable_fp32_communication", false, read_bool)?;
    let gradient_fp32_sync = s.or("gradient_fp32_sync", true, read_bool)?;
    let overlap = s.or(
        "overlap",
        parallel::fusion::OverlapConfig::default(),
        crate::config::memory::read_overlap,
    )?;
    warn_memory_keys_unused(
        (&recompute, &comm_fusion, &fusion_given, &overlap),
        hsdp.as_ref(),
        warnings,
    );
    // One stage is no pipeline: only `micro_batches` acts (it cuts the batch). The search
    // modes read the schedule for the pipeline they may choose (`auto_pipeline`, a loaded plan).
    if pipeline.as_ref().is_some_and(|p| p.stages == 1) && !matches!(mode, ParallelMode::Auto(_)) {
        for key in pipeline_given {
            warnings.push(format!(
                "parallel.pipeline.{key} has no effect with parallel.pipeline.stages = 1 (no \
                 pipeline runs; only micro_batches acts, cutting each batch)"
            ));
        }
    }
    if overlap.grad_computation_allreduce_overlap
        && !comm_fusion.as_ref().is_some_and(|f| f.openstate)
    {
        warnings.push(
            "parallel.overlap.grad_computation_allreduce_overlap has no effect without \
             [parallel.comm_fusion] (with openstate = true): it overlaps the fused gradient \
             buckets"
                .to_string(),
        );
    }
    if mode == ParallelMode::StandAlone && hsdp.is_some() {
        warnings.push(format!(
            "[parallel.hsdp] has no effect in mode \"{mode_name}\" (one device holds every \
             parameter whole)"
        ));
    }
    if mode == ParallelMode::StandAlone {
        // One device: no collective runs, so there is nothing to fuse, overlap or share.
        let given = [
            ("[parallel.comm_fusion]", comm_fusion.is_some()),
            ("parallel.comm_reuse", comm_reuse_given),
        ];
        for (key, _) in given.iter().filter(|(_, given)| *given) {
            warnings.push(format!(
                "{key} has no effect in mode \"{mode_name}\" (one device runs no collective \
                 communication)"
            ));
        }
    }
    if mode == ParallelMode::StandAlone && !manual_split.is_empty() {
        warnings.push(format!(
            "[parallel.manual_split] has no effect in mode \"{mode_name}\" (one device holds \
             every row)"
        ));
    }
    if let Some(op) = out_shard.keys().find(|op| !shard.contains_key(*op)) {
        return Err(config_error(
            &format!("parallel.out_shard.{op}"),
            format!("an out_strategy needs an in_strategy: add parallel.shard.{op} (MindSpore's shard() takes out_strategy only with in_strategy)"),
        ));
    }
    if !mode.uses_strategies() && !shard.is_empty() {
        warnings.push(format!(
            "[parallel.shard] has no effect in mode \"{mode_name}\" (only semi_auto and the search modes use op strategies)"
        ));
    }
    if !mode.uses_strategies() && strategy_file.is_some() {
        warnings.push(format!(
            "parallel.strategy_file has no effect in mode \"{mode_name}\" (only semi_auto and the search modes use op strategies)"
        ));
    }
    if mode == ParallelMode::StandAlone && devices_given && devices != 1 {
        warnings.push(format!(
            "parallel.devices = {devices} has no effect in mode \"stand_alone\" (it runs on 1 device)"
        ));
    }
    let is_layouts = |e: &StrategyEntry| matches!(e, StrategyEntry::Layouts(_));
    let layouts_given = matches!(dataset_strategy, DatasetStrategy::Layouts(_))
        || shard.values().chain(out_shard.values()).any(is_layouts);
    // The layouts this mode reads: op strategies only where it uses them, the dataset's
    // wherever the batch is split (not on one device).
    let layouts_used = (mode != ParallelMode::StandAlone
        && matches!(dataset_strategy, DatasetStrategy::Layouts(_)))
        || (mode.uses_strategies() && shard.values().chain(out_shard.values()).any(is_layouts));
    if mesh.is_some() && !layouts_given {
        warnings.push(
            "[parallel.mesh] has no effect: no entry of parallel.shard, parallel.out_shard or \
             parallel.dataset_strategy is a layout"
                .to_string(),
        );
    } else if mesh.is_some() && !layouts_used {
        warnings.push(format!(
            "[parallel.mesh] has no effect in mode \"{mode_name}\": the entries naming its axes \
             are not used in this mode"
        ));
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

/// The memory and communication keys that cannot act in this config, reported in `warnings`:
/// `[parallel.recompute]` naming no cell or op, `parallel_optimizer_comm_recompute` and
/// `computation_allgather_overlap` without hsdp weights in pieces (levels 1–3), and
/// `[parallel.comm_fusion]`'s collectives (`fusion_given`: those in the file) with
/// `openstate = false`.
fn warn_memory_keys_unused(
    (recompute, comm_fusion, fusion_given, overlap): (
        &Option<parallel::RecomputeConfig>,
        &Option<parallel::fusion::CommFusionConfig>,
        &[&str],
        &parallel::fusion::OverlapConfig,
    ),
    hsdp: Option<&parallel::HsdpConfig>,
    warnings: &mut Vec<String>,
) {
    let pieces = hsdp.is_some_and(|h| h.level.shards_weights());
    if let Some(r) = recompute {
        if r.cells.is_empty() && r.ops.is_empty() {
            warnings.push(
                "[parallel.recompute] has no effect: it names no cell (recompute.cells) and no \
                 op (recompute.ops) to recompute"
                    .to_string(),
            );
        } else if r.parallel_optimizer_comm_recompute && !pieces {
            warnings.push(
                "parallel.recompute.parallel_optimizer_comm_recompute has no effect without \
                 [parallel.hsdp] at optimizer_level \"level1\", \"level2\" or \"level3\" (no \
                 weight is gathered from pieces)"
                    .to_string(),
            );
        }
    }
    if overlap.computation_allgather_overlap && !pieces {
        warnings.push(
            "parallel.overlap.computation_allgather_overlap has no effect without \
             [parallel.hsdp] at optimizer_level \"level1\", \"level2\" or \"level3\" (no \
             weight is gathered from pieces)"
                .to_string(),
        );
    }
    if comm_fusion.as_ref().is_some_and(|f| !f.openstate) {
        for key in fusion_given {
            warnings.push(format!(
                "parallel.comm_fusion.{key} has no effect with parallel.comm_fusion.openstate = \
                 false (fusion is off)"
            ));
        }
    }
}

/// `parallel.dataset_strategy`: `"data_parallel"`, `"full_batch"`, or per-input tuples or
/// layouts on `mesh`.
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
