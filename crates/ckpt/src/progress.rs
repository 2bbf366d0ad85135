//! Progress reporting for long operations.
//!
//! The library reports bytes written through this trait and never draws anything itself: only
//! the command line knows whether there is a terminal (it implements the trait with a progress
//! bar on stderr).

/// Receives progress of a long operation, in bytes of output.
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
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}
