//! The MPI backend's reports to `tessera rank-env`: that this rank is starting MPI, then
//! whether it is making progress through its MPI calls.
//!
//! rank-env hands its command the write end of a pipe, named by [`MPI_START_FD_VAR`]. Just
//! before `MPI_Init` the backend writes one byte to it. A rank whose command ends with exit
//! code 0 and never wrote it did not take part in MPI: if another rank of the job started MPI,
//! that rank waits in `MPI_Init` for it forever, and the launcher stops the job instead of
//! hanging (rank-env tells it both).
//!
//! The pipe then stays open (close-on-exec, so that nothing the command runs holds it) for
//! [`MpiProgress`] lines: when this rank has been inside one MPI call, or outside every MPI
//! call, for a while, and when it moves again. The launcher takes a rank that runs outside MPI
//! for `--hang_time_out` while others wait inside a call for as long as hung, and names it in
//! a failure's report (docs/LAUNCH.md); both ranks merely run, so nothing else tells them
//! apart.

use std::fs::File;
use std::io::Write as _;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd as _;
use std::os::unix::fs::FileTypeExt as _;
use std::sync::Mutex;

/// The variable naming the pipe's write end (a file descriptor number) in the rank's command.
pub const MPI_START_FD_VAR: &str = "TESSERA_MPI_START_FD";

/// The pipe, kept after the start notice for the progress reports (taken by the MPI runtime).
static PROGRESS_PIPE: Mutex<Option<File>> = Mutex::new(None);

/// Writes the notice to the pipe [`MPI_START_FD_VAR`] names, once, and keeps the pipe for
/// [`take_progress_pipe`]. Nothing happens without the variable, or when the descriptor it
/// names is not a pipe (it is left open: it is not ours).
pub fn announce_mpi_start() {
    let Some(fd) = std::env::var(MPI_START_FD_VAR)
        .ok()
        .and_then(|text| text.parse::<i32>().ok())
        .filter(|fd| *fd > 2)
    else {
        return;
    };
    std::env::remove_var(MPI_START_FD_VAR);
    // SAFETY: the descriptor is only borrowed until it is known to be a pipe (ManuallyDrop
    // keeps it open otherwise); a pipe named by the variable is rank-env's, given to us to
    // write to until we end.
    let file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    let is_pipe = file.metadata().is_ok_and(|m| m.file_type().is_fifo());
    if !is_pipe {
        return;
    }
    let file = ManuallyDrop::into_inner(file);
    // A close-on-exec copy (`try_clone` duplicates with `F_DUPFD_CLOEXEC`) replaces the
    // inherited descriptor, so that nothing the command runs holds the pipe open.
    let Ok(mut kept) = file.try_clone() else {
        let mut file = file;
        let _ = file.write_all(b"M");
        return;
    };
    drop(file);
    if kept.write_all(b"M").is_ok() {
        *PROGRESS_PIPE.lock().unwrap_or_else(|e| e.into_inner()) = Some(kept);
    }
}

/// The pipe to rank-env kept by [`announce_mpi_start`], once: `None` outside `tessera launch`.
pub fn take_progress_pipe() -> Option<File> {
    PROGRESS_PIPE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
}

/// One progress report on the pipe, after the start notice (a line each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpiProgress {
    /// The rank has been inside one MPI call (`call`: `all_reduce on group world`) for `for_ms`.
    Inside {
        /// The call and its group.
        call: String,
        /// Milliseconds inside it so far.
        for_ms: u64,
    },
    /// The rank has been outside every MPI call for `for_ms` milliseconds.
    Outside {
        /// Milliseconds since its last call returned.
        for_ms: u64,
    },
    /// The rank entered or left an MPI call since its last report.
    Moving,
}

impl MpiProgress {
    /// The report's line, newline included (`inside 2000 all_reduce on group world`).
    pub fn line(&self) -> String {
        match self {
            MpiProgress::Inside { call, for_ms } => {
                // One line per report: a group label cannot break it.
                let call: String = call
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                format!("inside {for_ms} {call}\n")
            }
            MpiProgress::Outside { for_ms } => format!("outside {for_ms}\n"),
            MpiProgress::Moving => "moving\n".to_string(),
        }
    }

    /// Parses a report's line (without its newline); `None` for anything else.
    pub fn parse(line: &str) -> Option<MpiProgress> {
        let mut words = line.splitn(3, ' ');
        match (words.next()?, words.next(), words.next()) {
            ("inside", Some(ms), Some(call)) => Some(MpiProgress::Inside {
                call: call.to_string(),
                for_ms: ms.parse().ok()?,
            }),
            ("outside", Some(ms), None) => Some(MpiProgress::Outside {
                for_ms: ms.parse().ok()?,
            }),
            ("moving", None, None) => Some(MpiProgress::Moving),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    #[test]
    fn the_notice_goes_to_a_pipe_once_and_nothing_else_is_touched() {
        let (mut read, write) = std::io::pipe().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&write);
        // The descriptor now belongs to the notice, as it does in rank-env's command.
        std::mem::forget(write);
        std::env::set_var(MPI_START_FD_VAR, fd.to_string());
        announce_mpi_start();
        assert!(std::env::var(MPI_START_FD_VAR).is_err(), "said once");
        // The pipe is kept for the progress reports, close-on-exec; closed when dropped.
        let kept = take_progress_pipe().expect("kept");
        assert!(close_on_exec(kept.as_raw_fd()));
        assert!(take_progress_pipe().is_none(), "taken once");
        // The end of file below needs every write end closed: the inherited one was.
        drop(kept);
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut read, &mut got).unwrap();
        assert_eq!(
            got, b"M",
            "one byte, then the pipe was closed (end of file)"
        );
        // A descriptor that is not a pipe is left alone.
        let file = tempfile_like();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        std::env::set_var(MPI_START_FD_VAR, fd.to_string());
        announce_mpi_start();
        assert!(file.metadata().is_ok(), "still open");
        assert!(take_progress_pipe().is_none(), "not a pipe: not kept");
    }

    #[test]
    fn progress_reports_survive_their_line() {
        for report in [
            MpiProgress::Inside {
                call: "all_reduce on group dp(0,2)".into(),
                for_ms: 2250,
            },
            MpiProgress::Outside { for_ms: 0 },
            MpiProgress::Moving,
        ] {
            let line = report.line();
            assert_eq!(line.matches('\n').count(), 1, "{line:?}");
            assert_eq!(MpiProgress::parse(line.trim_end()), Some(report));
        }
        let broken = MpiProgress::Inside {
            call: "barrier on group a\nb".into(),
            for_ms: 1,
        };
        assert_eq!(broken.line(), "inside 1 barrier on group a b\n");
        for junk in ["", "inside", "inside x y", "outside 1 2", "moving on", "M"] {
            assert_eq!(MpiProgress::parse(junk), None, "{junk:?}");
        }
    }

    /// Whether descriptor `fd` of this process is close-on-exec (from `/proc/self/fdinfo`).
    fn close_on_exec(fd: i32) -> bool {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        flags & 0o2000000 != 0
    }

    fn tempfile_like() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("comm-notice-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        file
    }
}
