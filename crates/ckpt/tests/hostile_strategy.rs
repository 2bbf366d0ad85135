//! Hostile strategy files: each is refused with the file and the rule it breaks, within bounded
//! time and memory.

use ckpt::{read_operator_strategy_file, Strategy};

/// A MindSpore JSON strategy file with one parameter layout and one op strategy item whose
/// value is `item`.
fn ms_json(item: &str) -> String {
    format!(
        r#"{{"current_stage": 0,
  "parallel_strategy_item": {{"Default/MatMul-op0": {item}}},
  "parallel_layout_item": {{"w": {{"dev_matrix": [2, 4], "tensor_map": [1, 0],
    "tensor_shape": [8, 8], "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}}}}}}"#
    )
}

#[test]
fn ms_json_strategy_items_need_a_list_of_split_tuples() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    std::fs::write(
        &good,
        ms_json(r#"{"stage": 0, "parallel_strategy": [[2, 4], [4, 1]]}"#),
    )
    .unwrap();
    Strategy::load(&good).expect("a valid file");
    for (name, item) in [
        ("missing", r#"{"stage": 0}"#),
        ("null", r#"{"stage": 0, "parallel_strategy": null}"#),
        ("string", r#"{"stage": 0, "parallel_strategy": "2,4"}"#),
        (
            "number",
            r#"{"stage": 0, "parallel_strategy": 9223372036854775808}"#,
        ),
        (
            "negative",
            r#"{"stage": 0, "parallel_strategy": [[-1, 4]]}"#,
        ),
    ] {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, ms_json(item)).unwrap();
        let e = Strategy::load(&path).expect_err(name).to_string();
        assert!(
            e.contains(&path.display().to_string())
                && e.contains("Default/MatMul-op0")
                && e.contains("\"parallel_strategy\""),
            "{name}: {e}"
        );
    }
}

#[test]
fn a_ten_million_tuple_in_strategy_is_refused_by_its_value_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("op.json");
    let tuples = vec!["[1]"; 10_000_000].join(",");
    std::fs::write(
        &path,
        format!(r#"{{"parallel_strategy_item": {{"m": {{"stage": 0, "parallel_strategy": [{tuples}]}}}}}}"#),
    )
    .unwrap();
    let e = read_operator_strategy_file(&path).unwrap_err().to_string();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("JSON values"),
        "{e}"
    );
}

#[test]
fn an_operator_strategy_file_checks_current_stage() {
    let dir = tempfile::tempdir().unwrap();
    for (name, stage) in [
        ("null", "null"),
        ("string", "\"0\""),
        ("negative", "-1"),
        ("huge", "9223372036854775808"),
        ("float", "1e308"),
        ("list", "[0]"),
    ] {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(
            &path,
            format!(r#"{{"current_stage": {stage}, "parallel_strategy_item": {{"m": {{"stage": 0, "parallel_strategy": [[1]]}}}}}}"#),
        )
        .unwrap();
        let e = read_operator_strategy_file(&path)
            .expect_err(name)
            .to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("\"current_stage\""),
            "{name}: {e}"
        );
    }
}

#[test]
fn op_strategies_are_bounded_in_tuples_and_factors() {
    let dir = tempfile::tempdir().unwrap();
    let many = vec!["[1]"; 1025].join(",");
    let wide = format!("[{}]", vec!["1"; 65].join(","));
    let layout = r#"{"dev_matrix": [2], "tensor_map": [[0]], "interleaved_parallel": false, "alias_name": ["a"]}"#;
    let layouts = (0..1025)
        .map(|i| format!(r#""{i}": {layout}"#))
        .collect::<Vec<_>>()
        .join(",");
    let cases = [
        (
            "op_many.json",
            format!(
                r#"{{"parallel_strategy_item": {{"m": {{"stage": 0, "parallel_strategy": [{many}]}}}}}}"#
            ),
            "1025 split tuples",
        ),
        (
            "op_wide.json",
            format!(
                r#"{{"parallel_strategy_item": {{"m": {{"stage": 0, "parallel_strategy": [{wide}]}}}}}}"#
            ),
            "65 split factors",
        ),
        (
            "op_layouts.json",
            format!(r#"{{"parallel_layout_value_item": {{"m": {{{layouts}}}}}}}"#),
            "1025 layouts",
        ),
    ];
    for (file, text, rule) in cases {
        let path = dir.path().join(file);
        std::fs::write(&path, text).unwrap();
        let e = read_operator_strategy_file(&path)
            .expect_err(file)
            .to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("\"m\"") && e.contains(rule),
            "{file}: {e}"
        );
    }
    // The same bound in the strategy files a run loads (`parallel.strategy_file`).
    let ms = dir.path().join("ms.json");
    std::fs::write(
        &ms,
        ms_json(&format!(r#"{{"stage": 0, "parallel_strategy": [{many}]}}"#)),
    )
    .unwrap();
    let tessera = dir.path().join("tessera.json");
    std::fs::write(
        &tessera,
        format!(r#"{{"format": "tessera-strategy", "version": 1, "tensors": [], "ops": [{{"name": "m", "in_strategy": [{wide}]}}]}}"#),
    )
    .unwrap();
    for (path, rule) in [(ms, "1025 split tuples"), (tessera, "65 split factors")] {
        let e = Strategy::load(&path).expect_err("too big").to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains(rule),
            "{}: {e}",
            path.display()
        );
    }
}

/// A protobuf varint.
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited protobuf field.
fn field(number: u64, payload: &[u8], out: &mut Vec<u8>) {
    varint(number << 3 | 2, out);
    varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

#[test]
fn a_protobuf_tensor_map_of_a_million_dims_is_refused() {
    // dev_matrix [2, 4]; tensor_map one packed flat map of `dims` entries of -1.
    let file = |dims: usize| {
        let mut dev = Vec::new();
        field(1, &[2, 4], &mut dev);
        let mut map_values = Vec::new();
        for _ in 0..dims {
            varint(u64::MAX, &mut map_values);
        }
        let mut map = Vec::new();
        field(1, &map_values, &mut map);
        let mut layout = Vec::new();
        field(1, &dev, &mut layout);
        field(2, &map, &mut layout);
        let mut item = Vec::new();
        field(1, b"w", &mut item);
        field(2, &layout, &mut item);
        let mut out = Vec::new();
        field(3, &item, &mut out);
        out
    };
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.ckpt");
    std::fs::write(&good, file(2)).unwrap();
    Strategy::load(&good).expect("a two-dim layout");
    let path = dir.path().join("wide.ckpt");
    std::fs::write(&path, file(1_000_000)).unwrap();
    let e = Strategy::load(&path)
        .expect_err("a million dims")
        .to_string();
    assert!(
        e.contains(&path.display().to_string())
            && e.contains("\"w\"")
            && e.contains("1000000 tensor dims"),
        "{e}"
    );
}

#[test]
fn a_layout_value_error_quotes_a_huge_value_briefly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("op.json");
    let huge = "x".repeat(1 << 20);
    std::fs::write(
        &path,
        format!(r#"{{"parallel_layout_value_item": {{"m": {{"0": {{"dev_matrix": ["{huge}"], "tensor_map": [[0]], "interleaved_parallel": false, "alias_name": ["a"]}}}}}}}}"#),
    )
    .unwrap();
    let e = read_operator_strategy_file(&path).unwrap_err().to_string();
    assert!(
        e.contains("\"dev_matrix\"") && e.len() < 1000,
        "{} bytes",
        e.len()
    );
}

#[test]
fn a_shape_of_a_million_dims_is_refused_as_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let dims = vec!["1"; 1_000_000].join(",");
    let ms = dir.path().join("ms.json");
    std::fs::write(
        &ms,
        format!(r#"{{"parallel_layout_item": {{"w": {{"dev_matrix": [2], "tensor_map": [-1, -1], "tensor_shape": [{dims}], "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}}}}}}"#),
    )
    .unwrap();
    let tessera = dir.path().join("tessera.json");
    std::fs::write(
        &tessera,
        format!(r#"{{"format": "tessera-strategy", "version": 1, "tensors": [{{"name": "w", "shape": [{dims}], "placements": [{{"stage": 0, "mesh": {{"axes": [["a", 2]], "rank_list": [0, 1]}}, "dims": [[]]}}]}}]}}"#),
    )
    .unwrap();
    for path in [ms, tessera] {
        let e = Strategy::load(&path)
            .expect_err("a million dims")
            .to_string();
        assert!(
            e.contains(&path.display().to_string())
                && e.contains("at most 64 sizes")
                && e.len() < 1000,
            "{}",
            &e[..e.len().min(400)]
        );
    }
}
