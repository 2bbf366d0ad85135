//! The one error type of the graph crate.

use layout::SliceBox;
use tensor::{DType, TensorError};

/// Everything that can go wrong building, differentiating or executing a graph.
///
/// Every variant names its culprit: the node by its hierarchical name (`layer2.matmul`), the
/// value by its name, and the rule that was broken.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// An op was given the wrong number of inputs.
    #[error("{node}: {op} takes {expected} inputs, got {got}")]
    InputCount {
        /// The node.
        node: String,
        /// The op kind (`MatMul`).
        op: &'static str,
        /// Inputs the op takes.
        expected: usize,
        /// Inputs given.
        got: usize,
    },
    /// `eval_op` was given the wrong number of output buffers.
    #[error("{node}: {op} produces {expected} outputs, got {got} output buffers")]
    OutputCount {
        /// The node.
        node: String,
        /// The op kind.
        op: &'static str,
        /// Outputs the op produces.
        expected: usize,
        /// Buffers given.
        got: usize,
    },
    /// An input of the wrong dtype.
    #[error("{node}: input `{value}` has dtype {got}, but {op} needs {expected}")]
    InputDType {
        /// The node.
        node: String,
        /// The op kind.
        op: &'static str,
        /// The input value.
        value: String,
        /// Its dtype.
        got: DType,
        /// What the op needs (`a floating-point dtype`, `i32 or i64`, `the dtype of x (f32)`).
        expected: String,
    },
    /// An input of the wrong rank.
    #[error("{node}: input `{value}` has shape {shape:?}, but {op} needs {expected}")]
    InputRank {
        /// The node.
        node: String,
        /// The op kind.
        op: &'static str,
        /// The input value.
        value: String,
        /// Its shape.
        shape: Vec<usize>,
        /// What the op needs (`a 2-D matrix`).
        expected: &'static str,
    },
    /// Two dims that must be equal differ.
    #[error("{node}: {what} {lhs_dim} and {rhs_dim} differ ({lhs}, {rhs})")]
    DimMismatch {
        /// The node.
        node: String,
        /// Which dims (`inner dims`, `channel dim and bias length`).
        what: &'static str,
        /// The left value.
        lhs: Box<Operand>,
        /// The left dim size.
        lhs_dim: usize,
        /// The right value.
        rhs: Box<Operand>,
        /// The right dim size.
        rhs_dim: usize,
    },
    /// Two shapes NumPy broadcasting cannot reconcile.
    #[error("{node}: {lhs} and {rhs} cannot be broadcast together")]
    NotBroadcastable {
        /// The node.
        node: String,
        /// The left value.
        lhs: Box<Operand>,
        /// The right value.
        rhs: Box<Operand>,
    },
    /// An attribute that is invalid for the op or its inputs.
    #[error("{node}: attribute `{attribute}` {reason}")]
    Attribute {
        /// The node.
        node: String,
        /// The attribute (`shape`, `perm`, `keep_prob`).
        attribute: &'static str,
        /// What is wrong with it, naming the values involved.
        reason: String,
    },
    /// A node, input or parameter name used twice, or an empty name part.
    #[error("`{name}` {reason}")]
    BadName {
        /// The full (scoped) name.
        name: String,
        /// What is wrong (`is already defined in this graph`).
        reason: &'static str,
    },
    /// A value id that does not belong to the graph.
    #[error("{context}: value id {id} does not exist (the graph has {n_values} values)")]
    UnknownValue {
        /// Who asked.
        context: String,
        /// The id.
        id: usize,
        /// Values in the graph.
        n_values: usize,
    },
    /// A node id that does not belong to the graph.
    #[error("{context}: node id {id} does not exist (the graph has {n_nodes} nodes)")]
    UnknownNode {
        /// Who asked.
        context: String,
        /// The id.
        id: usize,
        /// Nodes in the graph.
        n_nodes: usize,
    },
    /// A differentiation request that cannot be honoured.
    #[error("grad: `{value}` {reason}")]
    NotDifferentiable {
        /// The loss, parameter or node concerned.
        value: String,
        /// Why (`must be a scalar loss (shape []), got [4, 10]`).
        reason: String,
    },
    /// An initializer that cannot produce a parameter's values.
    #[error("parameter `{param}`: initializer {init} {reason}")]
    Init {
        /// The parameter.
        param: String,
        /// The initializer (`HeUniform`).
        init: &'static str,
        /// Why (`needs at least 2 dims to compute fan_in, got shape [10]`).
        reason: String,
    },
    /// A box that does not lie in the global tensor it addresses.
    #[error("{context}: region {region} does not fit in the global shape {shape:?}")]
    RegionOutOfRange {
        /// Who asked (`parameter fc1_weight`, `layer1.dropout`).
        context: String,
        /// The box (boxed: a box holds its dims inline, and every result of this type would
        /// carry its size).
        region: Box<SliceBox>,
        /// The global shape.
        shape: Vec<usize>,
    },
    /// A tensor handed to the executor or to `eval_op` that does not match the value it is for.
    #[error(
        "{context}: expected {expected_dtype} {expected_shape:?}, got {got_dtype} {got_shape:?}"
    )]
    TensorMismatch {
        /// The value or node and operand (`input x`, `layer1.matmul output 0`).
        context: String,
        /// Shape the graph says.
        expected_shape: Vec<usize>,
        /// Dtype the graph says.
        expected_dtype: DType,
        /// Shape given.
        got_shape: Vec<usize>,
        /// Dtype given.
        got_dtype: DType,
    },
    /// An op executed on a dtype the executor does not compute with.
    #[error("{node}: {op} cannot execute on dtype {dtype} (the executor computes in f32 and f64, and in bf16 and f16 through f32)")]
    UnsupportedDType {
        /// The node.
        node: String,
        /// The op kind.
        op: &'static str,
        /// The dtype.
        dtype: DType,
    },
    /// A value the executor does not keep after a run (an intermediate whose buffer is reused).
    #[error("executor: value `{value}` is not kept after a run; ask for it as an output when building the executor")]
    NotKept {
        /// The value.
        value: String,
    },
    /// A kernel failed while executing a node.
    #[error("{node}: {source}")]
    Kernel {
        /// The node.
        node: String,
        /// The kernel's error.
        #[source]
        source: Box<TensorError>,
    },
}

/// A value named in an error: its name and shape, shown as `` `x` [32, 512] ``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// The value's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl std::fmt::Display for Operand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` {:?}", self.name, self.shape)
    }
}

impl GraphError {
    /// Wraps a kernel error with the node it happened in.
    pub(crate) fn kernel(node: &str) -> impl FnOnce(TensorError) -> GraphError + '_ {
        move |source| GraphError::Kernel {
            node: node.to_string(),
            source: Box::new(source),
        }
    }
}
