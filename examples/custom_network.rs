//! A network built with Tessera's Rust API and trained on 8 ranks, semi-auto parallel — the
//! Rust counterpart of a MindSpore script that defines a `Cell`, calls `shard` on its ops and
//! runs `Model.train(epochs, dataset, callbacks=[…])`. The data is any `runtime::Dataset` (here
//! the bundled digits, opened as one; a data set of your own implements the same trait), and a
//! callback of ours watches every step.
//!
//! Run from the repository root:
//! `cargo run --release -p tessera-runtime --example custom_network`

use graph::models::Model;
use graph::nn::{Activation, Dense};
use graph::GraphBuilder;
use parallel::{ParallelConfig, ParallelMode};
use runtime::{Callback, IdxDataset, Normalize, RuntimeError, StepInfo, TrainEndInfo, Trainer};
use tensor::DType;

/// A callback of our own: remembers the lowest loss and the step it came at, and prints them
/// when training ends (it runs on rank 0).
#[derive(Default)]
struct LowestLoss {
    lowest: Option<(u64, f32)>,
}

impl Callback for LowestLoss {
    fn on_step_end(&mut self, step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        if self.lowest.is_none_or(|(_, loss)| step.loss < loss) {
            self.lowest = Some((step.global_step, step.loss));
        }
        Ok(())
    }

    fn on_train_end(&mut self, _end: &TrainEndInfo<'_>) -> Result<(), RuntimeError> {
        if let Some((step, loss)) = self.lowest {
            println!("lowest loss {loss} at step {step}");
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The network: flatten -> fc1 (Dense + ReLU) -> fc2 (Dense) -> cross entropy.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[32, 8, 8], DType::F32)?;
    let labels = b.input("labels", &[32], DType::I32)?;
    let h = b.flatten("flatten", x)?;
    let h = b.call("fc1", &Dense::new(64, 256).activation(Activation::Relu), h)?;
    let logits = b.call("fc2", &Dense::new(256, 10), h)?;
    let loss = b.sparse_softmax_cross_entropy("loss", logits, labels)?;
    let model = Model {
        graph: b.finish(),
        input: x,
        labels,
        logits,
        loss,
    };

    // 8 devices: fc1's matmul split 2 ways on the batch and 4 on its output features (the
    // weight is [out, in], so its strategy is (4, 1)); everything else data parallel.
    let parallel = ParallelConfig::new(ParallelMode::SemiAuto, 8)
        .shard("fc1.matmul", &[&[2, 1], &[4, 1]])
        .shard("fc1.bias_add", &[&[2, 4], &[4]])
        .shard("fc1.relu", &[&[2, 4]]);

    // The digits' training and test splits as data sets (`Trainer::new(model, parallel,
    // "data/digits")` opens the same); any other `runtime::Dataset` goes in their place.
    let (train, test) =
        IdxDataset::open_train_and_test("data/digits".as_ref(), None, Normalize::Standardize)?;
    let report = Trainer::with_dataset(model, parallel, train)
        .test_dataset(test)
        .callback(LowestLoss::default())
        .epochs(3)
        .output_dir("runs/custom_network")
        .train()?;
    println!(
        "{} steps, test accuracy {:.2}%",
        report.losses().len(),
        100.0 * report.accuracies().last().copied().unwrap_or(0.0)
    );
    Ok(())
}
