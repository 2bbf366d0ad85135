//! Pipeline strategies: per-stage MindSpore files merged (`merge_pipeline_strategys`, in
//! deterministic stage order), then a 2-stage × 4-device checkpoint with a parameter shared by
//! both stages converted to 4 devices without pipeline, and back.

use ckpt::{MsLayoutItem, MsStrategyFile, MsStrategyItem, Strategy};
use tensor::{DType, Tensor};

use crate::util::{ms_layout as layout, read_all, tmp};

/// The stage files of case4 in FORMAT_EXAMPLES.txt (pipeline 2 × dev [2,2]).
fn stage_file(stage: u32) -> MsStrategyFile {
    let (w, b) = if stage == 0 {
        (layout(&[2, 2], &[1, 0]), layout(&[2, 2], &[0]))
    } else {
        (layout(&[2, 2], &[0, -1]), layout(&[2, 2], &[-1]))
    };
    MsStrategyFile {
        current_stage: 1,
        strategy_items: vec![MsStrategyItem {
            node_name: format!("Default/network-Net/stage{stage}/MatMul-op{stage}"),
            stage,
            strategies: vec![vec![2, 2], vec![2, 1]],
        }],
        layout_items: vec![
            MsLayoutItem {
                param_name: format!("s{stage}.w"),
                layout: w,
            },
            MsLayoutItem {
                param_name: format!("s{stage}.b"),
                layout: b,
            },
            MsLayoutItem {
                param_name: "shared.emb".into(),
                layout: layout(&[2, 2], &[0, -1]),
            },
        ],
    }
}

#[test]
fn merge_stages_in_stage_order() {
    let dir = tmp();
    let stages = dir.path().join("stages");
    std::fs::create_dir_all(&stages).unwrap();
    // Names chosen so that file-name order differs from stage order.
    std::fs::write(stages.join("a_stage1.ckpt"), stage_file(1).encode()).unwrap();
    std::fs::write(stages.join("b_stage0.ckpt"), stage_file(0).encode()).unwrap();
    std::fs::write(stages.join("c_copy_of_stage0.ckpt"), stage_file(0).encode()).unwrap();
    let out = dir.path().join("merged.ckpt");
    let report = ckpt::merge_pipeline_strategies(&stages, &out, false).unwrap();
    assert_eq!(
        report.merged.iter().map(|(_, s)| *s).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_eq!(report.skipped.len(), 1);
    let bytes = std::fs::read(&out).unwrap();
    let merged = MsStrategyFile::decode(&out, &bytes).unwrap();
    assert_eq!(merged.current_stage, 1);
    let names: Vec<&str> = merged
        .layout_items
        .iter()
        .map(|i| i.param_name.as_str())
        .collect();
    assert_eq!(
        names,
        vec![
            "0-s0.w",
            "0-s0.b",
            "0-shared.emb",
            "1-s1.w",
            "1-s1.b",
            "1-shared.emb"
        ]
    );
    // Read back: two stages, the shared embedding placed in both.
    let s = Strategy::load(&out).unwrap();
    assert_eq!(s.n_stages(), 2);
    let emb = s.param("shared.emb").unwrap();
    assert_eq!(emb.placements.len(), 2);
    assert_eq!(emb.placements[1].layout.mesh().rank_list(), &[4, 5, 6, 7]);
    // Another rank's copy of a stage (other bytes, the same strategies) is skipped; a file
    // claiming a merged stage with other layouts is refused, naming both files.
    let mut copy = stage_file(0);
    copy.current_stage = 7;
    copy.layout_items.reverse();
    std::fs::write(stages.join("e_rank1_stage0.ckpt"), copy.encode()).unwrap();
    let report =
        ckpt::merge_pipeline_strategies(&stages, &dir.path().join("m1.ckpt"), false).unwrap();
    assert_eq!(report.merged.len(), 2);
    assert_eq!(report.skipped.len(), 2, "{:?}", report.skipped);
    let mut other = stage_file(0);
    other.layout_items[0].layout = layout(&[2, 2], &[-1, -1]);
    std::fs::write(stages.join("f_other_stage0.ckpt"), other.encode()).unwrap();
    let conflicted = dir.path().join("m_conflict.ckpt");
    let err = ckpt::merge_pipeline_strategies(&stages, &conflicted, false).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("f_other_stage0.ckpt")
            && text.contains("b_stage0.ckpt")
            && text.contains("pipeline stage 0"),
        "{text}"
    );
    assert!(!conflicted.exists());
    std::fs::remove_file(stages.join("e_rank1_stage0.ckpt")).unwrap();
    std::fs::remove_file(stages.join("f_other_stage0.ckpt")).unwrap();
    // Mixing protobuf and JSON inputs is refused.
    std::fs::write(stages.join("d.json"), b"{}").unwrap();
    let err =
        ckpt::merge_pipeline_strategies(&stages, &dir.path().join("m2.ckpt"), false).unwrap_err();
    assert!(matches!(err, ckpt::CkptError::MixedFormats { .. }), "{err}");
    // A single unmerged stage-1 file cannot drive a conversion.
    let lone = dir.path().join("lone.ckpt");
    std::fs::write(&lone, stage_file(1).encode()).unwrap();
    let err = Strategy::load(&lone).unwrap().check_stages().unwrap_err();
    assert!(err.to_string().contains("merge-stages"), "{err}");
    // Nor can a merge of stage 1 alone: refused, naming the missing stage, nothing written.
    let only_one = dir.path().join("only_one");
    std::fs::create_dir_all(&only_one).unwrap();
    std::fs::write(only_one.join("s1.ckpt"), stage_file(1).encode()).unwrap();
    let merged = dir.path().join("m3.ckpt");
    let err = ckpt::merge_pipeline_strategies(&only_one, &merged, false).unwrap_err();
    assert!(err.to_string().contains("stage 0 is missing"), "{err}");
    assert!(!merged.exists());
}

/// An entry named like a strategy file that is not a regular file (a directory, a broken link)
/// is an error naming it, not an input left out of the merge without a word.
#[test]
fn a_strategy_name_on_what_is_not_a_file_is_an_error() {
    let dir = tmp();
    let stages = dir.path().join("stages");
    std::fs::create_dir_all(&stages).unwrap();
    std::fs::write(stages.join("b_stage0.ckpt"), stage_file(0).encode()).unwrap();
    std::fs::create_dir(stages.join("a_stage1.ckpt")).unwrap();
    let out = dir.path().join("merged.ckpt");
    let err = ckpt::merge_pipeline_strategies(&stages, &out, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a_stage1.ckpt") && err.contains("not a regular file"),
        "{err}"
    );
    std::fs::remove_dir(stages.join("a_stage1.ckpt")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("gone"), stages.join("a_stage1.ckpt")).unwrap();
    let err = ckpt::merge_pipeline_strategies(&stages, &out, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("a_stage1.ckpt"), "{err}");
    assert!(!out.exists(), "nothing written");
}

/// Two stages with an operator of the same name merge into protobuf (a list keeps both), but
/// a JSON output, which keys operators by name, would hold a duplicate key that no reader
/// accepts: `tessera strategy merge-stages DIR merged.json` wrote a file `strategy show`
/// then refused. It is refused before writing, naming the operator and both stages.
#[test]
fn a_json_merge_of_stages_sharing_an_operator_name_is_refused() {
    let dir = tmp();
    let stages = dir.path().join("stages");
    std::fs::create_dir_all(&stages).unwrap();
    for stage in [0, 1] {
        let mut file = stage_file(stage);
        file.strategy_items[0].node_name = "Default/network-Net/MatMul-op0".into();
        let text = file.to_json_text();
        std::fs::write(stages.join(format!("s{stage}.json")), text).unwrap();
    }
    let pb = dir.path().join("merged.ckpt");
    ckpt::merge_pipeline_strategies(&stages, &pb, false).unwrap();
    let merged = MsStrategyFile::decode(&pb, &std::fs::read(&pb).unwrap()).unwrap();
    assert_eq!(merged.strategy_items.len(), 2);
    let json = dir.path().join("merged.json");
    let err = ckpt::merge_pipeline_strategies(&stages, &json, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Default/network-Net/MatMul-op0")
            && err.contains("stage 0")
            && err.contains("stage 1")
            && err.contains("protobuf"),
        "{err}"
    );
    assert!(!json.exists(), "nothing written");
    // Distinct names still merge into JSON, and it reads back.
    for stage in [0, 1] {
        let text = stage_file(stage).to_json_text();
        std::fs::write(stages.join(format!("s{stage}.json")), text).unwrap();
    }
    ckpt::merge_pipeline_strategies(&stages, &json, false).unwrap();
    assert_eq!(Strategy::load(&json).unwrap().n_stages(), 2);
}

#[test]
fn pipeline_to_flat_and_back() {
    let dir = tmp();
    let stages = dir.path().join("stages");
    std::fs::create_dir_all(&stages).unwrap();
    std::fs::write(stages.join("s0.ckpt"), stage_file(0).encode()).unwrap();
    std::fs::write(stages.join("s1.ckpt"), stage_file(1).encode()).unwrap();
    let a = dir.path().join("A.ckpt");
    ckpt::merge_pipeline_strategies(&stages, &a, false).unwrap();
    // Global shapes, and the source written rank by rank from the resolved layouts.
    let shapes = [
        ("s0.w", vec![8, 4]),
        ("s0.b", vec![4]),
        ("s1.w", vec![8, 4]),
        ("s1.b", vec![4]),
        ("shared.emb", vec![16, 4]),
    ];
    let strategy = Strategy::load(&a).unwrap();
    let (resolved, unknown) = strategy
        .resolve(|p, _| {
            Ok(shapes
                .iter()
                .find(|(n, _)| *n == p.name)
                .map(|(_, s)| ckpt::ShapeHint {
                    shape: s.clone(),
                    is_global: true,
                    dtype: Some(DType::F32),
                    source: "the test".into(),
                }))
        })
        .unwrap();
    assert!(unknown.is_empty());
    let full: Vec<Tensor> = resolved
        .params()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let n: usize = p.shape.iter().product();
            Tensor::from_vec(&p.shape, (0..n).map(|x| (i * 1000 + x) as f32).collect()).unwrap()
        })
        .collect();
    let src = dir.path().join("src");
    for rank in 0..8 {
        let mut tensors = Vec::new();
        for (p, t) in resolved.params().iter().zip(&full) {
            if let Some((pl, slot)) = p.placement_of_rank(rank) {
                tensors.push((
                    p.name.clone(),
                    t.extract_box(&pl.held.slot_box(slot)).unwrap(),
                ));
            }
        }
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        ckpt::save_rank_checkpoint(&src, rank, &refs, false).unwrap();
    }
    // To everything on one rank: full tensors.
    let merged = dir.path().join("merged");
    let report =
        ckpt::convert_checkpoints(&src, &a, &merged, None, &ckpt::ConvertOptions::default())
            .unwrap();
    let got = read_all(&merged.join("rank_0/checkpoint_0.safetensors"));
    for (p, t) in resolved.params().iter().zip(&full) {
        let (_, stored) = got.iter().find(|(n, _)| *n == p.name).unwrap();
        assert_eq!(stored.bytes, t.as_bytes(), "{}", p.name);
    }
    // The shared embedding is read from one stage only.
    assert!(report.ranks[0].source_ranks.len() <= 8);
    // Back to the pipeline layout (the merged checkpoint's strategy: all on rank 0): identical.
    let one = ckpt::ResolvedStrategy::single_rank(
        &resolved
            .params()
            .iter()
            .map(|p| (p.name.clone(), p.shape.clone(), p.dtype))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let full_strategy = dir.path().join("full.json");
    ckpt::save_param_strategy_file(
        &full_strategy,
        &one,
        &[],
        ckpt::StrategyFlavour::Tessera,
        false,
    )
    .unwrap();
    let back = dir.path().join("back");
    ckpt::convert_checkpoints(
        &merged,
        &full_strategy,
        &back,
        Some(&a),
        &ckpt::ConvertOptions::default(),
    )
    .unwrap();
    for rank in 0..8 {
        let f = format!("rank_{rank}/checkpoint_{rank}.safetensors");
        let mut x = read_all(&src.join(&f));
        let mut y = read_all(&back.join(&f));
        x.sort_by(|p, q| p.0.cmp(&q.0));
        y.sort_by(|p, q| p.0.cmp(&q.0));
        assert_eq!(x, y, "rank {rank}");
    }
}

/// A rank runs one pipeline stage: a strategy placing parameters of two stages on one rank is
/// refused by the stage check (`ckpt verify`, conversions), naming the rank and both stages.
#[test]
fn stages_may_not_share_a_rank() {
    let dir = tmp();
    let placement = |stage: usize, ranks: &str| {
        format!(
            r#"{{"stage": {stage}, "mesh": {{"axes": [["dp", 2]], "rank_list": {ranks}}}, "dims": [["dp"], []]}}"#
        )
    };
    let strategy = |b_ranks: &str| {
        format!(
            r#"{{"format": "tessera-strategy", "version": 1, "tensors": [
                {{"name": "a", "shape": [4, 2], "dtype": "f32", "placements": [{}]}},
                {{"name": "b", "shape": [4, 2], "dtype": "f32", "placements": [{}]}}]}}"#,
            placement(0, "[0, 1]"),
            placement(1, b_ranks)
        )
    };
    let path = dir.path().join("overlap.json");
    std::fs::write(&path, strategy("[1, 2]")).unwrap();
    let err = Strategy::load(&path).unwrap().check_stages().unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("rank 1") && text.contains("stage 0") && text.contains("stage 1"),
        "{text}"
    );
    // Disjoint rank lists are two stages, as a pipeline writes them.
    std::fs::write(&path, strategy("[2, 3]")).unwrap();
    Strategy::load(&path).unwrap().check_stages().unwrap();
}

/// A merge is refused, naming the file, when a stage file breaks a layout rule or the stages
/// do not make one strategy: it used to write a merged file that every reader (Tessera's
/// `build_searched_strategy` included) then refused.
#[test]
fn a_merge_every_reader_would_refuse_is_not_written() {
    let dir = tmp();
    let stages = dir.path().join("stages");
    std::fs::create_dir_all(&stages).unwrap();
    std::fs::write(stages.join("stage0.ckpt"), stage_file(0).encode()).unwrap();
    // Stage 1 with an optimizer shard whose rank stride (2) is not its replica group's (1).
    let mut bad = stage_file(1);
    bad.layout_items[1].layout.opt_weight_shard_size = 2;
    bad.layout_items[1].layout.opt_weight_shard_step = 2;
    std::fs::write(stages.join("stage1.ckpt"), bad.encode()).unwrap();
    let out = dir.path().join("merged.ckpt");
    let err = ckpt::merge_pipeline_strategies(&stages, &out, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("stage1.ckpt") && err.contains("s1.b") && err.contains("opt_weight_shard"),
        "{err}"
    );
    assert!(!out.exists());
    // Each stage file valid alone, but stage 1 over 8 devices and stage 0 over 4.
    let mut wide = stage_file(1);
    for item in &mut wide.layout_items {
        item.layout.dev_matrix = vec![vec![2, 4]];
    }
    std::fs::write(stages.join("stage1.ckpt"), wide.encode()).unwrap();
    let err = ckpt::merge_pipeline_strategies(&stages, &out, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("merged.ckpt") && err.contains("devices"),
        "{err}"
    );
    assert!(!out.exists());
    // The same stages, consistent, merge.
    std::fs::write(stages.join("stage1.ckpt"), stage_file(1).encode()).unwrap();
    ckpt::merge_pipeline_strategies(&stages, &out, false).unwrap();
    Strategy::load(&out).unwrap();
}
