//! Data sets of any number of columns (MindSpore's columns fed positionally to
//! `construct(c1, ..., ck)`): each graph input is fed its own column ([`Trainer::columns`],
//! `TrainSession::with_columns`), sharded exactly as on one device, and an input bound to no
//! column — which was fed the data input's column without a word — is refused naming it.

use graph::models::Model;
use graph::nn::{Activation, Dense};
use graph::{GraphBuilder, ValueId};
use parallel::{ParallelConfig, ParallelMode};
use runtime::{Dataset, RuntimeError, SampleSpec, TrainReport, Trainer};
use tensor::{DType, Tensor};

/// Samples per batch.
const BATCH: usize = 8;
/// Features per sample (the data and the mask have the same shape).
const FEATURES: usize = 6;
/// Classes.
const CLASSES: usize = 3;

/// A value in [0, 1) from a fixed hash of `(salt, i)`.
fn hash(salt: u64, i: usize) -> f32 {
    let mut x = (i as u64 + 1) ^ salt;
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    (x % 1000) as f32 / 1000.0
}

/// Three columns: `x` and `mask` (f32 `[FEATURES]` each; the mask of 0s and 1s, or all 1s) and
/// `y` (i32 class).
#[derive(Debug)]
struct Masked {
    x: Vec<f32>,
    mask: Vec<f32>,
    y: Vec<i32>,
}

impl Masked {
    fn new(n: usize, ones: bool) -> Masked {
        let x = (0..n * FEATURES).map(|i| hash(3, i) * 2.0 - 1.0).collect();
        let mask = (0..n * FEATURES)
            .map(|i| if ones || hash(5, i) < 0.7 { 1.0 } else { 0.0 })
            .collect();
        let y = (0..n)
            .map(|i| (hash(7, i) * CLASSES as f32) as i32)
            .collect();
        Masked { x, mask, y }
    }

    fn rows(data: &[f32], indices: &[usize]) -> Result<Tensor, RuntimeError> {
        let values = indices
            .iter()
            .flat_map(|&i| data[i * FEATURES..(i + 1) * FEATURES].iter().copied())
            .collect();
        Ok(Tensor::from_vec(&[indices.len(), FEATURES], values)?)
    }
}

impl Dataset for Masked {
    fn len(&self) -> usize {
        self.y.len()
    }

    fn input_spec(&self) -> SampleSpec {
        SampleSpec {
            shape: vec![FEATURES],
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
        Masked::rows(&self.x, indices)
    }

    fn read_labels(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        let values = indices.iter().map(|&i| self.y[i]).collect();
        Ok(Tensor::from_vec(&[indices.len()], values)?)
    }

    fn columns(&self) -> usize {
        3
    }

    fn column_spec(&self, column: usize) -> Option<SampleSpec> {
        match column {
            0 | 1 => Some(self.input_spec()),
            2 => Some(self.label_spec()),
            _ => None,
        }
    }

    fn read_column(&self, column: usize, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        match column {
            0 => self.read_inputs(indices),
            1 => Masked::rows(&self.mask, indices),
            _ => self.read_labels(indices),
        }
    }
}

/// `x · mask` → fc1 (Dense, ReLU) → fc2 → cross entropy, and the graph values of its columns
/// `[x, mask, y]`; without `masked`, `x` → fc1 → … and the columns `[x, y]`.
fn model(masked: bool) -> (Model, Vec<ValueId>) {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[BATCH, FEATURES], DType::F32).unwrap();
    let mut columns = vec![x];
    let mut h = x;
    if masked {
        let mask = b.input("mask", &[BATCH, FEATURES], DType::F32).unwrap();
        columns.push(mask);
        h = b.mul("masking", x, mask).unwrap();
    }
    let labels = b.input("labels", &[BATCH], DType::I32).unwrap();
    columns.push(labels);
    let h = b
        .call(
            "fc1",
            &Dense::new(FEATURES, 16).activation(Activation::Relu),
            h,
        )
        .unwrap();
    let logits = b.call("fc2", &Dense::new(16, CLASSES), h).unwrap();
    let loss = b
        .sparse_softmax_cross_entropy("loss", logits, labels)
        .unwrap();
    let model = Model {
        graph: b.finish(),
        input: x,
        labels,
        logits,
        loss,
    };
    (model, columns)
}

/// The data and label columns of a [`Masked`] only (the default two columns).
#[derive(Debug)]
struct TwoColumns(Masked);
impl Dataset for TwoColumns {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn input_spec(&self) -> SampleSpec {
        self.0.input_spec()
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

fn bits(report: &TrainReport) -> Vec<u32> {
    report.losses().iter().map(|l| l.to_bits()).collect()
}

/// Two deterministic epochs of the masked model on `data` under `parallel`, its columns bound.
fn train(parallel: ParallelConfig, data: Masked, out: &std::path::Path) -> TrainReport {
    let (model, columns) = model(true);
    Trainer::with_dataset(model, parallel, data)
        .columns(columns)
        .epochs(2)
        .deterministic(true)
        .print_loss(false)
        .output_dir(out)
        .train()
        .unwrap()
}

#[test]
fn each_input_takes_its_own_column_sharded_exactly_as_on_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let one = train(
        ParallelConfig::stand_alone(),
        Masked::new(64, false),
        &tmp.path().join("one"),
    );
    assert_eq!(one.losses().len(), 16, "2 epochs of 64 / 8");
    let four = ParallelConfig::new(ParallelMode::SemiAuto, 4)
        .shard("masking", &[&[2, 2], &[2, 2]])
        .shard("fc1.matmul", &[&[2, 2], &[1, 2]]);
    let sharded = train(four, Masked::new(64, false), &tmp.path().join("four"));
    assert_eq!(bits(&sharded), bits(&one), "4 devices are one device");
    let data_parallel = ParallelConfig::new(ParallelMode::DataParallel, 2);
    let two = train(
        data_parallel,
        Masked::new(64, false),
        &tmp.path().join("dp"),
    );
    assert_eq!(
        bits(&two),
        bits(&one),
        "2 data-parallel devices are one device"
    );

    // A mask of ones trains exactly as the network without it on the (x, y) columns: the mask
    // column reached the mask input (and x and y theirs).
    let ones = train(
        ParallelConfig::stand_alone(),
        Masked::new(64, true),
        &tmp.path().join("ones"),
    );
    let (plain, _) = model(false);
    let unmasked = Trainer::with_dataset(
        plain,
        ParallelConfig::stand_alone(),
        TwoColumns(Masked::new(64, false)),
    )
    .epochs(2)
    .deterministic(true)
    .print_loss(false)
    .output_dir(tmp.path().join("plain"))
    .train()
    .unwrap();
    assert_eq!(bits(&ones), bits(&unmasked));
    assert_ne!(bits(&one), bits(&ones), "the mask changes the run");
}

fn refused(columns: Option<Vec<ValueId>>) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let (model, _) = model(true);
    let data = Masked::new(32, false);
    let trainer = match columns {
        Some(columns) => {
            Trainer::with_dataset(model, ParallelConfig::stand_alone(), data).columns(columns)
        }
        None => Trainer::with_dataset(model, ParallelConfig::stand_alone(), TwoColumns(data)),
    };
    trainer
        .print_loss(false)
        .output_dir(tmp.path())
        .train()
        .unwrap_err()
        .to_string()
}

#[test]
fn an_input_bound_to_no_column_or_to_several_is_refused_naming_it() {
    // The default binding is (data input, labels): the mask input was fed the data input's
    // column (same shape) and trained on x·x without a word.
    let err = refused(None);
    assert!(
        err.contains("the graph input mask") && err.contains("none"),
        "{err}"
    );
    let (_, c) = model(true);
    let err = refused(Some(vec![c[0], c[2]]));
    assert!(err.contains("one per column"), "{err}");
    let err = refused(Some(vec![c[0], c[0], c[2]]));
    assert!(
        err.contains("the graph input x") && err.contains("columns 0 and 1"),
        "{err}"
    );
    let err = refused(Some(vec![c[0], c[2], c[1]]));
    assert!(
        err.contains("the graph input labels (column 1") && err.contains("dtype"),
        "{err}"
    );
    let err = refused(Some(vec![c[0], c[1], ValueId(c[2].0 + 1)]));
    assert!(err.contains("not a graph input"), "{err}");
}
