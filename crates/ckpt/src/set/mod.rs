//! Checkpoint sets: a checkpoint directory appears whole or not at all.
//!
//! A *set* is what one save or one conversion writes into a destination directory `DST`: its
//! `rank_<N>/` folders, its other files (strategies, index files) and the marker
//! `tessera_set.json` ([`SetMarker`]) that lists them. Writing one ([`SetWriter`]):
//!
//! 1. **Lock.** `<parent>/.<name>.tessera-lock` is locked with `flock` ([`DestLock`]); a
//!    second writer fails at once naming the holder.
//! 2. **Recover.** Leftovers of a writer that died (staging or retired directories, see
//!    below) are cleaned up: a staging directory is removed, a retired one has its foreign
//!    entries moved back into `DST` first.
//! 3. **Stage.** Every file is written into a fresh sibling `<parent>/.<name>.tessera-staging-<id>`
//!    (unique per writer) holding the sentinel `.tessera-staging`, each file fsynced.
//! 4. **Mark.** The marker is written and fsynced.
//! 5. **Link.** Entries of `DST` that belong to no set (a metrics log, a user's notes) are
//!    hard-linked into the staging directory, so the new `DST` holds them from its first instant.
//! 6. **Switch.** The staging directory becomes `DST` with one `rename` (`RENAME_NOREPLACE`
//!    when `DST` does not exist, `RENAME_EXCHANGE` when it does), and the parent is fsynced.
//!    This is the commit point: before it readers see the old `DST`, after it the new one.
//! 7. **Retire.** The old set's entries are removed (a stale `rank_<N>/` of an earlier, larger
//!    run goes with them); foreign entries not linked before the switch are moved into `DST`.
//!
//! Under [`crate::Durability::OsBuffered`] (the writers' `fsync: false`) steps 3, 4 and 6 skip
//! every fsync and nothing else: the switch is as atomic against a failing process, but a power
//! loss soon after may lose the new set.
//!
//! Readers ([`check_set`]) refuse a directory that is a staging directory (uncommitted) or
//! whose files disagree with its marker (mixed): a missing or resized file, a `rank_<N>/` the
//! marker does not list, a safetensors file carrying another set's id. A directory without a
//! marker (MindSpore's own checkpoints) is read as before. A reader that finds the directory
//! replaced by another set while it opens the files (`DirIdentity`) stops with
//! [`CkptError::SetReplaced`].

mod lock;
mod marker;
pub(crate) mod switch;
pub(crate) mod writer;

use std::path::{Path, PathBuf};

use crate::error::{io_err, CkptError, Result};
use crate::io::atomic_write::create_missing_dirs;
pub(crate) use crate::io::pending;

pub use lock::DestLock;
pub use marker::{SetFile, SetMarker, SET_ID_KEY, SET_MARKER};
pub use pending::abandon_pending_sets;
pub use writer::SetWriter;

/// A set's strategy file, in Tessera JSON: what `tessera train` writes beside the rank folders,
/// what a conversion to a destination strategy writes into its output (that strategy, bound to
/// the shapes and dtypes written), and what a resumed run (`output.resume_from`) reads the set
/// under when `output.resume_strategy` names no other file.
pub const SET_STRATEGY_FILE: &str = "strategy.json";

/// The file that marks a directory as a staging directory (an uncommitted set).
pub(crate) const STAGING_SENTINEL: &str = ".tessera-staging";

/// `<parent>/.<name>.<suffix>`: a hidden sibling of `dest` (a resolved destination).
pub(crate) fn sibling(dest: &Path, suffix: &str) -> PathBuf {
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    dest.with_file_name(format!(".{name}.{suffix}"))
}

/// The rank of a `rank_<N>` entry name.
pub(crate) fn rank_of_entry(name: &str) -> Option<usize> {
    name.strip_prefix("rank_")
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse().ok())
}

/// An absolute destination path whose parent exists (`.` and `..` resolved, symlinks of an
/// existing destination followed), and the parent directories that had to be created for it,
/// outermost first.
pub(crate) fn resolve_destination(dest: &Path) -> Result<(PathBuf, Vec<PathBuf>)> {
    if dest.as_os_str().is_empty() {
        return Err(CkptError::EmptyDestination);
    }
    if dest.exists() {
        let resolved = std::fs::canonicalize(dest).map_err(io_err(dest, "resolve path"))?;
        if resolved.parent().is_none() {
            return Err(CkptError::UnsafeDestination {
                path: dest.to_path_buf(),
                rule: "a checkpoint cannot replace the root directory".to_string(),
            });
        }
        return Ok((resolved, Vec::new()));
    }
    let name = dest
        .file_name()
        .ok_or_else(|| CkptError::UnsafeDestination {
            path: dest.to_path_buf(),
            rule: "not a directory name".to_string(),
        })?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let created = create_missing_dirs(&parent)?;
    let parent = std::fs::canonicalize(&parent).map_err(io_err(&parent, "resolve path"))?;
    Ok((parent.join(name), created))
}

/// Which directory a path leads to (device and inode), so a reader can tell that a writer
/// switched another set into its place ([`DirIdentity::check`]) while it opened the files one
/// by one: a switch gives the path a new directory, never changes the old one's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirIdentity {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl DirIdentity {
    /// The directory `dir` leads to now (symlinks followed).
    pub(crate) fn of(dir: &Path) -> Result<DirIdentity> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(dir).map_err(io_err(dir, "read metadata"))?;
        Ok(DirIdentity {
            path: dir.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// [`CkptError::SetReplaced`] unless the path still leads to the same directory (`removed`
    /// when it leads nowhere now).
    pub(crate) fn check(&self) -> Result<()> {
        match std::fs::metadata(&self.path) {
            Ok(_) if DirIdentity::of(&self.path).is_ok_and(|now| now == *self) => Ok(()),
            found => Err(CkptError::SetReplaced {
                path: self.path.clone(),
                removed: found.is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound),
            }),
        }
    }
}

/// Validates the set in `dir` for a reader: `Ok(Some(marker))` for a committed set whose files
/// match its marker, `Ok(None)` for a directory without a marker (not written as a set), and
/// [`CkptError::UncommittedSet`] or [`CkptError::MixedSet`] (the first fault) otherwise.
pub fn check_set(dir: &Path) -> Result<Option<SetMarker>> {
    let audit = audit_set(dir)?;
    match audit.faults.into_iter().next() {
        Some(fault) => Err(fault),
        None => Ok(audit.marker),
    }
}

/// What [`audit_set`] found.
#[derive(Debug)]
pub struct SetAudit {
    /// The directory's marker, if it has one.
    pub marker: Option<SetMarker>,
    /// Every disagreement between the directory and its marker.
    pub faults: Vec<CkptError>,
}

/// Every fault of the set in `dir` (see [`check_set`]); errors only when the directory or its
/// marker cannot be read at all.
pub fn audit_set(dir: &Path) -> Result<SetAudit> {
    let staging_name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.') && n.contains(".tessera-staging-"));
    if staging_name || dir.join(STAGING_SENTINEL).exists() {
        return Ok(SetAudit {
            marker: None,
            faults: vec![CkptError::UncommittedSet {
                path: dir.to_path_buf(),
                reason: "it is the staging directory of a write that has not committed (or was interrupted)".to_string(),
            }],
        });
    }
    let Some(marker) = SetMarker::read(dir)? else {
        return Ok(SetAudit {
            marker: None,
            faults: Vec::new(),
        });
    };
    let mut faults = Vec::new();
    let mixed = |reason: String| CkptError::MixedSet {
        path: dir.to_path_buf(),
        id: marker.id.clone(),
        reason,
    };
    for file in &marker.files {
        let path = SetMarker::file_path(dir, file);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() && m.len() == file.bytes => {
                let Some(listed) = file.crc32 else { continue };
                if marker::file_crc32(&path)? != listed {
                    faults.push(mixed(format!(
                        "{}'s contents are not the set's: its CRC-32 differs from the one the \
                         set lists (edited or replaced by another file of the same size)",
                        file.path
                    )));
                }
            }
            Ok(m) if m.is_file() => faults.push(mixed(format!(
                "{} has {} bytes but the set lists {} bytes (it is not the set's file)",
                file.path,
                m.len(),
                file.bytes
            ))),
            Ok(_) => faults.push(mixed(format!("{} is not a regular file", file.path))),
            Err(_) => faults.push(mixed(format!("{} is listed but missing", file.path))),
        }
    }
    for entry in std::fs::read_dir(dir).map_err(io_err(dir, "list directory"))? {
        let entry = entry.map_err(io_err(dir, "list directory"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(rank) = rank_of_entry(&name) {
            if !marker.ranks.contains(&rank) {
                faults.push(mixed(format!(
                    "{name}/ is not one of the set's rank folders {:?} (a stale or foreign rank)",
                    marker.ranks
                )));
            }
        }
    }
    Ok(SetAudit {
        marker: Some(marker),
        faults,
    })
}

/// Checks that a file's set id (its safetensors `tessera_set` metadata, `None` for files
/// without one) agrees with the set `dir` holds (`expected`: the marker's id).
pub(crate) fn check_file_id(
    dir: &Path,
    file: &Path,
    expected: Option<&str>,
    found: Option<&str>,
) -> Result<()> {
    match (expected, found) {
        (Some(e), Some(f)) if e != f => Err(CkptError::MixedSet {
            path: dir.to_path_buf(),
            id: e.to_string(),
            reason: format!("{} belongs to set {f}", file.display()),
        }),
        _ => Ok(()),
    }
}
