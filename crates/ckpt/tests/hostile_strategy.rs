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

/// A version-2 Tessera strategy file of one tensor `w` of shape `[8]` with this placement, and
/// these `ops`.
fn tessera_v2(placement: &str, ops: &str) -> String {
    format!(
        r#"{{"format": "tessera-strategy", "version": 2, "tensors": [{{"name": "w", "shape": [8], "dtype": "f32", "placements": [{placement}]}}], "ops": [{ops}]}}"#
    )
}

#[test]
fn tessera_strategy_sizes_from_the_file_are_refused_before_they_are_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let ranks = vec!["0"; 2_000_000].join(",");
    let cases = [
        (
            "range_1e12",
            tessera_v2(
                r#"{"mesh": {"axes": [["dp", 2]], "rank_range": [0, 1000000000000]}, "dims": [["dp"]]}"#,
                "",
            ),
            "gives 1000000000000 ranks",
        ),
        (
            "mesh_1e12",
            tessera_v2(
                r#"{"mesh": {"axes": [["dp", 1000000000000]], "rank_range": [0, 1000000000000]}, "dims": [["dp"]]}"#,
                "",
            ),
            "1000000000000",
        ),
        (
            "rank_list_2e6",
            tessera_v2(
                &format!(
                    r#"{{"mesh": {{"axes": [["dp", 2]], "rank_list": [{ranks}]}}, "dims": [["dp"]]}}"#
                ),
                "",
            ),
            "\"rank_list\" has 2000000 ranks, but the mesh axes [2] have 2 devices",
        ),
        (
            "deep_dims",
            tessera_v2(
                &format!(
                    r#"{{"mesh": {{"axes": [["dp", 2]], "rank_range": [0, 2]}}, "dims": {deep}}}"#
                ),
                "",
            ),
            "recursion limit",
        ),
        (
            "deep_in_strategy",
            tessera_v2(
                r#"{"mesh": {"axes": [["dp", 2]], "rank_range": [0, 2]}, "dims": [["dp"]]}"#,
                &format!(r#"{{"name": "m", "in_strategy": {deep}}}"#),
            ),
            "\"in_strategy\" must be a list of split tuples",
        ),
    ];
    for (name, text, rule) in cases {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, text).unwrap();
        let start = std::time::Instant::now();
        let e = Strategy::load(&path).expect_err(name).to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains(rule) && e.len() < 1000,
            "{name}: {}",
            &e[..e.len().min(1000)]
        );
        assert!(
            start.elapsed().as_secs() < 20,
            "{name}: {:?}",
            start.elapsed()
        );
    }
}

#[test]
fn tessera_strategy_huge_strings_are_refused_without_being_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let huge = "n".repeat(64 << 20);
    let placement = r#"{"mesh": {"axes": [["dp", 2]], "rank_range": [0, 2]}, "dims": [["dp"]]}"#;
    let cases = [
        (
            "tensor_name",
            format!(
                r#"{{"format": "tessera-strategy", "version": 2, "tensors": [{{"name": "{huge}", "shape": [8], "placements": [{placement}]}}]}}"#
            ),
            "tensor #0: its \"name\" is 67108864 bytes long",
        ),
        (
            "op_name",
            tessera_v2(
                placement,
                &format!(r#"{{"name": "{huge}", "in_strategy": [[1]]}}"#),
            ),
            "ops #0: its \"name\" is 67108864 bytes long",
        ),
        (
            "dtype",
            format!(
                r#"{{"format": "tessera-strategy", "version": 2, "tensors": [{{"name": "w", "shape": [8], "dtype": "{huge}", "placements": [{placement}]}}]}}"#
            ),
            "a string of 67108864 bytes",
        ),
        (
            "axis_name",
            tessera_v2(
                &format!(
                    r#"{{"mesh": {{"axes": [["{huge}", 2]], "rank_range": [0, 2]}}, "dims": [["dp"]]}}"#
                ),
                "",
            ),
            "a string of 67108864 bytes",
        ),
    ];
    for (name, text, rule) in cases {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, text).unwrap();
        let e = Strategy::load(&path).expect_err(name).to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains(rule) && e.len() < 1000,
            "{name}: {}",
            &e[..e.len().min(1000)]
        );
    }
    // A name of 10 000 characters is read, and quoted in a message cut to 200 characters.
    let long = "n".repeat(10_000);
    let path = dir.path().join("long.json");
    std::fs::write(
        &path,
        format!(
            r#"{{"format": "tessera-strategy", "version": 2, "tensors": [{{"name": "{long}", "shape": [8], "placements": [{{"mesh": {{"axes": [["dp", 2]], "rank_range": [0, 2]}}, "dims": [["mp"]]}}]}}]}}"#
        ),
    )
    .unwrap();
    let e = Strategy::load(&path).expect_err("no axis mp").to_string();
    assert!(
        e.contains(&format!("\"{}…\"", "n".repeat(200))) && e.len() < 1000,
        "{}",
        &e[..e.len().min(1000)]
    );
}

#[test]
fn a_tessera_strategy_may_give_its_version_after_its_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let placement = r#"{"mesh": {"axes": [["dp", 2]], "rank_range": [0, 2]}, "dims": [["dp"]]}"#;
    let path = dir.path().join("late.json");
    std::fs::write(
        &path,
        format!(
            r#"{{"tensors": [{{"placements": [{placement}], "shape": [8], "name": "w"}}], "ops": [], "format": "tessera-strategy", "version": 2}}"#
        ),
    )
    .unwrap();
    let s = Strategy::load(&path).unwrap();
    assert_eq!(s.params[0].name, "w");
    // A version this build does not read is named before any tensor's fault.
    std::fs::write(
        &path,
        r#"{"tensors": [{"name": "w"}], "format": "tessera-strategy", "version": 3}"#,
    )
    .unwrap();
    let e = Strategy::load(&path).unwrap_err().to_string();
    assert!(e.contains("version 3 is not supported"), "{e}");
    // A key given twice is refused, as a JSON tree refused it.
    std::fs::write(
        &path,
        format!(
            r#"{{"format": "tessera-strategy", "version": 2, "tensors": [{{"name": "w", "shape": [8], "shape": [8], "placements": [{placement}]}}]}}"#
        ),
    )
    .unwrap();
    let e = Strategy::load(&path).unwrap_err().to_string();
    assert!(e.contains("duplicate key \"shape\""), "{e}");
}

#[test]
fn a_tensor_of_more_placements_than_the_stage_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let placements = (0..65_537)
        .map(|s| {
            format!(
                r#"{{"stage": {s}, "mesh": {{"axes": [["dp", 2]], "rank_range": [0, 2]}}, "dims": [["dp"]]}}"#
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    let path = dir.path().join("stages.json");
    std::fs::write(
        &path,
        format!(
            r#"{{"format": "tessera-strategy", "version": 2, "tensors": [{{"name": "w", "shape": [8], "placements": [{placements}]}}]}}"#
        ),
    )
    .unwrap();
    let e = Strategy::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("\"w\"") && e.contains("\"placements\" has 65537 entries, more than the 65536"),
        "{e}"
    );
}

#[test]
fn a_repeated_operator_name_is_refused_naming_the_operator_section_and_the_stage() {
    let dir = tempfile::tempdir().unwrap();
    let item = r#"{"stage": 1, "parallel_strategy": [[2, 4]]}"#;
    let text = format!(
        r#"{{"current_stage": 1,
  "parallel_strategy_item": {{"Default/MatMul-op0": {item}, "Default/MatMul-op0": {item}}},
  "parallel_layout_item": {{"w": {{"dev_matrix": [2, 4], "tensor_map": [1, 0],
    "tensor_shape": [8, 8], "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}}}}}}"#
    );
    let path = dir.path().join("stage1.json");
    std::fs::write(&path, &text).unwrap();
    for e in [
        Strategy::load(&path).unwrap_err().to_string(),
        read_operator_strategy_file(&path).unwrap_err().to_string(),
    ] {
        assert!(
            e.contains(&path.display().to_string())
                && e.contains("duplicate key \"Default/MatMul-op0\" in \"parallel_strategy_item\"")
                && e.contains("keyed by operator name")
                && e.contains("pipeline stage 1"),
            "{e}"
        );
    }
    // A key repeated elsewhere stays a plain JSON fault.
    let path = dir.path().join("layout.json");
    std::fs::write(
        &path,
        text.replacen("Default/MatMul-op0", "Default/MatMul-op1", 1)
            .replace("\"field\": 0", "\"field\": 0, \"field\": 0"),
    )
    .unwrap();
    let e = Strategy::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("duplicate key \"field\"") && !e.contains("operator name"),
        "{e}"
    );
}

#[test]
fn messages_quote_a_huge_operator_name_briefly() {
    let dir = tempfile::tempdir().unwrap();
    let huge = "m".repeat(1 << 20);
    let cases = [
        // A repeated op name, as a duplicate key.
        format!(
            r#"{{"parallel_strategy_item": {{"{huge}": {{"stage": 0, "parallel_strategy": [[1]]}}, "{huge}": {{"stage": 0, "parallel_strategy": [[1]]}}}}}}"#
        ),
        // An op's strategy of the wrong form.
        format!(
            r#"{{"parallel_strategy_item": {{"{huge}": {{"stage": 0, "parallel_strategy": "x"}}}}}}"#
        ),
        // An out_strategy without an in_strategy.
        format!(
            r#"{{"parallel_strategy_item": {{"x": {{"stage": 0, "parallel_strategy": [[1]]}}}}, "parallel_out_strategy_item": {{"{huge}": {{"stage": 0, "parallel_strategy": [[1]]}}}}}}"#
        ),
    ];
    for (i, text) in cases.iter().enumerate() {
        let path = dir.path().join(format!("op{i}.json"));
        std::fs::write(&path, text).unwrap();
        let e = read_operator_strategy_file(&path).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{}…", "m".repeat(200))) && e.len() < 1000,
            "case {i}: {}",
            &e[..e.len().min(1000)]
        );
    }
    // The same in a MindSpore JSON strategy file.
    let path = dir.path().join("ms.json");
    std::fs::write(
        &path,
        ms_json(r#"{"stage": 0, "parallel_strategy": "x"}"#).replace("Default/MatMul-op0", &huge),
    )
    .unwrap();
    let e = Strategy::load(&path).unwrap_err().to_string();
    assert!(
        e.contains(&format!("{}…", "m".repeat(200))) && e.len() < 1000,
        "{}",
        &e[..e.len().min(1000)]
    );
}
