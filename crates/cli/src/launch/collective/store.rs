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
//! is gone.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The name prefix of every elastic store.
const PREFIX: &str = "tessera-elastic-";
/// The name prefix of every OpenMPI scratch directory.
const SCRATCH_PREFIX: &str = "tessera-mpi-";
/// The file naming a directory's launcher: `<pid> <start time in clock ticks>`.
const OWNER_FILE: &str = ".tessera-launch-owner";

/// Creates this launcher's store, after removing the stores of launchers that are gone.
pub fn create() -> anyhow::Result<tempfile::TempDir> {
    create_owned(PREFIX, "the elastic store")
}

/// Creates this launcher's scratch directory for OpenMPI (`mpirun --mca orte_tmpdir_base` and
/// `btl_vader_backing_directory`), after removing those of launchers that are gone.
pub fn create_mpi_scratch() -> anyhow::Result<tempfile::TempDir> {
    create_owned(SCRATCH_PREFIX, "OpenMPI's scratch directory")
}

/// A new directory `<prefix>XXXX` on the memory file system holding its owner file, after the
/// ones of gone launchers with the same prefix were removed.
fn create_owned(prefix: &str, what: &str) -> anyhow::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    remove_orphans(&base, prefix);
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&base)
        .with_context(|| format!("cannot create {what} in {}", base.display()))?;
    let me = std::process::id();
    let owner = format!("{me} {}", start_time(me).unwrap_or(0));
    std::fs::write(dir.path().join(OWNER_FILE), owner)
        .with_context(|| format!("cannot write {}", dir.path().display()))?;
    Ok(dir)
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
        if !owner_alive(&owner) {
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
}
