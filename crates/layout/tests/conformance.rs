//! Conformance with MindSpore 2.10's `Layout`: every entry of
//! `tests/fixtures/mindspore/cases/case0_layout_to_dict/layouts.json` — the `to_dict()` results, the
//! derived sharding strategies and the rejected calls with their messages.

use std::path::PathBuf;

use layout::{DimSpec, Layout, MsDimMap};
use serde_json::Value;

/// The reference cases, copied into the repository (`tests/fixtures/mindspore/`).
fn case0() -> Option<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/mindspore/cases/case0_layout_to_dict/layouts.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the MindSpore conformance fixtures are part of the repository)",
            path.display()
        )
    });
    Some(serde_json::from_str(&text).expect("layouts.json is valid JSON"))
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_u64().expect("a non-negative integer") as usize)
        .collect()
}

fn dim_spec(v: &Value) -> DimSpec {
    match v {
        Value::String(s) => DimSpec::from(s.as_str()),
        Value::Array(items) => DimSpec::Axes(
            items
                .iter()
                .map(|i| i.as_str().expect("alias").to_string())
                .collect(),
        ),
        other => panic!("unexpected call entry {other}"),
    }
}

fn ms_map_to_json(maps: &[MsDimMap]) -> Value {
    Value::Array(
        maps.iter()
            .map(|m| match m {
                MsDimMap::Single(v) => Value::from(*v),
                MsDimMap::Multi(vs) => Value::from(vs.clone()),
            })
            .collect(),
    )
}

#[test]
fn to_dict_results_and_rejected_calls_match_mindspore() {
    let Some(cases) = case0() else { return };
    let cases = cases.as_array().expect("a list of cases");
    let mut checked_ok = 0;
    let mut checked_err = 0;
    for case in cases {
        let outcome: Result<Layout, layout::LayoutError> = if case["call"].is_string() {
            // `to_dict()` before `__call__`: a layout without a tensor map.
            Layout::new(&[2, 4], &["dp", "mp"], None).and_then(|l| l.to_dict().map(|_| l))
        } else {
            let aliases: Vec<String> = case["alias_name"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            let rank_list = (!case["rank_list"].is_null()).then(|| usizes(&case["rank_list"]));
            let entries: Vec<DimSpec> = case["call"]
                .as_array()
                .unwrap()
                .iter()
                .map(dim_spec)
                .collect();
            Layout::new(&usizes(&case["device_matrix"]), &aliases, rank_list)
                .and_then(|l| l.apply(&entries))
        };
        match (&case["error"], outcome) {
            (Value::String(expected), Err(err)) => {
                let expected = expected.trim_start_matches("ValueError: ");
                let ours = err.to_string();
                assert!(
                    ours.starts_with(expected),
                    "call {}: MindSpore says {expected:?}, we say {ours:?}",
                    case["call"]
                );
                checked_err += 1;
            }
            (Value::String(expected), Ok(_)) => {
                panic!("call {} should fail with {expected:?}", case["call"])
            }
            (_, Err(err)) => panic!("call {} failed: {err}", case["call"]),
            (_, Ok(layout)) => {
                let dict = layout.to_dict().unwrap();
                let want = &case["to_dict"];
                assert_eq!(dict.device_matrix, usizes(&want["device_matrix"]));
                assert_eq!(
                    ms_map_to_json(&dict.tensor_map),
                    want["tensor_map"],
                    "{}",
                    case["call"]
                );
                assert_eq!(
                    Value::from(dict.interleaved_parallel),
                    want["interleaved_parallel"]
                );
                assert_eq!(Value::from(dict.alias_name.clone()), want["alias_name"]);
                assert_eq!(dict.rank_list, usizes(&want["rank_list"]));
                assert_eq!(
                    layout.split_factors(),
                    usizes(&case["sharding_strategy"]),
                    "sharding strategy of {}",
                    case["call"]
                );
                checked_ok += 1;
            }
        }
    }
    assert_eq!(checked_ok + checked_err, cases.len());
    assert!(
        checked_ok >= 9 && checked_err >= 7,
        "{checked_ok} ok, {checked_err} errors"
    );
}
