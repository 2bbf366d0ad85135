//! Checkpoint sets end to end: a conversion or a training save killed at any point (SIGINT or
//! SIGKILL) leaves its destination holding the old complete set or the new one, and `verify`
//! agrees; two writers into one destination never both write it; the tools refuse to harm
//! what they did not create.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use layout::Layout;
use tensor::Tensor;

use crate::util::{assert_ok, repo_root, s, tessera, Scratch};

const ROWS: usize = 2048;
const COLS: usize = 1024;

/// A strategy of `n` [ROWS, COLS] f32 tensors over `dev` with MindSpore map `map`.
fn strategy(dev: &[usize], map: &[i64], n: usize) -> ckpt::ResolvedStrategy {
    let params = (0..n)
        .map(|i| ckpt::ResolvedParam {
            name: format!("layer{i}.weight"),
            shape: vec![ROWS, COLS],
            dtype: Some(tensor::DType::F32),
            placements: vec![ckpt::ParamLayout::new(
                0,
                Layout::from_ms_flat(dev, map, None)
                    .unwrap()
                    .bind(&[ROWS, COLS])
                    .unwrap(),
                1,
            )
            .unwrap()],
        })
        .collect();
    ckpt::ResolvedStrategy::new(params).unwrap()
}

/// An 8-rank source checkpoint (`dir/src`, strategy `dir/A.json`) and two target strategies:
/// `B.json` (4 ranks) and `C.json` (2 ranks).
fn source(dir: &Path, n_tensors: usize) {
    let a = strategy(&[2, 4], &[1, 0], n_tensors);
    let save = |name: &str, st: &ckpt::ResolvedStrategy| {
        ckpt::save_param_strategy_file(
            &dir.join(name),
            st,
            &[],
            ckpt::StrategyFlavour::Tessera,
            true,
        )
        .unwrap();
    };
    save("A.json", &a);
    save("B.json", &strategy(&[2, 2], &[0, 1], n_tensors));
    save("C.json", &strategy(&[2], &[0, -1], n_tensors));
    for rank in 0..8 {
        let mut tensors = Vec::new();
        for p in a.params() {
            let region = p.placements[0].held.rank_box(rank).unwrap();
            let n: usize = region.shape.iter().product();
            let data: Vec<f32> = (0..n).map(|i| (i + rank * 7) as f32).collect();
            tensors.push((
                p.name.clone(),
                Tensor::from_vec(&region.shape, data).unwrap(),
            ));
        }
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        ckpt::save_rank_checkpoint(&dir.join("src"), rank, &refs, true).unwrap();
    }
}

fn convert_cmd(dir: &Path, dst: &Path, strategy: &str, force: bool) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.args(["ckpt", "convert", "--quiet", "--src"])
        .arg(dir.join("src"))
        .arg("--src-strategy")
        .arg(dir.join("A.json"))
        .arg("--dst")
        .arg(dst)
        .arg("--dst-strategy")
        .arg(dir.join(strategy));
    if force {
        cmd.arg("--force");
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd
}

/// The rank folders of a set directory.
fn rank_dirs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rank_"))
        .collect();
    v.sort();
    v
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn marker_id(dir: &Path) -> String {
    ckpt::SetMarker::read(dir)
        .unwrap()
        .expect("a set marker")
        .id
}

/// Sends `signal` to `child` after `delay` (or lets it finish first) and reaps it.
fn kill_after(mut child: Child, delay: Duration, signal: i32) {
    let start = Instant::now();
    while start.elapsed() < delay {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, signal);
    }
    child.wait().unwrap();
}

/// The `i`-th of `n` kill delays over `[0, 1.3 * span]`, jittered by a fixed sequence so the
/// points differ between signals and runs.
fn delay(i: usize, n: usize, span: Duration, salt: u64) -> Duration {
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt;
    x ^= x >> 29;
    let jitter = (x % 1000) as f64 / 1000.0 / n as f64;
    span.mul_f64(1.3 * (i as f64 / n as f64 + jitter))
}

/// The set a destination holds: its id and the strategy (file, ranks) it was written for.
#[derive(Clone)]
struct Held {
    id: String,
    strategy: &'static str,
    ranks: usize,
}

/// Asserts `dst` holds exactly `old` or a new set written for `new` (verified with `tessera
/// ckpt verify`); returns what it holds.
fn assert_old_or_new(dir: &Path, dst: &Path, old: &Held, new: (&'static str, usize)) -> Held {
    let id = marker_id(dst);
    let held = if id == old.id {
        old.clone()
    } else {
        Held {
            id,
            strategy: new.0,
            ranks: new.1,
        }
    };
    assert_eq!(rank_dirs(dst).len(), held.ranks, "{:?}", entries(dst));
    let out = tessera(&[
        "ckpt",
        "verify",
        "--src",
        s(dst),
        "--strategy",
        s(&dir.join(held.strategy)),
    ]);
    assert_ok(&out);
    held
}

/// Asserts nothing but `keep` is left in `dir` (no staging directory, no lock file).
fn assert_only(dir: &Path, keep: &[&str]) {
    let mut want: Vec<String> = keep.iter().map(|k| k.to_string()).collect();
    want.sort();
    assert_eq!(entries(dir), want);
}

/// The other target: a conversion into a destination holding one set writes the other.
fn other(held: &Held) -> (&'static str, usize) {
    if held.strategy == "B.json" {
        ("C.json", 2)
    } else {
        ("B.json", 4)
    }
}

#[test]
fn interrupted_conversions_leave_the_old_or_the_new_set() {
    interrupted_conversions(false);
}

/// Without fsync a conversion is as atomic against a killed process (only a power loss can
/// lose its data).
#[test]
fn interrupted_conversions_without_fsync_leave_the_old_or_the_new_set() {
    interrupted_conversions(true);
}

/// Kills conversions (`--no-fsync` or not) at points before, during and after their run and
/// checks the destination holds the old set or the new one, whole.
fn interrupted_conversions(no_fsync: bool) {
    let scratch = Scratch::new(if no_fsync {
        "interrupt-convert-no-fsync"
    } else {
        "interrupt-convert"
    });
    let dir = &scratch.0;
    let convert_cmd = |dir: &Path, dst: &Path, strategy: &str, force: bool| {
        let mut cmd = convert_cmd(dir, dst, strategy, force);
        if no_fsync {
            cmd.arg("--no-fsync");
        }
        cmd
    };
    source(dir, 4);
    let dst = dir.join("dst");
    assert!(convert_cmd(dir, &dst, "B.json", false)
        .status()
        .unwrap()
        .success());
    let mut held = Held {
        id: marker_id(&dst),
        strategy: "B.json",
        ranks: 4,
    };
    // How long one conversion takes, so the kills land before, during and after it.
    let start = Instant::now();
    assert!(convert_cmd(dir, &dir.join("probe"), "C.json", false)
        .status()
        .unwrap()
        .success());
    let span = start.elapsed();
    std::fs::remove_dir_all(dir.join("probe")).unwrap();
    let base = ["A.json", "B.json", "C.json", "dst", "src"];
    let mut outcomes = (0, 0);
    for (signal, salt) in [(libc::SIGINT, 1u64), (libc::SIGKILL, 2)] {
        for i in 0..20 {
            let target = other(&held);
            let child = convert_cmd(dir, &dst, target.0, true).spawn().unwrap();
            kill_after(child, delay(i, 20, span, salt), signal);
            let now = assert_old_or_new(dir, &dst, &held, target);
            if now.id == held.id {
                outcomes.0 += 1;
            } else {
                outcomes.1 += 1;
            }
            held = now;
            if signal == libc::SIGINT {
                // An interrupted conversion removes its staging directory and lock.
                assert_only(dir, &base);
            }
        }
    }
    println!(
        "{} kills kept the old set, {} found the new one",
        outcomes.0, outcomes.1
    );
    // Whatever SIGKILL left behind, the next writer cleans up.
    let target = other(&held);
    assert!(convert_cmd(dir, &dst, target.0, true)
        .status()
        .unwrap()
        .success());
    assert_old_or_new(dir, &dst, &held, target);
    assert_only(dir, &base);
}

fn train_cmd(out: &Path, devices: usize) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.current_dir(repo_root())
        .args(["train", "examples/seed_semi_auto.toml", "--devices"])
        .arg(devices.to_string())
        .args([
            "--set",
            "train.epochs=1",
            "--set",
            "train.max_steps=4",
            "--set",
            "train.eval=false",
            "--set",
        ])
        .arg(format!("output.dir={}", out.display()));
    if devices != 8 {
        // A 2-device strategy for the same ops.
        for (op, st) in [
            ("matmul1", "[[1,2],[2,1]]"),
            ("relu1", "[[2,1]]"),
            ("matmul2", "[[1,2],[2,1]]"),
            ("relu2", "[[2,1]]"),
        ] {
            cmd.arg("--set").arg(format!("parallel.shard.{op}={st}"));
        }
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd
}

/// Asserts the run folder `run` holds `old` or a new set for `devices` ranks, each verified
/// against the strategy saved with it.
fn assert_run_old_or_new(run: &Path, old: &(String, usize), devices: usize) -> (String, usize) {
    let id = marker_id(run);
    let n = if id == old.0 { old.1 } else { devices };
    assert_eq!(rank_dirs(run).len(), n, "{:?}", entries(run));
    let out = tessera(&[
        "ckpt",
        "verify",
        "--src",
        s(run),
        "--strategy",
        s(&run.join("strategy.json")),
    ]);
    assert_ok(&out);
    (id, n)
}

#[test]
fn interrupted_training_saves_leave_the_old_or_the_new_set() {
    let scratch = Scratch::new("interrupt-train");
    let run = scratch.0.join("run");
    assert!(train_cmd(&run, 8).status().unwrap().success());
    std::fs::write(run.join("notes.txt"), b"mine").unwrap();
    let mut held = (marker_id(&run), 8);
    let start = Instant::now();
    assert!(train_cmd(&scratch.0.join("probe"), 2)
        .status()
        .unwrap()
        .success());
    let span = start.elapsed();
    std::fs::remove_dir_all(scratch.0.join("probe")).unwrap();
    for (signal, salt) in [(libc::SIGINT, 3u64), (libc::SIGKILL, 4)] {
        for i in 0..20 {
            let devices = if held.1 == 8 { 2 } else { 8 };
            let child = train_cmd(&run, devices).spawn().unwrap();
            kill_after(child, delay(i, 20, span, salt), signal);
            held = assert_run_old_or_new(&run, &held, devices);
            // The user's file survives every switch.
            assert_eq!(std::fs::read(run.join("notes.txt")).unwrap(), b"mine");
            if signal == libc::SIGINT {
                assert_only(&scratch.0, &["run"]);
            }
        }
    }
    let devices = if held.1 == 8 { 2 } else { 8 };
    assert!(train_cmd(&run, devices).status().unwrap().success());
    assert_run_old_or_new(&run, &held, devices);
    assert_only(&scratch.0, &["run"]);
}

#[test]
fn two_writers_into_one_destination_never_both_write_it() {
    let scratch = Scratch::new("two-writers");
    let dir = &scratch.0;
    source(dir, 4);
    for round in 0..4 {
        let dst = dir.join(format!("dst{round}"));
        // Without --force exactly one may write; with it, each writes whole or fails at once.
        let force = round % 2 == 1;
        let a = convert_cmd(dir, &dst, "B.json", force).spawn().unwrap();
        let b = convert_cmd(dir, &dst, "C.json", force).spawn().unwrap();
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let ok = [a.status.success(), b.status.success()];
        for out in [&a, &b] {
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(
                    err.contains("another writer holds this destination")
                        || err.contains("the destination exists"),
                    "{err}"
                );
            }
        }
        if !force {
            assert_eq!(ok.iter().filter(|&&x| x).count(), 1, "{ok:?}");
        } else {
            assert!(ok.iter().any(|&x| x), "{ok:?}");
        }
        // The result is one whole set, of whichever writer committed last.
        let ranks = rank_dirs(&dst).len();
        let strategy = if ranks == 4 { "B.json" } else { "C.json" };
        assert_ok(&tessera(&[
            "ckpt",
            "verify",
            "--src",
            s(&dst),
            "--strategy",
            s(&dir.join(strategy)),
        ]));
    }
    // A lock held by this process makes a writer fail at once, naming it.
    let dst = dir.join("locked");
    let _held = ckpt::SetWriter::begin(&dst, "test", false).unwrap();
    let start = Instant::now();
    let out = convert_cmd(dir, &dst, "B.json", true).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("process {}", std::process::id())),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn tools_refuse_to_harm_what_they_did_not_create() {
    let scratch = Scratch::new("refusals");
    let dir = &scratch.0;
    source(dir, 1);
    // bench ckpt-convert never deletes an existing --dir.
    std::fs::write(dir.join("keep.txt"), b"precious").unwrap();
    let out = tessera(&[
        "bench",
        "ckpt-convert",
        "--dir",
        s(dir),
        "--tensors",
        "1",
        "--reps",
        "1",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));
    assert_eq!(std::fs::read(dir.join("keep.txt")).unwrap(), b"precious");
    // convert --src D --dst D --force, a destination inside the source, an escaping prefix.
    let src = dir.join("src");
    let before = entries(&src.join("rank_0"));
    for (dst, prefix) in [
        (src.clone(), "checkpoint_"),
        (src.join("rank_9"), "checkpoint_"),
        (dir.join("out"), "../../x_"),
    ] {
        let out = tessera(&[
            "ckpt",
            "convert",
            "--src",
            s(&src),
            "--src-strategy",
            s(&dir.join("A.json")),
            "--dst",
            s(&dst),
            "--prefix",
            prefix,
            "--force",
        ]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("destination is the source")
                || err.contains("inside one of the source's rank folders")
                || err.contains("plain name fragment"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    assert_eq!(entries(&src.join("rank_0")), before);
    assert!(!dir.join("out").exists() && !dir.parent().unwrap().join("x_0").exists());
    // A strategy for 4 ranks used with the 8 rank folders: MindSpore's protobuf has no shapes,
    // so the slices alone would imply a wrong global shape.
    let four = dir.join("A4.ckpt");
    ckpt::save_param_strategy_file(
        &four,
        &strategy(&[2, 2], &[1, 0], 1),
        &[],
        ckpt::StrategyFlavour::MsProtobuf,
        false,
    )
    .unwrap();
    let out = tessera(&[
        "ckpt",
        "convert",
        "--src",
        s(&src),
        "--src-strategy",
        s(&four),
        "--dst",
        s(&dir.join("out")),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds rank folders [4, 5, 6, 7]"), "{err}");
    assert!(!dir.join("out").exists());
}

#[test]
fn inspect_names_what_it_detected_and_rejects_corrupt_files() {
    let scratch = Scratch::new("inspect");
    let dir = &scratch.0;
    source(dir, 1);
    let file = dir.join("src/rank_0/checkpoint_0.safetensors");
    let out = tessera(&["ckpt", "inspect", s(&file)]);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("detected: safetensors"));
    // A MindSpore .ckpt with its tensor bytes cut short parses as no known format.
    let conv = dir.join("conv");
    assert_ok(&tessera(&[
        "ckpt",
        "convert",
        "--src",
        s(&dir.join("src")),
        "--src-strategy",
        s(&dir.join("A.json")),
        "--dst",
        s(&conv),
        "--format",
        "ckpt",
    ]));
    let ckpt_file = conv.join("rank_0/checkpoint_0.ckpt");
    let out = tessera(&["ckpt", "inspect", s(&ckpt_file)]);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("detected: MindSpore .ckpt"));
    let bytes = std::fs::read(&ckpt_file).unwrap();
    for cut in [bytes.len() / 2, bytes.len() - 5, 40] {
        let bad = dir.join(format!("bad{cut}.ckpt"));
        std::fs::write(&bad, &bytes[..cut]).unwrap();
        let out = tessera(&["ckpt", "inspect", s(&bad)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(err.contains("matches no format"), "{err}");
        assert!(err.contains(&format!("bad{cut}.ckpt")), "{err}");
    }
}

#[test]
fn resume_refuses_a_mixed_set() {
    let scratch = Scratch::new("resume-mixed");
    let (a, b) = (scratch.0.join("a"), scratch.0.join("b"));
    assert!(train_cmd(&a, 8).status().unwrap().success());
    let mut other = train_cmd(&b, 8);
    other.args(["--set", "train.seed=7"]);
    assert!(other.status().unwrap().success());
    // Same shapes, same sizes: only the set ids differ.
    let file = "rank_3/checkpoint_3.safetensors";
    std::fs::copy(b.join(file), a.join(file)).unwrap();
    let mut resume = train_cmd(&scratch.0.join("c"), 8);
    // Steps left to train past the checkpoint's, so that the set itself is what is refused.
    resume
        .args(["--set", "train.max_steps=6", "--set"])
        .arg(format!("output.resume_from={}", a.display()));
    let out = resume.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mixed checkpoint set"), "{err}");
    assert!(!scratch.0.join("c").join("rank_0").exists());
}

/// `strategy merge-stages` (one file, written through `.<name>.<pid>-<n>.tmp`): the temporary
/// file a SIGKILLed run left is removed by the next run into that file, which keeps the user's
/// files; two runs racing for a new output without `--force` never both succeed (the later
/// rename would silently replace the earlier run's file).
#[test]
fn merge_stages_cleans_up_after_a_killed_run_and_never_races_over_a_file() {
    let scratch = Scratch::new("merge-stages-writers");
    let dir = &scratch.0;
    let case = repo_root().join("tests/fixtures/mindspore/cases/case1_dp2mp4_to_2x2/strategy");
    for (stages, file) in [("stages_a", "A.ckpt"), ("stages_b", "B.ckpt")] {
        std::fs::create_dir(dir.join(stages)).unwrap();
        std::fs::copy(case.join(file), dir.join(stages).join(file)).unwrap();
    }
    let merge = |stages: &str, out: &Path, force: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
        cmd.args(["strategy", "merge-stages"])
            .arg(dir.join(stages))
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if force {
            cmd.arg("--force");
        }
        cmd
    };
    // What each run writes on its own.
    let mut expected = Vec::new();
    for stages in ["stages_a", "stages_b"] {
        let out = dir.join(format!("{stages}.ckpt"));
        assert!(merge(stages, &out, false).status().unwrap().success());
        expected.push(std::fs::read(&out).unwrap());
    }
    assert_ne!(expected[0], expected[1]);
    // A killed run's leftover (a pid no process can have) beside the user's file.
    let out_dir = dir.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::write(out_dir.join("keep.txt"), b"mine").unwrap();
    std::fs::write(out_dir.join(".merged.ckpt.999999942-0.tmp"), b"half").unwrap();
    let merged = out_dir.join("merged.ckpt");
    let out = merge("stages_a", &merged, false).output().unwrap();
    assert_ok(&out);
    assert_eq!(entries(&out_dir), vec!["keep.txt", "merged.ckpt"]);
    assert_eq!(std::fs::read(&merged).unwrap(), expected[0]);
    assert_eq!(std::fs::read(out_dir.join("keep.txt")).unwrap(), b"mine");
    // Racing for a new file without --force: exactly one wins, and its file is whole.
    let raced = out_dir.join("raced.ckpt");
    for round in 0..20 {
        let _ = std::fs::remove_file(&raced);
        let a = merge("stages_a", &raced, false).spawn().unwrap();
        let b = merge("stages_b", &raced, false).spawn().unwrap();
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let won: Vec<usize> = [&a, &b]
            .iter()
            .enumerate()
            .filter(|(_, o)| o.status.success())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(won.len(), 1, "round {round}: both or neither succeeded");
        let lost = if won[0] == 0 { &b } else { &a };
        let err = String::from_utf8_lossy(&lost.stderr);
        assert!(
            err.contains("raced.ckpt") && err.contains("exists"),
            "{err}"
        );
        assert_eq!(std::fs::read(&raced).unwrap(), expected[won[0]]);
        assert_eq!(
            entries(&out_dir),
            vec!["keep.txt", "merged.ckpt", "raced.ckpt"]
        );
    }
}

/// A set converted to MindSpore's `.ckpt` format (`tessera ckpt convert --format ckpt`, or one
/// MindSpore wrote) resumes as its `.safetensors` original does: resume looked for
/// `rank_0/checkpoint_0.safetensors` only ("holds no checkpoint"), and read the saved step from
/// it. On the same layout the resumed run ends bitwise where the uninterrupted one does, and on
/// another device count where the resume from the original set ends; neither names its
/// strategy file (`--dst-strategy` wrote it into the set).
#[test]
fn a_set_converted_to_ckpt_format_resumes_as_the_original() {
    let scratch = Scratch::new("resume-ckpt-format");
    let dir = &scratch.0;
    let (half, whole, conv) = (dir.join("half"), dir.join("whole"), dir.join("conv"));
    train_two_steps(&half);
    assert!(train_cmd(&whole, 8).status().unwrap().success());
    convert_set(
        &half,
        &conv,
        Some(&half.join("strategy.json")),
        Some("ckpt"),
    );
    assert!(conv.join("rank_7/checkpoint_7.ckpt").is_file());
    // No `output.resume_strategy`: the converted set carries the layout it was written for.
    assert!(conv.join("strategy.json").is_file());
    let resume = |from: &Path, out: &Path, devices: usize| {
        assert_ok(&resume_without_strategy(from, out, devices));
    };
    let same = dir.join("same");
    resume(&conv, &same, 8);
    assert_ok(&tessera(&["ckpt", "diff", s(&same), s(&whole)]));
    let (from_ckpt, from_st) = (dir.join("two_ckpt"), dir.join("two_st"));
    resume(&conv, &from_ckpt, 2);
    resume(&half, &from_st, 2);
    assert_ok(&tessera(&["ckpt", "diff", s(&from_ckpt), s(&from_st)]));
}

/// Resumes `train_cmd(out, devices)` from the set `from` with no `output.resume_strategy`.
fn resume_without_strategy(from: &Path, out: &Path, devices: usize) -> std::process::Output {
    let mut cmd = train_cmd(out, devices);
    cmd.arg("--set")
        .arg(format!("output.resume_from=\"{}\"", from.display()));
    cmd.output().unwrap()
}

/// A merged set (`tessera ckpt convert` without `--dst-strategy`: rank 0 alone, every tensor
/// whole, no strategy file, as MindSpore's merged checkpoints are) resumes with no
/// `output.resume_strategy`, in `.safetensors` and in `.ckpt` format: resume refused it ("the
/// strategy file ... does not exist"). On 8 and on 2 devices the resumed run ends bitwise where
/// the resume from the sharded original does.
#[test]
fn a_merged_set_without_a_strategy_resumes_as_the_sharded_original() {
    let scratch = Scratch::new("resume-merged");
    let dir = &scratch.0;
    let half = dir.join("half");
    train_two_steps(&half);
    let mut from_original = Vec::new();
    for devices in [8, 2] {
        let out = dir.join(format!("original_{devices}"));
        assert_ok(&resume_without_strategy(&half, &out, devices));
        from_original.push((devices, out));
    }
    for format in ["safetensors", "ckpt"] {
        let merged = dir.join(format!("merged_{format}"));
        convert_set(&half, &merged, None, Some(format));
        assert!(merged
            .join(format!("rank_0/checkpoint_0.{format}"))
            .is_file());
        assert!(!merged.join("rank_1").exists());
        assert!(!merged.join("strategy.json").exists());
        for (devices, original) in &from_original {
            let out = dir.join(format!("resumed_{format}_{devices}"));
            assert_ok(&resume_without_strategy(&merged, &out, *devices));
            assert_ok(&tessera(&["ckpt", "diff", s(&out), s(original)]));
        }
    }
}

/// Without a strategy file only a set of rank 0 alone, every tensor whole, is read (as merged):
/// rank 0's file of a sharded set (shards of another shape than the model's) is refused naming
/// the tensor, and a set of several ranks naming `output.resume_strategy` (it is not read as
/// merged, which would refuse a shard). Neither
/// run trains or writes a checkpoint.
#[test]
fn a_set_without_a_strategy_resumes_only_when_merged() {
    let scratch = Scratch::new("resume-unmerged");
    let dir = &scratch.0;
    let half = dir.join("half");
    train_two_steps(&half);
    let copy_ranks = |to: &Path, ranks: &[usize]| {
        for r in ranks {
            let name = format!("rank_{r}/checkpoint_{r}.safetensors");
            std::fs::create_dir_all(to.join(format!("rank_{r}"))).unwrap();
            std::fs::copy(half.join(&name), to.join(&name)).unwrap();
        }
    };
    // Rank 0's file of the sharded set alone: it holds a shard, of another shape than the
    // merged tensor's.
    let shard = dir.join("shard");
    copy_ranks(&shard, &[0]);
    let file = ckpt::CheckpointFile::open(&shard.join("rank_0/checkpoint_0.safetensors")).unwrap();
    let original = ckpt::CheckpointFile::open(
        &tessera_merged(&half, &dir.join("merged")).join("rank_0/checkpoint_0.safetensors"),
    )
    .unwrap();
    let sharded = file
        .tensors()
        .iter()
        .find(|t| original.tensor(&t.name).unwrap().shape != t.shape)
        .expect("a tensor sharded on rank 0");
    let out = dir.join("out_shard");
    let run = resume_without_strategy(&shard, &out, 8);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{err}");
    assert!(
        err.contains(&format!("tensor {:?}", sharded.name))
            && err.contains("output.resume_strategy"),
        "{err}"
    );
    assert!(!out.join("rank_0").exists());

    let two = dir.join("two");
    copy_ranks(&two, &[0, 1]);
    let out = dir.join("out_two");
    let run = resume_without_strategy(&two, &out, 8);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{err}");
    assert!(
        err.contains("output.resume_strategy") && err.contains("holds ranks [0, 1]"),
        "{err}"
    );
    assert!(!out.join("rank_0").exists());
}

/// `tessera ckpt convert` of the set `src` into `dst` with no destination strategy (merged).
fn tessera_merged(src: &Path, dst: &Path) -> std::path::PathBuf {
    convert_set(src, dst, None, None);
    dst.to_path_buf()
}

/// The 8-device run of `train_cmd` stopped after 2 of its 4 steps, its set in `out`.
fn train_two_steps(out: &Path) {
    let mut first = train_cmd(out, 8);
    first.args(["--set", "train.max_steps=2"]);
    assert!(first.status().unwrap().success());
}

/// `tessera ckpt convert` of the run `src` (its `strategy.json`) into `dst`: to `dst_strategy`,
/// or merged into rank 0 without one, in `format` or the source's.
fn convert_set(src: &Path, dst: &Path, dst_strategy: Option<&Path>, format: Option<&str>) {
    let src_strategy = src.join("strategy.json");
    let mut args = vec![
        "ckpt",
        "convert",
        "--src",
        s(src),
        "--src-strategy",
        s(&src_strategy),
        "--dst",
        s(dst),
    ];
    if let Some(strategy) = dst_strategy {
        args.extend(["--dst-strategy", s(strategy)]);
    }
    if let Some(format) = format {
        args.extend(["--format", format]);
    }
    assert_ok(&tessera(&args));
}
