//! `Cell.shard` and the functional `shard` of a traced network: the strategies of the ops that
//! read a value whose split the user fixed (a Cell's input, a parameter of its
//! `parameter_plan`), chosen by the engine's cost model among the candidates that split it so
//! ([`search::anchored_strategies`], as `runtime::shard` does for MindSpore's PyNative `shard`).
//! The other ops are left to the run's mode (sharding propagation from these, or data parallel).

use std::collections::BTreeMap;

use graph::ValueId;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use search::{anchored_strategies as search_anchored, Anchor, EvalSettings};

use crate::builder::NetworkBuilder;

/// Adds this module's function.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(anchored_strategies, m)?)?;
    Ok(())
}

/// `{op name: in_strategy}` of every forward op of the network traced into `builder` that reads
/// an anchored value (`anchors`: `(value id, split per dim)`), on `devices` devices (a stage's),
/// costed on the `h100-nvlink-ib` profile (`parallel.device_profile`'s default). An error
/// names the op and the anchor no candidate strategy serves.
#[pyfunction]
fn anchored_strategies(
    py: Python<'_>,
    builder: &NetworkBuilder,
    anchors: Vec<(usize, Vec<usize>)>,
    devices: usize,
) -> PyResult<BTreeMap<String, Vec<Vec<usize>>>> {
    if devices == 0 {
        return Err(PyValueError::new_err(
            "shard: devices is 0; a strategy needs at least one device",
        ));
    }
    let graph = builder.builder.graph().clone();
    let count = graph.values().len();
    if let Some((id, _)) = anchors.iter().find(|(id, _)| *id >= count) {
        return Err(PyValueError::new_err(format!(
            "shard: value {id} is not in the traced network ({count} values)"
        )));
    }
    let anchors: Vec<Anchor> = anchors
        .into_iter()
        .map(|(id, split)| Anchor {
            value: ValueId(id),
            split,
        })
        .collect();
    let profile = search::profiles::built_in("h100-nvlink-ib")
        .ok_or_else(|| PyValueError::new_err("the built-in device profile is missing"))?;
    py.detach(|| {
        let settings = EvalSettings {
            profile: &profile,
            devices,
            optimizer_states: 1,
            held: None,
        };
        search_anchored(&graph, &anchors, &settings)
    })
    .map_err(|e| PyValueError::new_err(format!("shard: {e}")))
}
