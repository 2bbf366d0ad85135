//! [`SetWriter`]: one set being written (lock, staging directory, commit).

use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::switch::{link_foreign, retire, switch};
use super::{
    pending, resolve_destination, sibling, DestLock, SetMarker, SET_ID_KEY, SET_MARKER,
    STAGING_SENTINEL,
};
use crate::error::{io_err, CkptError, Result};
use crate::io::atomic_write::{remove_empty_dirs, write_file_with};
use crate::io::durability::Durability;

/// The infix of staging directory names: `.<name>.tessera-staging-<id>`.
const STAGING_INFIX: &str = "tessera-staging-";

/// A set being written into a staging directory beside its destination, under the
/// destination's lock. Dropped without [`SetWriter::commit`], it removes the staging directory
/// (and any parent directories it created) and leaves the destination untouched.
#[derive(Debug)]
pub struct SetWriter {
    /// The destination as the caller named it (for the paths reported).
    given: PathBuf,
    /// The destination, resolved (absolute, parent existing).
    dest: PathBuf,
    staging: PathBuf,
    id: String,
    tool: String,
    created_parents: Vec<PathBuf>,
    committed: bool,
    /// Whether the staged files, the marker and the directories are flushed to disk.
    durability: Durability,
    /// Held until the staging directory is cleaned up (then released before the parents this
    /// writer created are removed, since its file lives in the innermost one).
    lock: Option<DestLock>,
}

impl SetWriter {
    /// Locks `dest`, cleans up after writers that died, and creates a fresh staging
    /// directory. Refuses a `dest` that exists and is not an empty directory unless `force`;
    /// `tool` names the operation in the marker (`"ckpt convert"`). Durable: see
    /// [`SetWriter::begin_with`].
    pub fn begin(dest: &Path, tool: &str, force: bool) -> Result<SetWriter> {
        Self::begin_with(dest, tool, force, Durability::Fsync)
    }

    /// [`SetWriter::begin`] with the given durability: under [`Durability::OsBuffered`] the
    /// sentinel, the marker and the directories are never fsynced (the caller writes the set's
    /// own files with the same durability, [`SetWriter::durability`]); everything else, the
    /// staging, the lock, the atomic switch and the cleanup, is the same.
    pub fn begin_with(
        dest: &Path,
        tool: &str,
        force: bool,
        durability: Durability,
    ) -> Result<SetWriter> {
        let (resolved, created_parents) = resolve_destination(dest)?;
        let undo = |e: CkptError| {
            remove_empty_dirs(&created_parents);
            e
        };
        let lock = DestLock::acquire(&resolved).map_err(undo)?;
        let staged = Staged {
            tool,
            force,
            durability,
            lock,
            created_parents: created_parents.clone(),
        };
        let result = Self::stage(&resolved, staged);
        if result.is_err() {
            remove_empty_dirs(&created_parents);
        }
        result.map(|mut w| {
            w.given = dest.to_path_buf();
            w
        })
    }

    /// [`SetWriter::begin_with`] after refusing a destination that is or contains one of
    /// `sources` (the directories the operation reads), or lies inside one of its `rank_<N>/`
    /// folders.
    pub fn begin_apart(
        dest: &Path,
        sources: &[&Path],
        tool: &str,
        force: bool,
        durability: Durability,
    ) -> Result<SetWriter> {
        check_apart(dest, sources)?;
        Self::begin_with(dest, tool, force, durability)
    }

    fn stage(resolved: &Path, staged: Staged<'_>) -> Result<SetWriter> {
        let Staged {
            tool,
            force,
            durability,
            lock,
            created_parents,
        } = staged;
        recover(resolved, durability)?;
        check_destination(resolved, force)?;
        let id = fresh_id();
        let staging = sibling(resolved, &format!("{STAGING_INFIX}{id}"));
        {
            // Created and recorded in one step, so an interruption removes it.
            let mut pending = pending::guard();
            std::fs::create_dir(&staging).map_err(io_err(&staging, "create staging directory"))?;
            pending.push(staging.clone());
        }
        let writer = SetWriter {
            given: resolved.to_path_buf(),
            dest: resolved.to_path_buf(),
            staging,
            id,
            tool: tool.to_string(),
            created_parents,
            committed: false,
            durability,
            lock: Some(lock),
        };
        write_sentinel(&writer.staging, durability)?;
        Ok(writer)
    }

    /// The directory to write the set's files into (paths relative to it are the final ones).
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// The set's id (also written into every safetensors file's metadata).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where `rel` (a path inside the set) is written now: inside the staging directory.
    pub fn staged(&self, rel: &Path) -> PathBuf {
        self.staging.join(rel)
    }

    /// Where `rel` will be once the set is committed, under the destination as given.
    pub fn final_path(&self, rel: &Path) -> PathBuf {
        self.given.join(rel)
    }

    /// The safetensors metadata entry that ties a file to this set.
    pub fn metadata_entry(&self) -> (String, String) {
        (SET_ID_KEY.to_string(), self.id.clone())
    }

    /// The destination (resolved: absolute, `.` and `..` removed).
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Whether the set is flushed to disk as it is committed; the set's own files are to be
    /// written with the same.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Refuses ([`CkptError::UnsafeDestination`], naming the file) to write the top-level
    /// files `names` into the set when the destination already holds an entry of one of those
    /// names that no set marker of the destination lists: a file of the user's (their own
    /// `strategy.json`, say), which committing would replace, though only the set's files were
    /// asked for. An entry the destination's set lists is that set's, replaced with the rest
    /// of it (the existing rule for a destination written with `force`). Call it before the
    /// set's files are written.
    pub fn refuse_foreign(&self, names: &[&str]) -> Result<()> {
        let listed = SetMarker::read(&self.dest)
            .ok()
            .flatten()
            .map(|m| m.entries)
            .unwrap_or_default();
        for name in names {
            let present = std::fs::symlink_metadata(self.dest.join(name)).is_ok();
            if present && !listed.iter().any(|e| e == name) {
                return Err(CkptError::UnsafeDestination {
                    path: self.given.join(name),
                    rule: format!(
                        "the destination already holds this entry and no checkpoint set there \
                         lists it (it is not a file Tessera wrote); \"{}\" writes its own {name} \
                         into the set, which would replace it: move it out of the destination, \
                         or write into another directory",
                        self.tool
                    ),
                });
            }
        }
        Ok(())
    }

    /// Writes the marker and switches the staging directory into place (the commit point), then
    /// retires the directory it replaced. Returns the marker.
    pub fn commit(mut self) -> Result<SetMarker> {
        self.durability.sync_tree(&self.staging)?;
        let marker = SetMarker::describe(&self.staging, &self.id, &self.tool)?;
        write_file_with(
            &self.staging.join(SET_MARKER),
            marker.to_json().as_bytes(),
            false,
            self.durability,
        )?;
        // Entries of the destination that belong to no set are in the new directory from the
        // instant it appears (hard links; the rest is moved after the switch).
        pending::creating(|| link_foreign(&self.dest, &self.staging, &marker.entries))?;
        let sentinel = self.staging.join(STAGING_SENTINEL);
        std::fs::remove_file(&sentinel).map_err(io_err(&sentinel, "remove"))?;
        self.durability.sync_dir(&self.staging);
        // An interruption waits until the switch is done (see `pending`).
        let mut list = pending::guard();
        let switched = switch(&self.staging, &self.dest, &marker, self.durability);
        self.committed = true;
        pending::unregister_in(&mut list, &self.staging);
        drop(list);
        switched?;
        Ok(marker)
    }
}

impl Drop for SetWriter {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.staging);
            pending::unregister(&self.staging);
        }
        drop(self.lock.take());
        if !self.committed {
            remove_empty_dirs(&self.created_parents);
        }
    }
}

/// What [`SetWriter::stage`] needs besides the destination.
struct Staged<'a> {
    tool: &'a str,
    force: bool,
    durability: Durability,
    lock: DestLock,
    created_parents: Vec<PathBuf>,
}

/// `path` made absolute with `.`, `..` and symlinks of its existing part resolved, without
/// creating anything.
fn resolve_lexically(path: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(path).map_err(io_err(path, "resolve path"))?;
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => break,
        }
    }
    let mut out = std::fs::canonicalize(existing).unwrap_or_else(|_| existing.to_path_buf());
    for name in rest.into_iter().rev() {
        if name == ".." {
            out.pop();
        } else if name != "." {
            out.push(name);
        }
    }
    Ok(out)
}

/// Refuses a destination that is or contains one of `sources`, or lies inside one of its
/// `rank_<N>/` folders (where it would change the source's ranks).
pub(crate) fn check_apart(dest: &Path, sources: &[&Path]) -> Result<()> {
    let d = resolve_lexically(dest)?;
    for src in sources {
        let s = resolve_lexically(src)?;
        let in_rank_folder = d
            .strip_prefix(&s)
            .ok()
            .and_then(|rest| rest.components().next())
            .and_then(|c| c.as_os_str().to_str())
            .is_some_and(|first| super::rank_of_entry(first).is_some());
        let rule = if d == s {
            "the destination is the source directory; converting in place would destroy the source"
        } else if in_rank_folder {
            "the destination lies inside one of the source's rank folders"
        } else if s.starts_with(&d) {
            "the destination contains the source directory; replacing it would destroy the source"
        } else {
            continue;
        };
        return Err(CkptError::UnsafeDestination {
            path: dest.to_path_buf(),
            rule: format!("{rule} ({})", src.display()),
        });
    }
    Ok(())
}

/// Refuses an existing `dest` that is not a directory, or not empty, unless `force`.
fn check_destination(dest: &Path, force: bool) -> Result<()> {
    let meta = match std::fs::symlink_metadata(dest) {
        Ok(m) => m,
        Err(_) => return Ok(()),
    };
    if !meta.is_dir() {
        return Err(CkptError::UnsafeDestination {
            path: dest.to_path_buf(),
            rule: "the destination exists and is not a directory".to_string(),
        });
    }
    let empty = std::fs::read_dir(dest)
        .map_err(io_err(dest, "list directory"))?
        .next()
        .is_none();
    if !empty && !force {
        return Err(CkptError::DestinationExists {
            path: dest.to_path_buf(),
        });
    }
    Ok(())
}

/// Creates the empty sentinel in `staging` directly under its own name (no temporary file):
/// a writer killed while making it leaves a staging directory that is empty, which
/// [`recover`] removes, never a stray temporary file that recovery would retire into the
/// destination as a foreign entry.
fn write_sentinel(staging: &Path, durability: Durability) -> Result<()> {
    let path = staging.join(STAGING_SENTINEL);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io_err(&path, "create"))?;
    durability.sync_file(&file, &path)?;
    durability.sync_dir(staging);
    Ok(())
}

/// Whether `stale` (a staging-prefixed directory without the sentinel) is what a writer killed
/// before its sentinel existed leaves: nothing at all, or only the temporary file through which
/// earlier versions wrote the sentinel (`..tessera-staging.<pid>-<n>.tmp`).
fn unborn_staging(stale: &Path) -> bool {
    let tmp_prefix = format!(".{STAGING_SENTINEL}.");
    std::fs::read_dir(stale).is_ok_and(|entries| {
        entries.into_iter().all(|e| {
            e.is_ok_and(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(&tmp_prefix)
                    && name.ends_with(".tmp")
                    && e.file_type().is_ok_and(|t| t.is_file())
            })
        })
    })
}

/// Cleans up after writers of `dest` that died (the caller holds the lock): a staging
/// directory that still has its sentinel is removed, and so is one a writer died creating
/// (empty, or holding only the sentinel's temporary file); any other one without the sentinel
/// (an old directory after the switch, or a new one just before) is retired into `dest`,
/// flushed with `durability`.
fn recover(dest: &Path, durability: Durability) -> Result<()> {
    let Some(parent) = dest.parent() else {
        return Ok(());
    };
    let prefix = sibling(dest, STAGING_INFIX);
    let prefix = prefix.file_name().unwrap_or_default().to_string_lossy();
    let entries = std::fs::read_dir(parent).map_err(io_err(parent, "list directory"))?;
    for entry in entries {
        let entry = entry.map_err(io_err(parent, "list directory"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(prefix.as_ref()) || !entry.path().is_dir() {
            continue;
        }
        let stale = entry.path();
        if stale.join(STAGING_SENTINEL).exists() || unborn_staging(&stale) {
            std::fs::remove_dir_all(&stale).map_err(io_err(&stale, "remove stale staging"))?;
        } else if dest.exists() {
            let current = SetMarker::read(dest).ok().flatten();
            let entries = current.map(|m| m.entries).unwrap_or_default();
            retire(&stale, dest, &entries, durability)?;
        }
        // Otherwise the directory may hold entries of no set with nowhere to go: left alone.
    }
    Ok(())
}

/// A fresh 16-hex-digit id: the process, the clock and a counter, mixed by a randomly keyed
/// hasher.
fn fresh_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::set::{audit_set, check_set};

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn write_set(dest: &Path, ranks: &[usize], force: bool) -> SetMarker {
        let w = SetWriter::begin(dest, "test", force).unwrap();
        for r in ranks {
            let dir = w.staging().join(format!("rank_{r}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("f{r}.bin")), vec![*r as u8; 10 + r]).unwrap();
        }
        std::fs::write(w.staging().join("strategy.json"), b"{}").unwrap();
        w.commit().unwrap()
    }

    #[test]
    fn a_new_set_appears_whole_with_its_marker() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("a/b/out");
        let marker = write_set(&dest, &[0, 1], false);
        assert_eq!(marker.ranks, vec![0, 1]);
        assert_eq!(marker.entries, vec!["rank_0", "rank_1", "strategy.json"]);
        assert_eq!(
            names(&dest),
            vec!["rank_0", "rank_1", "strategy.json", SET_MARKER]
        );
        // Nothing beside it: no staging directory, no lock file.
        assert_eq!(names(&tmp.path().join("a/b")), vec!["out"]);
        assert_eq!(check_set(&dest).unwrap().unwrap().id, marker.id);
    }

    #[test]
    fn replacing_removes_stale_ranks_and_keeps_foreign_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("out");
        write_set(&dest, &[0, 1, 2, 3], false);
        std::fs::write(dest.join("notes.txt"), b"mine").unwrap();
        assert!(matches!(
            SetWriter::begin(&dest, "test", false),
            Err(CkptError::DestinationExists { .. })
        ));
        let marker = write_set(&dest, &[0, 1], true);
        assert_eq!(
            names(&dest),
            vec!["notes.txt", "rank_0", "rank_1", "strategy.json", SET_MARKER]
        );
        assert_eq!(std::fs::read(dest.join("notes.txt")).unwrap(), b"mine");
        assert_eq!(check_set(&dest).unwrap().unwrap().id, marker.id);
        assert_eq!(names(tmp.path()), vec!["out"]);
    }

    #[test]
    fn an_abandoned_writer_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("x/y/out");
        {
            let w = SetWriter::begin(&dest, "test", false).unwrap();
            std::fs::write(w.staging().join("half"), b"..").unwrap();
        }
        assert_eq!(names(tmp.path()), Vec::<String>::new());
    }

    #[test]
    fn a_second_writer_fails_at_once_naming_the_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("out");
        let first = SetWriter::begin(&dest, "test", false).unwrap();
        let err = SetWriter::begin(&dest, "test", true).unwrap_err();
        assert!(
            matches!(&err, CkptError::DestinationLocked { holder, .. } if holder.contains(&std::process::id().to_string())),
            "{err}"
        );
        drop(first);
        write_set(&dest, &[0], false);
    }

    #[test]
    fn leftovers_of_dead_writers_are_recovered() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("out");
        write_set(&dest, &[0, 1], false);
        // A writer died while staging: its directory still has the sentinel.
        let staging = sibling(&dest, "tessera-staging-dead1");
        std::fs::create_dir_all(staging.join("rank_0")).unwrap();
        std::fs::write(staging.join(STAGING_SENTINEL), b"").unwrap();
        // A writer died after the switch: the old directory (an old set of rank 5), holding
        // a foreign file and a rank folder no marker lists (the user's).
        let retired = sibling(&dest, "tessera-staging-dead2");
        write_set(&retired, &[5], false);
        std::fs::write(retired.join("metrics.jsonl"), b"log").unwrap();
        std::fs::create_dir_all(retired.join("rank_6")).unwrap();
        std::fs::write(retired.join("rank_6/keep.txt"), b"mine").unwrap();
        // A reader refuses the staging directory.
        assert!(matches!(
            check_set(&staging),
            Err(CkptError::UncommittedSet { .. })
        ));
        write_set(&dest, &[0], true);
        assert_eq!(names(tmp.path()), vec!["out"]);
        assert_eq!(std::fs::read(dest.join("metrics.jsonl")).unwrap(), b"log");
        assert!(!dest.join("rank_5").exists());
        assert_eq!(
            std::fs::read(dest.join("rank_6/keep.txt")).unwrap(),
            b"mine"
        );
    }

    /// A `rank_<N>` folder the destination holds outside any set (no marker lists it, the new
    /// set does not write it) is the user's: a new set keeps it (and a reader then reports it
    /// as a stale or foreign rank); the old set's own rank folders are removed.
    #[test]
    fn a_rank_folder_of_no_set_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("out");
        write_set(&dest, &[0, 1, 2], false);
        std::fs::create_dir_all(dest.join("rank_5")).unwrap();
        std::fs::write(dest.join("rank_5/keep.txt"), b"mine").unwrap();
        write_set(&dest, &[0], true);
        assert!(!dest.join("rank_1").exists() && !dest.join("rank_2").exists());
        assert_eq!(
            std::fs::read(dest.join("rank_5/keep.txt")).unwrap(),
            b"mine"
        );
        let audit = audit_set(&dest).unwrap();
        assert!(
            audit
                .faults
                .iter()
                .any(|f| f.to_string().contains("rank_5/")),
            "{:?}",
            audit.faults
        );
    }

    #[test]
    fn audit_finds_every_disagreement_with_the_marker() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("out");
        write_set(&dest, &[0, 1, 2], false);
        std::fs::write(dest.join("rank_0/f0.bin"), b"resized").unwrap();
        std::fs::remove_file(dest.join("rank_1/f1.bin")).unwrap();
        std::fs::create_dir(dest.join("rank_7")).unwrap();
        let audit = audit_set(&dest).unwrap();
        let text: Vec<String> = audit.faults.iter().map(|e| e.to_string()).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(text[0].contains("rank_0/f0.bin has 7 bytes"), "{text:?}");
        assert!(
            text[1].contains("rank_1/f1.bin is listed but missing"),
            "{text:?}"
        );
        assert!(
            text[2].contains("rank_7/ is not one of the set's rank folders"),
            "{text:?}"
        );
        assert!(matches!(check_set(&dest), Err(CkptError::MixedSet { .. })));
    }

    #[test]
    fn a_destination_inside_or_around_the_source_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir(&src).unwrap();
        for dest in [
            src.clone(),
            src.join("rank_3"),
            src.join("rank_0/x"),
            tmp.path().to_path_buf(),
            src.join(".."),
        ] {
            let err = SetWriter::begin_apart(&dest, &[&src], "test", true, Durability::Fsync)
                .unwrap_err();
            assert!(matches!(err, CkptError::UnsafeDestination { .. }), "{err}");
        }
        assert_eq!(names(&src), Vec::<String>::new());
        SetWriter::begin_apart(
            &tmp.path().join("dst"),
            &[&src],
            "test",
            false,
            Durability::Fsync,
        )
        .unwrap();
        // Beside the rank folders is allowed (a merge into `run/merged`).
        SetWriter::begin_apart(
            &src.join("merged"),
            &[&src],
            "test",
            false,
            Durability::Fsync,
        )
        .unwrap();
    }
}
