//! Strategy records a hostile or outgrown file gets wrong: a stage placed twice, layouts that do
//! not fit the recorded shapes (`inspect`), MindSpore's optimizer and field keys out of range,
//! and the compact `"rank_range"` form of Tessera JSON that keeps 8,192-rank strategies readable.

use std::path::Path;

use ckpt::{
    inspect, save_param_strategy_file, MsLayoutItem, MsStrategyFile, ParamLayout, ResolvedParam,
    ResolvedStrategy, Strategy, StrategyFlavour,
};
use layout::{Layout, Mesh};

use crate::util::{ms_layout, tmp};

/// A Tessera strategy file of one tensor `w` of `shape` with these placements (JSON objects).
fn tessera_file(version: u64, shape: &str, placements: &[String]) -> String {
    format!(
        r#"{{"format": "tessera-strategy", "version": {version}, "tensors": [{{"name": "w", "shape": {shape}, "dtype": "f32", "placements": [{}]}}]}}"#,
        placements.join(", ")
    )
}

fn placement(stage: usize, mesh: &str, dims: &str) -> String {
    format!(r#"{{"stage": {stage}, "mesh": {mesh}, "dims": {dims}}}"#)
}

fn load_err(path: &Path, text: &str) -> String {
    std::fs::write(path, text).unwrap();
    Strategy::load(path).expect_err(text).to_string()
}

#[test]
fn a_tensor_placing_one_stage_twice_is_refused_at_the_second_copy() {
    let dir = tmp();
    let path = dir.path().join("dup.json");
    let one = placement(
        0,
        r#"{"axes": [["dp", 2]], "rank_list": [0, 1]}"#,
        r#"[["dp"]]"#,
    );
    let text = tessera_file(1, "[8]", &vec![one.clone(); 100_000]);
    let start = std::time::Instant::now();
    let e = load_err(&path, &text);
    assert!(
        e.contains(&path.display().to_string())
            && e.contains("\"w\"")
            && e.contains("stage 0 is placed twice"),
        "{e}"
    );
    assert!(start.elapsed().as_secs() < 30, "{:?}", start.elapsed());
    // A placement without "stage" is in stage 0: the same stage again.
    let implicit = r#"{"mesh": {"axes": [["dp", 2]], "rank_list": [0, 1]}, "dims": [["dp"]]}"#;
    let e = load_err(&path, &tessera_file(1, "[8]", &[one, implicit.to_string()]));
    assert!(e.contains("stage 0 is placed twice"), "{e}");
    // Two different stages are fine.
    let s1 = placement(
        1,
        r#"{"axes": [["dp", 2]], "rank_list": [2, 3]}"#,
        r#"[["dp"]]"#,
    );
    let s0 = placement(
        0,
        r#"{"axes": [["dp", 2]], "rank_list": [0, 1]}"#,
        r#"[["dp"]]"#,
    );
    std::fs::write(&path, tessera_file(1, "[8]", &[s1, s0])).unwrap();
    let s = Strategy::load(&path).unwrap();
    let stages: Vec<usize> = s.params[0].placements.iter().map(|p| p.stage).collect();
    assert_eq!(stages, [0, 1]);
}

#[test]
fn an_operator_strategy_whose_out_strategy_is_in_another_stage_is_refused() {
    let dir = tmp();
    let path = dir.path().join("ops.json");
    let file = |out_stage: usize| {
        format!(
            r#"{{"parallel_strategy_item": {{"m": {{"stage": 1, "parallel_strategy": [[2, 1]]}}}},
                "parallel_out_strategy_item": {{"m": {{"stage": {out_stage}, "parallel_strategy": [[2, 1]]}}}}}}"#
        )
    };
    std::fs::write(&path, file(1)).unwrap();
    let ops = ckpt::read_operator_strategy_file(&path).unwrap();
    assert_eq!(
        (ops[0].stage, ops[0].outputs.clone()),
        (1, Some(vec![vec![2, 1]]))
    );
    std::fs::write(&path, file(0)).unwrap();
    let e = ckpt::read_operator_strategy_file(&path)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&path.display().to_string())
            && e.contains("\"m\"")
            && e.contains("out_strategy is in pipeline stage 0 but its in_strategy in stage 1"),
        "{e}"
    );
}

#[test]
fn inspect_checks_the_layouts_against_the_recorded_shapes() {
    let dir = tmp();
    let mesh = r#"{"axes": [["dp", 2], ["mp", 4]], "rank_list": [0, 1, 2, 3, 4, 5, 6, 7]}"#;
    let good = dir.path().join("good.json");
    std::fs::write(
        &good,
        tessera_file(1, "[8, 4]", &[placement(0, mesh, r#"[["mp"], []]"#)]),
    )
    .unwrap();
    assert!(matches!(
        inspect(&good).unwrap(),
        ckpt::InspectedFile::Strategy(_)
    ));
    for (name, shape, dims, rule) in [
        ("not_dividing", "[6, 4]", r#"[["mp"], []]"#, "6"),
        ("other_rank", "[8, 4, 2]", r#"[["mp"], []]"#, "dims"),
    ] {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, tessera_file(1, shape, &[placement(0, mesh, dims)])).unwrap();
        let e = inspect(&path).expect_err(name).to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("\"w\"") && e.contains(rule),
            "{name}: {e}"
        );
    }
    // MindSpore JSON: tensor_shape [6, 8] split 4 ways on dim 0; a map naming axis 2 of a
    // two-axis device matrix.
    for (name, dev, map, shape, rule) in [
        ("ms_not_dividing", "[4, 2]", "[1, 0]", "[6, 8]", "6"),
        ("ms_no_such_axis", "[4, 2]", "[2, 0]", "[8, 8]", "2"),
        ("ms_other_rank", "[4, 2]", "[1, 0]", "[8, 8, 8]", "dims"),
    ] {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(
            &path,
            format!(
                r#"{{"current_stage": 0, "parallel_layout_item": {{"w": {{"dev_matrix": {dev}, "tensor_map": {map}, "tensor_shape": {shape}, "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}}}}}}"#
            ),
        )
        .unwrap();
        let e = inspect(&path).expect_err(name).to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("\"w\"") && e.contains(rule),
            "{name}: {e}"
        );
    }
}

/// A MindSpore JSON strategy of one parameter `w` whose `key` is `value`.
fn ms_json_with(key: &str, value: &str) -> String {
    let mut fields = vec![
        ("field", "0"),
        ("opt_weight_shard_step", "0"),
        ("opt_weight_shard_size", "0"),
    ];
    for f in &mut fields {
        if f.0 == key {
            f.1 = value;
        }
    }
    let fields: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!(r#""{k}": {v}"#))
        .collect();
    format!(
        r#"{{"current_stage": 0, "parallel_layout_item": {{"w": {{"dev_matrix": [2, 4], "tensor_map": [-1, 0], "tensor_shape": [8, 8], {}}}}}}}"#,
        fields.join(", ")
    )
}

/// MindSpore layout fields outside their meaning (a negative field size, rank stride or group
/// size other than -1; a field split, which MindSpore merges in its own order) are refused
/// naming the file, the tensor and the key, in both strategy flavours.
#[test]
fn ms_layout_fields_out_of_their_range_are_refused_naming_the_key() {
    let dir = tmp();
    let path = dir.path().join("s.json");
    // -1 is MindSpore's "the whole replica group" (2 ranks here): step 4 is its stride.
    std::fs::write(
        &path,
        ms_json_with("opt_weight_shard_size", "-1").replace(
            r#""opt_weight_shard_step": 0"#,
            r#""opt_weight_shard_step": 4"#,
        ),
    )
    .unwrap();
    assert_eq!(
        Strategy::load(&path).unwrap().params[0].placements[0].opt_shard,
        2
    );
    for (key, value) in [
        ("field", "-1"),
        // A field split is merged by MindSpore in its own order: refused, not misplaced.
        ("field", "2"),
        ("field", "1.5"),
        ("field", "\"0\""),
        ("opt_weight_shard_step", "-4"),
        ("opt_weight_shard_step", "0.5"),
        ("opt_weight_shard_size", "-2"),
        ("opt_weight_shard_size", "true"),
    ] {
        let e = load_err(&path, &ms_json_with(key, value));
        assert!(
            e.contains(&path.display().to_string()) && e.contains("\"w\"") && e.contains(key),
            "{key} = {value}: {e}"
        );
    }
    // The same rules for the protobuf flavour.
    let pb = dir.path().join("s.ckpt");
    for (key, set) in [
        (
            "field",
            (|l: &mut ckpt::MsLayout| l.field = -3) as fn(&mut ckpt::MsLayout),
        ),
        ("opt_weight_shard_step", |l| l.opt_weight_shard_step = -1),
        ("opt_weight_shard_size", |l| l.opt_weight_shard_size = -5),
    ] {
        let mut layout = ms_layout(&[2, 4], &[-1, 0]);
        set(&mut layout);
        let file = MsStrategyFile {
            current_stage: 0,
            strategy_items: Vec::new(),
            layout_items: vec![MsLayoutItem {
                param_name: "w".into(),
                layout,
            }],
        };
        std::fs::write(&pb, file.encode()).unwrap();
        let e = Strategy::load(&pb).unwrap_err().to_string();
        assert!(e.contains("\"w\"") && e.contains(key), "{key}: {e}");
    }
}

/// `n` tensors, each split over all the `ranks` ranks of a `[dp, mp]` mesh (`rank_list` when
/// given, else `0..dp*mp`).
fn resolved(
    n: usize,
    dp: usize,
    mp: usize,
    stage: usize,
    ranks: Option<Vec<usize>>,
) -> ResolvedStrategy {
    let mesh = Mesh::new(&[dp, mp], &["dp", "mp"], ranks).unwrap();
    let params = (0..n)
        .map(|i| {
            let shape = vec![dp * 2, mp];
            let mp_layout = Layout::from_mesh(mesh.clone(), vec![vec![0], vec![1]])
                .unwrap()
                .bind(&shape)
                .unwrap();
            ResolvedParam {
                name: format!("layer{i}.w"),
                shape,
                dtype: Some(tensor::DType::F32),
                placements: vec![ParamLayout::new(stage, mp_layout, 1).unwrap()],
            }
        })
        .collect();
    ResolvedStrategy::new(params).unwrap()
}

fn round_trip(path: &Path, strategy: &ResolvedStrategy) -> ResolvedStrategy {
    save_param_strategy_file(path, strategy, &[], StrategyFlavour::Tessera, true).unwrap();
    let (back, unknown) = Strategy::load(path)
        .unwrap()
        .resolve(|_, _| Ok(None))
        .unwrap();
    assert!(unknown.is_empty());
    back
}

#[test]
fn a_thousand_tensors_over_8192_ranks_round_trip_in_a_small_file() {
    let dir = tmp();
    let path = dir.path().join("big.json");
    let strategy = resolved(1_100, 8, 1_024, 0, None);
    let back = round_trip(&path, &strategy);
    assert_eq!(back.params(), strategy.params());
    assert_eq!(back.n_ranks(), 8_192);
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 1 << 20, "{size} bytes");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(r#""version": 2"#) && !text.contains("rank_list"));
}

#[test]
fn rank_ranges_keep_their_start_and_other_rank_lists_stay_lists() {
    let dir = tmp();
    // Stage 1 of two 8-rank stages: ranks 8..16.
    let path = dir.path().join("stage1.json");
    let strategy = resolved(3, 2, 4, 1, Some((8..16).collect()));
    assert_eq!(round_trip(&path, &strategy).params(), strategy.params());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("\"rank_range\"") && !text.contains("rank_list"),
        "{text}"
    );
    // A permuted list is not a range.
    let path = dir.path().join("permuted.json");
    let strategy = resolved(2, 2, 2, 0, Some(vec![1, 0, 3, 2]));
    assert_eq!(round_trip(&path, &strategy).params(), strategy.params());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("\"rank_list\"") && !text.contains("rank_range"),
        "{text}"
    );
}

#[test]
fn version_1_files_with_full_rank_lists_still_load() {
    let dir = tmp();
    let path = dir.path().join("old.json");
    // Written the old way: version 1, every rank listed, stage 1 of 4-rank stages.
    let mesh = r#"{"axes": [["dp", 2], ["mp", 2]], "rank_list": [4, 5, 6, 7]}"#;
    std::fs::write(
        &path,
        tessera_file(1, "[4, 2]", &[placement(1, mesh, r#"[["dp"], ["mp"]]"#)]),
    )
    .unwrap();
    let s = Strategy::load(&path).unwrap();
    assert_eq!(
        s.params[0].placements[0].layout.mesh().rank_list(),
        [4, 5, 6, 7]
    );
    // Version 1 without any rank key: ranks 0..n, as before.
    let bare = r#"{"axes": [["dp", 2], ["mp", 2]]}"#;
    std::fs::write(
        &path,
        tessera_file(1, "[4, 2]", &[placement(0, bare, r#"[["dp"], ["mp"]]"#)]),
    )
    .unwrap();
    let s = Strategy::load(&path).unwrap();
    assert_eq!(
        s.params[0].placements[0].layout.mesh().rank_list(),
        [0, 1, 2, 3]
    );
    // The same file as version 2 must say which ranks.
    let e = load_err(
        &path,
        &tessera_file(2, "[4, 2]", &[placement(0, bare, r#"[["dp"], ["mp"]]"#)]),
    );
    assert!(e.contains("\"w\"") && e.contains("neither"), "{e}");
    // A version this build does not know is refused.
    let e = load_err(&path, &tessera_file(3, "[4, 2]", &[]));
    assert!(e.contains("version 3 is not supported"), "{e}");
}

#[test]
fn a_bad_rank_range_is_refused_naming_the_tensor() {
    let dir = tmp();
    let path = dir.path().join("r.json");
    let axes = r#""axes": [["dp", 2], ["mp", 2]]"#;
    for (ranks, rule) in [
        (r#""rank_range": [4, 4], "rank_list": [4, 5, 6, 7]"#, "both"),
        (r#""rank_range": [0, 8]"#, "gives 8 ranks"),
        (
            r#""rank_range": [0, 18446744073709551615]"#,
            "18446744073709551615",
        ),
        (
            r#""rank_range": [9223372036854775807, 4]"#,
            "past the limit",
        ),
        (r#""rank_range": [1048575, 4]"#, "past the limit"),
        // A start above 2^63 - 1 is a rank past the limit, not a malformed pair.
        (
            r#""rank_range": [18446744073709551615, 4]"#,
            "[18446744073709551615, 4] reaches past the limit",
        ),
        (
            r#""rank_range": [9223372036854775808, 4]"#,
            "[9223372036854775808, 4] reaches past the limit",
        ),
        (r#""rank_range": [0]"#, "[start, count]"),
        (r#""rank_range": [0, -4]"#, "[start, count]"),
        (r#""rank_range": "0..4""#, "[start, count]"),
    ] {
        let mesh = format!("{{{axes}, {ranks}}}");
        let e = load_err(
            &path,
            &tessera_file(2, "[4, 2]", &[placement(0, &mesh, r#"[["dp"], ["mp"]]"#)]),
        );
        assert!(
            e.contains(&path.display().to_string()) && e.contains("\"w\"") && e.contains(rule),
            "{ranks}: {e}"
        );
    }
    let mesh = format!(r#"{{{axes}, "rank_range": [12, 4]}}"#);
    std::fs::write(
        &path,
        tessera_file(2, "[4, 2]", &[placement(3, &mesh, r#"[["dp"], ["mp"]]"#)]),
    )
    .unwrap();
    let s = Strategy::load(&path).unwrap();
    assert_eq!(
        s.params[0].placements[0].layout.mesh().rank_list(),
        [12, 13, 14, 15]
    );
}

/// An operator recorded twice in one pipeline stage: which record applied was a silent choice.
/// Each reader refuses it naming the file, the op and the stage; one name in two stages stays.
#[test]
fn an_operator_recorded_twice_in_one_stage_is_refused_by_every_reader() {
    let dir = tmp();
    let dup = |e: &str, path: &Path, stage: usize| {
        assert!(
            e.contains(&path.display().to_string())
                && e.contains("op \"m\"")
                && e.contains(&format!("two strategy records in pipeline stage {stage}")),
            "{e}"
        );
    };
    // Tessera JSON: the "ops" list.
    let path = dir.path().join("t.json");
    let tessera = |stages: [usize; 2]| {
        let ops: Vec<String> = stages
            .iter()
            .map(|s| format!(r#"{{"name": "m", "stage": {s}, "in_strategy": [[2, 1]]}}"#))
            .collect();
        let one = placement(
            0,
            r#"{"axes": [["dp", 2]], "rank_list": [0, 1]}"#,
            r#"[["dp"]]"#,
        );
        let text = tessera_file(2, "[8]", &[one]);
        format!(
            "{}, \"ops\": [{}]}}",
            text.strip_suffix('}').unwrap(),
            ops.join(", ")
        )
    };
    dup(&load_err(&path, &tessera([1, 1])), &path, 1);
    std::fs::write(&path, tessera([0, 1])).unwrap();
    assert_eq!(Strategy::load(&path).unwrap().ops.len(), 2);
    // MindSpore protobuf: a repeated parallel_strategy_item.
    let path = dir.path().join("s.ckpt");
    let protobuf = |stages: [u32; 2]| MsStrategyFile {
        current_stage: 1,
        strategy_items: stages
            .iter()
            .zip([2, 4])
            .map(|(&stage, split)| ckpt::MsStrategyItem {
                node_name: "m".into(),
                stage,
                strategies: vec![vec![split, 1]],
            })
            .collect(),
        layout_items: vec![MsLayoutItem {
            param_name: "w".into(),
            layout: ms_layout(&[2], &[0]),
        }],
    };
    std::fs::write(&path, protobuf([0, 0]).encode()).unwrap();
    dup(&Strategy::load(&path).unwrap_err().to_string(), &path, 0);
    std::fs::write(&path, protobuf([0, 1]).encode()).unwrap();
    assert_eq!(Strategy::load(&path).unwrap().ops.len(), 2);
    // A stage file repeating an op is refused by the merge, naming it, before anything is written.
    let stages = dir.path().join("stages");
    std::fs::create_dir_all(&stages).unwrap();
    let stage_file = stages.join("stage0.ckpt");
    std::fs::write(&stage_file, protobuf([0, 0]).encode()).unwrap();
    let merged = dir.path().join("merged.ckpt");
    let e = ckpt::merge_pipeline_strategies(&stages, &merged, false)
        .unwrap_err()
        .to_string();
    dup(&e, &stage_file, 0);
    assert!(!merged.exists());
    // MindSpore JSON and the operator strategy file key ops by name: a JSON object cannot hold
    // one name twice, and the reader refuses the duplicate key, naming the file and the op.
    let item = r#""m": {"stage": 0, "parallel_strategy": [[2, 1]]}"#;
    let path = dir.path().join("ms.json");
    let e = load_err(
        &path,
        &format!(
            r#"{{"current_stage": 0, "parallel_strategy_item": {{{item}, {item}}}, "parallel_layout_item": {{"w": {{"dev_matrix": [2], "tensor_map": [0], "tensor_shape": [8]}}}}}}"#
        ),
    );
    assert!(
        e.contains(&path.display().to_string()) && e.contains("duplicate key \"m\""),
        "{e}"
    );
    let path = dir.path().join("ops.json");
    std::fs::write(
        &path,
        format!(r#"{{"parallel_strategy_item": {{{item}, {item}}}}}"#),
    )
    .unwrap();
    let e = ckpt::read_operator_strategy_file(&path)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("duplicate key \"m\""),
        "{e}"
    );
}

#[test]
#[ignore = "slow in a debug build (half a minute on a busy machine): run with --ignored or in release"]
fn a_300_000_tensor_strategy_round_trips() {
    // About 35 JSON values a tensor: more than the 2^23 values a tree of the whole file could
    // hold, which capped a readable strategy at about 190 000 tensors.
    let dir = tmp();
    let path = dir.path().join("huge.json");
    let strategy = resolved(300_000, 8, 1_024, 0, None);
    let back = round_trip(&path, &strategy);
    assert_eq!(back.params(), strategy.params());
}

#[test]
fn a_strategy_of_more_values_than_a_json_tree_held_is_read() {
    // 1 030 tensors, each split into 8 192 blocks of one row listed in "rows": 8.4 million
    // cheap values (17 MB of text), over the 2^23 values the whole-file tree refused.
    let n = 1_030;
    let rows = vec!["1"; 8_192].join(",");
    let tensors = (0..n)
        .map(|i| {
            format!(
                r#"{{"name":"t{i}","shape":[8192],"dtype":"f32","placements":[{{"stage":0,"mesh":{{"axes":[["dp",8192]],"rank_range":[0,8192]}},"dims":[["dp"]],"optimizer_shard":1,"rows":[{rows}]}}]}}"#
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    let text =
        format!(r#"{{"format":"tessera-strategy","version":2,"tensors":[{tensors}],"ops":[]}}"#);
    let start = std::time::Instant::now();
    let s = Strategy::from_bytes(Path::new("rows.json"), text.as_bytes()).unwrap();
    assert_eq!(s.params.len(), n);
    for (i, p) in s.params.iter().enumerate() {
        assert_eq!(p.name, format!("t{i}"));
        assert_eq!(p.placements[0].rows.as_deref(), Some(&[1; 8_192][..]));
    }
    assert!(start.elapsed().as_secs() < 60, "{:?}", start.elapsed());
}
