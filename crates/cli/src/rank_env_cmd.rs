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
//! and both are killed when the MPI launcher's process that started rank-env ends
//! (`PR_SET_PDEATHSIG`), so no rank outlives a killed `mpirun`. When the command fails,
//! rank-env writes [`launch_env::RANK_FAILED_LINE`] to its stderr before it ends: `mpirun`
//! forwards a rank's output before it acts on the rank's end, so `tessera launch` learns which
//! rank failed first even when `mpirun`'s own report of it is missing (it sometimes is).

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
    die_with_launcher()?;
    // The signals are caught before the command starts, so none is lost in between.
    let mut signals = signal_hook::iterator::Signals::new(PASSED_SIGNALS)
        .context("cannot install the signal handlers")?;
    ps::launch::die_with_parent(&mut command);
    let mut child = command.spawn().map_err(|error| {
        anyhow::anyhow!(
            "cannot run {} for rank {rank}: {error}",
            program.to_string_lossy()
        )
    })?;
    let pid = child.id() as libc::pid_t;
    let handle = signals.handle();
    let passer = std::thread::Builder::new()
        .name("rank-env-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
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
    let waited = wait_unreaped(pid);
    handle.close();
    let _ = passer.join();
    waited.with_context(|| format!("cannot wait for rank {rank}'s command"))?;
    let status = child
        .wait()
        .with_context(|| format!("cannot wait for rank {rank}'s command"))?;
    end_as(status)
}

/// Waits for the child `pid` to end, leaving it to be reaped (`waitid` with `WNOWAIT`).
fn wait_unreaped(pid: libc::pid_t) -> std::io::Result<()> {
    loop {
        // SAFETY: waitid(2) writes only into `info`, a zeroed siginfo_t owned here.
        let done = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if done == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Ends this process as the command ended: with its exit code, or by its signal (after the
/// failure line on stderr when it failed).
fn end_as(status: ExitStatus) -> anyhow::Result<()> {
    if status.success() {
        std::process::exit(0);
    }
    match (status.code(), status.signal()) {
        (Some(code), _) => {
            eprintln!("{} (exit code {code})", launch_env::RANK_FAILED_LINE);
            std::process::exit(code);
        }
        (None, Some(signal)) => {
            eprintln!("{} (signal {signal})", launch_env::RANK_FAILED_LINE);
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

/// Asks the kernel for SIGKILL when this process's parent (the MPI launcher's process that
/// started the rank) ends. Refuses to go on when the parent has already ended (its signal would
/// never come).
fn die_with_launcher() -> anyhow::Result<()> {
    // SAFETY: getppid(2) and prctl(2) take plain integers and touch no memory of ours.
    unsafe {
        let parent = libc::getppid();
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error())
                .context("cannot ask to end with the MPI launcher (prctl PR_SET_PDEATHSIG)");
        }
        if libc::getppid() != parent {
            anyhow::bail!("the MPI launcher's process that started this rank has already ended");
        }
    }
    Ok(())
}
