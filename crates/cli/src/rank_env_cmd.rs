//! `tessera rank-env -- COMMAND`: run one rank's command of an `mpirun` job with Tessera's
//! environment contract (and MindSpore's names) set from the MPI launcher's rank variables.
//!
//! `mpirun -np 4 tessera rank-env -- tessera train CONFIG` is one collective job of 4 ranks:
//! each process gets `TESSERA_RANK`, `TESSERA_WORLD_SIZE`, `TESSERA_LOCAL_RANK`, the worker
//! variables, `RANK_ID`, `RANK_SIZE`, `DEVICE_ID`, … and `TESSERA_BACKEND=mpi`, which
//! `tessera train` takes as its `--backend` when none is given. The command replaces this
//! process (`exec`), so signals and the exit status are the command's own; it is killed when
//! the MPI launcher's process that started it ends (`PR_SET_PDEATHSIG`), so no rank outlives a
//! killed `mpirun`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::process::Command;

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

/// Sets the contract for this process's rank and runs the command in its place; returns only
/// on an error.
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
    let error = command.exec();
    Err(anyhow::anyhow!(
        "cannot run {} for rank {rank}: {error}",
        program.to_string_lossy()
    ))
}

/// Asks the kernel for SIGKILL when this process's parent (the MPI launcher's process that
/// started the rank) ends; the request survives `exec`. Refuses to go on when the parent has
/// already ended (its signal would never come).
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
