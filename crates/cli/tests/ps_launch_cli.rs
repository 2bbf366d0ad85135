//! Parameter-server training under `tessera launch` (issue 19's kill tests): a server or a
//! worker SIGKILLed mid-run is restarted by `--restarts 1`, rejoins, and the job finishes; a
//! restarted server reports the steps it replayed and lost. The processes are found by the
//! environment the launcher gave them (their role and this job's scheduler address).

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::util::{repo_root, s, tessera_command, wait_or_kill, Scratch};

/// Longest the job may take before the test calls it hung (a guard, not a timing check).
const HANG_GUARD: Duration = Duration::from_secs(180);

/// A free port on 127.0.0.1 for this job's scheduler.
fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
}

/// Starts `tessera launch --nproc 2 --ps-servers 1 --restarts 1` of the seed parameter-server
/// run (sync, 2 workers, 1 server, snapshots every 5 steps).
fn start_job(dir: &Path, addr: &str) -> Child {
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
        "1",
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
    let addr = free_addr();
    let job = start_job(dir, &addr);
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
