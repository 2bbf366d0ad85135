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

/// An MLP like [`seed_mlp`] traced from cells, its ops named as a cell of one's own names them,
/// inside the cell `within` (`"net"`: all in the engine's pipeline layer `net`, as a loss cell
/// of one's own traces them; `""`: each cell a layer of its own): `flatten`, `Dense` cells `fc1`
/// (`in → hidden`), `fc2` (`hidden → hidden`) and `fc3` (`hidden → classes`, no activation),
/// then `loss` (SparseSoftmaxCrossEntropy), so `net.flatten`, `net.fc1.matmul`, … `fc1` and
/// `fc2` apply their own ReLU, or, with `shared_act`, are each followed by a call of one
/// activation cell `act` (ops `act.relu` and `act.relu_1`, as the Python front end names a
/// cell's second call). The graphs of pipelines whose `stage_config` names cells below a layer,
/// or that cut between a cell's calls.
pub fn nested_mlp(
    batch: usize,
    input_shape: &[usize],
    hidden: usize,
    classes: usize,
    shared_act: bool,
    within: &str,
) -> Result<Model, GraphError> {
    use crate::nn::{Activation, Dense};
    let name = |cell: &str| match within {
        "" => cell.to_string(),
        _ => format!("{within}.{cell}"),
    };
    let mut b = GraphBuilder::new();
    let mut x_shape = vec![batch];
    x_shape.extend_from_slice(input_shape);
    let x = b.input("x", &x_shape, DType::F32)?;
    let labels = b.input("labels", &[batch], DType::I32)?;
    let dense = |inputs: usize| match shared_act {
        true => Dense::new(inputs, hidden),
        false => Dense::new(inputs, hidden).activation(Activation::Relu),
    };
    let act = |b: &mut GraphBuilder, h, op: &str| match shared_act {
        true => b.relu(op, h),
        false => Ok(h),
    };
    let h = b.flatten(&name("flatten"), x)?;
    let h = b.call(&name("fc1"), &dense(input_shape.iter().product()), h)?;
    let h = act(&mut b, h, &name("act.relu"))?;
    let h = b.call(&name("fc2"), &dense(hidden), h)?;
    let h = act(&mut b, h, &name("act.relu_1"))?;
    let logits = b.call(&name("fc3"), &Dense::new(hidden, classes), h)?;
    classifier(b, &name("loss"), (x, labels), logits)
}

/// The model of `b`'s graph ending in `logits`: their sparse softmax cross entropy against
/// `labels` as op `loss_name`, the graph's outputs the loss, then the logits.
fn classifier(
    mut b: GraphBuilder,
    loss_name: &str,
    (input, labels): (ValueId, ValueId),
    logits: ValueId,
) -> Result<Model, GraphError> {
    let loss = b.sparse_softmax_cross_entropy(loss_name, logits, labels)?;
    b.output(loss)?;
    b.output(logits)?;
    Ok(Model {
        graph: b.finish(),
        input,
        labels,
        logits,
        loss,
    })
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
    classifier(b, "loss", (x, labels), logits)
}
