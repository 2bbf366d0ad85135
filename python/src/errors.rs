//! Library errors as Python exceptions carrying the culprit: `file`, `tensor` and `rule`.

use std::path::Path;

use ckpt::CkptError;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    _tessera,
    CheckpointError,
    PyValueError,
    "Bad checkpoint, strategy or request. Attributes: `file` (the path at fault or None), \
     `tensor` (the tensor or parameter, or None) and `rule` (the rule broken)."
);
pyo3::create_exception!(
    _tessera,
    CheckpointIOError,
    PyOSError,
    "An operating-system error on a checkpoint file, with `file`, `tensor` (None) and `rule`."
);
pyo3::create_exception!(
    _tessera,
    ConfigError,
    PyValueError,
    "A training configuration that breaks a rule. Attributes: `file` (the config file or \
     None), `tensor` (the config key or op, or None) and `rule`."
);

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    m.add("CheckpointIOError", py.get_type::<CheckpointIOError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    Ok(())
}

/// The culprit of an error: file, tensor and rule.
struct Culprit<'a> {
    file: Option<&'a Path>,
    tensor: Option<&'a str>,
    rule: String,
}

fn culprit(e: &CkptError) -> Culprit<'_> {
    use CkptError as E;
    let rule = |r: &str| r.to_string();
    let (file, tensor, rule): (Option<&Path>, Option<&str>, String) = match e {
        E::Io { path, op, source } => (Some(path), None, format!("{op} failed: {source}")),
        E::StrategyParam {
            path,
            tensor,
            rule: r,
        }
        | E::TensorMissing {
            path,
            tensor,
            rule: r,
        }
        | E::CkptValue {
            path,
            tensor,
            rule: r,
        } => (Some(path), Some(tensor), rule(r)),
        E::Unsupported {
            path,
            tensor,
            reason,
        } => (Some(path), Some(tensor), rule(reason)),
        E::Layout {
            path,
            tensor,
            source,
        } => (Some(path), Some(tensor), source.to_string()),
        E::UnknownDType { path, tensor, .. }
        | E::ShapeOverflow { path, tensor, .. }
        | E::InvalidOffsets { path, tensor, .. }
        | E::TensorByteLength { path, tensor, .. }
        | E::SliceShape { path, tensor, .. }
        | E::DTypeMismatch { path, tensor, .. } => (Some(path), Some(tensor), e.to_string()),
        E::GlobalShape { tensor, reason } => (None, Some(tensor), rule(reason)),
        E::UnsafeDestination { path, rule: r } => (Some(path), None, rule(r)),
        E::InvalidStrategy { path, reason }
        | E::InvalidHeader { path, reason }
        | E::SafetensorsTruncated { path, reason }
        | E::InvalidSet { path, reason }
        | E::UncommittedSet { path, reason }
        | E::Decrypt { path, reason } => (Some(path), None, rule(reason)),
        E::Protobuf { path, reason, .. } | E::MixedSet { path, reason, .. } => {
            (Some(path), None, rule(reason))
        }
        E::DuplicateTensor { path, tensor }
        | E::TensorOverrun { path, tensor, .. }
        | E::TensorIncomplete { path, tensor } => (Some(path), Some(tensor), e.to_string()),
        E::DuplicateParam { tensor }
        | E::InterleavedLayout { tensor }
        | E::PlanMismatch { tensor, .. } => (None, Some(tensor), e.to_string()),
        E::ChoiceFunc { param, .. } => (None, Some(param), e.to_string()),
        // A per-rank file list breaks the rule as a whole (too few files, one file for two
        // ranks that differ, …): the culprit is the argument, named as the message names it.
        E::RankFileList { argument, rule: r } => (Some(Path::new(*argument)), None, rule(r)),
        other => (error_path(other), None, other.to_string()),
    };
    Culprit { file, tensor, rule }
}

/// The path of the variants that only name a file.
fn error_path(e: &CkptError) -> Option<&Path> {
    use CkptError as E;
    match e {
        E::DestinationExists { path }
        | E::DestinationLocked { path, .. }
        | E::HeaderTooLarge { path, .. }
        | E::DataLength { path, .. }
        | E::CrcMismatch { path, .. }
        | E::MissingRestoreList { path }
        | E::NoRankDirs { path }
        | E::DuplicateRankDir { path, .. }
        | E::MissingRank { path, .. }
        | E::RankCountMismatch { path, .. }
        | E::MixedFormats { path, .. }
        | E::FileSuffix { path, .. }
        | E::UnknownExtension { path, .. }
        | E::NoFiles { path, .. }
        | E::NotUnified { path }
        | E::AlreadyEncrypted { path }
        | E::UnknownFormat { path, .. }
        | E::NotParsedAs { path, .. }
        | E::NotInspectable { path, .. }
        | E::OldSetKept { path, .. }
        | E::WrittenPastEnd { path } => Some(path),
        _ => None,
    }
}

/// A checkpoint error as `CheckpointIOError` (I/O) or `CheckpointError` (everything else).
pub fn ckpt_err(e: CkptError) -> PyErr {
    let mut message = e.to_string();
    let mut c = culprit(&e);
    if matches!(e, CkptError::DestinationExists { .. }) {
        // The library words it for the command line; in Python the switch is `force=True`.
        for text in [&mut message, &mut c.rule] {
            *text = text.replace("pass --force", "pass force=True");
        }
    }
    let err = match e {
        CkptError::Io { .. } => CheckpointIOError::new_err(message),
        _ => CheckpointError::new_err(message),
    };
    let file = c.file.map(|p| p.display().to_string());
    with_culprit(err, file, c.tensor.map(str::to_string), c.rule)
}

/// Sets `file`, `tensor` and `rule` on the exception instance of `err`.
pub fn with_culprit(
    err: PyErr,
    file: Option<String>,
    tensor: Option<String>,
    rule: String,
) -> PyErr {
    Python::attach(|py| {
        let value = err.value(py);
        let set = value
            .setattr("file", file)
            .and_then(|()| value.setattr("tensor", tensor))
            .and_then(|()| value.setattr("rule", rule));
        match set {
            Ok(()) => err,
            Err(e) => e,
        }
    })
}

/// A layout error as `ValueError`, MindSpore's exception for a bad `Layout`.
pub fn layout_err(e: layout::LayoutError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A runtime error as `ConfigError` (a configuration, data file or parallel plan that breaks a
/// rule), `CheckpointError` / `CheckpointIOError` (checkpoint trouble) or `RuntimeError` (a run
/// that failed).
pub fn runtime_err(e: runtime::RuntimeError) -> PyErr {
    use runtime::RuntimeError as R;
    let message = e.to_string();
    let config = |file: Option<&Path>, key: Option<&str>, rule: String| {
        with_culprit(
            ConfigError::new_err(message.clone()),
            file.map(|p| p.display().to_string()),
            key.map(str::to_string),
            rule,
        )
    };
    match e {
        R::Config { key, reason } => config(None, Some(&key), reason),
        R::ConfigFile { path, key, reason } => config(Some(&path), Some(&key), reason),
        R::Data { path, reason } | R::Unusable { path, reason, .. } => {
            config(Some(&path), None, reason)
        }
        R::Parallel(p) => config(None, None, p.to_string()),
        R::Search(s) => config(None, None, s.to_string()),
        R::Io { path, source } => with_culprit(
            CheckpointIOError::new_err(message),
            Some(path.display().to_string()),
            None,
            source.to_string(),
        ),
        R::Ckpt(e) => ckpt_err(e),
        _ => pyo3::exceptions::PyRuntimeError::new_err(message),
    }
}
