//! Training and running networks written in Python (`tessera.nn.Cell`s), traced into a
//! [`NetworkBuilder`].
//!
//! - [`train_network`] trains the traced network with [`runtime::Trainer`] on numpy arrays (an
//!   in-memory [`runtime::Dataset`], [`NumpyDataset`]), ranks as threads with the GIL released,
//!   calling a Python function at every step end (with the GIL re-acquired). An exception in
//!   that function stops training and is re-raised to the caller. A run may resume from an
//!   earlier run's checkpoint set (`output.resume_from`); it returns the set it saved.
//! - [`read_parameters`] reads whole parameters back from such a set (`ckpt::load_rank_tensors`
//!   with unsplit target layouts), [`forward_network`] runs the traced network forward only on
//!   one device ([`graph::Executor`]) with given parameter values (`Model.eval`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use graph::models::Model;
use graph::{Executor, ValueId};
use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use parallel::{ParallelConfig, ParallelMode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime::{
    Callback, CallbackList, Dataset, LaunchOptions, ResumeFrom, RuntimeError, SampleSpec, StepInfo,
    TrainConfig, TrainSession, Trainer,
};
use tensor::{DType, Tensor};

use crate::builder::{graph_err, NetworkBuilder};
use crate::errors::runtime_err;
use crate::optim::{optimizer_config, Recipe};

/// Adds the class and functions of this module and of [`crate::builder`].
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NetworkBuilder>()?;
    m.add_function(wrap_pyfunction!(train_network, m)?)?;
    m.add_function(wrap_pyfunction!(read_parameters, m)?)?;
    m.add_function(wrap_pyfunction!(forward_network, m)?)?;
    Ok(())
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
/// Trains the network traced into `builder` (its values `input`, `labels`, `logits`, `loss`)
/// on `inputs` (f32, `[samples, ..sample shape]`) and `labels` (i32, `[samples]`), on
/// `devices` ranks (threads) under semi-auto parallel with `strategies` (`[(op name, [[..],
/// ..])]`, as `ParallelConfig::shard` takes them). Calls `callback(epoch, step_in_epoch,
/// global_step, loss, lr)` after every step; returns every step's loss. `recipe` holds the
/// rest of the training recipe built in Python ([`Recipe`]: learning-rate schedule,
/// weight-decay filter, gradient clipping, periodic checkpoints).
#[pyfunction]
#[pyo3(signature = (
    builder, input, labels, logits, loss, inputs, label_data, *,
    devices=1, strategies=Vec::new(), epochs=1, max_steps=None, optimizer="Momentum",
    learning_rate=0.05, momentum=0.9, use_nesterov=false, beta1=0.9, beta2=0.999, eps=1e-8,
    weight_decay=0.0, seed=1, deterministic=false, shuffle=true, callback=None, output_dir=None, resume_from=None,
    recipe=None,
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
    resume_from: Option<PathBuf>,
    recipe: Option<&Bound<'_, PyDict>>,
) -> PyResult<(Vec<f32>, Option<PathBuf>)> {
    let recipe = Recipe::read(recipe)?;
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
    let mut trainer = Trainer::with_dataset(
        model.clone(),
        parallel.clone(),
        NumpyDataset {
            inputs: Vec::new(),
            sample_shape: Vec::new(),
            labels: Vec::new(),
        },
    )
    .optimizer(optimizer)
    .epochs(epochs)
    .seed(seed)
    .deterministic(deterministic)
    .shuffle(shuffle)
    .print_loss(false);
    if let Some(steps) = max_steps {
        trainer = trainer.max_steps(steps);
    }
    let out_dir = output_dir.clone();
    if let Some(dir) = output_dir {
        trainer = trainer.output_dir(dir);
    }
    // The Trainer's settings as a configuration, with `output.resume_from` set when the run
    // continues from an earlier one's checkpoint set (the Trainer has no setter for it).
    let base = trainer.config().map_err(runtime_err)?;
    let mut output = base.output().clone();
    output.resume_from = resume_from.map(ResumeFrom::Dir);
    let mut train = base.train().clone();
    recipe.apply_to_sections(&mut train, &mut output);
    let config = recipe.apply(
        TrainConfig::from_parts(
            base.model().clone(),
            base.data().clone(),
            parallel,
            optimizer,
            train,
            output,
        )
        .map_err(runtime_err)?,
    )?;
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
    let report = py.detach(|| {
        runtime::allocator::keep_freed_memory();
        let session = TrainSession::with_dataset(&config, model, Arc::new(dataset), None)?;
        runtime::train_local_with(&session, &options, callbacks)
    });
    if let Some(err) = error.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(err);
    }
    let losses = report.map_err(runtime_err)?.losses().to_vec();
    let saved = out_dir.and_then(|d| runtime::periodic_ckpt::latest_set(&d));
    Ok((losses, saved))
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
        .map(|(_, shape)| layout::TensorLayout::replicated(mesh.clone(), shape))
        .collect();
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

/// The value `output` of the network traced into `builder` for every sample of `inputs`
/// (f32, `[samples, ..sample shape]`), run forward only on one device by the engine's
/// executor with the parameters set to `params` (`[(value id, array)]`), batch by batch (the
/// input's first dim; the last batch is padded with zeros and the padding dropped).
#[pyfunction]
fn forward_network<'py>(
    py: Python<'py>,
    builder: &NetworkBuilder,
    input: usize,
    output: usize,
    params: Vec<(usize, PyReadonlyArrayDyn<'py, f32>)>,
    inputs: PyReadonlyArrayDyn<'py, f32>,
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
    let row: usize = in_shape[1..].iter().product();
    let out_row: usize = out_shape[1..].iter().product();
    let shape = inputs.shape().to_vec();
    if shape.len() != in_shape.len() || shape[1..] != in_shape[1..] {
        return Err(PyValueError::new_err(format!(
            "inputs have shape {shape:?}; the network takes samples of shape {:?}",
            &in_shape[1..]
        )));
    }
    let samples = shape[0];
    let data: Vec<f32> = inputs.as_array().iter().copied().collect();
    let mut values = Vec::with_capacity(params.len());
    for (id, array) in &params {
        let t = Tensor::from_vec(array.shape(), array.as_array().iter().copied().collect())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        values.push((ValueId(*id), t));
    }
    let result = py.detach(|| -> Result<Vec<f32>, String> {
        let mut exec =
            Executor::with_outputs(&graph, &[ValueId(output)]).map_err(|e| e.to_string())?;
        for (id, t) in &values {
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
        let mut out = Vec::with_capacity(samples * out_row);
        let mut start = 0;
        while start < samples {
            let n = batch.min(samples - start);
            let mut chunk = vec![0f32; batch * row];
            chunk[..n * row].copy_from_slice(&data[start * row..(start + n) * row]);
            let t = Tensor::from_vec(&in_shape, chunk).map_err(|e| e.to_string())?;
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
