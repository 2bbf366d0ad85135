//! Every configuration key takes effect, or is reported: a key given where it cannot act (in
//! this mode, model, data format or combination of keys) is accepted with a warning naming it,
//! and the same key where it acts gets no warning.

use std::path::Path;

use runtime::TrainConfig;

/// The seed MLP on IDX images, stand-alone.
const MLP: &str = crate::config::MINIMAL;

/// The parameter-server mode: a worker computes its share of each batch in one pass.
const PS_MODE: &str = "parallel.mode=\"parameter_server\"";

/// The GPT on text, 4 devices in semi_auto.
const GPT: &str = r#"
[model]
name = "gpt"
layers = 2
heads = 4
hidden = 32
seq_len = 16
[data]
format = "text"
path = "t.txt"
batch_size = 8
[parallel]
mode = "semi_auto"
devices = 4
[train]
epochs = 1
optimizer = "adam"
learning_rate = 0.01
[output]
dir = "out"
"#;

/// The config `text` with `overrides`, which must be valid.
fn parse(text: &str, overrides: &[&str]) -> TrainConfig {
    crate::config::parse_with(text, overrides).unwrap_or_else(|e| panic!("{overrides:?}: {e}"))
}

/// The warnings of `text` with `overrides` that mention `needle`.
fn warned(text: &str, overrides: &[&str], needle: &str) -> Vec<String> {
    parse(text, overrides)
        .warnings()
        .into_iter()
        .filter(|w| w.contains(needle))
        .collect()
}

/// `needle` is warned about with `unused`, in a warning saying "has no effect", and not with
/// `used` (where the key acts).
fn check(text: &str, unused: &[&str], used: &[&str], needle: &str) {
    let found = warned(text, unused, needle);
    assert!(
        found.iter().any(|w| w.contains("has no effect")),
        "{unused:?}: no warning about {needle}: {:?}",
        parse(text, unused).warnings()
    );
    let quiet = warned(text, used, needle);
    assert!(quiet.is_empty(), "{used:?}: {quiet:?}");
}

#[test]
fn shuffle_is_reported_for_text_data() {
    check(GPT, &["data.shuffle=false"], &[], "data.shuffle");
    let none = warned(MLP, &["data.shuffle=false"], "data.shuffle");
    assert!(none.is_empty(), "{none:?}");
    // Still read by its rule.
    let bad = TrainConfig::parse(
        GPT,
        None,
        &["data.shuffle=3".to_string()],
        Path::new("/base"),
    )
    .unwrap_err()
    .to_string();
    assert!(bad.contains("data.shuffle"), "{bad}");
}

#[test]
fn pixel_max_is_reported_when_standardisation_cancels_it() {
    check(
        MLP,
        &["data.pixel_max=16"],
        &["data.pixel_max=16", "data.normalize=scale"],
        "data.pixel_max",
    );
}

#[test]
fn a_byte_tokenizer_is_reported_for_token_files() {
    check(
        GPT,
        &["data.format=tokens", "data.tokenizer=byte"],
        &["data.tokenizer=byte"],
        "data.tokenizer",
    );
}

#[test]
fn eval_batches_are_reported_when_nothing_evaluates() {
    check(
        GPT,
        &["data.eval_batches=2", "train.eval=false"],
        &[
            "data.eval_batches=2",
            "train.eval=false",
            "train.eval_interval=5",
        ],
        "data.eval_batches",
    );
    let evaluating = warned(GPT, &["data.eval_batches=2"], "data.eval_batches");
    assert!(evaluating.is_empty(), "{evaluating:?}");
}

#[test]
fn deterministic_blocks_are_reported_outside_deterministic_mode() {
    check(
        MLP,
        &["parallel.deterministic_blocks=4"],
        &[
            "parallel.deterministic_blocks=4",
            "train.deterministic=true",
        ],
        "parallel.deterministic_blocks",
    );
}

#[test]
fn fp32_communication_keys_are_reported_in_f32_training() {
    for key in [
        "parallel.enable_fp32_communication=true",
        "parallel.gradient_fp32_sync=false",
    ] {
        let name = key.split('=').next().unwrap();
        check(GPT, &[key], &[key, "train.precision=bf16"], name);
    }
    // gradient_fp32_sync = false, overridden by enable_fp32_communication.
    check(
        GPT,
        &[
            "train.precision=bf16",
            "parallel.gradient_fp32_sync=false",
            "parallel.enable_fp32_communication=true",
        ],
        &["train.precision=bf16", "parallel.gradient_fp32_sync=false"],
        "parallel.gradient_fp32_sync",
    );
}

#[test]
fn gradient_accumulation_shard_is_reported_without_accumulation() {
    let mut unused = vec![
        "parallel.mode=data_parallel",
        "parallel.devices=4",
        "parallel.hsdp.optimizer_level=\"zero1\"",
        "parallel.hsdp.gradient_accumulation_shard=false",
    ];
    let mut used = unused.clone();
    used.push("train.grad_accumulation_steps=2");
    check(MLP, &unused, &used, "gradient_accumulation_shard");
    // Micro-batch interleaving accumulates too.
    unused.push("parallel.micro_batch_interleave=2");
    let quiet = warned(MLP, &unused, "gradient_accumulation_shard");
    assert!(quiet.is_empty(), "{quiet:?}");
}

#[test]
fn the_search_time_budget_is_reported_outside_dynamic_programming() {
    for mode in ["sharding_propagation", "recursive_programming"] {
        let mode = format!("parallel.mode={mode}");
        check(
            MLP,
            &[&mode, "parallel.devices=2", "parallel.search_time_budget=5"],
            &[
                "parallel.mode=dynamic_programming",
                "parallel.devices=2",
                "parallel.search_time_budget=5",
            ],
            "parallel.search_time_budget",
        );
    }
}

#[test]
fn batch_split_keys_are_reported_on_one_device() {
    for key in [
        "parallel.dataset_strategy=\"full_batch\"",
        "parallel.gradients_mean=false",
        "parallel.loss_repeated_mean=false",
    ] {
        let name = key.split('=').next().unwrap();
        check(
            MLP,
            &[key],
            &[key, "parallel.mode=data_parallel", "parallel.devices=2"],
            name,
        );
    }
}

#[test]
fn hsdp_on_one_device_is_reported_after_the_devices_flag() {
    let unused = [
        "parallel.mode=data_parallel",
        "parallel.devices=1",
        "parallel.hsdp.optimizer_level=\"zero1\"",
    ];
    check(
        MLP,
        &unused,
        &[
            "parallel.mode=data_parallel",
            "parallel.devices=2",
            "parallel.hsdp.optimizer_level=\"zero1\"",
        ],
        "[parallel.hsdp]",
    );
    let two = parse(MLP, &unused).with_devices(2).unwrap();
    assert!(
        !two.warnings().iter().any(|w| w.contains("[parallel.hsdp]")),
        "{:?}",
        two.warnings()
    );
}

#[test]
fn gpt_split_keys_over_an_axis_of_one_are_reported() {
    let cases = [
        (
            "parallel.use_seq_parallel=true",
            "parallel.model_parallel=2",
            "use_seq_parallel",
        ),
        (
            "parallel.vocab_emb_dp=false",
            "parallel.model_parallel=2",
            "vocab_emb_dp",
        ),
        (
            "parallel.context_parallel_algo=ring",
            "parallel.context_parallel=2",
            "context_parallel_algo",
        ),
    ];
    for (key, axis, name) in cases {
        check(GPT, &[key], &[key, axis], name);
    }
}

#[test]
fn recompute_and_overlap_keys_without_their_subject_are_reported() {
    check(
        MLP,
        &["parallel.recompute.mp_comm_recompute=false"],
        &["parallel.recompute.ops=[\"ReLU\"]"],
        "[parallel.recompute]",
    );
    let hsdp = [
        "parallel.mode=data_parallel",
        "parallel.devices=2",
        "parallel.hsdp.optimizer_level=\"level1\"",
    ];
    let key = "parallel.recompute.parallel_optimizer_comm_recompute=true";
    let ops = "parallel.recompute.ops=[\"ReLU\"]";
    let mut used = hsdp.to_vec();
    used.extend([key, ops]);
    check(
        MLP,
        &[
            "parallel.mode=data_parallel",
            "parallel.devices=2",
            key,
            ops,
        ],
        &used,
        "parallel_optimizer_comm_recompute",
    );
    let key = "parallel.overlap.computation_allgather_overlap=true";
    let mut used = hsdp.to_vec();
    used.push(key);
    check(
        MLP,
        &[
            "parallel.mode=data_parallel",
            "parallel.devices=2",
            "parallel.hsdp.optimizer_level=\"zero2\"",
            key,
        ],
        &used,
        "computation_allgather_overlap",
    );
}

#[test]
fn fusion_keys_with_fusion_off_are_reported() {
    let dp = ["parallel.mode=data_parallel", "parallel.devices=2"];
    let size = "parallel.comm_fusion.allreduce={mode=\"size\",config=1}";
    let mut unused = dp.to_vec();
    unused.extend([size, "parallel.comm_fusion.openstate=false"]);
    let mut used = dp.to_vec();
    used.push(size);
    check(MLP, &unused, &used, "parallel.comm_fusion.allreduce");
    let overlap = "parallel.overlap.grad_computation_allreduce_overlap=true";
    unused.push(overlap);
    used.push(overlap);
    check(MLP, &unused, &used, "grad_computation_allreduce_overlap");
}

#[test]
fn pipeline_keys_with_one_stage_are_reported() {
    for key in [
        "parallel.pipeline.output_broadcast=true",
        "parallel.pipeline.scheduler=gpipe",
    ] {
        let name = key.split('=').next().unwrap();
        check(
            GPT,
            &["parallel.pipeline.stages=1", key],
            &["parallel.pipeline.stages=2", key],
            name,
        );
    }
    // micro_batches acts with one stage: it cuts the batch.
    let cut = parse(
        GPT,
        &[
            "parallel.pipeline.stages=1",
            "parallel.pipeline.micro_batches=2",
        ],
    );
    assert!(cut.warnings().is_empty(), "{:?}", cut.warnings());
    assert_eq!(cut.data().batch_size, 4);
}

#[test]
fn communication_keys_are_reported_on_one_device() {
    for (key, needle) in [
        (
            "parallel.comm_fusion.openstate=true",
            "[parallel.comm_fusion]",
        ),
        ("parallel.comm_reuse=0", "parallel.comm_reuse"),
    ] {
        check(
            MLP,
            &[key],
            &[key, "parallel.mode=data_parallel", "parallel.devices=2"],
            needle,
        );
    }
}

#[test]
fn batch_cuts_are_refused_in_parameter_server_mode() {
    for (key, named) in [
        (
            "parallel.micro_batch_interleave=2",
            "parallel.micro_batch_interleave",
        ),
        ("parallel.pipeline.micro_batches=2", "parallel.pipeline"),
        ("parallel.pipeline.stages=2", "parallel.pipeline"),
    ] {
        let mut overrides = vec![PS_MODE, key];
        if key.contains("micro_batches") {
            overrides.push("parallel.pipeline.stages=1");
        }
        let err = crate::config::parse_with(MLP, &overrides).unwrap_err();
        match err {
            runtime::RuntimeError::Config { key, reason } => {
                assert_eq!(key, named, "{reason}");
                assert!(reason.contains("parameter_server"), "{reason}");
            }
            other => panic!("{overrides:?}: {other}"),
        }
    }
    // The batch stays whole: a worker's share of 8 rows.
    assert_eq!(parse(MLP, &[PS_MODE]).data().batch_size, 8);
}

#[test]
fn parameter_server_warnings_name_the_mode_the_file_sets() {
    let config = parse(MLP, &[PS_MODE, "parallel.hsdp.threshold=0"]);
    let hsdp: Vec<String> = config
        .warnings()
        .into_iter()
        .filter(|w| w.contains("[parallel.hsdp]"))
        .collect();
    assert_eq!(hsdp.len(), 1, "{hsdp:?}");
    assert!(hsdp[0].contains("mode \"parameter_server\""), "{hsdp:?}");
}
