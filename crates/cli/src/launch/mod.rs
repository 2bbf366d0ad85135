//! `tessera launch`: start a job's processes, after MindSpore's `msrun`.
//!
//! By default one collective job of `--nproc N` ranks on the MPI backend ([`collective`]:
//! `mpirun` over `tessera rank-env`, on this host or across nodes). With `--ps-servers S` a
//! parameter-server job of one scheduler, S servers and N workers, and with `--independent` N
//! independent workers, each started and supervised here with its role, rank and world size in
//! the environment (the contract is in `docs/LAUNCH.md` and [`plan::JobPlan::environment`]).
//! Each process's output goes to its own log file and, prefixed, to the merged console view;
//! signals to the launcher are forwarded; a failed process is restarted while `--restarts`
//! allows, and otherwise stops the job.
//!
//! The modules: [`plan`] (arguments → the processes and their environment, pure), [`output`]
//! (log files and the console view), [`child`] (starting and signalling one process),
//! [`supervise`] (the policy: restarts and ending the job) and [`collective`] (one MPI job).
//! This file is the glue.

mod child;
pub mod collective;
mod output;
mod plan;
mod supervise;

use std::ffi::OsString;
use std::fmt;
use std::net::TcpListener;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use plan::{JobPlan, LaunchRequest};
use supervise::Outcome;

/// Lines of a failed process's log shown when it stops the job.
const TAIL_LINES: usize = 20;

/// `--master_addr` when not given.
const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
/// `--master_port` when not given.
const DEFAULT_MASTER_PORT: u16 = 8118;
/// `--cluster_time_out` when not given, seconds.
const DEFAULT_CLUSTER_SECS: u64 = 600;

/// Arguments of `tessera launch`.
#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// Ranks of the job (1 to 1024), on all nodes together; msrun's `--worker_num` is an alias.
    #[arg(long, value_name = "N", visible_alias = "worker_num")]
    nproc: usize,
    /// Start N independent processes (each its own run, restarted on its own), not one
    /// collective job.
    #[arg(long)]
    independent: bool,
    /// Ranks on this node when the job spans nodes (msrun's model: the same command on every
    /// node); default: all of them.
    #[arg(long, value_name = "L", visible_alias = "local_worker_num")]
    local_worker_num: Option<usize>,
    /// Node 0's address, where the other nodes' launchers join (msrun's `--master_addr`);
    /// default 127.0.0.1.
    #[arg(long, value_name = "HOST", visible_alias = "master_addr")]
    master_addr: Option<String>,
    /// Node 0's port for the other nodes' launchers (msrun's `--master_port`); default 8118.
    #[arg(
        long,
        value_name = "PORT",
        visible_alias = "master_port",
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    master_port: Option<u16>,
    /// This node's rank (msrun's `--node_rank`); default: node 0 is the one that can listen on
    /// the master address, the others are numbered as they join.
    #[arg(long, value_name = "R", visible_alias = "node_rank")]
    node_rank: Option<usize>,
    /// msrun's `--join`: the launcher always waits for the job to end (`--join false` is
    /// refused).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    join: Option<bool>,
    /// Seconds node 0 waits for the other nodes, and a node for node 0 (msrun's
    /// `--cluster_time_out`); default 600.
    #[arg(long, value_name = "SECS", visible_alias = "cluster_time_out")]
    cluster_time_out: Option<u64>,
    /// Collective job: seconds after which a rank is taken as hung and the job is stopped,
    /// naming it: a rank stopped by a signal (SIGSTOP) this long while others run (0: never;
    /// default 300), and, only when this flag is given, a rank still running this long after
    /// another rank's command ended.
    #[arg(long, value_name = "SECS", visible_alias = "hang_time_out")]
    hang_time_out: Option<u64>,
    /// An MPI host file for one `mpirun` across hosts (reached by ssh).
    #[arg(long, value_name = "FILE")]
    hostfile: Option<PathBuf>,
    /// Run a parameter-server job: one scheduler, S servers (1 to 1024) and the N workers.
    #[arg(long, value_name = "S")]
    ps_servers: Option<usize>,
    /// Restart a failed worker or server up to K times (the scheduler is never restarted).
    #[arg(long, value_name = "K", default_value_t = 0)]
    restarts: u32,
    /// Directory of the per-process logs `<role>_<id>.log` (created if missing; existing logs
    /// are appended to, never truncated or removed); msrun's `--log_dir` is an alias.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "tessera_logs",
        visible_alias = "log_dir"
    )]
    log_dir: PathBuf,
    /// The scheduler's address given to every process (default: a free port on 127.0.0.1);
    /// only with --ps-servers.
    #[arg(long, value_name = "HOST:PORT")]
    scheduler_addr: Option<String>,
    /// Seconds between SIGTERM and SIGKILL when the job is stopped.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    grace_period: u64,
    /// The command every process runs, after `--` (e.g. `-- tessera train CONFIG`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// The job was stopped because the launcher received this signal; the binary exits with
/// 128 + the signal number, as the signal's default action would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted(pub i32);

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "interrupted by signal {}; every process was stopped",
            self.0
        )
    }
}

impl std::error::Error for Interrupted {}

/// Runs `tessera launch`: Ok when every worker exited 0 and the console view was written
/// whole (a console that could not be written is the job's error only when the job succeeded;
/// the processes and their logs went on regardless, see [`output::write_out`]).
pub fn run(args: &LaunchArgs) -> anyhow::Result<()> {
    run_job(args)?;
    match output::console_failure() {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// Starts and supervises the job `args` describes, to its end.
fn run_job(args: &LaunchArgs) -> anyhow::Result<()> {
    if args.join == Some(false) {
        anyhow::bail!("--join false is not supported: tessera launch always waits for its job (run it in the background from your shell)");
    }
    if args.independent && args.ps_servers.is_some() {
        anyhow::bail!("--independent and --ps-servers are two different jobs (N independent workers, or a parameter-server job of a scheduler, servers and workers); give one of them");
    }
    if args.ps_servers.is_none() && !args.independent {
        if args.scheduler_addr.is_some() {
            return Err(plan::PlanError::AddressWithoutServers.into());
        }
        if args
            .local_worker_num
            .is_none_or(|local| local == args.nproc)
            && (args.master_addr.is_some() || args.master_port.is_some())
        {
            // msrun's scripts give them on one node too: not an error, but not silent either.
            eprintln!("[launch] note: --master_addr and --master_port are used only by a job across nodes (--local_worker_num below --worker_num); this job's {} rank(s) all run from this node", args.nproc);
        }
        return collective::run(&collective::CollectiveRequest {
            worker_num: args.nproc,
            local_worker_num: args.local_worker_num,
            master_addr: args
                .master_addr
                .clone()
                .unwrap_or_else(|| DEFAULT_MASTER_ADDR.into()),
            master_port: args.master_port.unwrap_or(DEFAULT_MASTER_PORT),
            node_rank: args.node_rank,
            hostfile: args.hostfile.clone(),
            cluster_secs: args.cluster_time_out.unwrap_or(DEFAULT_CLUSTER_SECS),
            hang_secs: args.hang_time_out.unwrap_or(collective::DEFAULT_HANG_SECS),
            hang_strict: args.hang_time_out.is_some(),
            restarts: args.restarts,
            grace_secs: args.grace_period,
            log_dir: args.log_dir.clone(),
            command: args.command.clone(),
        });
    }
    let form = match args.independent {
        true => "--independent",
        false => "--ps-servers",
    };
    let collective_only = [
        ("--local_worker_num", args.local_worker_num.is_some()),
        ("--node_rank", args.node_rank.is_some()),
        ("--hostfile", args.hostfile.is_some()),
        ("--hang_time_out", args.hang_time_out.is_some()),
        ("--master_addr", args.master_addr.is_some()),
        ("--master_port", args.master_port.is_some()),
        ("--cluster_time_out", args.cluster_time_out.is_some()),
    ];
    if let Some((flag, _)) = collective_only.iter().find(|(_, given)| *given) {
        anyhow::bail!("{flag} belongs to one collective job, which {form} does not start: it cannot be combined with --ps-servers or --independent (--local_worker_num, --node_rank, --hostfile, --hang_time_out, --master_addr, --master_port and --cluster_time_out are the collective job's)");
    }
    let request = LaunchRequest {
        workers: args.nproc,
        servers: args.ps_servers,
        restarts: args.restarts,
        log_dir: args.log_dir.clone(),
        scheduler_addr: args.scheduler_addr.clone(),
        grace_secs: args.grace_period,
        command: args.command.clone(),
        secret: match args.ps_servers {
            Some(_) => Some(job_secret()?),
            None => None,
        },
    };
    let plan = JobPlan::new(request, free_local_port)?;
    raise_open_file_limit(plan.world_size());
    let names: Vec<String> = plan.processes.iter().map(|s| s.log_file_name()).collect();
    let logs = output::open_logs(&plan.log_dir, &names)?;
    let events = supervise::channel();
    let signals = forward_signals(events.0.clone())?;
    eprintln!("[launch] {}", summary(&plan));
    let outcome = supervise::supervise(&plan, logs, events);
    signals.close();
    report(outcome)
}

/// Turns the job's outcome into the command's result, printing a failed process's log tail.
fn report(outcome: Outcome) -> anyhow::Result<()> {
    match outcome {
        Outcome::Success { finished, lost } => {
            for worker in lost {
                eprintln!("[launch] {worker} was lost; the job finished on {finished} worker(s)");
            }
            Ok(())
        }
        Outcome::AllWorkersLost(lost) => Err(anyhow::anyhow!(
            "every worker was lost: {}; the job was stopped",
            lost.join(", ")
        )),
        Outcome::Interrupted(signal) => Err(Interrupted(signal).into()),
        Outcome::Bug(what) => Err(anyhow::anyhow!("internal error in tessera launch: {what}")),
        Outcome::StartFailed { spec, error } => Err(anyhow::anyhow!(
            "cannot start {spec} (rank {}): {error}; the job was stopped",
            spec.rank
        )),
        Outcome::Failed { spec, status, log } => {
            let shown = supervise::describe(&status);
            eprintln!("[launch] {spec} (rank {}) failed: {shown}", spec.rank);
            match output::tail(&log, TAIL_LINES) {
                Ok(lines) => {
                    eprintln!("[launch] last lines of {}:", log.display());
                    for line in lines {
                        eprintln!("[{spec}] {line}");
                    }
                }
                Err(err) => eprintln!("[launch] cannot read {}: {err}", log.display()),
            }
            Err(anyhow::anyhow!(
                "{spec} (rank {}) failed ({shown}); the job was stopped",
                spec.rank
            ))
        }
    }
}

/// `3 processes (1 scheduler, 1 server, 1 worker) …`: what is about to start.
fn summary(plan: &JobPlan) -> String {
    let workers = count(plan.num_workers, "worker");
    let mut text = if plan.num_servers > 0 {
        format!(
            "starting {} processes (1 scheduler, {}, {workers}), scheduler at {}",
            plan.world_size(),
            count(plan.num_servers, "server"),
            plan.scheduler_addr.as_deref().unwrap_or("?")
        )
    } else {
        format!("starting {workers}")
    };
    text.push_str(&format!(", logs in {}", plan.log_dir.display()));
    text
}

/// `1 worker`, `2 workers`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A port on 127.0.0.1 that is free now (the OS picks it; it is released at once for the
/// scheduler to bind).
fn free_local_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The PS job's secret: `TESSERA_JOB_SECRET` when set (so processes of this launch and of
/// launches on other hosts, given the same secret, form one job), else a fresh one.
pub(crate) fn job_secret() -> anyhow::Result<ps::auth::JobSecret> {
    Ok(match std::env::var(runtime::launch_env::JOB_SECRET) {
        Ok(text) => ps::auth::JobSecret::from_env_value(Some(text))?,
        Err(_) => ps::auth::JobSecret::generate()?,
    })
}

/// Raises the soft limit on open files towards the hard one when the job needs more than it
/// allows: the launcher holds three descriptors per process (two pipes and the log file), and
/// the common soft limit of 1024 would stop a job of 1024 workers. The processes inherit the
/// raised limit. Left as is if that fails; opening a file past the limit is then reported as
/// an error.
fn raise_open_file_limit(processes: usize) {
    let needed = (processes as u64).saturating_mul(3).saturating_add(64);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the one struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= needed {
            return;
        }
        limit.rlim_cur = needed.min(limit.rlim_max);
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
}

/// Delivers SIGINT and SIGTERM to the supervisor as events, from a plain thread.
pub(crate) fn forward_signals(
    sender: std::sync::mpsc::Sender<child::Event>,
) -> anyhow::Result<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("cannot install the signal handlers")?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("launch-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if sender.send(child::Event::Signal(signal)).is_err() {
                    break;
                }
            }
        })
        .context("cannot start the signal thread")?;
    Ok(handle)
}
