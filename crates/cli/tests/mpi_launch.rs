//! `tessera launch` starting one collective job under `mpirun` (built only with `--features
//! mpi`): on this host, and across two "nodes" that are two launcher invocations joined over
//! loopback (msrun's model), with the losses of `tessera train --devices N` on threads; a failed
//! rank named with its log; whole-job restarts; the contract in each rank; and the launch
//! errors (a port in use, a master that never answers or never comes, no `mpirun`) said within
//! the timeout, with no process left behind.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::mpi_train::{args, train_command};
use crate::util::{assert_ok, repo_root, s, step_losses, tessera_command, wait_or_kill, Scratch};

/// Longest a launch may take before the test calls it hung (not a timing check).
const HANG_GUARD: Duration = Duration::from_secs(300);

pub(crate) fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_tessera")
}

/// `tessera launch LAUNCH… -- COMMAND…`, from the repository root, output captured.
pub(crate) fn launch(launch: &[&str], command: &[&str]) -> Command {
    let mut c = tessera_command();
    c.arg("launch")
        .args(launch)
        .arg("--")
        .args(command)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs a launch to its end (see [`finish`]).
pub(crate) fn launched(command: &mut Command) -> Output {
    finish(command.spawn().expect("starting tessera launch"))
}

pub(crate) fn finish(child: Child) -> Output {
    wait_or_kill(child, HANG_GUARD).expect("tessera launch hung")
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A port on 127.0.0.1 free right now.
pub(crate) fn free_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port().to_string()
}

/// Processes whose command line mentions `marker` (a test's scratch path).
pub(crate) fn processes_mentioning(marker: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?.to_string();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (pid != me && text.contains(marker) && crate::util::alive(pid.parse().ok()?))
                .then(|| format!("{pid}: {text}"))
        })
        .collect()
}

/// The small GPT of the MPI launch tests on 4 devices (2 layers, width 64, 32 tokens, batch
/// 8), with `sets` (its layout, steps, modes) added, as `name`.
pub(crate) fn small_gpt(dir: &Path, name: &str, sets: &[&str]) -> Vec<String> {
    let base = [
        "parallel.devices=4",
        "parallel.mode=\"semi_auto\"",
        "model.layers=2",
        "model.hidden=64",
        "model.seq_len=32",
        "data.batch_size=8",
        "train.eval=false",
    ];
    let all = base.iter().chain(sets).map(|x| x.to_string()).collect();
    train_command("examples/gpt_kjv.toml", dir, name, all)
}

/// The small GPT in data × model parallel 2 × 2, 6 steps, with `extra`, as `name`.
fn gpt(dir: &Path, name: &str, extra: &[&str]) -> Vec<String> {
    let mut sets = vec![
        "parallel.data_parallel=2",
        "parallel.model_parallel=2",
        "parallel.vocab_emb_dp=false",
        "train.max_steps=6",
    ];
    sets.extend(extra);
    small_gpt(dir, name, &sets)
}

/// `tessera launch --nproc 4 -- tessera train` is one 4-rank job: its losses are `tessera train
/// --devices 4` on threads (1e-6), and bit for bit in deterministic mode; every rank's lines are
/// in its own log, and the ranks saw the contract.
#[test]
fn launch_nproc_4_is_one_job_with_the_threads_losses() {
    let dir = Scratch::new("mpi-launch-one");
    for (name, extra) in [
        ("plain", &[][..]),
        ("det", &["train.deterministic=true"][..]),
    ] {
        let mut mpi = vec![exe().to_string()];
        mpi.extend(gpt(&dir.0, &format!("{name}-mpi"), extra));
        let logs = dir.0.join(format!("{name}-logs"));
        let out = launched(&mut launch(
            &["--nproc", "4", "--log-dir", s(&logs)],
            &args(&mpi),
        ));
        assert_ok(&out);
        let threads = gpt(&dir.0, &format!("{name}-threads"), extra);
        assert_ok(
            &tessera_command()
                .args(args(&threads))
                .current_dir(repo_root())
                .output()
                .unwrap(),
        );
        let m = step_losses(&dir.0.join(format!("{name}-mpi.jsonl")));
        let t = step_losses(&dir.0.join(format!("{name}-threads.jsonl")));
        assert_eq!(m.len(), 6, "{name}");
        for (step, (a, b)) in m.iter().zip(&t).enumerate() {
            if name == "det" {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{name} step {}: {a} vs {b}",
                    step + 1
                );
            } else {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs(),
                    "{name} step {}: {a} vs {b}",
                    step + 1
                );
            }
        }
        // Rank 0 logs the steps; each rank's log holds its own lines, without MPI's tags.
        let log0 = std::fs::read_to_string(logs.join("worker_0.log")).unwrap();
        assert!(log0.contains("step: 6, loss is"), "{log0}");
        assert!(!log0.contains("<stdout>:"), "{log0}");
        for rank in 0..4 {
            let log = std::fs::read_to_string(logs.join(format!("worker_{rank}.log"))).unwrap();
            assert!(
                log.starts_with(&format!(
                    "--- tessera launch: worker {rank} (rank {rank}), restart count 0 ---"
                )),
                "{log}"
            );
        }
        let console = String::from_utf8_lossy(&out.stdout);
        assert!(console.contains("[worker 0] epoch: 1 step: 6"), "{console}");
    }
}

/// Each rank runs with the contract (its rank, the world, MindSpore's names, the MPI
/// backend); a rank that fails ends the job, named with its log's last lines; `--restarts 1`
/// starts the whole job again with `TESSERA_RESTART_COUNT=1`.
#[test]
fn ranks_get_the_contract_and_a_failed_rank_is_named_or_restarted() {
    let dir = Scratch::new("mpi-launch-env");
    let logs = dir.0.join("logs");
    let script = "echo \"rank=$TESSERA_RANK world=$TESSERA_WORLD_SIZE id=$RANK_ID size=$RANK_SIZE device=$DEVICE_ID ms=$MS_WORKER_NUM backend=$TESSERA_BACKEND restart=$TESSERA_RESTART_COUNT\"";
    let out = launched(&mut launch(
        &["--nproc", "3", "--log-dir", s(&logs)],
        &["sh", "-c", script],
    ));
    assert_ok(&out);
    // `--hostfile` goes to mpirun: a host file naming this host with 3 slots.
    let hostfile = dir.0.join("hosts");
    std::fs::write(&hostfile, "localhost slots=3\n").unwrap();
    let hosted = dir.0.join("hosted-logs");
    let out = launched(&mut launch(
        &[
            "--nproc",
            "3",
            "--hostfile",
            s(&hostfile),
            "--log-dir",
            s(&hosted),
        ],
        &["sh", "-c", script],
    ));
    assert_ok(&out);
    let log = std::fs::read_to_string(hosted.join("worker_2.log")).unwrap();
    assert!(log.contains("rank=2 world=3"), "{log}");
    for rank in 0..3 {
        let log = std::fs::read_to_string(logs.join(format!("worker_{rank}.log"))).unwrap();
        assert!(
            log.contains(&format!(
                "rank={rank} world=3 id={rank} size=3 device={rank} ms=3 backend=mpi restart=0"
            )),
            "{log}"
        );
    }

    let fail = "if [ \"$TESSERA_RANK\" = 1 ] && [ \"$TESSERA_RESTART_COUNT\" = 0 ]; then echo 'rank one gives up' >&2; exit 3; fi; echo \"done $TESSERA_RANK\"";
    let failing = dir.0.join("fail-logs");
    // mpirun stops the sleeping ranks.
    let err = failed_before_the_bound(
        &["--nproc", "3", "--log-dir", s(&failing)],
        &["sh", "-c", &format!("{fail}; sleep 600")],
    );
    // How the rank's own command ended, from its rank-env, beside mpirun's view.
    assert!(
        err.contains("worker 1 (rank 1) failed (exit code 3; mpirun:"),
        "{err}"
    );
    assert!(
        err.contains("[worker 1] rank one gives up"),
        "the log's tail is shown: {err}"
    );
    assert!(processes_mentioning(s(&failing)).is_empty());

    let restarted = dir.0.join("restart-logs");
    let out = launched(&mut launch(
        &[
            "--nproc",
            "3",
            "--restarts",
            "1",
            "--log-dir",
            s(&restarted),
        ],
        &["sh", "-c", fail],
    ));
    assert_ok(&out);
    assert!(
        stderr(&out).contains("starting the job again (1 of 1 restarts)"),
        "{}",
        stderr(&out)
    );
    let log = std::fs::read_to_string(restarted.join("worker_1.log")).unwrap();
    // mpirun forwards a rank's stdout and stderr separately, so rank-env's own lines on
    // stderr may come before or after the command's: only the second run's section counts.
    let second_run = log
        .split_once("restart count 1 ---\n")
        .map(|(_, after)| after)
        .unwrap_or_else(|| panic!("no second run in the log: {log}"));
    assert!(second_run.lines().any(|line| line == "done 1"), "{log}");
    assert!(!second_run.contains("rank one gives up"), "{log}");
}

/// Two launcher invocations on this machine are the two nodes of one 4-rank job (msrun's
/// model, node ranks 0 and 1, the master on loopback): the losses of one 4-rank job, every
/// rank's log on node 0, and node 1 ends with the job.
#[test]
fn two_node_ranks_on_loopback_form_one_job() {
    let dir = Scratch::new("mpi-launch-nodes");
    let port = free_port();
    let mut train = vec![exe().to_string()];
    train.extend(gpt(&dir.0, "nodes", &[]));
    let node = |rank: &str| {
        let logs = dir.0.join(format!("logs{rank}"));
        launch(
            &[
                "--worker_num",
                "4",
                "--local_worker_num",
                "2",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                &port,
                "--node_rank",
                rank,
                "--cluster_time_out",
                "120",
                "--log_dir",
                s(&logs),
            ],
            &args(&train),
        )
        .spawn()
        .unwrap()
    };
    // Node 1 first: it waits for node 0 to listen.
    let one = node("1");
    let zero = node("0");
    let (zero, one) = (finish(zero), finish(one));
    assert_ok(&zero);
    assert_ok(&one);
    assert!(stderr(&one).contains("as node 1 of 2"), "{}", stderr(&one));
    let threads = gpt(&dir.0, "threads", &[]);
    assert_ok(
        &tessera_command()
            .args(args(&threads))
            .current_dir(repo_root())
            .output()
            .unwrap(),
    );
    let m = step_losses(&dir.0.join("nodes.jsonl"));
    let t = step_losses(&dir.0.join("threads.jsonl"));
    assert_eq!(m.len(), 6);
    for (a, b) in m.iter().zip(&t) {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "{a} vs {b}");
    }
    for rank in 0..4 {
        assert!(dir.0.join(format!("logs0/worker_{rank}.log")).exists());
    }
    let saved = dir.0.join("nodes");
    assert!(ckpt::check_set(&saved).unwrap().is_some(), "one whole set");
}

/// A node rank not below the nodes, a master port in use, a master that never answers, a
/// node that never comes and no `mpirun` on PATH: each a clear error naming the flag or the
/// program, within the time allowed, with nothing left running.
#[test]
fn launch_errors_name_the_flag_and_leave_nothing_behind() {
    let dir = Scratch::new("mpi-launch-errors");
    let logs = dir.0.join("logs");
    let sleeper = ["sh", "-c", "sleep 600"];
    let base = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "--worker_num",
            "4",
            "--local_worker_num",
            "2",
            "--log_dir",
            s(&logs),
        ]
        .map(String::from)
        .to_vec();
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    // Each launch is refused with `message`, well within the time it was given (a bound
    // against a hang, not a benchmark).
    let refused = |extra: &[&str], message: &str| {
        let start = Instant::now();
        let out = launched(&mut launch(&args(&base(extra)), &sleeper));
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(
            stderr(&out).contains(message),
            "{extra:?}: {}",
            stderr(&out)
        );
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{:?}",
            start.elapsed()
        );
    };
    refused(
        &["--node_rank", "2"],
        "--node_rank 2 must be below the job's 2 node(s)",
    );
    // Node 0 cannot listen where another program does.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    refused(
        &["--node_rank", "0", "--master_port", &port],
        &format!("node 0 cannot listen on 127.0.0.1:{port} (--master_addr, --master_port)"),
    );
    // A master that accepts but never answers: node 1 gives up at --cluster_time_out.
    let node1 = |port: &str, secs: &'static str| {
        [
            "--node_rank",
            "1",
            "--master_port",
            port,
            "--cluster_time_out",
            secs,
        ]
        .map(String::from)
    };
    refused(
        &args(&node1(&port, "2")),
        "did not answer within --cluster_time_out",
    );
    drop(taken);
    // Nobody at the master address.
    let port = free_port();
    refused(
        &args(&node1(&port, "1")),
        &format!("could not reach node 0's launcher at 127.0.0.1:{port} within --cluster_time_out"),
    );
    // Node 0 whose other node never comes.
    refused(
        &[
            "--node_rank",
            "0",
            "--master_port",
            &port,
            "--cluster_time_out",
            "2",
        ],
        "node rank(s) 1 of 2 did not join within --cluster_time_out",
    );

    // No mpirun on PATH.
    let out = launch(&["--nproc", "2", "--log-dir", s(&logs)], &sleeper)
        .env("PATH", s(&dir.0))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("`mpirun` is not on PATH"),
        "{}",
        stderr(&out)
    );
    assert!(
        processes_mentioning(s(&dir.0)).is_empty(),
        "{:?}",
        processes_mentioning(s(&dir.0))
    );
}

/// Waits for the `ranks` ranks of the launch `child` to touch `<dir>/started-<rank>`, sends the
/// launcher SIGTERM, checks that it exits 128 + 15, and waits (30 s at most) until no process
/// mentions `gone` (a path in the ranks' command lines).
fn terminate_once_started(child: Child, dir: &Path, ranks: usize, gone: &Path) {
    let start = Instant::now();
    while (0..ranks).any(|r| !dir.join(format!("started-{r}")).exists()) {
        assert!(start.elapsed() < HANG_GUARD, "the ranks never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let out = finish(child);
    assert_eq!(out.status.code(), Some(128 + 15), "{}", stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !processes_mentioning(s(gone)).is_empty() {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            processes_mentioning(s(gone))
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGTERM to the launcher stops the job: every rank ends, and the launcher exits 128 + 15.
#[test]
fn a_signal_to_the_launcher_stops_every_rank() {
    let dir = Scratch::new("mpi-launch-signal");
    let logs = dir.0.join("logs");
    let marker = dir.0.join("started");
    let script = format!("touch {}-$TESSERA_RANK; exec sleep 600", s(&marker));
    let child = launch(
        &["--nproc", "3", "--log-dir", s(&logs), "--grace-period", "5"],
        &["sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    terminate_once_started(child, &dir.0, 3, &marker);
}

/// With `--grace-period 0` the launcher kills `mpirun` before OpenMPI's own kill of the ranks:
/// each rank-env then kills its command and every process the command started, so one that
/// ignores SIGTERM does not outlive the job (it used to run on, an orphan).
#[test]
fn a_zero_grace_leaves_no_process_that_ignores_sigterm() {
    let dir = Scratch::new("mpi-launch-grace0");
    let (mut job, stubborn) = stubborn_job(&dir.0);
    terminate_once_started(job.spawn().unwrap(), &dir.0, 2, &stubborn);
}

/// A launch of 2 ranks with `--grace-period 0` whose ranks each start a process that ignores
/// SIGTERM (its command line mentions the returned path) and touch `<dir>/started-<rank>`.
fn stubborn_job(dir: &Path) -> (Command, std::path::PathBuf) {
    let logs = dir.join("logs");
    let started = dir.join("started");
    let stubborn = dir.join("stubborn");
    let script = format!(
        "sh -c 'trap \"\" TERM; touch {}-$TESSERA_RANK; while :; do sleep 1; done' {} & wait",
        s(&started),
        s(&stubborn)
    );
    let job = launch(
        &["--nproc", "2", "--log-dir", s(&logs), "--grace-period", "0"],
        &["sh", "-c", &script],
    );
    (job, stubborn)
}

/// OpenMPI's session directory and shared-memory segments go to the launcher's own directory,
/// removed when it ends: a job whose `mpirun` the launcher had to kill (`--grace-period 0`)
/// leaves nothing of OpenMPI's in the temporary directory, and no scratch directory of this
/// launcher stays in `/dev/shm`.
#[test]
fn a_killed_mpirun_leaves_no_openmpi_files_behind() {
    let dir = Scratch::new("mpi-launch-scratch");
    let tmp = dir.0.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let (mut job, stubborn) = stubborn_job(&dir.0);
    let child = job.env("TMPDIR", &tmp).spawn().unwrap();
    let launcher = child.id();
    terminate_once_started(child, &dir.0, 2, &stubborn);
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
    let owned_by_launcher = |entry: &std::fs::DirEntry| {
        std::fs::read_to_string(entry.path().join(".tessera-launch-owner"))
            .is_ok_and(|owner| owner.split_whitespace().next() == Some(&launcher.to_string()))
    };
    let scratch: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("tessera-"))
        .filter(owned_by_launcher)
        .map(|e| e.path())
        .collect();
    assert!(
        scratch.is_empty(),
        "the launcher's directories stayed: {scratch:?}"
    );
}

/// A rank whose command ends with exit code 0 without starting MPI, while another rank starts
/// MPI (and would wait for it in `MPI_Init` forever: OpenMPI takes the clean exit for a finished
/// rank), ends the job at once with both named, instead of hanging.
#[test]
fn a_rank_ending_before_mpi_stops_the_job_instead_of_hanging() {
    let dir = Scratch::new("mpi-launch-early-exit");
    let logs = dir.0.join("logs");
    let out_dir = dir.0.join("out");
    let train = format!(
        "exec {} train examples/seed_semi_auto.toml --devices 2 --set 'parallel.mode=\"data_parallel\"' --set train.max_steps=2 --set 'output.dir=\"{}\"'",
        exe(),
        s(&out_dir)
    );
    let script = format!("if [ \"$TESSERA_RANK\" = 1 ]; then exit 0; fi; {train}");
    // Within the bound: it used to hang.
    let err = failed_before_the_bound(
        &["--nproc", "2", "--log-dir", s(&logs), "--grace-period", "5"],
        &["sh", "-c", &script],
    );
    assert!(
        err.contains("rank 1 ended (exit code 0) without starting MPI, while rank 0 started MPI"),
        "{err}"
    );
    let log = std::fs::read_to_string(logs.join("worker_1.log")).unwrap();
    assert!(
        log.contains("the command ended before starting MPI (exit code 0)"),
        "{log}"
    );
    assert!(processes_mentioning(s(&out_dir)).is_empty());
}

/// Runs `tessera launch LAUNCH… -- COMMAND…`, checks that it failed within 120 s (a bound
/// against a hang, not a benchmark) and returns its stderr.
fn failed_before_the_bound(launch_args: &[&str], command: &[&str]) -> String {
    let start = Instant::now();
    let out = launched(&mut launch(launch_args, command));
    assert!(!out.status.success());
    assert!(
        start.elapsed() < Duration::from_secs(120),
        "{:?}",
        start.elapsed()
    );
    stderr(&out)
}

/// Runs `tessera launch LAUNCH… -- sh -c SCRIPT` (the ranks' logs in `<dir>/logs`) to its end
/// under a guard far above the run's length: `None` when it hung.
fn launch_script(dir: &Path, launch_args: &[&str], script: &str) -> Option<Output> {
    let logs = dir.join("logs");
    let mut all = vec!["--log-dir", s(&logs), "--grace-period", "2"];
    all.extend(launch_args);
    let child = launch(&all, &["sh", "-c", script]).spawn().unwrap();
    wait_or_kill(child, Duration::from_secs(150))
}

/// Runs `script` on 2 ranks with `--hang_time_out hang_secs`, asserts the launcher ended with
/// exit code 1 leaving no process of the job (`dir`) running, and returns its stderr.
fn stopped_job_stderr(dir: &Scratch, hang_secs: &str, script: &str) -> String {
    let out = launch_script(
        &dir.0,
        &["--nproc", "2", "--hang_time_out", hang_secs],
        script,
    )
    .expect("tessera launch hung");
    stopped_and_gone(&out, dir)
}

/// The stderr of a launch `out` that ended with exit code 1, asserting that no process of the
/// job (`dir`) is left running.
fn stopped_and_gone(out: &Output, dir: &Scratch) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        processes_mentioning(s(&dir.0)).is_empty(),
        "{:?}",
        processes_mentioning(s(&dir.0))
    );
    err
}

/// A rank still running after another rank's command ended (a script looping or sleeping
/// outside MPI) is named and the job stopped after `--hang_time_out`, with every process gone;
/// it used to leave the launcher waiting forever.
#[test]
fn a_rank_running_on_after_another_ended_is_named_as_hung() {
    let dir = Scratch::new("mpi-launch-hang-ended");
    let script = format!(
        "[ \"$TESSERA_RANK\" = 1 ] && sleep 600; exit 0 # {}",
        s(&dir.0)
    );
    let err = stopped_job_stderr(&dir, "3", &script);
    assert!(
        err.contains("rank 1 still running 3 s after rank 0's command ended (exit code 0)")
            && err.contains("taken as hung (--hang_time_out 3)"),
        "{err}"
    );
}

/// A rank stopped by a signal (SIGSTOP) while the others run is named and the job stopped
/// after `--hang_time_out` (it used to wait forever, or until a collective's time out failed a
/// rank that was only waiting for it); every process is gone afterwards, the stopped one too.
#[test]
fn a_stopped_rank_is_named_as_hung() {
    let dir = Scratch::new("mpi-launch-hang-stopped");
    let script = format!(
        "[ \"$TESSERA_RANK\" = 1 ] && kill -STOP $$; sleep 600 # {}",
        s(&dir.0)
    );
    let err = stopped_job_stderr(&dir, "3", &script);
    assert!(
        err.contains("rank 1's command was stopped (signal 19, SIGSTOP) for 3 s or more while rank 0 kept running"),
        "{err}"
    );
}

/// Without the watchdog (`--hang_time_out 0`), a rank that fails while another is stopped is
/// named with the stopped one beside it: the failed rank may only have been waiting for it
/// (a collective's time out names no peer).
#[test]
fn a_failure_report_names_a_rank_stopped_at_the_time() {
    let dir = Scratch::new("mpi-launch-stopped-failure");
    let log1 = dir.0.join("logs").join("worker_1.log");
    let script = format!(
        "if [ \"$TESSERA_RANK\" = 1 ]; then kill -STOP $$; sleep 600; fi; \
         until grep -q 'command was stopped' {}; do sleep 0.2; done; exit 3",
        s(&log1)
    );
    let err = stopped_job_stderr(&dir, "0", &script);
    assert!(
        err.contains("worker 0 (rank 0) failed (exit code 3")
            && err.contains("rank 1's command is stopped (signal 19, SIGSTOP), and the others may have waited for it"),
        "{err}"
    );
}

/// `tessera train` of the small GPT on 2 ranks (data parallel), its rank 1 hanging outside MPI
/// at the start of step 2 (`TESSERA_FAULT`, `at=hang`) while rank 0 goes on into the step's
/// collectives, launched with `launch_args` and the train flags `train_args`; its stderr once
/// the launcher ended with exit code 1, with no process of the job left.
fn job_with_a_rank_hanging_outside_mpi(
    dir: &Scratch,
    launch_args: &[&str],
    train_args: &[&str],
) -> String {
    let mut command = vec![exe().to_string()];
    command.extend(small_gpt(
        &dir.0,
        "hang",
        &[
            "parallel.devices=2",
            "parallel.data_parallel=2",
            "parallel.model_parallel=1",
            "train.max_steps=4",
        ],
    ));
    command.extend(train_args.iter().map(|a| a.to_string()));
    let logs = dir.0.join("logs");
    let mut all = vec!["--nproc", "2", "--log-dir", s(&logs), "--grace-period", "2"];
    all.extend(launch_args);
    let mut job = launch(&all, &args(&command));
    job.env("TESSERA_FAULT", "rank=1,step=2,at=hang");
    stopped_and_gone(&launched(&mut job), dir)
}

/// A rank running outside MPI (hung in its own code) while the other waits for it inside a
/// collective is named and the job stopped after `--hang_time_out`: both ranks run, so it used
/// to go on until a collective's time out failed the rank that was only waiting.
#[test]
fn a_rank_outside_mpi_while_another_waits_inside_is_named_as_hung() {
    let dir = Scratch::new("mpi-launch-hang-outside");
    let err = job_with_a_rank_hanging_outside_mpi(&dir, &["--hang_time_out", "4"], &[]);
    assert!(
        err.contains(
            "rank 1 ran outside every MPI call for 4 s or more while rank 0 waited inside"
        ) && err.contains("taken as hung (--hang_time_out 4)"),
        "{err}"
    );
}

/// Without `--hang_time_out`, the rank that fails at its collective's time out is named, and
/// beside it the rank it waited for, outside MPI all that time (the time out names no peer).
#[test]
fn a_failure_report_names_a_rank_outside_mpi_while_the_failed_one_waited() {
    let dir = Scratch::new("mpi-launch-outside-failure");
    let err = job_with_a_rank_hanging_outside_mpi(&dir, &[], &["--timeout", "8"]);
    assert!(
        err.contains("worker 0 (rank 0) failed")
            && err.contains("rank 1 had run outside every MPI call for")
            && err.contains("while rank 0 waited inside"),
        "{err}"
    );
}
