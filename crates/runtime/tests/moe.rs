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

fn semi(devices: usize, keys: &str) -> String {
    format!("devices = {devices}\nmode = \"semi_auto\"\n{keys}")
}

/// Asserts every loss within a relative 1e-5 of one device's, and the parameters.
fn assert_same_run(what: &str, run: &Run, reference: &Run) {
    run_util::assert_losses_within(what, &run.0, &reference.0, 1e-5);
    run_util::assert_same_run(what, run, reference, 1e-4);
}

/// Expert parallel (over every device, or with data and model parallel) × top-1 and top-2.
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
    ];
    for top_k in [1, 2] {
        let moe = moe_keys(top_k, "");
        let out = tmp.path().join(format!("sa-{top_k}"));
        let reference = train(&config(&out, &moe, "mode = \"stand_alone\"", &[]));
        for (i, (name, devices, keys)) in cases.iter().enumerate() {
            let out = tmp.path().join(format!("case-{top_k}-{i}"));
            let run = train(&config(&out, &moe, &semi(*devices, keys), &[]));
            assert_same_run(&format!("{name}, top-{top_k}"), &run, &reference);
        }
    }
}
