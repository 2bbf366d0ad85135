//! Everything `tessera` writes on stdout goes through here, never through `print!`, which
//! panics (exit code 101, a backtrace) when stdout cannot be written (a full disk,
//! `> /dev/full`).
//!
//! A command's result is written with [`write_stdout`] (or the [`out!`] and [`outln!`]
//! macros around it): a failed write is an error naming stdout. A closed pipe (`tessera … |
//! head`) comes back as an `io::Error` under that context, which `main` ends quietly on.
//!
//! Lines written from threads that cannot return an error (the launcher's merged console view,
//! training's loss lines) go through [`StdoutLines`]: the first failure is kept, said once on
//! stderr where the caller asks for it, and turned into the command's error by
//! [`take_failure`] when the command ends.
//!
//! A command that writes rarely (a benchmark between its rows) learns that the reader of its
//! stdout has gone without writing, from [`reader_gone`].

use std::io::{self, Write as _};
use std::sync::Mutex;

use anyhow::Context as _;

/// Writes `text` to stdout; a failed write is an error naming stdout, and a closed pipe comes
/// back as an `io::Error` (under that context) for `main` to ignore.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("cannot write the output to stdout")
}

/// `print!` that returns [`write_stdout`]'s error instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::stdout::write_stdout(&format!($($arg)*))
    };
}

/// `println!` that returns [`write_stdout`]'s error instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::stdout::write_stdout(&format!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {out, outln};

/// The first failed write of a [`StdoutLines`] in this process, kept for [`take_failure`].
static FAILURE: Mutex<Option<io::Error>> = Mutex::new(None);

/// A writer to stdout for threads that cannot return an error to the command. Its first
/// failure in the process is kept for [`take_failure`]; every failure is still returned to the
/// caller, which decides whether to go on.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdoutLines;

impl StdoutLines {
    /// Writes `line` whole, under the stdout lock (so lines never interleave), and flushes it;
    /// on the first failure of any [`StdoutLines`] in this process, hands the error to
    /// `first_failure` (to say it once, e.g. on stderr) and keeps it.
    pub fn write_line(
        &self,
        line: &[u8],
        first_failure: impl FnOnce(&io::Error),
    ) -> io::Result<()> {
        let mut stdout = io::stdout().lock();
        let result = stdout.write_all(line).and_then(|()| stdout.flush());
        drop(stdout);
        keep(result, first_failure)
    }
}

/// Keeps the error of `result` when it is the first failure of a [`StdoutLines`], after
/// handing it to `first_failure`.
fn keep(result: io::Result<()>, first_failure: impl FnOnce(&io::Error)) -> io::Result<()> {
    if let Err(err) = &result {
        let mut kept = FAILURE.lock().unwrap_or_else(|p| p.into_inner());
        if kept.is_none() {
            first_failure(err);
            *kept = Some(copy_of(err));
        }
    }
    result
}

/// Writes as stdout does (line-buffered: a line reaches stdout at its newline or at `flush`).
impl io::Write for StdoutLines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        keep(io::stdout().lock().write_all(buf), |_| {})?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        keep(io::stdout().lock().flush(), |_| {})
    }
}

/// The same error again (`io::Error` is not `Clone`): its OS error code, else its kind and
/// message.
fn copy_of(err: &io::Error) -> io::Error {
    match err.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(err.kind(), err.to_string()),
    }
}

/// The first failed write of a [`StdoutLines`] in this process, if any (taken: a second call
/// returns `None`), as an error naming stdout and `what` was written there. A closed pipe
/// stays an `io::Error` under that context, so `main` ends quietly on it.
pub fn take_failure(what: &str) -> Option<anyhow::Error> {
    let err = FAILURE.lock().unwrap_or_else(|p| p.into_inner()).take()?;
    Some(anyhow::Error::new(err).context(format!("cannot write {what} to stdout")))
}

/// Whether stdout is a pipe or socket whose reader has gone (`tessera … | head -1` after
/// `head` exited): a write would fail with a broken pipe. Asks the OS without writing
/// (`poll`), so a command can stop before its next output instead of at it; a file, a
/// terminal or an open pipe is not gone.
pub fn reader_gone() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid `pollfd` for the duration of the call, a zero timeout.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready == 1 && fd.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// The error a command stopped by [`reader_gone`] ends with: a broken pipe naming stdout and
/// `what` was written there, which `main` ends quietly on.
pub fn reader_gone_error(what: &str) -> anyhow::Error {
    anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe))
        .context(format!("cannot write {what} to stdout"))
}
