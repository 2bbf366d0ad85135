//! This node's launcher-owned directories on the memory file system (`/dev/shm`; the temporary
//! directory where there is none), each private to its launcher and removed with everything in
//! it when the launcher ends:
//! - the in-memory **store** for `train.elastic`'s snapshots, named in every rank's
//!   `TESSERA_ELASTIC_DIR`. It outlives the job's attempts, so a restarted job finds the
//!   snapshots of the one that failed;
//! - OpenMPI's **scratch**: its session directory and its shared-memory segments, which `mpirun`
//!   leaves behind when the launcher has to kill it (SIGKILL after `--grace-period`).
//!
//! A launcher that was killed (SIGKILL) cannot remove its directories: each holds its launcher's
//! process id and start time, and the next launcher on the node removes the ones whose launcher
//! is gone. The running launcher also holds a lock (`flock`) on that owner file: a launcher in
//! another PID namespace sharing `/dev/shm` (containers started with `--ipc=host`) cannot see
//! the owner's process, and the lock keeps it from taking a running job's directory for a gone
//! one.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The name prefix of every elastic store.
const PREFIX: &str = "tessera-elastic-";
/// The name prefix of every OpenMPI scratch directory.
const SCRATCH_PREFIX: &str = "tessera-mpi-";
/// The file naming a directory's launcher: `<pid> <start time in clock ticks>`.
const OWNER_FILE: &str = ".tessera-launch-owner";

/// A directory of this launcher's, removed with everything in it when dropped; its owner file
/// stays locked while it lives.
#[derive(Debug)]
pub struct OwnedDir {
    // Declared first so the lock is let go only after the directory is gone.
    dir: tempfile::TempDir,
    _lock: std::fs::File,
}

impl OwnedDir {
    /// The directory's path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Creates this launcher's store, after removing the stores of launchers that are gone.
pub fn create() -> anyhow::Result<OwnedDir> {
    create_owned(PREFIX, "the elastic store")
}

/// Creates this launcher's scratch directory for OpenMPI (`mpirun --mca orte_tmpdir_base` and
/// `btl_vader_backing_directory`), after removing those of launchers that are gone.
pub fn create_mpi_scratch() -> anyhow::Result<OwnedDir> {
    create_owned(SCRATCH_PREFIX, "OpenMPI's scratch directory")
}

/// A new directory `<prefix>XXXX` on the memory file system holding its owner file (locked
/// while the directory lives), after the ones of gone launchers with the same prefix were
/// removed.
fn create_owned(prefix: &str, what: &str) -> anyhow::Result<OwnedDir> {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    create_owned_in(&base, prefix, what)
}

/// [`create_owned`] in the directory `base`.
fn create_owned_in(base: &Path, prefix: &str, what: &str) -> anyhow::Result<OwnedDir> {
    remove_orphans(base, prefix);
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)
        .with_context(|| format!("cannot create {what} in {}", base.display()))?;
    let me = std::process::id();
    let owner = format!("{me} {}", start_time(me).unwrap_or(0));
    let owner_file = dir.path().join(OWNER_FILE);
    std::fs::write(&owner_file, owner)
        .with_context(|| format!("cannot write {}", owner_file.display()))?;
    let lock = std::fs::File::open(&owner_file)
        .with_context(|| format!("cannot open {}", owner_file.display()))?;
    // A file system without locks leaves only the process check to tell a running owner.
    let _ = try_lock(&lock);
    Ok(OwnedDir { dir, _lock: lock })
}

/// Takes an exclusive `flock` on `file` without waiting: Ok(true) when taken, Ok(false) when
/// another open file holds it.
fn try_lock(file: &std::fs::File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: flock(2) on a descriptor `file` owns, with plain integers.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.kind() {
        std::io::ErrorKind::WouldBlock => Ok(false),
        _ => Err(err),
    }
}

/// Whether the owner file at `path` is locked by a running launcher (a launcher in another PID
/// namespace, whose process id means nothing here, included).
fn locked_by_a_launcher(path: &Path) -> bool {
    match std::fs::File::open(path) {
        // The lock taken here is let go when `file` is dropped.
        Ok(file) => matches!(try_lock(&file), Ok(false)),
        Err(_) => false,
    }
}

/// Removes the directories named `<prefix>…` in `base` whose launcher (named in the owner file)
/// no longer runs. Directories without an owner file are not Tessera's and stay.
fn remove_orphans(base: &Path, prefix: &str) {
    for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(prefix) {
            continue;
        }
        let dir: PathBuf = entry.path();
        let Ok(owner) = std::fs::read_to_string(dir.join(OWNER_FILE)) else {
            continue;
        };
        if !owner_alive(&owner) && !locked_by_a_launcher(&dir.join(OWNER_FILE)) {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Whether the launcher `<pid> <start>` still runs (the same process, not a reused id).
fn owner_alive(owner: &str) -> bool {
    let mut words = owner.split_whitespace();
    let (Some(pid), Some(start)) = (
        words.next().and_then(|w| w.parse::<u32>().ok()),
        words.next().and_then(|w| w.parse::<u64>().ok()),
    ) else {
        // Unreadable: leave it.
        return true;
    };
    start_time(pid).is_some_and(|now| now == start)
}

/// Process `pid`'s start time in clock ticks since boot (`/proc/<pid>/stat`'s 22nd field).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: the fields after the command name, from the 3rd.
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split(' ').nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_of_gone_launchers_are_removed_and_others_kept() {
        let base = tempfile::tempdir().unwrap();
        let mine = base.path().join(format!("{PREFIX}mine"));
        let gone = base.path().join(format!("{PREFIX}gone"));
        let foreign = base.path().join(format!("{PREFIX}foreign"));
        for d in [&mine, &gone, &foreign] {
            std::fs::create_dir(d).unwrap();
        }
        let me = std::process::id();
        std::fs::write(
            mine.join(OWNER_FILE),
            format!("{me} {}", start_time(me).unwrap()),
        )
        .unwrap();
        // A start time that cannot be this process's: its launcher is gone.
        std::fs::write(gone.join(OWNER_FILE), format!("{me} 1")).unwrap();
        // A gone launcher's OpenMPI scratch is another kind: removed with its own prefix only.
        let scratch = base.path().join(format!("{SCRATCH_PREFIX}gone"));
        std::fs::create_dir(&scratch).unwrap();
        std::fs::write(scratch.join(OWNER_FILE), format!("{me} 1")).unwrap();
        remove_orphans(base.path(), PREFIX);
        assert!(scratch.exists(), "another kind of directory stays");
        remove_orphans(base.path(), SCRATCH_PREFIX);
        assert!(!scratch.exists(), "a gone launcher's scratch is removed");
        assert!(mine.exists(), "a running launcher's store stays");
        assert!(!gone.exists(), "a gone launcher's store is removed");
        assert!(
            foreign.exists(),
            "a directory without an owner file is not ours"
        );
    }

    /// A launcher in another PID namespace (a container sharing `/dev/shm`) names a process id
    /// this one cannot see: its lock on the owner file keeps its directory, which used to be
    /// removed under its running job.
    #[test]
    fn a_locked_directory_of_an_unseen_launcher_is_kept() {
        let base = tempfile::tempdir().unwrap();
        let running = base.path().join(format!("{PREFIX}elsewhere"));
        std::fs::create_dir(&running).unwrap();
        // A process id no process here has (above Linux's pid_max), as another namespace's.
        std::fs::write(running.join(OWNER_FILE), "4294967295 12345").unwrap();
        let held = std::fs::File::open(running.join(OWNER_FILE)).unwrap();
        assert!(try_lock(&held).unwrap(), "the test's lock");
        remove_orphans(base.path(), PREFIX);
        assert!(running.exists(), "a locked store was removed");
        drop(held);
        remove_orphans(base.path(), PREFIX);
        assert!(
            !running.exists(),
            "an unlocked store of a gone launcher stays"
        );
        // And a store made here holds its lock while it lives.
        let made = create_owned_in(base.path(), PREFIX, "the test's store").unwrap();
        assert!(locked_by_a_launcher(&made.path().join(OWNER_FILE)));
    }
}
