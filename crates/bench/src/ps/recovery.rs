//! Recovery times of parameter-server jobs run as real processes of the `tessera` binary: a
//! killed worker, and a killed server restarted at once.

use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use runtime::launch_env;

use super::{config_text, PsRequest};
use crate::{BenchError, Pieces, Progress};

/// A sync job of real processes of the `tessera` binary, every output line sent with its
/// process's tag (the rank, or a tag given to a restarted process) and the time it arrived.
struct ProcessJob {
    program: PathBuf,
    config: PathBuf,
    /// Servers and workers.
    shape: (usize, usize),
    /// The scheduler's address.
    addr: String,
    secret: ps::auth::JobSecret,
    children: Vec<Child>,
    /// The processes this bench killed (expected to fail).
    killed: Vec<usize>,
    tx: Option<mpsc::Sender<(usize, Instant, String)>>,
    rx: mpsc::Receiver<(usize, Instant, String)>,
}

impl ProcessJob {
    /// Writes the config `name` of a `servers` × `workers` recovery job in `dir` and starts
    /// every process of the job, tagged with its rank.
    fn launch(
        request: &PsRequest,
        dir: &Path,
        name: &str,
        (servers, workers): (usize, usize),
    ) -> Result<ProcessJob, BenchError> {
        let config = recovery_config(request, dir, name, servers, workers)?;
        let (tx, rx) = mpsc::channel();
        let mut job = ProcessJob {
            program: request.tessera.clone(),
            config,
            shape: (servers, workers),
            addr: format!("127.0.0.1:{}", ps::launch::free_local_port()?),
            secret: ps::auth::JobSecret::generate()?,
            children: Vec::new(),
            killed: Vec::new(),
            tx: Some(tx),
            rx,
        };
        for rank in 0..1 + servers + workers {
            job.start(rank, job.env_of(rank))?;
        }
        Ok(job)
    }

    /// The environment of process `rank` of the job.
    fn env_of(&self, rank: usize) -> Vec<(String, String)> {
        let (servers, workers) = self.shape;
        ps::launch::role_env(rank, servers, workers, &self.addr, &self.secret)
    }

    /// Starts `tessera train CONFIG` with `env`, its lines tagged `tag`; its index.
    fn start(&mut self, tag: usize, env: Vec<(String, String)>) -> Result<usize, BenchError> {
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
            Box::new(child.stdout.take().ok_or(BenchError::NoPipe("stdout"))?),
            Box::new(child.stderr.take().ok_or(BenchError::NoPipe("stderr"))?),
        ];
        let tx = self.tx.clone().ok_or(BenchError::OutputClosed)?;
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
    fn next(&self, want: &dyn Fn(usize, &str) -> bool) -> Result<Instant, BenchError> {
        let limit = Duration::from_secs(120);
        loop {
            let (tag, at, line) = self
                .rx
                .recv_timeout(limit)
                .map_err(|_| BenchError::RecoveryStalled)?;
            if want(tag, &line) {
                return Ok(at);
            }
        }
    }

    /// SIGKILLs process `index` and reaps it.
    fn kill(&mut self, index: usize) -> Result<(), BenchError> {
        let child = &mut self.children[index];
        child.kill()?;
        let _ = child.wait();
        self.killed.push(index);
        Ok(())
    }

    /// Waits for every process; fails naming those (not killed here) that failed.
    fn wait(mut self) -> Result<(), BenchError> {
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
            false => Err(BenchError::RecoveryFailed(failed)),
        }
    }
}

/// A sync recovery job's config file: `servers` × `workers`, snapshots every 5 steps.
fn recovery_config(
    request: &PsRequest,
    dir: &Path,
    name: &str,
    servers: usize,
    workers: usize,
) -> Result<PathBuf, BenchError> {
    let ps = format!(
        "servers = {servers}\nworkers = {workers}\ncheckpoint_every = 5\nheartbeat_ms = 100\ndead_after_ms = {}",
        request.dead_after_ms
    );
    let text = config_text(
        request,
        &dir.join(name),
        "mode = \"parameter_server\"",
        &ps,
        request.steps.max(60),
        1,
    )?;
    std::fs::create_dir_all(dir)?;
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, text)?;
    Ok(config)
}

/// Kills worker 2 of a sync job of 3 workers (real processes) after step 20; returns the
/// seconds until the scheduler declared it dead and until worker 0 finished its next step.
pub(super) fn worker_recovery(request: &PsRequest, dir: &Path) -> Result<(f64, f64), BenchError> {
    let mut job = ProcessJob::launch(request, dir, "rec", (1, 3))?;
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
fn server_recovery(request: &PsRequest, dir: &Path) -> Result<(f64, f64), BenchError> {
    let mut job = ProcessJob::launch(request, dir, "srv", (2, 2))?;
    // Rank 3 is worker 0; rank 2 is server 1.
    job.next(&|rank, line| rank == 3 && line.contains("step: 20,"))?;
    let killed = Instant::now();
    job.kill(2)?;
    let mut env = job.env_of(2);
    for (k, v) in env.iter_mut() {
        if k == launch_env::RESTART_COUNT {
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

/// Seconds measured over trials.
#[derive(Debug, Clone, PartialEq)]
pub struct Spread(pub Vec<f64>);

impl fmt::Display for Spread {
    /// `median 1.20 s (min 1.10, max 1.40, 5 trials)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let median = match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        write!(
            f,
            "median {median:.2} s (min {:.2}, max {:.2}, {} trials)",
            v.first().copied().unwrap_or(f64::NAN),
            v.last().copied().unwrap_or(f64::NAN),
            v.len()
        )
    }
}

/// A piece of the recovery report, in the order it is measured.
#[derive(Debug, Clone, PartialEq)]
pub enum RecoveryLine {
    /// What is measured.
    Header {
        /// `ps.dead_after_ms`.
        dead_after_ms: u64,
        /// Trials asked for of each kind.
        trials: usize,
    },
    /// A killed worker: seconds from the kill until declared dead and until the next step.
    WorkerTrial {
        /// The trial, from 1.
        trial: usize,
        /// Until the scheduler declared it dead.
        dead: f64,
        /// Until the survivors' next completed step.
        next: f64,
    },
    /// A killed server: seconds from the kill until its restart serves and until the next step.
    ServerTrial {
        /// The trial, from 1.
        trial: usize,
        /// Until the restarted server serves again.
        serving: f64,
        /// Until worker 0's next completed step.
        next: f64,
    },
    /// Every trial's figures.
    Summary {
        /// Killed workers declared dead.
        dead: Spread,
        /// The survivors' next step after a killed worker.
        worker_next: Spread,
        /// Restarted servers serving again.
        serving: Spread,
        /// The next step after a killed server.
        server_next: Spread,
    },
}

impl fmt::Display for RecoveryLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoveryLine::Header {
                dead_after_ms,
                trials,
            } => writeln!(
                f,
                "recovery of a sync seed-MLP job (processes of this binary, heartbeat_ms = 100, dead_after_ms = {dead_after_ms}, checkpoint_every = 5), {trials} trial(s) each"
            ),
            RecoveryLine::WorkerTrial { trial, dead, next } => writeln!(
                f,
                "  killed worker, trial {trial}: declared dead {dead:.2} s, next completed step {next:.2} s after the kill"
            ),
            RecoveryLine::ServerTrial {
                trial,
                serving,
                next,
            } => writeln!(
                f,
                "  killed server, trial {trial}: restarted server serving {serving:.2} s, next completed step {next:.2} s after the kill"
            ),
            RecoveryLine::Summary {
                dead,
                worker_next,
                serving,
                server_next,
            } => {
                writeln!(f, "killed worker (1 server, 3 workers): declared dead {dead}")?;
                writeln!(f, "killed worker: survivors' next completed step {worker_next}")?;
                writeln!(
                    f,
                    "killed server (2 servers, 2 workers, restarted at once): serving again {serving}"
                )?;
                writeln!(f, "killed server: next completed step {server_next}")
            }
        }
    }
}

/// Runs `trial` for `0..trials` (at least one), showing each trial's line; every trial's two
/// figures.
fn repeat(
    trials: usize,
    push: &mut dyn FnMut(RecoveryLine) -> Result<(), BenchError>,
    mut trial: impl FnMut(usize) -> Result<((f64, f64), RecoveryLine), BenchError>,
) -> Result<(Vec<f64>, Vec<f64>), BenchError> {
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for n in 0..trials.max(1) {
        let ((a, b), line) = trial(n)?;
        push(line)?;
        first.push(a);
        second.push(b);
    }
    Ok((first, second))
}

/// `trials` killed workers and killed servers.
pub(super) fn run_recovery(
    request: &PsRequest,
    trials: usize,
    dir: &Path,
    progress: &mut dyn Progress,
) -> Result<Pieces<RecoveryLine>, BenchError> {
    let mut lines = Pieces::default();
    let mut push = |line: RecoveryLine| lines.show(progress, line);
    push(RecoveryLine::Header {
        dead_after_ms: request.dead_after_ms,
        trials,
    })?;
    let (dead, worker_next) = repeat(trials, &mut push, |trial| {
        let (dead, next) = worker_recovery(request, &dir.join(format!("w{trial}")))?;
        let line = RecoveryLine::WorkerTrial {
            trial: trial + 1,
            dead,
            next,
        };
        Ok(((dead, next), line))
    })?;
    let (serving, server_next) = repeat(trials, &mut push, |trial| {
        let (serving, next) = server_recovery(request, &dir.join(format!("s{trial}")))?;
        let line = RecoveryLine::ServerTrial {
            trial: trial + 1,
            serving,
            next,
        };
        Ok(((serving, next), line))
    })?;
    push(RecoveryLine::Summary {
        dead: Spread(dead),
        worker_next: Spread(worker_next),
        serving: Spread(serving),
        server_next: Spread(server_next),
    })?;
    Ok(lines)
}
