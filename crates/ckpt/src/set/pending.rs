//! The staging directories and lock files of this process's unfinished writes, so that an
//! interrupted command (SIGINT, SIGTERM) can remove them before it exits.
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

/// Records a path this process created and must remove if interrupted.
pub(crate) fn register(path: &Path) {
    guard().push(path.to_path_buf());
}

/// Forgets a path (it was committed or removed).
pub(crate) fn unregister_in(list: &mut Vec<PathBuf>, path: &Path) {
    list.retain(|p| p != path);
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
