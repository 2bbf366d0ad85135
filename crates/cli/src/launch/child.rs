//! Starting one process of the job and signalling it.
//!
//! Every process is the leader of its own process group, so a signal reaches it and everything
//! it started (a shell's children, say) at once, and a Ctrl-C at the terminal reaches only the
//! launcher, which forwards it exactly once. Each asks the kernel for SIGKILL when the launcher
//! ends ([`ps::launch::die_with_parent`]), so none outlives a launcher that was killed. Its stdin is closed (`/dev/null`); stdout and stderr
//! go to [`output::pump`] threads. A waiter thread owns the child, reaps it, waits for the output
//! threads to copy its last lines (at most [`DRAIN_WAIT`]: a stray grandchild may keep a pipe
//! open) and then reports its exit as an [`Event`].

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::output::{self, Router};

/// Longest wait, after a process ended, for its output threads to reach the end of its pipes.
/// Generous: on a loaded machine the threads may need seconds to copy the last lines (the
/// failure report `mpirun` prints as it exits, which names the failed rank); only a stray
/// grandchild holding a pipe open makes the whole wait happen.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// What the supervisor is told.
#[derive(Debug)]
pub enum Event {
    /// The process in slot `slot` ended (or waiting for it failed), and its output is copied.
    Exited {
        /// Index of the process in the job plan.
        slot: usize,
        /// How it ended.
        status: io::Result<ExitStatus>,
    },
    /// The launcher received this signal.
    Signal(i32),
    /// The job cannot complete, for this reason (a collective job's ranks showed it): stop it.
    Stop(String),
}

/// A started process that has not been reported as ended yet.
#[derive(Debug)]
pub struct Running {
    /// Its process id, which is also its process group id.
    pub pid: libc::pid_t,
}

/// What one start of a process needs.
pub struct StartRequest<'a> {
    /// The program and its arguments.
    pub command: &'a [OsString],
    /// Variables to set.
    pub set: &'a [(&'static str, String)],
    /// Variables to remove (those of the contract this process does not get).
    pub remove: &'a [&'static str],
    /// Where its output lines go (its log file and console prefix, or per-rank files).
    pub output: Arc<dyn Router>,
    /// Its name in thread names (`worker 1`, `mpirun`).
    pub name: String,
    /// Its index in the job plan, reported back in [`Event::Exited`].
    pub slot: usize,
}

/// Starts the process and its output and waiter threads.
pub fn start(request: StartRequest<'_>, events: &Sender<Event>) -> io::Result<Running> {
    let (program, args) = request
        .command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // Its own process group keeps it out of the terminal's signals; the kernel's SIGKILL when
    // the launcher ends (SIGKILL of the launcher included) keeps it from outliving the launcher.
    ps::launch::die_with_parent(&mut command);
    for name in request.remove {
        command.env_remove(name);
    }
    command.envs(request.set.iter().map(|(k, v)| (k, v)));
    let mut child = command.spawn().map_err(|err| {
        io::Error::new(err.kind(), format!("{}: {err}", program.to_string_lossy()))
    })?;
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::other(format!(
            "process id {} out of range",
            child.id()
        )));
    };
    match watch(child, pid, request, events) {
        Ok(()) => Ok(Running { pid }),
        Err(err) => {
            // Nothing watches it: do not leave it running or unreaped.
            signal_group(pid, libc::SIGKILL);
            // SAFETY: waitpid(2) on our own child, with no status pointer.
            unsafe {
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            Err(err)
        }
    }
}

/// Starts the output threads and the waiter thread of the just-spawned `child` (process `pid`).
fn watch(
    mut child: Child,
    pid: libc::pid_t,
    request: StartRequest<'_>,
    events: &Sender<Event>,
) -> io::Result<()> {
    let mut pumps = Vec::with_capacity(2);
    if let Some(stdout) = child.stdout.take() {
        pumps.push(output::pump(stdout, &request.name, request.output.clone())?);
    }
    if let Some(stderr) = child.stderr.take() {
        pumps.push(output::pump(stderr, &request.name, request.output)?);
    }
    let events = events.clone();
    let slot = request.slot;
    std::thread::Builder::new()
        .name(format!("launch-wait {pid}"))
        .spawn(move || {
            let status = child.wait();
            drain(pumps);
            // The supervisor outlives every waiter; a closed channel means it has given up.
            let _ = events.send(Event::Exited { slot, status });
        })?;
    Ok(())
}

/// Waits (at most [`DRAIN_WAIT`]) for the output threads to end, and joins those that did; one
/// still blocked on a pipe that a stray grandchild holds open is left to itself.
fn drain(pumps: Vec<JoinHandle<()>>) {
    let deadline = Instant::now() + DRAIN_WAIT;
    while Instant::now() < deadline && !pumps.iter().all(|p| p.is_finished()) {
        std::thread::sleep(Duration::from_millis(5));
    }
    for pump in pumps.into_iter().filter(|p| p.is_finished()) {
        let _ = pump.join();
    }
}

/// Sends `signal` to the process group led by `pid`. A group that is already gone is not an
/// error.
pub fn signal_group(pid: libc::pid_t, signal: i32) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(-pid, signal);
    }
}
