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

/// `tessera train CONFIG` with a 120 s timeout, each of `sets` as `--set`, its output under
/// `out_dir`, and `extra` arguments; returns its output and how long it ran.
fn train_config(config: &str, sets: &[&str], out_dir: &Path, extra: &[&str]) -> (Output, Duration) {
    let out_dir = format!("output.dir=\"{}\"", s(out_dir));
    let mut args = vec!["train", config, "--timeout", "120"];
    for set in sets.iter().chain([&out_dir.as_str()]) {
        args.extend(["--set", set]);
    }
    args.extend_from_slice(extra);
    let start = Instant::now();
    let out = tessera(&args);
    (out, start.elapsed())
}

/// `tessera train examples/seed_semi_auto.toml` (8 devices), 4 steps, see [`train_config`].
fn train(out_dir: &Path, extra: &[&str]) -> (Output, Duration) {
    train_config(
        "examples/seed_semi_auto.toml",
        &["train.max_steps=4"],
        out_dir,
        extra,
    )
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
    // Rank 3 dumps its step 1 norms into norms/rank_3/local_norm_step_1.json, which is a
    // directory: it fails at the end of step 1, while the other seven ranks go on to step 2 and
    // wait for it. (A rank_3 that is a file is refused before any rank starts.)
    let norms = dir.0.join("norms");
    std::fs::create_dir_all(norms.join("rank_3").join("local_norm_step_1.json")).unwrap();
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

/// A tiny GPT on the bundled text (1 device unless `extra` sets `parallel.devices`), its output in
/// `out_dir`, plus `extra` arguments.
fn train_gpt(out_dir: &Path, extra: &[&str]) -> (Output, Duration) {
    let sets = [
        "parallel.devices=1",
        "parallel.data_parallel=1",
        "parallel.model_parallel=1",
        "model.layers=1",
        "model.hidden=16",
        "model.heads=2",
        "model.seq_len=8",
        "data.batch_size=2",
        "data.steps_per_epoch=2",
        "train.epochs=1",
    ];
    train_config("examples/gpt_kjv.toml", &sets, out_dir, extra)
}

/// Item 15 of issue 30: an unwritable `--trace` fails before training, like `--log-json`.
#[test]
fn an_unwritable_trace_fails_before_training() {
    let dir = Scratch::new("failfast-trace");
    let trace = dir.0.join("missing").join("trace.json");
    let run = train_gpt(
        &dir.0.join("run"),
        &[
            "--set",
            "parallel.devices=2",
            "--set",
            "parallel.pipeline={ stages = 2, micro_batches = 2 }",
            "--trace",
            s(&trace),
        ],
    );
    assert_fails_before_training(&run, &format!("trace {}", s(&trace)));
    assert_fails_before_training(&run, "does not exist");
    assert!(!dir.0.join("run").exists(), "no output directory is left");
}

/// Item 14: counts that drive work are bounded before the run.
#[test]
fn an_unbounded_eval_batches_is_refused() {
    let dir = Scratch::new("failfast-eval");
    let run = train_gpt(
        &dir.0.join("run"),
        &["--set", "data.eval_batches=1000000000"],
    );
    assert_fails_before_training(&run, "data.eval_batches");
    assert_fails_before_training(&run, "between 1 and 65536");
}

/// Item 13: a model under the element bound but larger than the machine's memory fails before
/// any rank starts, naming the prediction and what is available; `--explain` still works.
#[test]
fn a_run_larger_than_the_memory_fails_naming_both_figures() {
    let dir = Scratch::new("failfast-memory");
    // 4 layers of width 6144: 1.8e9 parameters (under the 2^31 bound), ~29 GB each with AdamW;
    // four data-parallel replicas in this one process need ~116 GB.
    let big = [
        "--set",
        "parallel.devices=4",
        "--set",
        "parallel.data_parallel=4",
        "--set",
        "model.layers=4",
        "--set",
        "model.hidden=6144",
        "--set",
        "model.heads=4",
        "--set",
        "data.batch_size=4",
    ];
    let run = train_gpt(&dir.0.join("run"), &big);
    assert_fails_before_training(&run, "parallel.devices");
    assert_fails_before_training(&run, "GiB");
    assert_fails_before_training(&run, "is available");
    assert!(!dir.0.join("run").exists(), "no output directory is left");
    let mut explain = big.to_vec();
    explain.push("--explain");
    let (out, _) = train_gpt(&dir.0.join("run"), &explain);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("predicted peaks"));
}

/// Item 6: a run whose every step overflows at its fixed loss scale fails, naming the key,
/// and writes no checkpoint; a run with some skipped steps says how many.
#[test]
fn a_run_whose_every_step_overflowed_fails_naming_the_loss_scale() {
    let dir = Scratch::new("failfast-overflow");
    let run_dir = dir.0.join("run");
    let (out, _) = train_gpt(
        &run_dir,
        &[
            "--set",
            "train.precision=\"f16\"",
            "--set",
            "train.loss_scale=1e9",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("train.loss_scale"), "{stderr}");
    assert!(
        stderr.contains("every one of the run's 2 steps"),
        "{stderr}"
    );
    assert!(
        !run_dir.join("strategy.json").exists(),
        "no checkpoint of unchanged parameters"
    );
}

/// Item 7: a checkpoint resumes only into the model and vocabulary it was saved from, and
/// only when steps are left to train.
#[test]
fn a_resume_into_another_model_or_alphabet_or_past_the_end_is_refused() {
    let dir = Scratch::new("failfast-resume-model");
    let first = dir.0.join("first");
    let (out, _) = train_gpt(&first, &["--set", "model.layers=2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resume = format!("output.resume_from=\"{}\"", s(&first));
    // One layer fewer: blocks.1.* would be dropped.
    let run = train_gpt(
        &dir.0.join("fewer"),
        &["--set", &resume, "--set", "train.epochs=2"],
    );
    assert_fails_before_training(&run, "output.resume_from");
    assert_fails_before_training(&run, "this model does not have (blocks.1.");
    // The same model, nothing left to train.
    let run = train_gpt(
        &dir.0.join("done"),
        &["--set", &resume, "--set", "model.layers=2"],
    );
    assert_fails_before_training(&run, "nothing is left to train");
    // A tensor damaged in place (a NaN written over one value; the file keeps its size, which
    // is all the set marker records) is named before any step runs.
    let damaged = dir.0.join("damaged");
    let copy = std::process::Command::new("cp")
        .args(["-r", s(&first), s(&damaged)])
        .status()
        .unwrap();
    assert!(copy.success());
    let file = damaged.join("rank_0/checkpoint_0.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let (name, at) = header
        .as_object()
        .unwrap()
        .iter()
        .find_map(|(name, t)| {
            let f32s = t.get("dtype")? == "F32" && name.starts_with("blocks.0.");
            f32s.then(|| {
                (
                    name.clone(),
                    t["data_offsets"][0].as_u64().unwrap() as usize,
                )
            })
        })
        .expect("an f32 tensor of the first block");
    let at = 8 + header_len + at;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let resume_damaged = format!("output.resume_from=\"{}\"", s(&damaged));
    let run = train_gpt(
        &dir.0.join("from-damaged"),
        &[
            "--set",
            &resume_damaged,
            "--set",
            "model.layers=2",
            "--set",
            "train.epochs=2",
        ],
    );
    assert!(!run.0.status.success());
    let stderr = String::from_utf8_lossy(&run.0.stderr);
    assert!(
        stderr.contains(&format!("tensor {name:?}"))
            && stderr.contains("holds a NaN or infinite value"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&run.0.stdout).contains("loss is"));
    // The same model under another optimizer: its state would be dropped (sgd keeps none) or
    // missing (adam's moments are not mint_adamw's).
    for (optimizer, keeps) in [("sgd", "none"), ("adam", "moment1, moment2")] {
        let set = format!("train.optimizer=\"{optimizer}\"");
        let run = train_gpt(
            &dir.0.join(optimizer),
            &[
                "--set",
                &resume,
                "--set",
                "model.layers=2",
                "--set",
                "train.epochs=2",
                "--set",
                &set,
            ],
        );
        assert_fails_before_training(&run, "train.optimizer");
        assert_fails_before_training(
            &run,
            &format!("keeps the optimizer state {keeps}, but the checkpoint"),
        );
        assert_fails_before_training(&run, "holds exp_avg, exp_avg_sq");
    }
    // Resuming with steps left works.
    let (out, _) = train_gpt(
        &dir.0.join("more"),
        &[
            "--set",
            &resume,
            "--set",
            "model.layers=2",
            "--set",
            "train.epochs=2",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Character tokens: another text with an alphabet of the same size.
    let text_a = dir.0.join("a.txt");
    let text_b = dir.0.join("b.txt");
    std::fs::write(&text_a, "abcd dcba ".repeat(200)).unwrap();
    std::fs::write(&text_b, "wxyz zyxw ".repeat(200)).unwrap();
    let char_run = |out_dir: &Path, text: &Path, extra: &[&str]| {
        let path = format!("data.path=\"{}\"", s(text));
        let mut args = vec!["--set", "data.tokenizer=\"char\"", "--set", &path];
        args.extend_from_slice(extra);
        train_gpt(out_dir, &args)
    };
    let (out, _) = char_run(&dir.0.join("char"), &text_a, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resume = format!("output.resume_from=\"{}\"", s(&dir.0.join("char")));
    let run = char_run(
        &dir.0.join("char2"),
        &text_b,
        &["--set", &resume, "--set", "train.epochs=2"],
    );
    assert_fails_before_training(&run, "model.json");
    assert_fails_before_training(&run, "alphabet");
}
