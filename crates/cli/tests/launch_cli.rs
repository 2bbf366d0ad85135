//! `tessera launch` end to end: the environment contract its processes see, their logs and the
//! merged console view, failure, restarts, signal forwarding and argument errors.
//!
//! The processes are small shell scripts. Every run goes through [`finish`], which fails the
//! test instead of hanging if the launcher does not end; that bound (minutes) is a guard against
//! a hang, far above the runs' real length, not a timing assertion.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::util::{
    alive, assert_ok, s, tessera_command, tessera_path, wait_or_kill, wait_until_gone, Scratch,
};

/// Longest a launch may take before the test calls it hung; the sleepers below sleep 600 s.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// `tessera launch` with `args`, run from `cwd`, output captured. These tests are about the
/// supervisor of independent processes: without `--ps-servers` the launch gets `--independent`
/// (one collective job under `mpirun` is tested in `mpi_launch.rs`).
fn launch_command(cwd: &Path, args: &[&str]) -> Command {
    let mut command = tessera_command();
    command.arg("launch");
    if !args.contains(&"--ps-servers") {
        command.arg("--independent");
    }
    command
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Waits for a started launcher's output; kills it and fails the test if it hangs.
fn finish(child: Child) -> Output {
    wait_or_kill(child, HANG_GUARD)
        .unwrap_or_else(|| panic!("tessera launch did not end within {HANG_GUARD:?}"))
}

/// Runs `tessera launch --log-dir <dir>/logs ARGS -- sh -c SCRIPT` to its end.
fn launch_sh(dir: &Path, args: &[&str], script: &str) -> Output {
    let logs = dir.join("logs");
    let mut all = vec!["--log-dir", s(&logs)];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", "sh", "-c", script]);
    finish(
        launch_command(dir, &all)
            .spawn()
            .expect("starting tessera launch"),
    )
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Waits until `path` holds a process id (written by a child); fails the test after the guard.
fn wait_for_pid(path: &Path) -> libc::pid_t {
    let start = std::time::Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(pid) = text.trim().parse() {
                return pid;
            }
        }
        assert!(
            start.elapsed() < HANG_GUARD,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Prints every contract variable on one line (`-` for an unset one).
const PRINT_ENV: &str = "echo \"role=${TESSERA_ROLE-} rank=${TESSERA_RANK-} \
world=${TESSERA_WORLD_SIZE-} local=${TESSERA_LOCAL_RANK-} sid=${TESSERA_SERVER_ID--} \
wid=${TESSERA_WORKER_ID--} ns=${TESSERA_NUM_SERVERS-} nw=${TESSERA_NUM_WORKERS-} \
addr=${TESSERA_SCHEDULER_ADDR--} restart=${TESSERA_RESTART_COUNT-}\"";

/// In a PS job, `script` with the workers held back until the scheduler and the `servers` have
/// run it (their own end is reported by a mark in `dir`): once the workers finish, the launcher
/// stops the others, which might otherwise not have run yet.
fn workers_after_the_others(dir: &Path, servers: usize, script: &str) -> String {
    let marks = dir.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    format!(
        "{script}; if [ \"$TESSERA_ROLE\" != worker ]; then touch {marks}/$TESSERA_RANK; exit 0; fi; \
         while [ \"$(ls {marks} | wc -l)\" -lt {others} ]; do sleep 0.05; done",
        marks = s(&marks),
        others = servers + 1
    )
}

#[test]
fn workers_see_their_rank_and_world_size() {
    let dir = Scratch::new("launch-env-workers");
    let logs = dir.0.join("logs");
    let args = [
        "--log-dir",
        s(&logs),
        "--nproc",
        "3",
        "--",
        "sh",
        "-c",
        PRINT_ENV,
    ];
    // Contract variables in the launcher's own environment do not leak into its processes.
    let mut command = launch_command(&dir.0, &args);
    command
        .env("TESSERA_SERVER_ID", "99")
        .env("TESSERA_SCHEDULER_ADDR", "leaked:1")
        .env("TESSERA_RESTART_COUNT", "5");
    let out = finish(command.spawn().unwrap());
    assert_ok(&out);
    let console = stdout(&out);
    for id in 0..3 {
        let line = format!(
            "role=worker rank={id} world=3 local={id} sid=- wid={id} ns=0 nw=3 addr=- restart=0"
        );
        assert!(
            console.contains(&format!("[worker {id}] {line}\n")),
            "{console}"
        );
        let log = read(&dir.0.join(format!("logs/worker_{id}.log")));
        assert!(log.contains(&format!("{line}\n")), "{log}");
    }
}

/// msrun's flags `--worker_num` and `--log_dir` are aliases, and each worker finds MindSpore's
/// variables (`RANK_ID`, `RANK_SIZE`, `DEVICE_ID`, `MS_ROLE`, …) beside the contract; the
/// launcher's own `RANK_ID` does not leak into them.
#[test]
fn msrun_flags_and_mindspore_variables() {
    let dir = Scratch::new("launch-msrun");
    let logs = dir.0.join("ms_logs");
    let script = "echo \"$MS_ROLE rank=$RANK_ID size=$RANK_SIZE node=$MS_NODE_ID device=$DEVICE_ID workers=$MS_WORKER_NUM servers=${MS_SERVER_NUM--} sched=${MS_SCHED_HOST--}\"";
    let args = [
        "--worker_num",
        "2",
        "--log_dir",
        s(&logs),
        "--",
        "sh",
        "-c",
        script,
    ];
    let mut command = launch_command(&dir.0, &args);
    command.env("RANK_ID", "77").env("MS_SERVER_NUM", "9");
    let out = finish(command.spawn().unwrap());
    assert_ok(&out);
    for id in 0..2 {
        let line =
            format!("MS_WORKER rank={id} size=2 node={id} device={id} workers=2 servers=- sched=-");
        let log = read(&logs.join(format!("worker_{id}.log")));
        assert!(log.contains(&format!("{line}\n")), "{log}");
    }
}

#[test]
fn a_ps_job_has_a_scheduler_servers_and_workers_with_one_scheduler_address() {
    let dir = Scratch::new("launch-env-ps");
    let script = workers_after_the_others(&dir.0, 2, PRINT_ENV);
    let out = launch_sh(&dir.0, &["--nproc", "2", "--ps-servers", "2"], &script);
    assert_ok(&out);
    let console = stdout(&out);
    let scheduler = read(&dir.0.join("logs/scheduler_0.log"));
    let addr = scheduler
        .split_whitespace()
        .find_map(|word| word.strip_prefix("addr="))
        .expect("the scheduler sees an address")
        .to_string();
    let port = addr.strip_prefix("127.0.0.1:").expect("a local address");
    assert!(port.parse::<u16>().is_ok_and(|p| p > 0), "{addr}");
    let expected = [
        (
            "scheduler 0",
            "scheduler_0",
            "role=scheduler rank=0 world=5 local=0 sid=- wid=-",
        ),
        (
            "server 0",
            "server_0",
            "role=server rank=1 world=5 local=1 sid=0 wid=-",
        ),
        (
            "server 1",
            "server_1",
            "role=server rank=2 world=5 local=2 sid=1 wid=-",
        ),
        (
            "worker 0",
            "worker_0",
            "role=worker rank=3 world=5 local=3 sid=- wid=0",
        ),
        (
            "worker 1",
            "worker_1",
            "role=worker rank=4 world=5 local=4 sid=- wid=1",
        ),
    ];
    for (name, file, head) in expected {
        let line = format!("{head} ns=2 nw=2 addr={addr} restart=0");
        assert!(console.contains(&format!("[{name}] {line}\n")), "{console}");
        let log = read(&dir.0.join(format!("logs/{file}.log")));
        assert!(log.contains(&line), "{log}");
    }
}

#[test]
fn a_ps_job_shares_one_secret_that_is_fresh_or_given_and_never_printed() {
    let dir = Scratch::new("launch-secret");
    let secrets = dir.0.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    // Each process writes the secret it got (none: `-`) to a file of its rank and run.
    let script = |run: &str| {
        format!(
            "printf %s \"${{TESSERA_JOB_SECRET--}}\" > {dir}/{run}_$TESSERA_RANK",
            dir = s(&secrets)
        )
    };
    let read_run = |run: &str, ranks: usize| -> Vec<String> {
        (0..ranks)
            .map(|rank| read(&secrets.join(format!("{run}_{rank}"))))
            .collect()
    };
    let fresh = |run: &str| {
        let script = workers_after_the_others(&dir.0.join(run), 1, &script(run));
        let out = launch_sh(&dir.0, &["--nproc", "2", "--ps-servers", "1"], &script);
        assert_ok(&out);
        let got = read_run(run, 4);
        assert!(
            got.iter().all(|g| g == &got[0]),
            "one secret per job: {got:?}"
        );
        assert!(
            got[0].len() == 64 && got[0].chars().all(|c| c.is_ascii_hexdigit()),
            "{got:?}"
        );
        assert!(!stdout(&out).contains(&got[0]) && !stderr(&out).contains(&got[0]));
        got[0].clone()
    };
    assert_ne!(fresh("first"), fresh("second"), "each job makes its own");
    // A secret in the launcher's environment is the job's (launches on several hosts share it).
    let given = "a-secret-shared-by-two-hosts";
    let script_given = workers_after_the_others(&dir.0.join("given"), 1, &script("given"));
    let logs = dir.0.join("logs");
    let mut command = launch_command(
        &dir.0,
        &[
            "--log-dir",
            s(&logs),
            "--nproc",
            "2",
            "--ps-servers",
            "1",
            "--",
            "sh",
            "-c",
            &script_given,
        ],
    );
    command.env("TESSERA_JOB_SECRET", given);
    assert_ok(&finish(command.spawn().unwrap()));
    assert_eq!(read_run("given", 4), vec![given.to_string(); 4]);
    // Too short a secret is refused before anything starts, naming the variable.
    let mut command = launch_command(&dir.0, &["--nproc", "1", "--ps-servers", "1", "--", "true"]);
    command.env("TESSERA_JOB_SECRET", "short");
    let out = finish(command.spawn().unwrap());
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("TESSERA_JOB_SECRET"),
        "{}",
        stderr(&out)
    );
    // A job of workers only has no secret, even if the launcher's environment holds one.
    let mut command = launch_command(
        &dir.0,
        &[
            "--log-dir",
            s(&logs),
            "--nproc",
            "1",
            "--",
            "sh",
            "-c",
            &script("plain"),
        ],
    );
    command.env("TESSERA_JOB_SECRET", given);
    assert_ok(&finish(command.spawn().unwrap()));
    assert_eq!(read_run("plain", 1), vec!["-".to_string()]);
}

#[test]
fn a_given_scheduler_address_is_passed_on() {
    let dir = Scratch::new("launch-env-addr");
    let out = launch_sh(
        &dir.0,
        &[
            "--nproc",
            "1",
            "--ps-servers",
            "1",
            "--scheduler-addr",
            "tessera-scheduler.default.svc:50051",
        ],
        &workers_after_the_others(&dir.0, 1, "echo \"addr=$TESSERA_SCHEDULER_ADDR\""),
    );
    assert_ok(&out);
    let console = stdout(&out);
    for name in ["scheduler 0", "server 0", "worker 0"] {
        assert!(
            console.contains(&format!(
                "[{name}] addr=tessera-scheduler.default.svc:50051\n"
            )),
            "{console}"
        );
    }
}

#[test]
fn stdout_and_stderr_go_to_the_log_and_the_console_line_by_line() {
    let dir = Scratch::new("launch-logs");
    let logs = dir.0.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    // What is already in the log directory stays: logs are appended to.
    std::fs::write(logs.join("worker_0.log"), "from an earlier run\n").unwrap();
    std::fs::write(logs.join("notes.txt"), "not ours\n").unwrap();
    // Four workers each write 200 lines of 3000 copies of their id, alternating stdout and
    // stderr, at the same time: every console line must be one whole line of one worker.
    let script = "i=0; line=$(printf \"%3000s\" \"\" | tr \" \" \"$TESSERA_WORKER_ID\"); \
        while [ $i -lt 100 ]; do echo \"$line\"; echo \"$line\" >&2; i=$((i+1)); done; \
        echo \"out of $TESSERA_WORKER_ID\"; echo \"err of $TESSERA_WORKER_ID\" >&2";
    let out = launch_sh(&dir.0, &["--nproc", "4"], script);
    assert_ok(&out);
    let console = stdout(&out);
    let mut counts = [0usize; 4];
    for line in console.lines() {
        let (prefix, text) = line.split_once("] ").expect("a prefixed line");
        let id: usize = prefix.strip_prefix("[worker ").unwrap().parse().unwrap();
        if text.starts_with("out of") || text.starts_with("err of") {
            assert_eq!(text[7..].trim(), id.to_string());
            continue;
        }
        let digit = char::from(b'0' + id as u8);
        assert!(
            text.len() == 3000 && text.chars().all(|c| c == digit),
            "an interleaved line from worker {id}: {text:.80}…"
        );
        counts[id] += 1;
    }
    assert_eq!(counts, [200; 4]);
    for id in 0..4 {
        let log = read(&logs.join(format!("worker_{id}.log")));
        assert!(log.contains(&format!("out of {id}\n")), "stdout in the log");
        assert!(log.contains(&format!("err of {id}\n")), "stderr in the log");
        assert!(
            console.contains(&format!("[worker {id}] err of {id}\n")),
            "stderr in the console view"
        );
        assert_eq!(log.lines().filter(|l| l.len() == 3000).count(), 200);
    }
    let kept = read(&logs.join("worker_0.log"));
    assert!(kept.starts_with("from an earlier run\n"), "{kept:.200}");
    assert_eq!(read(&logs.join("notes.txt")), "not ours\n");
}

#[test]
fn the_default_log_directory_is_created_in_the_working_directory() {
    let dir = Scratch::new("launch-default-logs");
    // The process's stdin is closed: `read` finds its end at once.
    let script = "echo hello; if read line; then echo got input; else echo stdin closed; fi";
    let args = ["--nproc", "1", "--", "sh", "-c", script];
    let out = finish(launch_command(&dir.0, &args).spawn().unwrap());
    assert_ok(&out);
    let log = read(&dir.0.join("tessera_logs/worker_0.log"));
    assert!(log.contains("hello\nstdin closed\n"), "{log}");
}

#[test]
fn a_failing_process_stops_the_job_with_its_log_tail() {
    let dir = Scratch::new("launch-fail");
    let pid_file = dir.0.join("sleeper.pid");
    // Worker 0 sleeps for ten minutes; worker 1 waits until it runs, then fails.
    let script = format!(
        "if [ \"$TESSERA_WORKER_ID\" = 0 ]; then echo $$ > {pid}; exec sleep 600; fi; \
         while [ ! -s {pid} ]; do sleep 0.05; done; \
         echo \"worker one's last words\"; echo 'on stderr too' >&2; exit 3",
        pid = s(&pid_file)
    );
    let out = launch_sh(&dir.0, &["--nproc", "2"], &script);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("[launch] worker 1 (rank 1) failed: exit status: 3"),
        "{err}"
    );
    assert!(
        err.contains("[worker 1] worker one's last words\n"),
        "the log tail: {err}"
    );
    assert!(err.contains("[worker 1] on stderr too\n"), "{err}");
    assert!(err.contains("error: worker 1 (rank 1) failed"), "{err}");
    let sleeper = wait_for_pid(&pid_file);
    assert!(!alive(sleeper), "the sleeping worker was stopped");
}

#[test]
fn a_process_killed_by_a_signal_is_a_failure() {
    let dir = Scratch::new("launch-killed");
    let out = launch_sh(&dir.0, &["--nproc", "1"], "kill -KILL $$");
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("worker 0 (rank 0) failed: signal: 9 (SIGKILL)"),
        "{err}"
    );
}

#[test]
fn a_process_that_ignores_sigterm_gets_sigkill_after_the_grace_period() {
    let dir = Scratch::new("launch-stubborn");
    let pid_file = dir.0.join("stubborn.pid");
    let script = format!(
        "if [ \"$TESSERA_WORKER_ID\" = 0 ]; then trap '' TERM; echo $$ > {pid}; exec sleep 600; fi; \
         while [ ! -s {pid} ]; do sleep 0.05; done; exit 1",
        pid = s(&pid_file)
    );
    let out = launch_sh(&dir.0, &["--nproc", "2", "--grace-period", "1"], &script);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("worker 0 still running 1 s after it was told to stop; sending SIGKILL"),
        "{err}"
    );
    assert!(!alive(wait_for_pid(&pid_file)));
}

/// Fails on the first start only.
const FAIL_FIRST: &str =
    "echo \"start $TESSERA_RESTART_COUNT\"; [ \"$TESSERA_RESTART_COUNT\" -ge 1 ] || exit 7";

#[test]
fn a_failed_worker_is_restarted_with_its_restart_count() {
    let dir = Scratch::new("launch-restart");
    let out = launch_sh(&dir.0, &["--nproc", "2", "--restarts", "1"], FAIL_FIRST);
    assert_ok(&out);
    let err = stderr(&out);
    for id in 0..2 {
        assert!(
            err.contains(&format!(
                "[launch] worker {id} (rank {id}) failed (exit status: 7); restarting it (1 of 1)"
            )),
            "{err}"
        );
        let log = read(&dir.0.join(format!("logs/worker_{id}.log")));
        assert!(
            log.contains("start 0\n") && log.contains("start 1\n"),
            "{log}"
        );
        assert!(!log.contains("start 2"), "{log}");
    }
    // Without restarts the same job fails: the restart is what made it pass.
    let again = Scratch::new("launch-no-restart");
    let out = launch_sh(&again.0, &["--nproc", "2"], FAIL_FIRST);
    assert!(!out.status.success());
}

#[test]
fn restarts_are_counted_per_process_and_run_out() {
    let dir = Scratch::new("launch-restart-out");
    let out = launch_sh(
        &dir.0,
        &["--nproc", "1", "--restarts", "2"],
        "echo \"start $TESSERA_RESTART_COUNT\"; exit 4",
    );
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("restarting it (2 of 2)"), "{err}");
    assert!(
        err.contains("worker 0 (rank 0) failed: exit status: 4"),
        "{err}"
    );
    let log = read(&dir.0.join("logs/worker_0.log"));
    let starts: Vec<&str> = log.lines().filter(|l| l.starts_with("start ")).collect();
    assert_eq!(starts, ["start 0", "start 1", "start 2"]);
}

#[test]
fn a_failed_server_is_restarted_but_the_scheduler_is_not() {
    let dir = Scratch::new("launch-restart-ps");
    // The server fails on its first start and marks its second; the worker waits for the mark.
    let mark = dir.0.join("server-restarted");
    let script = format!(
        "echo \"start $TESSERA_RESTART_COUNT\"; \
         if [ \"$TESSERA_ROLE\" = server ]; then [ \"$TESSERA_RESTART_COUNT\" = 0 ] && exit 2; \
         touch {mark}; fi; \
         if [ \"$TESSERA_ROLE\" = worker ]; then while [ ! -e {mark} ]; do sleep 0.05; done; fi",
        mark = s(&mark)
    );
    let script = script.as_str();
    let out = launch_sh(
        &dir.0,
        &["--nproc", "1", "--ps-servers", "1", "--restarts", "1"],
        script,
    );
    assert_ok(&out);
    let server = read(&dir.0.join("logs/server_0.log"));
    assert!(
        server.contains("start 0\n") && server.contains("start 1\n"),
        "{server}"
    );

    let dir = Scratch::new("launch-scheduler-fails");
    let script = "echo \"start $TESSERA_RESTART_COUNT\"; \
        if [ \"$TESSERA_ROLE\" = scheduler ]; then exit 6; fi; exec sleep 600";
    let out = launch_sh(
        &dir.0,
        &["--nproc", "1", "--ps-servers", "1", "--restarts", "3"],
        script,
    );
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("scheduler 0 (rank 0) failed: exit status: 6"),
        "{err}"
    );
    let scheduler = read(&dir.0.join("logs/scheduler_0.log"));
    assert!(
        !scheduler.contains("start 1"),
        "never restarted: {scheduler}"
    );
}

#[test]
fn when_every_worker_is_done_the_scheduler_and_servers_are_stopped() {
    let dir = Scratch::new("launch-ps-done");
    let marks = dir.0.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    // The scheduler and servers mark that their SIGTERM trap is set, then wait for ever; the
    // workers finish once all three are waiting.
    let script = format!(
        "if [ \"$TESSERA_ROLE\" != worker ]; then trap 'echo asked to stop; exit 0' TERM; \
         touch {marks}/$TESSERA_RANK; sleep 600 & wait; exit 9; fi; \
         while [ \"$(ls {marks} | wc -l)\" -lt 3 ]; do sleep 0.05; done; echo trained",
        marks = s(&marks)
    );
    let script = script.as_str();
    let out = launch_sh(&dir.0, &["--nproc", "2", "--ps-servers", "2"], script);
    assert_ok(&out);
    assert!(stderr(&out).contains("every worker finished; stopping the scheduler and servers"));
    for file in ["scheduler_0", "server_0", "server_1"] {
        let log = read(&dir.0.join(format!("logs/{file}.log")));
        assert!(log.contains("asked to stop\n"), "{file}: {log}");
    }
}

#[test]
fn signals_to_the_launcher_reach_every_process() {
    for (signal, name) in [(libc::SIGTERM, "TERM"), (libc::SIGINT, "INT")] {
        let dir = Scratch::new(&format!("launch-signal-{name}"));
        let logs = dir.0.join("logs");
        // Each worker runs a `sleep` in the foreground (in the worker's process group, so the
        // signal reaches it too), then records that it got the signal and ends.
        let script = format!(
            "trap 'echo got {name}; exit 0' {name}; echo $$ > {dir}/pid_$TESSERA_WORKER_ID; \
             sh -c 'echo $$ > {dir}/sleep_'$TESSERA_WORKER_ID'; exec sleep 600'; echo sleep ended",
            dir = s(&dir.0)
        );
        let args = [
            "--log-dir",
            s(&logs),
            "--nproc",
            "2",
            "--",
            "sh",
            "-c",
            &script,
        ];
        let child = launch_command(&dir.0, &args).spawn().unwrap();
        let mut pids = Vec::new();
        for id in 0..2 {
            pids.push(wait_for_pid(&dir.0.join(format!("pid_{id}"))));
            pids.push(wait_for_pid(&dir.0.join(format!("sleep_{id}"))));
        }
        // SAFETY: kill(2) on the launcher this test started.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let out = finish(child);
        assert_eq!(out.status.code(), Some(128 + signal), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("interrupted by signal"),
            "{}",
            stderr(&out)
        );
        for id in 0..2 {
            let log = read(&logs.join(format!("worker_{id}.log")));
            assert!(log.contains(&format!("got {name}\n")), "{log}");
        }
        for pid in pids {
            assert!(!alive(pid), "process {pid} outlived the launcher ({name})");
        }
    }
}

#[test]
fn sigkill_of_the_launcher_takes_every_process_with_it() {
    let dir = Scratch::new("launch-sigkill");
    let logs = dir.0.join("logs");
    // Every process of a PS job (scheduler, server, two workers) records its pid, then becomes
    // a sleeper with that pid.
    let script = format!(
        "echo $$ > {dir}/pid_$TESSERA_RANK; exec sleep 600",
        dir = s(&dir.0)
    );
    let args = [
        "--log-dir",
        s(&logs),
        "--nproc",
        "2",
        "--ps-servers",
        "1",
        "--",
        "sh",
        "-c",
        &script,
    ];
    let child = launch_command(&dir.0, &args).spawn().unwrap();
    let pids: Vec<libc::pid_t> = (0..4)
        .map(|rank| wait_for_pid(&dir.0.join(format!("pid_{rank}"))))
        .collect();
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    let out = finish(child);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGKILL)
    );
    wait_until_gone(&pids, HANG_GUARD, "SIGKILL of tessera launch");
}

#[test]
fn launch_runs_tessera_train() {
    let dir = Scratch::new("launch-train");
    let logs = dir.0.join("logs");
    let output_dir = format!("output.dir=\"{}\"", s(&dir.0.join("run")));
    let args = [
        "--nproc",
        "1",
        "--log-dir",
        s(&logs),
        "--",
        tessera_path(),
        "train",
        "examples/seed_stand_alone.toml",
        "--set",
        "train.max_steps=3",
        "--set",
        &output_dir,
    ];
    let out = finish(
        launch_command(&crate::util::repo_root(), &args)
            .spawn()
            .unwrap(),
    );
    assert_ok(&out);
    let console = stdout(&out);
    assert!(
        console.contains("[worker 0] epoch: 1 step: 3, loss is "),
        "{console}"
    );
    let log = read(&logs.join("worker_0.log"));
    assert!(log.contains("epoch: 1 step: 3, loss is "), "{log}");
    assert!(dir.0.join("run/rank_0/checkpoint_0.safetensors").is_file());
}

#[test]
fn bad_arguments_are_refused_before_anything_starts() {
    let dir = Scratch::new("launch-args");
    let logs = dir.0.join("logs");
    let cases: [(&[&str], &str); 9] = [
        (
            &["--nproc", "0", "--", "true"],
            "--nproc must be between 1 and 1024, got 0",
        ),
        (
            &["--nproc", "1025", "--", "true"],
            "--nproc must be between 1 and 1024, got 1025",
        ),
        (&["--nproc", "-3", "--", "true"], "--nproc"),
        (&["--nproc", "2"], "<COMMAND>"),
        (
            &["--nproc", "1", "--ps-servers", "0", "--", "true"],
            "--ps-servers must be between 1 and 1024, got 0",
        ),
        (
            &["--nproc", "1", "--scheduler-addr", "h:1", "--", "true"],
            "--scheduler-addr needs --ps-servers",
        ),
        (
            &[
                "--nproc",
                "1",
                "--ps-servers",
                "1",
                "--scheduler-addr",
                "nohost",
                "--",
                "true",
            ],
            "--scheduler-addr must be HOST:PORT",
        ),
        (
            &["--nproc", "1", "--restarts", "5000", "--", "true"],
            "--restarts must be at most 1000",
        ),
        (
            &["--nproc", "1", "--master_port", "0", "--", "true"],
            "0 is not in 1..=65535",
        ),
    ];
    for (args, needle) in cases {
        let mut all = vec!["--log-dir", s(&logs)];
        all.extend_from_slice(args);
        let out = finish(launch_command(&dir.0, &all).spawn().unwrap());
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
        assert!(!logs.exists(), "{args:?} created the log directory");
    }
}

#[test]
fn a_command_that_cannot_start_is_reported() {
    let dir = Scratch::new("launch-nocommand");
    let logs = dir.0.join("logs");
    let args = [
        "--log-dir",
        s(&logs),
        "--nproc",
        "2",
        "--",
        "/nonexistent/tessera-x",
    ];
    let out = finish(launch_command(&dir.0, &args).spawn().unwrap());
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("cannot start worker 0 (rank 0): /nonexistent/tessera-x: No such file"),
        "{err}"
    );
}

#[test]
fn a_stray_background_process_holding_the_output_does_not_hold_the_launcher() {
    let dir = Scratch::new("launch-stray");
    let pid_file = dir.0.join("stray.pid");
    // The worker leaves a sleeper behind that keeps its stdout open, and exits 0.
    let script = format!(
        "sh -c 'echo $$ > {pid}; exec sleep 600' & echo started; \
         while [ ! -s {pid} ]; do sleep 0.05; done",
        pid = s(&pid_file)
    );
    let out = launch_sh(&dir.0, &["--nproc", "1"], &script);
    let stray = wait_for_pid(&pid_file);
    // The launcher does not follow what a process left behind: stop it here.
    // SAFETY: kill(2) on the sleeper this test started.
    unsafe { libc::kill(stray, libc::SIGKILL) };
    assert_ok(&out);
    assert!(stdout(&out).contains("[worker 0] started\n"));
}

/// `tessera rank-env` turns an MPI launcher's rank variables (OpenMPI's, given here by hand)
/// into the contract plus MindSpore's names and `TESSERA_BACKEND=mpi`, removes contract
/// variables that do not apply, and runs the command, ending as it ended; outside an MPI
/// launcher, or with a command that cannot start, it says so.
#[test]
fn rank_env_maps_an_mpi_launchers_rank_to_the_contract() {
    let script = "echo \"rank=$TESSERA_RANK world=$TESSERA_WORLD_SIZE local=$TESSERA_LOCAL_RANK wid=$TESSERA_WORKER_ID id=$RANK_ID size=$RANK_SIZE device=$DEVICE_ID backend=$TESSERA_BACKEND addr=${TESSERA_SCHEDULER_ADDR--}\"; exit 7";
    let out = tessera_command()
        .args(["rank-env", "--", "sh", "-c", script])
        .env("OMPI_COMM_WORLD_RANK", "2")
        .env("OMPI_COMM_WORLD_SIZE", "4")
        .env("OMPI_COMM_WORLD_LOCAL_RANK", "0")
        .env("TESSERA_SCHEDULER_ADDR", "leaked:1")
        .output()
        .unwrap();
    assert_eq!(
        stdout(&out),
        "rank=2 world=4 local=0 wid=2 id=2 size=4 device=0 backend=mpi addr=-\n"
    );
    // The command's exit status is rank-env's, and its failure is reported on stderr.
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("tessera rank-env: the command failed (exit code 7)"),
        "{}",
        stderr(&out)
    );
    // What the command left running (here a process ignoring SIGTERM) ends with the rank.
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("left");
    let script = format!(
        "sh -c 'trap \"\" TERM; echo $$ > {}; exec sleep 100' >/dev/null 2>&1 & while [ ! -s {} ]; do sleep 0.05; done; exit 0",
        pid_file.display(),
        pid_file.display()
    );
    let out = tessera_command()
        .args(["rank-env", "--", "sh", "-c", &script])
        .env("PMI_RANK", "0")
        .env("PMI_SIZE", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let left: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{left}")).exists(),
        "process {left}, left by the command, outlived rank-env"
    );
    // Orphans that end while the command runs are reaped then, not left zombies until the end:
    // the command checks its parent (rank-env) has no zombie child after 20 orphans ended.
    let script = "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do (true &); done; sleep 1; zombies=0; for s in /proc/[0-9]*/stat; do set -- $(cat $s 2>/dev/null); [ \"$4\" = \"$PPID\" ] && [ \"$3\" = Z ] && zombies=$((zombies+1)); done; echo zombies=$zombies";
    let out = tessera_command()
        .args(["rank-env", "--", "sh", "-c", script])
        .env("PMI_RANK", "0")
        .env("PMI_SIZE", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "zombies=0\n", "{}", stderr(&out));
    // A command ended by a signal ends rank-env by the same signal.
    let out = tessera_command()
        .args(["rank-env", "--", "sh", "-c", "kill -TERM $$"])
        .env("PMI_RANK", "0")
        .env("PMI_SIZE", "1")
        .output()
        .unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGTERM),
        "{out:?}"
    );
    assert!(
        stderr(&out).contains("the command failed (signal 15)"),
        "{}",
        stderr(&out)
    );

    // A signal to rank-env reaches the command, which may handle it: rank-env then ends as
    // the command does (here with 0, after the command's own clean-up).
    let mut child = tessera_command()
        .args([
            "rank-env",
            "--",
            "sh",
            "-c",
            "trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
        ])
        .env("PMI_RANK", "0")
        .env("PMI_SIZE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut stdout_pipe = child.stdout.take().unwrap();
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(&mut stdout_pipe, &mut ready).unwrap();
    assert_eq!(&ready, b"ready\n");
    // SAFETY: kill(2) with the pid of a child this test started and has not reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    child.stdout = Some(stdout_pipe);
    let out = wait_or_kill(child, HANG_GUARD).expect("rank-env ends as its command does");
    assert_eq!(stdout(&out), "got TERM\n", "{}", stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let out = tessera_command()
        .args(["rank-env", "--", "true"])
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("PMI_RANK")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("OMPI_COMM_WORLD_RANK"),
        "{}",
        stderr(&out)
    );

    let out = tessera_command()
        .args(["rank-env", "--", "/nonexistent/tessera-command"])
        .env("PMI_RANK", "0")
        .env("PMI_SIZE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot run /nonexistent/tessera-command for rank 0"),
        "{}",
        stderr(&out)
    );
}

/// `tessera train` takes `TESSERA_BACKEND` as its `--backend` when none is given: a build
/// without MPI then says how to get one.
#[cfg(not(feature = "mpi"))]
#[test]
fn train_takes_its_backend_from_the_environment() {
    let out = tessera_command()
        .args(["train", "examples/seed_stand_alone.toml"])
        .env("TESSERA_BACKEND", "mpi")
        .current_dir(crate::util::repo_root())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--backend mpi needs a tessera built with"),
        "{}",
        stderr(&out)
    );
}
