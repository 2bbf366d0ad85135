//! [`Durability`]: whether a write flushes its files and directories to stable storage.
//!
//! Every `fsync` the crate issues goes through this module ([`Durability::sync_file`],
//! [`Durability::sync_dir`], [`Durability::sync_tree`]), so turning durability off is one value
//! carried by an [`crate::io::atomic_write::AtomicFile`] and a [`crate::SetWriter`], not a flag
//! threaded through every call.
//!
//! Turning it off changes nothing else: files are still staged under unique temporary names and
//! renamed into place, a set still appears by one atomic switch, and a failed write still
//! removes what it created. A failed or killed *process* therefore still leaves the old set or
//! the new one, never a mix; only a power loss or an operating-system crash shortly after the
//! write can lose (or, on some filesystems, empty) the new files, since they may still be in the
//! page cache.

use std::fs::File;
use std::path::Path;

use crate::error::{io_err, Result};

/// Whether finished files (and the directories naming them) are flushed to stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `fsync` every data file, the set marker and each directory whose entries changed, so a
    /// committed write survives a power loss or an OS crash. The default.
    #[default]
    Fsync,
    /// Leave the data to the operating system's page cache (no `fsync` at all): what `cp` and
    /// MindSpore's tools do. Still atomic against a failing or killed process; a power loss or
    /// OS crash soon after the write may lose the new data.
    OsBuffered,
}

impl Durability {
    /// [`Durability::Fsync`] when `fsync` is true, else [`Durability::OsBuffered`].
    pub fn from_fsync(fsync: bool) -> Durability {
        if fsync {
            Durability::Fsync
        } else {
            Durability::OsBuffered
        }
    }

    /// Whether this durability issues `fsync`.
    pub fn fsyncs(self) -> bool {
        self == Durability::Fsync
    }

    /// Flushes `file` (written at `path`, named in the error) to disk, unless buffered.
    pub(crate) fn sync_file(self, file: &File, path: &Path) -> Result<()> {
        if self.fsyncs() {
            probe::record(path);
            file.sync_all().map_err(io_err(path, "fsync"))?;
        }
        Ok(())
    }

    /// Flushes a directory's entries to disk, unless buffered. Some filesystems refuse to fsync
    /// a directory; that is not worth failing a finished write for.
    pub(crate) fn sync_dir(self, dir: &Path) {
        if !self.fsyncs() {
            return;
        }
        if let Ok(d) = File::open(dir) {
            probe::record(dir);
            let _ = d.sync_all();
        }
    }

    /// Flushes `dir` and every directory below it, unless buffered.
    pub(crate) fn sync_tree(self, dir: &Path) -> Result<()> {
        if !self.fsyncs() {
            return Ok(());
        }
        for entry in std::fs::read_dir(dir).map_err(io_err(dir, "list directory"))? {
            let entry = entry.map_err(io_err(dir, "list directory"))?;
            if entry.file_type().map_err(io_err(dir, "stat"))?.is_dir() {
                self.sync_tree(&entry.path())?;
            }
        }
        self.sync_dir(dir);
        Ok(())
    }
}

/// Counts the `fsync` calls made on paths under a watched directory, for tests. Tests of one
/// binary run in parallel, so a single global count would see other tests' writes; counting by
/// path keeps each test to its own temporary directory. Compiled to nothing outside tests.
#[cfg(test)]
pub(crate) mod probe {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    /// The watched roots and their counts.
    static WATCHED: Mutex<Vec<(PathBuf, usize)>> = Mutex::new(Vec::new());

    /// Counts fsyncs under `root` from now until the returned watch is dropped.
    pub(crate) fn watch(root: &Path) -> Watch {
        let root = std::fs::canonicalize(root).expect("a watched directory exists");
        WATCHED.lock().unwrap().push((root.clone(), 0));
        Watch { root }
    }

    /// An active count of fsyncs under one directory.
    pub(crate) struct Watch {
        root: PathBuf,
    }

    impl Watch {
        /// The fsyncs counted so far.
        pub(crate) fn count(&self) -> usize {
            let watched = WATCHED.lock().unwrap();
            watched
                .iter()
                .filter(|(r, _)| *r == self.root)
                .map(|(_, n)| n)
                .sum()
        }
    }

    impl Drop for Watch {
        fn drop(&mut self) {
            let mut watched = WATCHED.lock().unwrap();
            if let Some(i) = watched.iter().position(|(r, _)| *r == self.root) {
                watched.remove(i);
            }
        }
    }

    pub(super) fn record(path: &Path) {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        for (root, n) in WATCHED.lock().unwrap().iter_mut() {
            if path.starts_with(root) {
                *n += 1;
            }
        }
    }
}

#[cfg(not(test))]
mod probe {
    /// Outside tests, nothing is counted.
    pub(super) fn record(_: &std::path::Path) {}
}

#[cfg(test)]
mod tests;
