//! `tessera bench ps`: parameter-server training of the seed MLP (digits, hidden 128, global
//! batch 32) in steps/s — sync and async, 1, 2 and 4 workers, 1 and 2 servers — next to
//! data-parallel all-reduce training on the local backend in the same run, and the time a
//! sync job takes to go on after a worker is killed.
//!
//! The roles run as threads of this process over real gRPC on 127.0.0.1 (the recovery run
//! starts real processes of this binary); everything shares this machine's cores.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use runtime::{LaunchOptions, Session, TrainConfig};

/// Arguments of `tessera bench ps`.
#[derive(Debug, Args)]
pub struct PsBenchArgs {
    /// Steps per run.
    #[arg(long, default_value_t = 200)]
    steps: u64,
    /// The digits directory.
    #[arg(long, default_value = "data/digits")]
    data: PathBuf,
    /// `ps.dead_after_ms` of the recovery run.
    #[arg(long, default_value_t = 1000)]
    dead_after_ms: u64,
}

/// The seed MLP config: `[parallel]` body `parallel`, `[ps]` body `ps` (empty: no section).
fn config_text(
    data: &Path,
    out: &Path,
    parallel: &str,
    ps: &str,
    steps: u64,
    print: u64,
) -> String {
    let ps = match ps.is_empty() {
        true => String::new(),
        false => format!("[ps]\n{ps}\n"),
    };
    format!(
        "[model]\nname = \"seed_mlp\"\nhidden = 128\nclasses = 10\n\
         [data]\nformat = \"idx\"\ndir = \"{}\"\nbatch_size = 32\nshuffle = true\n\
         [parallel]\n{parallel}\n{ps}\
         [train]\nepochs = 100\nmax_steps = {steps}\noptimizer = \"momentum\"\nlearning_rate = 0.02\n\
         momentum = 0.9\nseed = 3\neval = false\nper_print_times = {print}\n\
         [output]\ndir = \"{}\"\n",
        data.display(),
        out.display()
    )
}

fn parse(text: &str) -> anyhow::Result<TrainConfig> {
    Ok(TrainConfig::parse(text, None, &[], Path::new("."))?)
}

/// Steps/s of data-parallel training on `devices` ranks.
fn data_parallel(args: &PsBenchArgs, dir: &Path, devices: usize) -> anyhow::Result<f64> {
    let parallel = format!("mode = \"data_parallel\"\ndevices = {devices}");
    let config = parse(&config_text(
        &args.data,
        &dir.join("dp"),
        &parallel,
        "",
        args.steps,
        0,
    ))?;
    let session = Session::new(&config)?;
    let options = LaunchOptions {
        print_loss: false,
        ..LaunchOptions::default()
    };
    let report = runtime::train_local(&session, &options)?;
    let ms: f64 = report.step_ms().iter().sum();
    Ok(report.step_ms().len() as f64 / (ms / 1e3).max(1e-9))
}

/// Steps/s of a parameter-server job (worker 0's step loop).
fn parameter_server(
    args: &PsBenchArgs,
    dir: &Path,
    sync: bool,
    servers: usize,
    workers: usize,
) -> anyhow::Result<f64> {
    let ps = format!("servers = {servers}\nworkers = {workers}\nsync = {sync}\nstaleness = 2");
    let text = config_text(
        &args.data,
        &dir.join("ps"),
        "mode = \"parameter_server\"",
        &ps,
        args.steps,
        0,
    );
    let config = parse(&text)?;
    let addr = format!("127.0.0.1:{}", ps::launch::free_local_port()?);
    let handles: Vec<_> = (0..1 + servers + workers)
        .map(|rank| {
            let config = config.clone();
            let vars = ps::launch::role_env(rank, servers, workers, &addr);
            std::thread::spawn(move || -> anyhow::Result<Option<ps::WorkerReport>> {
                let env = ps::RoleEnv::from_lookup(|n| {
                    vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
                })?
                .ok_or_else(|| anyhow::anyhow!("no role"))?;
                Ok(ps::run_role(&config, &env)?)
            })
        })
        .collect();
    let mut rate = None;
    for h in handles {
        let report = h
            .join()
            .map_err(|_| anyhow::anyhow!("a role thread panicked"))??;
        if let Some(r) = report.filter(|r| r.worker_id == 0) {
            rate = Some(r.steps_run as f64 / r.step_seconds.max(1e-9));
        }
    }
    rate.ok_or_else(|| anyhow::anyhow!("worker 0 did not report"))
}

/// Kills worker 2 of a sync job of 3 workers (real processes of this binary) after step 20;
/// returns the seconds until the scheduler declared it dead and until worker 0 finished its
/// next step.
fn recovery(args: &PsBenchArgs, dir: &Path) -> anyhow::Result<(f64, f64)> {
    let ps = format!(
        "servers = 1\nworkers = 3\nheartbeat_ms = 100\ndead_after_ms = {}",
        args.dead_after_ms
    );
    let steps = args.steps.max(60);
    let text = config_text(
        &args.data,
        &dir.join("rec"),
        "mode = \"parameter_server\"",
        &ps,
        steps,
        1,
    );
    let config = dir.join("recovery.toml");
    std::fs::write(&config, text)?;
    let program = std::env::current_exe()?;
    let addr = format!("127.0.0.1:{}", ps::launch::free_local_port()?);
    let (tx, rx) = mpsc::channel::<(usize, Instant, String)>();
    let mut children = Vec::new();
    for rank in 0..5 {
        let mut child = Command::new(&program)
            .arg("train")
            .arg(&config)
            .envs(ps::launch::role_env(rank, 1, 3, &addr))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let streams: [Box<dyn std::io::Read + Send>; 2] = [
            Box::new(
                child
                    .stdout
                    .take()
                    .ok_or_else(|| anyhow::anyhow!("no stdout"))?,
            ),
            Box::new(
                child
                    .stderr
                    .take()
                    .ok_or_else(|| anyhow::anyhow!("no stderr"))?,
            ),
        ];
        for stream in streams {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send((rank, Instant::now(), line)).is_err() {
                        break;
                    }
                }
            });
        }
        children.push(child);
    }
    drop(tx);
    let limit = Duration::from_secs(120);
    let next = |want: &dyn Fn(usize, &str) -> bool| -> anyhow::Result<Instant> {
        loop {
            let (rank, at, line) = rx
                .recv_timeout(limit)
                .map_err(|_| anyhow::anyhow!("the recovery run stalled"))?;
            if want(rank, &line) {
                return Ok(at);
            }
        }
    };
    // Rank 2 is worker 0 (rank 1 the server); rank 4 is worker 2.
    next(&|rank, line| rank == 2 && line.contains("step: 20,"))?;
    let killed = Instant::now();
    children[4].kill()?;
    let dead = next(&|rank, line| rank == 0 && line.contains("worker 2 declared dead"))?;
    let resumed = next(&|rank, line| rank == 2 && line.contains(", loss is "))?;
    for child in &mut children {
        let _ = child.wait();
    }
    Ok((
        dead.duration_since(killed).as_secs_f64(),
        resumed.duration_since(killed).as_secs_f64(),
    ))
}

/// Runs `tessera bench ps`.
pub fn run(args: &PsBenchArgs) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("tessera-bench-ps-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!(
        "seed MLP (digits, hidden 128, global batch 32, momentum), {} steps per run; steps/s of worker 0's loop (PS) or the mean step (DP)",
        args.steps
    );
    println!("{:<28} {:>9}", "run", "steps/s");
    for devices in [1, 2, 4] {
        let rate = data_parallel(args, &dir, devices)?;
        println!(
            "{:<28} {rate:>9.1}",
            format!("all-reduce DP, {devices} rank(s)")
        );
    }
    for sync in [true, false] {
        for servers in [1, 2] {
            for workers in [1, 2, 4] {
                let rate = parameter_server(args, &dir, sync, servers, workers)?;
                let mode = if sync { "sync" } else { "async" };
                println!(
                    "{:<28} {rate:>9.1}",
                    format!("PS {mode}, {workers} w × {servers} s")
                );
            }
        }
    }
    let (dead, resumed) = recovery(args, &dir)?;
    println!(
        "killed worker (sync, 3 workers, dead_after_ms = {}): declared dead after {dead:.2} s; worker 0 finished its next step {resumed:.2} s after the kill",
        args.dead_after_ms
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
