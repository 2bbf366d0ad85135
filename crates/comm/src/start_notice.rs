//! The MPI backend's notice to `tessera rank-env` that this rank is starting MPI.
//!
//! rank-env hands its command the write end of a pipe, named by [`MPI_START_FD_VAR`]. Just
//! before `MPI_Init` the backend writes one byte to it and closes it. A rank whose command ends
//! with exit code 0 and never wrote it did not take part in MPI: if another rank of the job
//! started MPI, that rank waits in `MPI_Init` for it forever, and the launcher stops the job
//! instead of hanging (rank-env tells it both).

use std::io::Write as _;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd as _;
use std::os::unix::fs::FileTypeExt as _;

/// The variable naming the pipe's write end (a file descriptor number) in the rank's command.
pub const MPI_START_FD_VAR: &str = "TESSERA_MPI_START_FD";

/// Writes the notice to the pipe [`MPI_START_FD_VAR`] names, once, and closes it. Nothing
/// happens without the variable, or when the descriptor it names is not a pipe (it is left
/// open: it is not ours).
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
    // write once and close.
    let file = ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let is_pipe = file.metadata().is_ok_and(|m| m.file_type().is_fifo());
    if !is_pipe {
        return;
    }
    let mut file = ManuallyDrop::into_inner(file);
    let _ = file.write_all(b"M");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notice_goes_to_a_pipe_once_and_nothing_else_is_touched() {
        let (mut read, write) = std::io::pipe().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&write);
        // The descriptor now belongs to the notice, as it does in rank-env's command.
        std::mem::forget(write);
        std::env::set_var(MPI_START_FD_VAR, fd.to_string());
        announce_mpi_start();
        assert!(std::env::var(MPI_START_FD_VAR).is_err(), "said once");
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
    }

    fn tempfile_like() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("comm-notice-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        file
    }
}
