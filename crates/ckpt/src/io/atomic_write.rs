//! Atomic file creation: write `.<name>.<pid>-<n>.tmp` beside the destination (a name unique
//! to this process and write, so concurrent writers never share one), fsync it, rename it into
//! place, fsync the directory (both fsyncs only under [`Durability::Fsync`]). A reader never
//! sees a half-written file, and a failure (or a panic, or an early return) removes the
//! temporary file and the parent directories the write created (those still empty). Without
//! `force` the rename never replaces a file another writer put there meanwhile. The temporary
//! files of the same destination that killed writers left are removed first
//! ([`remove_stale_temporaries`]).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::durability::Durability;
use super::pending;
use crate::error::{io_err, CkptError, Result};

/// A destination being written. Dropped without [`AtomicFile::commit`], it removes its
/// temporary file and leaves the destination untouched.
#[derive(Debug)]
pub(crate) struct AtomicFile {
    dest: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
    durability: Durability,
    /// Whether the commit may replace a file at the destination; without it a file that
    /// appeared there meanwhile (a concurrent writer's) makes the commit fail.
    force: bool,
    /// The parent directories this write created, outermost first: removed (when empty) if
    /// the file is never committed, since the tool did not find them and made nothing in them.
    created_dirs: Vec<PathBuf>,
}

/// Fails with [`CkptError::DestinationExists`] when `path` exists and `force` is off, and with
/// [`CkptError::UnsafeDestination`] when it exists and is not a regular file, forced or not:
/// the rename into place would replace a device, a FIFO, a socket or a directory the tool did
/// not create (as root, `/dev/full` became a plain file).
pub(crate) fn check_destination(path: &Path, force: bool) -> Result<()> {
    if let Ok(meta) = fs::metadata(path) {
        if !meta.is_file() {
            return Err(CkptError::UnsafeDestination {
                path: path.to_path_buf(),
                rule: "it exists and is not a regular file (a device, a FIFO, a socket or a \
                       directory), which writing the file into place would replace"
                    .to_string(),
            });
        }
    }
    if !force && path.exists() {
        return Err(CkptError::DestinationExists {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Creates `dir` and its missing parents; the directories created, outermost first. A failure
/// removes those it had created and names the directory that could not be made.
pub(crate) fn create_missing_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.as_os_str().is_empty() && !at.exists() {
        missing.push(at.to_path_buf());
        at = at.parent().unwrap_or(Path::new(""));
    }
    let mut created = Vec::new();
    for dir in missing.into_iter().rev() {
        match fs::create_dir(&dir) {
            Ok(()) => created.push(dir),
            // Made by a concurrent writer (or a directory after all): not ours to remove.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => {
                remove_empty_dirs(&created);
                return Err(io_err(&dir, "create directory")(e));
            }
        }
    }
    Ok(created)
}

/// The directories an output created for itself: dropped before [`CreatedDirs::keep`] (the
/// output failed), it removes those still empty, never one it found. Also what other crates
/// create their output directories with (the training run's `output.dir`).
#[derive(Debug)]
#[must_use = "dropping it removes the directories it created"]
pub struct CreatedDirs(Vec<PathBuf>);

impl CreatedDirs {
    /// Creates `dir` and its missing parents, remembering which were made. A failure removes
    /// those it had made and is [`crate::CkptError::Io`] naming the directory that could not
    /// be made.
    pub fn create(dir: &Path) -> Result<CreatedDirs> {
        create_missing_dirs(dir).map(CreatedDirs)
    }

    /// The output is done: its directories stay.
    pub fn keep(mut self) {
        self.0.clear();
    }
}

impl Drop for CreatedDirs {
    fn drop(&mut self) {
        remove_empty_dirs(&self.0);
    }
}

/// Removes the directories of `created` (outermost first) that are empty, innermost first.
pub(crate) fn remove_empty_dirs(created: &[PathBuf]) {
    for dir in created.iter().rev() {
        // Fails, and keeps the directory, when anything is in it.
        let _ = fs::remove_dir(dir);
    }
}

impl AtomicFile {
    /// Starts writing `dest` through `<dest>.tmp`, to be committed with `durability`. Refuses
    /// an existing `dest` unless `force`.
    pub(crate) fn create(dest: &Path, force: bool, durability: Durability) -> Result<AtomicFile> {
        check_destination(dest, force)?;
        pending::creating(|| Self::create_unguarded(dest, force, durability))
    }

    fn create_unguarded(dest: &Path, force: bool, durability: Durability) -> Result<AtomicFile> {
        let parent = dest.parent().filter(|p| !p.as_os_str().is_empty());
        let created_dirs = match parent {
            Some(parent) => create_missing_dirs(parent)?,
            None => Vec::new(),
        };
        // What a writer of this file that was killed (SIGKILL, power loss) left: removed, so
        // re-running a killed command leaves nothing behind. Best effort: a temporary file that
        // cannot be removed is only clutter, never read.
        if let Some(name) = dest.file_name().and_then(|n| n.to_str()) {
            let _ = remove_stale_temporaries(parent.unwrap_or(Path::new(".")), &[name.to_string()]);
        }
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(dest.file_name().unwrap_or_default());
        tmp_name.push(format!(".{}-{n}.tmp", std::process::id()));
        let tmp = dest.with_file_name(tmp_name);
        let file = match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(file) => file,
            Err(e) => {
                remove_empty_dirs(&created_dirs);
                return Err(io_err(&tmp, "create")(e));
            }
        };
        // Held until the file is renamed into place (or removed): it tells this live write
        // from the temporary file of a writer that was killed (see `remove_stale_temporaries`).
        // A filesystem without `flock` leaves the file unlocked, and then never removed by it.
        let _ = try_lock(&file);
        Ok(AtomicFile {
            dest: dest.to_path_buf(),
            tmp,
            file: Some(file),
            durability,
            force,
            created_dirs,
        })
    }

    /// The final path.
    pub(crate) fn dest(&self) -> &Path {
        &self.dest
    }

    fn file(&mut self) -> &mut File {
        self.file
            .as_mut()
            .expect("an uncommitted AtomicFile has its file")
    }

    /// The open temporary file, for positioned writes.
    pub(crate) fn as_file(&self) -> &File {
        self.file
            .as_ref()
            .expect("an uncommitted AtomicFile has its file")
    }

    /// Appends `data`.
    pub(crate) fn write_all(&mut self, data: &[u8]) -> Result<()> {
        let tmp = self.tmp.clone();
        self.file().write_all(data).map_err(io_err(tmp, "write"))?;
        Ok(())
    }

    /// Flushes the data to disk, renames the file into place and flushes the directory entry
    /// (the flushes only under [`Durability::Fsync`]). Without `force` the rename never
    /// replaces a file: one that another writer put at the destination since
    /// [`AtomicFile::create`] checked it is [`CkptError::DestinationExists`], and stays.
    pub(crate) fn commit(mut self) -> Result<PathBuf> {
        let file = self.file.take().expect("commit runs once");
        if let Err(e) = self.durability.sync_file(&file, &self.tmp) {
            // Dropped below with its file gone: remove the temporary file here.
            drop(file);
            let _ = fs::remove_file(&self.tmp);
            return Err(e);
        }
        // Renamed while still open (and locked), so no cleaner takes it for a killed writer's.
        let renamed = pending::creating(|| rename_into_place(&self.tmp, &self.dest, self.force));
        drop(file);
        if let Err(e) = renamed {
            // Not in place (a directory appeared at the destination, say, or without `force`
            // a concurrent writer's file): the temporary file is removed here, the directories
            // this write created on drop.
            let _ = fs::remove_file(&self.tmp);
            let file_there = fs::symlink_metadata(&self.dest).is_ok_and(|m| m.is_file());
            if !self.force && e.kind() == std::io::ErrorKind::AlreadyExists && file_there {
                return Err(CkptError::DestinationExists {
                    path: self.dest.clone(),
                });
            }
            return Err(io_err(&self.dest, "rename into place")(e));
        }
        // In place: the directories it created hold it now.
        self.created_dirs.clear();
        if let Some(parent) = self.dest.parent() {
            let dir = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            // Persist the rename.
            self.durability.sync_dir(dir);
        }
        Ok(std::mem::take(&mut self.dest))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
        // Empty unless the file never reached its place.
        remove_empty_dirs(&self.created_dirs);
    }
}

/// Renames `tmp` to `dest`; without `force` never over an existing `dest` (`RENAME_NOREPLACE`;
/// a filesystem without it falls back to a plain rename, after the earlier existence check).
fn rename_into_place(tmp: &Path, dest: &Path, force: bool) -> std::io::Result<()> {
    use crate::set::switch::{rename2, RenameMode};
    if !force {
        match rename2(tmp, dest, RenameMode::NoReplace) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {}
            done => return done,
        }
    }
    fs::rename(tmp, dest)
}

/// Takes `flock(LOCK_EX | LOCK_NB)` on `file`; whether it was granted.
fn try_lock(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: `file` is an open descriptor for the duration of the call.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Removes from `dir` the temporary files that writers of `names` (file names in `dir`) were
/// killed while writing (SIGKILL, power loss): `.<name>.<pid>-<n>.tmp`, regular files that no
/// live writer holds locked. Files of writers still running (in this or another process, on a
/// filesystem honouring `flock`) are locked and kept, and so are those whose process is still
/// alive on this host (a writer locks its file just after creating it); nothing else is
/// touched. Returns the files removed.
pub(crate) fn remove_stale_temporaries(dir: &Path, names: &[String]) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(io_err(dir, "list directory")(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err(dir, "list directory"))?;
        let file_name = entry.file_name();
        let Some(entry_name) = file_name.to_str() else {
            continue;
        };
        let pid = names.iter().find_map(|n| temporary_pid(entry_name, n));
        let Some(pid) = pid else {
            continue;
        };
        if !entry.file_type().is_ok_and(|t| t.is_file()) || process_alive(pid) {
            continue;
        }
        let path = entry.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if try_lock(&file) {
            fs::remove_file(&path).map_err(io_err(&path, "remove stale temporary file"))?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// The writer's process id when `entry` is `.<name>.<pid>-<n>.tmp`, the temporary name
/// [`AtomicFile`] gives `name`.
fn temporary_pid(entry: &str, name: &str) -> Option<u32> {
    let rest = entry
        .strip_prefix('.')
        .and_then(|r| r.strip_prefix(name))
        .and_then(|r| r.strip_prefix('.'))
        .and_then(|r| r.strip_suffix(".tmp"))?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (pid, n) = rest.split_once('-')?;
    if !digits(pid) || !digits(n) {
        return None;
    }
    pid.parse().ok()
}

/// Whether process `pid` exists on this host (this process included).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Commits finished files on a background thread, so the disk flushes one file while the next
/// is being assembled (a conversion would otherwise alternate between CPU work and waiting for
/// `fsync`). At most one finished file waits in the queue. Dropping the committer waits for the
/// files already handed over; [`Committer::finish`] also reports the first failure.
pub(crate) struct Committer {
    tx: Option<std::sync::mpsc::SyncSender<AtomicFile>>,
    handle: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Committer {
    /// Starts the committing thread.
    pub(crate) fn new() -> Committer {
        let (tx, rx) = std::sync::mpsc::sync_channel::<AtomicFile>(1);
        let handle = std::thread::spawn(move || {
            let mut first_error = None;
            for file in rx {
                if first_error.is_some() {
                    drop(file); // removes its temporary file
                    continue;
                }
                if let Err(e) = file.commit() {
                    first_error = Some(e);
                }
            }
            first_error.map_or(Ok(()), Err)
        });
        Committer {
            tx: Some(tx),
            handle: Some(handle),
        }
    }

    /// Hands a finished file over to be flushed and renamed into place.
    pub(crate) fn submit(&self, file: AtomicFile) -> Result<()> {
        let dest = file.dest().to_path_buf();
        self.tx
            .as_ref()
            .expect("a live committer")
            .send(file)
            .map_err(|_| CkptError::Io {
                path: dest,
                op: "commit",
                source: std::io::Error::other("the committing thread stopped"),
            })
    }

    /// Waits until every file handed over is committed; the first failure, if any.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.join()
    }

    fn join(&mut self) -> Result<()> {
        drop(self.tx.take());
        match self.handle.take() {
            Some(h) => h.join().unwrap_or(Err(CkptError::ThreadPanicked {
                thread: "the committing thread",
            })),
            None => Ok(()),
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

/// Writes `data` to `dest` atomically and durably.
pub(crate) fn write_file(dest: &Path, data: &[u8], force: bool) -> Result<PathBuf> {
    write_file_with(dest, data, force, Durability::Fsync)
}

/// Writes `data` to `dest` atomically, with `durability`.
pub(crate) fn write_file_with(
    dest: &Path,
    data: &[u8],
    force: bool,
    durability: Durability,
) -> Result<PathBuf> {
    let mut f = AtomicFile::create(dest, force, durability)?;
    f.write_all(data)?;
    f.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `force`, a file another writer put at the destination after the existence
    /// check (two writers racing for a new file) is never replaced: the commit fails, names
    /// the file and leaves the other writer's file and no temporary file.
    #[test]
    fn a_file_that_appeared_meanwhile_is_not_replaced_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("merged.ckpt");
        let mut mine = AtomicFile::create(&dest, false, Durability::OsBuffered).unwrap();
        mine.write_all(b"mine").unwrap();
        write_file(&dest, b"theirs", false).unwrap();
        let err = mine.commit().unwrap_err();
        assert!(
            matches!(&err, CkptError::DestinationExists { path } if path == &dest),
            "{err}"
        );
        assert_eq!(fs::read(&dest).unwrap(), b"theirs");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        // With force the later writer replaces it.
        let mut forced = AtomicFile::create(&dest, true, Durability::OsBuffered).unwrap();
        forced.write_all(b"forced").unwrap();
        forced.commit().unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"forced");
    }

    /// A writer killed mid-write (SIGKILL) leaves `.<name>.<pid>-<n>.tmp`; the next write of
    /// that file removes it, but keeps a temporary file of a process still alive, those of
    /// other files and everything else.
    #[test]
    fn a_write_removes_what_a_killed_writer_of_the_file_left() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("merged.ckpt");
        // Pids above any pid_max: processes that cannot exist.
        let stale = [
            ".merged.ckpt.999999942-0.tmp",
            ".merged.ckpt.999999943-5.tmp",
        ];
        let alive = format!(".merged.ckpt.{}-77.tmp", std::process::id());
        let kept = [
            alive.as_str(),
            ".other.ckpt.999999942-0.tmp",
            ".merged.ckpt.tmp",
            "merged.ckpt.999999942-0.tmp",
            "keep.txt",
        ];
        for name in stale.iter().chain(&kept) {
            fs::write(dir.path().join(name), b"half").unwrap();
        }
        write_file(&dest, b"whole", false).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"whole");
        for name in stale {
            assert!(!dir.path().join(name).exists(), "{name} was left");
        }
        for name in kept {
            assert!(dir.path().join(name).exists(), "{name} was removed");
        }
    }

    #[test]
    fn dropped_file_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("a.bin");
        {
            let mut f = AtomicFile::create(&dest, false, Durability::Fsync).unwrap();
            f.write_all(b"half").unwrap();
        }
        assert!(!dest.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// A write that fails removes the parent directories it created (a full disk, a file-size
    /// limit), never one it found, nor one that holds anything.
    #[test]
    fn a_failed_write_removes_the_directories_it_created() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("existing");
        fs::create_dir(&existing).unwrap();
        {
            let mut f =
                AtomicFile::create(&existing.join("a/b/x.bin"), false, Durability::Fsync).unwrap();
            f.write_all(b"half").unwrap();
            assert!(existing.join("a/b").is_dir());
        }
        assert_eq!(fs::read_dir(&existing).unwrap().count(), 0, "a/ is gone");
        // A directory it created that another file went into stays.
        {
            let _f =
                AtomicFile::create(&existing.join("c/y.bin"), false, Durability::Fsync).unwrap();
            fs::write(existing.join("c/other"), b"x").unwrap();
        }
        assert!(existing.join("c/other").is_file());
        // A committed file keeps its directories.
        write_file(&existing.join("d/e/z.bin"), b"z", false).unwrap();
        assert_eq!(fs::read(existing.join("d/e/z.bin")).unwrap(), b"z");
        // A parent that is a file: nothing is created, the error names the directory.
        let err = write_file(&existing.join("d/e/z.bin/f/g.bin"), b"g", false).unwrap_err();
        assert!(err.to_string().contains("z.bin/f"), "{err}");
        assert_eq!(fs::read_dir(existing.join("d/e")).unwrap().count(), 1);
    }

    /// A rename that fails (a directory appeared at the destination after the write began)
    /// removes the temporary file and the directories the write created.
    #[test]
    fn a_failed_rename_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("new/a.bin");
        let mut f = AtomicFile::create(&dest, false, Durability::OsBuffered).unwrap();
        f.write_all(b"data").unwrap();
        fs::create_dir_all(dest.join("in_the_way")).unwrap();
        let err = f.commit().unwrap_err();
        assert!(err.to_string().contains("rename into place"), "{err}");
        let names: Vec<_> = fs::read_dir(dir.path().join("new"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.bin"], "only the directory in the way");
    }

    #[test]
    fn never_replaces_what_is_not_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.expect("mkfifo").success());
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        for (dest, force) in [(&fifo, true), (&fifo, false), (&sub, true)] {
            let err = write_file(dest, b"x", force).unwrap_err();
            assert!(
                matches!(err, CkptError::UnsafeDestination { .. }),
                "{}: {err}",
                dest.display()
            );
            assert!(err.to_string().contains("not a regular file"), "{err}");
        }
        use std::os::unix::fs::FileTypeExt;
        assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(sub.is_dir());
        // Only the FIFO and the directory: no temporary file left beside them.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn refuses_existing_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("a.bin");
        write_file(&dest, b"one", false).unwrap();
        assert!(matches!(
            write_file(&dest, b"two", false),
            Err(CkptError::DestinationExists { .. })
        ));
        assert_eq!(fs::read(&dest).unwrap(), b"one");
        write_file(&dest, b"two", true).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"two");
    }
}
