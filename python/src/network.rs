//! Networks written in Python (`tessera.nn.Cell`s): the tracing backend and their training.
//!
//! - [`NetworkBuilder`] (`tessera._tessera.NetworkBuilder`) wraps a [`graph::GraphBuilder`]:
//!   `construct` runs once on symbolic tensors (`tessera.ops`), and every op it applies adds a
//!   node here, checked at once (shapes and dtypes); each call returns the new value's id and
//!   shape.
//! - [`train_network`] trains the traced network with [`runtime::Trainer`] on numpy arrays (an
//!   in-memory [`runtime::Dataset`], [`NumpyDataset`]), ranks as threads with the GIL released,
//!   calling a Python function at every step end (with the GIL re-acquired). An exception in
//!   that function stops training and is re-raised to the caller.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use graph::models::Model;
use graph::{FanMode, GraphBuilder, Initializer, ValueId};
use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use parallel::{ParallelConfig, ParallelMode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runtime::{
    Callback, Dataset, OptimizerConfig, OptimizerKind, RuntimeError, SampleSpec, StepInfo, Trainer,
};
use tensor::{DType, Tensor};

use crate::errors::runtime_err;

/// Adds the class and function of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NetworkBuilder>()?;
    m.add_function(wrap_pyfunction!(train_network, m)?)?;
    Ok(())
}

/// A graph error as `ValueError`; the message names the node or value and the rule broken.
fn graph_err(e: graph::GraphError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The graph a network's `construct` is traced into (`tessera._tessera.NetworkBuilder`).
/// Values are addressed by their integer ids; every method returns `(id, shape)`.
#[pyclass(module = "tessera._tessera")]
pub struct NetworkBuilder {
    builder: GraphBuilder,
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

/// Samples held in memory: one row of `inputs` (f32) and one label (i32) per sample.
#[derive(Debug)]
pub struct NumpyDataset {
    inputs: Vec<f32>,
    sample_shape: Vec<usize>,
    labels: Vec<i32>,
}

impl NumpyDataset {
    fn sample_len(&self) -> usize {
        self.sample_shape.iter().product()
    }

    fn check(&self, indices: &[usize]) -> Result<(), RuntimeError> {
        match indices.iter().find(|&&i| i >= self.labels.len()) {
            Some(i) => Err(RuntimeError::Config {
                key: "dataset".to_string(),
                reason: format!("sample {i} is past the end ({} samples)", self.labels.len()),
            }),
            None => Ok(()),
        }
    }
}

impl Dataset for NumpyDataset {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn input_spec(&self) -> SampleSpec {
        SampleSpec {
            shape: self.sample_shape.clone(),
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
        self.check(indices)?;
        let n = self.sample_len();
        let mut data = Vec::with_capacity(indices.len() * n);
        for &i in indices {
            data.extend_from_slice(&self.inputs[i * n..(i + 1) * n]);
        }
        let mut shape = vec![indices.len()];
        shape.extend_from_slice(&self.sample_shape);
        Ok(Tensor::from_vec(&shape, data)?)
    }

    fn read_labels(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        self.check(indices)?;
        let data = indices.iter().map(|&i| self.labels[i]).collect();
        Ok(Tensor::from_vec(&[indices.len()], data)?)
    }
}

/// Calls a Python function `(epoch, step_in_epoch, global_step, loss)` at every step end (on
/// rank 0), holding the GIL only for the call. Its first exception is kept for the caller and
/// stops training.
struct PyStepCallback {
    function: Py<PyAny>,
    error: Arc<Mutex<Option<PyErr>>>,
}

impl Callback for PyStepCallback {
    fn on_step_end(&mut self, step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        let args = (step.epoch, step.step_in_epoch, step.global_step, step.loss);
        let result = Python::attach(|py| self.function.call1(py, args).map(drop));
        match result {
            Ok(()) => Ok(()),
            Err(err) => {
                let reason = format!("a callback raised {err}; training stops");
                *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(err);
                Err(RuntimeError::Config {
                    key: "callbacks".to_string(),
                    reason,
                })
            }
        }
    }
}

/// The optimizer named as MindSpore's class (`SGD`, `Momentum`, `Adam`, `AdamWeightDecay`).
fn optimizer_config(
    name: &str,
    learning_rate: f64,
    momentum: f64,
    use_nesterov: bool,
    betas: (f64, f64, f64),
    weight_decay: f64,
) -> PyResult<OptimizerConfig> {
    let (beta1, beta2, eps) = betas;
    let kind = match name {
        "SGD" => OptimizerKind::Sgd,
        "Momentum" => OptimizerKind::Momentum {
            momentum,
            use_nesterov,
        },
        "Adam" => OptimizerKind::Adam { beta1, beta2, eps },
        "AdamWeightDecay" => OptimizerKind::AdamW { beta1, beta2, eps },
        other => {
            return Err(PyValueError::new_err(format!(
                "optimizer {other} is not supported (SGD, Momentum, Adam, AdamWeightDecay)"
            )))
        }
    };
    Ok(OptimizerConfig {
        kind,
        learning_rate,
        weight_decay,
    })
}

/// Trains the network traced into `builder` (its values `input`, `labels`, `logits`, `loss`)
/// on `inputs` (f32, `[samples, ..sample shape]`) and `labels` (i32, `[samples]`), on
/// `devices` ranks (threads) under semi-auto parallel with `strategies` (`[(op name, [[..],
/// ..])]`, as `ParallelConfig::shard` takes them). Calls `callback(epoch, step_in_epoch,
/// global_step, loss)` after every step; returns every step's loss.
#[pyfunction]
#[pyo3(signature = (
    builder, input, labels, logits, loss, inputs, label_data, *,
    devices=1, strategies=Vec::new(), epochs=1, max_steps=None, optimizer="Momentum",
    learning_rate=0.05, momentum=0.9, use_nesterov=false, beta1=0.9, beta2=0.999, eps=1e-8,
    weight_decay=0.0, seed=1, deterministic=false, shuffle=true, callback=None, output_dir=None,
))]
#[allow(clippy::too_many_arguments)]
fn train_network(
    py: Python<'_>,
    builder: &NetworkBuilder,
    input: usize,
    labels: usize,
    logits: usize,
    loss: usize,
    inputs: PyReadonlyArrayDyn<'_, f32>,
    label_data: PyReadonlyArrayDyn<'_, i32>,
    devices: usize,
    strategies: Vec<(String, Vec<Vec<usize>>)>,
    epochs: usize,
    max_steps: Option<u64>,
    optimizer: &str,
    learning_rate: f64,
    momentum: f64,
    use_nesterov: bool,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    seed: u64,
    deterministic: bool,
    shuffle: bool,
    callback: Option<Py<PyAny>>,
    output_dir: Option<PathBuf>,
) -> PyResult<Vec<f32>> {
    let shape = inputs.shape().to_vec();
    let (samples, sample_shape) = match shape.split_first() {
        Some((&n, rest)) => (n, rest.to_vec()),
        None => return Err(PyValueError::new_err("inputs must have a sample dim")),
    };
    if label_data.shape() != [samples] {
        return Err(PyValueError::new_err(format!(
            "labels have shape {:?}; expected [{samples}], one per input sample",
            label_data.shape()
        )));
    }
    let dataset = NumpyDataset {
        inputs: inputs.as_array().iter().copied().collect(),
        sample_shape,
        labels: label_data.as_array().iter().copied().collect(),
    };
    let optimizer = optimizer_config(
        optimizer,
        learning_rate,
        momentum,
        use_nesterov,
        (beta1, beta2, eps),
        weight_decay,
    )?;
    let model = Model {
        graph: builder.builder.clone().finish(),
        input: ValueId(input),
        labels: ValueId(labels),
        logits: ValueId(logits),
        loss: ValueId(loss),
    };
    let mode = match devices {
        1 => ParallelMode::StandAlone,
        _ => ParallelMode::SemiAuto,
    };
    let mut parallel = ParallelConfig::new(mode, devices);
    for (op, strategy) in &strategies {
        let rows: Vec<&[usize]> = strategy.iter().map(Vec::as_slice).collect();
        parallel = parallel.shard(op, &rows);
    }
    let error = Arc::new(Mutex::new(None));
    let mut trainer = Trainer::with_dataset(model, parallel, dataset)
        .optimizer(optimizer)
        .epochs(epochs)
        .seed(seed)
        .deterministic(deterministic)
        .shuffle(shuffle)
        .print_loss(false);
    if let Some(steps) = max_steps {
        trainer = trainer.max_steps(steps);
    }
    if let Some(dir) = output_dir {
        trainer = trainer.output_dir(dir);
    }
    if let Some(function) = callback {
        trainer = trainer.callback(PyStepCallback {
            function,
            error: error.clone(),
        });
    }
    let report = py.detach(|| {
        runtime::allocator::keep_freed_memory();
        trainer.train()
    });
    if let Some(err) = error.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(err);
    }
    Ok(report.map_err(runtime_err)?.losses().to_vec())
}
