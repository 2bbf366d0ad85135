//! Parameters with given values (`tessera.Parameter(numpy array)`, MindSpore's
//! `Parameter(Tensor(array))`): a parameter of the traced graph initialised by
//! [`graph::Initializer::Values`], so every rank starts from its slice of the array; it may be
//! frozen (`requires_grad=False`).

use graph::Initializer;
use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::builder::{graph_err, NetworkBuilder};

/// Adds this module's function.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parameter_values, m)?)?;
    Ok(())
}

/// Adds f32 parameter `name` to `builder`, starting from `values` (its shape is the
/// parameter's), trainable or frozen (`requires_grad=False`: the engine never updates it);
/// returns `(id, shape)` as `NetworkBuilder.parameter` does.
#[pyfunction]
#[pyo3(signature = (builder, name, values, trainable=true))]
fn parameter_values(
    builder: &mut NetworkBuilder,
    name: &str,
    values: PyReadonlyArrayDyn<'_, f32>,
    trainable: bool,
) -> PyResult<(usize, Vec<usize>)> {
    let shape = values.shape().to_vec();
    crate::builder::check_shape(&format!("parameter {name}"), &shape)?;
    let data: Vec<f64> = crate::arrays::collect_array(
        &format!("parameter {name}"),
        values.len(),
        values.as_array().iter().map(|&v| f64::from(v)),
    )?;
    let dtype = builder.builder.float_dtype();
    let id = builder
        .builder
        .parameter_with(
            name,
            &shape,
            dtype,
            Initializer::Values(data.into()),
            trainable,
        )
        .map_err(graph_err)?;
    Ok((id.0, shape))
}
