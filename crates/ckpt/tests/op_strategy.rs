//! MindSpore's operator strategy files: round trips, a file in MindSpore's own layout, and the
//! rule each bad file breaks.

use ckpt::{read_operator_strategy_file, write_operator_strategy_file, OpStrategyRecord};
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
            "split factor",
        ),
        (
            r#"{"parallel_strategy_item":{"op":{"stage":0}}}"#,
            "\"parallel_strategy\" must be a list",
        ),
        (
            r#"{"parallel_strategy_item":{},"parallel_layout_value_item":{}}"#,
            "layout-form",
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
