//! Every command when its stdout cannot be written: a full device (`> /dev/full`) is an error
//! naming stdout with exit code 1, never a panic (`println!`'s exit code 101 and backtrace);
//! a closed pipe (`… | head -1`) ends the command quietly.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Output, Stdio};

use crate::util::{assert_ok, repo_root, s, tessera, tessera_command, Scratch};

/// Runs `tessera args` in the repository root with its stdout on `/dev/full`.
fn to_full_stdout(args: &[&str]) -> Output {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    tessera_command()
        .args(args)
        .current_dir(repo_root())
        .stdout(Stdio::from(full))
        .output()
        .expect("running tessera")
}

/// Asserts that `out` failed with exit code 1 (not a panic's 101), its error naming `what`
/// could not be written to stdout; returns its stderr.
#[track_caller]
fn assert_stdout_error(out: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let expected = format!("cannot write {what} to stdout: No space left on device");
    assert!(err.contains(&expected), "no {expected:?} in:\n{err}");
    err
}

/// Trains the seed MLP on one device for `steps` steps into `dir`, with `extra` settings.
fn train_args(dir: &Path, steps: u64, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "examples/seed_stand_alone.toml",
        "--devices",
        "1",
        "--set",
        "train.epochs=1000",
    ]
    .map(String::from)
    .to_vec();
    for set in [
        format!("train.max_steps={steps}"),
        format!("output.dir={:?}", s(dir)),
    ] {
        args.extend(["--set".to_string(), set]);
    }
    for set in extra {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args
}

/// `tessera plan` printed its plan with `print!`: a panic.
#[test]
fn plan_to_a_full_stdout_is_an_error_not_a_panic() {
    let scratch = Scratch::new("stdout-plan");
    let out_set = format!("output.dir={:?}", s(&scratch.0));
    for json in [false, true] {
        let mut args = vec!["plan", "examples/gpt_kjv.toml", "--set", &out_set];
        if json {
            args.push("--json");
        }
        assert_ok(&tessera(&args));
        assert_stdout_error(&to_full_stdout(&args), "the output");
    }
}

/// `tessera ckpt inspect` of a strategy file printed its `detected:` line with `println!`: a
/// panic. `tessera strategy show` of the same file, and the checkpoint's listing, are errors
/// too.
#[test]
fn ckpt_inspect_and_strategy_show_to_a_full_stdout_are_errors_not_panics() {
    let scratch = Scratch::new("stdout-inspect");
    let run = scratch.0.join("run");
    let args = train_args(&run, 1, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_ok(&tessera(&args));
    let strategy = run.join("strategy.ckpt");
    let checkpoint = run.join("rank_0").join("checkpoint_0.safetensors");
    for args in [
        ["ckpt", "inspect", s(&strategy)],
        ["ckpt", "inspect", s(&checkpoint)],
        ["strategy", "show", s(&strategy)],
    ] {
        assert_ok(&tessera(&args));
        assert_stdout_error(&to_full_stdout(&args), "the output");
    }
}

/// `tessera train`'s loss lines went to stdout through the library's monitor, whose error
/// named `<loss monitor output>`; its closing summary was printed with `println!`, a panic.
/// Both are now errors naming stdout, and the loss lines' stops the run.
#[test]
fn train_to_a_full_stdout_is_an_error_not_a_panic() {
    let scratch = Scratch::new("stdout-train");
    let args = train_args(&scratch.0.join("loss"), 5, &["train.per_print_times=1"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = assert_stdout_error(&to_full_stdout(&args), "the loss lines");
    assert!(err.contains("training stopped"), "{err}");
    // No loss lines: the summary after the run is what cannot be written.
    let args = train_args(&scratch.0.join("summary"), 2, &["train.per_print_times=0"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_stdout_error(&to_full_stdout(&args), "the output");
}

/// `tessera train … | head -1`: the reader gone after the first loss line stops the run
/// quietly, with exit code 0, as every other command ends on a closed pipe (it ended with
/// `error: rank 0: <loss monitor output>: Broken pipe` and exit code 1).
#[test]
fn train_into_a_closed_pipe_stops_quietly() {
    let scratch = Scratch::new("stdout-train-pipe");
    let args = train_args(&scratch.0, 100_000, &["train.per_print_times=1"]);
    let mut child = tessera_command()
        .args(&args)
        .current_dir(repo_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running tessera");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader (and the pipe's only read end) is dropped here.
    assert!(first.starts_with("epoch: 1 step: 1, loss is"), "{first}");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("error"), "{err}");
}

/// `tessera launch`'s console view dropped every line it could not write without a word,
/// ending with exit code 0. The processes still run to their end and their logs are whole;
/// the failure is said once on stderr and is the job's error.
#[test]
fn launch_to_a_full_stdout_keeps_the_logs_and_is_an_error() {
    let scratch = Scratch::new("stdout-launch");
    let logs = scratch.0.join("logs");
    let args = [
        "launch",
        "--independent",
        "--nproc",
        "2",
        "--log-dir",
        s(&logs),
        "--",
        "sh",
        "-c",
        "echo first; echo second",
    ];
    let out = to_full_stdout(&args);
    let err = assert_stdout_error(&out, "the console view");
    assert_eq!(
        err.matches("[launch] cannot write the console view")
            .count(),
        1,
        "{err}"
    );
    for worker in 0..2 {
        let log = std::fs::read_to_string(logs.join(format!("worker_{worker}.log"))).unwrap();
        assert!(log.ends_with("first\nsecond\n"), "{log}");
    }
    // A job that failed says its own failure, not the console's.
    let failing = [&args[..8], &["echo first; exit 3"]].concat();
    let out = to_full_stdout(&failing);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("error: worker"), "{err}");
    assert!(
        err.contains("[launch] cannot write the console view"),
        "{err}"
    );
}

/// `tessera bench`'s report could not be written: it exited at once from inside the
/// benchmark, leaving the working directory it had created (`--dir`, a source checkpoint of
/// 128 MiB here) behind. It now runs to its end, removes what it created and fails naming
/// stdout.
#[test]
fn bench_to_a_full_stdout_cleans_up_and_is_an_error() {
    let scratch = Scratch::new("stdout-bench");
    let dir = scratch.0.join("work");
    let args = [
        "bench",
        "ckpt-convert",
        "--tensors",
        "1",
        "--reps",
        "1",
        "--dir",
        s(&dir),
    ];
    assert_stdout_error(&to_full_stdout(&args), "the report");
    assert!(!dir.exists(), "{} was left behind", dir.display());
}

/// `tessera bench … | head`: a benchmark whose reader has gone ran to its end (here the
/// 128 MiB source generated and 100 repetitions of four conversions and copies) before
/// finding that its report could not be written. It stops at its next step (here before the
/// source is generated), removes the working directory it created and ends quietly, as every
/// command does on a closed pipe.
#[test]
fn bench_into_a_closed_pipe_stops_at_its_next_step_and_cleans_up() {
    let scratch = Scratch::new("stdout-bench-pipe");
    let dir = scratch.0.join("work");
    let (reader, writer) = std::io::pipe().expect("a pipe");
    // The reader is gone before the benchmark starts.
    drop(reader);
    let out = tessera_command()
        .args([
            "bench",
            "ckpt-convert",
            "--tensors",
            "1",
            "--reps",
            "100",
            "--dir",
            s(&dir),
        ])
        .current_dir(repo_root())
        .stdout(writer)
        .output()
        .expect("running tessera");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("error"), "{err}");
    assert!(!err.contains("generating the source"), "{err}");
    assert!(!dir.exists(), "{} was left behind", dir.display());
}

/// `train.print_local_norm` prints on every rank from inside the runtime: a full stdout was an
/// error naming `<local norm output>`; it names stdout.
#[test]
fn local_norms_to_a_full_stdout_name_stdout() {
    let scratch = Scratch::new("stdout-local-norm");
    let args = train_args(
        &scratch.0,
        2,
        &["train.per_print_times=0", "train.print_local_norm=true"],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = to_full_stdout(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("stdout: No space left on device") && !err.contains("<local norm output>"),
        "{err}"
    );
}
