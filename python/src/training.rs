//! Training and planning from Python over the `runtime` crate, as `tessera train` and
//! `tessera train --explain` drive a `runtime::Training`, returning data instead of printing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use parallel::StepSummary;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use runtime::{LaunchOptions, TrainConfig, Training};

use crate::errors::{runtime_err, with_culprit, ConfigError};

/// Adds the functions of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(train, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    Ok(())
}

/// A configuration from a TOML file (`path`) or TOML text (`text`, relative paths against the
/// current directory), with `overrides` (`section.key=value`) and a device count applied.
fn load_config(
    path: Option<&Path>,
    text: Option<&str>,
    overrides: &[String],
    devices: Option<usize>,
) -> PyResult<TrainConfig> {
    match (path, text) {
        (Some(path), _) => TrainConfig::load_on(path, overrides, devices).map_err(|e| match e {
            // Reading the config file itself: an OS error on the config, not a checkpoint's.
            runtime::RuntimeError::Io { path: p, source } if p == path => {
                config_file_err(&p, &source)
            }
            other => runtime_err(other),
        }),
        (None, text) => {
            let base = std::env::current_dir().map_err(|source| {
                runtime_err(runtime::RuntimeError::Io {
                    path: PathBuf::from("."),
                    source,
                })
            })?;
            TrainConfig::parse_on(text.unwrap_or(""), None, overrides, devices, &base)
                .map_err(runtime_err)
        }
    }
}

/// The config file `path` could not be read: the `OSError` subclass of the OS error
/// (`FileNotFoundError`, `IsADirectoryError`, `PermissionError`, …) with `filename` set, or a
/// `ConfigError` naming the file (an error without an OS error number, e.g. not UTF-8 text).
fn config_file_err(path: &Path, source: &std::io::Error) -> PyErr {
    let file = path.display().to_string();
    match source.raw_os_error() {
        Some(errno) => {
            // `OSError(errno, strerror, filename)` is created as the subclass of `errno`.
            let text = source.to_string();
            let strerror = text
                .strip_suffix(&format!(" (os error {errno})"))
                .unwrap_or(&text);
            pyo3::exceptions::PyOSError::new_err((
                errno,
                format!("reading the training config: {strerror}"),
                file,
            ))
        }
        None => with_culprit(
            ConfigError::new_err(format!("config file {file}: {source}")),
            Some(file),
            None,
            source.to_string(),
        ),
    }
}

/// Trains as `tessera train` does (ranks as threads); returns the metrics as a dict.
#[pyfunction]
#[pyo3(signature = (path=None, text=None, devices=None, overrides=Vec::new(), log_json=None, print_loss=false, timeout=300.0))]
#[allow(clippy::too_many_arguments)]
fn train<'py>(
    py: Python<'py>,
    path: Option<PathBuf>,
    text: Option<String>,
    devices: Option<usize>,
    overrides: Vec<String>,
    log_json: Option<PathBuf>,
    print_loss: bool,
    timeout: f64,
) -> PyResult<Bound<'py, PyDict>> {
    // At most a week, as `tessera train --timeout`: a larger one would overflow the wait's
    // `Duration` (a panic, not an error).
    if !(timeout.is_finite() && timeout > 0.0 && timeout <= 604_800.0) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "timeout {timeout} must be a positive number of seconds, at most 604800 (a week)"
        )));
    }
    let config = load_config(path.as_deref(), text.as_deref(), &overrides, devices)?;
    let mut warnings = config.warnings();
    let out_dir = config.output().dir.clone();
    let saved = config.output().save_checkpoint;
    let metrics_log = log_json.unwrap_or_else(|| config.output().metrics_file());
    let report = py
        .detach(|| {
            runtime::allocator::keep_freed_memory();
            let options = LaunchOptions {
                print_loss,
                metrics_log: Some(metrics_log.clone()),
                timeout: Duration::from_secs_f64(timeout),
                mpi_watchdog: false,
                trace: false,
                // A Python caller keeps its interpreter: a hung rank is not ended by exiting.
                exit_on_hung_rank: false,
            };
            let training = Training::from_config(&config)?;
            // What the compiled program caps or skips beyond the configuration's warnings.
            let compiled = training.session().warnings();
            let report = training.options(options).train_local()?;
            Ok::<_, runtime::RuntimeError>((report, compiled))
        })
        .map_err(runtime_err)?;
    let (report, compiled) = report;
    warnings.extend(compiled);
    let d = PyDict::new(py);
    d.set_item("devices", report.devices)?;
    d.set_item("steps", report.losses().len())?;
    d.set_item("losses", report.losses())?;
    d.set_item("accuracies", report.accuracies())?;
    d.set_item("eval_losses", report.eval_losses())?;
    let step_ms = report.ranks.first().map(|r| r.step_ms.clone());
    d.set_item("step_ms", step_ms.unwrap_or_default())?;
    d.set_item("pipeline_bubble", report.pipeline_bubble())?;
    d.set_item("output_dir", out_dir.display().to_string())?;
    d.set_item("checkpoint_saved", saved)?;
    d.set_item("metrics_log", metrics_log.display().to_string())?;
    d.set_item("warnings", warnings)?;
    Ok(d)
}

/// The parallel plan of a configuration, as `tessera train --explain` prints it, as a dict:
/// every parameter's layout and slice, every step (kernels and inserted communication with
/// reason and bytes per step), and the explain text itself.
#[pyfunction]
#[pyo3(signature = (path=None, text=None, devices=None, overrides=Vec::new()))]
fn plan<'py>(
    py: Python<'py>,
    path: Option<PathBuf>,
    text: Option<String>,
    devices: Option<usize>,
    overrides: Vec<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let config = load_config(path.as_deref(), text.as_deref(), &overrides, devices)?;
    let training = py
        .detach(|| Training::from_config(&config))
        .map_err(runtime_err)?;
    let session = training.session();
    let summary = session.train.summary();
    let params = PyList::empty(py);
    for p in &summary.params {
        let d = PyDict::new(py);
        d.set_item("name", &p.name)?;
        d.set_item("shape", &p.shape)?;
        d.set_item("layout", &p.layout)?;
        d.set_item("mesh", &p.mesh)?;
        d.set_item("slice_shape", &p.slice_shape)?;
        d.set_item("replicas", p.replicas)?;
        d.set_item("trainable", p.trainable)?;
        d.set_item("optimizer_sharded", p.optimizer_sharded)?;
        params.append(d)?;
    }
    let steps = PyList::empty(py);
    for step in &summary.steps {
        let d = PyDict::new(py);
        match step {
            StepSummary::Kernel { name } => {
                d.set_item("kind", "kernel")?;
                d.set_item("name", name)?;
            }
            StepSummary::Reshard {
                value,
                communication,
                bytes,
                reason,
            } => {
                d.set_item("kind", "reshard")?;
                d.set_item("value", value)?;
                d.set_item("communication", communication)?;
                d.set_item("bytes", bytes)?;
                d.set_item("reason", reason)?;
            }
        }
        steps.append(d)?;
    }
    let d = PyDict::new(py);
    d.set_item("mode", summary.mode)?;
    d.set_item("devices", summary.devices)?;
    d.set_item("bytes_per_step", summary.bytes_per_step)?;
    d.set_item("reshards", summary.reshards)?;
    d.set_item("params", params)?;
    d.set_item("steps", steps)?;
    d.set_item("pipelined", session.is_pipelined())?;
    d.set_item(
        "explain",
        session.train.explain_with(session.deterministic_blocks()),
    )?;
    Ok(d)
}
