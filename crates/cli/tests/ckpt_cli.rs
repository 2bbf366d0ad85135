//! The `tessera ckpt` and `tessera strategy` commands end to end: output, `--json` and exit
//! codes, on the MindSpore reference cases (skipped, with the reason printed, when absent).

use std::path::{Path, PathBuf};

use crate::util::{assert_ok, s, tessera, Scratch};

/// A MindSpore reference case, copied into the repository (`tests/fixtures/mindspore/`).
fn case(name: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/mindspore/cases")
        .join(name);
    assert!(
        dir.is_dir(),
        "{} is missing: the MindSpore conformance fixtures are part of the repository",
        dir.display()
    );
    Some(dir)
}

#[test]
fn strategy_show_json_is_build_searched_strategy() {
    let Some(c) = case("case1_dp2mp4_to_2x2") else {
        return;
    };
    let out = tessera(&["strategy", "show", "--json", s(&c.join("strategy/A.ckpt"))]);
    assert_ok(&out);
    let ours: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let theirs: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(c.join("expected/build_searched_strategy_A.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(ours, theirs);
}

#[test]
fn restore_ranks() {
    let Some(c) = case("case5_group_info") else {
        return;
    };
    let out = tessera(&[
        "strategy",
        "restore-ranks",
        "--json",
        s(&c.join("group_info.pb")),
    ]);
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[0,1,2,3]");
    let out = tessera(&[
        "strategy",
        "restore-ranks",
        s(&c.join("group_info_no_restore.pb")),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ckpt_restore_rank_list"));
}

#[test]
fn ranks_json() {
    let Some(c) = case("case3_opt_shard_to_4") else {
        return;
    };
    let out = tessera(&[
        "ckpt",
        "ranks",
        "--json",
        "--src-strategy",
        s(&c.join("strategy/A.ckpt")),
        "--dst-strategy",
        s(&c.join("strategy/B.ckpt")),
        "--rank",
        "1",
    ]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source_ranks"], serde_json::json!([0, 1, 4, 5, 6, 7]));
    assert_eq!(v["minimal"], "exact");
}

#[test]
fn convert_verify_and_refuse_overwrite() {
    let Some(c) = case("case1_dp2mp4_to_2x2") else {
        return;
    };
    let dir = Scratch::new("convert");
    let dst = dir.0.join("out");
    let (src, sa, sb) = (
        c.join("src_ckpt"),
        c.join("strategy/A.ckpt"),
        c.join("strategy/B.ckpt"),
    );
    let convert = |extra: &[&str]| {
        let mut args = vec![
            "ckpt",
            "convert",
            "--quiet",
            "--json",
            "--src",
            s(&src),
            "--src-strategy",
            s(&sa),
            "--dst",
            s(&dst),
            "--dst-strategy",
            s(&sb),
        ];
        args.extend_from_slice(extra);
        tessera(&args)
    };
    let out = convert(&[]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ranks"].as_array().unwrap().len(), 4);
    // A second run refuses to overwrite, and says so.
    let out = convert(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_ok(&convert(&["--force"]));
    let verify = |strategy: &str| {
        tessera(&[
            "ckpt",
            "verify",
            "--replicas",
            "--src",
            s(&dst),
            "--strategy",
            s(&c.join("strategy").join(strategy)),
        ])
    };
    let out = verify("B.ckpt");
    assert_ok(&out);
    // Against the wrong strategy, the shapes do not fit: faults and a non-zero exit.
    let out = verify("A.ckpt");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAULT"));
}

#[test]
fn inspect_checkpoint_and_strategy() {
    let Some(c) = case("case1_dp2mp4_to_2x2") else {
        return;
    };
    let out = tessera(&[
        "ckpt",
        "inspect",
        "--json",
        s(&c.join("src_ckpt/rank_5/checkpoint_5.ckpt")),
    ]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tensors"].as_array().unwrap().len(), 7);
    assert_eq!(v["tensors"][5]["dtype"], "BFloat16");
    let out = tessera(&["ckpt", "inspect", s(&c.join("strategy/A.ckpt"))]);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("net.w1"));
}

#[test]
fn merge_split_runs_and_file_suffix() {
    let Some(c) = case("case1_dp2mp4_to_2x2") else {
        return;
    };
    let dir = Scratch::new("merge-split");
    let (src, strategy) = (c.join("src_safetensors"), c.join("strategy/A.ckpt"));
    let merge = |dst: &Path, extra: &[&str]| {
        let mut args = vec![
            "ckpt",
            "merge",
            "--src",
            s(&src),
            "--strategy",
            s(&strategy),
            "--dst",
            s(dst),
            "--max-part-bytes",
            "64",
            "--json",
        ];
        args.extend_from_slice(extra);
        tessera(&args)
    };
    let whole = dir.0.join("whole");
    assert_ok(&merge(&whole, &[]));
    let split = dir.0.join("split");
    let second = merge(&split, &["--split", "2/2", "--file-suffix", "_0"]);
    // "_0" matches only rank 0's file name: the other ranks have no matching file.
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("file_suffix"));
    for k in ["2/2", "1/2"] {
        let out = merge(&split, &["--split", k]);
        assert_ok(&out);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["index"].is_null(), k == "2/2", "{k}: {report}");
    }
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".safetensors") || n.ends_with(".json"))
            .filter(|n| n != "tessera_set.json")
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&split), names(&whole));
    assert!(!merge(&dir.0.join("bad"), &["--split", "3/2"])
        .status
        .success());
    assert!(!merge(&dir.0.join("bad"), &["--split", "x"])
        .status
        .success());
}

/// The files of `dir`'s `rank_<r>/` directories, bytes by relative path.
fn rank_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for rank in std::fs::read_dir(dir).unwrap() {
        let rank = rank.unwrap().path();
        if !rank.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&rank).unwrap() {
            let f = f.unwrap().path();
            let rel = f.strip_prefix(dir).unwrap().to_path_buf();
            files.push((rel, std::fs::read(&f).unwrap()));
        }
    }
    files.sort();
    files
}

#[test]
fn convert_reads_encrypted_sources_with_dec_key() {
    let Some(c) = case("case1_dp2mp4_to_2x2") else {
        return;
    };
    let dir = Scratch::new("dec-key");
    let key = b"0123456789abcdef";
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let enc = dir.0.join("enc");
    for r in 0..8 {
        let name = format!("rank_{r}/checkpoint_{r}.ckpt");
        std::fs::create_dir_all(enc.join(format!("rank_{r}"))).unwrap();
        ckpt::crypto::encrypt_file(
            &c.join("src_ckpt").join(&name),
            &enc.join(&name),
            key,
            ckpt::CipherMode::AesCbc,
            false,
        )
        .unwrap();
    }
    let key_file = dir.0.join("key");
    std::fs::write(&key_file, key).unwrap();
    let (sa, sb) = (c.join("strategy/A.ckpt"), c.join("strategy/B.ckpt"));
    let convert = |src: &Path, dst: &Path, extra: &[&str]| {
        let mut args = vec![
            "ckpt",
            "convert",
            "--quiet",
            "--src",
            s(src),
            "--src-strategy",
            s(&sa),
            "--dst",
            s(dst),
            "--dst-strategy",
            s(&sb),
        ];
        args.extend_from_slice(extra);
        tessera(&args)
    };
    let plain = dir.0.join("plain");
    assert_ok(&convert(&c.join("src_ckpt"), &plain, &[]));
    // The hex key and the key file both give the plain conversion's bytes.
    let (by_hex, by_file) = (dir.0.join("hex"), dir.0.join("file"));
    assert_ok(&convert(
        &enc,
        &by_hex,
        &["--dec-key", &hex, "--dec-mode", "AES-CBC"],
    ));
    let key_arg = ["--dec-key-file", s(&key_file), "--dec-mode", "AES-CBC"];
    assert_ok(&convert(&enc, &by_file, &key_arg));
    assert_eq!(rank_files(&by_hex), rank_files(&plain));
    assert_eq!(rank_files(&by_file), rank_files(&plain));
    // Without a key, with the wrong key or the wrong mode: an error, and no output.
    let wrong: String = "ff".repeat(16);
    for (extra, says) in [
        (&[][..], "encrypted"),
        (&["--dec-key", &wrong, "--dec-mode", "AES-CBC"][..], ""),
        (&["--dec-key", &hex, "--dec-mode", "AES-GCM"][..], ""),
        (&["--dec-key", "abc"][..], "hex"),
        (&["--dec-mode", "AES-CBC"][..], "needs a key"),
    ] {
        let out_dir = dir.0.join("refused");
        let out = convert(&enc, &out_dir, extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(err.contains(says), "{extra:?}: {err}");
        assert!(!out_dir.exists(), "{extra:?} left {}", out_dir.display());
    }
}

#[test]
fn convert_slices_an_unsharded_source_without_src_strategy() {
    let Some(c) = case("case1_dp2mp4_to_2x2") else {
        return;
    };
    let dir = Scratch::new("unsharded");
    let dst = dir.0.join("out");
    let out = tessera(&[
        "ckpt",
        "convert",
        "--quiet",
        "--src",
        s(&c.join("full_ckpt")),
        "--dst",
        s(&dst),
        "--dst-strategy",
        s(&c.join("strategy/A.ckpt")),
    ]);
    assert_ok(&out);
    // The way MindSpore made the reference's sharded sources from the full checkpoint.
    assert_eq!(rank_files(&dst), rank_files(&c.join("src_ckpt")));
    let out = tessera(&[
        "ckpt",
        "convert",
        "--src",
        s(&c.join("full_ckpt")),
        "--dst",
        s(&dir.0.join("x")),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to convert"));
}

/// Every file under `dir` by relative path, with the set id blanked out.
fn set_files(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let id = ckpt::SetMarker::read(dir).unwrap().expect("a set").id;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).replace(&id, "#");
            out.insert(path.strip_prefix(dir).unwrap().to_path_buf(), text.into());
        }
    }
    out
}

#[test]
fn no_fsync_converts_and_merges_to_the_same_files() {
    let Some(c) = case("case1_dp2mp4_to_2x2") else {
        return;
    };
    let dir = Scratch::new("no-fsync");
    let (src, sa, sb) = (
        c.join("src_ckpt"),
        c.join("strategy/A.ckpt"),
        c.join("strategy/B.ckpt"),
    );
    let run = |args: &[&str], dst: &Path, extra: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--quiet", "--dst", s(dst)]);
        all.extend_from_slice(extra);
        assert_ok(&tessera(&all));
    };
    let convert = [
        "ckpt",
        "convert",
        "--src",
        s(&src),
        "--src-strategy",
        s(&sa),
        "--dst-strategy",
        s(&sb),
    ];
    let merge = ["ckpt", "merge", "--src", s(&src), "--strategy", s(&sa)];
    for (name, args) in [("convert", &convert[..]), ("merge", &merge[..])] {
        let (on, off) = (
            dir.0.join(format!("{name}_on")),
            dir.0.join(format!("{name}_off")),
        );
        run(args, &on, &[]);
        run(args, &off, &["--no-fsync"]);
        let files = set_files(&on);
        assert!(files.len() > 1, "{name}: {:?}", files.keys());
        assert_eq!(files, set_files(&off), "{name}");
    }
    let help = tessera(&["ckpt", "convert", "--help"]);
    assert_ok(&help);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("--no-fsync") && text.contains("power loss"),
        "{text}"
    );
}

#[test]
fn strategy_show_json_gives_consecutive_ranks_as_a_range() {
    let dir = Scratch::new("show-ranks");
    let file = dir.0.join("strategy.json");
    let placement = |stage: usize, ranks: &[usize]| {
        format!(
            r#"{{"stage": {stage}, "mesh": {{"axes": [["dp", 2], ["mp", 4]], "rank_list": {ranks:?}}}, "dims": [["dp"], ["mp"]]}}"#
        )
    };
    let tensor = |name: &str, placements: &[String]| {
        format!(
            r#"{{"name": "{name}", "shape": [8, 8], "dtype": "f32", "placements": [{}]}}"#,
            placements.join(", ")
        )
    };
    let spread = [0, 2, 4, 6, 1, 3, 5, 7];
    let text = format!(
        r#"{{"format": "tessera-strategy", "version": 1, "tensors": [{}, {}]}}"#,
        tensor(
            "a",
            &[
                placement(0, &(0..8).collect::<Vec<_>>()),
                placement(1, &(8..16).collect::<Vec<_>>())
            ]
        ),
        tensor("b", &[placement(0, &spread)]),
    );
    std::fs::write(&file, text).unwrap();
    let out = tessera(&["strategy", "show", "--json", s(&file)]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let a = &v["tensors"][0]["placements"];
    assert_eq!(a[0]["rank_range"], serde_json::json!([0, 8]), "{v}");
    assert_eq!(a[1]["rank_range"], serde_json::json!([8, 8]), "{v}");
    assert!(
        a[0].get("rank_list").is_none() && a[1].get("rank_list").is_none(),
        "{v}"
    );
    let b = &v["tensors"][1]["placements"][0];
    assert_eq!(b["rank_list"], serde_json::json!(spread), "{v}");
    assert!(b.get("rank_range").is_none(), "{v}");
}

/// A pipeline source merged into one rank writes its tensors in MindSpore's order: MindSpore
/// reads the last stage's files first and writes the parameters it redistributes before the
/// rest (`global_step`). The expected file is MindSpore 2.10's own `convert_checkpoints`
/// output (`tests/fixtures/mindspore/generated/pipeline_merge_order/README.md`); before the
/// fix Tessera followed rank 0's file, stage 0's parameters first.
#[test]
fn pipeline_merge_writes_mindspores_tensor_order() {
    let c = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/mindspore/generated/pipeline_merge_order");
    let scratch = Scratch::new("pipeline_merge_order");
    let dst = scratch.0.join("out");
    let out = tessera(&[
        "ckpt",
        "convert",
        "--src",
        s(&c.join("src")),
        "--src-strategy",
        s(&c.join("strategy/A.ckpt")),
        "--dst",
        s(&dst),
        "--prefix",
        "converted_",
        "--quiet",
        "--no-fsync",
    ]);
    assert_ok(&out);
    let ours = std::fs::read(dst.join("rank_0/converted_0.ckpt")).unwrap();
    let theirs =
        std::fs::read(c.join("expected/convert_A_to_full/rank_0/converted_0.ckpt")).unwrap();
    assert!(
        ours == theirs,
        "converted_0.ckpt is not byte-identical to MindSpore's (tensor order)"
    );
}

/// The tensors of a safetensors file: name → (dtype, shape, bytes).
fn safetensors_tensors(
    path: &Path,
) -> std::collections::BTreeMap<String, (String, Vec<u64>, Vec<u8>)> {
    let data = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&data[8..8 + n]).unwrap();
    let mut out = std::collections::BTreeMap::new();
    for (name, v) in header.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        let off: Vec<usize> = v["data_offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        let shape = v["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        let bytes = data[8 + n + off[0]..8 + n + off[1]].to_vec();
        out.insert(
            name.clone(),
            (v["dtype"].as_str().unwrap().to_string(), shape, bytes),
        );
    }
    out
}

/// `ckpt load` slices only the parameters the target strategy lists, as MindSpore 2.10's
/// `load_distributed_checkpoint` does: a parameter of the unified checkpoint the strategy lacks
/// is left out (and reported as skipped). The expected files are MindSpore's own output
/// (`tests/fixtures/mindspore/generated/load_unlisted_params/README.md`); before the fix
/// Tessera wrote `net.p0` whole on every rank.
#[test]
fn load_leaves_out_parameters_the_target_strategy_lacks() {
    let c = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/mindspore/generated/load_unlisted_params");
    let scratch = Scratch::new("load_unlisted_params");
    let dst = scratch.0.join("out");
    let out = tessera(&[
        "ckpt",
        "load",
        "--unified",
        s(&c.join("unified")),
        "--strategy",
        s(&c.join("strategy/B.json")),
        "--dst",
        s(&dst),
        "--json",
        "--no-fsync",
    ]);
    assert_ok(&out);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("net.p0") && report.contains("not in the target strategy"),
        "the left-out parameter is not reported: {report}"
    );
    for r in 0..6 {
        let file = format!("rank_{r}/net.safetensors");
        let ours = safetensors_tensors(&dst.join(&file));
        let theirs = safetensors_tensors(&c.join("expected/load_distributed_B").join(&file));
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>(),
            "rank {r}: tensor names differ from MindSpore's"
        );
        assert!(ours == theirs, "rank {r}: tensors differ from MindSpore's");
    }
}
