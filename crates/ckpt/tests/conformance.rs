//! Conformance with MindSpore 2.10: every expected output of the reference cases (case1:
//! dp2×mp4 → 2×2 with f32/f16/bf16 and a parameter outside the strategy; case3: optimizer
//! sharding) is reproduced tensor for tensor. Where MindSpore is wrong or not minimal, the right
//! answer is asserted and the difference is documented in docs/MINDSPORE_DIFFERENCES.md.

use std::path::Path;

use ckpt::{ConvertOptions, Format, MergeOptions, Strategy};
use serde_json::Value;

use crate::util::{assert_same_safetensors_bytes, assert_same_tensors, case, read_all, tmp};

const CASES: [&str; 2] = ["case1_dp2mp4_to_2x2", "case3_opt_shard_to_4"];

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn each_case(f: impl Fn(&Path)) {
    for name in CASES {
        let Some(dir) = case(name) else { return };
        f(&dir);
    }
}

fn convert(
    c: &Path,
    src: &str,
    strategies: (&str, Option<&str>),
    format: Option<Format>,
    prefix: &str,
    ranks: Option<&[usize]>,
) -> tempfile::TempDir {
    let out = tmp();
    let opts = ConvertOptions {
        format,
        prefix,
        ranks,
        chunk_bytes: 4096, // small chunks exercise the chunked assembly
        // The safetensors sources lack the bf16 parameters their strategy lists; MindSpore
        // skips them silently, Tessera only when asked.
        allow_missing: src.contains("safetensors"),
        ..Default::default()
    };
    ckpt::convert_checkpoints(
        &c.join(src),
        &c.join("strategy").join(strategies.0),
        out.path(),
        strategies.1.map(|s| c.join("strategy").join(s)).as_deref(),
        &opts,
    )
    .unwrap();
    out
}

#[test]
fn convert_refuses_a_checkpoint_missing_strategy_parameters_unless_allowed() {
    // case1's safetensors sources lack the bf16 parameters of its strategy.
    if let Some(c) = case("case1_dp2mp4_to_2x2") {
        let c = c.as_path();
        let err = ckpt::convert_checkpoints(
            &c.join("src_safetensors"),
            &c.join("strategy/A.ckpt"),
            &tmp().path().join("out"),
            Some(&c.join("strategy/B.ckpt")),
            &ConvertOptions::default(),
        )
        .unwrap_err();
        assert!(
            matches!(&err, ckpt::CkptError::TensorMissing { rule, .. } if rule.contains("--allow-missing")),
            "{err}"
        );
    }
}

#[test]
fn convert_ckpt_a_to_b() {
    each_case(|c| {
        let out = convert(
            c,
            "src_ckpt",
            ("A.ckpt", Some("B.ckpt")),
            None,
            "converted_",
            None,
        );
        for r in 0..4 {
            let file = format!("rank_{r}/converted_{r}.ckpt");
            assert_same_tensors(
                &out.path().join(&file),
                &c.join("expected/convert_ckpt_A_to_B").join(&file),
                true,
            );
        }
    });
}

#[test]
fn convert_by_rank_a_to_b() {
    each_case(|c| {
        for r in 0..4 {
            let out = tmp();
            ckpt::convert_checkpoint_by_rank(
                r,
                &c.join("src_ckpt"),
                &c.join("strategy/A.ckpt"),
                out.path(),
                Some(&c.join("strategy/B.ckpt")),
                &ConvertOptions::default(),
            )
            .unwrap();
            // Only rank r was written (and the destination strategy, which the set records,
            // and the set's marker).
            let mut names: Vec<String> = std::fs::read_dir(out.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            assert_eq!(
                names,
                [
                    format!("rank_{r}"),
                    ckpt::SET_STRATEGY_FILE.to_string(),
                    ckpt::SET_MARKER.to_string()
                ]
            );
            assert_same_tensors(
                &out.path().join(format!("rank_{r}/checkpoint_{r}.ckpt")),
                &c.join(format!("expected/convert_by_rank_A_to_B/rank_{r}.ckpt")),
                true,
            );
        }
    });
}

#[test]
fn convert_ckpt_a_to_full() {
    each_case(|c| {
        let out = convert(c, "src_ckpt", ("A.ckpt", None), None, "merged_", None);
        assert_same_tensors(
            &out.path().join("rank_0/merged_0.ckpt"),
            &c.join("expected/convert_ckpt_A_to_full/rank_0/merged_0.ckpt"),
            true,
        );
        // Merging everything reproduces the unsharded weights too.
        assert_same_tensors(
            &out.path().join("rank_0/merged_0.ckpt"),
            &c.join("full_ckpt/rank_0/full.ckpt"),
            true,
        );
    });
}

#[test]
fn convert_ckpt_with_json_strategies() {
    each_case(|c| {
        let out = convert(
            c,
            "src_ckpt",
            ("A.json", Some("B.json")),
            None,
            "converted_",
            None,
        );
        for r in 0..4 {
            let file = format!("rank_{r}/converted_{r}.ckpt");
            assert_same_tensors(
                &out.path().join(&file),
                &c.join("expected/convert_ckpt_A_to_B_json").join(&file),
                true,
            );
        }
    });
}

#[test]
fn convert_safetensors_a_to_b() {
    each_case(|c| {
        let out = convert(
            c,
            "src_safetensors",
            ("A.ckpt", Some("B.ckpt")),
            None,
            "converted_",
            None,
        );
        for r in 0..4 {
            let file = format!("rank_{r}/converted_{r}.safetensors");
            let ours = out.path().join(&file);
            let expected = c.join("expected/convert_sf_A_to_B").join(&file);
            assert_same_tensors(&ours, &expected, true);
            // Header and order follow the reference writer, so the bytes match too (but for
            // the set id Tessera adds to the metadata).
            assert_same_safetensors_bytes(&ours, &expected);
        }
    });
}

#[test]
fn convert_safetensors_to_ckpt() {
    each_case(|c| {
        let out = convert(
            c,
            "src_safetensors",
            ("A.ckpt", Some("B.ckpt")),
            Some(Format::Ckpt),
            "converted_",
            None,
        );
        for r in 0..4 {
            let file = format!("rank_{r}/converted_{r}.ckpt");
            assert_same_tensors(
                &out.path().join(&file),
                &c.join("expected/convert_sf_A_to_B_as_ckpt").join(&file),
                false,
            );
        }
    });
}

#[test]
fn ckpt_output_is_byte_identical_to_mindspore() {
    each_case(|c| {
        let out = convert(
            c,
            "src_ckpt",
            ("A.ckpt", Some("B.ckpt")),
            None,
            "converted_",
            None,
        );
        for r in 0..4 {
            let file = format!("rank_{r}/converted_{r}.ckpt");
            assert_eq!(
                std::fs::read(out.path().join(&file)).unwrap(),
                std::fs::read(c.join("expected/convert_ckpt_A_to_B").join(&file)).unwrap(),
                "{file}"
            );
        }
    });
}

fn check_unified(c: &Path, src: &str, dedup: bool, expected: &str) {
    let out = tmp();
    let opts = MergeOptions {
        dedup,
        chunk_bytes: 1000,
        ..Default::default()
    };
    let report =
        ckpt::unified_safetensors(&c.join(src), &c.join("strategy/A.ckpt"), out.path(), &opts)
            .unwrap();
    let exp = c.join("expected").join(expected);
    assert_same_tensors(
        &out.path().join("part0.safetensors"),
        &exp.join("part0.safetensors"),
        true,
    );
    assert_same_safetensors_bytes(
        &out.path().join("part0.safetensors"),
        &exp.join("part0.safetensors"),
    );
    let ours = json(&out.path().join("param_name_map.json"));
    let theirs = json(&exp.join("param_name_map.json"));
    assert_eq!(ours, theirs);
    // Same key order (largest parameter first) as MindSpore's index.
    assert_eq!(
        std::fs::read_to_string(out.path().join("param_name_map.json")).unwrap(),
        std::fs::read_to_string(exp.join("param_name_map.json")).unwrap()
    );
    let hyper = exp.join("hyper_param.safetensors");
    assert_eq!(report.hyper.is_some(), hyper.exists());
    if hyper.exists() {
        assert_same_tensors(&out.path().join("hyper_param.safetensors"), &hyper, true);
    }
}

#[test]
fn unified_safetensors() {
    each_case(|c| check_unified(c, "src_safetensors", false, "unified_safetensors"));
}

#[test]
fn unified_safetensors_from_dedup_sources() {
    each_case(|c| {
        check_unified(
            c,
            "src_safetensors_dedup",
            true,
            "unified_safetensors_dedup",
        )
    });
}

#[test]
fn load_distributed_from_unified() {
    each_case(|c| {
        let out = tmp();
        let opts = ConvertOptions {
            chunk_bytes: 512,
            ..Default::default()
        };
        let report = ckpt::load_distributed_checkpoint(
            &c.join("expected/unified_safetensors"),
            &c.join("strategy/B.ckpt"),
            out.path(),
            &opts,
        )
        .unwrap();
        assert_eq!(report.ranks.len(), 4);
        for r in 0..4 {
            let file = format!("rank_{r}/net.safetensors");
            assert_same_tensors(
                &out.path().join(&file),
                &c.join("expected/load_distributed_B").join(&file),
                true,
            );
        }
    });
}

#[test]
fn load_segmented() {
    each_case(|c| {
        let entries = ckpt::load_segmented_checkpoints(&c.join("segmented")).unwrap();
        let expected = json(&c.join("expected/load_segmented_checkpoints.json"));
        let expected = expected.as_object().unwrap();
        assert_eq!(entries.len(), expected.len());
        for e in &entries {
            let x = &expected[&e.tensor.name];
            assert_eq!(x["dtype"], e.tensor.ty.mindspore_name());
            assert_eq!(x["shape"], serde_json::json!(e.tensor.shape));
        }
        // Written out, the union is the unsharded checkpoint.
        let out = tmp();
        let merged = out.path().join("all.ckpt");
        ckpt::write_segmented(
            &entries,
            &merged,
            false,
            ckpt::Durability::Fsync,
            &ckpt::NoProgress,
        )
        .unwrap();
        assert_same_tensors(&merged, &c.join("full_ckpt/rank_0/full.ckpt"), false);
    });
}

#[test]
fn build_searched_strategy() {
    each_case(|c| {
        for s in ["A", "B"] {
            let strategy = Strategy::load(&c.join(format!("strategy/{s}.ckpt"))).unwrap();
            let ms = ckpt::MsStrategyFile::of_strategy(&strategy)
                .unwrap()
                .expect("a MindSpore strategy file");
            let ours: Value = serde_json::from_str(&ms.searched_strategy_json()).unwrap();
            assert_eq!(
                ours,
                json(&c.join(format!("expected/build_searched_strategy_{s}.json")))
            );
        }
    });
}

#[test]
fn strategy_protobuf_round_trips_byte_for_byte() {
    each_case(|c| {
        for s in ["A", "B"] {
            let path = c.join(format!("strategy/{s}.ckpt"));
            let bytes = std::fs::read(&path).unwrap();
            let file = ckpt::MsStrategyFile::decode(&path, &bytes).unwrap();
            assert_eq!(file.encode(), bytes, "{}", path.display());
        }
    });
}

#[test]
fn protobuf_and_json_strategies_agree() {
    each_case(|c| {
        for s in ["A", "B"] {
            let pb = Strategy::load(&c.join(format!("strategy/{s}.ckpt"))).unwrap();
            let js = Strategy::load(&c.join(format!("strategy/{s}.json"))).unwrap();
            assert_eq!(pb.params.len(), js.params.len());
            for (a, b) in pb.params.iter().zip(&js.params) {
                assert_eq!(a.name, b.name);
                assert_eq!(a.placements, b.placements);
                assert!(b.shape.is_some(), "JSON records tensor_shape");
            }
        }
    });
}

/// MindSpore's `rank_list_for_convert` returns supersets; Tessera's list is a proven minimum and
/// always a subset of what MindSpore asks for.
#[test]
fn rank_lists_are_minimal() {
    // (case, dst rank) -> the minimum, worked out by hand in docs/MINDSPORE_DIFFERENCES.md.
    let expected: [(&str, [Vec<usize>; 4], usize); 2] = [
        (
            "case1_dp2mp4_to_2x2",
            [
                vec![0, 1, 2, 3, 4, 5],
                vec![0, 1, 2, 3, 4, 5],
                vec![0, 1, 2, 3, 6, 7],
                vec![0, 1, 2, 3, 6, 7],
            ],
            8,
        ),
        (
            "case3_opt_shard_to_4",
            [
                vec![0, 1, 2, 3, 4, 5],
                vec![0, 1, 4, 5, 6, 7],
                vec![0, 1, 2, 3, 6, 7],
                vec![2, 3, 4, 5, 6, 7],
            ],
            8,
        ),
    ];
    for (name, minima, full) in expected {
        let Some(c) = case(name) else { return };
        let a = Strategy::load(&c.join("strategy/A.ckpt")).unwrap();
        let b = Strategy::load(&c.join("strategy/B.ckpt")).unwrap();
        let ms = json(&c.join("expected/rank_list_for_convert.json"));
        for (r, minimum) in minima.iter().enumerate() {
            let cover = ckpt::minimal_rank_list(&a, Some(&b), r).unwrap();
            assert!(cover.exact);
            assert_eq!(&cover.ranks, minimum, "{name} rank {r}");
            let theirs: Vec<usize> = ms["A_to_B"][r.to_string()]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            assert!(cover.ranks.iter().all(|x| theirs.contains(x)));
            assert!(cover.ranks.len() <= theirs.len());
        }
        // Merging everything needs one rank of each replica group.
        let cover = ckpt::minimal_rank_list(&a, None, 0).unwrap();
        assert!(cover.ranks.len() <= full);
        assert_eq!(ms["A_to_None(rank0)"].as_array().unwrap().len(), full);
    }
}

/// The conversion reads exactly the minimal set of source files.
#[test]
fn conversion_opens_only_the_minimal_ranks() {
    let Some(c) = case("case3_opt_shard_to_4") else {
        return;
    };
    let out = tmp();
    let report = ckpt::convert_checkpoint_by_rank(
        1,
        &c.join("src_ckpt"),
        &c.join("strategy/A.ckpt"),
        out.path(),
        Some(&c.join("strategy/B.ckpt")),
        &ConvertOptions::default(),
    )
    .unwrap();
    assert_eq!(report.ranks[0].source_ranks, vec![0, 1, 4, 5, 6, 7]);
    // A source directory missing the ranks it does not need still converts.
    let partial = tmp();
    for r in [0usize, 1, 4, 5, 6, 7] {
        let d = partial.path().join(format!("rank_{r}"));
        std::fs::create_dir_all(&d).unwrap();
        let f = format!("checkpoint_{r}.ckpt");
        std::fs::copy(c.join(format!("src_ckpt/rank_{r}/{f}")), d.join(&f)).unwrap();
    }
    let out2 = tmp();
    ckpt::convert_checkpoint_by_rank(
        1,
        partial.path(),
        &c.join("strategy/A.ckpt"),
        out2.path(),
        Some(&c.join("strategy/B.ckpt")),
        &ConvertOptions::default(),
    )
    .unwrap();
    assert_same_tensors(
        &out2.path().join("rank_1/checkpoint_1.ckpt"),
        &c.join("expected/convert_by_rank_A_to_B/rank_1.ckpt"),
        false,
    );
}

fn groups(v: &Value) -> Vec<Vec<usize>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|g| {
            g.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect()
        })
        .collect()
}

#[test]
fn redundancy_maps() {
    each_case(|c| {
        for s in ["A", "B"] {
            let map = ckpt::redundancy_of_file(&c.join(format!("strategy/{s}.ckpt"))).unwrap();
            let expected = json(&c.join(format!("expected/redundancy_{s}.json")));
            let exp_groups = expected["get_parameter_redundancy"].as_object().unwrap();
            assert_eq!(map.len(), exp_groups.len());
            for (name, g) in &map {
                assert_eq!(&g[..], &groups(&exp_groups[name])[..], "{s} {name}");
            }
            let owners = ckpt::remove_param_redundancy(&map);
            let exp_owners = expected["remove_param_redundancy"].as_object().unwrap();
            assert_eq!(owners.len(), exp_owners.len());
            for (rank, names) in &owners {
                let exp: Vec<&str> = exp_owners[&rank.to_string()]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect();
                assert_eq!(names.iter().map(String::as_str).collect::<Vec<_>>(), exp);
            }
        }
    });
}

#[test]
fn dedup_matches_mindspore_sources() {
    each_case(|c| {
        let out = tmp();
        ckpt::dedup_checkpoints(
            &c.join("src_safetensors"),
            &c.join("strategy/A.ckpt"),
            out.path(),
            false,
            ckpt::Durability::Fsync,
            &ckpt::NoProgress,
        )
        .unwrap();
        for r in 0..8 {
            let file = format!("rank_{r}/checkpoint_{r}.safetensors");
            let ours = out.path().join(&file);
            assert_same_tensors(&ours, &c.join("src_safetensors_dedup").join(&file), true);
            assert!(ckpt::CheckpointFile::open(&ours)
                .unwrap()
                .removes_redundancy());
        }
    });
}

#[test]
fn verify_accepts_reference_checkpoints() {
    each_case(|c| {
        for (dir, strategy) in [
            ("src_ckpt", "A.ckpt"),
            ("src_safetensors", "A.json"),
            ("src_safetensors_dedup", "A.ckpt"),
            ("expected/convert_ckpt_A_to_B", "B.ckpt"),
        ] {
            let r =
                ckpt::verify_checkpoints(&c.join(dir), &c.join("strategy").join(strategy), true)
                    .unwrap();
            // The safetensors sources leave out bf16 (MindSpore could not convert it): that is
            // reported, and is the only fault.
            let faults: Vec<_> = r
                .faults
                .iter()
                .filter(|f| {
                    !(dir.starts_with("src_safetensors") && f.tensor.as_deref() == Some("net.bf"))
                })
                .collect();
            assert!(faults.is_empty(), "{dir}: {faults:?}");
            assert!(r.n_slices > 0);
        }
    });
}

#[test]
fn group_info_restore_list() {
    let Some(c) = case("case5_group_info") else {
        return;
    };
    let path = c.join("group_info.pb");
    assert_eq!(
        ckpt::restore_group_info_list(&path).unwrap(),
        vec![0, 1, 2, 3]
    );
    let info = ckpt::GroupInfo::read(&path).unwrap();
    assert_eq!(info.groups.len(), 2);
    assert_eq!(info.groups[0].group_name, "2-5004544844489628105");
    assert_eq!(info.encode(), std::fs::read(&path).unwrap());
    // MindSpore returns [] here (its bug 4); the documented behaviour is an error.
    let err = ckpt::restore_group_info_list(&c.join("group_info_no_restore.pb")).unwrap_err();
    assert!(
        matches!(err, ckpt::CkptError::MissingRestoreList { .. }),
        "{err}"
    );
}

#[test]
fn source_order_and_dtypes_are_kept() {
    let Some(c) = case("case1_dp2mp4_to_2x2") else {
        return;
    };
    let out = convert(
        &c,
        "src_ckpt",
        ("A.ckpt", Some("B.ckpt")),
        None,
        "converted_",
        Some(&[0]),
    );
    let tensors = read_all(&out.path().join("rank_0/converted_0.ckpt"));
    let types: Vec<(&str, &str)> = tensors
        .iter()
        .map(|(n, s)| (n.as_str(), s.ty.as_str()))
        .collect();
    assert_eq!(
        types,
        vec![
            ("net.w1", "Float32"),
            ("net.b1", "Float32"),
            ("net.w2", "Float32"),
            ("net.emb", "Float32"),
            ("net.h16", "Float16"),
            ("net.bf", "BFloat16"),
            ("global_step", "Int32"),
        ]
    );
}

/// `convert_checkpoint_files` (MindSpore's `{rank: file}` form): given only the files of the
/// minimal cover, each destination rank's file is MindSpore's, written to the exact name asked.
#[test]
fn convert_by_rank_from_named_files() {
    each_case(|c| {
        let a = Strategy::load(&c.join("strategy/A.ckpt")).unwrap();
        let b = Strategy::load(&c.join("strategy/B.ckpt")).unwrap();
        for r in 0..4 {
            let cover = ckpt::minimal_rank_list(&a, Some(&b), r).unwrap();
            let files: std::collections::BTreeMap<usize, std::path::PathBuf> = cover
                .ranks
                .iter()
                .map(|&s| (s, c.join(format!("src_ckpt/rank_{s}/checkpoint_{s}.ckpt"))))
                .collect();
            let out = tmp();
            let dst = out.path().join(format!("out_{r}.ckpt"));
            let report = ckpt::convert_checkpoint_files(
                r,
                &files,
                Some(&c.join("strategy/A.ckpt")),
                &dst,
                Some(&c.join("strategy/B.ckpt")),
                &ConvertOptions::default(),
            )
            .unwrap();
            assert_eq!(report.path, dst);
            assert_eq!(report.source_ranks, cover.ranks);
            assert_same_tensors(
                &dst,
                &c.join(format!("expected/convert_by_rank_A_to_B/rank_{r}.ckpt")),
                true,
            );
            // An existing output is kept unless forced.
            let again = ckpt::convert_checkpoint_files(
                r,
                &files,
                Some(&c.join("strategy/A.ckpt")),
                &dst,
                Some(&c.join("strategy/B.ckpt")),
                &ConvertOptions::default(),
            );
            assert!(
                matches!(again, Err(ckpt::CkptError::DestinationExists { .. })),
                "{again:?}"
            );
        }
    });
}

/// Loading one rank in memory gives the tensors MindSpore's `load_distributed_checkpoint`
/// wrote for it, from the unified checkpoint and from the per-rank files alike.
#[test]
fn load_rank_in_memory_matches_load_distributed() {
    each_case(|c| {
        let files: std::collections::BTreeMap<usize, std::path::PathBuf> = (0..8)
            .map(|s| (s, c.join(format!("src_ckpt/rank_{s}/checkpoint_{s}.ckpt"))))
            .collect();
        for r in 0..4 {
            let expected = read_all(&c.join(format!(
                "expected/load_distributed_B/rank_{r}/net.safetensors"
            )));
            let unified = ckpt::load_rank_from_unified(
                &c.join("expected/unified_safetensors"),
                &c.join("strategy/B.ckpt"),
                r,
            )
            .unwrap();
            let from_files = ckpt::load_rank_from_files(
                &files,
                &c.join("strategy/A.ckpt"),
                &c.join("strategy/B.ckpt"),
                r,
            )
            .unwrap();
            for (name, want) in &expected {
                for (label, got) in [("unified", &unified), ("files", &from_files)] {
                    let (_, t) = got
                        .iter()
                        .find(|(n, _)| n == name)
                        .unwrap_or_else(|| panic!("{label}: rank {r} lacks {name}"));
                    assert_eq!(t.shape(), want.shape.as_slice(), "{label} {name}");
                    assert_eq!(t.as_bytes(), want.bytes.as_slice(), "{label} {name}");
                }
            }
        }
        let err = ckpt::load_rank_from_unified(
            &c.join("expected/unified_safetensors"),
            &c.join("strategy/B.ckpt"),
            9,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("rank 9 is not a destination rank"),
            "{err}"
        );
    });
}

/// `convert_unsharded` (MindSpore's `convert_checkpoints` without a source strategy) remakes the
/// sharded sources MindSpore made from the full checkpoint.
#[test]
fn convert_unsharded_remakes_the_sources() {
    each_case(|c| {
        let out = tmp();
        ckpt::convert_unsharded(
            &c.join("full_ckpt"),
            out.path(),
            &c.join("strategy/A.ckpt"),
            &ConvertOptions::default(),
        )
        .unwrap();
        for r in 0..8 {
            let file = format!("rank_{r}/checkpoint_{r}.ckpt");
            assert_same_tensors(
                &out.path().join(&file),
                &c.join("src_ckpt").join(&file),
                true,
            );
        }
    });
}

/// Loading from a unified checkpoint (to files, or one rank in memory) leaves out the
/// parameters the target strategy does not list, as MindSpore's `load_distributed_checkpoint`
/// does (`tests/fixtures/mindspore/generated/load_unlisted_params/README.md`: B lists `net.p1`
/// only, the unified checkpoint also holds `net.p0`).
#[test]
fn load_from_unified_leaves_out_unlisted_parameters() {
    let c = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/mindspore/generated/load_unlisted_params");
    let unified = c.join("unified");
    let b = c.join("strategy/B.json");
    for r in 0..6 {
        let expected = read_all(&c.join(format!(
            "expected/load_distributed_B/rank_{r}/net.safetensors"
        )));
        let got = ckpt::load_rank_from_unified(&unified, &b, r).unwrap();
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        let want: Vec<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, want, "rank {r}");
        for ((_, t), (_, w)) in got.iter().zip(&expected) {
            assert_eq!(t.as_bytes(), w.bytes.as_slice(), "rank {r}");
        }
    }
    let out = tmp();
    let report =
        ckpt::load_distributed_checkpoint(&unified, &b, out.path(), &ConvertOptions::default())
            .unwrap();
    assert!(
        report
            .skipped
            .iter()
            .any(|(n, why)| n == "net.p0" && why.contains("not in the target strategy")),
        "{:?}",
        report.skipped
    );
}
