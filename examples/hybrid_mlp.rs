//! HYBRID_PARALLEL by hand: the seed MLP (`x · W1 → ReLU → · W2 → ReLU → · W3 → cross
//! entropy`) trained on a `dp × mp` mesh where the code on each rank slices the weights and
//! places the communication itself, Megatron style — the Rust counterpart of a MindSpore script
//! in `hybrid_parallel` mode, or of JAX's `shard_map`:
//!
//! - `W1` is split by columns over `mp` and `W2` by rows, so `relu(x·W1)` needs no
//!   communication and `·W2` leaves partial sums, all-reduced over `mp`;
//! - the batch is split over `dp`, so the weight gradients are all-reduced over `dp`;
//! - `W3` is replicated.
//!
//! It trains the numbers `mode = "stand_alone"` trains (the same initial values, batches and
//! optimizer). Run from the repository root:
//! `cargo run --release -p tessera-runtime --example hybrid_mlp`

use std::path::{Path, PathBuf};
use std::time::Duration;

use comm::ReduceOp;
use graph::{FanMode, Initializer};
use layout::Layout;
use runtime::{
    BatchPlan, HybridRank, IdxDataset, Normalize, Optimizer, OptimizerConfig, OptimizerKind,
    ParamSpec, RuntimeError,
};
use tensor::kernels::{self, UnaryOp};
use tensor::{DType, Tensor};

/// What to train: the seed MLP's sizes and its stand-alone config's hyperparameters.
#[derive(Debug, Clone)]
pub struct HybridMlp {
    /// The digits (IDX files).
    pub data_dir: PathBuf,
    /// Data-parallel ranks.
    pub dp: usize,
    /// Model-parallel ranks.
    pub mp: usize,
    /// Hidden width (divisible by `mp`).
    pub hidden: usize,
    /// The global batch (divisible by `dp`).
    pub batch_size: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// Momentum SGD's learning rate.
    pub learning_rate: f64,
    /// Momentum SGD's μ.
    pub momentum: f64,
    /// Seed of the initial weights and of the shuffle.
    pub seed: u64,
}

/// A finished run: the loss of every step and every weight, assembled whole.
#[derive(Debug, Clone)]
pub struct HybridRun {
    /// The global batch's mean loss at every step.
    pub losses: Vec<f32>,
    /// `fc1_weight`, `fc2_weight`, `fc3_weight`, whole.
    pub weights: Vec<(String, Tensor)>,
}

/// The weights, their shapes and how each rank slices them (MindSpore's `Layout` spelling).
fn weights(
    spec: &HybridMlp,
    in_features: usize,
) -> Result<Vec<(String, Vec<usize>, Layout)>, RuntimeError> {
    let mesh = Layout::new(&[spec.dp, spec.mp], &["dp", "mp"], None)?;
    let classes = 10;
    Ok(vec![
        (
            "fc1_weight".to_string(),
            vec![in_features, spec.hidden],
            mesh.apply(&["None".into(), "mp".into()])?,
        ),
        (
            "fc2_weight".to_string(),
            vec![spec.hidden, spec.hidden],
            mesh.apply(&["mp".into(), "None".into()])?,
        ),
        (
            "fc3_weight".to_string(),
            vec![spec.hidden, classes],
            mesh.apply(&["None".into(), "None".into()])?,
        ),
    ])
}

/// Trains `spec` on a `dp × mp` mesh of threads.
pub fn train_hybrid_mlp(spec: &HybridMlp) -> Result<HybridRun, RuntimeError> {
    let (train, _) = IdxDataset::open_train_and_test(&spec.data_dir, None, Normalize::Standardize)?;
    let [rows, cols] = train.image_shape();
    let params = weights(spec, rows * cols)?;
    let mesh = params[0].2.mesh().clone();
    let per_rank = runtime::run_hybrid(&mesh, Duration::from_secs(60), |place| {
        train_rank(spec, &train, &params, place)
    })?;
    // Every rank holds a box of each weight; together they tile it.
    let mut whole: Vec<(String, Tensor)> = params
        .iter()
        .map(|(name, shape, _)| (name.clone(), Tensor::zeros(DType::F32, shape)))
        .collect();
    for (_, shards) in &per_rank {
        for ((_, full), (region, shard)) in whole.iter_mut().zip(shards) {
            full.insert_box(region, shard)?;
        }
    }
    Ok(HybridRun {
        losses: per_rank[0].0.clone(),
        weights: whole,
    })
}

/// One rank's training: its losses, and its box and shard of every weight at the end.
type RankRun = (Vec<f32>, Vec<(layout::SliceBox, Tensor)>);

fn train_rank(
    spec: &HybridMlp,
    train: &IdxDataset,
    params: &[(String, Vec<usize>, Layout)],
    place: &mut HybridRank,
) -> Result<RankRun, RuntimeError> {
    let init = Initializer::HeUniform {
        negative_slope: 0.0,
        mode: FanMode::FanOut,
    };
    let mut boxes = Vec::new();
    let mut shards = Vec::new();
    for (name, shape, layout) in params {
        let region = place.slice_box(layout, shape)?;
        shards.push(init.fill(shape, &region, DType::F32, spec.seed, name)?);
        boxes.push(region);
    }
    let specs: Vec<ParamSpec> = params
        .iter()
        .zip(&shards)
        .map(|((name, _, _), s)| ParamSpec {
            name: name.clone(),
            shape: s.shape().to_vec(),
            dtype: DType::F32,
        })
        .collect();
    let kind = OptimizerKind::Momentum {
        momentum: spec.momentum,
        use_nesterov: false,
    };
    let config = OptimizerConfig {
        kind,
        learning_rate: spec.learning_rate,
        weight_decay: 0.0,
    };
    let mut optimizer = Optimizer::new(config, &specs)?;
    let local_rows = spec.batch_size / spec.dp;
    let first_row = place.coordinate("dp")? * local_rows;
    let plan = BatchPlan::train(train.len(), spec.batch_size, true, spec.seed, 1)?;
    let mut losses = Vec::with_capacity(spec.steps);
    for step in 0..spec.steps.min(plan.len()) {
        let batch = plan.batch(step).expect("a step within the epoch");
        let rows = batch.rows(first_row, local_rows)?;
        let x = train.read_images(rows)?;
        let features = x.n_elements() / local_rows;
        let x = x.reshape(&[local_rows, features])?;
        let labels = train.read_labels(rows)?;
        let (loss, grads) = forward_backward(spec, place, &shards, &x, &labels)?;
        losses.push(loss);
        optimizer.begin_step();
        for (k, (shard, grad)) in shards.iter_mut().zip(&grads).enumerate() {
            optimizer.update(k, shard, grad)?;
        }
    }
    Ok((losses, boxes.into_iter().zip(shards).collect()))
}

/// The global batch's mean loss and this rank's weight gradients (already summed over `dp`).
fn forward_backward(
    spec: &HybridMlp,
    place: &mut HybridRank,
    w: &[Tensor],
    x: &Tensor,
    labels: &Tensor,
) -> Result<(f32, Vec<Tensor>), RuntimeError> {
    // Forward: h1 holds this rank's columns; h2's partial sums are completed over `mp`.
    let a1 = kernels::matmul(x, &w[0], false, false)?;
    let h1 = kernels::unary(UnaryOp::Relu, &a1)?;
    let mut a2 = kernels::matmul(&h1, &w[1], false, false)?;
    place
        .axis_group(&["mp"])?
        .all_reduce(&mut a2, ReduceOp::Sum)?;
    let h2 = kernels::unary(UnaryOp::Relu, &a2)?;
    let logits = kernels::matmul(&h2, &w[2], false, false)?;
    // The mean over the local rows, weighted to the global batch's mean.
    let share = (x.shape()[0] as f32) / (spec.batch_size as f32);
    let mut loss = kernels::sparse_softmax_cross_entropy(&logits, labels)?;
    loss.as_f32_mut()?[0] *= share;
    place
        .axis_group(&["dp"])?
        .all_reduce(&mut loss, ReduceOp::Sum)?;
    // Backward: every rank of an `mp` group holds the same dh2, so W1 and W2's gradients
    // need no communication over `mp`.
    let dlogits =
        kernels::sparse_softmax_cross_entropy_grad(&logits, labels, &Tensor::scalar(share))?;
    let mut dw3 = kernels::matmul(&h2, &dlogits, true, false)?;
    let dh2 = kernels::matmul(&dlogits, &w[2], false, true)?;
    let da2 = kernels::unary_grad(UnaryOp::Relu, &a2, &dh2)?;
    let mut dw2 = kernels::matmul(&h1, &da2, true, false)?;
    let dh1 = kernels::matmul(&da2, &w[1], false, true)?;
    let da1 = kernels::unary_grad(UnaryOp::Relu, &a1, &dh1)?;
    let mut dw1 = kernels::matmul(x, &da1, true, false)?;
    let dp = place.axis_group(&["dp"])?;
    for g in [&mut dw1, &mut dw2, &mut dw3] {
        dp.all_reduce(g, ReduceOp::Sum)?;
    }
    Ok((loss.as_f32()?[0], vec![dw1, dw2, dw3]))
}

/// The bundled digits, from the repository root or from this crate's directory.
fn digits() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.join("../../data/digits")
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = HybridMlp {
        data_dir: digits(),
        dp: 2,
        mp: 2,
        hidden: 128,
        batch_size: 32,
        steps: 40,
        learning_rate: 0.02,
        momentum: 0.9,
        seed: 3,
    };
    let run = train_hybrid_mlp(&spec)?;
    for (step, loss) in run.losses.iter().enumerate() {
        println!("step {}: loss {loss:.6}", step + 1);
    }
    for (name, w) in &run.weights {
        println!("{name}: {:?}", w.shape());
    }
    Ok(())
}
