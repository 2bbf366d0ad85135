//! `parallel.strategy_file_only_for_trainable_params`: MindSpore's strategy file lists only the
//! trainable parameters unless told otherwise; Tessera's checkpoints hold what the strategy file
//! describes and a resume loads it.

use std::path::{Path, PathBuf};

use graph::models::Model;
use graph::nn::{Activation, Dense};
use graph::Initializer;
use parallel::{ParallelConfig, ParallelMode};
use runtime::{LaunchOptions, OutputConfig, ResumeFrom, Session, TrainConfig, TrainLoopConfig};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/digits")
}

/// An MLP whose output projection `frozen_head` is a non-trainable parameter.
fn model() -> Model {
    let mut b = graph::GraphBuilder::new();
    let x = b.input("x", &[32, 8, 8], tensor::DType::F32).unwrap();
    let labels = b.input("labels", &[32], tensor::DType::I32).unwrap();
    let h = b.flatten("flatten", x).unwrap();
    let h = b
        .call("fc1", &Dense::new(64, 32).activation(Activation::Relu), h)
        .unwrap();
    let head = b
        .parameter_with(
            "frozen_head",
            &[32, 10],
            tensor::DType::F32,
            Initializer::Uniform { scale: 0.5 },
            false,
        )
        .unwrap();
    let logits = b.matmul("head", h, head).unwrap();
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

/// A config of `model()` on 2 data-parallel devices: `steps` steps in all from `seed`,
/// unshuffled, writing to `out`, resuming from `resume` when set.
fn config(out: &Path, seed: u64, steps: u64, only: bool, resume: Option<&Path>) -> TrainConfig {
    let parallel = ParallelConfig::new(ParallelMode::SemiAuto, 2);
    let base = runtime::Trainer::new(model(), parallel, data_dir())
        .config()
        .unwrap();
    let mut data = base.data().clone();
    data.shuffle = false;
    let train = TrainLoopConfig {
        max_steps: Some(steps),
        seed,
        eval: false,
        ..base.train().clone()
    };
    let output = OutputConfig {
        dir: out.to_path_buf(),
        save_checkpoint: true,
        save_checkpoint_steps: None,
        save_checkpoint_seconds: None,
        keep_checkpoint_max: 5,
        resume_from: resume.map(|p| ResumeFrom::Dir(p.to_path_buf())),
        resume_strategy: None,
        group_info_file: None,
    };
    TrainConfig::from_parts(
        base.model().clone(),
        data,
        base.parallel_config(),
        base.optimizer_config(),
        train,
        output,
    )
    .unwrap()
    .with_strategy_file_only_for_trainable_params(only)
}

fn losses(config: &TrainConfig) -> Vec<f32> {
    let session = Session::with_model(config, model()).unwrap();
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    runtime::train_local(&session, &options)
        .unwrap()
        .losses()
        .to_vec()
}

/// Whether the strategy files and rank 0's checkpoint in `out` hold `name`.
fn saved(out: &Path, name: &str) -> [bool; 3] {
    let json = ckpt::Strategy::load(&out.join("strategy.json")).unwrap();
    let ms = ckpt::Strategy::load(&out.join("strategy.ckpt")).unwrap();
    let rank0 = ckpt::rank_file_path(out, 0, "checkpoint_", ckpt::Format::Safetensors);
    let file = ckpt::CheckpointFile::open(&rank0).unwrap();
    [
        json.param(name).is_some(),
        ms.param(name).is_some(),
        file.read_tensor(name).is_ok(),
    ]
}

#[test]
fn only_trainable_parameters_are_saved_by_default() {
    let tmp = tempfile::tempdir().unwrap();
    for (only, want) in [(true, false), (false, true)] {
        let out = tmp.path().join(format!("only-{only}"));
        losses(&config(&out, 3, 2, only, None));
        assert_eq!(saved(&out, "frozen_head"), [want; 3], "only = {only}");
        assert_eq!(saved(&out, "fc1.weight"), [true; 3], "only = {only}");
        assert!(saved(&out, "moments.fc1.weight")[0], "only = {only}");
    }
}

#[test]
fn non_trainable_parameters_are_resumed_only_when_saved() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = losses(&config(&tmp.path().join("whole"), 3, 20, false, None));
    for only in [false, true] {
        let first = tmp.path().join(format!("first-{only}"));
        let mut run = losses(&config(&first, 3, 10, only, None));
        // Resumed with another seed: the frozen head is the checkpoint's only if it was saved.
        let second = tmp.path().join(format!("second-{only}"));
        run.extend(losses(&config(&second, 4, 20, only, Some(&first))));
        assert_eq!(run.len(), 20);
        let same = run
            .iter()
            .zip(&whole)
            .all(|(a, b)| (a - b).abs() <= 1e-4 * b.abs().max(1e-12));
        assert_eq!(same, !only, "only = {only}: {run:?} vs {whole:?}");
    }
    // A checkpoint saved without the frozen head cannot give it to a run that asks for it.
    let from = tmp.path().join("first-true");
    let session = Session::with_model(
        &config(&tmp.path().join("third"), 4, 20, false, Some(&from)),
        model(),
    )
    .unwrap();
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    let err = runtime::train_local(&session, &options)
        .unwrap_err()
        .to_string();
    assert!(err.contains("frozen_head"), "{err}");
}
