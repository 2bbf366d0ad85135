//! Softmax cross entropy built from primitive ops, so that its logits may stay split on the class
//! dim (MindFormers' vocabulary-parallel cross entropy).
//!
//! [`GraphBuilder::vocab_parallel_cross_entropy`] computes exactly
//! [`Op::SparseSoftmaxCrossEntropy`]'s value,
//! `Σ_rows (log Σ_c exp(x − m) − Σ_c onehot·(x − m)) / batch_divisor` with
//! `m = StopGradient(ReduceMax(x))` per row (the `+ m` and `− m` of the textbook form cancel).
//! Every reduction over the classes is a `ReduceMax` or `ReduceSum` to `[n, 1]`: with the logits
//! split on the class dim, each is a pending max or sum of an `[n, 1]` tensor, resolved by an
//! all-reduce of that size, and nothing gathers the logits. [`vocab_parallel_cross_entropy_strategies`]
//! gives the strategies that keep them split.

use crate::builder::GraphBuilder;
use crate::error::GraphError;
use crate::ir::ValueId;

/// The nodes of the composite, by name in its scope, and whether each node's inputs are
/// logits-shaped (`[n, c]`, split `dp × mp`) or row-shaped (`[n, 1]` or `[n]`, split `dp`).
const NODES: [(&str, &[Shape]); 12] = [
    ("max", &[Shape::Logits]),
    ("shift", &[Shape::Rows]),
    ("shifted", &[Shape::Logits, Shape::Rows]),
    ("exp", &[Shape::Logits]),
    ("sum_exp", &[Shape::Logits]),
    ("log_sum_exp", &[Shape::Rows]),
    ("one_hot", &[Shape::Logits]),
    ("pick", &[Shape::Logits, Shape::Logits]),
    ("target", &[Shape::Logits]),
    ("row_loss", &[Shape::Rows, Shape::Rows]),
    ("total", &[Shape::Rows]),
    ("loss", &[Shape::Scalar, Shape::Scalar]),
];

/// The kind of an operand of the composite's nodes (a one-hot's strategy is its output's,
/// logits-shaped).
#[derive(Debug, Clone, Copy)]
enum Shape {
    Logits,
    Rows,
    Scalar,
}

impl GraphBuilder {
    /// Softmax cross entropy of `logits [n, c]` against integer `labels [n]`, summed over rows
    /// and divided by `batch_divisor` (the GLOBAL batch size), as named nodes in scope `name`:
    /// the value and gradient of [`Op::SparseSoftmaxCrossEntropy`], from ops that may keep the
    /// logits split on the class dim (see the module doc). Returns the scalar loss
    /// (`name.loss`).
    ///
    /// [`Op::SparseSoftmaxCrossEntropy`]: crate::Op::SparseSoftmaxCrossEntropy
    pub fn vocab_parallel_cross_entropy(
        &mut self,
        name: &str,
        logits: ValueId,
        labels: ValueId,
        batch_divisor: usize,
    ) -> Result<ValueId, GraphError> {
        let logits_value = self.value(logits)?;
        let classes = match logits_value.shape.as_slice() {
            [_, c] => *c,
            shape => {
                return Err(GraphError::InputRank {
                    node: name.to_string(),
                    op: "vocab_parallel_cross_entropy",
                    value: logits_value.name.clone(),
                    shape: shape.to_vec(),
                    expected: "2-D logits [batch, classes]",
                })
            }
        };
        if batch_divisor == 0 {
            return Err(GraphError::Attribute {
                node: name.to_string(),
                attribute: "batch_divisor",
                reason: "must be at least 1".to_string(),
            });
        }
        // The composite's constants (the one-hot, the divisor) take the logits' dtype, not the
        // builder's: under mixed precision the logits are cast to f32 for the loss.
        let dtype = logits_value.dtype;
        let outer = std::mem::replace(&mut self.float_dtype, dtype);
        let loss = self.scope(name, |b| {
            let max = b.reduce_max(NODES[0].0, logits, &[1], true)?;
            let m = b.stop_gradient(NODES[1].0, max)?;
            let shifted = b.sub(NODES[2].0, logits, m)?;
            let exp = b.exp(NODES[3].0, shifted)?;
            let sum_exp = b.reduce_sum(NODES[4].0, exp, &[1], true)?;
            let lse = b.log(NODES[5].0, sum_exp)?;
            let one_hot = b.one_hot(NODES[6].0, labels, classes)?;
            let picked = b.mul(NODES[7].0, one_hot, shifted)?;
            let target = b.reduce_sum(NODES[8].0, picked, &[1], true)?;
            let row_loss = b.sub(NODES[9].0, lse, target)?;
            let total = b.reduce_sum(NODES[10].0, row_loss, &[], false)?;
            let divisor = b.fill("divisor", &[], batch_divisor as f64)?;
            b.div(NODES[11].0, total, divisor)
        });
        self.float_dtype = outer;
        loss
    }
}

/// Strategies (by full node name) for the nodes of the composite built in scope `scope` that
/// keep its logits split `dp` ways on rows and `mp` ways on classes, so that only `[n, 1]`
/// tensors are reduced across ranks.
pub fn vocab_parallel_cross_entropy_strategies(
    scope: &str,
    dp: usize,
    mp: usize,
) -> Vec<(String, Vec<Vec<usize>>)> {
    NODES
        .iter()
        .map(|(node, inputs)| {
            let strategy = inputs
                .iter()
                .map(|shape| match shape {
                    Shape::Logits => vec![dp, mp],
                    Shape::Rows => vec![dp, 1],
                    Shape::Scalar => Vec::new(),
                })
                .collect();
            let name = if scope.is_empty() {
                node.to_string()
            } else {
                format!("{scope}.{node}")
            };
            (name, strategy)
        })
        .collect()
}
