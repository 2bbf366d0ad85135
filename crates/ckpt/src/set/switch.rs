//! The commit point of a set: one rename of the staging directory onto the destination, then
//! retiring the old directory's set entries.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{SetMarker, SET_MARKER, STAGING_SENTINEL};
use crate::error::{io_err, CkptError, Result};
use crate::io::durability::Durability;

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

/// Moves the foreign entry `old` back to `new`: when `new` is absent, by renaming; when it is
/// `old`'s hard link, by dropping the old name; directories entry by entry. Returns whether
/// nothing of `old` is left.
fn merge_back(old: &Path, new: &Path) -> bool {
    let (Ok(o), n) = (
        std::fs::symlink_metadata(old),
        std::fs::symlink_metadata(new),
    ) else {
        return true;
    };
    match n {
        Err(_) => rename2(old, new, RenameMode::NoReplace).is_ok(),
        Ok(n) if o.is_dir() && n.is_dir() => {
            let mut all = true;
            if let Ok(entries) = std::fs::read_dir(old) {
                for e in entries.flatten() {
                    all &= merge_back(&e.path(), &new.join(e.file_name()));
                }
            }
            all && std::fs::remove_dir(old).is_ok()
        }
        Ok(n) if !o.is_dir() && o.dev() == n.dev() && o.ino() == n.ino() => {
            std::fs::remove_file(old).is_ok()
        }
        Ok(_) => false,
    }
}

/// Puts the committed staging directory `staging` in place of `dest`, then retires the
/// directory it replaced (now at `staging`). The parent and `dest` are flushed with
/// `durability`.
pub(crate) fn switch(
    staging: &Path,
    dest: &Path,
    new: &SetMarker,
    durability: Durability,
) -> Result<()> {
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
    durability.sync_dir(parent);
    if exists {
        retire(staging, dest, &new.entries, durability)?;
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
    // `<staging>.old`: still a staging-prefixed name, so the next writer recovers it.
    let mut aside = staging.as_os_str().to_owned();
    aside.push(".old");
    let aside = std::path::PathBuf::from(aside);
    std::fs::rename(dest, &aside).map_err(io_err(dest, "move the old set aside"))?;
    std::fs::rename(staging, dest).map_err(io_err(dest, "rename into place"))?;
    std::fs::rename(&aside, staging).map_err(io_err(&aside, "rename"))
}

/// The names of `dir`'s entries that belong to a set: the set marker and sentinel, the old
/// marker's entries (when `dir` has a marker) and `new_entries`. A `rank_<N>` folder no marker
/// lists and the new set does not write is not the tool's to remove, whatever its name: it is
/// kept (and a reader then reports it as a stale or foreign rank of the set).
fn is_set_entry(name: &str, owned: &BTreeSet<String>) -> bool {
    owned.contains(name) || name == SET_MARKER || name == STAGING_SENTINEL
}

fn owned_names(dir: &Path, new_entries: &[String]) -> BTreeSet<String> {
    let mut owned: BTreeSet<String> = new_entries.iter().cloned().collect();
    if let Some(m) = SetMarker::read(dir).ok().flatten() {
        owned.extend(m.entries);
    }
    owned
}

fn list(dir: &Path) -> Result<Vec<std::fs::DirEntry>> {
    std::fs::read_dir(dir)
        .map_err(io_err(dir, "list directory"))?
        .collect::<std::io::Result<_>>()
        .map_err(io_err(dir, "list directory"))
}

/// Before the switch: gives the staging directory `staging` a hard link to every file of `dest`
/// that belongs to no set (directories are recreated, their files linked), so that the new
/// directory holds them from the instant it appears. What cannot be linked is moved by
/// [`retire`] after the switch.
pub(crate) fn link_foreign(dest: &Path, staging: &Path, new_entries: &[String]) -> Result<()> {
    if !dest.is_dir() {
        return Ok(());
    }
    let owned = owned_names(dest, new_entries);
    for entry in list(dest)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_set_entry(&name, &owned) {
            mirror(&entry.path(), &staging.join(&name));
        }
    }
    Ok(())
}

/// Hard-links `from` at `to`, recreating directories; failures are left to [`retire`].
fn mirror(from: &Path, to: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(from) else {
        return;
    };
    if meta.is_dir() {
        if std::fs::create_dir(to).is_ok() {
            if let Ok(entries) = std::fs::read_dir(from) {
                for e in entries.flatten() {
                    mirror(&e.path(), &to.join(e.file_name()));
                }
            }
        }
    } else {
        let _ = std::fs::hard_link(from, to);
    }
}

/// `entries` with the set marker last: a retire cut short (the process killed) keeps the marker
/// while any entry of the old set is left, so the writer that recovers it still knows them as
/// the set's (without it, a leftover `rank_<N>` would count as foreign and be moved into the new
/// set's directory).
fn marker_last(mut entries: Vec<std::fs::DirEntry>) -> Vec<std::fs::DirEntry> {
    entries.sort_by_key(|e| e.file_name() == SET_MARKER);
    entries
}

/// Retires the old directory `old` that `dest` replaced: the old set's entries are removed;
/// entries that belong to no set were linked into `dest` before the switch, and what was not
/// (or appeared since) is moved there now; then `old` is removed. If a foreign entry can be
/// neither, `old` is kept and the error names it.
pub(crate) fn retire(
    old: &Path,
    dest: &Path,
    new_entries: &[String],
    durability: Durability,
) -> Result<()> {
    let owned = owned_names(old, new_entries);
    let mut kept = Vec::new();
    for entry in marker_last(list(old)?) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if is_set_entry(&name, &owned) {
            let removed = if path.is_dir() && !path.is_symlink() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.map_err(io_err(&path, "remove the old set's entry"))?;
        } else if !merge_back(&path, &dest.join(&name)) {
            kept.push(name);
        }
    }
    durability.sync_dir(dest);
    if kept.is_empty() {
        std::fs::remove_dir(old).map_err(io_err(old, "remove the old set's directory"))?;
        return Ok(());
    }
    Err(CkptError::OldSetKept {
        path: dest.to_path_buf(),
        kept: old.to_path_buf(),
        entries: kept,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_sets_marker_is_retired_last() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["rank_0", "rank_5", "zz"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        for name in [SET_MARKER, "a.json", STAGING_SENTINEL] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        let names: Vec<String> = marker_last(list(dir.path()).unwrap())
            .iter()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 6);
        assert_eq!(
            names.last().map(String::as_str),
            Some(SET_MARKER),
            "{names:?}"
        );
    }
}
