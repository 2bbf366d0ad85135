//! Progress of long operations, reported to a Python callable.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use ckpt::Progress;
use pyo3::prelude::*;

/// Calls `callback(event, label, value)` for each progress event: `("start", label,
/// total_bytes)`, `("advance", label, bytes)`, `("file", path, 0)` and `("finish", label, 0)`.
///
/// The first exception raised by the callback (`KeyboardInterrupt` included) stops the
/// operation and is raised to the caller as it is: the sink keeps it, calls the callback no
/// more, and from then on asks the library to stop ([`Progress::stop_requested`]). The library
/// polls that after every chunk and before its commit, and then returns
/// [`ckpt::CkptError::Stopped`] having removed what it staged, so an exception before the
/// commit leaves nothing behind; [`PyProgress::run`] runs the operation and raises the kept
/// exception in place of what it returned. The events are only ever reported on the thread
/// that called the operation (the library forwards its worker threads' progress there).
pub struct PyProgress {
    callback: Option<Py<PyAny>>,
    label: Mutex<String>,
    /// The callback's first exception.
    raised: Mutex<Option<PyErr>>,
    /// Whether `raised` was ever set: the library's stop, read once per chunk.
    stop: AtomicBool,
}

impl PyProgress {
    /// A sink calling `callback`, or reporting nothing for `None`.
    pub fn new(callback: Option<Py<PyAny>>) -> PyProgress {
        PyProgress {
            callback,
            label: Mutex::new(String::new()),
            raised: Mutex::new(None),
            stop: AtomicBool::new(false),
        }
    }

    /// Runs `operation` (which reports to this sink) with the GIL released: the callback's
    /// first exception, if any, whatever the operation returned (normally
    /// [`ckpt::CkptError::Stopped`]); else what it returned.
    pub fn run<T: Send>(
        &self,
        py: Python<'_>,
        operation: impl FnOnce(&PyProgress) -> T + Send,
    ) -> PyResult<T> {
        let outcome = py.detach(|| operation(self));
        match self.raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(outcome),
        }
    }

    fn call(&self, event: &str, label: Option<&str>, value: u64) {
        let Some(callback) = &self.callback else {
            return;
        };
        if self.stop.load(Ordering::Relaxed) {
            return;
        }
        let label = match label {
            Some(l) => l.to_string(),
            None => self.label.lock().map(|l| l.clone()).unwrap_or_default(),
        };
        let failed = Python::attach(|py| callback.call1(py, (event, label, value)).err());
        if let Some(e) = failed {
            self.raised
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
            self.stop.store(true, Ordering::Relaxed);
        }
    }
}

impl Progress for PyProgress {
    fn start(&self, label: &str, total_bytes: u64) {
        if let Ok(mut l) = self.label.lock() {
            *l = label.to_string();
        }
        self.call("start", Some(label), total_bytes);
    }
    fn advance(&self, bytes: u64) {
        self.call("advance", None, bytes);
    }
    fn file_done(&self, path: &std::path::Path) {
        self.call("file", Some(&path.display().to_string()), 0);
    }
    fn finish(&self) {
        self.call("finish", None, 0);
    }
    fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
