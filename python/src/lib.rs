//! The native half of the Python package `tessera` (import name `tessera._tessera`).
//!
//! It turns Python arguments into calls of Tessera's library crates and their results into
//! plain Python data (dicts, lists, numpy arrays); it holds no checkpoint, layout or training
//! logic of its own. The MindSpore-compatible names, signatures and argument checks live in the
//! Python layer (`tessera/parallel/`, and `tessera/nn/`, `ops.py`, `train.py` for networks
//! written in Python), which calls these functions.
//!
//! - [`checkpoints`]: `mindspore.parallel`'s checkpoint tools over the `ckpt` crate.
//! - [`layouts`]: `Layout` checks, `to_dict` and per-rank slices over the `layout` crate.
//! - [`training`]: `train` and `plan` over the `runtime` crate.
//! - [`builder`]: the tracing backend of networks written in Python (`tessera.nn`) over
//!   `graph::GraphBuilder`; [`network`]: their training over `runtime::Trainer` and their
//!   forward runs; [`values`]: their parameters with given values; [`save`]:
//!   `save_checkpoint` of named arrays.
//! - [`anchors`]: the strategies `Cell.shard` fixes (anchored sharding).
//! - [`distributed`]: one process per rank under `tessera launch` (the `mpi` feature).
//! - [`errors`]: every library error becomes `CheckpointError` (a `ValueError`) or
//!   `CheckpointIOError` (an `OSError`) with `file`, `tensor` and `rule` attributes.
//!
//! Long operations release the GIL; progress reaches a Python callable ([`progress`]).

use pyo3::prelude::*;

mod anchors;
mod arrays;
mod builder;
mod checkpoints;
mod distributed;
mod errors;
mod layouts;
mod network;
mod progress;
mod save;
mod training;
mod values;

/// The module `tessera._tessera`.
#[pymodule]
fn _tessera(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    checkpoints::register(m)?;
    layouts::register(m)?;
    training::register(m)?;
    network::register(m)?;
    distributed::register(m)?;
    anchors::register(m)?;
    values::register(m)?;
    save::register(m)?;
    Ok(())
}
