//! `tessera`: the command line of the Tessera parallel-training engine.
//!
//! This crate is glue: it parses arguments into validated requests, makes one library call,
//! prints the result and turns errors into a one-line reason and a non-zero exit code. Anything
//! worth testing lives in the library crates. The exception is `launch`, a process supervisor:
//! processes, signals and exit codes are this crate's business alone (ARCHITECTURE.md, `cli`).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use clap::{Parser, Subcommand};

mod bench_cmd;
mod ckpt_cmd;
mod generate_cmd;
mod grid;
mod launch;
mod layout_cmd;
mod parse;
mod plan_cmd;
mod ps_cmd;
mod rank_env_cmd;
mod reshard_cmd;
mod stdout;
mod strategy_cmd;
mod timeline;
mod train_cmd;

/// Tessera: parallel training and distributed checkpoints.
#[derive(Debug, Parser)]
#[command(name = "tessera", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show how a tensor is laid out over a device mesh: every rank's slice, the replica groups,
    /// and a drawing of the blocks.
    Layout(layout_cmd::LayoutArgs),
    /// Train a model from a TOML configuration on N ranks (threads, or MPI processes).
    Train(train_cmd::TrainArgs),
    /// Sample text from a trained GPT (its checkpoint under any strategy).
    Generate(generate_cmd::GenerateArgs),
    /// Plan moving a tensor from one layout to another (bytes per rank, lower bound, every step);
    /// `--run` executes it on local ranks and checks the result.
    Reshard(reshard_cmd::ReshardArgs),
    /// Plan a run without starting ranks: search (or cost) every op's strategy, predict the
    /// step time and memory, write the operator strategy file.
    Plan(plan_cmd::PlanArgs),
    /// Benchmarks, each next to its baseline measured in the same run.
    Bench(bench_cmd::BenchArgs),
    /// Distributed checkpoints: convert, rank lists, merge, load, dedup, verify, inspect.
    Ckpt(ckpt_cmd::CkptArgs),
    /// Strategy files: show, merge pipeline stages, restore ranks from group info.
    Strategy(strategy_cmd::StrategyArgs),
    /// Start a job, after MindSpore's `msrun`: one collective job of N ranks on the MPI backend
    /// (`mpirun` over `tessera rank-env`, on this host or across nodes with msrun's flags), a
    /// parameter-server job (`--ps-servers`) or N independent processes (`--independent`);
    /// per-rank logs, a merged console view, signal forwarding, restarts.
    Launch(launch::LaunchArgs),
    /// Run one rank of an `mpirun` job with Tessera's environment contract set from the MPI
    /// launcher's rank (`mpirun -np N tessera rank-env -- tessera train CONFIG`: one collective
    /// job, `tessera train` on the MPI backend).
    RankEnv(rank_env_cmd::RankEnvArgs),
    /// The remote shell `tessera launch` gives `mpirun` across nodes (not for users).
    #[command(hide = true)]
    LaunchAgent(launch::collective::agent::AgentArgs),
}

/// Applies the resource settings read from the environment before any input is read: the
/// ceiling on ranks per mesh ([`layout::limits::max_ranks`], default 1,048,576).
fn apply_limits() -> anyhow::Result<()> {
    if let Some(text) = std::env::var_os(runtime::launch_env::MAX_RANKS) {
        let text = text.to_string_lossy();
        layout::limits::set_max_ranks_from_str(&text)?;
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    apply_limits()?;
    match cli.command {
        Command::Layout(args) => layout_cmd::run(&args),
        Command::Train(args) => train_cmd::run(&args),
        Command::Generate(args) => generate_cmd::run(&args),
        Command::Reshard(args) => reshard_cmd::run(&args),
        Command::Plan(args) => plan_cmd::run(&args),
        Command::Bench(args) => bench_cmd::run(&args),
        Command::Ckpt(args) => ckpt_cmd::run(&args),
        Command::Strategy(args) => strategy_cmd::run(&args),
        Command::Launch(args) => launch::run(&args),
        Command::RankEnv(args) => rank_env_cmd::run(&args),
        Command::LaunchAgent(args) => {
            let code = launch::collective::agent::run(&args)?;
            std::process::exit(code);
        }
    }
}

/// Set while a command supervises child processes (a parameter-server `tessera train` that
/// started its roles): a signal is then recorded in [`STOP_SIGNAL`] for it to stop them,
/// rather than ending this process at once and leaving them running.
static SUPERVISING: AtomicBool = AtomicBool::new(false);

/// The signal received while [`SUPERVISING`] (0: none).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// On SIGINT, SIGTERM or SIGHUP: while a command supervises children, hand it the signal (see
/// [`SUPERVISING`]); otherwise remove the staging directories and lock files of unfinished
/// checkpoint writes (a committed set is never touched; a commit in progress finishes first),
/// then exit with 128 + the signal number, as the default action would.
fn clean_up_on_signals() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        return;
    };
    std::thread::spawn(move || {
        for signal in signals.forever() {
            if SUPERVISING.load(Ordering::SeqCst) {
                STOP_SIGNAL.store(signal, Ordering::SeqCst);
                continue;
            }
            ckpt::abandon_pending_sets();
            std::process::exit(128 + signal);
        }
    });
}

/// The error and its causes, each cause once: messages that already quote their cause (most
/// I/O errors do) do not repeat it.
fn message(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    runtime::allocator::keep_freed_memory();
    // `launch` and `rank-env` write no checkpoint sets and handle their signals themselves:
    // they pass them on to their processes and exit only as those end (exiting at once here
    // would have the kernel SIGKILL a rank-env command before it could act on the signal).
    if !matches!(cli.command, Command::Launch(_) | Command::RankEnv(_)) {
        clean_up_on_signals();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // A broken pipe (e.g. `tessera … | head`) is not an error worth reporting.
            if err
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", message(&err));
            if let Some(launch::Interrupted(signal)) = err.downcast_ref::<launch::Interrupted>() {
                return ExitCode::from(u8::try_from(128 + signal).unwrap_or(1));
            }
            ExitCode::FAILURE
        }
    }
}
