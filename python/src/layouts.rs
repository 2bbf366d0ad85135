//! `mindspore.parallel.Layout`'s checks and `to_dict()`, and every rank's slice of a tensor,
//! over the `layout` crate. The Python `Layout` class does MindSpore's type checks and calls
//! these for everything else.

use layout::{DimSpec, Layout, MsDimMap};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::errors::layout_err;

/// Adds the functions of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(layout_to_dict, m)?)?;
    m.add_function(wrap_pyfunction!(layout_slices, m)?)?;
    Ok(())
}

/// One `Layout.__call__` entry: an alias, `"None"`, or a tuple of aliases.
fn dim_spec(entry: &Bound<'_, PyAny>) -> PyResult<DimSpec> {
    if let Ok(alias) = entry.extract::<String>() {
        return Ok(DimSpec::from(alias.as_str()));
    }
    let aliases: Vec<String> = entry.extract()?;
    Ok(DimSpec::Axes(aliases))
}

/// A layout, with its tensor map applied when `tensor_map` is given.
fn build(
    device_matrix: &[usize],
    alias_name: &[String],
    rank_list: Option<Vec<usize>>,
    tensor_map: Option<&Bound<'_, PyList>>,
) -> PyResult<Layout> {
    let layout = Layout::new(device_matrix, alias_name, rank_list).map_err(layout_err)?;
    let Some(entries) = tensor_map else {
        return Ok(layout);
    };
    let specs = entries
        .iter()
        .map(|e| dim_spec(&e))
        .collect::<PyResult<Vec<_>>>()?;
    layout.apply(&specs).map_err(layout_err)
}

/// Checks a layout (raising MindSpore's `ValueError`s) and returns MindSpore's `to_dict()`,
/// tuples as MindSpore gives them; with `tensor_map=None`, raises as `to_dict()` does before
/// `__call__`.
#[pyfunction]
#[pyo3(signature = (device_matrix, alias_name, rank_list=None, tensor_map=None))]
fn layout_to_dict<'py>(
    py: Python<'py>,
    device_matrix: Vec<usize>,
    alias_name: Vec<String>,
    rank_list: Option<Vec<usize>>,
    tensor_map: Option<Bound<'py, PyList>>,
) -> PyResult<Bound<'py, PyDict>> {
    let layout = build(&device_matrix, &alias_name, rank_list, tensor_map.as_ref())?;
    let dict = layout.to_dict().map_err(layout_err)?;
    let map = PyList::empty(py);
    for m in &dict.tensor_map {
        match m {
            MsDimMap::Single(v) => map.append(v)?,
            MsDimMap::Multi(vs) => map.append(PyTuple::new(py, vs)?)?,
        }
    }
    let d = PyDict::new(py);
    d.set_item("device_matrix", PyTuple::new(py, &dict.device_matrix)?)?;
    d.set_item("tensor_map", map.to_tuple())?;
    d.set_item("interleaved_parallel", dict.interleaved_parallel)?;
    d.set_item("alias_name", PyTuple::new(py, &dict.alias_name)?)?;
    d.set_item("rank_list", dict.rank_list)?;
    Ok(d)
}

/// Every rank's slice of a tensor of `shape` under a layout: per mesh slot, the device, the
/// rank and the box (`offset`, `shape`), plus the layout's split factors and replica count.
#[pyfunction]
#[pyo3(signature = (device_matrix, alias_name, rank_list, tensor_map, shape))]
fn layout_slices<'py>(
    py: Python<'py>,
    device_matrix: Vec<usize>,
    alias_name: Vec<String>,
    rank_list: Option<Vec<usize>>,
    tensor_map: Bound<'py, PyList>,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let layout = build(&device_matrix, &alias_name, rank_list, Some(&tensor_map))?;
    let bound = layout.bind(&shape).map_err(layout_err)?;
    let mesh = bound.mesh();
    let slices = PyList::empty(py);
    for slot in 0..mesh.n_slots() {
        let b = bound.slot_box(slot);
        let d = PyDict::new(py);
        d.set_item("rank", mesh.rank_of_slot(slot))?;
        d.set_item("device", mesh.device_of_slot(slot))?;
        d.set_item("offset", &b.offset[..])?;
        d.set_item("shape", &b.shape[..])?;
        slices.append(d)?;
    }
    let d = PyDict::new(py);
    d.set_item("shape", shape)?;
    d.set_item("slice_shape", bound.slice_shape())?;
    d.set_item("split_factors", layout.split_factors())?;
    d.set_item("replicas", layout.replica_count())?;
    d.set_item("slices", slices)?;
    Ok(d)
}
