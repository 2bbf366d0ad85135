//! Helpers shared by the command-line tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

/// The path of the `tessera` binary built for these tests.
pub fn tessera_path() -> &'static str {
    env!("CARGO_BIN_EXE_tessera")
}

/// The `tessera` binary built for these tests as a command, to configure and start.
pub fn tessera_command() -> Command {
    Command::new(tessera_path())
}

/// Runs the `tessera` binary built for these tests.
pub fn tessera(args: &[&str]) -> Output {
    tessera_command()
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("running tessera")
}

/// Asserts that a command exited successfully; on failure the message shows what it printed.
#[track_caller]
pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "the command failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The repository root (the examples and the bundled data are relative to it).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A path as `&str`.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A fresh directory named after the test.
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("tessera-cli-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `"loss"` of every step line of a JSON-lines metrics log.
pub fn step_losses(log: &Path) -> Vec<f64> {
    std::fs::read_to_string(log)
        .expect("the metrics log exists")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("one JSON object per line"))
        .filter_map(|v| v.get("loss").and_then(|x| x.as_f64()))
        .collect()
}

/// Waits for `child`'s output; `None` if it has not ended within `guard` (it is then killed).
/// The guard catches a hang, far above a run's real length; it is not a timing check.
pub fn wait_or_kill(child: Child, guard: Duration) -> Option<Output> {
    let pid = child.id() as libc::pid_t;
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(guard) {
        Ok(output) => Some(output.expect("waiting for the process")),
        Err(_) => {
            // SAFETY: kill(2) on the process the test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            None
        }
    }
}

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
pub fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the parenthesised command name: `pid (comm) S …`.
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// The running children of process `parent` (from `/proc/*/stat`), ascending.
pub fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let mut found: Vec<libc::pid_t> = std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
                .filter(|&pid| {
                    let stat =
                        std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                    // `pid (comm) S ppid …`
                    let ppid = stat
                        .rsplit_once(") ")
                        .and_then(|(_, rest)| rest.split(' ').nth(1))
                        .and_then(|p| p.parse::<libc::pid_t>().ok());
                    ppid == Some(parent) && alive(pid)
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort_unstable();
    found
}

/// Polls until no process of `pids` runs; fails the test after `guard` (a guard against a
/// hang, not a timing check), naming the survivors and `what` was done to their parent.
pub fn wait_until_gone(pids: &[libc::pid_t], guard: Duration, what: &str) {
    let start = std::time::Instant::now();
    loop {
        let left: Vec<libc::pid_t> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() {
            return;
        }
        if start.elapsed() > guard {
            for &pid in &left {
                // SAFETY: kill(2) on a process this test's job started; touches no memory.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            panic!("processes {left:?} outlived their parent after {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every file under `dir` with its length, sorted: what a run has written so far.
pub fn files_with_sizes(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.metadata() {
                Ok(m) if m.is_dir() => todo.push(path),
                Ok(m) => found.push((path, m.len())),
                Err(_) => {}
            }
        }
    }
    found.sort();
    found
}
