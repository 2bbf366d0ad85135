//! `tessera rank-env -- COMMAND`: run one rank's command of an `mpirun` job with Tessera's
//! environment contract (and MindSpore's names) set from the MPI launcher's rank variables.
//!
//! `mpirun -np 4 tessera rank-env -- tessera train CONFIG` is one collective job of 4 ranks:
//! each process gets `TESSERA_RANK`, `TESSERA_WORLD_SIZE`, `TESSERA_LOCAL_RANK`, the worker
//! variables, `RANK_ID`, `RANK_SIZE`, `DEVICE_ID`, … and `TESSERA_BACKEND=mpi`, which
//! `tessera train` takes as its `--backend` when none is given.
//!
//! The command runs as rank-env's child and ends as rank-env ends: its exit code is rank-env's,
//! a signal that ends it ends rank-env the same way, the signals rank-env gets are passed on,
//! and the rank is killed when the MPI launcher's process that started rank-env ends
//! (`PR_SET_PDEATHSIG`), so no rank outlives a killed `mpirun`. Nothing the command started
//! outlives the rank either: rank-env adopts the command's orphaned processes
//! (`PR_SET_CHILD_SUBREAPER`), reaps them as they end, and kills what is left when the command
//! ends or the launcher goes. When the command fails, rank-env writes
//! [`launch_env::RANK_FAILED_LINE`] to its stderr before it ends: `mpirun` forwards a rank's
//! output before it acts on the rank's end, so `tessera launch` learns which rank failed first
//! even when `mpirun`'s own report of it is missing (it sometimes is).
//!
//! Under `tessera launch` (which gives a failure token) rank-env also says when the command is
//! starting MPI (the MPI backend's notice through a pipe, `comm::start_notice`) and when it
//! ended with exit code 0 without doing so: a rank that started MPI would wait in `MPI_Init`
//! for that one forever, and the launcher stops the job instead (it used to hang). It then
//! passes on the backend's progress reports through the same pipe ([`RANK_PROGRESS_LINE`]).

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, ExitStatus};

use anyhow::Context as _;
use clap::Args;
use runtime::launch_env;

/// Arguments of `tessera rank-env`.
#[derive(Debug, Args)]
pub struct RankEnvArgs {
    /// The rank's command, after `--` (e.g. `-- tessera train CONFIG`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// rank-env's line (under `tessera launch`, ended with the job's failure token) when the
/// command was stopped by a signal (SIGSTOP, SIGTSTP, …): `… stopped (signal 19)`. A rank
/// stopped while the others run makes them wait for it; the launcher names it.
pub const RANK_STOPPED_LINE: &str = "tessera rank-env: the command was stopped";
/// rank-env's line (under `tessera launch`) when the stopped command continued (SIGCONT).
pub const RANK_CONTINUED_LINE: &str = "tessera rank-env: the command continued";
/// rank-env's line (under `tessera launch`) when the command ended with exit code 0 after it
/// started MPI (or without a word from an MPI backend either way): the launcher times how long
/// the other ranks go on after it.
pub const RANK_FINISHED_LINE: &str = "tessera rank-env: the command finished (exit code 0)";

/// rank-env's line (under `tessera launch`) passing on one of the MPI backend's progress
/// reports ([`launch_env::MpiProgress`]'s line follows): the rank has been inside one MPI
/// call, or outside every call, for a while, or moves again. The launcher records them (they
/// are not shown in the logs) to name a rank running outside MPI while others wait inside it.
pub const RANK_PROGRESS_LINE: &str = "tessera rank-env: MPI progress: ";

/// The signals passed on to the command.
const PASSED_SIGNALS: [i32; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Sets the contract for this process's rank, runs the command and ends as it ended.
pub fn run(args: &RankEnvArgs) -> anyhow::Result<()> {
    let (rank, size, local) = launch_env::mpi_launcher_rank(|name| std::env::var(name).ok())?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "tessera rank-env runs each rank of an MPI launcher's job (`mpirun -np N tessera rank-env -- COMMAND`): none of OMPI_COMM_WORLD_RANK or PMI_RANK is set"
            )
        })?;
    // `tessera launch` counts the whole job's restarts; a bare `mpirun` job starts at 0.
    let restarts = match std::env::var(launch_env::RESTART_COUNT) {
        Ok(text) => text.parse::<u32>().map_err(|_| {
            anyhow::anyhow!(
                "{} must be a whole number, got {text:?}",
                launch_env::RESTART_COUNT
            )
        })?,
        Err(_) => 0,
    };
    let vars = launch_env::mpi_rank_vars(rank, size, local, restarts);
    // Read before the command's environment drops it (it is among the launcher's variables).
    let token = std::env::var(launch_env::FAILURE_TOKEN).ok();
    let (program, rest) = args
        .command
        .split_first()
        .context("no command given after --")?;
    let mut command = Command::new(program);
    command.args(rest);
    for name in launch_env::LAUNCHER_VARS {
        if !vars.iter().any(|(k, _)| *k == name) {
            command.env_remove(name);
        }
    }
    command.envs(vars.iter().map(|(k, v)| (k, v)));
    // The signals are caught before the command starts, so none is lost in between, and before
    // the launcher's end is asked for, so that its signal is caught too.
    let mut signals = signal_hook::iterator::Signals::new(PASSED_SIGNALS)
        .context("cannot install the signal handlers")?;
    // An adopted orphan's end (SIGCHLD) is reaped at once, not left a zombie until the rank ends.
    signals
        .add_signal(libc::SIGCHLD)
        .context("cannot install the signal handlers")?;
    let launcher = die_with_launcher()?;
    adopt_orphans()?;
    ps::launch::die_with_parent(&mut command);
    let notice = match &token {
        Some(token) => Some(StartNotice::give(&mut command, token)?),
        None => None,
    };
    let mut child = command.spawn().map_err(|error| {
        anyhow::anyhow!(
            "cannot run {} for rank {rank}: {error}",
            program.to_string_lossy()
        )
    })?;
    let notice = notice.map(StartNotice::watch).transpose()?;
    let pid = child.id() as libc::pid_t;
    let handle = signals.handle();
    let passer = std::thread::Builder::new()
        .name("rank-env-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if signal == libc::SIGCHLD {
                    reap_adopted(pid);
                    continue;
                }
                if launcher_ended(launcher) {
                    kill_the_rank(pid);
                }
                // SAFETY: kill(2) on our own child, which is not reaped before this thread ends
                // (see `wait_unreaped`).
                unsafe {
                    libc::kill(pid, signal);
                }
            }
        })
        .context("cannot start the signal thread")?;
    // Waiting without reaping keeps the child's process id from being reused while the
    // signal thread may still pass a signal to it.
    let waited = wait_unreaped(pid, token.as_deref());
    handle.close();
    let _ = passer.join();
    waited.with_context(|| format!("cannot wait for rank {rank}'s command"))?;
    let status = child
        .wait()
        .with_context(|| format!("cannot wait for rank {rank}'s command"))?;
    end_descendants();
    if status.success() {
        if let Some(token) = &token {
            let line = match notice.is_some_and(|watch| !watch.started()) {
                true => format!("{} (exit code 0)", launch_env::RANK_ENDED_BEFORE_MPI_LINE),
                false => RANK_FINISHED_LINE.to_string(),
            };
            eprintln!("{line}{}", launch_env::failure_token_suffix(token));
        }
    }
    end_as(status, token.as_deref())
}

/// The pipe through which the command's MPI backend says it is starting MPI
/// (`comm::start_notice`), before the command is started.
struct StartNotice {
    read: std::io::PipeReader,
    write: std::io::PipeWriter,
    token: String,
}

/// A thread reading the notice while the command runs: it writes
/// [`launch_env::RANK_MPI_STARTING_LINE`] when the notice comes, and reports whether it came.
struct NoticeWatch(std::sync::mpsc::Receiver<bool>);

impl StartNotice {
    /// A pipe whose write end the command inherits, named in its [`launch_env::MPI_START_FD`].
    fn give(command: &mut Command, token: &str) -> anyhow::Result<StartNotice> {
        use std::os::fd::AsRawFd as _;
        use std::os::unix::process::CommandExt as _;
        let (read, write) = std::io::pipe().context("cannot make the MPI start notice's pipe")?;
        let fd = write.as_raw_fd();
        command.env(launch_env::MPI_START_FD, fd.to_string());
        // SAFETY: the closure runs in the child between fork and exec and calls only the
        // async-signal-safe fcntl(2): the write end (close-on-exec here) stays open across the
        // command's exec.
        unsafe {
            command.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(StartNotice {
            read,
            write,
            token: token.to_string(),
        })
    }

    /// Closes rank-env's write end (the command holds its own) and starts the reading thread.
    fn watch(self) -> anyhow::Result<NoticeWatch> {
        let StartNotice {
            mut read,
            write,
            token,
        } = self;
        drop(write);
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("rank-env-mpi-notice".into())
            .spawn(move || {
                let started = read_notice(&mut read);
                let suffix = launch_env::failure_token_suffix(&token);
                if started {
                    eprintln!("{}{suffix}", launch_env::RANK_MPI_STARTING_LINE);
                }
                let _ = sender.send(started);
                if started {
                    pass_on_progress(read, &suffix);
                }
            })
            .context("cannot start the MPI notice thread")?;
        Ok(NoticeWatch(receiver))
    }
}

/// Passes the MPI backend's progress reports (`launch_env::MpiProgress`, a line each
/// after the notice) on to the launcher as [`RANK_PROGRESS_LINE`] lines, until the pipe ends.
fn pass_on_progress(read: std::io::PipeReader, suffix: &str) {
    use std::io::BufRead as _;
    let mut lines = std::io::BufReader::new(read);
    let mut line = String::new();
    loop {
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                let report = line.trim_end();
                if launch_env::MpiProgress::parse(report).is_some() {
                    eprintln!("{RANK_PROGRESS_LINE}{report}{suffix}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// Whether a byte comes through `read` before its end (every write end closed).
fn read_notice(read: &mut std::io::PipeReader) -> bool {
    let mut byte = [0u8; 1];
    loop {
        match std::io::Read::read(read, &mut byte) {
            Ok(n) => return n == 1,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// Longest wait, once the command and its descendants have ended (so every write end of the
/// pipe is closed), for the notice thread's answer; without one the rank is taken as having
/// started MPI (nothing is said).
const NOTICE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl NoticeWatch {
    /// Whether the command said it was starting MPI.
    fn started(self) -> bool {
        self.0.recv_timeout(NOTICE_WAIT).unwrap_or(true)
    }
}

/// Waits for the child `pid` to end, leaving it to be reaped (`waitid` with `WNOWAIT`). Under
/// `tessera launch` (`token` given) it also says when the command is stopped by a signal and
/// when it continues ([`RANK_STOPPED_LINE`], [`RANK_CONTINUED_LINE`]).
fn wait_unreaped(pid: libc::pid_t, token: Option<&str>) -> std::io::Result<()> {
    let watch_stops = match token {
        Some(_) => libc::WSTOPPED | libc::WCONTINUED,
        None => 0,
    };
    loop {
        // SAFETY: waitid(2) writes only into `info`, a zeroed siginfo_t owned here.
        let (done, code, signal) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let done = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT | watch_stops,
            );
            (done, info.si_code, info.si_status())
        };
        if done != 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::Interrupted {
                return Err(error);
            }
            continue;
        }
        let line = match code {
            libc::CLD_STOPPED => format!("{RANK_STOPPED_LINE} (signal {signal})"),
            libc::CLD_CONTINUED => RANK_CONTINUED_LINE.to_string(),
            _ => return Ok(()),
        };
        // Take the stop or continue event (without WEXITED nothing is reaped), so that the next
        // wait blocks until the command's next change.
        // SAFETY: as above.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WSTOPPED | libc::WCONTINUED | libc::WNOHANG,
            );
        }
        if let Some(token) = token {
            eprintln!("{line}{}", launch_env::failure_token_suffix(token));
        }
    }
}

/// Ends this process as the command ended: with its exit code, or by its signal (after the
/// failure line on stderr when it failed, ending with the launcher's `token` if it gave one).
fn end_as(status: ExitStatus, token: Option<&str>) -> anyhow::Result<()> {
    if status.success() {
        std::process::exit(0);
    }
    let token = token
        .map(launch_env::failure_token_suffix)
        .unwrap_or_default();
    match (status.code(), status.signal()) {
        (Some(code), _) => {
            eprintln!("{} (exit code {code}){token}", launch_env::RANK_FAILED_LINE);
            std::process::exit(code);
        }
        (None, Some(signal)) => {
            eprintln!("{} (signal {signal}){token}", launch_env::RANK_FAILED_LINE);
            // SAFETY: signal(2) and raise(3) with plain integers: the default action of the
            // signal that ended the command now ends this process.
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
                libc::raise(signal);
            }
            // A signal whose default action does not end a process.
            std::process::exit(128 + signal);
        }
        (None, None) => anyhow::bail!("the command ended with an unknown status {status:?}"),
    }
}

/// The signal the kernel sends this process when its parent (the MPI launcher's process that
/// started the rank) ends: one rank-env catches, so that it can end the whole rank.
const LAUNCHER_ENDED_SIGNAL: i32 = libc::SIGTERM;

/// Asks the kernel for [`LAUNCHER_ENDED_SIGNAL`] when this process's parent (the MPI
/// launcher's process that started the rank) ends, and returns that parent. Refuses to go on
/// when the parent has already ended (its signal would never come).
fn die_with_launcher() -> anyhow::Result<libc::pid_t> {
    // SAFETY: getppid(2) and prctl(2) take plain integers and touch no memory of ours.
    unsafe {
        let parent = libc::getppid();
        if libc::prctl(libc::PR_SET_PDEATHSIG, LAUNCHER_ENDED_SIGNAL, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error())
                .context("cannot ask to end with the MPI launcher (prctl PR_SET_PDEATHSIG)");
        }
        if libc::getppid() != parent {
            anyhow::bail!("the MPI launcher's process that started this rank has already ended");
        }
        Ok(parent)
    }
}

/// Whether the MPI launcher's process that started this rank (`launcher`) has ended.
fn launcher_ended(launcher: libc::pid_t) -> bool {
    // SAFETY: getppid(2) takes nothing and cannot fail.
    unsafe { libc::getppid() != launcher }
}

/// Ends the rank at once, when its launcher is gone: nothing is left to wait for its clean-up,
/// and its processes must not outlive the job. The command and every process it started (they
/// are this process's descendants, adopted when orphaned: [`adopt_orphans`]) are killed, even
/// those that ignore SIGTERM.
fn kill_the_rank(command: libc::pid_t) -> ! {
    // SAFETY: kill(2) on our own child, not reaped yet (see `wait_unreaped`).
    unsafe {
        libc::kill(command, libc::SIGKILL);
    }
    end_descendants();
    std::process::exit(128 + libc::SIGKILL)
}

/// Makes this process the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`): a
/// process the command started and left behind becomes this process's child, so that
/// [`end_descendants`] finds it, wherever it was started from.
fn adopt_orphans() -> anyhow::Result<()> {
    // SAFETY: prctl(2) with plain integers.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error()).context(
            "cannot adopt the command's orphaned processes (prctl PR_SET_CHILD_SUBREAPER)",
        );
    }
    Ok(())
}

/// Reaps every ended child of this process but the command (which the main thread reaps):
/// the orphans [`adopt_orphans`] made this process's children, as they end, so that none stays
/// a zombie while the rank runs.
fn reap_adopted(command: libc::pid_t) {
    loop {
        // SAFETY: waitid(2) writes only into `info`, a zeroed siginfo_t owned here; WNOWAIT
        // leaves the child to be reaped below (or, the command, by the main thread).
        let ended = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let found = libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            if found != 0 {
                return;
            }
            info.si_pid()
        };
        if ended == 0 || ended == command {
            // Nothing ended, or the command did: the main thread reaps it, and the others
            // that ended are reaped when the rank ends.
            return;
        }
        // SAFETY: waitpid(2) on a child that has ended, with no status pointer.
        unsafe {
            libc::waitpid(ended, std::ptr::null_mut(), libc::WNOHANG);
        }
    }
}

/// How long [`end_descendants`] keeps killing the descendants that appear.
const END_DESCENDANTS_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// Kills (SIGKILL) and reaps every child of this process, and the children they leave as they
/// die (adopted: [`adopt_orphans`]), until none is left: what the rank's command left running
/// does not outlive the rank. Call it once the command itself has been reaped.
fn end_descendants() {
    let until = std::time::Instant::now() + END_DESCENDANTS_FOR;
    // SAFETY: getpid(2) takes nothing.
    let me = unsafe { libc::getpid() };
    loop {
        let children = children_of(me);
        if children.is_empty() || std::time::Instant::now() > until {
            return;
        }
        for child in children {
            // SAFETY: kill(2) on our own child; waitpid(2) with WNOHANG reaps only our children.
            unsafe {
                libc::kill(child, libc::SIGKILL);
            }
        }
        // SAFETY: as above; a null status pointer is allowed.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The processes whose parent is `parent` (from `/proc/<pid>/stat`).
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: libc::pid_t = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`: the name may hold spaces and parentheses.
            let after_name = &stat[stat.rfind(')')? + 1..];
            let ppid: libc::pid_t = after_name.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}
