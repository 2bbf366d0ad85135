//! A network built with `GraphBuilder`, trained through [`runtime::Trainer`] on a data set
//! implemented here in memory (not IDX files): sharded over 8 devices it trains exactly as on
//! one, reading every batch through the [`Dataset`] trait, and a callback of the caller's sees
//! every step.

use std::sync::{Arc, Mutex};

use graph::models::Model;
use graph::nn::{Activation, Dense};
use graph::GraphBuilder;
use parallel::{ParallelConfig, ParallelMode};
use runtime::{
    Callback, Dataset, RuntimeError, SampleSpec, StepInfo, TrainEndInfo, TrainReport, Trainer,
};
use tensor::{DType, Tensor};

/// Samples per batch.
const BATCH: usize = 16;
/// Classes.
const CLASSES: usize = 4;

/// `n` samples of 4×4 pixels in [0, 1) from a fixed hash, each labelled by which quarter of
/// the image is brightest: learnable, and the same on every call.
#[derive(Debug)]
struct Quarters {
    pixels: Vec<f32>,
    labels: Vec<i32>,
}

impl Quarters {
    fn new(n: usize, salt: u64) -> Quarters {
        let mut pixels = Vec::with_capacity(n * 16);
        let mut labels = Vec::with_capacity(n);
        for sample in 0..n {
            let image: Vec<f32> = (0..16)
                .map(|p| {
                    let mut x = (sample as u64 * 16 + p as u64 + 1) ^ salt;
                    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    x ^= x >> 29;
                    (x % 1000) as f32 / 1000.0
                })
                .collect();
            let quarter = |q: usize| -> f32 {
                let (r0, c0) = (2 * (q / 2), 2 * (q % 2));
                (0..4).map(|k| image[(r0 + k / 2) * 4 + c0 + k % 2]).sum()
            };
            let label = (0..CLASSES)
                .max_by(|&a, &b| quarter(a).total_cmp(&quarter(b)))
                .unwrap();
            pixels.extend(image);
            labels.push(label as i32);
        }
        Quarters { pixels, labels }
    }
}

impl Dataset for Quarters {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn input_spec(&self) -> SampleSpec {
        SampleSpec {
            shape: vec![4, 4],
            dtype: DType::F32,
        }
    }

    fn label_spec(&self) -> SampleSpec {
        SampleSpec {
            shape: Vec::new(),
            dtype: DType::I32,
        }
    }

    fn read_inputs(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        let values = indices
            .iter()
            .flat_map(|&i| self.pixels[i * 16..(i + 1) * 16].iter().copied())
            .collect();
        Ok(Tensor::from_vec(&[indices.len(), 4, 4], values)?)
    }

    fn read_labels(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        let values = indices.iter().map(|&i| self.labels[i]).collect();
        Ok(Tensor::from_vec(&[indices.len()], values)?)
    }
}

/// flatten → fc1 (Dense 16 → 32, ReLU) → fc2 (Dense 32 → 4) → cross entropy.
fn model() -> Model {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[BATCH, 4, 4], DType::F32).unwrap();
    let labels = b.input("labels", &[BATCH], DType::I32).unwrap();
    let h = b.flatten("flatten", x).unwrap();
    let h = b
        .call("fc1", &Dense::new(16, 32).activation(Activation::Relu), h)
        .unwrap();
    let logits = b.call("fc2", &Dense::new(32, CLASSES), h).unwrap();
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

/// What the caller's callback saw: every step's global step and loss, and the run's end.
#[derive(Debug, Default)]
struct Seen {
    steps: Vec<(u64, f32)>,
    ended_at: Option<u64>,
}

/// Records into a shared [`Seen`].
struct Recorder(Arc<Mutex<Seen>>);

impl Callback for Recorder {
    fn on_step_end(&mut self, step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        self.0
            .lock()
            .unwrap()
            .steps
            .push((step.global_step, step.loss));
        Ok(())
    }

    fn on_train_end(&mut self, end: &TrainEndInfo<'_>) -> Result<(), RuntimeError> {
        self.0.lock().unwrap().ended_at = Some(end.global_step);
        Ok(())
    }
}

/// Two epochs of `model()` on 128 samples (8 steps each) under `parallel`, evaluated on 40
/// test samples after each; what the run reports and what its callback saw.
fn train(
    parallel: ParallelConfig,
    deterministic: bool,
    out: &std::path::Path,
) -> (TrainReport, Seen) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let report = Trainer::with_dataset(model(), parallel, Quarters::new(128, 7))
        .test_dataset(Quarters::new(40, 11))
        .callback(Recorder(seen.clone()))
        .epochs(2)
        .deterministic(deterministic)
        .print_loss(false)
        .output_dir(out)
        .train()
        .unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (report, seen)
}

/// fc1 split 2 ways on the batch and 4 on its output features, fc2 on its input features:
/// 8 devices.
fn sharded() -> ParallelConfig {
    ParallelConfig::new(ParallelMode::SemiAuto, 8)
        .shard("fc1.matmul", &[&[2, 1], &[4, 1]])
        .shard("fc1.bias_add", &[&[2, 4], &[4]])
        .shard("fc1.relu", &[&[2, 4]])
        .shard("fc2.matmul", &[&[1, 4], &[2, 4]])
}

#[test]
fn a_network_trains_on_an_in_memory_dataset_sharded_exactly_as_on_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, one_seen) = train(ParallelConfig::stand_alone(), true, &tmp.path().join("one"));
    let (eight, eight_seen) = train(sharded(), true, &tmp.path().join("eight"));
    assert_eq!(one.losses().len(), 16, "2 epochs of 128 / 16 batches");
    let bits = |r: &TrainReport| r.losses().iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&eight),
        bits(&one),
        "deterministic mode: 8 devices are one device"
    );
    assert_eq!(eight.accuracies(), one.accuracies());
    assert_eq!(
        one.accuracies().len(),
        2,
        "evaluated on the test set after each epoch"
    );
    assert!(
        one.losses().last() < one.losses().first(),
        "it learns: {:?}",
        one.losses()
    );
    // The caller's callback saw every step, in order, with the reported loss, and the end.
    for (report, seen) in [(&one, &one_seen), (&eight, &eight_seen)] {
        let expected: Vec<(u64, f32)> = (1..).zip(report.losses().iter().copied()).collect();
        assert_eq!(seen.steps, expected);
        assert_eq!(seen.ended_at, Some(16));
    }
    // Without deterministic mode the sharded run agrees within the usual tolerance.
    let (loose, _) = train(sharded(), false, &tmp.path().join("loose"));
    for (step, (a, b)) in loose.losses().iter().zip(one.losses()).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs().max(1e-3),
            "step {}: {a} vs {b}",
            step + 1
        );
    }
}

/// The data set's samples must be what the model's data input takes.
#[test]
fn a_dataset_whose_samples_the_model_cannot_take_is_refused() {
    #[derive(Debug)]
    struct Wide(Quarters);
    impl Dataset for Wide {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn input_spec(&self) -> SampleSpec {
            SampleSpec {
                shape: vec![4, 8],
                dtype: DType::F32,
            }
        }
        fn label_spec(&self) -> SampleSpec {
            self.0.label_spec()
        }
        fn read_inputs(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
            self.0.read_inputs(indices)
        }
        fn read_labels(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
            self.0.read_labels(indices)
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let err = Trainer::with_dataset(
        model(),
        ParallelConfig::stand_alone(),
        Wide(Quarters::new(64, 3)),
    )
    .print_loss(false)
    .output_dir(tmp.path())
    .train()
    .unwrap_err()
    .to_string();
    assert!(err.contains("[16, 4, 8]"), "{err}");
}
