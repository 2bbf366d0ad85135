//! Sync SGD on parameter servers is data-parallel training: the same rows per worker as per
//! rank, the gradients averaged, the runtime's optimizer; losses agree step for step.

use std::path::Path;

use runtime::{LaunchOptions, Session, TrainConfig};

use crate::util::{digits, ps_config, run_in_process};

/// The `[train]` keys of a run of `steps` steps with no evaluation.
fn steps_only(steps: u64) -> String {
    format!("epochs = 1\nmax_steps = {steps}\neval = false")
}

/// The same run as data parallel on `devices` ranks (local backend), `train` its `[train]` keys.
fn data_parallel_losses(out: &Path, devices: usize, train: &str) -> Vec<f32> {
    let text = crate::util::ps_text(out, "", train)
        .replace(
            "mode = \"parameter_server\"",
            &format!("mode = \"data_parallel\"\ndevices = {devices}"),
        )
        .replace("[ps]\n", "");
    let config = TrainConfig::parse(&text, None, &[], Path::new("/")).expect("a DP config");
    let session = Session::new(&config).expect("a session");
    let options = LaunchOptions {
        print_loss: false,
        metrics_log: Some(out.join("metrics.jsonl")),
        ..LaunchOptions::default()
    };
    runtime::train_local(&session, &options)
        .expect("DP trains")
        .losses()
        .to_vec()
}

fn assert_close(what: &str, ps: &[f32], dp: &[f32]) {
    assert_eq!(ps.len(), dp.len(), "{what}: steps");
    for (i, (a, b)) in ps.iter().zip(dp).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5,
            "{what}: step {}: PS loss {a} vs DP {b}",
            i + 1
        );
    }
}

#[test]
fn sync_ps_matches_data_parallel_step_for_step() {
    assert!(digits().exists());
    let dir = tempfile::tempdir().unwrap();
    let steps = 12;
    let dp = data_parallel_losses(&dir.path().join("dp"), 2, &steps_only(steps));
    // Two servers: the parameters are split between them.
    let config = ps_config(
        &dir.path().join("ps"),
        "servers = 2\nworkers = 2",
        &format!("epochs = 1\nmax_steps = {steps}\neval = false"),
    );
    let report = run_in_process(&config, 2, 2);
    assert_close("2 workers, 2 servers", &report.losses, &dp);
    // The losses move: a run that did not train would not match by accident.
    assert!(dp[0] - dp[dp.len() - 1] > 0.1, "{dp:?}");
}

#[test]
fn sync_ps_with_four_workers_matches_four_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 6;
    let dp = data_parallel_losses(&dir.path().join("dp"), 4, &steps_only(steps));
    let config = ps_config(
        &dir.path().join("ps"),
        "servers = 1\nworkers = 4",
        &format!("epochs = 1\nmax_steps = {steps}\neval = false"),
    );
    let report = run_in_process(&config, 1, 4);
    assert_close("4 workers, 1 server", &report.losses, &dp);
    // Every server wrote a snapshot at the end.
    assert!(ps::snapshot::snapshot_path(&dir.path().join("ps"), 0).exists());
}

/// The training recipe on the servers: a warm-up + cosine schedule (each push carries its
/// step's rate) and a weight-decay filter give the data-parallel run's losses step for step.
#[test]
fn sync_ps_follows_the_learning_rate_schedule_and_decay_filter() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 10;
    let train = format!(
        "{}\noptimizer = \"mint_adamw\"\nlearning_rate = 0.01\nweight_decay = 0.1\nno_weight_decay = [\"bias\"]\nlr_schedule = \"cosine\"\nwarmup_steps = 3\nmin_lr = 0.001\ndecay_steps = 10",
        steps_only(steps)
    );
    let dp = data_parallel_losses(&dir.path().join("dp"), 2, &train);
    let config = ps_config(&dir.path().join("ps"), "servers = 2\nworkers = 2", &train);
    let report = run_in_process(&config, 2, 2);
    assert_close("cosine schedule, 2 workers, 2 servers", &report.losses, &dp);
    // A constant rate gives other losses: the schedule was applied, not ignored.
    let constant = data_parallel_losses(
        &dir.path().join("constant"),
        2,
        &format!(
            "{}\noptimizer = \"mint_adamw\"\nlearning_rate = 0.01\nweight_decay = 0.1\nno_weight_decay = [\"bias\"]",
            steps_only(steps)
        ),
    );
    assert!(
        dp.iter().zip(&constant).any(|(a, b)| (a - b).abs() > 1e-4),
        "{dp:?} vs {constant:?}"
    );
    // The metrics log records each step's scheduled rate: warm-up from 0 rises.
    let log = std::fs::read_to_string(dir.path().join("ps").join("metrics.jsonl")).unwrap();
    let rates: Vec<f64> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("lr").and_then(serde_json::Value::as_f64))
        .collect();
    assert_eq!(rates.len(), steps as usize, "{log}");
    assert!(rates[0] < rates[2] && rates[2] > rates[9], "{rates:?}");
}

/// Async updates with clipping: each update is one worker's whole gradient clipped by its own
/// global norm, so one worker on one server is the one-device run with the same clipping, step
/// for step, and worker 0 logs the norms.
#[test]
fn async_ps_clips_each_update_by_its_global_norm() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 8;
    let train = format!("{}\nmax_grad_norm = 0.05", steps_only(steps));
    let dp = data_parallel_losses(&dir.path().join("dp"), 1, &train);
    let unclipped = data_parallel_losses(&dir.path().join("plain"), 1, &steps_only(steps));
    assert!(
        dp.iter().zip(&unclipped).any(|(a, b)| (a - b).abs() > 1e-4),
        "the clip norm is tight enough to change the run: {dp:?} vs {unclipped:?}"
    );
    let config = ps_config(
        &dir.path().join("ps"),
        "servers = 1\nworkers = 1\nsync = false",
        &train,
    );
    let report = run_in_process(&config, 1, 1);
    assert_close("async, clipped, 1 worker", &report.losses, &dp);
    let log = std::fs::read_to_string(dir.path().join("ps").join("metrics.jsonl")).unwrap();
    let norms: Vec<f64> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("grad_norm").and_then(serde_json::Value::as_f64))
        .collect();
    assert_eq!(norms.len(), steps as usize, "{log}");
    assert!(norms.iter().all(|&n| n > 0.05), "{norms:?}");
}

/// The `"grad_norm"` values of the metrics log in `dir`.
fn logged_norms(dir: &Path) -> Vec<f64> {
    let log = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("grad_norm").and_then(serde_json::Value::as_f64))
        .collect()
}

/// Sync updates with clipping: the servers each hold a part of the step's mean gradient; the
/// workers gather the parts' exact square sums and hand back the global norm, so the servers
/// clip by the norm of the whole mean gradient — the data-parallel run's, step for step, with
/// the same norms logged.
#[test]
fn sync_ps_clips_the_mean_gradient_by_its_global_norm_across_servers() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 8;
    let train = format!("{}\nmax_grad_norm = 0.05", steps_only(steps));
    let dp = data_parallel_losses(&dir.path().join("dp"), 2, &train);
    let unclipped = data_parallel_losses(&dir.path().join("plain"), 2, &steps_only(steps));
    assert!(
        dp.iter().zip(&unclipped).any(|(a, b)| (a - b).abs() > 1e-4),
        "the clip norm is tight enough to change the run: {dp:?} vs {unclipped:?}"
    );
    // Two servers: no process holds the whole gradient.
    let config = ps_config(&dir.path().join("ps"), "servers = 2\nworkers = 2", &train);
    let report = run_in_process(&config, 2, 2);
    assert_close("sync, clipped, 2 workers, 2 servers", &report.losses, &dp);
    let dp_norms = logged_norms(&dir.path().join("dp"));
    let ps_norms = logged_norms(&dir.path().join("ps"));
    assert_eq!(dp_norms.len(), steps as usize);
    assert_eq!(ps_norms.len(), dp_norms.len(), "one norm per step");
    for (i, (p, d)) in ps_norms.iter().zip(&dp_norms).enumerate() {
        assert!(
            (p - d).abs() <= 1e-5 * d.max(1.0),
            "step {}: PS norm {p} vs DP {d}",
            i + 1
        );
        assert!(*d > 0.05, "step {} is clipped: {d}", i + 1);
    }
}
