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
