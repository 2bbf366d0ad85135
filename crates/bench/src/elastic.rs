//! Elastic collective training measured on real processes: two nodes of one rank each joined
//! over loopback by `tessera launch` (msrun's model), the GPT in data parallel 2.
//!
//! - **Recovery**: rank 1 kills itself (`TESSERA_FAULT`) in step `kill_step`; every line of
//!   node 0's launcher is timed as it arrives, giving the detection (the kill → the launcher
//!   starting the job again), the rebuild (→ the ranks resumed from the in-memory snapshot)
//!   and the first step after it (→ its loss line), and the total.
//! - **Copy cost**: the same run with `train.elastic` (the default interval) and without, pair
//!   by pair, each run's steps/s as rank 0 reports it over its whole loop (snapshots included).

use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::toml_path;
use crate::timing::Summary;
use crate::{BenchError, Progress};

/// What to measure.
#[derive(Debug, Clone)]
pub struct ElasticRequest {
    /// The `tessera` binary (built with the `mpi` feature).
    pub tessera: PathBuf,
    /// The GPT configuration (`examples/gpt_kjv.toml`).
    pub config: PathBuf,
    /// Trials of each measurement.
    pub trials: usize,
    /// Steps of each run.
    pub steps: u64,
    /// The step whose start rank 1 dies at.
    pub kill_step: u64,
    /// `train.elastic_interval` (`None`: its default).
    pub interval: Option<u64>,
}

/// The times of one recovery.
#[derive(Debug, Clone, Copy)]
struct Recovery {
    detect: Duration,
    rebuild: Duration,
    first_step: Duration,
}

/// The measured figures.
#[derive(Debug, Clone)]
pub struct ElasticReport {
    /// Kill → the launcher starting the job again.
    pub detect: Summary,
    /// → the ranks resumed from memory.
    pub rebuild: Summary,
    /// → the first step after the resume completed.
    pub first_step: Summary,
    /// Kill → the first completed step.
    pub total: Summary,
    /// Steps/s without `train.elastic`, by trial.
    pub plain: Vec<f64>,
    /// Steps/s with it, by trial.
    pub elastic: Vec<f64>,
    /// The snapshot interval of the runs.
    pub interval: u64,
}

/// Lines of a node-0 launcher, each with the time it arrived.
struct Lines {
    rx: mpsc::Receiver<(Instant, String)>,
    /// The last [`Lines::KEPT`] lines read, for the error when the output ends.
    last: std::collections::VecDeque<String>,
}

impl Lines {
    /// Lines kept for an error.
    const KEPT: usize = 6;

    /// Lines arriving on `rx`.
    fn new(rx: mpsc::Receiver<(Instant, String)>) -> Lines {
        Lines {
            rx,
            last: std::collections::VecDeque::new(),
        }
    }

    /// The first line containing `what`, waiting at most `patience` for each line: the
    /// launcher's output ending first is [`BenchError::JobEnded`] with its last lines (a
    /// job that cannot start, e.g. a `tessera` built without MPI, says why there), a line not
    /// arriving in time [`BenchError::RecoveryStalled`].
    fn until(&mut self, what: &str, patience: Duration) -> Result<(Instant, String), BenchError> {
        loop {
            match self.rx.recv_timeout(patience) {
                Ok((at, line)) if line.contains(what) => return Ok((at, line)),
                Ok((_, line)) => {
                    if self.last.len() == Self::KEPT {
                        self.last.pop_front();
                    }
                    self.last.push_back(line);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => return Err(BenchError::RecoveryStalled),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(BenchError::JobEnded {
                        waiting_for: what.to_string(),
                        last_lines: self.last.drain(..).collect(),
                    })
                }
            }
        }
    }
}

/// How long a job may print nothing awaited.
const PATIENCE: Duration = Duration::from_secs(120);

/// One two-node job: both launchers, node 0's lines.
struct Job {
    children: Vec<Child>,
    lines: Lines,
}

impl Job {
    fn start(
        request: &ElasticRequest,
        elastic: bool,
        fault: bool,
        dir: &std::path::Path,
    ) -> Result<Job, BenchError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port()
            .to_string();
        let (tx, rx) = mpsc::channel();
        let mut children = Vec::new();
        for node in [1usize, 0] {
            let mut c = Command::new(&request.tessera);
            c.args(["launch", "--worker_num", "2", "--local_worker_num", "1"])
                .args(["--master_addr", "127.0.0.1", "--master_port", &port])
                .args(["--node_rank", &node.to_string(), "--restarts", "1"])
                .arg("--log_dir")
                .arg(dir.join(format!("logs{node}")))
                .arg("--")
                .arg(&request.tessera)
                .arg("train")
                .arg(&request.config)
                .args(["--devices", "2"]);
            let mut sets = vec![
                "parallel.data_parallel=2".to_string(),
                "parallel.model_parallel=1".to_string(),
                "train.eval=false".to_string(),
                "output.save_checkpoint=false".to_string(),
                format!("train.max_steps={}", request.steps),
                format!("output.dir={}", toml_path("output.dir", &dir.join("out"))?),
            ];
            if elastic {
                sets.push("train.elastic=true".to_string());
                if let Some(n) = request.interval {
                    sets.push(format!("train.elastic_interval={n}"));
                }
            }
            for set in sets {
                c.args(["--set", &set]);
            }
            if fault && node == 1 {
                c.env(
                    "TESSERA_FAULT",
                    format!("rank=1,step={},at=forward", request.kill_step),
                );
            }
            c.stdin(Stdio::null());
            if node == 0 {
                c.stdout(Stdio::piped()).stderr(Stdio::piped());
            } else {
                c.stdout(Stdio::null()).stderr(Stdio::null());
            }
            ps::launch::die_with_parent(&mut c);
            let mut child = c.spawn()?;
            if node == 0 {
                let out = child.stdout.take().ok_or(BenchError::NoPipe("stdout"))?;
                let err = child.stderr.take().ok_or(BenchError::NoPipe("stderr"))?;
                for stream in [
                    Box::new(out) as Box<dyn std::io::Read + Send>,
                    Box::new(err),
                ] {
                    let tx = tx.clone();
                    std::thread::spawn(move || {
                        for line in BufReader::new(stream).lines().map_while(Result::ok) {
                            let _ = tx.send((Instant::now(), line));
                        }
                    });
                }
            }
            children.push(child);
        }
        Ok(Job {
            children,
            lines: Lines::new(rx),
        })
    }

    /// Waits for both launchers; an error naming a failed one.
    fn finish(mut self) -> Result<(), BenchError> {
        let mut failed = Vec::new();
        for (i, child) in self.children.iter_mut().enumerate() {
            let status = child.wait()?;
            if !status.success() {
                failed.push(format!("node launcher {i}: {status}"));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(BenchError::RecoveryFailed(failed))
        }
    }
}

/// `(steps/s)` from rank 0's `trained N steps on D device(s) in X s (Y steps/s)`.
fn steps_per_s(line: &str) -> Option<f64> {
    let open = line.rfind('(')?;
    line[open + 1..].split_whitespace().next()?.parse().ok()
}

/// Runs the measurements, showing each trial as it ends.
pub fn elastic(
    request: &ElasticRequest,
    progress: &mut dyn Progress,
) -> Result<ElasticReport, BenchError> {
    let dir = tempfile::tempdir()?;
    let mut recoveries = Vec::new();
    for trial in 0..request.trials {
        crate::go_on(progress)?;
        progress.note(&format_args!(
            "recovery trial {} of {}",
            trial + 1,
            request.trials
        ));
        let mut job = Job::start(request, true, true, &dir.path().join(format!("r{trial}")))?;
        let (killed, _) = job
            .lines
            .until("TESSERA_FAULT: rank 1 kills itself", PATIENCE)?;
        let (detected, _) = job.lines.until("starting the job again", PATIENCE)?;
        let (resumed, _) = job
            .lines
            .until("elastic: resuming from the in-memory snapshot", PATIENCE)?;
        let (stepped, _) = job.lines.until("[worker 0] epoch:", PATIENCE)?;
        job.finish()?;
        recoveries.push(Recovery {
            detect: detected - killed,
            rebuild: resumed - detected,
            first_step: stepped - resumed,
        });
    }
    let (mut plain, mut elastic) = (Vec::new(), Vec::new());
    for trial in 0..request.trials {
        for (on, into) in [(false, &mut plain), (true, &mut elastic)] {
            crate::go_on(progress)?;
            progress.note(&format_args!(
                "copy-cost trial {} of {} (elastic {on})",
                trial + 1,
                request.trials
            ));
            let mut job = Job::start(
                request,
                on,
                false,
                &dir.path().join(format!("c{trial}{on}")),
            )?;
            let (_, line) = job.lines.until("[worker 0] trained ", PATIENCE)?;
            job.finish()?;
            into.push(steps_per_s(&line).ok_or(BenchError::NoWorkerReport)?);
        }
    }
    let of =
        |f: fn(&Recovery) -> Duration| Summary::of(&recoveries.iter().map(f).collect::<Vec<_>>());
    let report = ElasticReport {
        detect: of(|r| r.detect),
        rebuild: of(|r| r.rebuild),
        first_step: of(|r| r.first_step),
        total: of(|r| r.detect + r.rebuild + r.first_step),
        plain,
        elastic,
        interval: request
            .interval
            .unwrap_or(runtime::elastic::DEFAULT_INTERVAL),
    };
    progress.piece(&report);
    Ok(report)
}

/// The median, minimum and maximum of `values`.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

impl fmt::Display for ElasticReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |s: &Summary| {
            format!(
                "{:.0} ms (min {:.0}, max {:.0})",
                crate::timing::ms(s.median),
                crate::timing::ms(s.min),
                crate::timing::ms(s.max)
            )
        };
        writeln!(f, "elastic recovery, 2 nodes × 1 rank on loopback, GPT data parallel 2 (median of {} trials):", self.plain.len())?;
        writeln!(
            f,
            "  detection   kill → launcher restarts the job   {}",
            ms(&self.detect)
        )?;
        writeln!(
            f,
            "  rebuild     → ranks resumed from memory        {}",
            ms(&self.rebuild)
        )?;
        writeln!(
            f,
            "  first step  → first step after the resume      {}",
            ms(&self.first_step)
        )?;
        writeln!(
            f,
            "  total       kill → next completed step         {}",
            ms(&self.total)
        )?;
        let (p, p0, p1) = spread(&self.plain);
        let (e, e0, e1) = spread(&self.elastic);
        let ratios: Vec<f64> = self
            .elastic
            .iter()
            .zip(&self.plain)
            .map(|(e, p)| e / p)
            .collect();
        let (r, r0, r1) = spread(&ratios);
        writeln!(f, "copy cost at train.elastic_interval = {} (steps/s over the whole loop, pairs alternated):", self.interval)?;
        writeln!(
            f,
            "  without elastic  {p:.2} steps/s (min {p0:.2}, max {p1:.2})"
        )?;
        writeln!(
            f,
            "  with elastic     {e:.2} steps/s (min {e0:.2}, max {e1:.2})"
        )?;
        writeln!(
            f,
            "  ratio            {r:.3} (min {r0:.3}, max {r1:.3}); cost {:.1} %",
            (1.0 - r) * 100.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A launcher whose output ends before the awaited line is reported at once with its last
    /// lines (it was reported as stalled, after two minutes, without them); one that is still
    /// running but silent is stalled.
    #[test]
    fn a_job_that_ends_early_is_reported_with_its_last_lines() {
        let (tx, rx) = mpsc::channel();
        let mut lines = Lines::new(rx);
        for i in 0..8 {
            tx.send((Instant::now(), format!("line {i}"))).unwrap();
        }
        tx.send((Instant::now(), "built without MPI".into()))
            .unwrap();
        drop(tx);
        let started = Instant::now();
        let ended = lines.until("[worker 0] trained ", PATIENCE).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        match &ended {
            BenchError::JobEnded {
                waiting_for,
                last_lines,
            } => {
                assert_eq!(waiting_for, "[worker 0] trained ");
                assert_eq!(last_lines.len(), Lines::KEPT);
                assert_eq!(last_lines.last().unwrap(), "built without MPI");
            }
            other => panic!("{other:?}"),
        }
        assert!(ended.to_string().contains("built without MPI"), "{ended}");

        let (tx, rx) = mpsc::channel();
        let mut lines = Lines::new(rx);
        tx.send((Instant::now(), "a step".into())).unwrap();
        let stalled = lines.until("never", Duration::from_millis(50));
        assert!(matches!(stalled, Err(BenchError::RecoveryStalled)));
        drop(tx);
    }
}
