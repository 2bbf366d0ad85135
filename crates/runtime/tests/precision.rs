//! Mixed precision (`train.precision`, `train.loss_scale`, the f32 reduction switches): bf16
//! and f16 training follow the f32 loss curve within 5 % per step, on one device and under
//! data parallelism; the weights and activations take half the bytes, as predicted; an f16
//! loss scale that overflows skips every step on every rank; bad values are refused.

use std::path::Path;

use runtime::{Session, TrainConfig};

use crate::run_util::{self, adam_gpt, train_report, DP2, DP2_MP2};

const SA: &str = "mode = \"stand_alone\"";

/// The documented tolerance: each step's loss within 5 % of the f32 run's (this small GPT at
/// learning rate 0.01 drifts most: measured worst 2.7 % in bf16, 4.5 % in f16).
const TOLERANCE: f32 = 5e-2;

/// bf16 and f16 (dynamic loss scale) on one device, data parallel 2 (with fp32 gradient sync
/// and without) and dp 2 × mp 2 (every sum in f32): 20 steps within 5 % of f32's losses, and
/// not bitwise f32's (the model really computes in half precision).
#[test]
fn half_precision_follows_the_f32_curve() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 20;
    let (_, reference) =
        run_util::train_steps(&adam_gpt(&tmp.path().join("f32"), SA, steps, &[]), steps);
    let cases: [(&str, &str, &[&str]); 6] = [
        ("bf16, one device", SA, &["train.precision=\"bf16\""]),
        ("f16, one device", SA, &["train.precision=\"f16\""]),
        ("bf16, dp 2", DP2, &["train.precision=\"bf16\""]),
        (
            "bf16, dp 2, half-precision gradient sums",
            DP2,
            &[
                "train.precision=\"bf16\"",
                "parallel.gradient_fp32_sync=false",
            ],
        ),
        (
            "bf16, dp 2 × mp 2, f32 communication",
            DP2_MP2,
            &[
                "train.precision=\"bf16\"",
                "parallel.enable_fp32_communication=true",
            ],
        ),
        (
            "f16 with a static scale, dp 2",
            DP2,
            &["train.precision=\"f16\"", "train.loss_scale=1024"],
        ),
    ];
    for (i, (what, parallel, overrides)) in cases.iter().enumerate() {
        let cfg = adam_gpt(
            &tmp.path().join(format!("case-{i}")),
            parallel,
            steps,
            overrides,
        );
        let (_, losses) = run_util::train_steps(&cfg, steps);
        run_util::assert_losses_within(what, &losses, &reference, TOLERANCE);
        assert_ne!(losses, reference, "{what}: computed in half precision");
    }
}

/// bf16 weights and gradients take half of f32's bytes and the activations less (the logits
/// stay f32 for the loss); the optimizer keeps f32 state and an f32 master piece (Adam: 3 × 4
/// bytes per element instead of 2 × 4); every figure as predicted.
#[test]
fn half_precision_halves_weights_and_activations() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, precision: &str| {
        let set = format!("train.precision=\"{precision}\"");
        let cfg = adam_gpt(&tmp.path().join(name), DP2, 2, &[&set]);
        let (session, report, _) = train_report(&cfg);
        let m = report.ranks[0].memory_by_rank[0];
        assert_eq!(
            Some(m),
            session.predict_memory(0),
            "{precision}: as predicted"
        );
        m
    };
    let f32 = run("f32", "f32");
    let bf16 = run("bf16", "bf16");
    assert_eq!(bf16.peaks.parameters * 2, f32.peaks.parameters);
    assert_eq!(bf16.peaks.gradients * 2, f32.peaks.gradients);
    assert_eq!(bf16.peaks.optimizer * 2, f32.peaks.optimizer * 3);
    // Less than f32's, not half: the logits are cast to f32 for the loss.
    assert!(bf16.peaks.activations < f32.peaks.activations);
}

/// An f16 loss scale so large that every gradient overflows: every rank skips every step, so
/// the merged weights are the initial ones; the loss is still reported.
/// A resumed mixed-precision run continues from the saved f32 master weights: 2 steps, a
/// checkpoint, 2 more steps train bitwise the 4 steps of one run, with whole and with
/// hsdp-sharded masters (weights in pieces under level 1, whole under zero1); a bf16 run resumed from an f32 checkpoint takes its weights as masters.
#[test]
fn a_half_precision_resume_continues_from_the_f32_masters() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = "train.precision=\"bf16\"";
    let level1 = format!("{DP2}[parallel.hsdp]\nthreshold = 0");
    let zero1 = format!("{DP2}[parallel.hsdp]\noptimizer_level = \"zero1\"\nthreshold = 0");
    for (what, parallel) in [
        ("dp 2", DP2.to_string()),
        ("dp 2, hsdp level 1", level1),
        ("dp 2, hsdp zero1", zero1),
    ] {
        let dir = tmp.path().join(what.replace([' ', ','], "_"));
        let whole = adam_gpt(&dir.join("whole"), &parallel, 4, &[bf16]);
        let (_, _, reference) = run_util::train_report(&whole);
        let first = adam_gpt(&dir.join("first"), &parallel, 2, &[bf16]);
        run_util::train_steps(&first, 2);
        let from = format!("output.resume_from=\"{}\"", dir.join("first").display());
        let resumed = adam_gpt(&dir.join("resumed"), &parallel, 4, &[bf16, &from]);
        let (_, _, run) = run_util::train_report(&resumed);
        assert_eq!(
            run.0[..],
            reference.0[2..],
            "{what}: losses of steps 3 and 4"
        );
        assert_eq!(
            run.1, reference.1,
            "{what}: weights and masters after step 4"
        );
    }
    // From an f32 checkpoint: the masters are its weights. A resume must train a step (one
    // with nothing left is refused), so the step runs at learning rate 1e-30, which moves no
    // master by more than 1e-29.
    let first = adam_gpt(&tmp.path().join("f32"), DP2, 2, &[]);
    let (session, _) = run_util::train_steps(&first, 2);
    let from = format!(
        "output.resume_from=\"{}\"",
        tmp.path().join("f32").display()
    );
    let resumed = adam_gpt(
        &tmp.path().join("from-f32"),
        DP2,
        3,
        &[bf16, &from, "train.learning_rate=1e-30"],
    );
    run_util::train_steps(&resumed, 1);
    let names: Vec<String> = run_util::param_names(&session)
        .into_iter()
        .map(|n| format!("master_weight.{n}"))
        .collect();
    let masters = run_util::merged_params(&tmp.path().join("from-f32"), &names);
    let weights =
        run_util::merged_params(&tmp.path().join("f32"), &run_util::param_names(&session));
    for ((name, m), (_, w)) in masters.iter().zip(&weights) {
        assert_eq!(m.len(), w.len(), "{name}");
        for (a, b) in m.iter().zip(w) {
            assert!(
                (a - b).abs() <= 1e-29,
                "{name}: the f32 weights became the masters"
            );
        }
    }
}

/// A loss scale so large that every step overflows skips every update, and the run then fails
/// naming `train.loss_scale` instead of saving parameters that never moved (issue 30, item 6).
#[test]
fn an_overflowing_loss_scale_fails_the_run_and_saves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let skip = ["train.precision=\"f16\"", "train.loss_scale=1e30"];
    let out = tmp.path().join("skip");
    let session = runtime::Session::new(&adam_gpt(&out, DP2, 3, &skip)).unwrap();
    let err = runtime::train_local(&session, &runtime::LaunchOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("train.loss_scale"), "{err}");
    assert!(
        err.contains("every one of the run's 3 steps was skipped"),
        "{err}"
    );
    assert!(
        !out.join("strategy.json").exists(),
        "no checkpoint is written"
    );
}

/// Bad precision settings are refused naming the key.
#[test]
fn bad_precision_settings_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    for (set, key) in [
        ("train.precision=\"fp8\"", "train.precision"),
        ("train.loss_scale=0.5", "train.loss_scale"),
        ("train.loss_scale=\"auto\"", "train.loss_scale"),
        (
            "parallel.gradient_fp32_sync=1",
            "parallel.gradient_fp32_sync",
        ),
    ] {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/gpt_kjv.toml"),
        )
        .unwrap();
        let err = TrainConfig::parse(&text, None, &[set.to_string()], tmp.path())
            .expect_err(set)
            .to_string();
        assert!(err.contains(key), "{set}: {err}");
    }
    let seed = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/seed_stand_alone.toml"),
    )
    .unwrap();
    let cfg = TrainConfig::parse(
        &seed,
        None,
        &["train.precision=\"bf16\"".to_string()],
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .as_path(),
    )
    .unwrap();
    let err = Session::new(&cfg)
        .expect_err("the MLP trains in f32")
        .to_string();
    assert!(err.contains("train.precision"), "{err}");
}

/// bf16 and f16 train with the vocabulary-parallel loss (`vocab_emb_dp = false`, whose one-hot
/// and divisor follow the f32 logits), within the documented tolerance of f32; and half
/// precision trains in deterministic mode, which builds that loss on every device count, the
/// same bits on every run.
#[test]
fn half_precision_trains_with_the_vocabulary_parallel_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 8;
    let vocab = "devices = 2\nmode = \"semi_auto\"\nmodel_parallel = 2\nvocab_emb_dp = false\n";
    let (_, reference) =
        run_util::train_steps(&adam_gpt(&tmp.path().join("f32"), SA, steps, &[]), steps);
    let det = "train.deterministic=true";
    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "bf16, vocabulary parallel",
            vocab,
            &["train.precision=\"bf16\""],
        ),
        (
            "f16, vocabulary parallel",
            vocab,
            &["train.precision=\"f16\""],
        ),
        (
            "bf16, deterministic",
            SA,
            &["train.precision=\"bf16\"", det],
        ),
        ("f16, deterministic", SA, &["train.precision=\"f16\"", det]),
    ];
    for (i, (what, parallel, overrides)) in cases.iter().enumerate() {
        let out = tmp.path().join(format!("case-{i}"));
        let (_, _, run) = train_report(&adam_gpt(&out, parallel, steps, overrides));
        run_util::assert_losses_within(what, &run.0, &reference, TOLERANCE);
        assert_ne!(run.0, reference, "{what}: computed in half precision");
        if overrides.contains(&det) {
            let again = tmp.path().join(format!("again-{i}"));
            let (_, _, rerun) = train_report(&adam_gpt(&again, parallel, steps, overrides));
            run_util::assert_bitwise_run(what, &rerun, &run);
        }
    }
}

/// Half precision in deterministic mode on more than one device is refused before training,
/// naming `train.precision` (each rank's partial sums round to the half type, which one device
/// never does, so the run could not be bitwise one device's).
#[test]
fn half_precision_deterministic_on_several_devices_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for precision in ["train.precision=\"bf16\"", "train.precision=\"f16\""] {
        for parallel in [DP2, DP2_MP2] {
            let config = adam_gpt(
                tmp.path(),
                parallel,
                2,
                &[precision, "train.deterministic=true"],
            );
            let err = Session::new(&config).unwrap_err().to_string();
            assert!(
                err.contains("train.precision") && err.contains("one device"),
                "{precision}: {err}"
            );
        }
    }
}
