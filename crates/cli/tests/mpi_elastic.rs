//! Elastic collective training (`train.elastic`) under `tessera launch` (built with `--features
//! mpi`): a rank killed (SIGKILL) at the start of a step, before its update, inside a snapshot
//! or from outside, with data × model parallel, pipeline stages and hsdp; a node's launcher
//! killed and replaced; a shard lost with its copy. Each run finishes with parameters bitwise
//! equal (`tessera ckpt diff`) to the same run that never failed, in deterministic mode.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::mpi_launch::{
    exe, finish, free_port, launch, launched, processes_mentioning, small_gpt, stderr,
};
use crate::mpi_train::args;
use crate::util::{assert_ok, repo_root, s, tessera_command, Scratch};

/// The small GPT on 4 ranks in deterministic mode, `steps` steps, with `layout`'s sets.
fn gpt(dir: &Path, name: &str, layout: &[&str], steps: u64, elastic: bool) -> Vec<String> {
    let steps = format!("train.max_steps={steps}");
    let mut sets = vec!["train.deterministic=true", steps.as_str()];
    sets.extend(layout);
    if elastic {
        sets.extend(["train.elastic=true", "train.elastic_interval=4"]);
    }
    small_gpt(dir, name, &sets)
}

/// The same run on threads, never interrupted: the reference.
fn reference(dir: &Path, layout: &[&str], steps: u64) {
    let cmd = gpt(dir, "reference", layout, steps, false);
    let out = tessera_command()
        .args(args(&cmd))
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert_ok(&out);
}

/// `tessera ckpt diff` of the run `name` against the reference: bitwise equal.
fn assert_bitwise(dir: &Path, name: &str) {
    let out = tessera_command()
        .args(["ckpt", "diff"])
        .arg(dir.join("reference"))
        .arg(dir.join(name))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name} differs from the run that never failed:\n{text}"
    );
    assert!(text.contains(" 0 different"), "{text}");
}

const DP_MP: &[&str] = &[
    "parallel.data_parallel=2",
    "parallel.model_parallel=2",
    "parallel.vocab_emb_dp=false",
];
/// With clipping, so the ranks' update starts with the global-norm all-reduce: a rank killed
/// before its update leaves the others inside that all-reduce.
const PIPELINE: &[&str] = &[
    "parallel.model_parallel=1",
    "parallel.pipeline={ stages = 2, micro_batches = 4 }",
    "train.max_grad_norm=1.0",
];
const HSDP: &[&str] = &[
    "parallel.data_parallel=4",
    "parallel.model_parallel=1",
    "parallel.hsdp={ optimizer_level = \"level2\", threshold = 0 }",
];

/// A rank that kills itself (`TESSERA_FAULT`) at the start of step 7 (the others inside the
/// step's forward collectives), before the update of step 6 (the others inside clipping's
/// all-reduce), or inside the snapshot of step 8 (the others exchanging the copies): the launcher starts the job again, it resumes from the
/// in-memory snapshot of step 4, and finishes bitwise equal to the run that never failed.
#[test]
fn a_killed_rank_resumes_from_memory_to_the_bits_of_an_unbroken_run() {
    let cases: [(&str, &[&str], &str); 3] = [
        ("dp-mp", DP_MP, "rank=2,step=7,at=forward"),
        ("pipeline", PIPELINE, "rank=3,step=6,at=update"),
        ("hsdp", HSDP, "rank=1,step=8,at=snapshot"),
    ];
    for (name, layout, fault) in cases {
        let dir = Scratch::new(&format!("mpi-elastic-{name}"));
        reference(&dir.0, layout, 12);
        let mut cmd = vec![exe().to_string()];
        cmd.extend(gpt(&dir.0, "killed", layout, 12, true));
        let logs = dir.0.join("logs");
        let out = launched(
            launch(
                &["--nproc", "4", "--restarts", "1", "--log-dir", s(&logs)],
                &args(&cmd),
            )
            .env("TESSERA_FAULT", fault),
        );
        assert_ok(&out);
        let console = String::from_utf8_lossy(&out.stdout);
        assert!(
            stderr(&out).contains("starting the job again (1 of 1 restarts)"),
            "{name}"
        );
        assert!(
            console.contains("elastic: resuming from the in-memory snapshot of step 4"),
            "{name}: {console}"
        );
        assert_bitwise(&dir.0, "killed");
    }
}

/// A rank SIGKILLed from outside while the job trains: the same recovery.
#[test]
fn a_rank_killed_from_outside_is_recovered_bitwise() {
    let dir = Scratch::new("mpi-elastic-outside");
    reference(&dir.0, DP_MP, 24);
    let mut cmd = vec![exe().to_string()];
    cmd.extend(gpt(&dir.0, "killed", DP_MP, 24, true));
    let logs = dir.0.join("logs");
    let child = launch(
        &["--nproc", "4", "--restarts", "1", "--log-dir", s(&logs)],
        &args(&cmd),
    )
    .spawn()
    .unwrap();
    let start = Instant::now();
    let log0 = logs.join("worker_0.log");
    while !std::fs::read_to_string(&log0).is_ok_and(|t| t.contains("step: 9,")) {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the run never reached step 9"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // One of the ranks: a `tessera train` writing into this run's output.
    let marker = s(&dir.0.join("killed\"")).to_string();
    let victims = processes_mentioning(&marker);
    let rank_command = format!("{} train ", exe());
    let pid: i32 = victims
        .iter()
        .filter_map(|p| p.split_once(": "))
        .find(|(_, command)| command.starts_with(&rank_command))
        .and_then(|(pid, _)| pid.parse().ok())
        .expect("a rank's process");
    // SAFETY: kill(2) on a rank this test's job started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let out = finish(child);
    assert_ok(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("elastic: resuming from the in-memory snapshot of step"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_bitwise(&dir.0, "killed");
}

/// Starts node `rank` of a `nodes`-node job of 4 ranks on loopback at `port`.
fn node(
    dir: &Path,
    port: &str,
    nodes: usize,
    rank: usize,
    cmd: &[String],
    extra_env: &[(&str, &str)],
) -> std::process::Child {
    node_command(dir, port, nodes, rank, cmd, extra_env)
        .spawn()
        .unwrap()
}

/// The command [`node`] spawns.
fn node_command(
    dir: &Path,
    port: &str,
    nodes: usize,
    rank: usize,
    cmd: &[String],
    extra_env: &[(&str, &str)],
) -> std::process::Command {
    let local = (4 / nodes).to_string();
    let rank_text = rank.to_string();
    let logs = dir.join(format!("logs{rank}"));
    let mut c = launch(
        &[
            "--worker_num",
            "4",
            "--local_worker_num",
            &local,
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            port,
            "--node_rank",
            &rank_text,
            "--restarts",
            "1",
            "--cluster_time_out",
            "120",
            "--log_dir",
            s(&logs),
        ],
        &args(cmd),
    );
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c
}

/// Waits until node 0's rank 0 has logged `step`.
fn wait_for_step(dir: &Path, step: u64) {
    let log0 = dir.join("logs0/worker_0.log");
    let start = Instant::now();
    let want = format!("step: {step},");
    while !std::fs::read_to_string(&log0).is_ok_and(|t| t.contains(&want)) {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the run never reached step {step}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The elastic stores in /dev/shm whose launcher is `pid`.
fn stores_of(pid: u32) -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            std::fs::read_to_string(p.join(".tessera-launch-owner"))
                .is_ok_and(|o| o.split_whitespace().next() == Some(&pid.to_string()))
        })
        .collect()
}

/// Node 1's launcher killed (SIGKILL) mid-run takes its ranks and its store with it; the same
/// command started again joins in its place, its ranks' shards come from the copies node 0
/// kept, and the run finishes bitwise equal to one that never failed. The killed launcher's
/// store is removed by the next launcher on the machine.
#[test]
fn a_lost_node_is_replaced_and_its_shards_come_from_the_copies() {
    let dir = Scratch::new("mpi-elastic-node");
    reference(&dir.0, DP_MP, 30);
    let mut cmd = vec![exe().to_string()];
    cmd.extend(gpt(&dir.0, "killed", DP_MP, 30, true));
    let port = free_port();
    let one = node(&dir.0, &port, 2, 1, &cmd, &[]);
    let zero = node(&dir.0, &port, 2, 0, &cmd, &[]);
    wait_for_step(&dir.0, 10);
    let killed = one.id();
    let orphan = stores_of(killed);
    assert_eq!(orphan.len(), 1, "node 1's store");
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(killed as i32, libc::SIGKILL) };
    let _ = finish(one);
    let again = node(&dir.0, &port, 2, 1, &cmd, &[]);
    let (zero, again) = (finish(zero), finish(again));
    assert_ok(&zero);
    assert_ok(&again);
    let console = String::from_utf8_lossy(&zero.stdout);
    assert!(
        stderr(&zero).contains("waiting for node(s) 1 to join again"),
        "{}",
        stderr(&zero)
    );
    assert!(
        console.contains("elastic: resuming from the in-memory snapshot of step"),
        "{console}"
    );
    assert!(console.contains("file(s) moved between nodes"), "{console}");
    assert_bitwise(&dir.0, "killed");
    assert!(
        !orphan[0].exists(),
        "the killed launcher's store was removed"
    );
}

/// SIGTERM to node 0's launcher while it waits for a lost node to join again ends the wait at
/// once: the launcher says so and exits 128 + 15, not when `--cluster_time_out` runs out.
#[test]
fn a_signal_ends_the_wait_for_a_lost_node() {
    let dir = Scratch::new("mpi-elastic-wait-signal");
    let mut cmd = vec![exe().to_string()];
    cmd.extend(gpt(&dir.0, "killed", DP_MP, 30, true));
    let port = free_port();
    let one = node(&dir.0, &port, 2, 1, &cmd, &[]);
    let err_path = dir.0.join("zero.err");
    let mut zero = node_command(&dir.0, &port, 2, 0, &cmd, &[]);
    zero.stderr(std::fs::File::create(&err_path).unwrap());
    let zero = zero.spawn().unwrap();
    wait_for_step(&dir.0, 4);
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(one.id() as i32, libc::SIGKILL) };
    let _ = finish(one);
    let start = Instant::now();
    let waiting = "waiting for node(s) 1 to join again";
    while !std::fs::read_to_string(&err_path).is_ok_and(|t| t.contains(waiting)) {
        assert!(
            start.elapsed() < Duration::from_secs(110),
            "node 0 never waited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let signalled = Instant::now();
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(zero.id() as i32, libc::SIGTERM) };
    let out = finish(zero);
    let took = signalled.elapsed();
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert!(took < Duration::from_secs(30), "took {took:?}: {err}");
    assert_eq!(out.status.code(), Some(143), "{err}");
    assert!(
        err.contains("got signal 15; no longer waiting for the nodes"),
        "{err}"
    );
}

/// Four nodes of one rank: killing nodes 1 and 2 loses rank 1's shard and its only copy (kept
/// by node 2). The restarted job says so and continues from the last periodic checkpoint on
/// disk, still bitwise equal to the run that never failed.
#[test]
fn losing_a_shard_and_its_copy_falls_back_to_disk() {
    let dir = Scratch::new("mpi-elastic-double");
    reference(&dir.0, DP_MP, 30);
    let mut cmd = vec![exe().to_string()];
    cmd.extend(gpt(&dir.0, "killed", DP_MP, 30, true));
    cmd.extend([
        "--set".to_string(),
        "output.save_checkpoint_steps=6".to_string(),
    ]);
    let port = free_port();
    let mut others: Vec<std::process::Child> = (1..4)
        .map(|k| node(&dir.0, &port, 4, k, &cmd, &[]))
        .collect();
    let zero = node(&dir.0, &port, 4, 0, &cmd, &[]);
    wait_for_step(&dir.0, 14);
    for child in &others[..2] {
        // SAFETY: kill(2) on launchers this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    }
    let three = others.pop().unwrap();
    for child in others {
        let _ = finish(child);
    }
    let again: Vec<std::process::Child> = (1..3)
        .map(|k| node(&dir.0, &port, 4, k, &cmd, &[]))
        .collect();
    let zero = finish(zero);
    assert_ok(&zero);
    for child in again.into_iter().chain([three]) {
        assert_ok(&finish(child));
    }
    let console = String::from_utf8_lossy(&zero.stdout);
    assert!(
        console.contains("no in-memory snapshot survived whole (a shard and its copy were both lost); resuming from the last periodic checkpoint on disk"),
        "{console}"
    );
    assert_bitwise(&dir.0, "killed");
}

/// A rank that hangs (alive, making no progress) at the start of step 7: the others' collectives
/// time out (`--timeout 5`), the job ends, and the restarted job resumes from the snapshot of
/// step 4, bitwise equal to the run that never failed.
#[test]
fn a_hung_rank_is_timed_out_and_recovered() {
    let dir = Scratch::new("mpi-elastic-hang");
    reference(&dir.0, DP_MP, 12);
    let mut cmd = vec![exe().to_string()];
    cmd.extend(gpt(&dir.0, "killed", DP_MP, 12, true));
    cmd.extend(["--timeout".to_string(), "5".to_string()]);
    let logs = dir.0.join("logs");
    let out = launched(
        launch(
            &["--nproc", "4", "--restarts", "1", "--log-dir", s(&logs)],
            &args(&cmd),
        )
        .env("TESSERA_FAULT", "rank=1,step=7,at=hang"),
    );
    assert_ok(&out);
    let console = String::from_utf8_lossy(&out.stdout);
    assert!(
        console.contains("rank 1 hangs at the start of step 7"),
        "{console}"
    );
    assert!(
        console.contains("elastic: resuming from the in-memory snapshot of step 4"),
        "{console}"
    );
    assert_bitwise(&dir.0, "killed");
}
