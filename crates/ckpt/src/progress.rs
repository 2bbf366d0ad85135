//! Progress reporting for long operations, and the sink's way to stop one.
//!
//! The library reports bytes written through this trait and never draws anything itself: only
//! the command line knows whether there is a terminal (it implements the trait with a progress
//! bar on stderr). A sink can also ask the operation to stop ([`Progress::stop_requested`]),
//! for instance when a Python callback raised.

use crate::error::{CkptError, Result};

/// Receives progress of a long operation, in bytes of output, and may ask it to stop.
pub trait Progress {
    /// A phase starts: `total_bytes` of output will be written.
    fn start(&self, label: &str, total_bytes: u64) {
        let _ = (label, total_bytes);
    }
    /// `bytes` more were written.
    fn advance(&self, bytes: u64) {
        let _ = bytes;
    }
    /// A file was finished.
    fn file_done(&self, path: &std::path::Path) {
        let _ = path;
    }
    /// The phase is over.
    fn finish(&self) {}
    /// Whether the operation should stop now. The default never asks.
    ///
    /// The operation polls this on the thread it reports to: before it creates each output
    /// file, after every [`Progress::advance`] (one chunk of output), and before each commit
    /// (a file renamed into place, a checkpoint set switched in). Once a poll returns `true`,
    /// the operation stops there, commits nothing more and returns [`CkptError::Stopped`],
    /// leaving behind nothing it created, as after any other failure: its staged files are
    /// removed and an existing destination is left as it was. (A split `unified_safetensors`
    /// run, whose part files are committed one by one, keeps the parts it committed before,
    /// as after any other failure.) A stopped operation reports no [`Progress::finish`].
    ///
    /// It is polled once per chunk of output, so it should be cheap (a flag to read).
    fn stop_requested(&self) -> bool {
        false
    }
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// A poll point: [`CkptError::Stopped`] when `progress` asks the operation to stop.
pub(crate) fn stop_point(progress: &dyn Progress) -> Result<()> {
    if progress.stop_requested() {
        return Err(CkptError::Stopped);
    }
    Ok(())
}
