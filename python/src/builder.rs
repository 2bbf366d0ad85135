//! The tracing backend of networks written in Python: [`NetworkBuilder`]
//! (`tessera._tessera.NetworkBuilder`) wraps a [`graph::GraphBuilder`]. `construct` runs once on
//! symbolic tensors (`tessera.ops`), and every op it applies adds a node here, checked at once
//! (shapes and dtypes); each call returns the new value's id and shape.

use graph::{FanMode, GraphBuilder, GraphError, Initializer, Op, ValueId};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensor::DType;

/// A graph error as `ValueError`; the message names the node or value and the rule broken.
pub(crate) fn graph_err(e: graph::GraphError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The most elements one value may hold: at 8 bytes an element, its bytes must stay
/// addressable (`isize::MAX`). The graph's shape arithmetic multiplies dims unchecked, so a
/// shape beyond this (`[2**62, 2**62]`) is refused here, before it reaches the graph.
pub(crate) const MAX_ELEMENTS: usize = isize::MAX as usize / 8;

/// `shape` holds at most [`MAX_ELEMENTS`] elements; else a `ValueError` naming `what`.
pub(crate) fn check_shape(what: &str, shape: &[usize]) -> PyResult<()> {
    let elements = if shape.contains(&0) {
        Some(0)
    } else {
        shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    };
    match elements {
        Some(n) if n <= MAX_ELEMENTS => Ok(()),
        _ => Err(PyValueError::new_err(format!(
            "{what}: shape {shape:?} has more elements than fit in memory (at most \
             {MAX_ELEMENTS}; the product of its dims is {})",
            elements.map_or_else(|| "2**64 or more".to_string(), |n| n.to_string())
        ))),
    }
}

/// The graph a network's `construct` is traced into (`tessera._tessera.NetworkBuilder`).
/// Values are addressed by their integer ids; every method returns `(id, shape)`.
#[pyclass(module = "tessera._tessera")]
pub struct NetworkBuilder {
    pub(crate) builder: GraphBuilder,
}

/// The ops `NetworkBuilder.op` adds, by the name it takes, with their attributes (keyword
/// arguments of `op`).
pub const OPS: &[&str] = &[
    "matmul(transpose_a, transpose_b)",
    "batch_matmul(transpose_a, transpose_b)",
    "add",
    "sub",
    "mul",
    "div",
    "bias_add",
    "relu",
    "tanh",
    "sigmoid",
    "gelu(approximate)",
    "softmax",
    "log_softmax",
    "scaled_softmax(scale)",
    "exp",
    "log",
    "sqrt",
    "neg",
    "stop_gradient",
    "print(label)",
    "flatten",
    "reshape(shape)",
    "transpose(perm)",
    "broadcast_to(shape)",
    "reduce_sum(axes, keep_dims)",
    "reduce_max(axes, keep_dims)",
    "embedding",
    "one_hot(depth, dtype)",
    "cast(dtype)",
    "layer_norm(epsilon)",
    "dropout(keep_prob, seed)",
    "concat(axis)",
    "split(axis, sizes)",
    "fill(shape, value)",
    "triu(shape, diagonal)",
    "masked_fill(value)",
    "where",
    "sparse_softmax_cross_entropy",
];

/// A dtype by MindSpore's name (`float32`, `Float32`) or Tessera's (`f32`).
pub(crate) fn parse_dtype(context: &str, name: &str) -> PyResult<DType> {
    let canonical = match name {
        "float32" => "f32",
        "float16" => "f16",
        "bfloat16" => "bf16",
        "float64" => "f64",
        "int32" => "i32",
        "int64" => "i64",
        "bool" | "bool_" => "bool",
        other => other,
    };
    canonical.parse().map_err(|_| {
        PyValueError::new_err(format!(
            "{context}: dtype {name} is not supported (float32, float16, bfloat16, float64, \
             int32, int64)"
        ))
    })
}

/// MindSpore's lowercase name of `dtype` (`float32`), as `tessera.float32` is named.
pub(crate) fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F64 => "float64",
        DType::I32 => "int32",
        DType::I64 => "int64",
        other => other.name(),
    }
}

/// The keyword attributes of one `op` call, read with errors naming the node and the op.
struct Attrs<'a, 'py> {
    node: &'a str,
    kind: &'a str,
    dict: Option<&'a Bound<'py, PyDict>>,
}

impl<'py> Attrs<'_, 'py> {
    /// Attribute `key`, if given.
    fn get<T: for<'b> FromPyObject<'b, 'py>>(&self, key: &str) -> PyResult<Option<T>> {
        let Some(value) = self.dict.map(|d| d.get_item(key)).transpose()?.flatten() else {
            return Ok(None);
        };
        value.extract::<T>().map(Some).map_err(|_| {
            PyValueError::new_err(format!(
                "{}: {} attribute {key} has the wrong type ({})",
                self.node,
                self.kind,
                value
                    .get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string())
            ))
        })
    }

    /// Attribute `key`, or `default`.
    fn or<T: for<'b> FromPyObject<'b, 'py>>(&self, key: &str, default: T) -> PyResult<T> {
        Ok(self.get(key)?.unwrap_or(default))
    }

    /// Attribute `key`, which the op needs.
    fn need<T: for<'b> FromPyObject<'b, 'py>>(&self, key: &str) -> PyResult<T> {
        self.get(key)?.ok_or_else(|| {
            PyValueError::new_err(format!(
                "{}: {} needs the attribute {key}",
                self.node, self.kind
            ))
        })
    }

    /// The shape attribute `key`, which the op needs; a shape of more than [`MAX_ELEMENTS`]
    /// elements is a `ValueError` naming the node and the attribute.
    fn shape(&self, key: &str) -> PyResult<Vec<usize>> {
        let shape: Vec<usize> = self.need(key)?;
        check_shape(
            &format!("{}: {} attribute {key}", self.node, self.kind),
            &shape,
        )?;
        Ok(shape)
    }

    /// The piece sizes attribute `key` (Split's), which the op needs; sizes whose sum
    /// overflows are a `ValueError` naming the node and the attribute.
    fn sizes(&self, key: &str) -> PyResult<Vec<usize>> {
        let sizes: Vec<usize> = self.need(key)?;
        if sizes
            .iter()
            .try_fold(0usize, |a, &n| a.checked_add(n))
            .is_none()
        {
            return Err(PyValueError::new_err(format!(
                "{}: {} attribute {key} {sizes:?} adds up to more than 2**64 - 1 (the sizes \
                 must add up to the dim split)",
                self.node, self.kind
            )));
        }
        Ok(sizes)
    }

    /// The dtype attribute `key`, or the builder's float dtype.
    fn dtype(&self, key: &str, default: DType) -> PyResult<DType> {
        match self.get::<String>(key)? {
            Some(name) => parse_dtype(&format!("{} ({})", self.node, self.kind), &name),
            None => Ok(default),
        }
    }
}

/// The number of tensor inputs of op `kind` (`None`: any number, Concat's).
fn arity(kind: &str) -> Option<usize> {
    Some(match kind {
        "fill" | "triu" => 0,
        "matmul"
        | "batch_matmul"
        | "add"
        | "sub"
        | "mul"
        | "div"
        | "bias_add"
        | "embedding"
        | "masked_fill"
        | "sparse_softmax_cross_entropy" => 2,
        "layer_norm" | "where" => 3,
        "concat" => return None,
        _ => 1,
    })
}

impl NetworkBuilder {
    fn traced(&self, id: ValueId) -> PyResult<(usize, Vec<usize>)> {
        let shape = self.builder.shape(id).map_err(graph_err)?.to_vec();
        Ok((id.0, shape))
    }

    /// Adds node `name` of op `kind` on `v` with `attrs`; returns its outputs.
    fn add_op(
        &mut self,
        kind: &str,
        name: &str,
        v: &[ValueId],
        attrs: &Attrs<'_, '_>,
    ) -> PyResult<Vec<ValueId>> {
        let b = &mut self.builder;
        let float = b.float_dtype();
        let one = |r: Result<ValueId, GraphError>| r.map(|id| vec![id]);
        let flags = || -> PyResult<(bool, bool)> {
            Ok((
                attrs.or("transpose_a", false)?,
                attrs.or("transpose_b", false)?,
            ))
        };
        let reduce = || -> PyResult<(Vec<usize>, bool)> {
            Ok((attrs.or("axes", Vec::new())?, attrs.or("keep_dims", false)?))
        };
        let result = match kind {
            "matmul" => {
                let (ta, tb) = flags()?;
                one(b.matmul_with(name, v[0], v[1], ta, tb))
            }
            "batch_matmul" => {
                let (ta, tb) = flags()?;
                one(b.batch_matmul(name, v[0], v[1], ta, tb))
            }
            "add" => one(b.add(name, v[0], v[1])),
            "sub" => one(b.sub(name, v[0], v[1])),
            "mul" => one(b.mul(name, v[0], v[1])),
            "div" => one(b.div(name, v[0], v[1])),
            "bias_add" => one(b.bias_add(name, v[0], v[1])),
            "embedding" => one(b.embedding(name, v[0], v[1])),
            "masked_fill" => one(b.masked_fill(name, v[0], v[1], attrs.need("value")?)),
            "where" => one(b.select(name, v[0], v[1], v[2])),
            "sparse_softmax_cross_entropy" => one(b.sparse_softmax_cross_entropy(name, v[0], v[1])),
            "relu" => one(b.relu(name, v[0])),
            "tanh" => one(b.tanh(name, v[0])),
            "sigmoid" => one(b.sigmoid(name, v[0])),
            "gelu" => one(b.gelu(name, v[0], attrs.or("approximate", true)?)),
            "softmax" => one(b.softmax(name, v[0])),
            "log_softmax" => one(b.log_softmax(name, v[0])),
            "scaled_softmax" => one(b.scaled_softmax(name, v[0], attrs.need("scale")?)),
            "exp" => one(b.exp(name, v[0])),
            "log" => one(b.log(name, v[0])),
            "sqrt" => one(b.sqrt(name, v[0])),
            "neg" => one(b.neg(name, v[0])),
            "stop_gradient" => one(b.stop_gradient(name, v[0])),
            "print" => one(b.print(name, &attrs.or("label", String::new())?, v[0])),
            "flatten" => one(b.flatten(name, v[0])),
            "reshape" => one(b.reshape(name, v[0], &attrs.shape("shape")?)),
            "transpose" => one(b.transpose(name, v[0], &attrs.need::<Vec<usize>>("perm")?)),
            "broadcast_to" => one(b.broadcast_to(name, v[0], &attrs.shape("shape")?)),
            "reduce_sum" => {
                let (axes, keep) = reduce()?;
                one(b.reduce_sum(name, v[0], &axes, keep))
            }
            "reduce_max" => {
                let (axes, keep) = reduce()?;
                one(b.reduce_max(name, v[0], &axes, keep))
            }
            "one_hot" => {
                let op = Op::OneHot {
                    depth: attrs.need("depth")?,
                    dtype: attrs.dtype("dtype", float)?,
                };
                b.node(name, op, &[v[0]])
            }
            "cast" => one(b.cast(name, v[0], attrs.dtype("dtype", float)?)),
            "layer_norm" => {
                let op = Op::LayerNorm {
                    epsilon: attrs.need("epsilon")?,
                };
                b.node(name, op, v)
            }
            "dropout" => one(b.dropout(name, v[0], attrs.need("keep_prob")?, attrs.need("seed")?)),
            "concat" => one(b.concat(name, v, attrs.need("axis")?)),
            "split" => b.split(name, v[0], attrs.need("axis")?, &attrs.sizes("sizes")?),
            "fill" => one(b.fill(name, &attrs.shape("shape")?, attrs.need("value")?)),
            "triu" => one(b.triu(name, &attrs.shape("shape")?, attrs.need("diagonal")?)),
            other => {
                return Err(PyValueError::new_err(format!(
                    "{name}: op {other} is not supported (supported: {})",
                    OPS.join(", ")
                )))
            }
        };
        result.map_err(graph_err)
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
        let context = format!("input {name}");
        let dtype = match parse_dtype(&context, dtype)? {
            d @ (DType::F32 | DType::I32) => d,
            other => {
                return Err(PyValueError::new_err(format!(
                    "{context}: dtype {} is not supported (float32 or int32)",
                    dtype_name(other)
                )))
            }
        };
        check_shape(&context, &shape)?;
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
        check_shape(&format!("parameter {name}"), &shape)?;
        let id = self
            .builder
            .parameter(name, &shape, init)
            .map_err(graph_err)?;
        self.traced(id)
    }

    /// Adds node `name` applying op `kind` (one of `OPS`) to the values `inputs`, with its
    /// attributes as keyword arguments (`transpose_b=True`, `axes=[1]`, `dtype="float16"`);
    /// returns every output as `(id, shape, dtype)` (Split and LayerNorm have several).
    #[pyo3(signature = (kind, name, inputs, **attrs))]
    fn op(
        &mut self,
        kind: &str,
        name: &str,
        inputs: Vec<usize>,
        attrs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<(usize, Vec<usize>, String)>> {
        if let Some(n) = arity(kind) {
            if inputs.len() != n {
                return Err(PyValueError::new_err(format!(
                    "{name}: {kind} takes {n} input(s), got {}",
                    inputs.len()
                )));
            }
        }
        let v: Vec<ValueId> = inputs.into_iter().map(ValueId).collect();
        let attrs = Attrs {
            node: name,
            kind,
            dict: attrs,
        };
        let outputs = self.add_op(kind, name, &v, &attrs)?;
        outputs
            .into_iter()
            .map(|id| {
                let value = self.builder.value(id).map_err(graph_err)?;
                // An output too large to address (OneHot's depth, a broadcast) stops the trace
                // here, before any later shape arithmetic overflows on it.
                check_shape(&format!("{name} ({kind}) output"), &value.shape)?;
                Ok((
                    id.0,
                    value.shape.clone(),
                    dtype_name(value.dtype).to_string(),
                ))
            })
            .collect()
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
