//! Resource bounds on sizes that come from files, flags and configs.
//!
//! Every [`Mesh`](crate::Mesh) is checked here before its rank list is allocated, so a strategy
//! file, a `--devices` flag or a config key that asks for an absurd device count is an error
//! instead of an allocation failure. The rank ceiling is a process-wide setting (default
//! [`DEFAULT_MAX_RANKS`]); the binary raises or lowers it from the `TESSERA_MAX_RANKS`
//! environment variable with [`set_max_ranks`]. This crate itself reads no environment.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::LayoutError;

/// The default ceiling on the ranks (slots) of one mesh: 2^20 = 1,048,576.
pub const DEFAULT_MAX_RANKS: usize = 1 << 20;

/// The most axes a mesh may have. MindSpore's device matrices have a handful; 64 leaves room for
/// every factorisation of a 2^64 device count while bounding per-slot coordinate vectors.
pub const MAX_MESH_AXES: usize = 64;

static MAX_RANKS: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_RANKS);

/// The current ceiling on the ranks of one mesh (see [`set_max_ranks`]).
pub fn max_ranks() -> usize {
    MAX_RANKS.load(Ordering::Relaxed)
}

/// Sets the ceiling on the ranks of one mesh for the whole process. Zero is rejected.
pub fn set_max_ranks(max: usize) -> Result<(), LayoutError> {
    if max == 0 {
        return Err(LayoutError::BadRankCeiling {
            value: max.to_string(),
        });
    }
    MAX_RANKS.store(max, Ordering::Relaxed);
    Ok(())
}

/// Parses a rank ceiling as written in `TESSERA_MAX_RANKS` (a positive integer, `_` allowed as a
/// digit separator) and sets it.
pub fn set_max_ranks_from_str(text: &str) -> Result<usize, LayoutError> {
    let bad = || LayoutError::BadRankCeiling {
        value: text.to_string(),
    };
    let max: usize = text.trim().replace('_', "").parse().map_err(|_| bad())?;
    set_max_ranks(max).map_err(|_| bad())?;
    Ok(max)
}

/// Checks a device count against the rank ceiling: `n_ranks` ranks of a mesh described by
/// `device_matrix` (its axis sizes, for the message).
pub fn check_rank_count(n_ranks: usize, device_matrix: &[usize]) -> Result<(), LayoutError> {
    let max = max_ranks();
    if n_ranks > max {
        return Err(LayoutError::TooManyRanks {
            device_matrix: device_matrix.to_vec(),
            n_ranks: Some(n_ranks),
            max,
        });
    }
    Ok(())
}

/// The product of a device matrix, checked against overflow and the rank ceiling.
pub fn checked_rank_count(device_matrix: &[usize]) -> Result<usize, LayoutError> {
    if device_matrix.len() > MAX_MESH_AXES {
        return Err(LayoutError::TooManyAxes {
            n_axes: device_matrix.len(),
            max: MAX_MESH_AXES,
        });
    }
    let n_ranks = checked_product(device_matrix).ok_or_else(|| LayoutError::TooManyRanks {
        device_matrix: device_matrix.to_vec(),
        n_ranks: None,
        max: max_ranks(),
    })?;
    check_rank_count(n_ranks, device_matrix)?;
    Ok(n_ranks)
}

/// The largest text file a reader takes whole: a config, a device profile, a set marker, a
/// checkpoint index or a `model.json` (64 MiB).
pub const MAX_TEXT_FILE_BYTES: u64 = 64 << 20;

/// The largest strategy or group-info file a reader takes whole (1 GiB: a strategy records a
/// few hundred bytes per parameter).
pub const MAX_STRATEGY_FILE_BYTES: u64 = 1 << 30;

/// Reads the whole of `path`, refusing (with [`std::io::ErrorKind::InvalidData`]) a file of
/// more than `max_bytes` before holding more than `max_bytes + 1` of it, so a wrong path (a
/// device such as `/dev/zero`, a multi-gigabyte file) is an error and never an allocation
/// failure.
pub fn read_bounded(path: &std::path::Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    refuse_pipe(path)?;
    let file = std::fs::File::open(path)?;
    let hint = file.metadata().map_or(0, |m| m.len()).min(max_bytes);
    let mut bytes = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it holds more than {max_bytes} bytes, more than any file of this kind may (a device or a wrong path?)"),
        ));
    }
    Ok(bytes)
}

/// Refuses (with [`std::io::ErrorKind::InvalidInput`]) a `path` that is a named pipe (FIFO) or
/// a socket, before anything opens it: opening a FIFO waits, without end, for a process to
/// open its other side, so a wrong path would hang the command instead of failing. A missing
/// path passes (its opening reports it); regular files, directories and devices are left to
/// the caller's own checks. A descriptor this process already holds (`/dev/fd/N`, `/dev/stdout`,
/// `/proc/self/fd/N`, `/dev/stdin`: a shell's process substitution, `tessera train <(…)`)
/// passes too: its writer is already there.
pub fn refuse_pipe(path: &std::path::Path) -> std::io::Result<()> {
    let held = [
        "/dev/fd/",
        "/proc/self/fd/",
        "/dev/stdin",
        "/dev/stdout",
        "/dev/stderr",
    ]
    .iter()
    .any(|prefix| path.starts_with(prefix));
    #[cfg(unix)]
    if !held {
        use std::os::unix::fs::FileTypeExt;
        if let Ok(meta) = std::fs::metadata(path) {
            let kind = meta.file_type();
            let what = match () {
                _ if kind.is_fifo() => Some("a named pipe (FIFO)"),
                _ if kind.is_socket() => Some("a socket"),
                _ => None,
            };
            if let Some(what) = what {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("is {what}, not a regular file: opening it would wait for another process without end"),
                ));
            }
        }
    }
    let _ = (path, held);
    Ok(())
}

/// [`read_bounded`] as UTF-8 text (invalid UTF-8 is [`std::io::ErrorKind::InvalidData`]).
pub fn read_text_bounded(path: &std::path::Path, max_bytes: u64) -> std::io::Result<String> {
    String::from_utf8(read_bounded(path, max_bytes)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The product of `sizes`, or `None` when it overflows `usize`.
pub fn checked_product(sizes: &[usize]) -> Option<usize> {
    sizes.iter().try_fold(1usize, |acc, &s| acc.checked_mul(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file within the bound is read whole; one beyond it, or an endless device, is refused
    /// naming the bound.
    #[test]
    fn reads_stop_at_the_bound() {
        let dir = std::env::temp_dir().join(format!("tessera-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(read_bounded(&path, 5).unwrap(), b"12345");
        assert_eq!(read_text_bounded(&path, 8).unwrap(), "12345");
        let err = read_bounded(&path, 4).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("more than 4 bytes"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
        let err = read_bounded(std::path::Path::new("/dev/zero"), 1 << 10).unwrap_err();
        assert!(err.to_string().contains("more than 1024 bytes"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_named_pipe_is_refused_without_waiting() {
        let dir = std::env::temp_dir().join(format!("tessera-limits-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("pipe");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(read_bounded(&path, 1024).map_err(|e| e.to_string()));
        });
        let read = rx.recv_timeout(std::time::Duration::from_secs(10));
        std::fs::remove_dir_all(&dir).unwrap();
        let error = read
            .expect("reading a FIFO still waits after 10 s")
            .unwrap_err();
        assert!(error.contains("named pipe (FIFO)"), "{error}");
        assert!(refuse_pipe(std::path::Path::new("/no/such/file")).is_ok());
        // A pipe this process holds, as a shell's process substitution hands one over.
        let (reader, writer) = std::io::pipe().unwrap();
        use std::io::Write;
        (&writer).write_all(b"a = 1\n").unwrap();
        drop(writer);
        use std::os::fd::AsRawFd;
        let held = format!("/dev/fd/{}", reader.as_raw_fd());
        assert_eq!(
            read_bounded(std::path::Path::new(&held), 1024).unwrap(),
            b"a = 1\n"
        );
    }

    #[test]
    fn products_that_overflow_are_none() {
        assert_eq!(checked_product(&[2, 3, 4]), Some(24));
        assert_eq!(checked_product(&[]), Some(1));
        assert_eq!(checked_product(&[1 << 32, 1 << 32]), None);
        assert_eq!(checked_product(&[usize::MAX, 0]), Some(0));
    }

    #[test]
    fn the_default_ceiling_admits_a_million_ranks_and_no_more() {
        assert_eq!(DEFAULT_MAX_RANKS, 1_048_576);
        // The ceiling is process-wide; no test in this binary changes it.
        assert_eq!(checked_rank_count(&[1024, 1024]), Ok(1 << 20));
        let err = checked_rank_count(&[1024, 1025]).unwrap_err();
        assert_eq!(
            err,
            LayoutError::TooManyRanks {
                device_matrix: vec![1024, 1025],
                n_ranks: Some(1024 * 1025),
                max: DEFAULT_MAX_RANKS
            }
        );
        assert!(err.to_string().contains("1049600 ranks"), "{err}");
        assert!(err.to_string().contains("TESSERA_MAX_RANKS"), "{err}");
    }

    #[test]
    fn an_overflowing_device_matrix_is_too_many_ranks() {
        let err = checked_rank_count(&[1 << 40, 1 << 40]).unwrap_err();
        assert!(matches!(
            err,
            LayoutError::TooManyRanks { n_ranks: None, .. }
        ));
        assert!(err.to_string().contains("overflows"), "{err}");
    }

    #[test]
    fn at_most_64_axes() {
        assert_eq!(checked_rank_count(&[1; 64]), Ok(1));
        assert_eq!(
            checked_rank_count(&[1; 65]),
            Err(LayoutError::TooManyAxes {
                n_axes: 65,
                max: 64
            })
        );
    }

    #[test]
    fn a_ceiling_must_be_a_positive_integer() {
        for bad in ["0", "-3", "many", ""] {
            assert_eq!(
                set_max_ranks_from_str(bad),
                Err(LayoutError::BadRankCeiling {
                    value: bad.to_string()
                })
            );
        }
        assert_eq!(max_ranks(), DEFAULT_MAX_RANKS);
    }
}
