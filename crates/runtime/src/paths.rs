//! Path checks whose errors say what the path was for.
//!
//! A path a command reads must exist and be of the kind expected (a file, a directory); a path
//! a command writes must be creatable: not of the other kind, and its nearest existing ancestor
//! a directory in which a file can be made (missing directories below it are left for the
//! writer, which creates them). Every error names the config key (`section.key`), the flag or
//! what a positional argument is (`config file`), the path, what is wrong and what was
//! expected, instead of the system's bare "Is a directory (os error 21)".
//!
//! Nothing is left behind: the only thing created is a probe file, removed at once, in the
//! directory whose writability is checked.

use std::fs::Metadata;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::RuntimeError;

/// What a path must name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// A file (for a path read: anything but a directory, so a pipe the shell made, `<(…)`,
    /// still reads).
    File,
    /// A directory.
    Directory,
}

/// `path`, a path read, must be an existing `kind`. The error ([`RuntimeError::Unusable`])
/// reads `{what} {path}: {what is wrong}; expected {expected}`, `what` being the flag (`--data`)
/// or what the path is (`config file`), `expected` starting with the kind (`"a file (the
/// training configuration, TOML)"`).
pub fn check_input_path(
    what: &str,
    path: &Path,
    kind: PathKind,
    expected: &str,
) -> Result<(), RuntimeError> {
    report(input_problem(path, kind), |problem| {
        unusable(what, path, problem, expected)
    })
}

/// `path`, a path written, can be written as a `kind` (see the module's documentation); the
/// error as [`check_input_path`]'s.
pub fn check_output_path(
    what: &str,
    path: &Path,
    kind: PathKind,
    expected: &str,
) -> Result<(), RuntimeError> {
    report(output_problem(path, kind), |problem| {
        unusable(what, path, problem, expected)
    })
}

/// `dir` is a directory holding MNIST's IDX files, both splits (what `data.dir` names). The
/// error as [`check_input_path`]'s.
pub fn check_idx_dir(what: &str, dir: &Path) -> Result<(), RuntimeError> {
    report(idx_problem(dir), |problem| {
        unusable(what, dir, problem, IDX_DIR)
    })
}

/// [`check_input_path`] of the config key `key` (`section.key`): a
/// [`RuntimeError::Config`] naming the key, then the path.
pub(crate) fn check_key_input(
    key: &str,
    path: &Path,
    kind: PathKind,
    expected: &str,
) -> Result<(), RuntimeError> {
    report(input_problem(path, kind), |problem| {
        key_error(key, path, problem, expected)
    })
}

/// [`check_output_path`] of the config key `key`.
pub(crate) fn check_key_output(
    key: &str,
    path: &Path,
    kind: PathKind,
    expected: &str,
) -> Result<(), RuntimeError> {
    report(output_problem(path, kind), |problem| {
        key_error(key, path, problem, expected)
    })
}

/// [`check_idx_dir`] of the config key `key`.
pub(crate) fn check_key_idx_dir(key: &str, dir: &Path) -> Result<(), RuntimeError> {
    report(idx_problem(dir), |problem| {
        key_error(key, dir, problem, IDX_DIR)
    })
}

/// What an IDX data directory must be.
const IDX_DIR: &str = "a directory holding MNIST's IDX files (train-images-idx3-ubyte, \
                       train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte)";

/// `Ok` without a problem, else the error `error` makes of it.
fn report(
    problem: Option<String>,
    error: impl FnOnce(String) -> RuntimeError,
) -> Result<(), RuntimeError> {
    problem.map_or(Ok(()), |problem| Err(error(problem)))
}

fn unusable(what: &str, path: &Path, problem: String, expected: &str) -> RuntimeError {
    RuntimeError::Unusable {
        what: what.to_string(),
        path: path.to_path_buf(),
        reason: format!("{problem}; expected {expected}"),
    }
}

fn key_error(key: &str, path: &Path, problem: String, expected: &str) -> RuntimeError {
    RuntimeError::Config {
        key: key.to_string(),
        reason: format!("{}: {problem}; expected {expected}", shown(path)),
    }
}

/// `path` as an error shows it (an empty path quoted, so that it is seen).
fn shown(path: &Path) -> String {
    match path.as_os_str().is_empty() {
        true => "\"\"".to_string(),
        false => path.display().to_string(),
    }
}

/// What `meta` names, with its article: `a directory`, `a file`, `a named pipe`, …
fn kind_of(meta: &Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a named pipe";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "a device";
        }
    }
    match () {
        _ if meta.is_dir() => "a directory",
        _ if meta.is_file() => "a file",
        _ => "not a regular file",
    }
}

/// Whether `e` says that a path does not exist (or runs through a file).
fn is_missing(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// The nearest existing ancestor of `path` (not `path` itself; `.` for a relative path's
/// start) and what it is.
fn nearest_existing(path: &Path) -> Option<(PathBuf, Metadata)> {
    path.ancestors().skip(1).find_map(|a| {
        let a = match a.as_os_str().is_empty() {
            true => Path::new("."),
            false => a,
        };
        std::fs::metadata(a).ok().map(|m| (a.to_path_buf(), m))
    })
}

/// Why `path` is not an existing `kind` to read (`None`: it is).
fn input_problem(path: &Path, kind: PathKind) -> Option<String> {
    if path.as_os_str().is_empty() {
        return Some("is an empty path".to_string());
    }
    match std::fs::metadata(path) {
        Ok(meta) => match kind {
            PathKind::File if meta.is_dir() => Some("is a directory".to_string()),
            PathKind::Directory if !meta.is_dir() => Some(format!("is {}", kind_of(&meta))),
            _ => None,
        },
        Err(e) if is_missing(&e) => Some(match nearest_existing(path) {
            Some((ancestor, meta)) if !meta.is_dir() => format!(
                "does not exist ({} is {}, not a directory)",
                ancestor.display(),
                kind_of(&meta)
            ),
            _ => "does not exist".to_string(),
        }),
        Err(e) => Some(format!("cannot be examined ({})", e.kind())),
    }
}

/// Why `path` cannot be written as a `kind` (`None`: it can).
fn output_problem(path: &Path, kind: PathKind) -> Option<String> {
    if path.as_os_str().is_empty() {
        return Some("is an empty path".to_string());
    }
    match std::fs::metadata(path) {
        Ok(meta) => {
            let writes_in = match kind {
                PathKind::File if meta.is_dir() => return Some("is a directory".to_string()),
                PathKind::File if !meta.is_file() => {
                    return Some(format!("is {}, not a regular file", kind_of(&meta)))
                }
                PathKind::Directory if !meta.is_dir() => {
                    return Some(format!("is {}", kind_of(&meta)))
                }
                PathKind::Directory => path.to_path_buf(),
                // Replaced through a file made beside it.
                PathKind::File => match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                    _ => PathBuf::from("."),
                },
            };
            probe(&writes_in).err().map(|e| {
                format!(
                    "cannot be written: no file can be made in {} ({})",
                    writes_in.display(),
                    e.kind()
                )
            })
        }
        Err(e) if is_missing(&e) => match nearest_existing(path) {
            Some((ancestor, meta)) if !meta.is_dir() => Some(format!(
                "cannot be created: {} is {}, not a directory",
                ancestor.display(),
                kind_of(&meta)
            )),
            Some((ancestor, _)) => probe(&ancestor).err().map(|e| {
                format!(
                    "cannot be created: no file can be made in {} ({})",
                    ancestor.display(),
                    e.kind()
                )
            }),
            None => Some("cannot be created: none of its directories exists".to_string()),
        },
        Err(e) => Some(format!("cannot be examined ({})", e.kind())),
    }
}

/// Why `dir` is not an IDX data directory (`None`: it is).
fn idx_problem(dir: &Path) -> Option<String> {
    if let Some(problem) = input_problem(dir, PathKind::Directory) {
        return Some(problem);
    }
    let names = [crate::data::Split::Train, crate::data::Split::Test]
        .into_iter()
        .flat_map(|s| [s.images_file_name(), s.labels_file_name()]);
    for name in names {
        let file = dir.join(&name);
        match input_problem(&file, PathKind::File) {
            // A named pipe would be waited on without end: refused before it is opened.
            None => match layout::limits::refuse_pipe(&file) {
                Ok(()) => {}
                Err(e) => return Some(format!("its {name} {e}")),
            },
            Some(problem) if problem.starts_with("does not exist") => {
                return Some(format!("holds no {name}"))
            }
            Some(problem) => return Some(format!("its {name} {problem}")),
        }
    }
    None
}

/// Whether a file can be made in `dir`: an unnamed file (`O_TMPFILE`) made and closed, so that
/// a process killed meanwhile leaves nothing behind. Where the filesystem cannot make unnamed
/// files, a file of its own name (never an existing file's) is made and removed.
pub(crate) fn probe(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let unnamed = std::fs::OpenOptions::new()
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    match unnamed {
        Ok(_) => Ok(()),
        // No `O_TMPFILE` here (the filesystem's `EOPNOTSUPP`, an old kernel's `EISDIR`).
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            probe_by_name(dir)
        }
        Err(e) => Err(e),
    }
}

/// [`probe`] by a named file, made and removed.
fn probe_by_name(dir: &Path) -> std::io::Result<()> {
    static PROBES: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        ".tessera-write-check-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    );
    let file = dir.join(name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)?;
    let _ = std::fs::remove_file(&file);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_paths_name_the_kind_found_and_expected() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let problem = |p: &Path, k| input_problem(p, k).unwrap_or_default();
        assert_eq!(problem(dir.path(), PathKind::File), "is a directory");
        assert_eq!(problem(&file, PathKind::Directory), "is a file");
        assert_eq!(
            problem(&dir.path().join("nope"), PathKind::File),
            "does not exist"
        );
        assert!(problem(&file.join("x"), PathKind::File).contains("is a file, not a directory"));
        assert_eq!(problem(Path::new(""), PathKind::File), "is an empty path");
        assert!(input_problem(&file, PathKind::File).is_none());
        assert!(input_problem(dir.path(), PathKind::Directory).is_none());
    }

    /// Where the filesystem makes unnamed files, a probe never gives its file a name: a process
    /// killed while probing an existing output directory (a checkpoint set's) used to leave
    /// `.tessera-write-check-*` there, which later writes carried into every set.
    #[test]
    fn a_probe_never_names_a_file_where_unnamed_ones_can_be_made() {
        use std::os::unix::fs::OpenOptionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let unnamed = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(dir.path());
        if unnamed.is_err() {
            // This filesystem names every file: the probe by name is all there is.
            probe(dir.path()).unwrap();
            return;
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let (stop, path) = (stop.clone(), dir.path().to_path_buf());
            std::thread::spawn(move || {
                let mut seen = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    seen += std::fs::read_dir(&path).unwrap().count();
                }
                seen
            })
        };
        for _ in 0..5000 {
            probe(dir.path()).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        assert_eq!(watcher.join().unwrap(), 0, "a named probe file was seen");
    }

    #[test]
    fn written_paths_need_a_directory_to_be_made_in_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let problem = |p: &Path, k| output_problem(p, k).unwrap_or_default();
        assert_eq!(problem(dir.path(), PathKind::File), "is a directory");
        assert_eq!(problem(&file, PathKind::Directory), "is a file");
        assert!(problem(&file.join("a/b"), PathKind::Directory).contains("is a file, not a"));
        assert!(output_problem(&dir.path().join("a/b/c.json"), PathKind::File).is_none());
        assert!(output_problem(&file, PathKind::File).is_none());
        assert!(output_problem(dir.path(), PathKind::Directory).is_none());
        let mut left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "only the file: {left:?}");
        assert!(left.pop().unwrap().unwrap().path() == file);
    }
}
