//! Progress of long operations, reported to a Python callable.

use ckpt::Progress;
use pyo3::prelude::*;

/// Calls `callback(event, label, value)` for each progress event: `("start", label,
/// total_bytes)`, `("advance", label, bytes)`, `("file", path, 0)` and `("finish", label, 0)`.
/// An exception raised by the callback is printed (as an unraisable exception) and does not
/// stop the operation.
pub struct PyProgress {
    callback: Option<Py<PyAny>>,
    label: std::sync::Mutex<String>,
}

impl PyProgress {
    /// A sink calling `callback`, or reporting nothing for `None`.
    pub fn new(callback: Option<Py<PyAny>>) -> PyProgress {
        PyProgress {
            callback,
            label: std::sync::Mutex::new(String::new()),
        }
    }

    fn call(&self, event: &str, label: Option<&str>, value: u64) {
        let Some(callback) = &self.callback else {
            return;
        };
        let label = match label {
            Some(l) => l.to_string(),
            None => self.label.lock().map(|l| l.clone()).unwrap_or_default(),
        };
        Python::attach(|py| {
            if let Err(e) = callback.call1(py, (event, label, value)) {
                e.write_unraisable(py, Some(callback.bind(py)));
            }
        });
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
