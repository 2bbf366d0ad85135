//! [`GraphBuilder`]: building a graph op by op, with scoped hierarchical names and shape
//! inference at every step.

use tensor::DType;

use crate::error::GraphError;
use crate::infer::infer;
use crate::init::Initializer;
use crate::ir::{Graph, NameRef, Node, NodeId, NodeRole, Use, Value, ValueId, ValueKind};
use crate::nn::Cell;
use crate::op::Op;

/// Builds a [`Graph`]. Every op method checks its inputs' shapes and dtypes at once and returns
/// the id of the new value, or the error naming the node and the rule broken.
///
/// Names are scoped as MindSpore names a cell's members: inside `b.scope("layer2", …)` the node
/// `matmul` is `layer2.matmul` and the parameter `weight` is `layer2.weight`. Names must be unique
/// in the graph.
#[derive(Debug, Clone)]
pub struct GraphBuilder {
    graph: Graph,
    scope: String,
    pub(crate) float_dtype: DType,
}

impl Default for GraphBuilder {
    fn default() -> Self {
        GraphBuilder::new()
    }
}

/// Declares builder methods for ops with one input and no attribute.
macro_rules! unary_methods {
    ($($(#[$doc:meta])* $method:ident => $op:expr;)*) => {$(
        $(#[$doc])*
        pub fn $method(&mut self, name: &str, x: ValueId) -> Result<ValueId, GraphError> {
            self.op1(name, $op, &[x])
        }
    )*};
}

/// Declares builder methods for ops with two inputs and no attribute.
macro_rules! binary_methods {
    ($($(#[$doc:meta])* $method:ident => $op:expr;)*) => {$(
        $(#[$doc])*
        pub fn $method(&mut self, name: &str, a: ValueId, b: ValueId) -> Result<ValueId, GraphError> {
            self.op1(name, $op, &[a, b])
        }
    )*};
}

/// Declares builder methods for reductions over axes (ops with `axes` and `keep_dims`).
macro_rules! reduce_methods {
    ($($(#[$doc:meta])* $method:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        pub fn $method(
            &mut self,
            name: &str,
            x: ValueId,
            axes: &[usize],
            keep_dims: bool,
        ) -> Result<ValueId, GraphError> {
            let axes = axes.to_vec();
            self.op1(name, Op::$op { axes, keep_dims }, &[x])
        }
    )*};
}

impl GraphBuilder {
    /// A builder whose parameters are f32.
    pub fn new() -> GraphBuilder {
        GraphBuilder::with_float_dtype(DType::F32)
    }

    /// A builder whose parameters (and the blocks' parameters) have `dtype`, e.g. f64 for
    /// gradient checks.
    pub fn with_float_dtype(dtype: DType) -> GraphBuilder {
        GraphBuilder {
            graph: Graph::default(),
            scope: String::new(),
            float_dtype: dtype,
        }
    }

    /// A builder that continues `graph` (its ids stay valid).
    pub fn extend(graph: Graph) -> GraphBuilder {
        let float_dtype = graph
            .values
            .iter()
            .find(|v| v.dtype.is_float())
            .map_or(DType::F32, |v| v.dtype);
        GraphBuilder {
            graph,
            scope: String::new(),
            float_dtype,
        }
    }

    /// The dtype of new parameters.
    pub fn float_dtype(&self) -> DType {
        self.float_dtype
    }

    /// The graph built so far.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The value `id` built so far.
    pub fn value(&self, id: ValueId) -> Result<&Value, GraphError> {
        self.graph.value(id)
    }

    /// The shape of value `id`.
    pub fn shape(&self, id: ValueId) -> Result<&[usize], GraphError> {
        Ok(&self.graph.value(id)?.shape)
    }

    /// Runs `build` with names prefixed by `name.` (scopes nest: `encoder.layer0.matmul`).
    pub fn scope<T>(
        &mut self,
        name: &str,
        build: impl FnOnce(&mut GraphBuilder) -> Result<T, GraphError>,
    ) -> Result<T, GraphError> {
        let full = self.full_name(name)?;
        let outer = std::mem::replace(&mut self.scope, full);
        let result = build(self);
        self.scope = outer;
        result
    }

    /// Builds `cell` on `x` in scope `name` (MindSpore's `self.name(x)` for a cell attribute
    /// `name`): `b.call("fc1", &nn::Dense::new(784, 512), x)`.
    pub fn call(&mut self, name: &str, cell: &dyn Cell, x: ValueId) -> Result<ValueId, GraphError> {
        self.scope(name, |b| cell.build(b, x))
    }

    /// Marks `value` as an output of the graph.
    pub fn output(&mut self, value: ValueId) -> Result<(), GraphError> {
        self.graph.value(value)?;
        if !self.graph.outputs.contains(&value) {
            self.graph.outputs.push(value);
        }
        Ok(())
    }

    /// Forgets the declared outputs (a training graph declares its own).
    pub(crate) fn clear_outputs(&mut self) {
        self.graph.outputs.clear();
    }

    /// The finished graph.
    pub fn finish(self) -> Graph {
        self.graph
    }

    /// A value fed at every step, named `name` in the current scope.
    pub fn input(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: DType,
    ) -> Result<ValueId, GraphError> {
        let full = self.full_name(name)?;
        self.leaf(full, shape, dtype, ValueKind::Input)
    }

    /// A trainable parameter of the builder's float dtype, initialised by `init`.
    pub fn parameter(
        &mut self,
        name: &str,
        shape: &[usize],
        init: Initializer,
    ) -> Result<ValueId, GraphError> {
        self.parameter_with(name, shape, self.float_dtype, init, true)
    }

    /// A parameter of any dtype, trainable or frozen.
    pub fn parameter_with(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        init: Initializer,
        trainable: bool,
    ) -> Result<ValueId, GraphError> {
        let full = self.full_name(name)?;
        init.validate(&full, shape, dtype)?;
        self.leaf(full, shape, dtype, ValueKind::Parameter { init, trainable })
    }

    fn leaf(
        &mut self,
        full: String,
        shape: &[usize],
        dtype: DType,
        kind: ValueKind,
    ) -> Result<ValueId, GraphError> {
        let id = ValueId(self.graph.values.len());
        self.claim(&full, NameRef::Value(id))?;
        self.graph.values.push(Value {
            name: full,
            shape: shape.to_vec(),
            dtype,
            kind,
            producer: None,
        });
        self.graph.consumers.push(Vec::new());
        Ok(id)
    }

    /// Adds a node named `name` (in the current scope) applying `op` to `inputs`; returns its
    /// outputs. Every op method goes through here.
    pub fn node(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[ValueId],
    ) -> Result<Vec<ValueId>, GraphError> {
        self.node_with_role(name, op, inputs, NodeRole::Forward)
    }

    /// [`GraphBuilder::node`] with an explicit role, for passes that rebuild a training graph
    /// and keep each backward node's [`crate::GradOf`].
    pub fn node_with_role(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[ValueId],
        role: NodeRole,
    ) -> Result<Vec<ValueId>, GraphError> {
        let full = self.full_name(name)?;
        self.add_node(full, op, inputs, role)
    }

    /// Adds a node with a full (unscoped) name and a role.
    pub(crate) fn add_node(
        &mut self,
        full: String,
        op: Op,
        inputs: &[ValueId],
        role: NodeRole,
    ) -> Result<Vec<ValueId>, GraphError> {
        let n_values = self.graph.values.len();
        if let Some(bad) = inputs.iter().find(|v| v.0 >= n_values) {
            return Err(GraphError::UnknownValue {
                context: full,
                id: bad.0,
                n_values,
            });
        }
        let types = {
            let values: Vec<&Value> = inputs.iter().map(|v| &self.graph.values[v.0]).collect();
            infer(&full, &op, &values)?
        };
        let node_id = NodeId(self.graph.nodes.len());
        self.claim(&full, NameRef::Node(node_id))?;
        let mut outputs = Vec::with_capacity(types.len());
        for (k, (shape, dtype)) in types.into_iter().enumerate() {
            let id = ValueId(self.graph.values.len());
            let name = if k == 0 {
                full.clone()
            } else {
                format!("{full}:{k}")
            };
            self.graph.values.push(Value {
                name,
                shape,
                dtype,
                kind: ValueKind::Intermediate,
                producer: Some((node_id, k)),
            });
            self.graph.consumers.push(Vec::new());
            outputs.push(id);
        }
        for (input, v) in inputs.iter().enumerate() {
            self.graph.consumers[v.0].push(Use {
                node: node_id,
                input,
            });
        }
        self.graph.nodes.push(Node {
            name: full,
            op,
            inputs: inputs.to_vec(),
            outputs: outputs.clone(),
            role,
        });
        Ok(outputs)
    }

    /// Adds a single-output node and returns its output.
    fn op1(&mut self, name: &str, op: Op, inputs: &[ValueId]) -> Result<ValueId, GraphError> {
        Ok(self.node(name, op, inputs)?[0])
    }

    /// `name` in the current scope, checked.
    fn full_name(&self, name: &str) -> Result<String, GraphError> {
        let full = if self.scope.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.scope)
        };
        let reason = if name.is_empty() || name.split('.').any(str::is_empty) {
            Some("has an empty name part")
        } else if name.contains(':') {
            Some("contains `:`, which is reserved for output indices (`node:1`)")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(GraphError::BadName { name: full, reason }),
            None => Ok(full),
        }
    }

    fn claim(&mut self, full: &str, target: NameRef) -> Result<(), GraphError> {
        if self.graph.names.contains_key(full) {
            return Err(GraphError::BadName {
                name: full.to_string(),
                reason: "is already defined in this graph",
            });
        }
        self.graph.names.insert(full.to_string(), target);
        Ok(())
    }

    /// `a·b` of 2-D matrices.
    pub fn matmul(&mut self, name: &str, a: ValueId, b: ValueId) -> Result<ValueId, GraphError> {
        self.matmul_with(name, a, b, false, false)
    }

    /// `op(a)·op(b)` of 2-D matrices with transpose flags.
    pub fn matmul_with(
        &mut self,
        name: &str,
        a: ValueId,
        b: ValueId,
        transpose_a: bool,
        transpose_b: bool,
    ) -> Result<ValueId, GraphError> {
        let op = Op::MatMul {
            transpose_a,
            transpose_b,
        };
        self.op1(name, op, &[a, b])
    }

    /// Batched `op(a)·op(b)` with broadcasting batch dims.
    pub fn batch_matmul(
        &mut self,
        name: &str,
        a: ValueId,
        b: ValueId,
        transpose_a: bool,
        transpose_b: bool,
    ) -> Result<ValueId, GraphError> {
        let op = Op::BatchMatMul {
            transpose_a,
            transpose_b,
        };
        self.op1(name, op, &[a, b])
    }

    binary_methods! {
        /// `a + b`, broadcasting.
        add => Op::Add;
        /// `a - b`, broadcasting.
        sub => Op::Sub;
        /// `a · b` elementwise, broadcasting.
        mul => Op::Mul;
        /// `a / b` elementwise, broadcasting.
        div => Op::Div;
        /// `x + bias` over the last dim.
        bias_add => Op::BiasAdd;
        /// Rows of `table` picked by integer `ids`.
        embedding => Op::Embedding;
    }

    unary_methods! {
        /// `-x`.
        neg => Op::Neg;
        /// `max(x, 0)`.
        relu => Op::Relu;
        /// `tanh(x)`.
        tanh => Op::Tanh;
        /// The logistic sigmoid `1 / (1 + e^-x)`.
        sigmoid => Op::Sigmoid;
        /// Softmax over the last dim.
        softmax => Op::Softmax;
        /// Log-softmax over the last dim.
        log_softmax => Op::LogSoftmax;
        /// `e^x`.
        exp => Op::Exp;
        /// `ln x`.
        log => Op::Log;
        /// `√x`.
        sqrt => Op::Sqrt;
        /// `x`, through which no gradient flows.
        stop_gradient => Op::StopGradient;
    }

    /// MindSpore's `ops.Print`: `x`, printed with `label` each time the node runs
    /// ([`Op::Print`]).
    pub fn print(&mut self, name: &str, label: &str, x: ValueId) -> Result<ValueId, GraphError> {
        let op = Op::Print {
            label: label.to_string(),
        };
        self.node(name, op, &[x]).map(|out| out[0])
    }

    /// GeLU, the tanh approximation if `approximate`.
    pub fn gelu(
        &mut self,
        name: &str,
        x: ValueId,
        approximate: bool,
    ) -> Result<ValueId, GraphError> {
        self.op1(name, Op::Gelu { approximate }, &[x])
    }

    /// Layer norm of `x` over its last dim with scale `gamma` and shift `beta`; returns `y` (the
    /// node's other outputs are the saved `mean` and `rstd`).
    pub fn layer_norm(
        &mut self,
        name: &str,
        x: ValueId,
        gamma: ValueId,
        beta: ValueId,
        epsilon: f64,
    ) -> Result<ValueId, GraphError> {
        self.op1(name, Op::LayerNorm { epsilon }, &[x, gamma, beta])
    }

    /// `[n, ...]` → `[n, prod(...)]`.
    pub fn flatten(&mut self, name: &str, x: ValueId) -> Result<ValueId, GraphError> {
        let shape = self.shape(x)?;
        let target = match shape.split_first() {
            Some((&n, rest)) => vec![n, rest.iter().product()],
            None => Vec::new(), // rejected by shape inference, naming the node
        };
        self.op1(name, Op::Flatten { shape: target }, &[x])
    }

    /// The same elements with `shape`.
    pub fn reshape(
        &mut self,
        name: &str,
        x: ValueId,
        shape: &[usize],
    ) -> Result<ValueId, GraphError> {
        self.op1(
            name,
            Op::Reshape {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }

    /// Permutes the dims of `x`: output dim `i` is input dim `perm[i]`.
    pub fn transpose(
        &mut self,
        name: &str,
        x: ValueId,
        perm: &[usize],
    ) -> Result<ValueId, GraphError> {
        self.op1(
            name,
            Op::Transpose {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    /// `x` broadcast to `shape`.
    pub fn broadcast_to(
        &mut self,
        name: &str,
        x: ValueId,
        shape: &[usize],
    ) -> Result<ValueId, GraphError> {
        self.op1(
            name,
            Op::BroadcastTo {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }

    /// `x` summed down to `shape` (which broadcasts to `x`'s shape).
    pub fn sum_to_shape(
        &mut self,
        name: &str,
        x: ValueId,
        shape: &[usize],
    ) -> Result<ValueId, GraphError> {
        self.op1(
            name,
            Op::SumToShape {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }

    reduce_methods! {
        /// Sum over `axes` (all when empty).
        reduce_sum => ReduceSum;
        /// Maximum over `axes` (all when empty); not differentiable (see [`Op::ReduceMax`]).
        reduce_max => ReduceMax;
    }

    /// One-hot rows `[..., depth]` of the builder's float dtype for integer `labels [...]`.
    pub fn one_hot(
        &mut self,
        name: &str,
        labels: ValueId,
        depth: usize,
    ) -> Result<ValueId, GraphError> {
        let op = Op::OneHot {
            depth,
            dtype: self.float_dtype,
        };
        self.op1(name, op, &[labels])
    }

    /// A mixture of experts' router masks for `probs [G, T, E]` ([`Op::MoeRoute`]):
    /// `[dispatch [G, T, E, capacity], chosen [G, T, E], first [G, T, E]]`.
    pub fn moe_route(
        &mut self,
        name: &str,
        probs: ValueId,
        top_k: usize,
        capacity: usize,
    ) -> Result<[ValueId; 3], GraphError> {
        let outputs = self.node(name, Op::MoeRoute { top_k, capacity }, &[probs])?;
        Ok([outputs[0], outputs[1], outputs[2]])
    }

    /// Inverted dropout keeping elements with probability `keep_prob`.
    pub fn dropout(
        &mut self,
        name: &str,
        x: ValueId,
        keep_prob: f64,
        seed: u64,
    ) -> Result<ValueId, GraphError> {
        self.op1(name, Op::Dropout { keep_prob, seed }, &[x])
    }

    /// Mean softmax cross entropy of `logits [n, c]` against integer `labels [n]`, divided by
    /// the batch size `n` (the `batch_divisor` attribute).
    pub fn sparse_softmax_cross_entropy(
        &mut self,
        name: &str,
        logits: ValueId,
        labels: ValueId,
    ) -> Result<ValueId, GraphError> {
        let batch_divisor = self.shape(logits)?.first().copied().unwrap_or(0).max(1);
        let op = Op::SparseSoftmaxCrossEntropy { batch_divisor };
        self.op1(name, op, &[logits, labels])
    }

    /// A constant of the builder's float dtype.
    pub fn fill(&mut self, name: &str, shape: &[usize], value: f64) -> Result<ValueId, GraphError> {
        let op = Op::Fill {
            shape: shape.to_vec(),
            dtype: self.float_dtype,
            value,
        };
        self.op1(name, op, &[])
    }

    /// A constant of the builder's float dtype: 1 at `[.., i, j]` where `j - i >= diagonal`,
    /// else 0 (`diagonal = 1` gives the causal attention mask, 1 on future positions).
    pub fn triu(
        &mut self,
        name: &str,
        shape: &[usize],
        diagonal: i64,
    ) -> Result<ValueId, GraphError> {
        let op = Op::Triu {
            shape: shape.to_vec(),
            diagonal,
            dtype: self.float_dtype,
        };
        self.op1(name, op, &[])
    }

    /// `x` with `value` wherever `mask` (any dtype, broadcast to `x`) is nonzero.
    pub fn masked_fill(
        &mut self,
        name: &str,
        x: ValueId,
        mask: ValueId,
        value: f64,
    ) -> Result<ValueId, GraphError> {
        self.op1(name, Op::MaskedFill { value }, &[x, mask])
    }

    /// `x` where `cond` (any dtype, broadcast to `x`) is nonzero, else `y`: [`Op::Where`]
    /// (MindSpore's `Select`, NumPy's `where`).
    pub fn select(
        &mut self,
        name: &str,
        cond: ValueId,
        x: ValueId,
        y: ValueId,
    ) -> Result<ValueId, GraphError> {
        self.op1(name, Op::Where, &[cond, x, y])
    }

    /// `xs` (2 to [`crate::MAX_INPUTS`] values) joined along `axis`.
    pub fn concat(
        &mut self,
        name: &str,
        xs: &[ValueId],
        axis: usize,
    ) -> Result<ValueId, GraphError> {
        let op = Op::Concat { axis, n: xs.len() };
        self.op1(name, op, xs)
    }

    /// `x` cut along `axis` into pieces of `sizes` (summing to the dim); returns the pieces (the
    /// node's outputs `name`, `name:1`, …).
    pub fn split(
        &mut self,
        name: &str,
        x: ValueId,
        axis: usize,
        sizes: &[usize],
    ) -> Result<Vec<ValueId>, GraphError> {
        let op = Op::Split {
            axis,
            sizes: sizes.to_vec(),
        };
        self.node(name, op, &[x])
    }

    /// Elements `begin[d]..end[d]` of every dim `d` of `x`, every `strides[d]`-th.
    pub fn strided_slice(
        &mut self,
        name: &str,
        x: ValueId,
        begin: &[usize],
        end: &[usize],
        strides: &[usize],
    ) -> Result<ValueId, GraphError> {
        let op = Op::StridedSlice {
            begin: begin.to_vec(),
            end: end.to_vec(),
            strides: strides.to_vec(),
        };
        self.op1(name, op, &[x])
    }

    /// `x` converted to `dtype` (f32, f64, f16 or bf16), rounding to nearest.
    pub fn cast(&mut self, name: &str, x: ValueId, dtype: DType) -> Result<ValueId, GraphError> {
        self.op1(name, Op::Cast { dtype }, &[x])
    }

    /// `softmax(scale · x)` over the last dim.
    pub fn scaled_softmax(
        &mut self,
        name: &str,
        x: ValueId,
        scale: f64,
    ) -> Result<ValueId, GraphError> {
        self.op1(name, Op::ScaledSoftmax { scale }, &[x])
    }

    /// Fused attention `softmax(scale · q·kᵀ + mask)·v` of `q [..., Sq, d]` over `k`, `v`
    /// `[..., Sk, d]` (see [`Op::FlashAttention`]); returns `(out, lse)`, the node's outputs
    /// `name` and `name:1`.
    pub fn flash_attention(
        &mut self,
        name: &str,
        (q, k, v): (ValueId, ValueId, ValueId),
        causal: bool,
        scale: f64,
    ) -> Result<(ValueId, ValueId), GraphError> {
        let outputs = self.node(name, Op::FlashAttention { causal, scale }, &[q, k, v])?;
        Ok((outputs[0], outputs[1]))
    }

    /// Fused attention over the fused QKV projection's layout `qkv [..., S, N, 3·d]` (see
    /// [`Op::PackedAttention`]); returns `(out [..., S, N, d], lse [..., S, N])`, the node's
    /// outputs `name` and `name:1`.
    pub fn packed_attention(
        &mut self,
        name: &str,
        qkv: ValueId,
        causal: bool,
        scale: f64,
    ) -> Result<(ValueId, ValueId), GraphError> {
        let outputs = self.node(name, Op::PackedAttention { causal, scale }, &[qkv])?;
        Ok((outputs[0], outputs[1]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_names_are_unique() {
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[2, 3], DType::F32).unwrap();
        let y = b
            .scope("encoder", |b| b.scope("layer0", |b| b.relu("relu", x)))
            .unwrap();
        assert_eq!(b.value(y).unwrap().name, "encoder.layer0.relu");
        let err = b.scope("encoder", |b| b.scope("layer0", |b| b.relu("relu", x)));
        assert_eq!(
            err.unwrap_err().to_string(),
            "`encoder.layer0.relu` is already defined in this graph"
        );
        assert!(matches!(b.relu("a..b", x), Err(GraphError::BadName { .. })));
        assert!(matches!(b.relu("a:1", x), Err(GraphError::BadName { .. })));
        let g = b.finish();
        assert_eq!(g.node_by_name("encoder.layer0.relu"), Some(NodeId(0)));
        assert_eq!(g.value_by_name("encoder.layer0.relu"), Some(y));
        assert_eq!(g.value_by_name("x"), Some(x));
    }
}
