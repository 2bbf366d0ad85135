//! Checkpoint sets end to end: a conversion or a training save killed at any point (SIGINT or
//! SIGKILL) leaves its destination holding the old complete set or the new one, and `verify`
//! agrees; two writers into one destination never both write it; the tools refuse to harm
//! what they did not create.

use std::path::{Path, PathBuf};
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
    let scratch = Scratch::new("interrupt-convert");
    let dir = &scratch.0;
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
