//! `tessera train` fails fast (issue 13): what can be checked before the ranks start fails
//! then, and a rank that fails stops every rank with its own error, long before `--timeout`.
//!
//! The time bounds below are correctness bounds (the job must not wait for the 120 s timeout),
//! not benchmarks: every run here ends in a second or two.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::util::{s, tessera, Scratch};

/// Well under the 120 s `--timeout` these runs set, and far above their real duration.
const WELL_BEFORE_THE_TIMEOUT: Duration = Duration::from_secs(30);

/// `tessera train examples/seed_semi_auto.toml` (8 devices) with a 120 s timeout, its output
/// under `out_dir`, and `extra` arguments; returns its output and how long it ran.
fn train(out_dir: &Path, extra: &[&str]) -> (Output, Duration) {
    let out_dir = format!("output.dir=\"{}\"", s(out_dir));
    let mut args = vec![
        "train",
        "examples/seed_semi_auto.toml",
        "--timeout",
        "120",
        "--set",
        "train.max_steps=4",
        "--set",
        &out_dir,
    ];
    args.extend_from_slice(extra);
    let start = Instant::now();
    let out = tessera(&args);
    (out, start.elapsed())
}

/// Asserts that the run failed with `needle` in its error, trained no step, and ended well
/// before the timeout.
#[track_caller]
fn assert_fails_before_training((out, took): &(Output, Duration), needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "should fail: {stdout}");
    assert!(
        stderr.contains(needle),
        "{stderr:?} should contain {needle:?}"
    );
    assert!(
        !stdout.contains("loss is"),
        "no step may run first: {stdout}"
    );
    assert!(*took < WELL_BEFORE_THE_TIMEOUT, "took {took:?}");
}

#[test]
fn a_failing_rank_stops_every_rank_with_its_own_error() {
    let dir = Scratch::new("failfast-rank");
    // Rank 3 dumps its local norms into norms/rank_3/, which is a file: it fails at the end of
    // step 1, while the other seven ranks go on to step 2 and wait for it.
    let norms = dir.0.join("norms");
    std::fs::create_dir_all(&norms).unwrap();
    std::fs::write(norms.join("rank_3"), b"in the way").unwrap();
    let norms_path = format!("train.dump_local_norm_path=\"{}\"", s(&norms));
    let (out, took) = train(
        &dir.0.join("run"),
        &["--set", "train.dump_local_norm=true", "--set", &norms_path],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("rank 3:") && stderr.contains(s(&norms.join("rank_3"))),
        "rank 3's own error, not a peer's: {stderr}"
    );
    assert!(!stderr.contains("timed out"), "{stderr}");
    assert!(took < WELL_BEFORE_THE_TIMEOUT, "took {took:?}");
}

#[test]
fn a_log_json_in_a_missing_directory_fails_at_once_and_leaves_nothing() {
    let dir = Scratch::new("failfast-log");
    let log = dir.0.join("missing").join("log.jsonl");
    let run = train(&dir.0.join("made").join("run"), &["--log-json", s(&log)]);
    assert_fails_before_training(&run, &format!("metrics log {}", s(&log)));
    assert_fails_before_training(&run, "does not exist");
    assert!(
        !dir.0.join("made").exists(),
        "the output directories made for the check are removed"
    );
}

#[test]
fn an_output_dir_that_cannot_be_created_fails_before_training() {
    let dir = Scratch::new("failfast-out");
    let file = dir.0.join("a_file");
    std::fs::write(&file, b"not a directory").unwrap();
    let run = train(&file.join("run"), &[]);
    assert_fails_before_training(&run, "output.dir");
    assert_fails_before_training(&run, s(&file.join("run")));
}

#[test]
fn a_batch_larger_than_the_data_fails_naming_the_key() {
    let dir = Scratch::new("failfast-batch");
    let run = train(&dir.0.join("run"), &["--set", "data.batch_size=4096"]);
    assert_fails_before_training(&run, "data.batch_size");
    assert_fails_before_training(&run, "4096");
}

#[test]
fn resuming_from_a_missing_checkpoint_fails_before_training() {
    let dir = Scratch::new("failfast-resume");
    let from = dir.0.join("no_such_checkpoint");
    let resume = format!("output.resume_from=\"{}\"", s(&from));
    let run = train(&dir.0.join("run"), &["--set", &resume]);
    assert_fails_before_training(&run, "output.resume_from");
    assert_fails_before_training(&run, "does not exist");
    // A directory without a checkpoint in it.
    std::fs::create_dir_all(&from).unwrap();
    let run = train(&dir.0.join("run"), &["--set", &resume]);
    assert_fails_before_training(&run, "holds no checkpoint");
}
