//! One process per rank (`tessera launch --nproc N -- python3 script.py`, msrun's model):
//! `tessera.communication.init()` joins the `mpirun` job the launcher started, and this module
//! holds the process's world communicator until `release()` (or interpreter exit) finalises
//! MPI, so that several `Model.train` calls share one MPI session.
//!
//! Built without the cargo feature `mpi`, every function but [`mpi_available`] raises, saying
//! how to build a package with it.

use pyo3::prelude::*;

/// Adds this module's functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(mpi_available, m)?)?;
    m.add_function(wrap_pyfunction!(mpi_init, m)?)?;
    m.add_function(wrap_pyfunction!(mpi_broadcast_str, m)?)?;
    m.add_function(wrap_pyfunction!(mpi_barrier, m)?)?;
    m.add_function(wrap_pyfunction!(mpi_finalize, m)?)?;
    Ok(())
}

/// Whether this build trains ranks as MPI processes (the cargo feature `mpi`).
#[pyfunction]
fn mpi_available() -> bool {
    cfg!(feature = "mpi")
}

#[cfg(feature = "mpi")]
mod held {
    use std::sync::Mutex;

    use comm::mpi::MpiComm;
    use comm::Communicator;
    use pyo3::exceptions::PyRuntimeError;
    use pyo3::PyResult;

    /// The process's world communicator while `init()` holds it.
    static WORLD: Mutex<Option<MpiComm>> = Mutex::new(None);

    fn comm_err(e: comm::CommError) -> pyo3::PyErr {
        PyRuntimeError::new_err(format!("MPI: {e}"))
    }

    /// Runs `f` on the held world communicator; an error before `init()`.
    pub fn with_world<T>(f: impl FnOnce(&MpiComm) -> PyResult<T>) -> PyResult<T> {
        let world = WORLD.lock().unwrap_or_else(|p| p.into_inner());
        match world.as_ref() {
            Some(w) => f(w),
            None => Err(PyRuntimeError::new_err(
                "MPI is not initialised: call tessera.communication.init() first",
            )),
        }
    }

    pub fn init() -> PyResult<(usize, usize)> {
        let mut world = WORLD.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = world.as_ref() {
            return Ok((w.rank(), w.size()));
        }
        // The ranks train on the thread that calls, which is the thread that initialises.
        comm::mpi::prefer_thread_level(comm::mpi::ThreadLevel::Single);
        let w = MpiComm::world(comm::mpi::DEFAULT_TIMEOUT).map_err(comm_err)?;
        let answer = (w.rank(), w.size());
        *world = Some(w);
        Ok(answer)
    }

    pub fn broadcast_str(text: &str) -> PyResult<String> {
        with_world(|w| {
            let mut len = (text.len() as u64).to_le_bytes();
            w.broadcast_bytes(&mut len, 0).map_err(comm_err)?;
            let n = u64::from_le_bytes(len) as usize;
            if n > 1 << 20 {
                return Err(PyRuntimeError::new_err(format!(
                    "MPI broadcast: rank 0 sent a {n}-byte text; at most 1 MiB is accepted"
                )));
            }
            let mut buf = if w.rank() == 0 {
                text.as_bytes().to_vec()
            } else {
                vec![0u8; n]
            };
            w.broadcast_bytes(&mut buf, 0).map_err(comm_err)?;
            String::from_utf8(buf)
                .map_err(|_| PyRuntimeError::new_err("MPI broadcast: rank 0's text is not UTF-8"))
        })
    }

    pub fn barrier() -> PyResult<()> {
        with_world(|w| w.barrier().map_err(comm_err))
    }

    pub fn finalize() {
        // Dropping the last communicator finalises MPI (unless a failed call poisoned it).
        WORLD.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

#[cfg(not(feature = "mpi"))]
mod held {
    use pyo3::exceptions::PyRuntimeError;
    use pyo3::PyResult;

    fn unavailable<T>() -> PyResult<T> {
        Err(PyRuntimeError::new_err(
            "this tessera package was built without MPI, so it cannot run as one rank of a \
             `tessera launch --nproc N` job; build it with the feature: \
             MATURIN_PEP517_ARGS=\"--features mpi\" pip install ./python \
             (needs OpenMPI: apt-get install libopenmpi-dev openmpi-bin libclang-dev)",
        ))
    }

    pub fn init() -> PyResult<(usize, usize)> {
        unavailable()
    }

    pub fn broadcast_str(_text: &str) -> PyResult<String> {
        unavailable()
    }

    pub fn barrier() -> PyResult<()> {
        unavailable()
    }

    pub fn finalize() {}
}

/// Joins the `mpirun` job this process is a rank of (once; later calls return the same) and
/// returns `(rank, size)` as MPI answers them.
#[pyfunction]
fn mpi_init(py: Python<'_>) -> PyResult<(usize, usize)> {
    py.detach(held::init)
}

/// Rank 0's `text` on every rank (at most 1 MiB).
#[pyfunction]
fn mpi_broadcast_str(py: Python<'_>, text: String) -> PyResult<String> {
    py.detach(|| held::broadcast_str(&text))
}

/// Waits until every rank has called it.
#[pyfunction]
fn mpi_barrier(py: Python<'_>) -> PyResult<()> {
    py.detach(held::barrier)
}

/// Releases the world communicator: MPI is finalised once no training holds it.
#[pyfunction]
fn mpi_finalize() {
    held::finalize();
}

/// Trains `session` as this process's rank of the `mpirun` job, with `callbacks`.
#[cfg(feature = "mpi")]
pub fn train_rank(
    session: &runtime::TrainSession,
    options: &runtime::LaunchOptions,
    callbacks: runtime::CallbackList,
) -> Result<runtime::TrainReport, runtime::RuntimeError> {
    runtime::train_mpi_with(session, options, callbacks)
}

/// Without MPI there is no rank process to train: an error saying how to build one.
#[cfg(not(feature = "mpi"))]
pub fn train_rank(
    _session: &runtime::TrainSession,
    _options: &runtime::LaunchOptions,
    _callbacks: runtime::CallbackList,
) -> Result<runtime::TrainReport, runtime::RuntimeError> {
    Err(runtime::RuntimeError::Config {
        key: "backend".to_string(),
        reason: "this tessera package was built without MPI (the cargo feature `mpi`)".to_string(),
    })
}
