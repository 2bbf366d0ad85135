//! `tessera.save_checkpoint`: named arrays from Python written as one unsharded checkpoint file,
//! `.safetensors` or MindSpore's `.ckpt` (by the file's extension).

use std::path::PathBuf;

use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tensor::Tensor;

use crate::errors::{ckpt_err, with_culprit, CheckpointError};

/// Adds this module's function.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(save_tensors, m)?)?;
    Ok(())
}

/// Array `value` (float32, float64, int32 or int64) as a tensor; another dtype is a
/// `ValueError` naming tensor `name`.
fn to_tensor(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    fn typed<T: numpy::Element + tensor::Element + Copy>(
        name: &str,
        value: &Bound<'_, PyAny>,
    ) -> Option<PyResult<Tensor>> {
        let array = value.extract::<PyReadonlyArrayDyn<'_, T>>().ok()?;
        let data = crate::arrays::collect_array(
            &format!("tensor {name}"),
            array.len(),
            array.as_array().iter().copied(),
        );
        Some(data.and_then(|data| {
            Tensor::from_vec(array.shape(), data)
                .map_err(|e| PyValueError::new_err(format!("tensor {name}: {e}")))
        }))
    }
    typed::<f32>(name, value)
        .or_else(|| typed::<f64>(name, value))
        .or_else(|| typed::<i32>(name, value))
        .or_else(|| typed::<i64>(name, value))
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "tensor {name}: only float32, float64, int32 and int64 arrays can be saved"
            ))
        })?
}

/// Writes `tensors` (`[(name, numpy array)]`, in that order) into the file `path`, replacing
/// it: safetensors for `.safetensors` (in its canonical header order), MindSpore's protobuf
/// checkpoint for `.ckpt` in the order given (through a safetensors file in a temporary
/// directory beside it). Returns the path written.
#[pyfunction]
fn save_tensors(
    py: Python<'_>,
    path: PathBuf,
    tensors: Vec<(String, Bound<'_, PyAny>)>,
) -> PyResult<PathBuf> {
    let owned: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(name, value)| Ok((name.clone(), to_tensor(name, value)?)))
        .collect::<PyResult<_>>()?;
    // Checked here, naming the file asked for: a `.ckpt` is written through a staging file,
    // whose name the library's error would give instead.
    let mut seen = std::collections::HashSet::new();
    if let Some((name, _)) = owned.iter().find(|(n, _)| !seen.insert(n.as_str())) {
        let rule = format!("tensor \"{name}\" given twice");
        return Err(with_culprit(
            CheckpointError::new_err(format!("{}: {rule}", path.display())),
            Some(path.display().to_string()),
            Some(name.clone()),
            rule,
        ));
    }
    let ckpt = match path.extension().and_then(|e| e.to_str()) {
        Some("ckpt") => true,
        Some("safetensors") => false,
        _ => {
            return Err(PyValueError::new_err(format!(
                "{}: the file name must end in .ckpt or .safetensors",
                path.display()
            )))
        }
    };
    py.detach(move || {
        let refs: Vec<(&str, &Tensor)> = owned.iter().map(|(n, t)| (n.as_str(), t)).collect();
        if !ckpt {
            return ckpt::save_safetensors(&path, &refs, true);
        }
        let parent = path.parent().unwrap_or(std::path::Path::new("."));
        let staging = staging_dir(parent)?;
        let result = ckpt::save_safetensors(&staging.join("tensors.safetensors"), &refs, true)
            .and_then(|_| ckpt::load_segmented_checkpoints(&staging))
            .and_then(|mut entries| {
                // safetensors orders its header; a .ckpt keeps the order given, as MindSpore's
                // (by a name → position map: a linear search per entry is quadratic)
                let order: std::collections::HashMap<&str, usize> = owned
                    .iter()
                    .enumerate()
                    .map(|(i, (n, _))| (n.as_str(), i))
                    .collect();
                entries.sort_by_key(|e| order.get(e.tensor.name.as_str()).copied());
                ckpt::write_segmented(
                    &entries,
                    &path,
                    true,
                    ckpt::Durability::Fsync,
                    &ckpt::NoProgress,
                )
            });
        let _ = std::fs::remove_dir_all(&staging);
        result
    })
    .map_err(ckpt_err)
}

/// A new, empty directory beside the destination (in `parent`) for the intermediate safetensors
/// file, named `.tessera-save-<pid>-<n>` with the first `n` no entry has: it is created here, so
/// removing it afterwards removes only what this call made (never a directory of that name that
/// was already there, nor another thread's).
fn staging_dir(parent: &std::path::Path) -> ckpt::Result<PathBuf> {
    let parent = if parent.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        parent
    };
    let mut n = 0u32;
    loop {
        let dir = parent.join(format!(".tessera-save-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(source) => {
                return Err(ckpt::CkptError::Io {
                    path: dir,
                    op: "create directory",
                    source,
                })
            }
        }
    }
}
