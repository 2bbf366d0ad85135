//! Configs, in-process jobs (roles as threads over real gRPC) and role processes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ps::{PsError, RoleEnv, WorkerReport};
use runtime::TrainConfig;

/// The bundled digits.
pub fn digits() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/digits")
}

/// The seed MLP (hidden 128, batch 32, momentum, seed 3) on the digits in parameter-server
/// mode with `[ps]` body `ps` and `[train]` extras `train` (e.g. `max_steps = 20`).
pub fn ps_text(out: &Path, ps: &str, train: &str) -> String {
    format!(
        r#"
[model]
name = "seed_mlp"
hidden = 128
classes = 10
[data]
format = "idx"
dir = "{data}"
batch_size = 32
shuffle = true
[parallel]
mode = "parameter_server"
[ps]
{ps}
[train]
{train}
{defaults}
[output]
dir = "{out}"
"#,
        data = digits().display(),
        out = out.display(),
        defaults = train_defaults(train),
    )
}

/// `[train]` defaults of the tests, less the keys `given` sets.
fn train_defaults(given: &str) -> String {
    let defaults = [
        ("epochs", "1"),
        ("optimizer", "\"momentum\""),
        ("learning_rate", "0.02"),
        ("momentum", "0.9"),
        ("seed", "3"),
        ("per_print_times", "1"),
    ];
    defaults
        .iter()
        .filter(|(key, _)| {
            !given
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{key} ")))
        })
        .map(|(key, value)| format!("{key} = {value}\n"))
        .collect()
}

/// [`ps_text`] parsed.
pub fn ps_config(out: &Path, ps: &str, train: &str) -> TrainConfig {
    TrainConfig::parse(&ps_text(out, ps, train), None, &[], Path::new("/")).expect("a valid config")
}

/// A free port on 127.0.0.1.
pub fn scheduler_addr() -> String {
    format!(
        "127.0.0.1:{}",
        ps::launch::free_local_port().expect("a free port")
    )
}

/// The job secret of the test job whose scheduler is at `addr` (one per job, the same for
/// every role of it).
pub fn secret_of(addr: &str) -> ps::auth::JobSecret {
    ps::auth::JobSecret::new(format!("test-job-secret-{addr}")).expect("a valid secret")
}

/// The launcher's variables of `rank` of the test job at `addr` ([`ps::launch::role_env`]
/// with the job's [`secret_of`]).
pub fn role_env(rank: usize, servers: usize, workers: usize, addr: &str) -> Vec<(String, String)> {
    ps::launch::role_env(rank, servers, workers, addr, &secret_of(addr))
}

/// The environment of `rank` of a local job, as a launcher sets it.
pub fn env_of(rank: usize, servers: usize, workers: usize, addr: &str) -> RoleEnv {
    let vars = role_env(rank, servers, workers, addr);
    RoleEnv::from_lookup(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
        .expect("a valid environment")
        .expect("a role")
}

/// Runs every role of `config` as a thread of this process (real gRPC on 127.0.0.1); returns
/// worker 0's report. Fails the test when any role fails.
pub fn run_in_process(config: &TrainConfig, servers: usize, workers: usize) -> WorkerReport {
    run_in_process_with(config, (servers, workers), &scheduler_addr(), |_| {})
}

/// [`run_in_process`] with the scheduler at `addr` and each role's environment edited by `edit`.
pub fn run_in_process_with(
    config: &TrainConfig,
    (servers, workers): (usize, usize),
    addr: &str,
    edit: impl Fn(&mut RoleEnv),
) -> WorkerReport {
    let handles: Vec<_> = (0..1 + servers + workers)
        .map(|rank| {
            let config = config.clone();
            let mut env = env_of(rank, servers, workers, addr);
            edit(&mut env);
            std::thread::spawn(move || -> Result<Option<WorkerReport>, PsError> {
                ps::run_role(&config, &env, None)
            })
        })
        .collect();
    let mut report = None;
    for (rank, h) in handles.into_iter().enumerate() {
        match h.join().expect("the role thread does not panic") {
            Ok(Some(r)) if r.worker_id == 0 => report = Some(r),
            Ok(_) => {}
            Err(e) => panic!("rank {rank} failed: {e}"),
        }
    }
    report.expect("worker 0 reports")
}

/// A role process with its output collected line by line.
pub struct RoleProcess {
    /// The process.
    pub child: Child,
    /// Its standard output and error lines, as they come.
    pub lines: mpsc::Receiver<String>,
    /// Every line received so far.
    pub seen: Vec<String>,
}

impl RoleProcess {
    /// Starts `tessera-ps-role config` with `env`.
    pub fn start(config: &Path, env: &[(String, String)]) -> RoleProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera-ps-role"))
            .arg(config)
            .envs(env.iter().cloned())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the role process starts");
        let (tx, rx) = mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        RoleProcess {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Waits (at most `limit`) for a line containing `text`; whether one came.
    pub fn wait_for_line(&mut self, text: &str, limit: Duration) -> bool {
        if self.seen.iter().any(|l| l.contains(text)) {
            return true;
        }
        let deadline = Instant::now() + limit;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(text);
                    self.seen.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// Waits (at most `limit`) for the process to exit and its output to end; its success.
    pub fn finish(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(line);
        }
        status.is_some_and(|s| s.success())
    }

    /// Every line seen, joined.
    pub fn output(&self) -> String {
        self.seen.join("\n")
    }
}

/// SIGKILLs `child`.
pub fn sigkill(child: &Child) {
    // SAFETY: kill(2) on a process id this test started; no memory is touched.
    let rc = unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    assert_eq!(rc, 0, "SIGKILL delivered");
}

/// The accuracy in a `test accuracy after the last epoch: 93.21%` line.
pub fn final_accuracy(output: &str) -> Option<f64> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("test accuracy after the last epoch: "))
        .filter_map(|v| v.trim_end_matches('%').parse::<f64>().ok())
        .next_back()
}

/// The losses of `epoch: E step: S, loss is L` lines, in order.
pub fn loss_lines(output: &str) -> Vec<f32> {
    output
        .lines()
        .filter_map(|l| l.split_once(", loss is "))
        .filter_map(|(_, v)| v.trim().parse::<f32>().ok())
        .collect()
}
