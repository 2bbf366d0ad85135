//! `tessera.save_checkpoint`: named arrays from Python written as one unsharded checkpoint file,
//! `.safetensors` or MindSpore's `.ckpt` (by the file's extension).

use std::path::PathBuf;

use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tensor::Tensor;

use crate::errors::ckpt_err;

/// Adds this module's function.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(save_tensors, m)?)?;
    Ok(())
}

/// Array `value` (float32, float64, int32 or int64) as a tensor; another dtype is a
/// `ValueError` naming tensor `name`.
fn to_tensor(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    fn typed<T: numpy::Element + tensor::Element + Copy>(
        value: &Bound<'_, PyAny>,
    ) -> Option<Result<Tensor, tensor::TensorError>> {
        let array = value.extract::<PyReadonlyArrayDyn<'_, T>>().ok()?;
        let data: Vec<T> = array.as_array().iter().copied().collect();
        Some(Tensor::from_vec(array.shape(), data))
    }
    let tensor = typed::<f32>(value)
        .or_else(|| typed::<f64>(value))
        .or_else(|| typed::<i32>(value))
        .or_else(|| typed::<i64>(value))
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "tensor {name}: only float32, float64, int32 and int64 arrays can be saved"
            ))
        })?;
    tensor.map_err(|e| PyValueError::new_err(format!("tensor {name}: {e}")))
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
        let staging = parent.join(format!(".tessera-save-{}", std::process::id()));
        let result = ckpt::save_safetensors(&staging.join("tensors.safetensors"), &refs, true)
            .and_then(|_| ckpt::load_segmented_checkpoints(&staging))
            .and_then(|mut entries| {
                // safetensors orders its header; a .ckpt keeps the order given, as MindSpore's
                entries.sort_by_key(|e| owned.iter().position(|(n, _)| *n == e.tensor.name));
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
