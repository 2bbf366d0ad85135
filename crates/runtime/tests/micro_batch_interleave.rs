//! `parallel.micro_batch_interleave` (MindSpore's `MicroBatchInterleaved`): each batch cut
//! into parts run at once, one update; the same training as without it.

use runtime::{RuntimeError, TrainConfig};

use crate::run_util::{self, small_gpt, Run};

fn run(out: &std::path::Path, parallel: &str, overrides: &[&str]) -> Run {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    run_util::train_run(&small_gpt(out, "momentum", "", parallel, &overrides), 20).1
}

/// Interleave 2 under data parallel 2 and under model parallel 2 (whose activations are
/// all-reduced): every step's loss within a relative 1e-5 of the run without it, and the
/// merged parameters within 1e-5; and bitwise the run that accumulates the same two halves
/// one after the other (`train.grad_accumulation_steps = 2` of half the batch), so running
/// the parts at once changes no sum's order.
#[test]
fn interleave_two_equals_no_interleave() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, parallel) in [
        ("data parallel 2", run_util::DP2.to_string()),
        (
            "model parallel 2",
            "devices = 2\nmode = \"semi_auto\"\nmodel_parallel = 2\n".to_string(),
        ),
    ] {
        let dir = |tag: &str| tmp.path().join(format!("{}-{tag}", name.replace(' ', "-")));
        let plain = run(&dir("plain"), &parallel, &[]);
        let interleaved = run(
            &dir("interleaved"),
            &format!("{parallel}micro_batch_interleave = 2\n"),
            &[],
        );
        let sequential = run(
            &dir("sequential"),
            &parallel,
            &["data.batch_size=4", "train.grad_accumulation_steps=2"],
        );
        run_util::assert_losses_within(name, &interleaved.0, &plain.0, 1e-5);
        run_util::assert_same_run(name, &interleaved, &plain, 1e-5);
        run_util::assert_bitwise_run(name, &interleaved, &sequential);
    }
}

fn parse(parallel: &str, batch: usize) -> Result<TrainConfig, RuntimeError> {
    let text = run_util::small_gpt_text(
        std::path::Path::new("/nonexistent-out"),
        "momentum",
        "",
        parallel,
    );
    let batch = format!("data.batch_size={batch}");
    TrainConfig::parse(&text, None, &[batch], std::path::Path::new("/"))
}

fn config_error(parallel: &str, batch: usize) -> (String, String) {
    match parse(parallel, batch) {
        Err(RuntimeError::Config { key, reason }) => (key, reason),
        other => panic!("expected a config error, got {other:?}"),
    }
}

/// Invalid values name the key and the rule: below 1, not an integer, not dividing the batch,
/// combined with pipeline stages.
#[test]
fn invalid_interleave_values_are_refused_with_the_rule() {
    let key = "parallel.micro_batch_interleave";
    for (parallel, batch, rule) in [
        ("micro_batch_interleave = 0", 8, "≥ 1"),
        ("micro_batch_interleave = -2", 8, "≥ 1"),
        ("micro_batch_interleave = 2.5", 8, "an integer ≥ 1"),
        ("micro_batch_interleave = 3", 8, "do not divide data.batch_size = 8"),
        (
            "devices = 2\nmode = \"semi_auto\"\nmicro_batch_interleave = 2\n[parallel.pipeline]\nstages = 2",
            8,
            "without pipeline stages",
        ),
    ] {
        let (k, reason) = config_error(parallel, batch);
        assert_eq!(k, key, "{parallel}");
        assert!(reason.contains(rule), "{parallel}: {reason}");
    }
}

/// Accepted values cut the batch: 2 parts of a batch of 8 are micro-steps of 4.
#[test]
fn interleave_cuts_the_batch_into_micro_steps() {
    let config = parse("micro_batch_interleave = 2", 8).unwrap();
    assert_eq!(config.micro_batch_interleave(), 2);
    assert_eq!(config.data().batch_size, 4);
    assert_eq!(config.train().grad_accumulation_steps, 2);
    let config = parse("", 8).unwrap();
    assert_eq!(config.micro_batch_interleave(), 1);
    assert_eq!(config.data().batch_size, 8);
    assert_eq!(config.train().grad_accumulation_steps, 1);
}

/// A step cut into micro-batches (`micro_batch_interleave`, a pipeline's `micro_batches`) is
/// evaluated on the same validation windows as the uncut run: each validation batch is the
/// file's `data.batch_size` windows, run as its micro-batches. The evaluation used to run one
/// micro-batch's share of the windows per validation batch, so its loss silently differed
/// from the uncut run's (by 0.012 on the example GPT).
#[test]
fn a_cut_batch_is_evaluated_on_the_uncut_runs_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let eval_losses = |name: &str, parallel: &str| {
        let overrides = [
            "train.eval=true".to_string(),
            "data.steps_per_epoch=4".to_string(),
            "train.epochs=2".to_string(),
            "train.max_steps=8".to_string(),
            "data.eval_batches=3".to_string(),
        ];
        let config = small_gpt(&tmp.path().join(name), "adam", "", parallel, &overrides);
        let (_, report, _) = run_util::train_report(&config);
        report.eval_losses().to_vec()
    };
    let plain = eval_losses("plain", "mode = \"stand_alone\"");
    assert_eq!(plain.len(), 2, "one evaluation per epoch");
    for (name, parallel) in [
        (
            "interleave 2",
            "mode = \"stand_alone\"\nmicro_batch_interleave = 2",
        ),
        (
            "2 stages × 4 micro-batches",
            "devices = 2\nmode = \"semi_auto\"\n[parallel.pipeline]\nstages = 2\nmicro_batches = 4",
        ),
    ] {
        let cut = eval_losses(name, parallel);
        assert_eq!(cut.len(), plain.len(), "{name}");
        for (a, b) in cut.iter().zip(&plain) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "{name}: eval loss {a} vs {b}"
            );
        }
    }
}
