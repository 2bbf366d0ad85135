//! The graph IR: values, nodes and the immutable [`Graph`] with its traversals.

use std::collections::HashMap;
use std::fmt;

use tensor::DType;

use crate::error::GraphError;
use crate::infer::infer;
use crate::init::Initializer;
use crate::op::Op;

/// The index of a value in its graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub usize);

/// The index of a node in its graph (nodes are stored in topological order, so a smaller id
/// never depends on a larger one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Where a value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueKind {
    /// Fed from outside at every step (data, labels).
    Input,
    /// A parameter: initialised once by `init`, updated by an optimizer when `trainable`.
    Parameter {
        /// How its initial values are computed.
        init: Initializer,
        /// Whether the optimizer updates it (and `grad` may differentiate it).
        trainable: bool,
    },
    /// Produced by a node.
    Intermediate,
}

impl ValueKind {
    /// `an input`, `a parameter` or `an intermediate`, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            ValueKind::Input => "an input",
            ValueKind::Parameter { .. } => "a parameter",
            ValueKind::Intermediate => "an intermediate",
        }
    }
}

/// A tensor of the graph: its name, global shape, dtype and kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    /// Hierarchical name: a node's output is named after the node (`layer2.matmul`, further
    /// outputs `layer2.norm:1`); inputs and parameters carry their scope (`layer2.weight`).
    pub name: String,
    /// The shape, in elements.
    pub shape: Vec<usize>,
    /// The element type.
    pub dtype: DType,
    /// Input, parameter or intermediate.
    pub kind: ValueKind,
    /// The node producing it and the output index, for intermediates.
    pub producer: Option<(NodeId, usize)>,
}

impl Value {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the value is a parameter the optimizer trains.
    pub fn is_trainable(&self) -> bool {
        matches!(
            self.kind,
            ValueKind::Parameter {
                trainable: true,
                ..
            }
        )
    }
}

/// Which forward node a backward node differentiates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GradOf {
    /// The forward node.
    pub forward: NodeId,
    /// For each output of the backward node, the forward node's input whose gradient (or a
    /// contribution to it) that output is; `None` for an intermediate step of the rule (e.g. the
    /// `Mul` inside `Div`'s rule).
    pub wrt: Vec<Option<usize>>,
}

/// What a node is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeRole {
    /// Part of the forward computation.
    Forward,
    /// Part of the backward rule of a forward node.
    Backward(GradOf),
    /// Sums the gradient contributions of a forward value used more than once.
    Accumulate {
        /// The forward value whose gradient is summed.
        value: ValueId,
    },
    /// The gradient seed `dloss/dloss = 1`, or a zero gradient for a parameter the loss does not
    /// depend on.
    Seed {
        /// The forward value the constant is the gradient of.
        value: ValueId,
    },
}

/// A use of a value: input `input` of node `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Use {
    /// The consuming node.
    pub node: NodeId,
    /// Which of its inputs.
    pub input: usize,
}

/// An op applied to values.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Hierarchical name, unique in the graph (`layer2.matmul`).
    pub name: String,
    /// The op and its attributes.
    pub op: Op,
    /// Input values, in the op's order.
    pub inputs: Vec<ValueId>,
    /// Output values, in the op's order.
    pub outputs: Vec<ValueId>,
    /// Forward, backward (and of which node), accumulation or seed.
    pub role: NodeRole,
}

impl Node {
    /// The forward node and inputs this node differentiates, for backward nodes.
    pub fn grad_of(&self) -> Option<&GradOf> {
        match &self.role {
            NodeRole::Backward(of) => Some(of),
            _ => None,
        }
    }
}

/// A static graph: values and nodes in topological order.
///
/// Invariants (kept by [`crate::GraphBuilder`], the only way to make one): every node's inputs
/// exist before it (node order is a topological order); every value has exactly the shape and
/// dtype its producer's shape inference gives; names of nodes, inputs and parameters are unique.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Graph {
    pub(crate) values: Vec<Value>,
    pub(crate) nodes: Vec<Node>,
    pub(crate) consumers: Vec<Vec<Use>>,
    pub(crate) outputs: Vec<ValueId>,
    pub(crate) names: HashMap<String, NameRef>,
}

/// What a name in the graph refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameRef {
    Node(NodeId),
    Value(ValueId),
}

impl Graph {
    /// Every value, indexed by [`ValueId`].
    pub fn values(&self) -> &[Value] {
        &self.values
    }

    /// Every node, in topological order, indexed by [`NodeId`].
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The value `id`.
    pub fn value(&self, id: ValueId) -> Result<&Value, GraphError> {
        self.values.get(id.0).ok_or(GraphError::UnknownValue {
            context: "graph".to_string(),
            id: id.0,
            n_values: self.values.len(),
        })
    }

    /// The node `id`.
    pub fn node(&self, id: NodeId) -> Result<&Node, GraphError> {
        self.nodes.get(id.0).ok_or(GraphError::UnknownNode {
            context: "graph".to_string(),
            id: id.0,
            n_nodes: self.nodes.len(),
        })
    }

    /// Node ids in topological order (every node after the producers of its inputs).
    pub fn topological_order(&self) -> impl DoubleEndedIterator<Item = NodeId> + ExactSizeIterator {
        (0..self.nodes.len()).map(NodeId)
    }

    /// The node producing `value`, or `None` for inputs and parameters.
    pub fn producer(&self, value: ValueId) -> Option<NodeId> {
        self.values.get(value.0)?.producer.map(|(node, _)| node)
    }

    /// The uses of `value` as a node input, in node order.
    pub fn consumers(&self, value: ValueId) -> &[Use] {
        self.consumers.get(value.0).map_or(&[], Vec::as_slice)
    }

    /// The graph's declared outputs.
    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    /// The input values (fed at every step), in creation order.
    pub fn inputs(&self) -> Vec<ValueId> {
        self.ids_where(|v| v.kind == ValueKind::Input)
    }

    /// The parameters, in creation order.
    pub fn parameters(&self) -> Vec<ValueId> {
        self.ids_where(|v| matches!(v.kind, ValueKind::Parameter { .. }))
    }

    /// The trainable parameters, in creation order.
    pub fn trainable_parameters(&self) -> Vec<ValueId> {
        self.ids_where(Value::is_trainable)
    }

    fn ids_where(&self, keep: impl Fn(&Value) -> bool) -> Vec<ValueId> {
        (0..self.values.len())
            .map(ValueId)
            .filter(|id| keep(&self.values[id.0]))
            .collect()
    }

    /// The node named `name`.
    pub fn node_by_name(&self, name: &str) -> Option<NodeId> {
        match self.names.get(name)? {
            NameRef::Node(id) => Some(*id),
            NameRef::Value(_) => None,
        }
    }

    /// The value named `name`: an input, a parameter, or a node's output (`layer.norm` is the
    /// first output of node `layer.norm`, `layer.norm:1` the second).
    pub fn value_by_name(&self, name: &str) -> Option<ValueId> {
        match self.names.get(name) {
            Some(NameRef::Value(id)) => Some(*id),
            Some(NameRef::Node(id)) => self.nodes[id.0].outputs.first().copied(),
            None => {
                let (node, index) = name.rsplit_once(':')?;
                let index: usize = index.parse().ok()?;
                let id = self.node_by_name(node)?;
                self.nodes[id.0].outputs.get(index).copied()
            }
        }
    }

    /// The nodes needed to compute `targets`, and every node with a side effect (a
    /// [`crate::Op::Print`], whose output nobody reads) with what it needs, in topological
    /// order.
    pub fn nodes_needed_for(&self, targets: &[ValueId]) -> Vec<NodeId> {
        let mut needed = vec![false; self.nodes.len()];
        let mut stack: Vec<ValueId> = targets.to_vec();
        for node in self.nodes.iter().filter(|n| n.op.has_side_effect()) {
            stack.extend(&node.outputs);
        }
        let mut seen = vec![false; self.values.len()];
        while let Some(v) = stack.pop() {
            if v.0 >= seen.len() || seen[v.0] {
                continue;
            }
            seen[v.0] = true;
            if let Some(node) = self.producer(v) {
                if !needed[node.0] {
                    needed[node.0] = true;
                    stack.extend(&self.nodes[node.0].inputs);
                }
            }
        }
        (0..self.nodes.len())
            .filter(|&i| needed[i])
            .map(NodeId)
            .collect()
    }

    /// A copy of this graph with a new parameter `name`, a copy of parameter `param` (same
    /// shape, dtype, initialiser and trainability), read by `uses` instead of `param`. Every
    /// existing id stays; the copy is the last value. This is how pipeline stages give each
    /// stage that reads a shared parameter (a tied embedding) its own copy.
    pub fn with_parameter_copy(
        &self,
        param: ValueId,
        name: &str,
        uses: &[Use],
    ) -> Result<(Graph, ValueId), GraphError> {
        let original = self.value(param)?;
        if !matches!(original.kind, ValueKind::Parameter { .. }) {
            return Err(GraphError::BadName {
                name: original.name.clone(),
                reason: "is not a parameter, so it cannot be copied",
            });
        }
        if name.is_empty() || self.names.contains_key(name) {
            return Err(GraphError::BadName {
                name: name.to_string(),
                reason: "is already defined in this graph (or empty)",
            });
        }
        for u in uses {
            if self.nodes.get(u.node.0).and_then(|n| n.inputs.get(u.input)) != Some(&param) {
                return Err(GraphError::BadName {
                    name: original.name.clone(),
                    reason: "is not the input a use to be moved to its copy names",
                });
            }
        }
        let mut graph = self.clone();
        let copy = ValueId(graph.values.len());
        let mut value = original.clone();
        value.name = name.to_string();
        graph.values.push(value);
        graph.consumers.push(uses.to_vec());
        graph.consumers[param.0].retain(|u| !uses.contains(u));
        for u in uses {
            graph.nodes[u.node.0].inputs[u.input] = copy;
        }
        graph.names.insert(name.to_string(), NameRef::Value(copy));
        Ok((graph, copy))
    }

    /// A copy of this graph with edited ops and leaf shapes, keeping every id, name and role.
    ///
    /// `leaf_shape` gives the new shape of each input and parameter; `node_op` the new op of
    /// each node (e.g. the same op with a local `Reshape` shape). The shapes of intermediates are
    /// inferred again, in topological order, so every inconsistency is reported as the shape
    /// error of the node where it appears. This is how a parallel pass derives a per-rank graph
    /// with local shapes.
    pub fn rewrite(
        &self,
        mut leaf_shape: impl FnMut(ValueId, &Value) -> Vec<usize>,
        mut node_op: impl FnMut(NodeId, &Node) -> Op,
    ) -> Result<Graph, GraphError> {
        let mut graph = self.clone();
        for (i, value) in graph.values.iter_mut().enumerate() {
            if value.producer.is_none() {
                value.shape = leaf_shape(ValueId(i), &self.values[i]);
            }
        }
        for i in 0..graph.nodes.len() {
            let op = node_op(NodeId(i), &self.nodes[i]);
            let node = &graph.nodes[i];
            let inputs: Vec<&Value> = node.inputs.iter().map(|v| &graph.values[v.0]).collect();
            let types = infer(&node.name, &op, &inputs)?;
            if types.len() != node.outputs.len() {
                return Err(GraphError::Attribute {
                    node: node.name.clone(),
                    attribute: "op",
                    reason: format!(
                        "{} has {} outputs but the node being rewritten ({}) has {}",
                        op.kind(),
                        types.len(),
                        node.op.kind(),
                        node.outputs.len()
                    ),
                });
            }
            let outputs = node.outputs.clone();
            for (v, (shape, dtype)) in outputs.iter().zip(types) {
                graph.values[v.0].shape = shape;
                graph.values[v.0].dtype = dtype;
            }
            graph.nodes[i].op = op;
        }
        Ok(graph)
    }
}

impl fmt::Display for Graph {
    /// One line per leaf and per node, e.g.
    /// `%3 = layer1.matmul: MatMul(%0, %1) { transpose_a: false, transpose_b: true } -> [32, 512] f32`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, value) in self.values.iter().enumerate() {
            if value.producer.is_none() {
                writeln!(
                    f,
                    "%{i} = {} {}: {:?} {}",
                    match value.kind {
                        ValueKind::Input => "input",
                        _ => "parameter",
                    },
                    value.name,
                    value.shape,
                    value.dtype
                )?;
            }
        }
        for node in &self.nodes {
            let outputs: Vec<String> = node.outputs.iter().map(ToString::to_string).collect();
            let inputs: Vec<String> = node.inputs.iter().map(ToString::to_string).collect();
            let types: Vec<String> = node
                .outputs
                .iter()
                .map(|v| {
                    let value = &self.values[v.0];
                    format!("{:?} {}", value.shape, value.dtype)
                })
                .collect();
            // The attributes as `Debug` prints them, after the variant name.
            let debug = format!("{:?}", node.op);
            let attributes = debug.find(' ').map_or("", |i| &debug[i..]);
            writeln!(
                f,
                "{} = {}: {}({}){attributes} -> {}",
                outputs.join(", "),
                node.name,
                node.op.kind(),
                inputs.join(", "),
                types.join(", ")
            )?;
        }
        Ok(())
    }
}
