//! `tessera ckpt diff` (issue 17) end to end on training runs: identical runs, a run against
//! itself converted to another strategy, a tensor perturbed by one ulp (with and without a
//! tolerance), and a tensor missing on one side.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::util::{assert_ok, s, tessera, Scratch};

/// Trains the seed MLP for two steps from `config` into `dir`.
fn train(config: &str, dir: &Path) {
    assert_ok(&tessera(&[
        "train",
        config,
        "--set",
        "train.max_steps=2",
        "--set",
        "train.eval=false",
        "--set",
        &format!("output.dir=\"{}\"", s(dir)),
    ]));
}

fn diff(a: &Path, b: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["ckpt", "diff", s(a), s(b)];
    args.extend_from_slice(extra);
    tessera(&args)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The parameter names a run's strategy lists, in order.
fn param_names(run: &Path) -> Vec<String> {
    let strategy = ckpt::Strategy::load(&run.join("strategy.json")).unwrap();
    strategy.params.iter().map(|p| p.name.clone()).collect()
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).unwrap();
        }
    }
}

/// Adds one ulp to the first f32 element of `tensor` in every safetensors file of `run`'s rank
/// folders that holds it (every replica, so the merged tensor differs whichever replica is
/// read). Returns how many files were changed.
fn perturb_one_ulp(run: &Path, tensor: &str) -> usize {
    let mut changed = 0;
    for entry in std::fs::read_dir(run).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&dir).unwrap() {
            let path: PathBuf = file.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("safetensors") {
                continue;
            }
            let mut bytes = std::fs::read(&path).unwrap();
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            let Some(entry) = header.get(tensor) else {
                continue;
            };
            assert_eq!(entry["dtype"], "F32", "{tensor} in {}", path.display());
            let start = 8 + n + entry["data_offsets"][0].as_u64().unwrap() as usize;
            let old = f32::from_le_bytes(bytes[start..start + 4].try_into().unwrap());
            let new = f32::from_bits(old.to_bits() + 1);
            bytes[start..start + 4].copy_from_slice(&new.to_le_bytes());
            std::fs::write(&path, bytes).unwrap();
            changed += 1;
        }
    }
    changed
}

#[test]
fn ckpt_diff_finds_bitwise_equality_differences_and_missing_tensors() {
    let dir = Scratch::new("ckpt-diff");
    let (a, b) = (dir.0.join("a"), dir.0.join("b"));
    train("examples/seed_semi_auto.toml", &a);
    train("examples/seed_semi_auto.toml", &b);
    let names = param_names(&a);
    assert!(names.len() >= 2, "{names:?}");

    // Two identical runs: every tensor bitwise equal, exit 0.
    let out = diff(&a, &b, &[]);
    assert_ok(&out);
    let text = stdout(&out);
    for name in &names {
        assert!(
            text.lines()
                .any(|l| l.starts_with("EQUAL") && l.contains(name.as_str())),
            "{name} reported equal:\n{text}"
        );
    }
    assert!(text.trim_end().ends_with("OK"), "{text}");
    let out = diff(&a, &b, &["--json"]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["bitwise_equal"], true);
    assert_eq!(v["tensors"].as_array().unwrap().len(), names.len());
    assert_eq!(v["tensors"][0]["max_abs"], 0.0);

    // The same run converted to another strategy (one device): conversion moves bytes, so
    // the merged tensors are bitwise equal.
    let stand_alone = dir.0.join("stand_alone");
    train("examples/seed_stand_alone.toml", &stand_alone);
    let converted = dir.0.join("converted");
    assert_ok(&tessera(&[
        "ckpt",
        "convert",
        "--quiet",
        "--src",
        s(&a),
        "--src-strategy",
        s(&a.join("strategy.json")),
        "--dst",
        s(&converted),
        "--dst-strategy",
        s(&stand_alone.join("strategy.json")),
    ]));
    let other_strategy = stand_alone.join("strategy.json");
    let out = diff(&a, &converted, &["--strategy-b", s(&other_strategy)]);
    assert_ok(&out);
    // A differently trained run under that strategy differs, and the command says so.
    let out = diff(&a, &stand_alone, &[]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("not bitwise equal"),
        "{}",
        stderr(&out)
    );

    // One tensor perturbed by one ulp: non-zero exit naming it; a tolerance of 1e-6 accepts.
    let perturbed = dir.0.join("perturbed");
    copy_dir(&b, &perturbed);
    let victim = &names[0];
    assert!(perturb_one_ulp(&perturbed, victim) > 0);
    let out = diff(&a, &perturbed, &[]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        err.contains("1 tensor(s) not bitwise equal") && err.contains(victim.as_str()),
        "{err}"
    );
    let line = text
        .lines()
        .find(|l| l.contains(victim.as_str()))
        .unwrap_or_else(|| panic!("no line for {victim}:\n{text}"));
    assert!(line.starts_with("DIFFERS"), "{line}");
    for other in &names[1..] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("EQUAL") && l.contains(other.as_str())),
            "{other} still equal:\n{text}"
        );
    }
    let out = diff(&a, &perturbed, &["--tolerance", "1e-6"]);
    assert_ok(&out);
    assert!(
        stdout(&out)
            .lines()
            .any(|l| l.starts_with("WITHIN") && l.contains(victim.as_str())),
        "{}",
        stdout(&out)
    );
    let out = diff(&a, &perturbed, &["--tolerance", "1e-9", "--json"]);
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == victim.as_str())
        .unwrap();
    assert_eq!(row["status"], "differs");
    assert!(row["differing_elements"].as_u64().unwrap() >= 1, "{row}");
    let rel = row["max_rel"].as_f64().unwrap();
    assert!(rel > 0.0 && rel < 2.5e-7, "one ulp of an f32: {row}");

    // A tensor missing on one side: B's strategy without the last parameter.
    let missing = names.last().unwrap();
    let (resolved, _) = ckpt::Strategy::load(&b.join("strategy.json"))
        .unwrap()
        .resolve(|_, _| Ok(None))
        .unwrap();
    let kept: Vec<ckpt::ResolvedParam> = resolved
        .params()
        .iter()
        .filter(|p| &p.name != missing)
        .cloned()
        .collect();
    let fewer = dir.0.join("fewer.json");
    ckpt::save_param_strategy_file(
        &fewer,
        &ckpt::ResolvedStrategy::new(kept).unwrap(),
        &[],
        ckpt::StrategyFlavour::Tessera,
        false,
    )
    .unwrap();
    let out = diff(&a, &b, &["--strategy-b", s(&fewer)]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("1 tensor(s) only in") && err.contains(missing.as_str()),
        "{err}"
    );
    assert!(
        stdout(&out).contains(&format!("ONLY-A   {missing}")),
        "{}",
        stdout(&out)
    );

    // Bad input is refused with the reason.
    let out = diff(&a, &dir.0.join("nowhere"), &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("strategy"), "{}", stderr(&out));
    let out = diff(&a, &b, &["--tolerance=-1"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--tolerance"), "{}", stderr(&out));
}
