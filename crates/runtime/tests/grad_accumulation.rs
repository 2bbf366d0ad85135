//! `train.grad_accumulation_steps = K` (MindSpore's `GradAccumulation`, issue 15 part 4): K
//! micro-steps of `data.batch_size` each, one optimizer update with the mean of their
//! gradients, is one step on the K-times larger batch.
//!
//! Every comparison trains the same number of optimizer steps twice, once with K micro-batches
//! of `b` samples and once with one batch of `K·b`, and asks for the same loss at every step
//! (relative 1e-5) and the same merged parameters (1e-5): the micro-batches of a step are the
//! rows of the larger batch, so only the order of a few sums differs.

use std::path::Path;

use runtime::{LaunchOptions, RuntimeError, Session, TrainConfig};

use crate::run_util::{self, digits, merged_params, train_steps, Run};

/// The tolerance of every comparison: losses relative, parameters `1e-5 · (1 + |x|)`.
const TOLERANCE: f32 = 1e-5;

/// The seed MLP (hidden 64) on the digits for `steps` optimizer steps of `micro_steps`
/// micro-batches of `batch` samples, with `[parallel]` body `parallel` and overrides `extra`.
fn mlp_config(
    out: &Path,
    optimizer: &str,
    parallel: &str,
    shape: (usize, usize, usize),
    extra: &[&str],
) -> TrainConfig {
    let text = mlp_text(out, optimizer, parallel, shape);
    let overrides: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    TrainConfig::parse(&text, None, &overrides, Path::new("/")).expect("a valid test config")
}

/// The text of [`mlp_config`].
fn mlp_text(
    out: &Path,
    optimizer: &str,
    parallel: &str,
    (batch, micro_steps, steps): (usize, usize, usize),
) -> String {
    format!(
        r#"
[model]
name = "seed_mlp"
hidden = 64
classes = 10
[data]
format = "idx"
dir = "{data}"
batch_size = {batch}
shuffle = true
[parallel]
{parallel}
[train]
epochs = 1
max_steps = {steps}
grad_accumulation_steps = {micro_steps}
optimizer = "{optimizer}"
learning_rate = 0.02
momentum = 0.9
seed = 7
eval = false
[output]
dir = "{out}"
"#,
        data = digits().display(),
        out = out.display(),
    )
}

fn mlp_weights() -> Vec<String> {
    ["fc1_weight", "fc2_weight", "fc3_weight"]
        .map(String::from)
        .to_vec()
}

/// Trains `config` for `steps` optimizer steps: the losses and the merged parameters `names`.
fn train(config: &TrainConfig, steps: usize, names: &[String]) -> Run {
    let (_, losses) = train_steps(config, steps);
    (losses, merged_params(&config.output().dir, names))
}

/// `run` matches `reference` to [`TOLERANCE`]: losses relative, parameters absolute-or-relative.
fn assert_same_run(what: &str, run: &Run, reference: &Run) {
    let ((losses, _), (ref_losses, _)) = (run, reference);
    assert_eq!(losses.len(), ref_losses.len(), "{what}: steps");
    for (step, (a, b)) in losses.iter().zip(ref_losses).enumerate() {
        assert!(
            (a - b).abs() <= TOLERANCE * b.abs(),
            "{what}: step {}: loss {a} vs the larger batch's {b}",
            step + 1
        );
    }
    run_util::assert_same_run(what, run, reference, TOLERANCE);
}

const SEED_SHARDS: &str = r#"devices = 8
mode = "semi_auto"
[parallel.shard]
matmul1 = [[2, 4], [4, 1]]
relu1 = [[4, 1]]
matmul2 = [[1, 8], [8, 1]]
relu2 = [[8, 1]]
"#;

/// K = 4 micro-batches of 8 equal one batch of 32 for 8 steps, with Momentum and Adam; and
/// the K = 4 run under 4-device data parallelism and under the seed's semi-auto strategy (a
/// split reduction dim: pending sums reduced every micro-step) matches one device's K = 4 run.
///
/// The sharded runs are compared with one device's accumulating run, not directly with the
/// larger batch: sharding alone moves Adam's weights by up to ~6e-6 (another summation order,
/// which the sharded-training suites allow 1e-4 for), as much as accumulation does, so the two
/// together may exceed 1e-5. Deterministic mode takes sharding's part away
/// ([`sharded_accumulation_in_deterministic_mode_is_one_devices`]).
#[test]
fn four_micro_batches_train_the_mlp_like_a_four_times_larger_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 8;
    let parallels = [
        (
            "data parallel, 4 devices",
            "devices = 4\nmode = \"data_parallel\"",
        ),
        ("the seed's semi_auto strategy, 8 devices", SEED_SHARDS),
    ];
    let one_device = "mode = \"stand_alone\"";
    for optimizer in ["momentum", "adam"] {
        let run = |name: &str, parallel: &str, shape| {
            let out = tmp.path().join(format!("{optimizer}-{name}"));
            train(
                &mlp_config(&out, optimizer, parallel, shape, &[]),
                steps,
                &mlp_weights(),
            )
        };
        let larger_batch = run("big", one_device, (32, 1, steps));
        let accumulated = run("accum", one_device, (8, 4, steps));
        assert_same_run(
            &format!("K = 4 against batch × 4 ({optimizer})"),
            &accumulated,
            &larger_batch,
        );
        for (i, (what, parallel)) in parallels.iter().enumerate() {
            let sharded = run(&format!("sharded-{i}"), parallel, (8, 4, steps));
            assert_same_run(
                &format!("K = 4, {what}, against one device ({optimizer})"),
                &sharded,
                &accumulated,
            );
        }
    }
}

/// In deterministic mode (`train.deterministic`), K = 4 under data parallelism and the seed's
/// semi-auto strategy is bitwise one device's K = 4 run, and within 1e-5 of one batch of 32.
#[test]
fn sharded_accumulation_in_deterministic_mode_is_one_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 8;
    let det = ["train.deterministic=true"];
    let run = |name: &str, parallel: &str, shape| {
        let out = tmp.path().join(name);
        train(
            &mlp_config(&out, "adam", parallel, shape, &det),
            steps,
            &mlp_weights(),
        )
    };
    let one_device = "mode = \"stand_alone\"";
    let larger_batch = run("big", one_device, (32, 1, steps));
    let accumulated = run("accum", one_device, (8, 4, steps));
    assert_same_run("deterministic K = 4", &accumulated, &larger_batch);
    let parallels = [
        (
            "data parallel, 4 devices",
            "devices = 4\nmode = \"data_parallel\"",
        ),
        ("the seed's semi_auto strategy, 8 devices", SEED_SHARDS),
    ];
    for (i, (what, parallel)) in parallels.iter().enumerate() {
        let sharded = run(&format!("sharded-{i}"), parallel, (8, 4, steps));
        run_util::assert_bitwise_run(what, &sharded, &accumulated);
    }
}

/// Steps, epochs and `max_steps` count optimizer steps: with K = 4 and batch 8 an epoch of the
/// 1500 digits is 46 steps (1500 / 32), not 187; the second epoch reshuffles like the larger
/// batch's.
#[test]
fn epochs_count_optimizer_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 48; // two into the second epoch
    let big = mlp_config(
        &tmp.path().join("big"),
        "momentum",
        "mode = \"stand_alone\"",
        (32, 1, steps),
        &["train.epochs=2"],
    );
    let accum = mlp_config(
        &tmp.path().join("accum"),
        "momentum",
        "mode = \"stand_alone\"",
        (8, 4, steps),
        &["train.epochs=2"],
    );
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    let reports: Vec<_> = [big, accum]
        .iter()
        .map(|c| runtime::train_local(&Session::new(c).unwrap(), &options).unwrap())
        .collect();
    assert_eq!(reports[1].losses().len(), steps);
    assert_eq!(reports[1].ranks[0].global_step, steps as u64);
    for (step, (a, b)) in reports[1]
        .losses()
        .iter()
        .zip(reports[0].losses())
        .enumerate()
    {
        assert!(
            (a - b).abs() <= TOLERANCE * b.abs(),
            "step {}: {a} vs {b}",
            step + 1
        );
    }
}

/// A run with K = 4 stopped after 4 steps and resumed (under data parallelism) continues
/// exactly as the uninterrupted one: nothing of the accumulation outlives a step.
#[test]
fn an_accumulating_run_resumes_where_it_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = train(
        &mlp_config(
            &tmp.path().join("whole"),
            "adam",
            "mode = \"stand_alone\"",
            (8, 4, 8),
            &[],
        ),
        8,
        &mlp_weights(),
    );
    let first = tmp.path().join("first");
    let (_, mut losses) = train_steps(
        &mlp_config(&first, "adam", "mode = \"stand_alone\"", (8, 4, 4), &[]),
        4,
    );
    let resume = format!("output.resume_from=\"{}\"", first.display());
    let second = mlp_config(
        &tmp.path().join("second"),
        "adam",
        "devices = 2\nmode = \"data_parallel\"",
        (8, 4, 8),
        &[&resume],
    );
    let (_, rest) = train_steps(&second, 4);
    losses.extend(rest);
    let params = merged_params(&second.output().dir, &mlp_weights());
    assert_same_run("resumed with K = 4", &(losses, params), &whole);
}

/// The small GPT of `tests/gpt.rs` (2 blocks, width 32, 16 tokens) for `steps` optimizer steps
/// of `micro_steps` micro-batches of `batch` windows, with overrides `extra`.
fn gpt_config(
    out: &Path,
    parallel: &str,
    (batch, micro_steps, steps): (usize, usize, usize),
    extra: &[&str],
) -> TrainConfig {
    let mut overrides = vec![
        format!("data.batch_size={batch}"),
        format!("train.grad_accumulation_steps={micro_steps}"),
        format!("train.max_steps={steps}"),
    ];
    overrides.extend(extra.iter().map(|s| s.to_string()));
    run_util::small_gpt(out, "adam", "", parallel, &overrides)
}

/// K = 2 micro-batches of 4 windows equal one batch of 8 windows for 6 steps of the GPT (Adam):
/// a step's micro-batches are the rows of the larger batch's random windows. With data
/// parallel 2 × model parallel 2, K = 2 matches one device's K = 2 run (to the GPT suite's
/// sharding tolerance, 2e-4), with dropout too, and in deterministic mode bit for bit.
#[test]
fn two_micro_batches_train_the_gpt_like_a_twice_larger_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 6;
    let one_device = "mode = \"stand_alone\"";
    let dp_mp = "devices = 4\nmode = \"semi_auto\"\ndata_parallel = 2\nmodel_parallel = 2";
    let names: Vec<String> = Session::new(&gpt_config(
        &tmp.path().join("names"),
        one_device,
        (8, 1, steps),
        &[],
    ))
    .unwrap()
    .train
    .params
    .iter()
    .map(|p| p.name.clone())
    .collect();
    let run = |name: &str, parallel: &str, shape, extra: &[&str]| {
        let config = gpt_config(&tmp.path().join(name), parallel, shape, extra);
        train(&config, steps, &names)
    };
    let larger_batch = run("big", one_device, (8, 1, steps), &[]);
    let accumulated = run("accum", one_device, (4, 2, steps), &[]);
    assert_same_run("GPT, K = 2", &accumulated, &larger_batch);
    let sharded = run("sharded", dp_mp, (4, 2, steps), &[]);
    run_util::assert_same_run(
        "GPT, K = 2, dp 2 × mp 2, against one device",
        &sharded,
        &accumulated,
        2e-4,
    );
    // Dropout: micro-step j of step t draws its masks at step t·K + j, on every rank alike.
    let dropout = ["model.dropout=0.1"];
    let dropped = run("dropout", one_device, (4, 2, steps), &dropout);
    let dropped_sharded = run("dropout-sharded", dp_mp, (4, 2, steps), &dropout);
    run_util::assert_same_run(
        "GPT, K = 2, dropout, dp 2 × mp 2, against one device",
        &dropped_sharded,
        &dropped,
        2e-4,
    );
    let det = ["train.deterministic=true"];
    let det_accumulated = run("det-accum", one_device, (4, 2, steps), &det);
    let det_sharded = run("det-sharded", dp_mp, (4, 2, steps), &det);
    run_util::assert_bitwise_run(
        "GPT, K = 2, dp 2 × mp 2, deterministic",
        &det_sharded,
        &det_accumulated,
    );
}

/// The key is named by every bad value: not a positive integer, above the bound, or more
/// samples per step than the training set holds.
#[test]
fn bad_accumulation_counts_are_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let text = mlp_text(tmp.path(), "sgd", "mode = \"stand_alone\"", (8, 1, 1))
        .replace("grad_accumulation_steps = 1\n", "");
    let parse = |value: &str| {
        let set = format!("train.grad_accumulation_steps={value}");
        TrainConfig::parse(&text, None, &[set], Path::new("/"))
    };
    for (value, says) in [
        ("0", "must be ≥ 1"),
        ("-3", "must be ≥ 1"),
        ("65537", "must be between 1 and 65536"),
        ("2.5", "expected a positive integer"),
        ("\"four\"", "expected a positive integer"),
    ] {
        match parse(value) {
            Err(RuntimeError::Config { key, reason }) => {
                assert_eq!(key, "train.grad_accumulation_steps", "{value}");
                assert!(reason.contains(says), "{value}: {reason}");
            }
            other => panic!("{value}: expected a config error, got {other:?}"),
        }
    }
    assert_eq!(
        parse("65536").unwrap().train().grad_accumulation_steps,
        65536
    );
    assert_eq!(
        TrainConfig::parse(&text, None, &[], Path::new("/"))
            .unwrap()
            .train()
            .grad_accumulation_steps,
        1,
        "the default is no accumulation"
    );
    // 100 micro-batches of 32 are more than the 1500 digits.
    let too_many = mlp_config(
        tmp.path(),
        "sgd",
        "mode = \"stand_alone\"",
        (32, 100, 1),
        &[],
    );
    match Session::new(&too_many) {
        Err(RuntimeError::Config { key, reason }) => {
            assert_eq!(key, "train.grad_accumulation_steps");
            assert!(reason.contains("1500"), "{reason}");
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }
    // A config built in code is checked too.
    let err = runtime::Trainer::new(
        graph::models::seed_mlp(8, &[8, 8], 16, 10).unwrap(),
        parallel::ParallelConfig::stand_alone(),
        digits(),
    )
    .grad_accumulation_steps(0)
    .config()
    .unwrap_err();
    assert!(
        err.to_string().contains("train.grad_accumulation_steps"),
        "{err}"
    );
}
