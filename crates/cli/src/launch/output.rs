//! Where the processes' output goes: one log file per process, appended to (existing files are
//! never truncated or removed), and the merged console view on the launcher's stdout, every line
//! prefixed with its process (`[worker 1] …`).
//!
//! Each of a process's two pipes is read by its own thread, a line at a time; a line is written
//! whole, under one lock, to the log file and to the console, so lines never interleave.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::stdout::StdoutLines;

/// Longest line passed on as one; a longer run of bytes without a newline is cut into lines of
/// this length, so one process cannot make the launcher hold unbounded memory.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// How every attempt of a process starts its log's part: `--- tessera launch: worker 1 (rank
/// 1), restart count 0 ---` ([`attempt_header`]).
pub const ATTEMPT_HEADER: &str = "--- tessera launch: ";

/// The line starting an attempt's part of a log: `--- tessera launch: {who} (rank {rank}),
/// restart count {restarts} ---`.
pub fn attempt_header(who: &str, rank: usize, restarts: u32) -> String {
    format!("{ATTEMPT_HEADER}{who} (rank {rank}), restart count {restarts} ---\n")
}

/// How much of the end of a log file [`tail`] reads.
const TAIL_BYTES: u64 = 64 * 1024;

/// One process's log file, shared by the threads reading its stdout and stderr and kept over its
/// restarts.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    file: Mutex<File>,
    /// Set after the first failed write, so a full disk is reported once, not per line.
    failed: AtomicBool,
}

impl LogFile {
    /// Opens `path` for appending, creating it if missing; what it holds is kept.
    pub fn open(path: PathBuf) -> io::Result<LogFile> {
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(LogFile {
            path,
            file: Mutex::new(file),
            failed: AtomicBool::new(false),
        })
    }

    /// Takes an exclusive lock on the file (`flock`), held while this launcher runs; a log
    /// another running launcher holds is refused, naming it.
    fn lock_for_this_launcher(&self) -> anyhow::Result<()> {
        use std::os::fd::AsRawFd as _;
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: flock(2) on a descriptor this struct owns, with plain integers.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::WouldBlock => anyhow::bail!(
                "--log-dir: the log file {} is being written by another tessera launch that is running now; give each job its own --log-dir",
                self.path.display()
            ),
            // A file system without locks: the log is still written.
            _ => Ok(()),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line (which ends in a newline). A failure is reported on stderr once, and
    /// a line written in part (a full disk, a file-size limit) is cut off again, so the log
    /// never ends in half a line.
    pub fn write_line(&self, line: &[u8]) {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let end = file.metadata().map(|m| m.len());
        let result = file.write_all(line);
        if let Err(err) = result {
            if let Ok(end) = end {
                let _ = file.set_len(end);
            }
            drop(file);
            if !self.failed.swap(true, Ordering::Relaxed) {
                // One write, so the console's lines on stdout do not cut through it.
                let message = format!(
                    "[launch] cannot write {}: {err}; the console still shows the output\n",
                    self.path.display()
                );
                let _ = io::stderr().write_all(message.as_bytes());
            }
        }
    }
}

/// What `--log-dir` must name (in errors).
pub const LOG_DIR_EXPECTED: &str =
    "a directory (the per-process logs <role>_<id>.log, appended to; created if missing)";

/// Opens the log files `names` in the log directory `dir` (`--log-dir`) before anything starts,
/// each locked for this launcher ([`LogFile::open`] appends; a lock held by another launcher is
/// refused: two jobs writing one log would mix their lines and tails).
///
/// The directory is checked first (`tessera_runtime::check_output_path`: not a file, not under
/// a file, creatable or writable), then every existing log (a regular file, not a directory or
/// a named pipe, which would block the launcher). The error names `--log-dir`, the path, what
/// is wrong and what was expected. When one cannot be opened, the logs and directories this
/// call created are removed again and nothing else is touched.
pub fn open_logs(dir: &Path, names: &[String]) -> anyhow::Result<Vec<Arc<LogFile>>> {
    use runtime::PathKind;
    runtime::check_output_path("--log-dir", dir, PathKind::Directory, LOG_DIR_EXPECTED)?;
    let paths: Vec<PathBuf> = names.iter().map(|name| dir.join(name)).collect();
    for path in &paths {
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
            runtime::check_output_path(
                "--log-dir",
                path,
                PathKind::File,
                "a log file (appended to) or nothing",
            )?;
        }
    }
    let mut made = Made::default();
    let opened = made.dirs(dir).and_then(|()| {
        paths
            .iter()
            .map(|path| {
                let existed = path.exists();
                let log = LogFile::open(path.clone());
                if !existed && log.is_ok() {
                    made.files.push(path.clone());
                }
                let log = log.map_err(|e| {
                    anyhow::anyhow!(
                        "--log-dir {}: cannot open the log file {}: {e}",
                        dir.display(),
                        path.display()
                    )
                })?;
                log.lock_for_this_launcher()?;
                Ok(Arc::new(log))
            })
            .collect::<anyhow::Result<Vec<_>>>()
    });
    if opened.is_err() {
        made.undo();
    }
    opened
}

/// What [`open_logs`] created, to remove again when it fails.
#[derive(Default)]
struct Made {
    /// Directories created, outermost first.
    dirs: Vec<PathBuf>,
    /// Log files created.
    files: Vec<PathBuf>,
}

impl Made {
    /// Creates `dir` and its missing ancestors, remembering each.
    fn dirs(&mut self, dir: &Path) -> anyhow::Result<()> {
        let missing: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
            .map(Path::to_path_buf)
            .collect();
        for d in missing.into_iter().rev() {
            std::fs::create_dir(&d).map_err(|e| {
                anyhow::anyhow!(
                    "--log-dir {}: cannot create the directory {}: {e}",
                    dir.display(),
                    d.display()
                )
            })?;
            self.dirs.push(d);
        }
        Ok(())
    }

    /// Removes the files and then the directories made (a directory only while empty).
    fn undo(&self) {
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
        for dir in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Where each line of a process's output goes: its log file and its console prefix.
pub trait Router: Send + Sync {
    /// Hands `emit` each whole line `line` completes, with its log file and console prefix: a
    /// plain process's line as it is; a router that demultiplexes several sources may strip
    /// their tags, keep a piece until its line ends, or emit several lines.
    fn route(&self, line: &[u8], emit: &mut dyn FnMut(&LogFile, &str, &[u8]));
}

/// Every line to one log file, with one console prefix (`[worker 1] `).
#[derive(Debug)]
pub struct Prefixed {
    /// The console prefix.
    pub prefix: Arc<str>,
    /// The log file.
    pub log: Arc<LogFile>,
}

impl Router for Prefixed {
    fn route(&self, line: &[u8], emit: &mut dyn FnMut(&LogFile, &str, &[u8])) {
        emit(&self.log, &self.prefix, line);
    }
}

/// Starts a thread copying `pipe` line by line into the log and onto the console that `router`
/// gives each line (`name` names the thread). The thread ends when the pipe is closed (the
/// process and everything holding the pipe ended).
pub fn pump(
    pipe: impl Read + Send + 'static,
    name: &str,
    router: Arc<dyn Router>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("launch-output {name}"))
        .spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut line = Vec::new();
            let mut console_line = Vec::new();
            while next_line(&mut reader, &mut line) {
                router.route(&line, &mut |log, prefix, body| {
                    write_out(log, prefix, body, &mut console_line);
                });
            }
        })
}

/// Writes one whole line `body` to `log` and, after `prefix`, to the console (`console_line` is
/// scratch space).
///
/// A console that cannot be written (`tessera launch … > /dev/full`, `… | head`) stops neither
/// the processes nor their logs: the first failure is said once on stderr (a closed pipe is not
/// worth a word), and the job's result says it when the job ends ([`console_failure`]).
pub fn write_out(log: &LogFile, prefix: &str, body: &[u8], console_line: &mut Vec<u8>) {
    log.write_line(body);
    console_line.clear();
    console_line.extend_from_slice(prefix.as_bytes());
    console_line.extend_from_slice(body);
    let _ = StdoutLines.write_line(console_line, |err| {
        if err.kind() != io::ErrorKind::BrokenPipe {
            // One write, so the console's other lines do not cut through it.
            let message = format!("[launch] cannot write the console view to stdout: {err}; the processes keep running and their output is still written to their logs\n");
            let _ = io::stderr().write_all(message.as_bytes());
        }
    });
}

/// The first failure to write the console view ([`write_out`]) as an error naming stdout, if
/// there was one: the job's result when it otherwise succeeded. A closed pipe stays an
/// `io::Error` under that context, so `main` ends quietly on it, as before.
pub fn console_failure() -> Option<anyhow::Error> {
    crate::stdout::take_failure("the console view").map(|err| {
        err.context("the job finished, but its console view is incomplete (every process's output is in its log)")
    })
}

/// Whether `line`, as [`pump`] hands it to a router, is the first [`MAX_LINE_BYTES`] of a longer
/// line, ended by a newline the reader added (the rest comes as the next line): the only lines
/// of that length, since a line that fits ends within it.
pub fn cut_by_reader(line: &[u8]) -> bool {
    line.len() == MAX_LINE_BYTES + 1 && line.ends_with(b"\n")
}

/// Reads the next line into `line` (cleared first), ending it with a newline if the stream ended
/// without one; false at the end of the stream. A read error ends the stream. A line longer than
/// [`MAX_LINE_BYTES`] comes in parts ([`cut_by_reader`]).
fn next_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> bool {
    line.clear();
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => &[],
        };
        if buf.is_empty() {
            if line.is_empty() {
                return false;
            }
            line.push(b'\n');
            return true;
        }
        let room = MAX_LINE_BYTES - line.len();
        let window = &buf[..buf.len().min(room)];
        if let Some(end) = window.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&window[..=end]);
            reader.consume(end + 1);
            return true;
        }
        let taken = window.len();
        line.extend_from_slice(window);
        reader.consume(taken);
        if line.len() == MAX_LINE_BYTES {
            line.push(b'\n');
            return true;
        }
    }
}

/// The last `lines` lines of the file at `path` (from its last 64 KiB), lossily decoded, none
/// before the last [`ATTEMPT_HEADER`] line: the log is appended to, and what an earlier job or
/// attempt wrote is not this one's.
pub fn tail(path: &Path, lines: usize) -> io::Result<Vec<String>> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(TAIL_BYTES);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let mut all: Vec<&str> = text.lines().collect();
    if start > 0 && !all.is_empty() {
        // The first line read is probably cut.
        all.remove(0);
    }
    if let Some(header) = all.iter().rposition(|l| l.starts_with(ATTEMPT_HEADER)) {
        all.drain(..header);
    }
    let from = all.len().saturating_sub(lines);
    Ok(all[from..].iter().map(|l| l.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut reader = BufReader::with_capacity(7, bytes);
        let mut line = Vec::new();
        let mut out = Vec::new();
        while next_line(&mut reader, &mut line) {
            out.push(line.clone());
        }
        out
    }

    #[test]
    fn lines_are_split_at_newlines_and_the_last_one_is_ended() {
        assert_eq!(
            lines_of(b"one\ntwo and more\n\nlast"),
            [&b"one\n"[..], b"two and more\n", b"\n", b"last\n"]
        );
        assert!(lines_of(b"").is_empty());
    }

    #[test]
    fn an_endless_line_is_cut_into_bounded_lines() {
        let long = vec![b'x'; MAX_LINE_BYTES * 2 + 3];
        let lines = lines_of(&long);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].len(), MAX_LINE_BYTES + 1);
        assert_eq!(lines[2], b"xxx\n");
    }

    /// The log is appended to: the tail shows this attempt's lines only, from its header, never
    /// an earlier job's error as this one's.
    #[test]
    fn the_tail_starts_at_the_last_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker_0.log");
        let text = format!(
            "{}error: an earlier job's\n{}step 1\nerror: this one's\n",
            attempt_header("worker 0", 0, 0),
            attempt_header("worker 0", 0, 0)
        );
        std::fs::write(&path, text).unwrap();
        let lines = tail(&path, 20).unwrap();
        assert_eq!(
            lines,
            [
                "--- tessera launch: worker 0 (rank 0), restart count 0 ---",
                "step 1",
                "error: this one's"
            ]
        );
        assert_eq!(tail(&path, 1).unwrap(), ["error: this one's"]);
    }
}
