//! Parameter-server training under `tessera launch` (issue 19's kill tests): a server or a
//! worker SIGKILLed mid-run is restarted by `--restarts 1`, rejoins, and the job finishes; a
//! restarted server reports the steps it replayed and lost. The processes are found by the
//! environment the launcher gave them (their role and this job's scheduler address).

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::util::{repo_root, s, step_losses, tessera_command, wait_or_kill, Scratch};

/// Longest the job may take before the test calls it hung (a guard, not a timing check).
const HANG_GUARD: Duration = Duration::from_secs(180);

/// A free port on 127.0.0.1 for this job's scheduler.
fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
}

/// Starts `tessera launch --nproc 2 --ps-servers 1 --restarts R` of the seed parameter-server
/// run (sync, 2 workers, 1 server, snapshots every 5 steps).
fn start_job(dir: &Path, addr: &str, restarts: &str) -> Child {
    let out = dir.join("run");
    let sets = [
        "ps.servers=1".to_string(),
        "ps.workers=2".to_string(),
        "ps.checkpoint_every=5".to_string(),
        "ps.heartbeat_ms=100".to_string(),
        "ps.dead_after_ms=1500".to_string(),
        "train.epochs=3".to_string(),
        format!("output.dir=\"{}\"", s(&out)),
    ];
    let mut command = tessera_command();
    command.args([
        "launch",
        "--nproc",
        "2",
        "--ps-servers",
        "1",
        "--restarts",
        restarts,
        "--scheduler-addr",
        addr,
        "--log-dir",
        s(&dir.join("logs")),
        "--",
        s(Path::new(env!("CARGO_BIN_EXE_tessera"))),
        "train",
        "examples/seed_parameter_server.toml",
    ]);
    for set in &sets {
        command.args(["--set", set]);
    }
    command
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tessera launch")
}

/// The log of `role` `id` in the job's log directory (empty until written).
fn log(dir: &Path, role: &str, id: usize) -> String {
    std::fs::read_to_string(dir.join(format!("logs/{role}_{id}.log"))).unwrap_or_default()
}

/// Waits until `role` `id`'s log contains `text`.
fn wait_for(dir: &Path, role: &str, id: usize, text: &str) {
    let start = Instant::now();
    while !log(dir, role, id).contains(text) {
        assert!(
            start.elapsed() < HANG_GUARD,
            "{role} {id} never logged {text:?}:\n{}",
            log(dir, role, id)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid of the running process of `role` with `id_var=id` in the job of `addr`, from the
/// environment the launcher gave it.
fn find_process(addr: &str, role: &str, id_var: &str, id: usize) -> Option<i32> {
    let wanted = [
        format!("TESSERA_ROLE={role}"),
        format!("TESSERA_SCHEDULER_ADDR={addr}"),
        format!("{id_var}={id}"),
    ];
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let vars: Vec<String> = environ
            .split(|&b| b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        if wanted.iter().all(|w| vars.contains(w)) {
            return Some(pid);
        }
    }
    None
}

/// Waits for the launcher to end; kills it and fails the test if it hangs.
fn finish(child: Child, dir: &Path) -> std::process::Output {
    wait_or_kill(child, HANG_GUARD).unwrap_or_else(|| {
        panic!(
            "the job did not end within {HANG_GUARD:?}\nscheduler:\n{}\nworker 0:\n{}",
            log(dir, "scheduler", 0),
            log(dir, "worker", 0)
        )
    })
}

/// SIGKILLs `role` `id` of the job once worker 0 has logged step 20, and returns the job's
/// output after the launcher restarted it and the job ended.
fn kill_and_finish(dir: &Path, role: &str, id_var: &str, id: usize) -> std::process::Output {
    kill_and_finish_with(dir, role, id_var, id, "1")
}

/// [`kill_and_finish`] with `--restarts restarts`.
fn kill_and_finish_with(
    dir: &Path,
    role: &str,
    id_var: &str,
    id: usize,
    restarts: &str,
) -> std::process::Output {
    let addr = free_addr();
    let job = start_job(dir, &addr, restarts);
    wait_for(dir, "worker", 0, "step: 20,");
    let pid = find_process(&addr, role, id_var, id).expect("the process to kill");
    // SAFETY: kill(2) on a process of this test's job.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    finish(job, dir)
}

/// The test accuracy worker 0 reported after the last epoch (`test accuracy after the last
/// epoch: 93.4%`), as a fraction.
fn final_accuracy(dir: &Path) -> f64 {
    let text = log(dir, "worker", 0);
    text.lines()
        .filter_map(|l| l.split_once("test accuracy after the last epoch: "))
        .filter_map(|(_, v)| v.trim().trim_end_matches('%').parse::<f64>().ok())
        .next_back()
        .unwrap_or_else(|| panic!("an accuracy line:\n{text}"))
        / 100.0
}

#[test]
fn a_killed_server_restarts_from_its_snapshot_and_the_job_finishes() {
    let dir = Scratch::new("ps-launch-server");
    let out = kill_and_finish(&dir.0, "server", "TESSERA_SERVER_ID", 0);
    let console = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{console}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = log(&dir.0, "server", 0);
    assert!(
        server.contains("recovered: restarted from the snapshot"),
        "{server}"
    );
    assert!(
        server.contains("lost"),
        "the lost steps are reported:\n{server}"
    );
    assert!(
        final_accuracy(&dir.0) >= 0.9,
        "{}",
        log(&dir.0, "worker", 0)
    );
}

#[test]
fn a_killed_worker_restarts_and_the_job_keeps_its_accuracy() {
    let dir = Scratch::new("ps-launch-worker");
    let out = kill_and_finish(&dir.0, "worker", "TESSERA_WORKER_ID", 1);
    let console = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{console}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        final_accuracy(&dir.0) >= 0.9,
        "{}",
        log(&dir.0, "worker", 0)
    );
}

#[test]
fn a_worker_lost_with_no_restarts_left_is_reported_and_the_job_exits_0() {
    let dir = Scratch::new("ps-launch-lost-worker");
    let out = kill_and_finish_with(&dir.0, "worker", "TESSERA_WORKER_ID", 1, "0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "[launch] worker 1 (rank 3) (signal: 9 (SIGKILL)) was lost; the job finished on 1 worker(s)"
        ),
        "{stderr}"
    );
    let worker0 = log(&dir.0, "worker", 0);
    assert!(worker0.contains("worker 1 was lost at step "), "{worker0}");
    assert!(final_accuracy(&dir.0) >= 0.9, "{worker0}");
}

// ---- `tessera train` of a parameter-server config without a launcher: it starts every role
// as its own child and must take them with it, and end as the faults it survives allow ----

/// Starts `tessera train examples/seed_parameter_server.toml` (2 servers, 2 workers, so rank
/// 0 is the scheduler, 1..2 the servers, 3..4 the workers) with `sets` and its output in `dir`
/// (`run/`, `stdout`, `stderr`); returns it once its five roles run and worker 0 has written
/// `steps` step lines to the metrics log.
fn start_ps_train(dir: &Path, sets: &[&str], steps: usize) -> (Child, Vec<i32>) {
    let mut command = tessera_command();
    command.args(["train", "examples/seed_parameter_server.toml"]);
    let out = format!("output.dir=\"{}\"", s(&dir.join("run")));
    for set in [
        "ps.heartbeat_ms=100",
        "ps.dead_after_ms=1500",
        "train.epochs=50",
        out.as_str(),
    ]
    .iter()
    .chain(sets)
    {
        command.args(["--set", set]);
    }
    let child = command
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .expect("starting tessera train");
    let start = Instant::now();
    let roles = loop {
        let roles = crate::util::children_of(child.id() as i32);
        let lines = std::fs::read_to_string(dir.join("run/metrics.jsonl"))
            .map(|t| t.lines().filter(|l| l.contains("\"loss\"")).count())
            .unwrap_or(0);
        if roles.len() == 5 && lines >= steps {
            break roles;
        }
        assert!(
            start.elapsed() < HANG_GUARD,
            "the job never got going: {} roles, {lines} steps:\n{}",
            roles.len(),
            read_or_empty(&dir.join("stderr"))
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    (child, roles)
}

fn read_or_empty(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The role process among `roles` whose environment holds `entry` (`TESSERA_WORKER_ID=1`).
fn role_with(roles: &[i32], entry: &str) -> i32 {
    *roles
        .iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .unwrap_or_default()
                .split(|&b| b == 0)
                .any(|v| v == entry.as_bytes())
        })
        .unwrap_or_else(|| panic!("no role with {entry}"))
}

#[test]
fn signals_to_a_ps_train_stop_every_role_and_the_writes() {
    for (signal, name) in [
        (libc::SIGTERM, "TERM"),
        (libc::SIGINT, "INT"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGKILL, "KILL"),
    ] {
        let dir = Scratch::new(&format!("ps-train-sig{name}"));
        let (child, roles) = start_ps_train(&dir.0, &[], 3);
        // SAFETY: kill(2) on the process this test started.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let out = finish(child, &dir.0);
        crate::util::wait_until_gone(&roles, HANG_GUARD, &format!("SIG{name}"));
        if signal == libc::SIGKILL {
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&out.status),
                Some(signal)
            );
        } else {
            assert_eq!(out.status.code(), Some(128 + signal), "SIG{name}");
            let stderr = read_or_empty(&dir.0.join("stderr"));
            assert!(stderr.contains("interrupted by signal"), "{stderr}");
        }
        // Every role is gone, so nothing writes into output.dir any more, and the job did not
        // run to its end (50 epochs).
        let written = crate::util::files_with_sizes(&dir.0.join("run"));
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(crate::util::files_with_sizes(&dir.0.join("run")), written);
        let steps = step_losses(&dir.0.join("run/metrics.jsonl")).len();
        assert!(
            steps < 50 * 46,
            "SIG{name}: the job ran to its end ({steps} steps)"
        );
    }
}

#[test]
fn a_killed_worker_is_reported_and_the_job_exits_0() {
    let dir = Scratch::new("ps-train-lost-worker");
    let (child, roles) = start_ps_train(&dir.0, &["train.epochs=2"], 20);
    let worker = role_with(&roles, "TESSERA_WORKER_ID=1");
    // SAFETY: kill(2) on a role of this test's job.
    assert_eq!(unsafe { libc::kill(worker, libc::SIGKILL) }, 0);
    let out = finish(child, &dir.0);
    let (stdout, stderr) = (
        read_or_empty(&dir.0.join("stdout")),
        read_or_empty(&dir.0.join("stderr")),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "worker 1 (rank 4) (signal: 9 (SIGKILL)) was lost; the job finished on 1 worker(s)"
        ),
        "{stderr}"
    );
    assert!(
        stdout.contains("trained 92 steps on 1 worker(s)")
            && stdout.contains("worker 1 was lost at step "),
        "{stdout}"
    );
}

#[test]
fn a_job_that_loses_every_worker_or_a_server_fails_naming_it() {
    for (victims, cause) in [
        (
            &["TESSERA_WORKER_ID=0", "TESSERA_WORKER_ID=1"][..],
            "every worker was lost: worker 0 (rank 3) (signal: 9 (SIGKILL)), worker 1 (rank 4) (signal: 9 (SIGKILL))",
        ),
        (
            &["TESSERA_SERVER_ID=1"][..],
            "server 1 (rank 2) (signal: 9 (SIGKILL)) was lost; the job cannot go on without it",
        ),
        (
            &["TESSERA_ROLE=scheduler"][..],
            "scheduler 0 (rank 0) (signal: 9 (SIGKILL)) was lost; the job cannot go on without it",
        ),
    ] {
        let dir = Scratch::new("ps-train-fatal");
        let (child, roles) = start_ps_train(&dir.0, &[], 3);
        for entry in victims {
            let pid = role_with(&roles, entry);
            // SAFETY: kill(2) on a role of this test's job.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        }
        let out = finish(child, &dir.0);
        let stderr = read_or_empty(&dir.0.join("stderr"));
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(cause), "{stderr}");
        crate::util::wait_until_gone(&roles, HANG_GUARD, "a fatal fault");
    }
}

/// A server started on its own (by a launcher on another machine, in a pod) with an
/// `output.dir` it cannot write its snapshots into is refused at its start, naming the key,
/// rather than failing at its first snapshot mid-run (or, as here, waiting for a scheduler
/// first).
#[test]
fn a_server_role_refuses_an_unusable_output_dir_at_its_start() {
    let dir = Scratch::new("ps-server-output");
    let file = dir.0.join("afile");
    std::fs::write(&file, "x").unwrap();
    let run = file.join("run");
    let child = tessera_command()
        .args(["train", "examples/seed_parameter_server.toml"])
        .args(["--set", "ps.servers=1", "--set", "ps.workers=1"])
        .args(["--set", &format!("output.dir=\"{}\"", s(&run))])
        .env("TESSERA_ROLE", "server")
        .env("TESSERA_RANK", "1")
        .env("TESSERA_WORLD_SIZE", "3")
        .env("TESSERA_SERVER_ID", "0")
        .env("TESSERA_NUM_SERVERS", "1")
        .env("TESSERA_NUM_WORKERS", "1")
        .env("TESSERA_SCHEDULER_ADDR", free_addr())
        .env("TESSERA_JOB_SECRET", "s".repeat(32))
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_or_kill(child, HANG_GUARD).expect("the server hung");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("output.dir")
            && err.contains(&format!("{} is a file, not a directory", s(&file))),
        "{err}"
    );
}
