//! Built-in models.

use tensor::DType;

use crate::builder::GraphBuilder;
use crate::error::GraphError;
use crate::init::{FanMode, Initializer};
use crate::ir::{Graph, ValueId};

/// A built model: its forward graph and the values a training loop feeds and reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// The forward graph; its outputs are the loss and the logits.
    pub graph: Graph,
    /// The data input.
    pub input: ValueId,
    /// The integer labels input.
    pub labels: ValueId,
    /// The logits.
    pub logits: ValueId,
    /// The scalar loss.
    pub loss: ValueId,
}

/// The seed MLP: `flatten` → `matmul1` (`fc1_weight [in, hidden]`) → `relu1` → `matmul2`
/// (`fc2_weight [hidden, hidden]`) → `relu2` → `matmul3` (`fc3_weight [hidden, classes]`) →
/// `loss` (SparseSoftmaxCrossEntropy, mean over the batch), with plain MatMuls (no transposes,
/// no biases).
///
/// Inputs: `x [batch, input_shape...]` (f32; e.g. `[N, 8, 8]` images, flattened to `[N, 64]`)
/// and `labels [batch]` (i32). Weights are initialised `HeUniform` scaled by their true fan-in
/// (`in`, MindSpore's `fan_out` mode on an `[in, out]` weight).
pub fn seed_mlp(
    batch: usize,
    input_shape: &[usize],
    hidden: usize,
    classes: usize,
) -> Result<Model, GraphError> {
    seed_mlp_with_dtype(batch, input_shape, hidden, classes, DType::F32)
}

/// [`seed_mlp`] with parameters and input of another float dtype (f64 for gradient checks).
pub fn seed_mlp_with_dtype(
    batch: usize,
    input_shape: &[usize],
    hidden: usize,
    classes: usize,
    dtype: DType,
) -> Result<Model, GraphError> {
    let mut b = GraphBuilder::with_float_dtype(dtype);
    let mut x_shape = vec![batch];
    x_shape.extend_from_slice(input_shape);
    let in_features: usize = input_shape.iter().product();
    let init = Initializer::HeUniform {
        negative_slope: 0.0,
        mode: FanMode::FanOut,
    };
    let x = b.input("x", &x_shape, dtype)?;
    let labels = b.input("labels", &[batch], DType::I32)?;
    let w1 = b.parameter("fc1_weight", &[in_features, hidden], init.clone())?;
    let w2 = b.parameter("fc2_weight", &[hidden, hidden], init.clone())?;
    let w3 = b.parameter("fc3_weight", &[hidden, classes], init)?;
    let h = b.flatten("flatten", x)?;
    let h = b.matmul("matmul1", h, w1)?;
    let h = b.relu("relu1", h)?;
    let h = b.matmul("matmul2", h, w2)?;
    let h = b.relu("relu2", h)?;
    let logits = b.matmul("matmul3", h, w3)?;
    let loss = b.sparse_softmax_cross_entropy("loss", logits, labels)?;
    b.output(loss)?;
    b.output(logits)?;
    Ok(Model {
        graph: b.finish(),
        input: x,
        labels,
        logits,
        loss,
    })
}
