//! `tessera bench ps`: parameter-server training of the seed MLP (digits, hidden 128, global
//! batch 32), or with `--model gpt` a small GPT, in steps/s — sync and async, 1, 2 and 4 workers, 1 and 2 servers — next to
//! data-parallel all-reduce training on the local backend in the same run, and the time a
//! sync job takes to go on after a worker is killed. `--recovery` measures instead, over
//! `--trials` fresh jobs each, the time to recover from a killed worker (kill → the survivors'
//! next completed step) and from a killed server (kill → the restarted server serving again →
//! the next completed step), with the median and the spread.
//!
//! The roles run as threads of this process over real gRPC on 127.0.0.1 (the recovery runs
//! start real processes of this binary); everything shares this machine's cores.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
    /// Only measure recovery: a killed worker and a killed, restarted server, `--trials` times.
    #[arg(long)]
    recovery: bool,
    /// Fresh jobs per kind of failure with `--recovery`.
    #[arg(long, default_value_t = 5)]
    trials: usize,
    /// The model of the steps/s table: `seed_mlp` or `gpt` (a small GPT on `--text`).
    #[arg(long, default_value = "seed_mlp")]
    model: String,
    /// The text the GPT trains on.
    #[arg(long, default_value = "data/kjv/kjv.txt.gz")]
    text: PathBuf,
}

/// The small GPT of `--model gpt`.
const GPT_DESCRIPTION: &str =
    "GPT (KJV bytes, 2 blocks, 4 heads, width 64, 32 tokens, global batch 16, momentum)";

/// The `[model]` and `[data]` sections of `args.model`.
fn model_sections(args: &PsBenchArgs) -> String {
    match args.model.as_str() {
        "gpt" => format!(
            "[model]\nname = \"gpt\"\nlayers = 2\nheads = 4\nhidden = 64\nseq_len = 32\nffn_hidden = 256\n\
             [data]\nformat = \"text\"\npath = \"{}\"\nbatch_size = 16\nsteps_per_epoch = 100000\n",
            args.text.display()
        ),
        _ => format!(
            "[model]\nname = \"seed_mlp\"\nhidden = 128\nclasses = 10\n\
             [data]\nformat = \"idx\"\ndir = \"{}\"\nbatch_size = 32\nshuffle = true\n",
            args.data.display()
        ),
    }
}

/// The config of `args.model`: `[parallel]` body `parallel`, `[ps]` body `ps` (empty: no
/// section).
fn config_text(
    args: &PsBenchArgs,
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
        "{}[parallel]\n{parallel}\n{ps}\
         [train]\nepochs = 100\nmax_steps = {steps}\noptimizer = \"momentum\"\nlearning_rate = 0.02\n\
         momentum = 0.9\nseed = 3\neval = false\nper_print_times = {print}\n\
         [output]\ndir = \"{}\"\n",
        model_sections(args),
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
        args,
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
        args,
        &dir.join("ps"),
        "mode = \"parameter_server\"",
        &ps,
        args.steps,
        0,
    );
    let config = parse(&text)?;
    let report = run_threads(&config, servers, workers)?;
    Ok(report.steps_run as f64 / report.step_seconds.max(1e-9))
}

/// Runs a parameter-server job of `config` with every role a thread of this process (real
/// gRPC over loopback); worker 0's report.
pub(crate) fn run_threads(
    config: &TrainConfig,
    servers: usize,
    workers: usize,
) -> anyhow::Result<ps::WorkerReport> {
    let addr = format!("127.0.0.1:{}", ps::launch::free_local_port()?);
    let secret = ps::auth::JobSecret::generate()?;
    let handles: Vec<_> = (0..1 + servers + workers)
        .map(|rank| {
            let config = config.clone();
            let vars = ps::launch::role_env(rank, servers, workers, &addr, &secret);
            std::thread::spawn(move || -> anyhow::Result<Option<ps::WorkerReport>> {
                let env = ps::RoleEnv::from_lookup(|n| {
                    vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
                })?
                .ok_or_else(|| anyhow::anyhow!("no role"))?;
                Ok(ps::run_role(&config, &env, None)?)
            })
        })
        .collect();
    let mut report = None;
    for h in handles {
        let r = h
            .join()
            .map_err(|_| anyhow::anyhow!("a role thread panicked"))??;
        if let Some(r) = r.filter(|r| r.worker_id == 0) {
            report = Some(r);
        }
    }
    report.ok_or_else(|| anyhow::anyhow!("worker 0 did not report"))
}

/// A job of real processes of this binary, every output line sent with its process's tag
/// (the rank, or a tag given to a restarted process) and the time it arrived.
struct ProcessJob {
    program: PathBuf,
    config: PathBuf,
    children: Vec<Child>,
    /// The processes this bench killed (expected to fail).
    killed: Vec<usize>,
    tx: Option<mpsc::Sender<(usize, Instant, String)>>,
    rx: mpsc::Receiver<(usize, Instant, String)>,
}

impl ProcessJob {
    fn new(config: PathBuf) -> anyhow::Result<ProcessJob> {
        let (tx, rx) = mpsc::channel();
        Ok(ProcessJob {
            program: std::env::current_exe()?,
            config,
            children: Vec::new(),
            killed: Vec::new(),
            tx: Some(tx),
            rx,
        })
    }

    /// Starts `tessera train CONFIG` with `env`, its lines tagged `tag`; its index.
    fn start(&mut self, tag: usize, env: Vec<(String, String)>) -> anyhow::Result<usize> {
        let mut command = Command::new(&self.program);
        command
            .arg("train")
            .arg(&self.config)
            .envs(env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // The roles end with the benchmark, however it ends.
        ps::launch::die_with_parent(&mut command);
        let mut child = command.spawn()?;
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
        let tx = self
            .tx
            .clone()
            .ok_or_else(|| anyhow::anyhow!("the job's output is closed"))?;
        for stream in streams {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send((tag, Instant::now(), line)).is_err() {
                        break;
                    }
                }
            });
        }
        self.children.push(child);
        Ok(self.children.len() - 1)
    }

    /// The arrival of the next line (in arrival order) that `want` accepts.
    fn next(&self, want: &dyn Fn(usize, &str) -> bool) -> anyhow::Result<Instant> {
        let limit = Duration::from_secs(120);
        loop {
            let (tag, at, line) = self
                .rx
                .recv_timeout(limit)
                .map_err(|_| anyhow::anyhow!("the recovery run stalled"))?;
            if want(tag, &line) {
                return Ok(at);
            }
        }
    }

    /// SIGKILLs process `index` and reaps it.
    fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        let child = &mut self.children[index];
        child.kill()?;
        let _ = child.wait();
        self.killed.push(index);
        Ok(())
    }

    /// Waits for every process; fails naming those (not killed here) that failed.
    fn wait(mut self) -> anyhow::Result<()> {
        self.tx = None;
        let mut failed = Vec::new();
        for (i, child) in self.children.iter_mut().enumerate() {
            let status = child.wait()?;
            if !status.success() && !self.killed.contains(&i) {
                failed.push(format!("process {i}: {status}"));
            }
        }
        match failed.is_empty() {
            true => Ok(()),
            false => Err(anyhow::anyhow!(
                "the recovery run failed: {}",
                failed.join("; ")
            )),
        }
    }
}

/// A sync recovery job's config file: `servers` × `workers`, snapshots every 5 steps.
fn recovery_config(
    args: &PsBenchArgs,
    dir: &Path,
    name: &str,
    servers: usize,
    workers: usize,
) -> anyhow::Result<PathBuf> {
    let ps = format!(
        "servers = {servers}\nworkers = {workers}\ncheckpoint_every = 5\nheartbeat_ms = 100\ndead_after_ms = {}",
        args.dead_after_ms
    );
    let text = config_text(
        args,
        &dir.join(name),
        "mode = \"parameter_server\"",
        &ps,
        args.steps.max(60),
        1,
    );
    std::fs::create_dir_all(dir)?;
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, text)?;
    Ok(config)
}

/// Kills worker 2 of a sync job of 3 workers (real processes of this binary) after step 20;
/// returns the seconds until the scheduler declared it dead and until worker 0 finished its
/// next step.
fn recovery(args: &PsBenchArgs, dir: &Path) -> anyhow::Result<(f64, f64)> {
    let mut job = ProcessJob::new(recovery_config(args, dir, "rec", 1, 3)?)?;
    let addr = format!("127.0.0.1:{}", ps::launch::free_local_port()?);
    let secret = ps::auth::JobSecret::generate()?;
    for rank in 0..5 {
        job.start(rank, ps::launch::role_env(rank, 1, 3, &addr, &secret))?;
    }
    // Rank 2 is worker 0 (rank 1 the server); rank 4 is worker 2.
    job.next(&|rank, line| rank == 2 && line.contains("step: 20,"))?;
    let killed = Instant::now();
    job.kill(4)?;
    let dead = job.next(&|rank, line| rank == 0 && line.contains("worker 2 declared dead"))?;
    let resumed = job.next(&|rank, line| rank == 2 && line.contains(", loss is "))?;
    job.wait()?;
    Ok((
        dead.duration_since(killed).as_secs_f64(),
        resumed.duration_since(killed).as_secs_f64(),
    ))
}

/// SIGKILLs server 1 of a sync job of 2 servers and 2 workers after step 20 and restarts it
/// at once (`TESSERA_RESTART_COUNT=1`, as `tessera launch --restarts 1` does); returns the
/// seconds from the kill until the restarted server serves again and until worker 0 finished
/// its next step.
fn server_recovery(args: &PsBenchArgs, dir: &Path) -> anyhow::Result<(f64, f64)> {
    let mut job = ProcessJob::new(recovery_config(args, dir, "srv", 2, 2)?)?;
    let addr = format!("127.0.0.1:{}", ps::launch::free_local_port()?);
    let secret = ps::auth::JobSecret::generate()?;
    for rank in 0..5 {
        job.start(rank, ps::launch::role_env(rank, 2, 2, &addr, &secret))?;
    }
    // Rank 3 is worker 0; rank 2 is server 1.
    job.next(&|rank, line| rank == 3 && line.contains("step: 20,"))?;
    let killed = Instant::now();
    job.kill(2)?;
    let mut env = ps::launch::role_env(2, 2, 2, &addr, &secret);
    for (k, v) in env.iter_mut() {
        if k == "TESSERA_RESTART_COUNT" {
            *v = "1".to_string();
        }
    }
    const RESTARTED: usize = 5;
    job.start(RESTARTED, env)?;
    let serving = job.next(&|tag, line| tag == RESTARTED && line.contains("serving at"))?;
    let resumed = job.next(&|tag, line| tag == 3 && line.contains(", loss is "))?;
    job.wait()?;
    Ok((
        serving.duration_since(killed).as_secs_f64(),
        resumed.duration_since(killed).as_secs_f64(),
    ))
}

/// The median, the smallest and the largest of `values`, formatted in seconds.
fn spread(values: &[f64]) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let median = match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    };
    format!(
        "median {median:.2} s (min {:.2}, max {:.2}, {} trials)",
        v.first().copied().unwrap_or(f64::NAN),
        v.last().copied().unwrap_or(f64::NAN),
        v.len()
    )
}

/// `tessera bench ps --recovery`: `--trials` killed workers and killed servers.
fn run_recovery(args: &PsBenchArgs, dir: &Path) -> anyhow::Result<()> {
    println!(
        "recovery of a sync seed-MLP job (processes of this binary, heartbeat_ms = 100, dead_after_ms = {}, checkpoint_every = 5), {} trial(s) each",
        args.dead_after_ms, args.trials
    );
    let (mut dead, mut worker_next) = (Vec::new(), Vec::new());
    for trial in 0..args.trials.max(1) {
        let (d, n) = recovery(args, &dir.join(format!("w{trial}")))?;
        println!("  killed worker, trial {}: declared dead {d:.2} s, next completed step {n:.2} s after the kill", trial + 1);
        dead.push(d);
        worker_next.push(n);
    }
    let (mut serving, mut server_next) = (Vec::new(), Vec::new());
    for trial in 0..args.trials.max(1) {
        let (s, n) = server_recovery(args, &dir.join(format!("s{trial}")))?;
        println!("  killed server, trial {}: restarted server serving {s:.2} s, next completed step {n:.2} s after the kill", trial + 1);
        serving.push(s);
        server_next.push(n);
    }
    println!(
        "killed worker (1 server, 3 workers): declared dead {}",
        spread(&dead)
    );
    println!(
        "killed worker: survivors' next completed step {}",
        spread(&worker_next)
    );
    println!(
        "killed server (2 servers, 2 workers, restarted at once): serving again {}",
        spread(&serving)
    );
    println!(
        "killed server: next completed step {}",
        spread(&server_next)
    );
    Ok(())
}

/// Runs `tessera bench ps`.
pub fn run(args: &PsBenchArgs) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("tessera-bench-ps-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    if args.recovery {
        let outcome = run_recovery(args, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        return outcome;
    }
    let model = match args.model.as_str() {
        "gpt" => GPT_DESCRIPTION,
        "seed_mlp" => "seed MLP (digits, hidden 128, global batch 32, momentum)",
        other => anyhow::bail!("--model {other}: expected seed_mlp or gpt"),
    };
    println!(
        "{model}, {} steps per run; steps/s of worker 0's loop (PS) or the mean step (DP)",
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
