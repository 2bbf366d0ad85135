//! The tracing backend of networks written in Python: [`NetworkBuilder`]
//! (`tessera._tessera.NetworkBuilder`) wraps a [`graph::GraphBuilder`]. `construct` runs once on
//! symbolic tensors (`tessera.ops`), and every op it applies adds a node here, checked at once
//! (shapes and dtypes); each call returns the new value's id and shape.

use graph::{FanMode, GraphBuilder, Initializer, ValueId};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tensor::DType;

/// A graph error as `ValueError`; the message names the node or value and the rule broken.
pub(crate) fn graph_err(e: graph::GraphError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The graph a network's `construct` is traced into (`tessera._tessera.NetworkBuilder`).
/// Values are addressed by their integer ids; every method returns `(id, shape)`.
#[pyclass(module = "tessera._tessera")]
pub struct NetworkBuilder {
    pub(crate) builder: GraphBuilder,
}

/// The ops `NetworkBuilder.op` adds, by the name it takes.
pub const OPS: &[&str] = &[
    "matmul",
    "add",
    "sub",
    "mul",
    "div",
    "bias_add",
    "relu",
    "tanh",
    "gelu",
    "softmax",
    "log_softmax",
    "exp",
    "flatten",
    "reshape",
    "transpose",
    "sparse_softmax_cross_entropy",
];

impl NetworkBuilder {
    fn traced(&self, id: ValueId) -> PyResult<(usize, Vec<usize>)> {
        let shape = self.builder.shape(id).map_err(graph_err)?.to_vec();
        Ok((id.0, shape))
    }
}

#[pymethods]
impl NetworkBuilder {
    /// An empty graph with f32 parameters.
    #[new]
    fn new() -> NetworkBuilder {
        NetworkBuilder {
            builder: GraphBuilder::new(),
        }
    }

    /// A value fed at every step: `dtype` is `"float32"` or `"int32"`.
    fn input(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        dtype: &str,
    ) -> PyResult<(usize, Vec<usize>)> {
        let dtype = match dtype {
            "float32" => DType::F32,
            "int32" => DType::I32,
            other => {
                return Err(PyValueError::new_err(format!(
                    "input {name}: dtype {other} is not supported (float32 or int32)"
                )))
            }
        };
        let id = self.builder.input(name, &shape, dtype).map_err(graph_err)?;
        self.traced(id)
    }

    /// A trainable f32 parameter. `init` is MindSpore's initializer name: `"dense_weight"`
    /// (`HeUniform(negative_slope=√5)`, `nn.Dense`'s default), `"he_uniform"`, `"uniform"`
    /// (`U(-scale, scale)`), `"normal"` (`sigma` = `scale`), `"zeros"`, `"ones"`.
    #[pyo3(signature = (name, shape, init, scale=0.01))]
    fn parameter(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        init: &str,
        scale: f64,
    ) -> PyResult<(usize, Vec<usize>)> {
        let init = match init {
            "dense_weight" => Initializer::HeUniform {
                negative_slope: 5f64.sqrt(),
                mode: FanMode::FanIn,
            },
            "he_uniform" => Initializer::he_uniform(),
            "uniform" => Initializer::Uniform { scale },
            "normal" => Initializer::Normal {
                sigma: scale,
                mean: 0.0,
            },
            "zeros" => Initializer::Zeros,
            "ones" => Initializer::Ones,
            other => {
                return Err(PyValueError::new_err(format!(
                    "parameter {name}: initializer {other} is not supported"
                )))
            }
        };
        let id = self
            .builder
            .parameter(name, &shape, init)
            .map_err(graph_err)?;
        self.traced(id)
    }

    /// Adds node `name` applying op `kind` (one of `OPS`) to `inputs`; `transpose_a` and
    /// `transpose_b` are MatMul's, `shape` Reshape's target and `perm` Transpose's.
    #[pyo3(signature = (kind, name, inputs, transpose_a=false, transpose_b=false, shape=None, perm=None, approximate=true))]
    #[allow(clippy::too_many_arguments)]
    fn op(
        &mut self,
        kind: &str,
        name: &str,
        inputs: Vec<usize>,
        transpose_a: bool,
        transpose_b: bool,
        shape: Option<Vec<usize>>,
        perm: Option<Vec<usize>>,
        approximate: bool,
    ) -> PyResult<(usize, Vec<usize>)> {
        let arity = match kind {
            "matmul"
            | "add"
            | "sub"
            | "mul"
            | "div"
            | "bias_add"
            | "sparse_softmax_cross_entropy" => 2,
            _ => 1,
        };
        if inputs.len() != arity {
            return Err(PyValueError::new_err(format!(
                "{name}: {kind} takes {arity} input(s), got {}",
                inputs.len()
            )));
        }
        let v: Vec<ValueId> = inputs.into_iter().map(ValueId).collect();
        let b = &mut self.builder;
        let id = match kind {
            "matmul" => b.matmul_with(name, v[0], v[1], transpose_a, transpose_b),
            "add" => b.add(name, v[0], v[1]),
            "sub" => b.sub(name, v[0], v[1]),
            "mul" => b.mul(name, v[0], v[1]),
            "div" => b.div(name, v[0], v[1]),
            "bias_add" => b.bias_add(name, v[0], v[1]),
            "sparse_softmax_cross_entropy" => b.sparse_softmax_cross_entropy(name, v[0], v[1]),
            "relu" => b.relu(name, v[0]),
            "tanh" => b.tanh(name, v[0]),
            "gelu" => b.gelu(name, v[0], approximate),
            "softmax" => b.softmax(name, v[0]),
            "log_softmax" => b.log_softmax(name, v[0]),
            "exp" => b.exp(name, v[0]),
            "flatten" => b.flatten(name, v[0]),
            "reshape" => match shape {
                Some(shape) => b.reshape(name, v[0], &shape),
                None => {
                    return Err(PyValueError::new_err(format!(
                        "{name}: reshape needs a shape"
                    )))
                }
            },
            "transpose" => match perm {
                Some(perm) => b.transpose(name, v[0], &perm),
                None => {
                    return Err(PyValueError::new_err(format!(
                        "{name}: transpose needs a perm"
                    )))
                }
            },
            other => {
                return Err(PyValueError::new_err(format!(
                    "{name}: op {other} is not supported (supported: {})",
                    OPS.join(", ")
                )))
            }
        }
        .map_err(graph_err)?;
        self.traced(id)
    }

    /// The shape of value `id`.
    fn shape(&self, id: usize) -> PyResult<Vec<usize>> {
        Ok(self.builder.shape(ValueId(id)).map_err(graph_err)?.to_vec())
    }

    /// The names of the graph's nodes, in order (the names `shard` strategies attach to).
    fn node_names(&self) -> Vec<String> {
        self.builder
            .graph()
            .nodes()
            .iter()
            .map(|n| n.name.clone())
            .collect()
    }
}
