//! Failures with real processes (`tessera-ps-role`): a worker killed mid-run, a server killed
//! and restarted from its snapshot.

use std::path::Path;
use std::time::Duration;

use crate::util::{final_accuracy, loss_lines, ps_text, scheduler_addr, sigkill, RoleProcess};

const LIMIT: Duration = Duration::from_secs(120);

/// Starts every role of a job for the config file `config`.
fn start_job(config: &Path, servers: usize, workers: usize) -> (Vec<RoleProcess>, String) {
    let addr = scheduler_addr();
    let job = (0..1 + servers + workers)
        .map(|rank| {
            RoleProcess::start(
                config,
                &crate::util::role_env(rank, servers, workers, &addr),
            )
        })
        .collect();
    (job, addr)
}

fn write_config(dir: &Path, ps: &str, train: &str) -> std::path::PathBuf {
    let path = dir.join("ps.toml");
    std::fs::write(&path, ps_text(&dir.join("out"), ps, train)).unwrap();
    path
}

#[test]
fn a_killed_worker_leaves_the_job_to_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "servers = 1\nworkers = 3\nheartbeat_ms = 100\ndead_after_ms = 1500",
        "epochs = 5\nlearning_rate = 0.05\neval = true",
    );
    let (mut job, _) = start_job(&config, 1, 3);
    // Rank 0 scheduler, 1 server, 2..4 workers 0..2.
    assert!(
        job[2].wait_for_line("epoch: 1 step: 20,", LIMIT),
        "worker 0 reached step 20:\n{}",
        job[2].output()
    );
    sigkill(&job[4].child);
    let _ = job[4].finish(LIMIT);
    let ok: Vec<bool> = job.iter_mut().take(4).map(|p| p.finish(LIMIT)).collect();
    assert_eq!(
        ok,
        vec![true; 4],
        "scheduler:\n{}\nworker 0:\n{}",
        job[0].output(),
        job[2].output()
    );
    assert!(
        job[0].output().contains("worker 2 declared dead"),
        "{}",
        job[0].output()
    );
    let out = job[2].output();
    // The summary counts the workers that finished the job and names the one it lost.
    assert!(out.contains("trained 230 steps on 2 worker(s)"), "{out}");
    assert!(
        out.contains("worker 2 was lost at step ")
            && out.contains("the job finished on 2 worker(s)"),
        "{out}"
    );
    assert!(
        job[0]
            .output()
            .contains("the job is over; lost: worker 2 at step "),
        "{}",
        job[0].output()
    );
    let accuracy = final_accuracy(&out).expect("an accuracy line");
    eprintln!("after a killed worker: {accuracy} %");
    assert!(accuracy >= 90.0, "accuracy {accuracy} %");
}

#[test]
fn a_restarted_server_resumes_from_its_snapshot_and_replays() {
    restarted_server_replays("", "");
}

/// With one retry (a 50 ms backoff) the workers' retries run out long before a restarted
/// server is admitted (after about 2 × `ps.dead_after_ms`): they keep retrying it as long as
/// the scheduler waits for it to restart, and the job recovers. Before, every worker failed
/// with `Push to server 1 … failed after 2 attempt(s)` while the scheduler waited.
#[test]
fn a_restart_outlasting_the_workers_retries_is_waited_for() {
    let workers = restarted_server_replays("rpc_retries = 1\nrpc_timeout_ms = 4000", "");
    assert!(
        workers
            .iter()
            .any(|out| out.contains("retrying until it is back")),
        "no worker waited for the restart:\n{}",
        workers.join("\n")
    );
}

/// A server killed and never restarted: the workers wait for it while the scheduler does,
/// then every role fails, the workers naming the server and the scheduler's restart wait
/// (before, they gave up after `ps.rpc_retries`, saying only that the calls failed).
#[test]
fn a_server_nothing_restarts_fails_the_workers_naming_it_and_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "servers = 2\nworkers = 1\nheartbeat_ms = 50\ndead_after_ms = 300\nrpc_timeout_ms = 1000\nrpc_retries = 1",
        "epochs = 1\nmax_steps = 100000\neval = false",
    );
    let (mut job, _) = start_job(&config, 2, 1);
    // Rank 0 scheduler, 1..2 servers 0..1, 3 worker 0.
    assert!(
        job[3].wait_for_line("step: 5,", LIMIT),
        "worker 0 reached step 5:\n{}",
        job[3].output()
    );
    sigkill(&job[2].child);
    let _ = job[2].finish(LIMIT);
    let ok: Vec<bool> = [0, 1, 3].iter().map(|&i| job[i].finish(LIMIT)).collect();
    let (scheduler, worker) = (job[0].output(), job[3].output());
    assert!(!ok[0], "the scheduler fails the job:\n{scheduler}");
    assert!(!ok[2], "worker 0 fails:\n{worker}");
    assert!(
        scheduler.contains(
            "server 1 was declared dead (no heartbeat) and did not register again within 2 s"
        ),
        "{scheduler}"
    );
    let error = worker
        .lines()
        .find(|l| l.starts_with("error:") && l.contains("to server 1 at "))
        .unwrap_or_else(|| panic!("no error line:\n{worker}"));
    eprintln!("{error}");
    assert!(error.contains("restart wait"), "{error}");
    assert!(
        worker.contains("retrying until it is back"),
        "worker 0 did not wait:\n{worker}"
    );
}

/// With sync clipping, a restarted server replays steps whose global norm it no longer
/// knows: the workers hand it the norms they kept, and the run is still the uninterrupted one.
#[test]
fn a_restarted_server_replays_clipped_steps_with_the_kept_norms() {
    restarted_server_replays("", "max_grad_norm = 0.05");
}

/// Kills server 1 of a 2-server, 2-worker sync job (`train` its extra `[train]` keys) at step
/// 12, restarts it, and checks that it recovers from its snapshot by replay, losing nothing;
/// `ps` holds extra `[ps]` keys. Returns the workers' output.
fn restarted_server_replays(ps: &str, train: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let steps = 40;
    let config = write_config(
        dir.path(),
        &format!("servers = 2\nworkers = 2\ncheckpoint_every = 5\nheartbeat_ms = 100\ndead_after_ms = 1500\n{ps}"),
        &format!("epochs = 1\nmax_steps = {steps}\neval = false\n{train}"),
    );
    let (mut job, addr) = start_job(&config, 2, 2);
    // Rank 0 scheduler, 1..2 servers 0..1, 3..4 workers 0..1.
    assert!(
        job[3].wait_for_line("epoch: 1 step: 12,", LIMIT),
        "worker 0 reached step 12:\n{}",
        job[3].output()
    );
    sigkill(&job[2].child);
    let _ = job[2].finish(LIMIT);
    let mut env = crate::util::role_env(2, 2, 2, &addr);
    for (k, v) in env.iter_mut() {
        if k == "TESSERA_RESTART_COUNT" {
            *v = "1".to_string();
        }
    }
    let mut restarted = RoleProcess::start(&config, &env);
    let ok: Vec<bool> = [0, 1, 3, 4].iter().map(|&i| job[i].finish(LIMIT)).collect();
    assert!(
        restarted.finish(LIMIT),
        "restarted server:\n{}\nscheduler:\n{}\nworker 0:\n{}\nworker 1:\n{}",
        restarted.output(),
        job[0].output(),
        job[3].output(),
        job[4].output()
    );
    assert_eq!(ok, vec![true; 4], "worker 0:\n{}", job[3].output());
    let server = restarted.output();
    assert!(
        server.contains("restarted from the snapshot at version"),
        "{server}"
    );
    let recovered = server
        .lines()
        .find(|l| l.contains("recovered:"))
        .unwrap_or_else(|| panic!("no recovery line:\n{server}"));
    eprintln!("{recovered}");
    assert!(recovered.contains("lost 0 step(s)"), "{recovered}");
    let replayed: u64 = recovered
        .split("replayed ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a replayed count");
    assert!(replayed >= 1, "{recovered}");
    // The server reports after the first live step, not at the first replay, so it counts the
    // steps the workers replayed: the worker with the most kept gradients sent at most one more
    // (its last may cross with a live push of the same step, which completes that step as live).
    let sent = |out: String| -> u64 {
        out.lines()
            .filter_map(|l| l.split("replaying ").nth(1))
            .filter_map(|t| t.split(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let most = sent(job[3].output()).max(sent(job[4].output()));
    assert!(
        replayed <= most && replayed + 1 >= most,
        "{recovered} (workers sent up to {most})"
    );
    // Snapshot plus replay lose nothing: the losses are an uninterrupted run's.
    let losses = loss_lines(&job[3].output());
    assert_eq!(losses.len(), steps);
    let reference = crate::util::run_in_process(
        &crate::util::ps_config(
            &dir.path().join("reference"),
            "servers = 2\nworkers = 2",
            &format!("epochs = 1\nmax_steps = {steps}\neval = false\nper_print_times = 0\n{train}"),
        ),
        2,
        2,
    );
    for (i, (a, b)) in losses.iter().zip(&reference.losses).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5,
            "step {}: {a} vs uninterrupted {b}",
            i + 1
        );
    }
    vec![job[3].output(), job[4].output()]
}

/// Runs a 1-server, 2-worker job and starts a worker of each of `joiners` (new ids) once
/// worker 0 has run 10 steps; returns the steps each joiner ran and worker 0's output.
fn run_with_joiners(joiners: &[usize]) -> (Vec<u64>, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "servers = 1\nworkers = 2\nheartbeat_ms = 100\ndead_after_ms = 1500",
        "epochs = 3\neval = true",
    );
    let (mut job, addr) = start_job(&config, 1, 2);
    // Rank 0 scheduler, 1 server, 2..3 workers 0..1.
    assert!(
        job[2].wait_for_line("epoch: 1 step: 10,", LIMIT),
        "worker 0 reached step 10:\n{}",
        job[2].output()
    );
    // More workers: the launcher's counts stay 2; each registers and gets rows.
    let mut started: Vec<RoleProcess> = joiners
        .iter()
        .map(|&id| {
            let mut env = crate::util::role_env(3, 1, 2, &addr);
            for (k, v) in env.iter_mut() {
                if k == "TESSERA_WORKER_ID" {
                    *v = id.to_string();
                }
            }
            RoleProcess::start(&config, &env)
        })
        .collect();
    let ok: Vec<bool> = job.iter_mut().map(|p| p.finish(LIMIT)).collect();
    assert_eq!(ok, vec![true; 4], "scheduler:\n{}", job[0].output());
    let mut ran = Vec::new();
    for (joiner, &id) in started.iter_mut().zip(joiners) {
        assert!(joiner.finish(LIMIT), "joiner:\n{}", joiner.output());
        let prefix = format!("[ps worker {id}] ran ");
        let steps = joiner
            .output()
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_string))
            .and_then(|t| t.split(' ').next().and_then(|n| n.parse().ok()))
            .expect("the joiner's step count");
        assert!(job[0].output().contains(&format!("worker {id} registered")));
        ran.push(steps);
    }
    (ran, job[2].output())
}

#[test]
fn a_worker_joining_mid_run_takes_part() {
    let (ran, worker0) = run_with_joiners(&[2]);
    assert!(ran[0] >= 1, "{ran:?}");
    assert!(worker0.contains("trained 138 steps"), "{worker0}");
}

/// Scale-out from 2 to 4 workers mid-run: both new workers take part, and the job keeps the
/// seed run's accuracy.
#[test]
fn scaling_out_from_two_to_four_workers_mid_run() {
    let (ran, worker0) = run_with_joiners(&[2, 3]);
    assert!(ran.iter().all(|&n| n >= 1), "{ran:?}");
    let accuracy = final_accuracy(&worker0).expect("an accuracy line");
    assert!(accuracy >= 90.0, "{accuracy}\n{worker0}");
}
