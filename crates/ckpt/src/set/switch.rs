//! The commit point of a set: one rename of the staging directory onto the destination, then
//! retiring the old directory's set entries.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{rank_of_entry, SetMarker, SET_MARKER, STAGING_SENTINEL};
use crate::error::{io_err, CkptError, Result};

/// How [`rename2`] treats an existing target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenameMode {
    /// Fail if the target exists.
    NoReplace,
    /// Swap source and target atomically (both must exist).
    Exchange,
}

/// `renameat2(from, to, mode)`.
pub(crate) fn rename2(from: &Path, to: &Path, mode: RenameMode) -> std::io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::other("a path holds a NUL byte"))
    };
    let (a, b) = (c(from)?, c(to)?);
    let flags = match mode {
        RenameMode::NoReplace => libc::RENAME_NOREPLACE,
        RenameMode::Exchange => libc::RENAME_EXCHANGE,
    };
    // SAFETY: both pointers are NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Flushes a directory's entries to disk. Some filesystems refuse to fsync a directory; that
/// is not worth failing a finished write for.
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Flushes `dir` and every directory below it.
pub(crate) fn sync_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io_err(dir, "list directory"))? {
        let entry = entry.map_err(io_err(dir, "list directory"))?;
        if entry.file_type().map_err(io_err(dir, "stat"))?.is_dir() {
            sync_tree(&entry.path())?;
        }
    }
    sync_dir(dir);
    Ok(())
}

/// Puts the committed staging directory `staging` in place of `dest`, then retires the
/// directory it replaced (now at `staging`).
pub(crate) fn switch(staging: &Path, dest: &Path, new: &SetMarker) -> Result<()> {
    let parent = dest.parent().unwrap_or(Path::new("/"));
    let exists = std::fs::symlink_metadata(dest).is_ok();
    let mode = if exists {
        RenameMode::Exchange
    } else {
        RenameMode::NoReplace
    };
    match rename2(staging, dest, mode) {
        Ok(()) => {}
        Err(e) if is_unsupported(&e) => fallback_switch(staging, dest, exists)?,
        Err(e) => return Err(io_err(dest, "switch the new set into place")(e)),
    }
    sync_dir(parent);
    if exists {
        retire(staging, dest, &new.entries)?;
    }
    Ok(())
}

fn is_unsupported(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS))
}

/// For filesystems without `renameat2`: move the old directory aside, then the new one in.
/// Readers may briefly find no directory, never a mixed one.
fn fallback_switch(staging: &Path, dest: &Path, exists: bool) -> Result<()> {
    if !exists {
        return std::fs::rename(staging, dest).map_err(io_err(dest, "rename into place"));
    }
    let aside = staging.with_extension("old");
    std::fs::rename(dest, &aside).map_err(io_err(dest, "move the old set aside"))?;
    std::fs::rename(staging, dest).map_err(io_err(dest, "rename into place"))?;
    std::fs::rename(&aside, staging).map_err(io_err(&aside, "rename"))
}

/// Retires the old directory `old` that `dest` replaced: entries that belong to no set move
/// into `dest` (the new set owns `new_entries`); the old set's entries are removed, then `old`.
/// If a foreign entry cannot be moved, `old` is kept and the error names it.
pub(crate) fn retire(old: &Path, dest: &Path, new_entries: &[String]) -> Result<()> {
    let old_marker = SetMarker::read(old).ok().flatten();
    let mut owned: BTreeSet<&str> = new_entries.iter().map(String::as_str).collect();
    if let Some(m) = &old_marker {
        owned.extend(m.entries.iter().map(String::as_str));
    }
    let mut kept = Vec::new();
    let entries: Vec<_> = std::fs::read_dir(old)
        .map_err(io_err(old, "list directory"))?
        .collect::<std::io::Result<_>>()
        .map_err(io_err(old, "list directory"))?;
    for entry in &entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_set_entry = owned.contains(name.as_str())
            || name == SET_MARKER
            || name == STAGING_SENTINEL
            || rank_of_entry(&name).is_some();
        let path = entry.path();
        if is_set_entry {
            let removed = if path.is_dir() && !path.is_symlink() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.map_err(io_err(&path, "remove the old set's entry"))?;
        } else if rename2(&path, &dest.join(&name), RenameMode::NoReplace).is_err() {
            kept.push(name);
        }
    }
    sync_dir(dest);
    if kept.is_empty() {
        std::fs::remove_dir(old).map_err(io_err(old, "remove the old set's directory"))?;
        return Ok(());
    }
    Err(CkptError::InvalidRequest(format!(
        "the new set is committed in {}, but {} could not be moved back into it from the old directory, which is kept at {}",
        dest.display(),
        kept.join(", "),
        old.display()
    )))
}
