//! `tessera ckpt` given hostile or mistaken inputs: every path flag checked before any work,
//! and strategies that describe tensors the checkpoint does not hold.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::util::{assert_ok, s, tessera, Scratch};

/// The MindSpore reference case the tests read (part of the repository).
fn case1() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/mindspore/cases/case1_dp2mp4_to_2x2");
    assert!(dir.is_dir(), "{} is missing", dir.display());
    dir
}

/// What a failed command printed on stderr; fails the test if it succeeded.
#[track_caller]
fn refused(out: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{what} was accepted:\n{err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    err
}

/// Every path flag of every `tessera ckpt` subcommand is checked before any work: a directory
/// where a file is expected, a missing path, a file where a directory is expected, an output
/// under a regular file. The error names the flag, the path, what is wrong and what was
/// expected, and nothing is created.
#[test]
fn every_path_flag_is_checked_before_any_work() {
    let c = case1();
    let dir = Scratch::new("ckpt-path-flags");
    let file = dir.0.join("plain.txt");
    std::fs::write(&file, b"not a directory").unwrap();
    let missing = dir.0.join("missing");
    let under_file = file.join("out");
    let (src, sa, sb) = (
        c.join("src_ckpt"),
        c.join("strategy/A.ckpt"),
        c.join("strategy/B.ckpt"),
    );
    let strategy_dir = c.join("strategy");
    let fresh = dir.0.join("fresh");
    let (src, sa, sb, strategy_dir, fresh) = (s(&src), s(&sa), s(&sb), s(&strategy_dir), s(&fresh));
    let (file, missing, under_file) = (s(&file), s(&missing), s(&under_file));
    let unified = c.join("expected/unified_safetensors");
    let unified = s(&unified);
    // (arguments, flag named, path named, what is wrong)
    let cases: Vec<(Vec<&str>, &str, &str, &str)> = vec![
        (
            vec![
                "convert",
                "--src",
                src,
                "--src-strategy",
                strategy_dir,
                "--dst",
                fresh,
            ],
            "--src-strategy",
            strategy_dir,
            "is a directory",
        ),
        (
            vec![
                "convert",
                "--src",
                file,
                "--src-strategy",
                sa,
                "--dst",
                fresh,
            ],
            "--src",
            file,
            "is a file",
        ),
        (
            vec![
                "convert",
                "--src",
                src,
                "--src-strategy",
                sa,
                "--dst-strategy",
                missing,
                "--dst",
                fresh,
            ],
            "--dst-strategy",
            missing,
            "does not exist",
        ),
        (
            vec![
                "convert",
                "--src",
                src,
                "--src-strategy",
                sa,
                "--dst",
                under_file,
            ],
            "--dst",
            under_file,
            "is a file, not a directory",
        ),
        (
            vec!["convert", "--src", src, "--src-strategy", sa, "--dst", file],
            "--dst",
            file,
            "is a file",
        ),
        (
            vec![
                "convert",
                "--src",
                src,
                "--src-strategy",
                sa,
                "--dst",
                fresh,
                "--dec-key-file",
                strategy_dir,
            ],
            "--dec-key-file",
            strategy_dir,
            "is a directory",
        ),
        (
            vec!["ranks", "--src-strategy", missing, "--rank", "0"],
            "--src-strategy",
            missing,
            "does not exist",
        ),
        (
            vec![
                "ranks",
                "--src-strategy",
                sa,
                "--dst-strategy",
                strategy_dir,
                "--rank",
                "0",
            ],
            "--dst-strategy",
            strategy_dir,
            "is a directory",
        ),
        (
            vec!["merge", "--src", missing, "--strategy", sa, "--dst", fresh],
            "--src",
            missing,
            "does not exist",
        ),
        (
            vec![
                "merge",
                "--src",
                src,
                "--strategy",
                strategy_dir,
                "--dst",
                fresh,
            ],
            "--strategy",
            strategy_dir,
            "is a directory",
        ),
        (
            vec!["merge", "--src", src, "--strategy", sa, "--dst", under_file],
            "--dst",
            under_file,
            "is a file, not a directory",
        ),
        (
            vec!["load", "--unified", file, "--strategy", sb, "--dst", fresh],
            "--unified",
            file,
            "is a file",
        ),
        (
            vec![
                "load",
                "--unified",
                unified,
                "--strategy",
                missing,
                "--dst",
                fresh,
            ],
            "--strategy",
            missing,
            "does not exist",
        ),
        (
            vec![
                "load",
                "--unified",
                unified,
                "--strategy",
                sb,
                "--dst",
                file,
            ],
            "--dst",
            file,
            "is a file",
        ),
        (
            vec!["dedup", "--src", src, "--strategy", sa, "--dst", under_file],
            "--dst",
            under_file,
            "is a file, not a directory",
        ),
        (
            vec![
                "dedup",
                "--src",
                src,
                "--strategy",
                strategy_dir,
                "--dst",
                fresh,
            ],
            "--strategy",
            strategy_dir,
            "is a directory",
        ),
        (
            vec!["redundancy", "--strategy", strategy_dir],
            "--strategy",
            strategy_dir,
            "is a directory",
        ),
        (
            vec!["verify", "--src", file, "--strategy", sa],
            "--src",
            file,
            "is a file",
        ),
        (
            vec!["verify", "--src", src, "--strategy", missing],
            "--strategy",
            missing,
            "does not exist",
        ),
        (
            vec!["load-segmented", src, "--out", strategy_dir],
            "--out",
            strategy_dir,
            "is a directory",
        ),
        (
            vec![
                "diff",
                src,
                src,
                "--strategy-a",
                strategy_dir,
                "--strategy-b",
                sa,
            ],
            "--strategy-a",
            strategy_dir,
            "is a directory",
        ),
    ];
    for (args, flag, path, wrong) in cases {
        let mut full = vec!["ckpt"];
        full.extend(&args);
        let err = refused(&tessera(&full), &format!("{args:?}"));
        let said = format!("{flag} {path}: ");
        assert!(
            err.contains(&said) && err.contains(wrong) && err.contains("; expected a"),
            "{args:?} should say {said:?}, {wrong:?} and what was expected: {err}"
        );
        assert!(
            !Path::new(fresh).exists(),
            "{args:?} created {fresh} before refusing"
        );
    }
}

/// A strategy that gives shapes (MindSpore's JSON flavour) and lists a tensor no rank file
/// holds (MindSpore leaves bf16 out of its safetensors) is a missing tensor, as the protobuf
/// flavour's is: refused naming it and `--allow-missing`, or skipped with it. Before, the tensor
/// was bound from the strategy alone and every tool failed with "its element type cannot be
/// sliced (not a numeric dtype)".
#[test]
fn a_strategy_with_shapes_listing_a_tensor_no_file_holds() {
    let c = case1();
    let dir = Scratch::new("ckpt-absent-tensor");
    let (src, sa, sb) = (
        c.join("src_safetensors"),
        c.join("strategy/A.json"),
        c.join("strategy/B.json"),
    );
    let convert = |dst: &Path, extra: &[&str]| {
        let mut args = vec![
            "ckpt",
            "convert",
            "--quiet",
            "--json",
            "--src",
            s(&src),
            "--src-strategy",
            s(&sa),
            "--dst-strategy",
            s(&sb),
            "--dst",
            s(dst),
        ];
        args.extend_from_slice(extra);
        tessera(&args)
    };
    let refused_dst = dir.0.join("refused");
    let err = refused(&convert(&refused_dst, &[]), "an incomplete source");
    for part in ["\"net.bf\"", "A.json", "--allow-missing"] {
        assert!(err.contains(part), "{err}");
    }
    assert!(!err.contains("cannot be sliced"), "{err}");
    assert!(!refused_dst.exists());

    let out_dir = dir.0.join("converted");
    let out = convert(&out_dir, &["--allow-missing"]);
    assert_ok(&out);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ranks"].as_array().unwrap().len(), 4);
    let skipped: Vec<&str> = report["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(skipped.iter().all(|n| *n == "net.bf") && !skipped.is_empty());

    // Merging skips it; the merged tensors equal MindSpore's unified_safetensors output.
    let merged = dir.0.join("merged");
    let out = tessera(&[
        "ckpt",
        "merge",
        "--quiet",
        "--json",
        "--src",
        s(&src),
        "--strategy",
        s(&sa),
        "--dst",
        s(&merged),
    ]);
    assert_ok(&out);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["skipped"][0]["name"], "net.bf");

    // Comparing it with the .ckpt shards (which hold net.bf): only B holds it, every other
    // tensor is bitwise equal.
    let out = tessera(&[
        "ckpt",
        "diff",
        "--json",
        s(&src),
        s(&c.join("src_ckpt")),
        "--strategy-a",
        s(&sa),
        "--strategy-b",
        s(&sa),
    ]);
    let err = refused(&out, "a diff with a tensor on one side only");
    assert!(err.contains("only in") && err.contains("net.bf"), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["only_in_b"], serde_json::json!(["net.bf"]));
    assert_eq!(report["only_in_a"], serde_json::json!([]));
    let tensors = report["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 5);
    assert!(
        tensors.iter().all(|t| t["bitwise_equal"] == true),
        "{report}"
    );
}

/// `load-segmented DIR --out DIR/merged.ckpt` writes where a later load of DIR reads it as one
/// more segment (the later file by name wins a duplicate tensor, MindSpore's rule): the
/// command says so, and says nothing when the output goes elsewhere.
#[test]
fn a_segment_merge_written_into_its_own_directory_is_warned_about() {
    let dir = Scratch::new("ckpt-segments-out");
    let segments = dir.0.join("segments");
    std::fs::create_dir_all(&segments).unwrap();
    for part in ["part0.ckpt", "part1.ckpt"] {
        std::fs::copy(case1().join("segmented").join(part), segments.join(part)).unwrap();
    }
    let inside = segments.join("zz_merged.ckpt");
    let out = tessera(&["ckpt", "load-segmented", s(&segments), "--out", s(&inside)]);
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: --out") && err.contains("one more segment"),
        "{err}"
    );
    let outside = dir.0.join("merged.ckpt");
    let out = tessera(&["ckpt", "load-segmented", s(&segments), "--out", s(&outside)]);
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("warning"), "{err}");
}

/// `tessera ckpt inspect` checks a strategy's layouts against the shapes it records, as a
/// conversion does: a split that does not divide its dim, or a shape of another rank than the
/// layout's, is an error naming the tensor and the rule, with a non-zero exit and no listing.
/// Before, both files were listed and the command succeeded.
#[test]
fn inspect_refuses_a_strategy_whose_layouts_do_not_fit_its_shapes() {
    let dir = Scratch::new("ckpt-inspect-shapes");
    let mesh = r#"{"axes": [["dp", 2], ["mp", 4]], "rank_range": [0, 8]}"#;
    let file = |name: &str, shape: &str| {
        let path = dir.0.join(name);
        std::fs::write(
            &path,
            format!(
                r#"{{"format": "tessera-strategy", "version": 2, "tensors": [{{"name": "blocks.0.w", "shape": {shape}, "dtype": "f32", "placements": [{{"stage": 0, "mesh": {mesh}, "dims": [["mp"], []]}}]}}]}}"#
            ),
        )
        .unwrap();
        path
    };
    let good = file("good.json", "[8, 4]");
    let out = tessera(&["ckpt", "inspect", s(&good)]);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("blocks.0.w"));
    for (name, shape, rule) in [
        ("uneven.json", "[6, 4]", "6"),
        ("rank3.json", "[8, 4, 2]", "dims"),
    ] {
        let path = file(name, shape);
        let out = tessera(&["ckpt", "inspect", s(&path)]);
        let err = refused(&out, name);
        assert!(
            err.contains(s(&path)) && err.contains("\"blocks.0.w\"") && err.contains(rule),
            "{name}: {err}"
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("blocks.0.w"),
            "{name}: listed"
        );
    }
}
