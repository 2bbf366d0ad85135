//! The GPT with mixture-of-experts blocks (`[model.moe]`) trained with expert parallel gives
//! the numbers one device gives.
//!
//! Every case trains 20 steps of the small GPT of `run_util::small_gpt` with MoE blocks of 4
//! experts (capacity factor 1.25, so tokens are dropped) and compares the losses (relative
//! 1e-5) and the merged parameters with one device's; in deterministic mode, bitwise.

use std::path::Path;

use runtime::{Session, TrainConfig};

use crate::run_util::{self, Run};

/// `[model.moe]` with 4 experts, top-`top_k`, and `extra` keys.
fn moe_keys(top_k: usize, extra: &str) -> String {
    format!("[model.moe]\nexperts = 4\ntop_k = {top_k}\n{extra}")
}

fn config(out: &Path, moe: &str, parallel: &str, overrides: &[String]) -> TrainConfig {
    run_util::small_gpt(out, "momentum", moe, parallel, overrides)
}

fn train(config: &TrainConfig) -> Run {
    run_util::train_run(config, 20).1
}

/// Asserts every loss within a relative 1e-5 of one device's, and every parameter element
/// within `1e-5 · (1 + |x|)`.
fn assert_same_run(what: &str, run: &Run, reference: &Run) {
    run_util::assert_losses_within(what, &run.0, &reference.0, 1e-5);
    run_util::assert_same_run(what, run, reference, 1e-5);
}

/// Expert parallel (over every device; with data, model, sequence, vocabulary and context
/// parallel; in pipeline stages; with hsdp) × top-1 and top-2.
#[test]
fn expert_parallel_trains_like_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: &[(&str, usize, &str)] = &[
        ("ep 2", 2, "expert_parallel = 2"),
        ("ep 4", 4, "expert_parallel = 4"),
        (
            "dp 4 × mp 2, ep 2",
            8,
            "data_parallel = 4\nmodel_parallel = 2\nexpert_parallel = 2",
        ),
        (
            "dp 2 × mp 2, sequence and vocabulary parallel, ep 2",
            4,
            "data_parallel = 2\nmodel_parallel = 2\nuse_seq_parallel = true\nvocab_emb_dp = false\nexpert_parallel = 2",
        ),
        (
            "dp 2 × context parallel 2, ep 2",
            4,
            "data_parallel = 2\ncontext_parallel = 2\nexpert_parallel = 2",
        ),
        (
            // One micro-batch: the balancing loss is a product of batch means, so a run of
            // micro-batches balances each micro-batch (as gradient accumulation does).
            "2 stages × ep 2",
            4,
            "expert_parallel = 2\n[parallel.pipeline]\nstages = 2",
        ),
        (
            "ep 2 of dp 4, hsdp level3",
            4,
            "expert_parallel = 2\n[parallel.hsdp]\noptimizer_level = \"level3\"\nthreshold = 0",
        ),
    ];
    for top_k in [1, 2] {
        let moe = moe_keys(top_k, "");
        let out = tmp.path().join(format!("sa-{top_k}"));
        let reference = train(&config(&out, &moe, "mode = \"stand_alone\"", &[]));
        for (i, (name, devices, keys)) in cases.iter().enumerate() {
            let out = tmp.path().join(format!("case-{top_k}-{i}"));
            let run = train(&config(&out, &moe, &run_util::semi(*devices, keys), &[]));
            assert_same_run(&format!("{name}, top-{top_k}"), &run, &reference);
        }
    }
}

/// The reshards into and out of the experts' layout are all-to-alls among the expert-parallel
/// ranks: the dispatch into `expert_in`, the combine out of `expert_out` (forward), and their
/// mirrors in the backward pass.
#[test]
fn dispatch_and_combine_are_all_to_alls() {
    let tmp = tempfile::tempdir().unwrap();
    let moe = moe_keys(2, "");
    let config = config(
        tmp.path(),
        &moe,
        &run_util::semi(4, "expert_parallel = 4"),
        &[],
    );
    let session = Session::new(&config).unwrap();
    let summary = session.train.summary();
    let moves: Vec<(String, String)> = summary
        .steps
        .iter()
        .filter_map(|step| match step {
            parallel::StepSummary::Reshard {
                value,
                communication,
                ..
            } => Some((value.clone(), communication.clone())),
            parallel::StepSummary::Kernel { .. } => None,
        })
        .collect();
    let crossings = [
        "to_experts",
        "expert_out",
        "to_tokens.grad0",
        "expert_in.grad0",
    ];
    for block in 0..2 {
        for value in crossings {
            let name = format!("blocks.{block}.moe.{value}");
            let found: Vec<&str> = moves
                .iter()
                .filter(|(v, _)| *v == name)
                .map(|(_, c)| c.as_str())
                .collect();
            assert_eq!(found, ["all-to-all over 4 ranks"], "{name}: {moves:?}");
        }
    }
    // Nothing gathers the experts' inputs or outputs whole.
    let gathers: Vec<_> = moves
        .iter()
        .filter(|(v, c)| v.contains(".moe.") && c.contains("gather"))
        .collect();
    assert!(gathers.is_empty(), "{gathers:?}");
}

/// `train.deterministic = true`: expert parallel 2 and 4, and with data and model parallel,
/// top-1 and top-2 (with a shared expert), is bitwise one device's run.
#[test]
fn deterministic_expert_parallel_is_bitwise_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let det = ["train.deterministic=true".to_string()];
    let cases: &[(&str, usize, &str)] = &[
        ("ep 2", 2, "expert_parallel = 2"),
        ("ep 4", 4, "expert_parallel = 4"),
        (
            "dp 4 × mp 2, ep 2",
            8,
            "data_parallel = 4\nmodel_parallel = 2\nexpert_parallel = 2",
        ),
    ];
    for top_k in [1, 2] {
        let moe = moe_keys(top_k, "shared_expert = true");
        let out = tmp.path().join(format!("sa-{top_k}"));
        let reference = train(&config(&out, &moe, "mode = \"stand_alone\"", &det));
        for (i, (name, devices, keys)) in cases.iter().enumerate() {
            let out = tmp.path().join(format!("det-{top_k}-{i}"));
            let run = train(&config(&out, &moe, &run_util::semi(*devices, keys), &det));
            run_util::assert_bitwise_run(&format!("{name}, top-{top_k}"), &run, &reference);
        }
    }
}

/// `tessera plan` for a 64-expert MoE GPT (12 blocks, top-2) on 1,024 devices: every search
/// mode finds a plan whose experts are split (the expert-parallel hints reach the search).
/// The search time is printed (`--nocapture`); the test profile is optimised, not the release.
#[test]
fn a_64_expert_moe_plans_on_1024_devices() {
    let tmp = tempfile::tempdir().unwrap();
    for mode in ["dynamic_programming", "recursive_programming"] {
        let config = run_util::small_gpt(
            &tmp.path().join(mode),
            "adamw",
            "[model.moe]\nexperts = 64\ntop_k = 2",
            &format!("devices = 1024\nmode = \"{mode}\""),
            &[
                "data.batch_size=1024".to_string(),
                "model.layers=12".to_string(),
                "model.hidden=256".to_string(),
                "model.heads=16".to_string(),
                "model.seq_len=64".to_string(),
                "model.ffn_hidden=1024".to_string(),
            ],
        );
        let report = runtime::plan(&config).expect("a plan");
        eprintln!(
            "{mode}: search {:.0} ms, predicted step {:.2} ms",
            report.search_ms,
            report.step_ms()
        );
        let (_, experts) = report
            .strategies
            .iter()
            .find(|(name, _)| name == "blocks.0.moe.experts.fc1")
            .expect("a strategy for the experts");
        assert!(
            experts[1][0] > 1,
            "{mode}: the experts are split: {experts:?}"
        );
    }
}

/// Under mixed precision the router runs in f32 (its softmax, choices, gates and balancing
/// loss), the experts in bf16: one device and expert parallel 2 train to within bf16's
/// rounding of each other, and the loss falls.
#[test]
fn bf16_moe_trains_with_expert_parallel() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = ["train.precision=\"bf16\"".to_string()];
    let moe = moe_keys(2, "");
    let one = train(&config(
        &tmp.path().join("sa"),
        &moe,
        "mode = \"stand_alone\"",
        &bf16,
    ));
    let ep = train(&config(
        &tmp.path().join("ep"),
        &moe,
        &run_util::semi(2, "expert_parallel = 2"),
        &bf16,
    ));
    run_util::assert_losses_within("bf16, ep 2", &ep.0, &one.0, 2e-2);
    assert!(one.0[19] < one.0[0], "the loss falls: {:?}", one.0);
}

/// `model.json` records `[model.moe]`: `tessera generate` rebuilds the MoE GPT a run trained
/// (with expert parallel: its checkpoint merged on load) and continues a prompt with it.
#[test]
fn generate_samples_a_moe_gpt() {
    let tmp = tempfile::tempdir().unwrap();
    let moe = moe_keys(1, "shared_expert = true");
    let alone = tmp.path().join("alone");
    let sharded = tmp.path().join("ep2");
    train(&config(&alone, &moe, "mode = \"stand_alone\"", &[]));
    train(&config(
        &sharded,
        &moe,
        &run_util::semi(2, "expert_parallel = 2"),
        &[],
    ));
    let options = runtime::GenerateOptions {
        prompt: "And God said".to_string(),
        tokens: 12,
        temperature: 0.0,
        seed: 1,
    };
    let text = runtime::generate(&alone, &options).unwrap();
    assert!(text.starts_with("And God said"), "{text}");
    assert_eq!(text.chars().count(), "And God said".len() + 12, "{text:?}");
    assert_eq!(runtime::generate(&sharded, &options).unwrap(), text);
}

/// Bad `[model.moe]` values and expert splits are refused with the key and the rule.
#[test]
fn bad_moe_keys_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        ("experts = 1", "", "model.moe.experts"),
        ("experts = 4\ntop_k = 5", "", "model.moe.top_k"),
        (
            "experts = 4\ncapacity_factor = 0.0",
            "",
            "model.moe.capacity_factor",
        ),
        (
            "experts = 4\naux_loss_coeff = -0.5",
            "",
            "model.moe.aux_loss_coeff",
        ),
        (
            "experts = 4\nexperts_per_token = 2",
            "",
            "experts_per_token",
        ),
        (
            "experts = 4",
            "expert_parallel = 3",
            "parallel.expert_parallel",
        ),
        ("experts = 6", "expert_parallel = 4", "model.moe.experts"),
    ];
    for (i, (moe, parallel, key)) in cases.iter().enumerate() {
        let text = run_util::small_gpt_text(
            &tmp.path().join(format!("bad-{i}")),
            "momentum",
            &format!("[model.moe]\n{moe}"),
            &run_util::semi(4, parallel),
        );
        let err = TrainConfig::parse(&text, None, &[], Path::new("/"))
            .and_then(|config| Session::new(&config).map(|_| ()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{moe} / {parallel}: {err}");
    }
    // Expert parallel without MoE blocks: refused as the config is read, in every mode.
    let dense = run_util::small_gpt_text(
        &tmp.path().join("dense"),
        "momentum",
        "",
        &run_util::semi(4, "expert_parallel = 2"),
    );
    let err = TrainConfig::parse(&dense, None, &[], Path::new("/"))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("parallel.expert_parallel") && err.contains("[model.moe]"),
        "{err}"
    );
}

/// A checkpoint saved under expert parallel 2 resumes under expert parallel 4 and on one
/// device: each continues one device's uninterrupted run (checkpoints convert between expert
/// parallel degrees).
#[test]
fn checkpoints_resume_under_other_expert_parallel_degrees() {
    let tmp = tempfile::tempdir().unwrap();
    let moe = moe_keys(2, "");
    let whole = train(&config(
        &tmp.path().join("whole"),
        &moe,
        "mode = \"stand_alone\"",
        &[],
    ));
    let first = tmp.path().join("first");
    let half = ["train.max_steps=10".to_string()];
    let first_config = config(
        &first,
        &moe,
        &run_util::semi(2, "expert_parallel = 2"),
        &half,
    );
    let first_losses = run_util::train_steps(&first_config, 10).1;
    let resume = [format!("output.resume_from=\"{}\"", first.display())];
    for (what, parallel) in [
        ("ep 4", run_util::semi(4, "expert_parallel = 4")),
        ("one device", "mode = \"stand_alone\"".to_string()),
    ] {
        let out = tmp.path().join(what.replace(' ', "-"));
        let (_, report, (losses, params)) =
            run_util::train_report(&config(&out, &moe, &parallel, &resume));
        assert_eq!(report.ranks[0].global_step, 20, "{what}");
        let mut all = first_losses.clone();
        all.extend(losses);
        assert_eq!(all.len(), 20, "{what}: 10 steps, then the remaining 10");
        assert_same_run(what, &(all, params), &whole);
    }
}

/// The token choices the routing drops are counted per step (`moe_dropped` in the metrics
/// log): every rank reports the whole batch's count, and in deterministic mode it equals one
/// device's count at every step under expert, data and model parallel and pipeline stages (each
/// block of the routing counted once, not once per replica). With room for every token, none.
#[test]
fn dropped_choices_are_counted_once_per_step() {
    let tmp = tempfile::tempdir().unwrap();
    let det = ["train.deterministic=true".to_string()];
    let counts = |out: &str, moe: &str, parallel: &str| -> Vec<f64> {
        let config = config(&tmp.path().join(out), moe, parallel, &det);
        let (_, report, _) = run_util::train_report(&config);
        let first = report.ranks[0].moe_dropped.clone();
        for (rank, r) in report.ranks.iter().enumerate() {
            assert_eq!(r.moe_dropped, first, "{out}: rank {rank}");
        }
        assert_eq!(first.len(), 20, "{out}: one count per step");
        first
    };
    let tight = moe_keys(2, "capacity_factor = 0.5");
    let reference = counts("sa", &tight, "mode = \"stand_alone\"");
    assert!(reference.iter().any(|&n| n > 0.0), "{reference:?}");
    // 2 MoE blocks × batch 8 × 16 tokens × top-2 choices, of which some are dropped.
    assert!(
        reference.iter().all(|&n| n < 512.0 && n.fract() == 0.0),
        "{reference:?}"
    );
    for (name, devices, keys) in [
        ("ep 2", 2, "expert_parallel = 2"),
        (
            "dp 4 × mp 2, ep 2",
            8,
            "data_parallel = 4\nmodel_parallel = 2\nexpert_parallel = 2",
        ),
        (
            "2 stages × ep 2",
            4,
            "expert_parallel = 2\n[parallel.pipeline]\nstages = 2",
        ),
    ] {
        assert_eq!(
            counts(name, &tight, &run_util::semi(devices, keys)),
            reference,
            "{name}"
        );
    }
    let roomy = counts(
        "roomy",
        &moe_keys(2, "capacity_factor = 4.0"),
        &run_util::semi(2, "expert_parallel = 2"),
    );
    assert!(roomy.iter().all(|&n| n == 0.0), "{roomy:?}");
}

/// Context × expert × data × model parallel on 8 ranks (dp 2 × cp 2 × mp 2, the experts split
/// over the 2 data-parallel ranks), with Ulysses and with ring attention, top-1 and top-2:
/// equal to one device's run (1e-5), and bitwise in deterministic mode.
#[test]
fn context_expert_data_and_model_parallel_on_8_ranks_match_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let grid = "data_parallel = 2\ncontext_parallel = 2\nmodel_parallel = 2\nexpert_parallel = 2";
    let algos = [
        ("Ulysses", "", String::new()),
        (
            "ring",
            "fused_attention = true\n",
            "\ncontext_parallel_algo = \"ring\"".to_string(),
        ),
    ];
    let det = ["train.deterministic=true".to_string()];
    for top_k in [1, 2] {
        for (algo, model, keys) in &algos {
            let moe = format!("{model}{}", moe_keys(top_k, ""));
            let parallel = run_util::semi(8, &format!("{grid}{keys}"));
            for deterministic in [false, true] {
                let overrides: &[String] = if deterministic { &det } else { &[] };
                let name = format!("{algo}, top-{top_k}, deterministic {deterministic}");
                let dir = tmp.path().join(name.replace([' ', ','], "-"));
                let reference = train(&config(
                    &dir.join("sa"),
                    &moe,
                    "mode = \"stand_alone\"",
                    overrides,
                ));
                let run = train(&config(&dir.join("run"), &moe, &parallel, overrides));
                if deterministic {
                    run_util::assert_bitwise_run(&name, &run, &reference);
                } else {
                    assert_same_run(&name, &run, &reference);
                }
            }
        }
    }
}
