//! Parameters with given values (`tessera.Parameter(numpy array)`, MindSpore's
//! `Parameter(Tensor(array))`): a parameter of the traced graph initialised by
//! [`graph::Initializer::Values`], so every rank starts from its slice of the array.

use graph::Initializer;
use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::builder::{graph_err, NetworkBuilder};

/// Adds this module's function.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parameter_values, m)?)?;
    Ok(())
}

/// Adds trainable f32 parameter `name` to `builder`, starting from `values` (its shape is the
/// parameter's); returns `(id, shape)` as `NetworkBuilder.parameter` does.
#[pyfunction]
fn parameter_values(
    builder: &mut NetworkBuilder,
    name: &str,
    values: PyReadonlyArrayDyn<'_, f32>,
) -> PyResult<(usize, Vec<usize>)> {
    let shape = values.shape().to_vec();
    let data: Vec<f64> = values.as_array().iter().map(|&v| f64::from(v)).collect();
    let id = builder
        .builder
        .parameter(name, &shape, Initializer::Values(data.into()))
        .map_err(graph_err)?;
    Ok((id.0, shape))
}
