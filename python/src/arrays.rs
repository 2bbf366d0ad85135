//! Tensors as numpy arrays.

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};
use tensor::{DType, Tensor};

/// The numpy dtype of a Tessera dtype; bf16, which numpy lacks, becomes float32 (exactly, as
/// MindSpore's numpy path does).
fn numpy_dtype(dtype: DType) -> &'static str {
    match dtype {
        DType::F64 => "<f8",
        DType::F32 | DType::BF16 => "<f4",
        DType::F16 => "<f2",
        DType::I64 => "<i8",
        DType::I32 => "<i4",
        DType::I16 => "<i2",
        DType::I8 => "i1",
        DType::U64 => "<u8",
        DType::U32 => "<u4",
        DType::U16 => "<u2",
        DType::U8 => "u1",
        DType::Bool => "?",
    }
}

/// One tensor as a writable numpy array (one copy of the data).
pub fn to_numpy<'py>(py: Python<'py>, tensor: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let widened;
    let tensor = if tensor.dtype() == DType::BF16 {
        widened = tensor.to_dtype(DType::F32);
        &widened
    } else {
        tensor
    };
    let numpy = py.import("numpy")?;
    let buffer = PyByteArray::new(py, tensor.as_bytes());
    let flat = numpy.call_method1("frombuffer", (buffer, numpy_dtype(tensor.dtype())))?;
    flat.call_method1("reshape", (tensor.shape().to_vec(),))
}

/// Named tensors as a dict of numpy arrays, in the given order.
pub fn to_dict<'py>(py: Python<'py>, tensors: &[(String, Tensor)]) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, t) in tensors {
        dict.set_item(name, to_numpy(py, t)?)?;
    }
    Ok(dict)
}

/// The elements of `iter` (`len` of them) in a new vector, or a `MemoryError` naming `what` when
/// that many cannot be allocated. An array argument may be a view far larger than the memory
/// behind it (`np.broadcast_to(x, (2**40,))`), and copying it with `collect` would abort the
/// interpreter on the failed allocation.
pub fn collect_array<T>(
    what: &str,
    len: usize,
    iter: impl IntoIterator<Item = T>,
) -> PyResult<Vec<T>> {
    let mut out: Vec<T> = Vec::new();
    out.try_reserve_exact(len).map_err(|_| {
        let bytes = (len as u128) * (std::mem::size_of::<T>() as u128);
        pyo3::exceptions::PyMemoryError::new_err(format!(
            "{what}: {len} elements ({bytes} bytes) cannot be allocated; is it a broadcast \
             view of a much smaller array?"
        ))
    })?;
    out.extend(iter);
    Ok(out)
}
