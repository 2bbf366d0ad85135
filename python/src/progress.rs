//! Progress of long operations, reported to a Python callable.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use ckpt::Progress;
use pyo3::prelude::*;

/// Calls `callback(event, label, value)` for each progress event: `("start", label,
/// total_bytes)`, `("advance", label, bytes)`, `("file", path, 0)` and `("finish", label, 0)`.
///
/// The first exception raised by the callback (`KeyboardInterrupt` included) stops the
/// operation and is raised to the caller as it is: [`PyProgress::run`] runs the operation. The
/// `ckpt::Progress` trait gives a sink no way to stop the work, so the sink keeps the exception
/// and unwinds out of the library with a private payload (no panic message: `resume_unwind`
/// skips the panic hook); the library's writers stage their output and remove it when dropped
/// uncommitted, so an exception before the commit leaves nothing behind. The events are only
/// ever reported on the thread that called the operation (the library forwards its worker
/// threads' progress there), where `run` catches the unwind.
pub struct PyProgress {
    callback: Option<Py<PyAny>>,
    label: Mutex<String>,
    raised: Mutex<Option<PyErr>>,
}

/// The unwind payload of a callback's exception (the exception itself is in `raised`).
struct Stopped;

impl PyProgress {
    /// A sink calling `callback`, or reporting nothing for `None`.
    pub fn new(callback: Option<Py<PyAny>>) -> PyProgress {
        PyProgress {
            callback,
            label: Mutex::new(String::new()),
            raised: Mutex::new(None),
        }
    }

    /// Runs `operation` (which reports to this sink) with the GIL released: the callback's
    /// first exception, if any, whatever the operation returned; else what it returned.
    pub fn run<T: Send>(
        &self,
        py: Python<'_>,
        operation: impl FnOnce(&PyProgress) -> T + Send,
    ) -> PyResult<T> {
        let outcome = py.detach(|| catch_unwind(AssertUnwindSafe(|| operation(self))));
        if let Some(e) = self.take_raised() {
            return Err(e);
        }
        match outcome {
            Ok(result) => Ok(result),
            // A panic of the library itself, not a callback's exception.
            Err(payload) => resume_unwind(payload),
        }
    }

    fn take_raised(&self) -> Option<PyErr> {
        self.raised.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn call(&self, event: &str, label: Option<&str>, value: u64) {
        let Some(callback) = &self.callback else {
            return;
        };
        if self
            .raised
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return;
        }
        let label = match label {
            Some(l) => l.to_string(),
            None => self.label.lock().map(|l| l.clone()).unwrap_or_default(),
        };
        let failed = Python::attach(|py| callback.call1(py, (event, label, value)).err());
        if let Some(e) = failed {
            *self.raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            resume_unwind(Box::new(Stopped));
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
}
