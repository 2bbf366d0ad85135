//! Sync SGD on parameter servers is data-parallel training: the same rows per worker as per
//! rank, the gradients averaged, the runtime's optimizer; losses agree step for step.

use std::path::Path;

use runtime::{LaunchOptions, Session, TrainConfig};

use crate::util::{digits, ps_config, run_in_process};

/// The same run as data parallel on `devices` ranks (local backend).
fn data_parallel_losses(out: &Path, devices: usize, steps: u64) -> Vec<f32> {
    let text = crate::util::ps_text(
        out,
        "",
        &format!("epochs = 1\nmax_steps = {steps}\neval = false"),
    )
    .replace(
        "mode = \"parameter_server\"",
        &format!("mode = \"data_parallel\"\ndevices = {devices}"),
    )
    .replace("[ps]\n", "");
    let config = TrainConfig::parse(&text, None, &[], Path::new("/")).expect("a DP config");
    let session = Session::new(&config).expect("a session");
    let options = LaunchOptions {
        print_loss: false,
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
    let dp = data_parallel_losses(&dir.path().join("dp"), 2, steps);
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
    let dp = data_parallel_losses(&dir.path().join("dp"), 4, steps);
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
