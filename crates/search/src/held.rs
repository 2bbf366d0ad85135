//! Which forward values a training step holds until its backward pass: the ones the backward
//! reads. The others die as soon as the forward has read them, so the search's memory
//! estimate counts only these. A step's activations peak where the forward ends and the
//! backward starts: every held value is live, and the backward writes its first values, the
//! gradients of the loss op's inputs (for a language model the logits' gradient, as large as
//! the logits), which the estimate counts too.

use graph::{Graph, NodeRole, ValueId, ValueKind};

/// Per value of a graph, whether the backward pass reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldValues {
    held: Vec<bool>,
    /// Whether the value's gradient is written at the peak: an input of the loss op.
    first_gradients: Vec<bool>,
    /// Whether the backward computes the value's gradient: a floating-point value that depends
    /// on a trainable parameter (autodiff builds no gradient for the others: the data, the
    /// values computed from it alone, what a `StopGradient` cuts off).
    gradients: Vec<bool>,
}

impl HeldValues {
    /// The values of `graph` its backward reads. A graph that already holds backward nodes is
    /// read as it is; a forward graph is differentiated with respect to its trainable
    /// parameters, its loss being its first output that is a floating-point scalar. A graph
    /// with neither (nothing to train) holds every value, as does one that cannot be
    /// differentiated: the estimate then counts every output, never fewer bytes than a step
    /// holds.
    pub fn of(graph: &Graph) -> HeldValues {
        let n = graph.values().len();
        let all = || HeldValues {
            held: vec![true; n],
            first_gradients: vec![false; n],
            gradients: vec![true; n],
        };
        let Some(loss) = graph.outputs().iter().copied().find(|&v| {
            let value = &graph.values()[v.0];
            value.shape.is_empty() && value.dtype.is_float()
        }) else {
            return all();
        };
        let mut first_gradients = vec![false; n];
        if let Some(node) = graph.producer(loss) {
            for &v in &graph.nodes()[node.0].inputs {
                let value = &graph.values()[v.0];
                first_gradients[v.0] =
                    value.kind == graph::ValueKind::Intermediate && value.dtype.is_float();
            }
        }
        let held = if graph.nodes().iter().any(|n| n.role != NodeRole::Forward) {
            read_by_backward(graph, n)
        } else {
            let params = graph.trainable_parameters();
            if params.is_empty() {
                return all();
            }
            match graph::grad(graph, loss, &params) {
                Ok(training) => read_by_backward(&training.graph, n),
                Err(_) => return all(),
            }
        };
        HeldValues {
            held,
            first_gradients,
            gradients: with_gradient(graph),
        }
    }

    /// Whether the backward pass computes `value`'s gradient (a value the analysis did not see
    /// counts as having one). An op's input without one costs no gradient communication: no
    /// pending sum of it, no redistribution of it back to its producer.
    pub fn has_gradient(&self, value: ValueId) -> bool {
        self.gradients.get(value.0).copied().unwrap_or(true)
    }

    /// Whether the backward reads `value` (a value the analysis did not see counts as held).
    pub fn is_held(&self, value: ValueId) -> bool {
        self.held.get(value.0).copied().unwrap_or(true)
    }

    /// Whether `value`'s gradient is among the backward's first values, written while every
    /// held value is live: an input of the op that computes the loss.
    pub fn gradient_written_at_peak(&self, value: ValueId) -> bool {
        self.first_gradients.get(value.0).copied().unwrap_or(false)
    }
}

/// Per value of `graph`, whether autodiff gives it a gradient: floating-point values that
/// depend on a trainable parameter (`graph::depends_on`, the rule `graph::grad` follows).
fn with_gradient(graph: &Graph) -> Vec<bool> {
    let trainable: Vec<ValueId> = (0..graph.values().len())
        .map(ValueId)
        .filter(|v| {
            let value = &graph.values()[v.0];
            matches!(
                value.kind,
                ValueKind::Parameter {
                    trainable: true,
                    ..
                }
            ) && value.dtype.is_float()
        })
        .collect();
    graph::depends_on(graph, &trainable)
}

/// Per value among the first `n` of `training` (the forward graph's, which keep their ids),
/// whether a node other than a forward one reads it.
fn read_by_backward(training: &Graph, n: usize) -> Vec<bool> {
    let mut held = vec![false; n];
    for node in training.nodes() {
        if node.role == NodeRole::Forward {
            continue;
        }
        for &v in &node.inputs {
            if let Some(h) = held.get_mut(v.0) {
                *h = true;
            }
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed MLP: the flattened input (read by the first product's gradient), the ReLUs'
    /// outputs (their gradients and the next products' read them) and the logits (the cross
    /// entropy's gradient) are held; the products that feed a ReLU are not (its gradient reads
    /// its output), nor the loss (the backward starts from a seed). The logits' gradient is the
    /// backward's first value.
    #[test]
    fn the_backward_holds_what_its_rules_read() {
        let model = graph::models::seed_mlp(8, &[4, 4], 8, 4).unwrap();
        let graph = &model.graph;
        let held = HeldValues::of(graph);
        let output = |node: &str| {
            let n = graph.nodes().iter().find(|n| n.name == node).unwrap();
            n.outputs[0]
        };
        for (node, want) in [
            ("flatten", true),
            ("matmul1", false),
            ("relu1", true),
            ("matmul2", false),
            ("relu2", true),
            ("matmul3", true),
            ("loss", false),
        ] {
            assert_eq!(held.is_held(output(node)), want, "{node}");
        }
        assert!(held.gradient_written_at_peak(model.logits));
        assert!(!held.gradient_written_at_peak(model.labels));
        assert!(!held.gradient_written_at_peak(output("relu2")));
        // A graph with its backward already appended reads the same.
        let training = graph::grad(graph, model.loss, &graph.trainable_parameters()).unwrap();
        let again = HeldValues::of(&training.graph);
        for v in 0..graph.values().len() {
            assert_eq!(again.is_held(ValueId(v)), held.is_held(ValueId(v)));
        }
    }

    /// An add's gradient passes its output gradient through and a sum's needs only its
    /// input's shape, so values only they read are not held; a product's input is.
    #[test]
    fn values_only_forward_ops_read_are_not_held() {
        use graph::{GraphBuilder, Initializer, Op};
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[2, 3], tensor::DType::F32).unwrap();
        let w = b.parameter("w", &[3, 3], Initializer::Ones).unwrap();
        let y = b.matmul("mm", x, w).unwrap();
        let z = b.node("add", Op::Add, &[y, y]).unwrap()[0];
        let sum = Op::ReduceSum {
            axes: vec![],
            keep_dims: false,
        };
        let loss = b.node("loss", sum, &[z]).unwrap()[0];
        b.output(loss).unwrap();
        let graph = b.finish();
        let held = HeldValues::of(&graph);
        assert!(
            !held.is_held(y),
            "the product's output: only the add reads it"
        );
        assert!(
            !held.is_held(z),
            "the add's output: the sum's gradient needs only its shape"
        );
        assert!(held.is_held(x), "the weight's gradient reads the input");
        assert!(held.gradient_written_at_peak(z));
        assert!(!held.gradient_written_at_peak(y));
    }
}
