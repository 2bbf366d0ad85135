//! `tessera launch`'s collective-job flags refused before anything starts (any build), and a
//! build without the MPI backend saying how to get one. The jobs themselves run in
//! `mpi_launch.rs` (built with `--features mpi`).

use std::process::Output;

use crate::util::{tessera_command, Scratch};

fn launch(dir: &Scratch, args: &[&str]) -> Output {
    tessera_command()
        .arg("launch")
        .args(["--log-dir", crate::util::s(&dir.0.join("logs"))])
        .args(args)
        .args(["--", "true"])
        .output()
        .unwrap()
}

fn refused_with(dir: &Scratch, args: &[&str], message: &str) {
    let out = launch(dir, args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted");
    assert!(err.contains(message), "{args:?}: {err}");
    assert!(
        !dir.0.join("logs").exists(),
        "{args:?} created the log directory"
    );
}

#[test]
fn collective_flags_are_checked_before_anything_starts() {
    let dir = Scratch::new("launch-flags");
    let cases: [(&[&str], &str); 12] = [
        (
            &["--nproc", "0"],
            "--nproc (--worker_num) must be between 1 and 1024, got 0",
        ),
        (
            &["--worker_num", "4", "--local_worker_num", "3"],
            "--local_worker_num must divide --worker_num 4",
        ),
        (
            &[
                "--worker_num",
                "4",
                "--local_worker_num",
                "2",
                "--node_rank",
                "2",
            ],
            "--node_rank 2 must be below the job's 2 node(s)",
        ),
        (
            &[
                "--worker_num",
                "4",
                "--local_worker_num",
                "2",
                "--hostfile",
                "h",
            ],
            "--hostfile names the hosts of one mpirun",
        ),
        (
            &["--nproc", "2", "--join", "false"],
            "--join false is not supported",
        ),
        (
            &["--nproc", "2", "--cluster_time_out", "0"],
            "--cluster_time_out must be between 1 and 86400 seconds, got 0",
        ),
        (
            &["--nproc", "2", "--independent", "--node_rank", "0"],
            "cannot be combined with --ps-servers or --independent",
        ),
        (
            &["--nproc", "2", "--scheduler-addr", "h:1"],
            "--scheduler-addr needs --ps-servers",
        ),
        // Flags of another form of job used to be ignored without a word.
        (
            &["--nproc", "2", "--independent", "--ps-servers", "1"],
            "--independent and --ps-servers are two different jobs",
        ),
        (
            &["--nproc", "2", "--independent", "--master_addr", "10.0.0.1"],
            "--master_addr belongs to one collective job, which --independent does not start",
        ),
        (
            &["--nproc", "2", "--ps-servers", "1", "--master-port", "9000"],
            "--master_port belongs to one collective job, which --ps-servers does not start",
        ),
        (
            &["--nproc", "2", "--independent", "--cluster_time_out", "0"],
            "--cluster_time_out belongs to one collective job",
        ),
    ];
    for (args, message) in cases {
        refused_with(&dir, args, message);
    }
    // A host file mpirun could not read is refused before mpirun starts, naming its line.
    let hosts = dir.0.join("hosts");
    std::fs::write(&hosts, "node-1 slots=2\nnode-2 slots two\n").unwrap();
    let hosts = crate::util::s(&hosts);
    refused_with(
        &dir,
        &["--nproc", "2", "--hostfile", hosts],
        "line 2: \"slots\" after host node-2 is not a KEY=NUMBER setting",
    );
    // A host of no slots would still get ranks under mpirun's --oversubscribe.
    let zero = dir.0.join("hosts0");
    std::fs::write(&zero, "localhost slots=0\n").unwrap();
    refused_with(
        &dir,
        &["--nproc", "2", "--hostfile", crate::util::s(&zero)],
        "line 1: host localhost has slots=0",
    );
    // msrun's scripts pass --master_addr on one node too: taken, but said to be unused there.
    let out = launch(&dir, &["--nproc", "1", "--master_addr", "10.0.0.1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("note: --master_addr and --master_port are used only by a job across nodes"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir.0.join("logs"));
    // msrun's `--join` (true) is accepted: it is what the launcher always does.
    let out = launch(&dir, &["--nproc", "1", "--join", "--independent"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Without the MPI backend, one collective job cannot run: the launcher says so and how to
/// build one, before it creates anything.
#[cfg(not(feature = "mpi"))]
#[test]
fn a_build_without_mpi_says_how_to_get_it() {
    let dir = Scratch::new("launch-no-mpi");
    refused_with(
        &dir,
        &["--nproc", "2"],
        "this tessera was built without the MPI backend, which one collective job across processes needs: build it with `cargo build --release -p tessera-cli --features mpi`",
    );
}

/// `train.elastic` keeps its snapshots in the store `tessera launch` gives each node: a run
/// without one is refused naming the key and the variable; a malformed `TESSERA_FAULT` is
/// refused naming it.
#[test]
fn elastic_training_needs_the_launchers_store() {
    let dir = Scratch::new("elastic-no-store");
    let train = |env: &[(&str, &str)]| {
        let mut c = tessera_command();
        c.args([
            "train",
            "examples/seed_stand_alone.toml",
            "--set",
            "train.elastic=true",
        ])
        .args([
            "--set",
            &format!("output.dir=\"{}\"", crate::util::s(&dir.0)),
        ])
        .current_dir(crate::util::repo_root())
        .env_remove("TESSERA_ELASTIC_DIR");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let out = train(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("train.elastic") && err.contains("TESSERA_ELASTIC_DIR is not set"),
        "{err}"
    );
    let store = dir.0.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let out = train(&[
        ("TESSERA_ELASTIC_DIR", crate::util::s(&store)),
        ("TESSERA_FAULT", "rank=0,step=1,at=sometime"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("TESSERA_FAULT") && err.contains("unknown point"),
        "{err}"
    );
}

/// `--log-dir` and `--hostfile` are checked before anything is created or started: a file, a
/// path under a file, a directory where a file is expected, a log that is a directory or a
/// named pipe (opening one for writing waited for a reader forever). Each error names the
/// flag, the path, what is wrong and what was expected, and nothing is left behind.
#[test]
fn launch_paths_are_checked_before_anything_starts() {
    let dir = Scratch::new("launch-paths");
    let file = dir.0.join("afile");
    std::fs::write(&file, "x").unwrap();
    let refused = |args: &[&str], message: &str| {
        let child = tessera_command()
            .arg("launch")
            .args(args)
            .args(["--", "true"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = crate::util::wait_or_kill(child, std::time::Duration::from_secs(120))
            .unwrap_or_else(|| panic!("{args:?}: tessera launch hung"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(message), "{args:?}: {err}");
    };
    let f = crate::util::s(&file);
    let under = file.join("logs");
    refused(
        &["--nproc", "1", "--log-dir", f],
        &format!("--log-dir {f}: is a file; expected a directory (the per-process logs"),
    );
    refused(
        &[
            "--nproc",
            "1",
            "--independent",
            "--log_dir",
            crate::util::s(&under),
        ],
        &format!("cannot be created: {f} is a file, not a directory; expected a directory"),
    );
    let d = crate::util::s(&dir.0);
    refused(
        &["--nproc", "1", "--hostfile", d],
        &format!("--hostfile {d}: is a directory; expected a file (the MPI host file"),
    );
    refused(
        &["--nproc", "1", "--hostfile", crate::util::s(&under)],
        "does not exist (",
    );
    // A log that is a directory, or a named pipe: refused before any other log is created.
    let logs = dir.0.join("logs");
    std::fs::create_dir_all(logs.join("worker_1.log")).unwrap();
    let l = crate::util::s(&logs);
    refused(
        &["--nproc", "2", "--independent", "--log-dir", l],
        "worker_1.log: is a directory; expected a log file",
    );
    std::fs::remove_dir(logs.join("worker_1.log")).unwrap();
    let fifo = std::ffi::CString::new(crate::util::s(&logs.join("worker_1.log"))).unwrap();
    // SAFETY: mkfifo(3) with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    refused(
        &["--nproc", "2", "--independent", "--log-dir", l],
        "worker_1.log: is a named pipe, not a regular file; expected a log file",
    );
    let left: Vec<_> = std::fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["worker_1.log"], "worker_0.log was created: {left:?}");
}

/// Two launches running at once in one `--log-dir` would mix their lines in the same logs
/// (and a failure's tail would show the other job's): the second is refused, naming the log
/// and the flag, and the first job's log is untouched.
#[test]
fn a_log_dir_in_use_by_a_running_launch_is_refused() {
    let dir = Scratch::new("launch-shared-logs");
    let logs = dir.0.join("logs");
    let l = crate::util::s(&logs);
    let started = dir.0.join("started");
    let script = format!("touch {}; exec sleep 600", crate::util::s(&started));
    let mut first = tessera_command()
        .args(["launch", "--nproc", "1", "--independent", "--log-dir", l])
        .args(["--grace-period", "1", "--", "sh", "-c", &script])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let begun = std::time::Instant::now();
    while !started.exists() {
        assert!(
            begun.elapsed() < std::time::Duration::from_secs(120),
            "the first job never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let second = tessera_command()
        .args(["launch", "--nproc", "2", "--independent", "--log-dir", l])
        .args(["--", "true"])
        .output()
        .unwrap();
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(first.id() as libc::pid_t, libc::SIGTERM) };
    let _ = first.wait();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "the second launch ran: {err}");
    assert!(
        err.contains("worker_0.log is being written by another tessera launch")
            && err.contains("--log-dir"),
        "{err}"
    );
    assert!(
        !logs.join("worker_1.log").exists(),
        "the refused launch left a log behind"
    );
}
