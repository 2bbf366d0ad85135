//! Training and running networks written in Python (`tessera.nn.Cell`s), traced into a
//! [`NetworkBuilder`].
//!
//! - [`train_network`] trains the traced network on numpy arrays (an in-memory
//!   [`runtime::Dataset`], [`NumpyDataset`]) with a configuration of the sections a config
//!   file holds (`[parallel]`, `[train]`, `[output]`, as JSON), ranks as threads with the GIL
//!   released or, under `tessera launch`, this process as one MPI rank
//!   ([`crate::distributed`]). It calls a Python function at every step end (with the GIL
//!   re-acquired); an exception in that function stops training and is re-raised to the
//!   caller. A run may resume from an earlier run's checkpoint set (`output.resume_from`); it
//!   returns the set it saved last.
//! - [`read_parameters`] reads whole parameters back from such a set (`ckpt::load_rank_tensors`
//!   with unsplit target layouts), [`forward_network`] runs the traced network forward only on
//!   one device ([`graph::Executor`]) with given parameter values (`Model.eval`);
//!   [`forward_outputs`] feeds several inputs and returns several outputs per batch (an
//!   `eval_network`'s loss, logits and label).
//! - [`initial_values`] computes the values a training run starts the traced parameters from
//!   (their initializers under a seed, as every rank fills its shard), without training.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use graph::models::Model;
use graph::{Executor, ValueId};
use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runtime::{
    Callback, CallbackList, DataConfig, DataFormat, Dataset, LaunchOptions, ModelConfig, ModelName,
    Normalize, RuntimeError, SampleSpec, StepInfo, TrainConfig, TrainSession,
};
use tensor::{DType, Tensor};

use crate::arrays::collect_array;
use crate::builder::{graph_err, NetworkBuilder};
use crate::errors::runtime_err;

/// Adds the class and functions of this module and of [`crate::builder`].
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NetworkBuilder>()?;
    m.add_function(wrap_pyfunction!(train_network, m)?)?;
    m.add_function(wrap_pyfunction!(read_parameters, m)?)?;
    m.add_function(wrap_pyfunction!(forward_network, m)?)?;
    m.add_function(wrap_pyfunction!(forward_outputs, m)?)?;
    m.add_function(wrap_pyfunction!(initial_values, m)?)?;
    Ok(())
}

/// One column of samples held in memory: f32 (images, features, regression targets) or i32
/// (token ids, class labels), `shape` per sample.
#[derive(Debug)]
pub enum Column {
    /// f32 elements.
    F32(Vec<f32>),
    /// i32 elements.
    I32(Vec<i32>),
}

impl Column {
    /// A numpy array of float32 or int32 as a column; `what` names it in the error.
    fn from_array(array: &Bound<'_, PyAny>, what: &str) -> PyResult<(Column, Vec<usize>)> {
        if let Ok(a) = array.extract::<PyReadonlyArrayDyn<'_, f32>>() {
            let data = collect_array(what, a.len(), a.as_array().iter().copied())?;
            return Ok((Column::F32(data), a.shape().to_vec()));
        }
        if let Ok(a) = array.extract::<PyReadonlyArrayDyn<'_, i32>>() {
            let data = collect_array(what, a.len(), a.as_array().iter().copied())?;
            return Ok((Column::I32(data), a.shape().to_vec()));
        }
        Err(PyValueError::new_err(format!(
            "{what} must be a numpy array of float32 or int32"
        )))
    }

    fn dtype(&self) -> DType {
        match self {
            Column::F32(_) => DType::F32,
            Column::I32(_) => DType::I32,
        }
    }

    /// The samples `indices` (each `n` elements) as a tensor of `[indices.len(), ..shape]`.
    fn rows(&self, indices: &[usize], shape: &[usize]) -> Result<Tensor, RuntimeError> {
        fn gather<T: Copy>(data: &[T], indices: &[usize], n: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(indices.len() * n);
            for &i in indices {
                out.extend_from_slice(&data[i * n..(i + 1) * n]);
            }
            out
        }
        let n: usize = shape.iter().product();
        let mut full = vec![indices.len()];
        full.extend_from_slice(shape);
        Ok(match self {
            Column::F32(data) => Tensor::from_vec(&full, gather(data, indices, n))?,
            Column::I32(data) => Tensor::from_vec(&full, gather(data, indices, n))?,
        })
    }
}

/// The most columns a data set given to [`train_network`] may have (each one a graph input).
pub const MAX_COLUMNS: usize = 1024;

/// One column of a [`NumpyDataset`]: its elements, the shape of one sample and its name (for
/// errors).
#[derive(Debug)]
struct NumpyColumn {
    data: Column,
    shape: Vec<usize>,
    name: String,
}

/// Samples held in memory: one row of every column per sample (MindSpore's dataset columns,
/// fed positionally to the network), each of its column's dtype and per-sample shape. Column 0
/// is the [`Dataset`]'s input and column 1 (if any) its label.
#[derive(Debug)]
pub struct NumpyDataset {
    columns: Vec<NumpyColumn>,
    samples: usize,
}

impl NumpyDataset {
    fn check(&self, column: &NumpyColumn, indices: &[usize]) -> Result<(), RuntimeError> {
        match indices.iter().find(|&&i| i >= self.samples) {
            Some(i) => Err(RuntimeError::Config {
                key: format!("dataset column {}", column.name),
                reason: format!("sample {i} is past the end ({} samples)", self.samples),
            }),
            None => Ok(()),
        }
    }

    fn spec(&self, j: usize) -> SampleSpec {
        let c = &self.columns[j.min(self.columns.len() - 1)];
        SampleSpec {
            shape: c.shape.clone(),
            dtype: c.data.dtype(),
        }
    }
}

impl Dataset for NumpyDataset {
    fn len(&self) -> usize {
        self.samples
    }

    fn input_spec(&self) -> SampleSpec {
        self.spec(0)
    }

    fn label_spec(&self) -> SampleSpec {
        self.spec(1)
    }

    fn read_inputs(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        self.read_column(0, indices)
    }

    fn read_labels(&self, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        self.read_column(1, indices)
    }

    fn columns(&self) -> usize {
        self.columns.len()
    }

    fn column_spec(&self, column: usize) -> Option<SampleSpec> {
        (column < self.columns.len()).then(|| self.spec(column))
    }

    fn read_column(&self, column: usize, indices: &[usize]) -> Result<Tensor, RuntimeError> {
        let c = self
            .columns
            .get(column)
            .ok_or_else(|| RuntimeError::Mismatch {
                what: format!("column {column} of the data set"),
                expected: format!("a column below {}", self.columns.len()),
                got: format!("column {column}"),
            })?;
        self.check(c, indices)?;
        c.data.rows(indices, &c.shape)
    }
}

/// Calls a Python function `(epoch, step_in_epoch, global_step, loss, lr)` at every step end (on
/// rank 0), holding the GIL only for the call. Its first exception is kept for the caller and
/// stops training.
struct PyStepCallback {
    function: Py<PyAny>,
    error: Arc<Mutex<Option<PyErr>>>,
}

impl Callback for PyStepCallback {
    fn on_step_end(&mut self, step: &StepInfo<'_>) -> Result<(), RuntimeError> {
        let args = (
            step.epoch,
            step.step_in_epoch,
            step.global_step,
            step.loss,
            step.lr,
        );
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
/// Trains the network traced into `builder` on a data set of columns fed positionally:
/// `data[j]` (f32 or i32, `[samples, ..sample shape]`; `names[j]` names it in errors) into the
/// graph input `inputs[j]` (MindSpore's dataset columns given to `construct(c1, ..., ck)`; a
/// `WithLossCell`'s are the data and the label). The network's loss is the scalar `loss`;
/// `logits` is the value whose last dim counts the classes (the backbone's output; a loss cell
/// of one's own passes its loss). Batches of `batch_size` samples (default: the first input's
/// first dim; the graph's inputs are one micro-batch of it), with `config`: a JSON document of
/// the `[parallel]`, `[train]` and `[output]` sections a config file holds (docs/CONFIG.md;
/// `Model.train` and `AutoParallel` write it), read and checked as a file's are
/// ([`TrainConfig::for_network`]). `backend` is `"local"` (`parallel.devices` ranks as threads
/// of this process) or `"mpi"` (this process is one rank of the `mpirun` job
/// `tessera.communication.init()` joined). Calls `callback(epoch, step_in_epoch, global_step,
/// loss, lr)` after every step; returns every step's loss, the checkpoint set saved last, if
/// any, and the engine's warnings (a setting given that has no effect, or that the compiled
/// program caps: `TrainConfig::warnings` and `TrainSession::warnings`, what `tessera train`
/// prints), for the caller to show. Every graph input must be fed one column (at most
/// [`MAX_COLUMNS`]), of the shape and dtype it takes.
#[pyfunction]
#[pyo3(signature = (
    builder, inputs, logits, loss, data, config, *,
    names=None, batch_size=None, shuffle=true, backend="local", callback=None,
))]
#[allow(clippy::too_many_arguments)]
fn train_network(
    py: Python<'_>,
    builder: &NetworkBuilder,
    inputs: Vec<usize>,
    logits: usize,
    loss: usize,
    data: Vec<Bound<'_, PyAny>>,
    config: &str,
    names: Option<Vec<String>>,
    batch_size: Option<usize>,
    shuffle: bool,
    backend: &str,
    callback: Option<Py<PyAny>>,
) -> PyResult<(Vec<f32>, Option<PathBuf>, Vec<String>)> {
    let count = builder.builder.graph().values().len();
    if inputs.is_empty() || inputs.len() > MAX_COLUMNS {
        return Err(PyValueError::new_err(format!(
            "inputs: {} graph inputs; a network takes 1 to {MAX_COLUMNS} columns",
            inputs.len()
        )));
    }
    if data.len() != inputs.len() {
        return Err(PyValueError::new_err(format!(
            "data: {} column(s) for {} graph input(s); each input takes one column",
            data.len(),
            inputs.len()
        )));
    }
    let names = names.unwrap_or_else(|| (0..inputs.len()).map(|j| format!("column {j}")).collect());
    if names.len() != inputs.len() {
        return Err(PyValueError::new_err(format!(
            "names: {} name(s) for {} column(s)",
            names.len(),
            inputs.len()
        )));
    }
    let checked = inputs
        .iter()
        .enumerate()
        .map(|(j, &id)| (format!("inputs[{j}]"), id))
        .chain([("logits".to_string(), logits), ("loss".to_string(), loss)]);
    for (what, id) in checked {
        if id >= count {
            return Err(PyValueError::new_err(format!(
                "{what}: value {id} is not in the traced network ({count} values)"
            )));
        }
    }
    let mut columns = Vec::with_capacity(inputs.len());
    let mut samples = None;
    for ((array, name), &id) in data.iter().zip(&names).zip(&inputs) {
        let (column, full) = Column::from_array(array, &format!("column {name}"))?;
        let (n, shape) = match full.split_first() {
            Some((&n, rest)) => (n, rest.to_vec()),
            None => {
                return Err(PyValueError::new_err(format!(
                    "column {name} must have a sample dim"
                )))
            }
        };
        let first = *samples.get_or_insert(n);
        if n != first {
            return Err(PyValueError::new_err(format!(
                "column {name} has shape {full:?}; expected [{first}, ...], one row per sample \
                 of column {}",
                names[0]
            )));
        }
        // The arrays must be what the traced graph takes (its first dim is the batch): found
        // here, before any rank starts, where the runtime would fail its first step.
        let value = builder.builder.value(ValueId(id)).map_err(graph_err)?;
        let takes = value.shape.get(1..).unwrap_or(&[]);
        if value.shape.is_empty() || takes != shape.as_slice() || value.dtype != column.dtype() {
            return Err(PyValueError::new_err(format!(
                "column {name}: samples of shape {shape:?} and dtype {}, but the network's \
                 value `{}` {:?} takes samples of shape {takes:?} and dtype {}",
                column.dtype(),
                value.name,
                value.shape,
                value.dtype
            )));
        }
        columns.push(NumpyColumn {
            data: column,
            shape,
            name: name.clone(),
        });
    }
    let samples = samples.unwrap_or(0);
    if batch_size == Some(0) {
        return Err(PyValueError::new_err(
            "batch_size is 0; a batch holds at least one sample",
        ));
    }
    if let Some(f) = &callback {
        if !f.bind(py).is_callable() {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "callback must be callable, but got {}",
                f.bind(py).get_type().name()?
            )));
        }
    }
    let dataset = NumpyDataset { columns, samples };
    let ids: Vec<ValueId> = inputs.iter().map(|&id| ValueId(id)).collect();
    let model = Model {
        graph: builder.builder.clone().finish(),
        input: ids[0],
        // The labels of a loss cell of one's own are just another column: nothing reads the
        // model's labels but a test set's accuracy, which this run has not.
        labels: *ids.last().unwrap_or(&ids[0]),
        logits: ValueId(logits),
        loss: ValueId(loss),
    };
    let config = network_config(&model, config, batch_size, shuffle)?;
    let error = Arc::new(Mutex::new(None));
    let mut callbacks = CallbackList::new();
    if let Some(function) = callback {
        callbacks.push(Box::new(PyStepCallback {
            function,
            error: error.clone(),
        }));
    }
    let options = LaunchOptions {
        print_loss: false,
        metrics_log: Some(config.output().metrics_file()),
        ..LaunchOptions::default()
    };
    let mpi = match backend {
        "local" => false,
        "mpi" => true,
        other => {
            return Err(PyValueError::new_err(format!(
                "backend {other:?} is not one of \"local\", \"mpi\""
            )))
        }
    };
    let mut warnings = config.warnings();
    let report = py.detach(|| {
        runtime::allocator::keep_freed_memory();
        let session = TrainSession::with_columns(&config, model, ids, Arc::new(dataset), None)?;
        let compiled = session.warnings();
        let report = if mpi {
            crate::distributed::train_rank(&session, &options, callbacks)
        } else {
            runtime::train_local_with(&session, &options, callbacks)
        };
        report.map(|report| (report, compiled))
    });
    if let Some(err) = error.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(err);
    }
    let (report, compiled) = report.map_err(runtime_err)?;
    warnings.extend(compiled);
    let losses = report.losses().to_vec();
    let saved = runtime::periodic_ckpt::latest_set(&config.output().dir);
    Ok((losses, saved, warnings))
}

/// The training configuration of `model` from `json` (the `[parallel]`, `[train]` and
/// `[output]` sections), its classes the logits' last dim, its `data.batch_size` `batch_size`
/// (default: the input's first dim), which the configuration's pipeline micro-batches and
/// interleaved parts then cut, as they cut a file's.
fn network_config(
    model: &Model,
    json: &str,
    batch_size: Option<usize>,
    shuffle: bool,
) -> PyResult<TrainConfig> {
    let root: toml::Table = serde_json::from_str(json)
        .map_err(|e| PyValueError::new_err(format!("the training configuration: {e}")))?;
    let dim = |v: ValueId, first: bool| {
        let shape = &model.graph.values()[v.0].shape;
        (if first { shape.first() } else { shape.last() })
            .copied()
            .unwrap_or(1)
    };
    let model_config = ModelConfig {
        name: ModelName::Custom,
        hidden: 0,
        classes: dim(model.logits, false),
        gpt: None,
    };
    let data = DataConfig {
        format: DataFormat::Idx,
        dir: PathBuf::new(),
        batch_size: batch_size.unwrap_or_else(|| dim(model.input, true)),
        shuffle,
        pixel_max: None,
        normalize: Normalize::Standardize,
        text: None,
        batch_cuts: Vec::new(),
    };
    let base = std::env::current_dir().unwrap_or_default();
    TrainConfig::for_network(root, &base, model_config, data).map_err(runtime_err)
}

/// The whole tensors `names` (f32) of the checkpoint set in `ckpt_dir` (saved by a run of
/// [`train_network`], with its `strategy.json`), gathered from every rank's pieces.
#[pyfunction]
fn read_parameters<'py>(
    py: Python<'py>,
    ckpt_dir: PathBuf,
    names: Vec<(String, Vec<usize>)>,
) -> PyResult<Vec<Bound<'py, PyArrayDyn<f32>>>> {
    let mesh =
        layout::Mesh::new(&[1], &["d"], None).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let layouts: Vec<layout::TensorLayout> = names
        .iter()
        .map(|(name, shape)| {
            crate::builder::check_shape(name, shape)?;
            let whole = layout::Layout::replicated(mesh.clone(), shape.len());
            layout::TensorLayout::new(whole, shape)
                .map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
        })
        .collect::<PyResult<_>>()?;
    let targets: Vec<(&str, &layout::TensorLayout)> = names
        .iter()
        .zip(&layouts)
        .map(|((n, _), l)| (n.as_str(), l))
        .collect();
    let strategy = ckpt_dir.join("strategy.json");
    let tensors = py
        .detach(|| ckpt::load_rank_tensors(&ckpt_dir, &strategy, 0, &targets))
        .map_err(|e| PyValueError::new_err(format!("{}: {e}", ckpt_dir.display())))?;
    let mut out = Vec::with_capacity(names.len());
    for (name, shape) in &names {
        let t = tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| {
                PyValueError::new_err(format!("{}: no tensor {name}", ckpt_dir.display()))
            })?;
        let data: Vec<f32> = t.to_f64_vec().into_iter().map(|x| x as f32).collect();
        let array = numpy::ndarray::ArrayD::from_shape_vec(shape.clone(), data)
            .map_err(|e| PyValueError::new_err(format!("{name}: {e}")))?;
        out.push(array.into_pyarray(py));
    }
    Ok(out)
}

/// The parameter values `[(value id, array)]` a forward run is given, as tensors (their sizes
/// checked before the copy is allocated).
fn parameter_tensors(
    params: &[(usize, PyReadonlyArrayDyn<'_, f32>)],
) -> PyResult<Vec<(ValueId, Tensor)>> {
    let mut values = Vec::with_capacity(params.len());
    for (id, array) in params {
        let what = format!("parameter value {id}");
        let data = collect_array(&what, array.len(), array.as_array().iter().copied())?;
        let t = Tensor::from_vec(array.shape(), data)
            .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
        values.push((ValueId(*id), t));
    }
    Ok(values)
}

/// Sets the executor's parameter `values`; a value of another shape than the graph's is an
/// error naming it.
fn set_parameters(exec: &mut Executor, values: &[(ValueId, Tensor)]) -> Result<(), String> {
    for (id, t) in values {
        let slot = exec.value_mut(*id).map_err(|e| e.to_string())?;
        if slot.shape() != t.shape() {
            return Err(format!(
                "parameter value {} has shape {:?}; the graph's is {:?}",
                id.0,
                t.shape(),
                slot.shape()
            ));
        }
        *slot = t.clone();
    }
    Ok(())
}

/// The value `output` of the network traced into `builder` for every sample of `inputs`
/// (f32 or i32, `[samples, ..sample shape]`), run forward only on one device by the engine's
/// executor with the parameters set to `params` (`[(value id, array)]`), batch by batch (the
/// input's first dim; the last batch is padded with copies of its first sample and the padding
/// dropped).
#[pyfunction]
fn forward_network<'py>(
    py: Python<'py>,
    builder: &NetworkBuilder,
    input: usize,
    output: usize,
    params: Vec<(usize, PyReadonlyArrayDyn<'py, f32>)>,
    inputs: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let graph = builder.builder.clone().finish();
    let in_shape = builder
        .builder
        .shape(ValueId(input))
        .map_err(graph_err)?
        .to_vec();
    let out_shape = builder
        .builder
        .shape(ValueId(output))
        .map_err(graph_err)?
        .to_vec();
    let batch = in_shape.first().copied().unwrap_or(1);
    if out_shape.first() != Some(&batch) {
        return Err(PyValueError::new_err(format!(
            "the output has shape {out_shape:?}; its first dim must be the batch ({batch}), one \
             row per input sample"
        )));
    }
    let out_row: usize = out_shape[1..].iter().product();
    let (data, shape) = Column::from_array(inputs, "inputs")?;
    if shape.len() != in_shape.len() || shape[1..] != in_shape[1..] {
        return Err(PyValueError::new_err(format!(
            "inputs have shape {shape:?}; the network takes samples of shape {:?}",
            &in_shape[1..]
        )));
    }
    let samples = shape[0];
    // The outputs of every sample: checked before any step runs (a huge output row times many
    // samples would otherwise abort the interpreter when the buffer is allocated).
    let total = samples.checked_mul(out_row).ok_or_else(|| {
        PyValueError::new_err(format!(
            "the output of {samples} samples of shape {:?} has more elements than fit in memory",
            &out_shape[1..]
        ))
    })?;
    let mut out_buffer: Vec<f32> = collect_array("the output", total, std::iter::empty())?;
    let values = parameter_tensors(&params)?;
    let result = py.detach(|| -> Result<Vec<f32>, String> {
        let mut exec =
            Executor::with_outputs(&graph, &[ValueId(output)]).map_err(|e| e.to_string())?;
        set_parameters(&mut exec, &values)?;
        let mut out = std::mem::take(&mut out_buffer);
        let mut start = 0;
        while start < samples {
            let n = batch.min(samples - start);
            let rows: Vec<usize> = (start..start + n)
                .chain(std::iter::repeat_n(start, batch - n))
                .collect();
            let t = data
                .rows(&rows, &in_shape[1..])
                .map_err(|e| e.to_string())?;
            exec.set_input(ValueId(input), &t)
                .map_err(|e| e.to_string())?;
            exec.run().map_err(|e| e.to_string())?;
            let y = exec.value(ValueId(output)).map_err(|e| e.to_string())?;
            let y = y.as_f32().map_err(|e| e.to_string())?;
            out.extend_from_slice(&y[..n * out_row]);
            start += n;
        }
        Ok(out)
    });
    let out = result.map_err(PyValueError::new_err)?;
    let mut full = vec![samples];
    full.extend_from_slice(&out_shape[1..]);
    let array = numpy::ndarray::ArrayD::from_shape_vec(full, out)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(array.into_pyarray(py))
}

/// One output's shape and its values over every batch, in order.
type ShapedValues = (Vec<usize>, Vec<f32>);

/// The values `outputs` of the network traced into `builder` for every batch of `columns`
/// (one f32 or i32 array `[samples, ..sample shape]` per graph input of `inputs`, in order),
/// run forward only on one device by the engine's executor with the parameters set to `params`
/// (`[(value id, array)]`): the samples cut into batches of the traced batch (the inputs'
/// first dim), which must divide them (no padding: a batch's loss would change), each output
/// returned as one array `[batches, ..its shape]` (a scalar loss gives one value per batch).
/// An input count, a column's shape or an output of another dtype than f32 that does not fit
/// is a `ValueError` naming it.
#[pyfunction]
fn forward_outputs<'py>(
    py: Python<'py>,
    builder: &NetworkBuilder,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    params: Vec<(usize, PyReadonlyArrayDyn<'py, f32>)>,
    columns: Vec<Bound<'py, PyAny>>,
) -> PyResult<Vec<Bound<'py, PyArrayDyn<f32>>>> {
    if inputs.len() != columns.len() || inputs.is_empty() {
        return Err(PyValueError::new_err(format!(
            "{} column(s) for {} graph input(s); one column per input is needed",
            columns.len(),
            inputs.len()
        )));
    }
    let graph = builder.builder.clone().finish();
    let mut fed = Vec::with_capacity(inputs.len());
    let mut batch = None;
    let mut samples = None;
    for (k, (&input, column)) in inputs.iter().zip(&columns).enumerate() {
        let in_shape = builder
            .builder
            .shape(ValueId(input))
            .map_err(graph_err)?
            .to_vec();
        let what = format!("column {k}");
        let (data, shape) = Column::from_array(column, &what)?;
        if shape.len() != in_shape.len() || shape.is_empty() || shape[1..] != in_shape[1..] {
            return Err(PyValueError::new_err(format!(
                "{what} has shape {shape:?}; the network takes samples of shape {:?}",
                in_shape.get(1..).unwrap_or(&[])
            )));
        }
        let b = in_shape[0];
        if *batch.get_or_insert(b) != b || *samples.get_or_insert(shape[0]) != shape[0] {
            return Err(PyValueError::new_err(format!(
                "{what} has {} samples in batches of {b}; every column and input must have the \
                 same",
                shape[0]
            )));
        }
        fed.push((ValueId(input), data, in_shape));
    }
    let (batch, samples) = (batch.unwrap_or(1), samples.unwrap_or(0));
    if batch == 0 || samples % batch != 0 {
        return Err(PyValueError::new_err(format!(
            "{samples} samples do not make whole batches of {batch}"
        )));
    }
    let runs = samples / batch;
    let mut shapes = Vec::with_capacity(outputs.len());
    for &output in &outputs {
        let shape = builder
            .builder
            .shape(ValueId(output))
            .map_err(graph_err)?
            .to_vec();
        let total = shape
            .iter()
            .try_fold(runs, |n, &d| n.checked_mul(d))
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "output {output} of {runs} batches of shape {shape:?} has more elements \
                     than fit in memory"
                ))
            })?;
        let buffer: Vec<f32> = collect_array("an output", total, std::iter::empty())?;
        shapes.push((shape, buffer));
    }
    let values = parameter_tensors(&params)?;
    let ids: Vec<ValueId> = outputs.iter().map(|&o| ValueId(o)).collect();
    let result = py.detach(|| -> Result<Vec<ShapedValues>, String> {
        let mut exec = Executor::with_outputs(&graph, &ids).map_err(|e| e.to_string())?;
        set_parameters(&mut exec, &values)?;
        for run in 0..runs {
            let rows: Vec<usize> = (run * batch..(run + 1) * batch).collect();
            for (id, data, in_shape) in &fed {
                let t = data
                    .rows(&rows, &in_shape[1..])
                    .map_err(|e| e.to_string())?;
                exec.set_input(*id, &t).map_err(|e| e.to_string())?;
            }
            exec.run().map_err(|e| e.to_string())?;
            for (id, (_, out)) in ids.iter().zip(shapes.iter_mut()) {
                let y = exec.value(*id).map_err(|e| e.to_string())?;
                let y = y.as_f32().map_err(|e| format!("output {}: {e}", id.0))?;
                out.extend_from_slice(y);
            }
        }
        Ok(shapes)
    });
    let shapes = result.map_err(PyValueError::new_err)?;
    let mut arrays = Vec::with_capacity(shapes.len());
    for (shape, out) in shapes {
        let mut full = vec![runs];
        full.extend_from_slice(&shape);
        let array = numpy::ndarray::ArrayD::from_shape_vec(full, out)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        arrays.push(array.into_pyarray(py));
    }
    Ok(arrays)
}

/// The values a training run of the network traced into `builder` under `seed` (the config's
/// `train.seed`) starts the parameters `ids` from, whole: each parameter's initializer filled
/// over its global tensor, as every rank fills its shard (`RankExecutor::init_parameters`;
/// element `i` of parameter `name` depends on `(seed, name, i)` only, so the whole tensor is
/// what any sharding's ranks hold together). Nothing is trained. A value that is not a
/// parameter is a `ValueError` naming it; one too large to allocate, a `MemoryError`.
#[pyfunction]
fn initial_values<'py>(
    py: Python<'py>,
    builder: &NetworkBuilder,
    ids: Vec<usize>,
    seed: u64,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let value = builder.builder.value(ValueId(id)).map_err(graph_err)?;
        let graph::ValueKind::Parameter { init, .. } = &value.kind else {
            return Err(PyValueError::new_err(format!(
                "value `{}` is {}, not a parameter; it has no initial value",
                value.name,
                value.kind.name()
            )));
        };
        let what = format!("the initial value of parameter {}", value.name);
        // `fill` allocates the box as f64 and then as the parameter's dtype, unchecked: both
        // are reserved first, so a huge parameter is a MemoryError, not an abort.
        let n: usize = value.shape.iter().product();
        let probe: Vec<f64> = collect_array(&what, n, std::iter::empty())?;
        let probe2: Vec<f64> = collect_array(&what, n, std::iter::empty())?;
        drop((probe, probe2));
        let full = layout::SliceBox::full(&value.shape);
        let (shape, dtype, name) = (value.shape.clone(), value.dtype, value.name.clone());
        let init = init.clone();
        let tensor = py
            .detach(|| init.fill(&shape, &full, dtype, seed, &name))
            .map_err(graph_err)?;
        out.push(crate::arrays::to_numpy(py, &tensor)?);
    }
    Ok(out)
}
