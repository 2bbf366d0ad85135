//! MindSpore's operator strategy files: round trips, a file in MindSpore's own layout, and the
//! rule each bad file breaks.

use ckpt::{read_operator_strategy_file, write_operator_strategy_file, OpStrategyRecord};
use layout::{DimSpec, Layout};
use proptest::prelude::*;

fn record(
    name: &str,
    inputs: Vec<Vec<usize>>,
    outputs: Option<Vec<Vec<usize>>>,
) -> OpStrategyRecord {
    OpStrategyRecord {
        name: name.to_string(),
        stage: 0,
        inputs,
        outputs,
        in_layouts: None,
        out_layouts: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn files_round_trip(
        ops in prop::collection::vec(
            (
                "[a-z][a-z0-9_.]{0,12}",
                prop::collection::vec(prop::collection::vec(1usize..64, 0..4), 0..4),
                prop::option::of(prop::collection::vec(prop::collection::vec(1usize..64, 1..3), 1..2)),
            ),
            0..8,
        )
    ) {
        let mut seen = std::collections::BTreeSet::new();
        let records: Vec<OpStrategyRecord> = ops
            .into_iter()
            .filter(|(n, _, _)| seen.insert(n.clone()))
            .map(|(n, i, o)| record(&n, i, o))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ops.json");
        write_operator_strategy_file(&path, &records).unwrap();
        prop_assert_eq!(read_operator_strategy_file(&path).unwrap(), records);
    }
}

/// A file as MindSpore's `save_operator_strategy_file` lays it out (nlohmann's JSON of
/// `StrategyJsonInfo`: stages, in- and out-strategies by op name).
#[test]
fn a_mindspore_file_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("strategy.json");
    std::fs::write(
        &path,
        r#"{"current_stage":0,"parallel_out_strategy_item":{"Default/network-Net/MatMul-op0":{"parallel_strategy":[[8,1]],"stage":0}},"parallel_strategy_item":{"Default/network-Net/MatMul-op0":{"parallel_strategy":[[2,4],[4,1]],"stage":0},"Default/network-Net/ReLU-op1":{"parallel_strategy":[[8,1]],"stage":0}}}"#,
    )
    .unwrap();
    let records = read_operator_strategy_file(&path).unwrap();
    assert_eq!(
        records,
        vec![
            record(
                "Default/network-Net/MatMul-op0",
                vec![vec![2, 4], vec![4, 1]],
                Some(vec![vec![8, 1]])
            ),
            record("Default/network-Net/ReLU-op1", vec![vec![8, 1]], None),
        ]
    );
}

#[test]
fn bad_files_name_the_rule_broken() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[]", "must be a JSON object"),
        ("{}", "missing \"parallel_strategy_item\""),
        (
            r#"{"parallel_strategy_item":{"op":{"parallel_strategy":[[0]]}}}"#,
            "split factor 0 must be",
        ),
        // Values are named as JSON, never as Rust debug forms (`Float(1.5)`).
        (
            r#"{"parallel_strategy_item":{"op":{"parallel_strategy":[[1.5]]}}}"#,
            "split factor 1.5 must be",
        ),
        (
            r#"{"parallel_strategy_item":{"op":{"parallel_strategy":[["two"]]}}}"#,
            "split factor \"two\" must be",
        ),
        (
            r#"{"parallel_strategy_item":{"op":{"stage":0}}}"#,
            "\"parallel_strategy\" must be a list",
        ),
        (
            r#"{"parallel_strategy_item":{},"parallel_newshape_layout_value_item":{}}"#,
            "reshaped inputs are not supported",
        ),
        (
            r#"{"parallel_strategy_item":{},"parallel_out_strategy_item":{"x":{"parallel_strategy":[[1]]}}}"#,
            "no in_strategy",
        ),
        ("{not json", "not JSON"),
    ];
    for (i, (text, rule)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.json"));
        std::fs::write(&path, text).unwrap();
        let err = read_operator_strategy_file(&path).unwrap_err().to_string();
        assert!(err.contains(rule) && err.contains("bad"), "{text}: {err}");
    }
}

/// `Layout((2, 2, 2), ("dp", "sp", "mp"))(entries…)`.
fn lay(entries: &[&str]) -> Layout {
    let base = Layout::new(&[2, 2, 2], &["dp", "sp", "mp"], None).unwrap();
    let specs: Vec<DimSpec> = entries.iter().map(|e| DimSpec::parse(e)).collect();
    base.apply(&specs).unwrap()
}

/// One layout-form input as MindSpore writes it (`to_json_layout_value_tuple_item` in
/// `strategy_checkpoint_info.cc`): axis numbers counted from the right of the device matrix.
fn ms_layout(tensor_map: &str) -> String {
    format!(
        r#"{{"alias_name":["dp","sp","mp"],"dev_matrix":[2,2,2],"interleaved_parallel":false,"tensor_map":{tensor_map}}}"#
    )
}

/// A hand-written file with MindSpore's layout-form entries: `matmul1.shard(in_strategy=(
/// layout(("dp", "sp"), "None"), layout("None", "mp")), out_strategy=(layout(("dp", "sp", "mp"),
/// "None"),))` and a tuple-form `relu1`. nlohmann's JSON orders the input keys as strings, so
/// input "1" may come before "0".
#[test]
fn a_mindspore_layout_entry_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("strategy.json");
    let text = format!(
        r#"{{"current_stage":0,"parallel_strategy_item":{{"relu1":{{"parallel_strategy":[[8,1]],"stage":0}}}},
        "parallel_layout_value_item":{{"matmul1":{{"1":{},"0":{}}}}},
        "parallel_out_layout_value_item":{{"matmul1":{{"0":{}}}}}}}"#,
        ms_layout("[[-1],[0]]"),
        ms_layout("[[2,1],[-1]]"),
        ms_layout("[[2,1,0],[-1]]"),
    );
    std::fs::write(&path, text).unwrap();
    let records = read_operator_strategy_file(&path).unwrap();
    let mut want = record(
        "matmul1",
        vec![vec![4, 1], vec![1, 2]],
        Some(vec![vec![8, 1]]),
    );
    want.in_layouts = Some(vec![lay(&["dp+sp", "None"]), lay(&["None", "mp"])]);
    want.out_layouts = Some(vec![lay(&["dp+sp+mp", "None"])]);
    assert_eq!(records, vec![record("relu1", vec![vec![8, 1]], None), want]);
}

/// Layout-valued records are written as layout-form entries and read back equal, beside
/// tuple-valued ones.
#[test]
fn layout_records_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ops.json");
    let mut matmul = record(
        "matmul1",
        vec![vec![2, 1], vec![1, 4]],
        Some(vec![vec![2, 1]]),
    );
    matmul.in_layouts = Some(vec![lay(&["sp", "None"]), lay(&["None", "dp+mp"])]);
    let mut out_only = record(
        "matmul2",
        vec![vec![2, 4], vec![4, 1]],
        Some(vec![vec![1, 8]]),
    );
    out_only.out_layouts = Some(vec![lay(&["None", "mp+sp+dp"])]);
    matmul.out_layouts = Some(vec![lay(&["mp", "None"])]);
    // In name order, as read back sorted below.
    let records = vec![matmul, out_only, record("relu1", vec![vec![8, 1]], None)];
    write_operator_strategy_file(&path, &records).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("parallel_layout_value_item")
            && text.contains("parallel_out_layout_value_item")
    );
    let mut read = read_operator_strategy_file(&path).unwrap();
    read.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(read, records);
}

#[test]
fn bad_layout_entries_name_the_op_and_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let entry = |layouts: &str| {
        format!(r#"{{"current_stage":0,"parallel_layout_value_item":{{"matmul1":{layouts}}}}}"#)
    };
    let good = ms_layout("[[2],[-1]]");
    let cases = [
        (entry("[]"), "must be an object of input index"),
        (
            entry(&format!(r#"{{"1":{good}}}"#)),
            "must be an input index",
        ),
        (
            entry(&format!(r#"{{"0":{good},"01":{good}}}"#)),
            "must be an input index",
        ),
        (
            entry(
                r#"{"0":{"dev_matrix":[2,2,2],"tensor_map":[[2]],"alias_name":["dp","sp","mp"]}}"#,
            ),
            "missing \"interleaved_parallel\"",
        ),
        (
            entry(&format!(r#"{{"0":{}}}"#, ms_layout("[[3],[-1]]"))),
            "from 0 to 2",
        ),
        (
            entry(&format!(r#"{{"0":{}}}"#, ms_layout("[[2],[2]]"))),
            "tensor_map",
        ),
        (
            entry(&format!(r#"{{"0":{}}}"#, ms_layout("[[],[-1]]"))),
            "[-1] or a non-empty list",
        ),
        (
            entry(
                r#"{"0":{"dev_matrix":[2,0],"tensor_map":[[1]],"interleaved_parallel":false,"alias_name":["dp","mp"]}}"#,
            ),
            "axis size",
        ),
        (
            entry(
                r#"{"0":{"dev_matrix":[2,2],"tensor_map":[[1]],"interleaved_parallel":false,"alias_name":["dp"]}}"#,
            ),
            "alias",
        ),
        (
            entry(
                r#"{"0":{"dev_matrix":[2,2],"tensor_map":[[1]],"interleaved_parallel":true,"alias_name":["dp","interleaved_parallel"]}}"#,
            ),
            "not supported",
        ),
        (
            entry(
                r#"{"0":{"dev_matrix":[2,2],"tensor_map":[[1]],"interleaved_parallel":true,"alias_name":["dp","mp"]}}"#,
            ),
            "lacks",
        ),
        (
            entry(
                r#"{"0":{"dev_matrix":[2],"tensor_map":[[0]],"interleaved_parallel":false,"alias_name":["dp"],"rank_list":[0,1]}}"#,
            ),
            "unknown key \"rank_list\"",
        ),
        (
            format!(
                r#"{{"parallel_strategy_item":{{"matmul1":{{"stage":0,"parallel_strategy":[[4,1]]}}}},"parallel_layout_value_item":{{"matmul1":{{"0":{good}}}}}}}"#
            ),
            "disagree",
        ),
        (
            format!(
                r#"{{"parallel_strategy_item":{{}},"parallel_out_layout_value_item":{{"matmul1":{{"0":{good}}}}}}}"#
            ),
            "no in_strategy",
        ),
    ];
    for (i, (text, rule)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.json"));
        std::fs::write(&path, text).unwrap();
        let err = read_operator_strategy_file(&path).unwrap_err().to_string();
        assert!(
            err.contains(rule) && err.contains(&format!("bad{i}")),
            "{text}: {err}"
        );
        if !rule.contains("in_strategy") {
            assert!(err.contains("matmul1"), "{text}: {err}");
        }
    }
}

/// MindSpore's layout items name no pipeline stage, and `current_stage` is a save counter, not
/// a stage: an op known only from `parallel_layout_value_item` in a file whose other entries
/// name stages above 0 is refused naming the op and the key (it was placed on stage 0
/// silently). Its out_strategy entry's stage places it; without other stages it is on stage 0,
/// whatever `current_stage` says.
#[test]
fn a_layout_only_op_in_a_file_with_stages_is_refused_unless_its_stage_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("strategy.json");
    let file = |current_stage: usize, relu_stage: usize, out: &str| {
        format!(
            r#"{{"current_stage":{current_stage},"parallel_strategy_item":{{"relu1":{{"parallel_strategy":[[8,1]],"stage":{relu_stage}}}}},
            "parallel_layout_value_item":{{"matmul1":{{"0":{},"1":{}}}}}{out}}}"#,
            ms_layout("[[2,1],[-1]]"),
            ms_layout("[[-1],[0]]"),
        )
    };
    let read = |text: String| {
        std::fs::write(&path, text).unwrap();
        read_operator_strategy_file(&path)
    };
    let err = read(file(0, 1, "")).unwrap_err().to_string();
    for needle in [
        "\"matmul1\" is only in \"parallel_layout_value_item\", which gives no pipeline stage",
        "op \"relu1\" is in stage 1",
        "strategy.json",
    ] {
        assert!(err.contains(needle), "{err:?} lacks {needle:?}");
    }
    let stage_of = |records: Vec<OpStrategyRecord>| {
        records
            .into_iter()
            .find(|r| r.name == "matmul1")
            .map(|r| (r.stage, r.outputs))
    };
    let out =
        r#","parallel_out_strategy_item":{"matmul1":{"parallel_strategy":[[4,1]],"stage":1}}"#;
    assert_eq!(
        stage_of(read(file(0, 1, out)).unwrap()),
        Some((1, Some(vec![vec![4, 1]]))),
        "placed on its out_strategy entry's stage"
    );
    assert_eq!(
        stage_of(read(file(3, 0, "")).unwrap()),
        Some((0, None)),
        "current_stage is not a pipeline stage"
    );
}

/// A layout-form record of a file with stages is written with a split-tuple entry naming its
/// stage, so it reads back on that stage (not refused as an op whose stage is unknown).
#[test]
fn staged_layout_records_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ops.json");
    let mut matmul = record("matmul1", vec![vec![2, 1], vec![1, 4]], None);
    matmul.in_layouts = Some(vec![lay(&["sp", "None"]), lay(&["None", "dp+mp"])]);
    matmul.stage = 1;
    let records = vec![matmul, record("relu1", vec![vec![8, 1]], None)];
    write_operator_strategy_file(&path, &records).unwrap();
    let mut read = read_operator_strategy_file(&path).unwrap();
    read.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(read, records);
}
