//! Writes that run out of room: a command whose files may not grow past a size (RLIMIT_FSIZE,
//! which fails a write the way a full disk does, without needing a small filesystem) fails
//! with the file and the OS error, leaves the previous output whole and nothing of its own.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::util::{assert_ok, repo_root, s, tessera_command, Scratch};

/// Runs `tessera args` with its files limited to `limit` bytes: a write past it fails with
/// EFBIG ("File too large"; SIGXFSZ is ignored so the process is not killed instead).
fn tessera_with_file_limit(args: &[&str], limit: u64) -> Output {
    let mut cmd = tessera_command();
    cmd.args(args).current_dir(repo_root());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().expect("running tessera")
}

/// Every file under `dir`, by path relative to it, with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, at: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).unwrap().to_path_buf();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Two pipeline stages of one rank each: rank 1's checkpoint (the later layers and the
/// head) is larger than rank 0's, so a size limit between them fails rank 1's write alone.
fn pipeline_config(dir: &Path, out_dir: &Path) -> PathBuf {
    let data = repo_root().join("data/digits");
    let text = format!(
        "[model]\nname = \"seed_mlp\"\nhidden = 64\nclasses = 10\n\
         [data]\nformat = \"idx\"\ndir = \"{}\"\nbatch_size = 8\n\
         [parallel]\ndevices = 2\nmode = \"semi_auto\"\n\
         [parallel.pipeline]\nstages = 2\nmicro_batches = 2\n\
         [train]\nepochs = 1\nmax_steps = 2\noptimizer = \"momentum\"\nlearning_rate = 0.05\n\
         momentum = 0.9\nseed = 1\n\
         [output]\ndir = \"{}\"\n",
        s(&data),
        s(out_dir)
    );
    let path = dir.join("pipeline.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// When rank 1 cannot write its checkpoint, the error shown is rank 1's own (its file and
/// the OS error), not rank 0's "another rank failed"; the previous set stays whole and no
/// staging directory, lock or temporary file is left.
#[test]
fn a_rank_that_cannot_write_its_checkpoint_is_the_error_shown_and_the_old_set_stays() {
    let dir = Scratch::new("disk-full-rank");
    let out_dir = dir.0.join("run");
    let config = pipeline_config(&dir.0, &out_dir);
    assert_ok(
        &tessera_command()
            .args(["train", s(&config)])
            .output()
            .unwrap(),
    );
    let size = |r: usize| {
        let file = out_dir.join(format!("rank_{r}/checkpoint_{r}.safetensors"));
        std::fs::metadata(file).unwrap().len()
    };
    let (rank0, rank1) = (size(0), size(1));
    assert!(
        rank1 > rank0 + 64,
        "the test needs rank 1's file larger: {rank0} vs {rank1}"
    );
    let limit = (rank0 + rank1) / 2;
    let mut old = files(&out_dir);
    old.remove(Path::new("metrics.jsonl"));
    for (path, bytes) in &old {
        let own = path.ends_with("checkpoint_1.safetensors");
        assert!(
            own || (bytes.len() as u64) < limit,
            "{} too large",
            path.display()
        );
    }
    let out = tessera_with_file_limit(&["train", s(&config)], limit);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or("");
    assert!(error.contains("rank 1"), "{stderr}");
    assert!(error.contains("checkpoint_1.safetensors"), "{stderr}");
    assert!(error.contains("File too large"), "{stderr}");
    assert!(!error.contains("another rank failed"), "{stderr}");
    let mut now = files(&out_dir);
    now.remove(Path::new("metrics.jsonl"));
    assert!(now == old, "the previous set changed");
    let leftovers: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "run" && n != "pipeline.toml")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// `tessera plan` whose operator strategy file cannot be written fails naming it and leaves
/// neither a temporary file nor the output directories it created for it.
#[test]
fn a_plan_that_cannot_write_its_strategy_file_leaves_no_directory() {
    let dir = Scratch::new("disk-full-plan");
    let out_dir = dir.0.join("a/b");
    let out = tessera_with_file_limit(
        &[
            "plan",
            "examples/seed_semi_auto.toml",
            "--set",
            &format!("output.dir=\"{}\"", s(&out_dir)),
        ],
        64,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("operator_strategy.json"), "{stderr}");
    assert!(stderr.contains("File too large"), "{stderr}");
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0, "a/ is left");
}

/// `--trace` and `--timeline` files that cannot be written fail naming the file, and leave the
/// previous file whole: never an empty or half-written file at the path.
#[test]
fn trace_and_timeline_that_cannot_be_written_leave_the_previous_file() {
    let dir = Scratch::new("disk-full-trace");
    let config = pipeline_config(&dir.0, &dir.0.join("run"));
    let (trace, timeline) = (dir.0.join("t.json"), dir.0.join("t.svg"));
    for (flag, path) in [("--trace", &trace), ("--timeline", &timeline)] {
        std::fs::write(path, "previous").unwrap();
        // The run writes no checkpoint; its metrics log stays far below the limit.
        let out = tessera_with_file_limit(
            &[
                "train",
                s(&config),
                "--set",
                "output.save_checkpoint=false",
                flag,
                s(path),
            ],
            1000,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(s(path)),
            "{stderr}"
        );
        assert!(stderr.contains("File too large"), "{stderr}");
        assert_eq!(std::fs::read_to_string(path).unwrap(), "previous", "{flag}");
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["pipeline.toml", "run", "t.json", "t.svg"]);
}

/// `tessera launch` whose log file cannot grow says so once, naming the file, keeps showing
/// the output on the console, and leaves the log ending in a whole line.
#[test]
fn a_launch_log_that_cannot_grow_ends_in_a_whole_line() {
    let dir = Scratch::new("disk-full-launch");
    let logs = dir.0.join("logs");
    let script =
        "i=0; while [ $i -lt 300 ]; do echo \"line $i of a worker's output\"; i=$((i+1)); done";
    let out = tessera_with_file_limit(
        &[
            "launch",
            "--nproc",
            "1",
            "--independent",
            "--log-dir",
            s(&logs),
            "--",
            "sh",
            "-c",
            script,
        ],
        1000,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let log = logs.join("worker_0.log");
    let warning = format!("cannot write {}", s(&log));
    assert_eq!(stderr.matches(&warning).count(), 1, "{stderr}");
    let console = String::from_utf8_lossy(&out.stdout);
    assert!(
        console.contains("line 299 of a worker's output"),
        "{console}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.len() > 500 && text.len() <= 1000, "{}", text.len());
    assert!(text.ends_with('\n'), "the log ends in half a line: {text}");
}
