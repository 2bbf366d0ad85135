//! Hostile inputs: one test per error, each checking the exact variant and that the message
//! names the file, the tensor and the rule. The files in `tests/attacks/` are made by
//! `tests/attacks/make_attacks.py`.

use std::path::{Path, PathBuf};

use ckpt::{CheckpointFile, CkptError, ConvertOptions, Strategy};
use layout::Layout;
use tensor::Tensor;

use crate::util::tmp;

fn attack(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/attacks")
        .join(name)
}

fn open_err(name: &str) -> CkptError {
    let err = CheckpointFile::open(&attack(name)).expect_err(name);
    let msg = err.to_string();
    assert!(msg.contains(name), "the message names the file: {msg}");
    err
}

#[test]
fn safetensors_too_short() {
    assert!(matches!(
        open_err("st_too_short.safetensors"),
        CkptError::SafetensorsTruncated { .. }
    ));
}

#[test]
fn safetensors_header_too_large() {
    assert!(matches!(
        open_err("st_header_too_large.safetensors"),
        CkptError::HeaderTooLarge {
            size: 200_000_000,
            ..
        }
    ));
}

#[test]
fn safetensors_header_truncated() {
    assert!(matches!(
        open_err("st_header_truncated.safetensors"),
        CkptError::SafetensorsTruncated { .. }
    ));
}

#[test]
fn safetensors_header_not_utf8_json_or_object() {
    for name in [
        "st_not_utf8.safetensors",
        "st_not_json.safetensors",
        "st_not_object.safetensors",
        "st_metadata_not_strings.safetensors",
        "st_missing_offsets.safetensors",
    ] {
        assert!(
            matches!(open_err(name), CkptError::InvalidHeader { .. }),
            "{name}"
        );
    }
}

/// A tensor named twice in the header, even with the same entry, is refused as a repeated key:
/// a JSON object keeps the last of two equal keys, so which tensor the name meant would
/// depend on the order.
#[test]
fn safetensors_header_naming_a_tensor_twice() {
    let dir = tmp();
    let path = dir.path().join("twice.safetensors");
    let entry = r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#;
    let header = format!(r#"{{"a":{entry},"a":{entry}}}"#);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&1.0f32.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let err = CheckpointFile::open(&path).expect_err("a repeated name");
    let msg = err.to_string();
    assert!(matches!(err, CkptError::InvalidHeader { .. }), "{msg}");
    for part in ["twice.safetensors", "\"a\"", "more than once"] {
        assert!(msg.contains(part), "{msg}");
    }
}

/// A shape of 100 000 dims of size 1 describes 4 bytes, a consistent header: it is refused by
/// its number of dims (as `.ckpt` tensors are, beyond 64), and the message says how many
/// instead of quoting the shape (which made a 300 KB error line).
#[test]
fn safetensors_header_with_too_many_dims() {
    let dir = tmp();
    let path = dir.path().join("dims.safetensors");
    let shape = vec!["1"; 100_000].join(",");
    let header = format!(r#"{{"a":{{"dtype":"F32","shape":[{shape}],"data_offsets":[0,4]}}}}"#);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&1.0f32.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let Err(err) = CheckpointFile::open(&path) else {
        panic!("a shape of 100 000 dims was accepted");
    };
    let msg = err.to_string();
    assert!(matches!(err, CkptError::InvalidHeader { .. }), "{msg}");
    for part in ["dims.safetensors", "\"a\"", "100000 dims", "64"] {
        assert!(msg.contains(part), "{msg}");
    }
    assert!(msg.len() < 1000, "a message of {} bytes", msg.len());
    // 64 dims are still read.
    let shape = vec!["1"; 64].join(",");
    let header = format!(r#"{{"a":{{"dtype":"F32","shape":[{shape}],"data_offsets":[0,4]}}}}"#);
    assert_eq!(
        ckpt::parse::safetensors_header(header.as_bytes(), 4).unwrap(),
        1
    );
}

/// Opening a FIFO as a checkpoint (a weight map may name any path) is refused as not a regular
/// file at once: opening a FIFO waits for a writer, forever if none comes.
#[test]
fn a_fifo_is_no_checkpoint_file_and_no_wait() {
    let dir = tmp();
    let path = dir.path().join("part.safetensors");
    let made = std::process::Command::new("mkfifo").arg(&path).status();
    assert!(made.expect("mkfifo").success());
    let (sent, got) = std::sync::mpsc::channel();
    let opened = path.clone();
    std::thread::spawn(move || {
        let _ = sent.send(CheckpointFile::open(&opened).map(|_| ()));
    });
    let result = got
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("opening the FIFO still waits after 20 s");
    let msg = result.expect_err("a FIFO").to_string();
    assert!(
        msg.contains("part.safetensors") && msg.contains("not a regular file"),
        "{msg}"
    );
}

#[test]
fn safetensors_unknown_dtype() {
    let err = open_err("st_unknown_dtype.safetensors");
    assert!(
        matches!(&err, CkptError::UnknownDType { dtype, tensor, .. } if dtype == "F8_E4M3" && tensor == "a")
    );
}

#[test]
fn safetensors_shape_overflow() {
    assert!(matches!(
        open_err("st_shape_overflow.safetensors"),
        CkptError::ShapeOverflow { .. }
    ));
}

#[test]
fn safetensors_hole_and_overlap() {
    for name in ["st_hole.safetensors", "st_overlap.safetensors"] {
        let err = open_err(name);
        assert!(
            matches!(&err, CkptError::InvalidOffsets { tensor, .. } if tensor == "b"),
            "{name}: {err}"
        );
    }
}

#[test]
fn safetensors_byte_length() {
    let err = open_err("st_byte_length.safetensors");
    assert!(matches!(
        err,
        CkptError::TensorByteLength {
            expected: 12,
            got: 8,
            ..
        }
    ));
}

#[test]
fn safetensors_data_length() {
    for name in [
        "st_trailing_data.safetensors",
        "st_truncated_data.safetensors",
    ] {
        assert!(
            matches!(open_err(name), CkptError::DataLength { .. }),
            "{name}"
        );
    }
}

#[test]
fn ckpt_malformed_protobuf() {
    for name in [
        "ckpt_truncated.ckpt",
        "ckpt_huge_length.ckpt",
        "ckpt_no_tag.ckpt",
        "ckpt_garbage.ckpt",
    ] {
        let err = open_err(name);
        assert!(matches!(err, CkptError::Protobuf { .. }), "{name}: {err}");
    }
}

#[test]
fn ckpt_crc() {
    assert!(matches!(
        open_err("ckpt_bad_crc.ckpt"),
        CkptError::CrcMismatch { .. }
    ));
    let good = CheckpointFile::open(&attack("ckpt_good_crc.ckpt")).unwrap();
    assert!(good.crc().is_some());
    assert_eq!(
        good.read_tensor("w").unwrap().as_f32().unwrap(),
        &[1., 2., 3., 4.]
    );
}

#[test]
fn ckpt_value_rules() {
    for name in [
        "ckpt_dims_mismatch.ckpt",
        "ckpt_chunk_mismatch.ckpt",
        "ckpt_negative_dim.ckpt",
    ] {
        let err = open_err(name);
        assert!(
            matches!(&err, CkptError::CkptValue { tensor, .. } if tensor == "w"),
            "{name}: {err}"
        );
    }
}

#[test]
fn ckpt_map_tensor_is_unsupported() {
    assert!(matches!(
        open_err("ckpt_maptensor.ckpt"),
        CkptError::Unsupported { .. }
    ));
}

fn strategy_err(name: &str) -> CkptError {
    let err = Strategy::load(&attack(name)).expect_err(name);
    assert!(err.to_string().contains(name), "{err}");
    err
}

#[test]
fn strategy_garbage() {
    assert!(matches!(
        strategy_err("strategy_garbage.ckpt"),
        CkptError::Protobuf { .. }
    ));
    assert!(matches!(
        strategy_err("strategy_unknown_json.json"),
        CkptError::InvalidStrategy { .. }
    ));
    assert!(matches!(
        strategy_err("strategy_empty.ckpt"),
        CkptError::InvalidStrategy { .. }
    ));
    assert!(matches!(
        strategy_err("strategy_future_version.json"),
        CkptError::InvalidStrategy { .. }
    ));
}

#[test]
fn strategy_optimizer_step_disagrees() {
    let err = strategy_err("strategy_bad_opt_step.ckpt");
    assert!(
        matches!(&err, CkptError::StrategyParam { tensor, rule, .. }
        if tensor == "w" && rule.contains("opt_weight_shard_step is 3")),
        "{err}"
    );
}

#[test]
fn strategy_map_out_of_range() {
    let err = strategy_err("strategy_map_out_of_range.ckpt");
    assert!(
        matches!(&err, CkptError::Layout { tensor, .. } if tensor == "w"),
        "{err}"
    );
}

#[test]
fn strategy_device_counts_differ() {
    let err = strategy_err("strategy_two_device_counts.ckpt");
    assert!(
        matches!(&err, CkptError::StrategyParam { tensor, .. } if tensor == "b"),
        "{err}"
    );
}

#[test]
fn strategy_that_does_not_divide_the_shape() {
    let s = Strategy::load(&attack("strategy_not_dividing.json")).unwrap();
    let err = s.resolve(|_, _| Ok(None)).unwrap_err();
    assert!(
        matches!(&err, CkptError::Layout { tensor, source: layout::LayoutError::NotDivisible { .. }, .. } if tensor == "w"),
        "{err}"
    );
    assert!(err.to_string().contains("not divisible by 4"), "{err}");
}

/// Names with `-` in an unmerged file are kept whole (MindSpore fails on them).
#[test]
fn names_with_dashes() {
    let dir = tmp();
    let mesh = layout::Mesh::new(&[2], &["dp"], None).unwrap();
    let layouts = vec![
        ckpt::ResolvedParam {
            name: "layer-1.w".into(),
            shape: vec![4, 2],
            dtype: Some(tensor::DType::F32),
            placements: vec![ckpt::ParamLayout::new(
                0,
                Layout::from_mesh(mesh.clone(), vec![vec![0], vec![]])
                    .unwrap()
                    .bind(&[4, 2])
                    .unwrap(),
                1,
            )
            .unwrap()],
        },
        ckpt::ResolvedParam {
            name: "0-x".into(),
            shape: vec![2],
            dtype: Some(tensor::DType::F32),
            placements: vec![ckpt::ParamLayout::new(
                0,
                layout::TensorLayout::replicated(mesh, &[2]),
                1,
            )
            .unwrap()],
        },
    ];
    let strategy = ckpt::ResolvedStrategy::new(layouts).unwrap();
    let path = dir.path().join("s.ckpt");
    ckpt::save_param_strategy_file(
        &path,
        &strategy,
        &[],
        ckpt::StrategyFlavour::MsProtobuf,
        false,
    )
    .unwrap();
    let back = Strategy::load(&path).unwrap();
    let names: Vec<&str> = back.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, vec!["layer-1.w", "0-x"]);
}

/// Writes a 2-rank checkpoint of `w` [4, 2] split on dim 0, with its strategy.
fn two_rank_checkpoint(dir: &Path) -> PathBuf {
    let mesh = layout::Mesh::new(&[2], &["dp"], None).unwrap();
    let mp = Layout::from_mesh(mesh, vec![vec![0], vec![]])
        .unwrap()
        .bind(&[4, 2])
        .unwrap();
    let full = Tensor::from_vec(&[4, 2], (0..8).map(|x| x as f32).collect()).unwrap();
    for r in 0..2 {
        let part = full.extract_box(&mp.rank_box(r).unwrap()).unwrap();
        ckpt::save_rank_checkpoint(&dir.join("src"), r, &[("w", &part)], false).unwrap();
    }
    let strategy = ckpt::ResolvedStrategy::new(vec![ckpt::ResolvedParam {
        name: "w".into(),
        shape: vec![4, 2],
        dtype: Some(tensor::DType::F32),
        placements: vec![ckpt::ParamLayout::new(0, mp, 1).unwrap()],
    }])
    .unwrap();
    let path = dir.join("s.json");
    ckpt::save_param_strategy_file(&path, &strategy, &[], ckpt::StrategyFlavour::Tessera, false)
        .unwrap();
    path
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn missing_rank() {
    let dir = tmp();
    let s = two_rank_checkpoint(dir.path());
    std::fs::remove_dir_all(dir.path().join("src/rank_1")).unwrap();
    let err = ckpt::convert_checkpoints(
        &dir.path().join("src"),
        &s,
        &dir.path().join("out"),
        None,
        &ConvertOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err, CkptError::MissingRank { rank: 1, .. }),
        "{err}"
    );
    assert!(files_under(&dir.path().join("out")).is_empty());
}

#[test]
fn mixed_formats() {
    let dir = tmp();
    let s = two_rank_checkpoint(dir.path());
    std::fs::write(dir.path().join("src/rank_1/extra.ckpt"), b"").unwrap();
    let err = ckpt::convert_checkpoints(
        &dir.path().join("src"),
        &s,
        &dir.path().join("out"),
        None,
        &ConvertOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, CkptError::MixedFormats { .. }), "{err}");
}

#[test]
fn existing_destination_is_refused_and_untouched() {
    let dir = tmp();
    let s = two_rank_checkpoint(dir.path());
    let out = dir.path().join("out");
    let opts = ConvertOptions::default();
    ckpt::convert_checkpoints(&dir.path().join("src"), &s, &out, None, &opts).unwrap();
    let dest = out.join("rank_0/checkpoint_0.safetensors");
    let before = std::fs::read(&dest).unwrap();
    let err =
        ckpt::convert_checkpoints(&dir.path().join("src"), &s, &out, None, &opts).unwrap_err();
    assert!(matches!(err, CkptError::DestinationExists { .. }), "{err}");
    assert_eq!(std::fs::read(&dest).unwrap(), before);
    let forced = ConvertOptions {
        force: true,
        ..opts
    };
    ckpt::convert_checkpoints(&dir.path().join("src"), &s, &out, None, &forced).unwrap();
    let mut files = files_under(&out);
    files.sort();
    assert_eq!(files, vec![dest, out.join(ckpt::SET_MARKER)]);
}

#[test]
fn truncated_source_leaves_no_destination() {
    let dir = tmp();
    let s = two_rank_checkpoint(dir.path());
    let victim = dir.path().join("src/rank_1/checkpoint_1.safetensors");
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() - 4]).unwrap();
    let out = dir.path().join("out");
    let err = ckpt::convert_checkpoints(
        &dir.path().join("src"),
        &s,
        &out,
        None,
        &ConvertOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, CkptError::DataLength { .. }), "{err}");
    assert!(
        err.to_string().contains("checkpoint_1.safetensors"),
        "{err}"
    );
    assert!(files_under(&out).is_empty(), "{:?}", files_under(&out));
}

#[test]
fn slice_of_the_wrong_shape() {
    let dir = tmp();
    let s = two_rank_checkpoint(dir.path());
    let wrong = Tensor::from_vec(&[3, 2], vec![0f32; 6]).unwrap();
    ckpt::save_rank_checkpoint(&dir.path().join("src"), 1, &[("w", &wrong)], true).unwrap();
    let err = ckpt::convert_checkpoints(
        &dir.path().join("src"),
        &s,
        &dir.path().join("out"),
        None,
        &ConvertOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, CkptError::SliceShape { tensor, expected, .. } if tensor == "w" && expected == &vec![2, 2]),
        "{err}"
    );
}

#[test]
fn dtype_disagreement_between_ranks() {
    let dir = tmp();
    let s = two_rank_checkpoint(dir.path());
    let wrong = Tensor::from_vec(&[2, 2], vec![0f64; 4]).unwrap();
    ckpt::save_rank_checkpoint(&dir.path().join("src"), 1, &[("w", &wrong)], true).unwrap();
    let err = ckpt::convert_checkpoints(
        &dir.path().join("src"),
        &s,
        &dir.path().join("out"),
        None,
        &ConvertOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            &err,
            CkptError::GlobalShape { .. } | CkptError::DTypeMismatch { .. }
        ),
        "{err}"
    );
}

#[test]
fn verify_reports_every_fault() {
    let dir = tmp();
    let s = two_rank_checkpoint(dir.path());
    let r = ckpt::verify_checkpoints(&dir.path().join("src"), &s, true).unwrap();
    assert!(r.is_ok(), "{:?}", r.faults);
    // Corrupt rank 1: the report names its file.
    let victim = dir.path().join("src/rank_1/checkpoint_1.safetensors");
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() - 1]).unwrap();
    let r = ckpt::verify_checkpoints(&dir.path().join("src"), &s, true).unwrap();
    assert!(!r.is_ok());
    assert!(r.faults.iter().any(|f| f.path == victim), "{:?}", r.faults);
    assert!(
        r.faults.iter().any(
            |f| f.tensor.as_deref() == Some("w") && f.rule.contains("held by no readable rank")
        ),
        "{:?}",
        r.faults
    );
}

/// Op strategies survive every strategy flavour: inputs in all three, outputs in Tessera JSON
/// only (MindSpore's files have no field for them).
#[test]
fn op_strategies_round_trip_through_every_flavour() {
    let dir = tmp();
    let (strategy, _) = Strategy::load(&two_rank_checkpoint(dir.path()))
        .unwrap()
        .resolve(|_, _| Ok(None))
        .unwrap();
    let ops = vec![
        ckpt::OpStrategyRecord {
            name: "layer-1.matmul".into(),
            stage: 0,
            inputs: vec![vec![2, 4], vec![4, 1]],
            outputs: Some(vec![vec![8, 1]]),
            in_layouts: None,
            out_layouts: None,
        },
        ckpt::OpStrategyRecord {
            name: "relu1".into(),
            stage: 0,
            inputs: vec![vec![4, 1]],
            outputs: None,
            in_layouts: None,
            out_layouts: None,
        },
    ];
    for (file, flavour) in [
        ("ops.json", ckpt::StrategyFlavour::Tessera),
        ("ops.ckpt", ckpt::StrategyFlavour::MsProtobuf),
        ("ops_ms.json", ckpt::StrategyFlavour::MsJson),
    ] {
        let path = dir.path().join(file);
        ckpt::save_param_strategy_file(&path, &strategy, &ops, flavour, false).unwrap();
        let back = Strategy::load(&path).unwrap();
        let expected: Vec<ckpt::OpStrategyRecord> = ops
            .iter()
            .cloned()
            .map(|mut op| {
                if flavour != ckpt::StrategyFlavour::Tessera {
                    op.outputs = None;
                }
                op
            })
            .collect();
        assert_eq!(back.ops, expected, "{file}");
        assert_eq!(back.params.len(), 1, "{file}");
    }
}

#[test]
fn malformed_op_strategies_name_the_file_and_the_op() {
    let dir = tmp();
    let good = std::fs::read_to_string(two_rank_checkpoint(dir.path())).unwrap();
    for (ops, expected) in [
        (r#""ops": 3"#, "\"ops\" must be a list"),
        (r#""ops": [{"in_strategy": [[1]]}]"#, "ops #0: no \"name\""),
        (
            r#""ops": [{"name": "mm"}]"#,
            "op \"mm\" has no \"in_strategy\"",
        ),
        (
            r#""ops": [{"name": "mm", "in_strategy": [[0, 2]]}]"#,
            "op \"mm\": \"in_strategy\" must be a list of split tuples of positive integers",
        ),
        (
            r#""ops": [{"name": "mm", "in_strategy": [[1]], "out_strategy": "x"}]"#,
            "\"out_strategy\" must be",
        ),
    ] {
        let text = good.replacen(r#""ops": []"#, ops, 1);
        assert_ne!(text, good, "the fixture has an empty ops list");
        let path = dir.path().join("bad_ops.json");
        std::fs::write(&path, text).unwrap();
        let err = Strategy::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("bad_ops.json") && err.contains(expected),
            "{ops}: {err}"
        );
    }
}

/// An optimizer shard must split a slice among the ranks holding it: 3 over a slice held by 2
/// ranks is refused as that rule, not later as a shape mismatch.
#[test]
fn strategy_optimizer_shard_not_dividing_the_replicas() {
    let dir = tmp();
    let path = dir.path().join("opt3.json");
    let strategy = |k: usize| {
        format!(
            r#"{{"format": "tessera-strategy", "version": 1, "tensors": [{{"name": "w", "shape": [6, 4], "dtype": "f32", "placements": [{{"stage": 0, "mesh": {{"axes": [["dp", 2]]}}, "dims": [[], []], "optimizer_shard": {k}}}]}}]}}"#
        )
    };
    std::fs::write(&path, strategy(3)).unwrap();
    let err = Strategy::load(&path).unwrap_err();
    assert!(
        matches!(&err, CkptError::StrategyParam { tensor, rule, .. } if tensor == "w" && rule.contains("\"optimizer_shard\" 3 does not divide the 2 rank(s)")),
        "{err}"
    );
    std::fs::write(&path, strategy(2)).unwrap();
    Strategy::load(&path).unwrap();
}
