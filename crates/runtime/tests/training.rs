//! Training on N ranks gives the numbers one device gives.
//!
//! For every configuration: 20 training steps on N ranks (local backend) give the same loss at
//! every step as `stand_alone` on the same global batches (relative difference ≤ 1e-4), and the
//! checkpoints the ranks save, merged into full tensors with `ckpt`, hold the same parameters
//! (≤ 1e-4). Then: resuming from a checkpoint saved under one strategy into another continues
//! exactly where an uninterrupted run goes.

use std::path::{Path, PathBuf};

use runtime::{LaunchOptions, Session, TrainConfig};

use crate::run_util::{self, merged_params, train_steps, Run};

/// The bundled digits, relative to this crate.
fn data_dir() -> PathBuf {
    run_util::digits()
}

/// A config of the seed MLP (hidden 128) training 20 steps, with `parallel` as the
/// `[parallel]` section body and `extra` appended.
fn config(out: &Path, optimizer: &str, parallel: &str, extra: &[&str]) -> TrainConfig {
    run_util::seed_mlp(out, optimizer, parallel, extra)
}

/// The seed MLP's weights.
fn weights() -> Vec<String> {
    ["fc1_weight", "fc2_weight", "fc3_weight"]
        .map(String::from)
        .to_vec()
}

/// Trains `config` for 20 steps: the losses, and the merged weights by name.
fn train(config: &TrainConfig) -> Run {
    let (_, losses) = train_steps(config, 20);
    (losses, merged_params(&config.output().dir, &weights()))
}

fn assert_same_run(what: &str, run: &Run, reference: &Run) {
    run_util::assert_same_run(what, run, reference, 1e-4);
}

const SEED_SHARDS: &str = r#"
[parallel.shard]
matmul1 = [[2, 4], [4, 1]]
relu1 = [[4, 1]]
matmul2 = [[1, 8], [8, 1]]
relu2 = [[8, 1]]
"#;

fn semi(devices: usize, shards: &str) -> String {
    format!(
        "devices = {devices}\nmode = \"semi_auto\"\ndataset_strategy = \"data_parallel\"\ngradients_mean = true\n{shards}"
    )
}

#[test]
fn twelve_configurations_match_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let stand_alone = "devices = 1\nmode = \"stand_alone\"";
    for optimizer in ["momentum", "adam"] {
        let reference = train(&config(
            &tmp.path().join(format!("sa-{optimizer}")),
            optimizer,
            stand_alone,
            &[],
        ));
        let cases: Vec<(&str, String, Vec<&str>)> = vec![
            ("seed strategies, 8 devices", semi(8, SEED_SHARDS), vec![]),
            ("data parallel, 8 devices", "devices = 8\nmode = \"data_parallel\"".to_string(), vec![]),
            ("data parallel, 2 devices", "devices = 2\nmode = \"data_parallel\"".to_string(), vec![]),
            ("data parallel, 4 devices", "devices = 4\nmode = \"data_parallel\"".to_string(), vec![]),
            ("semi_auto, 1 device", semi(1, ""), vec![]),
            ("model parallel on matmul1 rows", semi(4, "[parallel.shard]\nmatmul1 = [[4, 1], [1, 1]]"), vec![]),
            ("model parallel on matmul1 reduction dim", semi(4, "[parallel.shard]\nmatmul1 = [[1, 4], [4, 1]]"), vec![]),
            ("model parallel on matmul2 columns", semi(4, "[parallel.shard]\nmatmul2 = [[1, 1], [1, 4]]"), vec![]),
            (
                "split reduction dim with an out-strategy (reduce-scatter)",
                semi(8, "[parallel.shard]\nmatmul1 = [[2, 4], [4, 1]]\n[parallel.out_shard]\nmatmul1 = [[8, 1]]"),
                vec![],
            ),
            ("repeated calculation (strategy on 2 of 8 devices)", semi(8, "[parallel.shard]\nmatmul1 = [[2, 1], [1, 1]]\nmatmul3 = [[1, 2], [2, 1]]"), vec![]),
            (
                "full batch with a split matmul3",
                semi(4, "[parallel.shard]\nmatmul3 = [[1, 4], [4, 1]]"),
                vec!["parallel.dataset_strategy=\"full_batch\""],
            ),
            (
                "per-input dataset strategy",
                semi(8, SEED_SHARDS),
                vec!["parallel.dataset_strategy=[[2, 1, 1], [2]]"],
            ),
        ];
        assert!(cases.len() >= 12);
        for (i, (what, parallel, extra)) in cases.iter().enumerate() {
            let out = tmp.path().join(format!("{optimizer}-{i}"));
            let run = train(&config(&out, optimizer, parallel, extra));
            assert_same_run(&format!("{what} ({optimizer})"), &run, &reference);
        }
    }
}

/// `train.deterministic = true`: the seed MLP under the seed's strategy (a split reduction
/// dim), data parallelism, a reduce-scatter out-strategy and repeated calculation gives one
/// device's losses and weights bit for bit.
#[test]
fn deterministic_mlp_runs_are_bitwise_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let det = "train.deterministic=true";
    for optimizer in ["sgd", "adam"] {
        let reference = train(&config(
            &tmp.path().join(format!("sa-{optimizer}")),
            optimizer,
            "devices = 1\nmode = \"stand_alone\"",
            &[det],
        ));
        let cases: Vec<(&str, String)> = vec![
            ("seed strategies, 8 devices", semi(8, SEED_SHARDS)),
            ("data parallel, 4 devices", "devices = 4\nmode = \"data_parallel\"".to_string()),
            (
                "split reduction dim with an out-strategy (reduce-scatter)",
                semi(8, "[parallel.shard]\nmatmul1 = [[2, 4], [4, 1]]\n[parallel.out_shard]\nmatmul1 = [[8, 1]]"),
            ),
            ("repeated calculation", semi(8, "[parallel.shard]\nmatmul1 = [[2, 1], [1, 1]]\nmatmul3 = [[1, 2], [2, 1]]")),
        ];
        for (i, (what, parallel)) in cases.iter().enumerate() {
            let out = tmp.path().join(format!("det-{optimizer}-{i}"));
            let run = train(&config(&out, optimizer, parallel, &[det]));
            run_util::assert_bitwise_run(&format!("{what} ({optimizer})"), &run, &reference);
        }
    }
}

/// Pipeline stages (one batch at a time): the layers split over 2 or 4 stages, data or model
/// parallel inside each stage's ranks, train like one device.
#[test]
fn pipeline_stages_match_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = train(&config(
        &tmp.path().join("sa"),
        "momentum",
        "devices = 1\nmode = \"stand_alone\"",
        &[],
    ));
    let cases: Vec<(&str, String)> = vec![
        ("2 stages on 2 devices", semi(2, "[parallel.pipeline]\nstages = 2")),
        ("2 stages × data parallel 2", semi(4, "[parallel.pipeline]\nstages = 2")),
        (
            "2 stages, model parallel inside a stage",
            semi(4, "[parallel.shard]\nmatmul2 = [[1, 2], [2, 1]]\n[parallel.pipeline]\nstages = 2"),
        ),
        (
            "2 stages, 4 micro-batches, 1F1B",
            semi(2, "[parallel.pipeline]\nstages = 2\nmicro_batches = 4"),
        ),
        (
            "2 stages × data parallel 2, 2 micro-batches, GPipe",
            semi(4, "[parallel.pipeline]\nstages = 2\nmicro_batches = 2\nscheduler = \"gpipe\""),
        ),
        (
            "3 stages, 8 micro-batches, zero bubble",
            semi(3, "[parallel.pipeline]\nstages = 3\nmicro_batches = 8\nscheduler = \"zero_bubble\"\n[parallel.pipeline.stage_config]\nmatmul1 = 0\nmatmul2 = 1\nmatmul3 = 2"),
        ),
        (
            "3 stages by stage_config",
            semi(3, "[parallel.pipeline]\nstages = 3\n[parallel.pipeline.stage_config]\nmatmul1 = 0\nmatmul2 = 1\nmatmul3 = 2"),
        ),
    ];
    for (i, (what, parallel)) in cases.iter().enumerate() {
        let out = tmp.path().join(format!("pipe-{i}"));
        let run = train(&config(&out, "momentum", parallel, &[]));
        assert_same_run(what, &run, &reference);
    }
}

/// Under pipeline stages the loss lives on the last stage, so `loss_repeated_mean = false` scales
/// the gradients by that stage's devices over the loss's batch shards (MindSpore's `VirtualDiv`
/// is per stage): 2 stages × data parallel 2 repeat it on no device, so the run is the
/// default's bit for bit (counting the job's 4 devices would double the gradients).
#[test]
fn loss_repeated_mean_counts_the_loss_stages_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let pipe = "[parallel.pipeline]\nstages = 2";
    let run = |name: &str, parallel: String, extra: &[&str]| {
        train(&config(
            &tmp.path().join(name),
            "momentum",
            &parallel,
            extra,
        ))
    };
    let repeat_off = ["parallel.loss_repeated_mean=false"];
    let reference = run("dp", semi(4, pipe), &[]);
    let off = run("dp-off", semi(4, pipe), &repeat_off);
    run_util::assert_bitwise_run("2 stages × dp 2", &off, &reference);
}

/// Strategies the canonical blocks can't serve are refused before training, naming the op, the
/// dim and the rule.
#[test]
fn deterministic_mode_refuses_misaligned_splits() {
    let tmp = tempfile::tempdir().unwrap();
    let refused = |parallel: String, extra: &[&str]| {
        let mut all = vec!["train.deterministic=true"];
        all.extend_from_slice(extra);
        let c = config(tmp.path(), "sgd", &parallel, &all);
        runtime::Session::new(&c)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    // 64 inputs in at most 2 blocks, split 4 ways.
    let err = refused(
        semi(4, "[parallel.shard]\nmatmul1 = [[1, 4], [4, 1]]"),
        &["parallel.deterministic_blocks=2"],
    );
    assert!(
        err.contains("matmul1")
            && err.contains("dim 1 of input 0")
            && err.contains("splits 4 ways"),
        "{err}"
    );
    // In a search mode the searches keep to the blocks, so a refused split is one they kept
    // fixed: the error says so, with what to change.
    let searched = "devices = 8\nmode = \"sharding_propagation\"\n\
                    [parallel.shard]\nmatmul1 = [[1, 8], [8, 1]]"
        .to_string();
    let err = refused(searched, &["parallel.deterministic_blocks=2"]);
    assert!(
        err.contains("which its strategy splits")
            && err.contains("[parallel.shard]")
            && err.contains("raise parallel.deterministic_blocks (now 2)"),
        "{err}"
    );
    // A split no key gave (the loss's default: its batch over 6 devices) says where it comes
    // from; a keyed one does not claim to be the default.
    let err = refused(
        "devices = 6\nmode = \"semi_auto\"".to_string(),
        &["data.batch_size=48"],
    );
    assert!(
        err.contains("splits 6 ways")
            && err.contains("the op's default, its batch split over the run's 6 devices"),
        "{err}"
    );
    assert!(
        !refused(
            semi(4, "[parallel.shard]\nmatmul1 = [[1, 4], [4, 1]]"),
            &["parallel.deterministic_blocks=2"],
        )
        .contains("the op's default"),
        "a keyed strategy called the default"
    );
    let bad = TrainConfig::parse(
        "[model]\nname = \"seed_mlp\"\nhidden = 8\nclasses = 10\n[data]\nformat = \"idx\"\ndir = \"x\"\nbatch_size = 8\n[parallel]\ndeterministic_blocks = 6\n[train]\nepochs = 1\n[output]\ndir = \"o\"\n",
        None,
        &[],
        Path::new("/"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        bad.contains("parallel.deterministic_blocks") && bad.contains("power of two"),
        "{bad}"
    );
}

#[test]
fn resuming_under_another_strategy_continues_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    // An uninterrupted 20-step run on one device.
    let whole = train(&config(
        &tmp.path().join("whole"),
        "momentum",
        "devices = 1\nmode = \"stand_alone\"",
        &[],
    ));
    // 10 steps under the seed strategies on 8 devices, then 10 more on 4 data-parallel devices
    // resumed from that checkpoint (converted on load, optimizer state included).
    let first = tmp.path().join("first");
    let first_cfg = config(
        &first,
        "momentum",
        &semi(8, SEED_SHARDS),
        &["train.max_steps=10"],
    );
    let session = Session::new(&first_cfg).unwrap();
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    let first_report = runtime::train_local(&session, &options).unwrap();
    let resume = format!("output.resume_from=\"{}\"", first.display());
    let second_cfg = config(
        &tmp.path().join("second"),
        "momentum",
        "devices = 4\nmode = \"data_parallel\"",
        &[&resume],
    );
    let (second_losses, second_params) = train_resumed(&second_cfg);
    let mut losses = first_report.losses().to_vec();
    losses.extend(second_losses);
    assert_same_run("resumed run", &(losses, second_params), &whole);
}

/// A run that diverges (a huge learning rate makes the loss NaN) stops with the invalid loss,
/// printed or not: without the printing monitor it used to end as a success.
#[test]
fn a_diverging_run_stops_on_its_invalid_loss_printed_or_not() {
    let tmp = tempfile::tempdir().unwrap();
    for print_loss in [false, true] {
        let cfg = config(
            &tmp.path().join(format!("diverge-{print_loss}")),
            "momentum",
            "devices = 2\nmode = \"data_parallel\"",
            &["train.learning_rate=1e30", "train.max_steps=20"],
        );
        let session = Session::new(&cfg).unwrap();
        let options = LaunchOptions {
            print_loss,
            ..LaunchOptions::default()
        };
        let err = runtime::train_local(&session, &options).unwrap_err();
        assert!(
            matches!(root(&err), runtime::RuntimeError::InvalidLoss { .. }),
            "print_loss = {print_loss}: {err}"
        );
    }
}

/// The error under a rank's wrapper.
fn root(err: &runtime::RuntimeError) -> &runtime::RuntimeError {
    match err {
        runtime::RuntimeError::Rank { source, .. } => root(source),
        other => other,
    }
}

/// A checkpoint of a 2-stage pipeline run (each rank saved only its stage's parameters)
/// resumes without a pipeline, and a data-parallel checkpoint resumes under 2 stages: the
/// losses continue one device's run.
#[test]
fn pipeline_checkpoints_resume_under_another_stage_count() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = train(&config(
        &tmp.path().join("whole"),
        "momentum",
        "devices = 1\nmode = \"stand_alone\"",
        &[],
    ));
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    for (i, (first_parallel, second_parallel)) in [
        (
            semi(4, "[parallel.pipeline]\nstages = 2"),
            "devices = 2\nmode = \"data_parallel\"".to_string(),
        ),
        (
            "devices = 2\nmode = \"data_parallel\"".to_string(),
            semi(4, "[parallel.pipeline]\nstages = 2"),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let first = tmp.path().join(format!("first-{i}"));
        let first_cfg = config(&first, "momentum", &first_parallel, &["train.max_steps=10"]);
        let first_report =
            runtime::train_local(&Session::new(&first_cfg).unwrap(), &options).unwrap();
        let resume = format!("output.resume_from=\"{}\"", first.display());
        let second_cfg = config(
            &tmp.path().join(format!("second-{i}")),
            "momentum",
            &second_parallel,
            &[&resume],
        );
        let (second_losses, second_params) = train_resumed(&second_cfg);
        let mut losses = first_report.losses().to_vec();
        losses.extend(second_losses);
        assert_same_run(
            &format!("resume case {i}"),
            &(losses, second_params),
            &whole,
        );
    }
}

/// Like [`train`] for a resumed run, which runs only the remaining steps.
fn train_resumed(config: &TrainConfig) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let session = Session::new(config).unwrap();
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    let report = runtime::train_local(&session, &options).unwrap();
    assert_eq!(
        report.losses().len(),
        10,
        "the resumed run trains the remaining steps"
    );
    assert_eq!(report.ranks[0].global_step, 20);
    let params = merged_params(&config.output().dir, &weights());
    (report.losses().to_vec(), params)
}

/// A network with biases, GeLU and layer norm built with the Rust API: sharded training matches
/// one device.
#[test]
fn a_custom_network_with_biases_and_layer_norm_matches_one_device() {
    use graph::models::Model;
    use graph::nn::{Activation, Dense, LayerNorm};
    use parallel::{ParallelConfig, ParallelMode};

    fn model() -> Model {
        let mut b = graph::GraphBuilder::new();
        let x = b.input("x", &[32, 8, 8], tensor::DType::F32).unwrap();
        let labels = b.input("labels", &[32], tensor::DType::I32).unwrap();
        let h = b.flatten("flatten", x).unwrap();
        let h = b
            .call(
                "fc1",
                &Dense::new(64, 128).activation(Activation::Gelu { approximate: true }),
                h,
            )
            .unwrap();
        let h = b.call("norm", &LayerNorm::new(128), h).unwrap();
        let logits = b.call("fc2", &Dense::new(128, 10), h).unwrap();
        let loss = b
            .sparse_softmax_cross_entropy("loss", logits, labels)
            .unwrap();
        Model {
            graph: b.finish(),
            input: x,
            labels,
            logits,
            loss,
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = |parallel: ParallelConfig, name: &str| {
        runtime::Trainer::new(model(), parallel, data_dir())
            .max_steps(20)
            .print_loss(false)
            .output_dir(tmp.path().join(name))
            .train()
            .unwrap()
    };
    let one = run(ParallelConfig::stand_alone(), "one");
    let sharded = run(
        ParallelConfig::new(ParallelMode::SemiAuto, 8)
            .shard("fc1.matmul", &[&[2, 1], &[4, 1]])
            .shard("fc1.bias_add", &[&[2, 4], &[4]])
            .shard("fc2.matmul", &[&[1, 4], &[2, 4]]),
        "sharded",
    );
    assert_eq!(one.losses().len(), 20);
    for (step, (a, b)) in sharded.losses().iter().zip(one.losses()).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs(),
            "step {}: {a} vs {b}",
            step + 1
        );
    }
}

/// Strategies given as MindSpore layouts on a (dp, sp, mp) = (2, 2, 2) mesh, with the batch
/// split over two axes and matmul2's reduction dim split over two (a pending sum).
const LAYOUT_SHARDS: &str = r#"
dataset_strategy = [[["dp", "sp"], "None", "None"], [["dp", "sp"]]]
[parallel.mesh]
device_matrix = [2, 2, 2]
alias_name = ["dp", "sp", "mp"]
[parallel.shard]
matmul1 = [[["dp", "sp"], "None"], ["None", "mp"]]
relu1 = [[["dp", "sp"], "mp"]]
matmul2 = [["dp", ["sp", "mp"]], [["sp", "mp"], "None"]]
matmul3 = [[["dp", "sp"], "mp"], ["mp", "None"]]
[parallel.out_shard]
matmul2 = [[["dp", "sp", "mp"], "None"]]
"#;

#[test]
fn layout_valued_strategies_match_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = train(&config(
        &tmp.path().join("sa"),
        "momentum",
        "devices = 1\nmode = \"stand_alone\"",
        &[],
    ));
    let parallel = format!("devices = 8\nmode = \"semi_auto\"\n{LAYOUT_SHARDS}");
    let out = tmp.path().join("layouts");
    let cfg = config(&out, "momentum", &parallel, &[]);
    let session = Session::new(&cfg).unwrap();
    // Strategy files record the layouts' split factors.
    let recorded: std::collections::BTreeMap<String, Vec<Vec<usize>>> = session
        .op_strategies()
        .into_iter()
        .map(|r| (r.name, r.inputs))
        .collect();
    assert_eq!(recorded["matmul1"], vec![vec![4, 1], vec![1, 2]]);
    assert_eq!(recorded["matmul2"], vec![vec![2, 4], vec![4, 1]]);
    let run = train(&cfg);
    assert_same_run("layout-valued strategies", &run, &reference);
}
