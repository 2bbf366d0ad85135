//! An advisory, exclusive lock on a checkpoint destination.
//!
//! The lock is the file `<parent>/.<name>.tessera-lock` beside the destination, held with
//! `flock` for as long as the [`DestLock`] lives; the operating system releases it when the
//! process dies, however it dies. The file records its holder (process, host, command, start
//! time), so a second writer fails at once with a message naming the holder. The holder removes
//! the file before it lets go; a writer that locked a file which was removed meanwhile retries
//! with a fresh one, so two writers never hold locks on two different files of one name.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{io_err, CkptError, Result};

/// The most of a lock file's holder description that is read back.
const MAX_HOLDER_BYTES: u64 = 4096;

/// An exclusive lock on one destination path; released (and its file removed) on drop.
#[derive(Debug)]
pub struct DestLock {
    path: PathBuf,
    file: Option<File>,
}

/// The lock file of `dest`, which must have a parent and a file name (see
/// [`super::resolve_destination`]).
pub(crate) fn lock_path(dest: &Path) -> PathBuf {
    super::sibling(dest, "tessera-lock")
}

impl DestLock {
    /// Takes the lock of `dest` (a resolved destination) or fails at once with
    /// [`CkptError::DestinationLocked`] naming the process that holds it.
    pub(crate) fn acquire(dest: &Path) -> Result<DestLock> {
        let path = lock_path(dest);
        // Retried only when the holder removed the file between our open and our lock.
        for _ in 0..64 {
            // Created and recorded in one step, so an interruption removes it.
            let file = {
                let mut pending = super::pending::guard();
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
                    .map_err(io_err(&path, "create lock file"))?;
                pending.push(path.clone());
                file
            };
            let locked = try_lock(&file);
            if !matches!(locked, Ok(true)) || !names_file(&path, &file) {
                // Not ours: forget it (the holder removes it).
                super::pending::unregister(&path);
            }
            match locked {
                Ok(true) => {}
                Ok(false) => {
                    return Err(CkptError::DestinationLocked {
                        path: dest.to_path_buf(),
                        holder: read_holder(&file),
                    })
                }
                Err(e) => return Err(io_err(&path, "lock")(e)),
            }
            if !names_file(&path, &file) {
                continue;
            }
            let mut lock = DestLock {
                path,
                file: Some(file),
            };
            lock.record_holder()?;
            return Ok(lock);
        }
        Err(CkptError::DestinationLocked {
            path: dest.to_path_buf(),
            holder: "writers that keep taking and releasing it".to_string(),
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn record_holder(&mut self) -> Result<()> {
        let file = self.file.as_mut().expect("a held lock has its file");
        let text = holder_description();
        file.set_len(0)
            .and_then(|()| file.write_all(text.as_bytes()))
            .map_err(io_err(&self.path, "write lock file"))
    }
}

impl Drop for DestLock {
    fn drop(&mut self) {
        // Remove the name first, then release: a waiter that opened the old file sees that the
        // name no longer leads to it and starts over.
        let _ = std::fs::remove_file(&self.path);
        super::pending::unregister(&self.path);
        drop(self.file.take());
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: `Ok(false)` when another open file holds the lock.
fn try_lock(file: &File) -> std::io::Result<bool> {
    loop {
        // SAFETY: the descriptor is open for the duration of the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(err),
        }
    }
}

/// Whether `path` still names the open `file` (same device and inode).
fn names_file(path: &Path, file: &File) -> bool {
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

fn read_holder(file: &File) -> String {
    let mut text = String::new();
    let _ = file.take(MAX_HOLDER_BYTES).read_to_string(&mut text);
    let text = text.trim();
    if text.is_empty() {
        "another process (it has not recorded itself yet)".to_string()
    } else {
        text.to_string()
    }
}

/// `process 123 on host h: tessera ckpt convert … (since unix time 1764000000)`.
fn holder_description() -> String {
    let mut command: String = std::env::args().collect::<Vec<_>>().join(" ");
    if command.len() > 512 {
        let mut cut = 512;
        while !command.is_char_boundary(cut) {
            cut -= 1;
        }
        command.truncate(cut);
        command.push('…');
    }
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "process {} on host {}: {command} (since unix time {since})",
        std::process::id(),
        hostname()
    )
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for `buf.len()` bytes; gethostname writes at most that many.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "?".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_fails_naming_the_holder_and_release_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        let first = DestLock::acquire(&dest).unwrap();
        let lock_file = first.path().to_path_buf();
        assert!(lock_file.exists());
        match DestLock::acquire(&dest) {
            Err(CkptError::DestinationLocked { holder, .. }) => {
                assert!(
                    holder.contains(&format!("process {}", std::process::id())),
                    "{holder}"
                );
            }
            other => panic!("expected DestinationLocked, got {other:?}"),
        }
        drop(first);
        assert!(!lock_file.exists());
        let again = DestLock::acquire(&dest).unwrap();
        drop(again);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
