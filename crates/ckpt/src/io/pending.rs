//! The staging directories and lock files of this process's unfinished writes, so that an
//! interrupted command (SIGINT, SIGTERM) can remove them before it exits. Checkpoint sets
//! ([`crate::set`]) register their staging directories and locks here; every atomic file
//! creation waits on the registry, so nothing appears in a directory being removed.
//!
//! A commit holds the registry's mutex while it switches a set into place, so an interruption
//! waits for the switch to finish instead of removing a directory halfway through it.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Locks the registry (a poisoned registry is still usable: it is a list of paths).
pub(crate) fn guard() -> MutexGuard<'static, Vec<PathBuf>> {
    PENDING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f`, which creates or renames a directory entry, while no interruption is cleaning
/// up: once [`abandon_pending_sets`] has started, `f` never runs (the caller blocks until the
/// process exits), so no file appears in a staging directory after it was removed.
pub(crate) fn creating<T>(f: impl FnOnce() -> T) -> T {
    let _guard = guard();
    f()
}

/// Forgets one record of a path (it was committed or removed).
pub(crate) fn unregister_in(list: &mut Vec<PathBuf>, path: &Path) {
    // One record per creation: a second writer of this process may have recorded it too.
    if let Some(i) = list.iter().rposition(|p| p == path) {
        list.remove(i);
    }
}

/// Forgets a path.
pub(crate) fn unregister(path: &Path) {
    unregister_in(&mut guard(), path);
}

/// Removes every staging directory and lock file of this process's unfinished writes; for a
/// signal handler that is about to exit. Never touches a committed set. Waits for a commit in
/// progress to finish first.
pub fn abandon_pending_sets() {
    let mut list = guard();
    for path in list.drain(..) {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {
                let _ = std::fs::remove_dir_all(&path);
            }
            Ok(_) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => {}
        }
    }
    // Keep the registry locked: the process is about to exit, and no write may start a switch.
    std::mem::forget(list);
}
