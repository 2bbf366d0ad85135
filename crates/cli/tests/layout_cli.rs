//! `tessera layout` and `tessera reshard`.

use crate::util::{assert_ok, tessera};

#[test]
fn layout_prints_slices_groups_and_the_block_grid() {
    let out = tessera(&[
        "layout",
        "--mesh",
        "dp=2,sp=2,mp=2",
        "--map",
        "dp+sp,mp",
        "--shape",
        "8,16",
    ]);
    assert_ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("MindSpore tensor_map [[2,1],0]"), "{text}");
    assert!(
        text.contains("     5  dp=1,sp=0,mp=1  [4:6, 8:16]"),
        "{text}"
    );
    assert!(text.contains("6:8 │  6   │  7   │"), "{text}");
}

#[test]
fn layout_json_has_the_documented_fields() {
    let out = tessera(&[
        "layout",
        "--mesh",
        "dp=2,mp=4",
        "--map",
        "dp,mp",
        "--shape",
        "8,16",
        "--json",
    ]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "device_matrix",
        "alias_name",
        "tensor_map",
        "interleaved_parallel",
        "rank_list",
        "shape",
        "slices",
        "replica_groups",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["slices"][6]["offset"], serde_json::json!([4, 8]));
}

#[test]
fn invalid_layouts_exit_non_zero_with_one_line() {
    for args in [
        &[
            "layout",
            "--mesh",
            "dp=2,mp=4",
            "--map",
            "dp,dp",
            "--shape",
            "8,16",
        ][..],
        &[
            "layout",
            "--mesh",
            "dp=2,mp=4",
            "--map",
            "dp,mp",
            "--shape",
            "8,15",
        ][..],
        &[
            "layout",
            "--mesh",
            "dp=2,None=4",
            "--map",
            "dp",
            "--shape",
            "8",
        ][..],
    ] {
        let out = tessera(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("error: "), "{err}");
    }
}

#[test]
fn reshard_runs_and_checks_its_plan() {
    let out = tessera(&[
        "reshard",
        "--shape",
        "64,64",
        "--from-mesh",
        "dp=2,tp=2",
        "--from",
        "dp,tp",
        "--to",
        "tp,dp",
        "--run",
        "--json",
    ]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["bytes_total"], v["bytes_lower_bound"]);
    assert_eq!(v["bytes_per_rank"].as_array().unwrap().len(), 4);
    // A pending sum over tp, to a layout that splits over tp: a reduce-scatter.
    let out = tessera(&[
        "reshard",
        "--shape",
        "8,8",
        "--from-mesh",
        "dp=2,tp=2",
        "--from",
        "dp,None",
        "--from-partial",
        "tp",
        "--to",
        "dp,tp",
        "--run",
        "--json",
    ]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["steps"][0]["kind"], "reduce-scatter");
}

/// On an interleaved mesh the rank list holds virtual ranks, `r*k + j` being copy `j` of device
/// `r`: the `k` slots of a mesh position must be one device's copies in order. Before, a list
/// that broke this was drawn anyway: `7,6,…,0` labelled virtual rank 7 (copy 1 of device 3)
/// as `3.0`, and `0,1,2,5` put position dp=1 on devices 1 and 2 while reporting 2 devices.
#[test]
fn an_interleaved_rank_list_that_splits_a_device_is_refused() {
    let layout = |rank_list: &str| {
        tessera(&[
            "layout",
            "--mesh",
            "dp=2,mp=2",
            "--map",
            "dp,mp",
            "--shape",
            "8,8",
            "--interleaved",
            "2",
            "--rank-list",
            rank_list,
        ])
    };
    for (list, named) in [
        ("7,6,5,4,3,2,1,0", "virtual rank 7 at slot 0"),
        ("0,1,2,5,4,3,6,7", "virtual rank 5 at slot 3"),
        ("1,2,3,4,5,6,7,8", "virtual rank 1 at slot 0"),
    ] {
        let out = layout(list);
        assert!(!out.status.success(), "{list} should fail");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("interleaved_parallel") && err.contains(named),
            "{err}"
        );
    }
    // Devices in another order, each device's copies together and in order: accepted.
    let out = layout("6,7,4,5,2,3,0,1");
    assert_ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("   3.0  dp=0,mp=0,interleaved_parallel=0"),
        "{text}"
    );
    assert!(
        text.contains("   3.1  dp=0,mp=0,interleaved_parallel=1"),
        "{text}"
    );
}

/// `tessera strategy show` checks that the fields of each parameter agree (the reader checks
/// each alone): a tensor map shorter than the shape, a shape its split does not divide, and an
/// operator split factor of 0 were shown as if the file were valid.
#[test]
fn strategy_show_refuses_a_file_whose_fields_disagree() {
    let scratch = crate::util::Scratch::new("strategy-show-disagree");
    let source = crate::util::repo_root()
        .join("../shared/reference/mindspore/cases/case1_dp2mp4_to_2x2/strategy/A.json");
    let source = if source.exists() {
        std::fs::read_to_string(&source).unwrap()
    } else {
        // The same shape of file, for a checkout without the reference cases.
        r#"{"current_stage": 1,
            "parallel_strategy_item": {"MatMul-op0": {"stage": 0, "parallel_strategy": [[2, 4], [4, 1]]}},
            "parallel_layout_item": {"net.w1": {"dev_matrix": [2, 4], "tensor_map": [1, 0],
                "tensor_shape": [64, 32], "field": 0, "opt_weight_shard_step": 0,
                "opt_weight_shard_size": 0}}}"#
            .to_string()
    };
    let good: serde_json::Value = serde_json::from_str(&source).unwrap();
    let show = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        edit(&mut v);
        let path = scratch.0.join(name);
        std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
        tessera(&["strategy", "show", crate::util::s(&path)])
    };
    assert_ok(&show("good.json", &|_| {}));
    let w1 = |v: &mut serde_json::Value| v["parallel_layout_item"]["net.w1"].take();
    type Edit<'a> = &'a dyn Fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 3] = [
        (
            "short_map.json",
            &|v| {
                let mut w = w1(v);
                w["tensor_map"] = serde_json::json!([1]);
                v["parallel_layout_item"]["net.w1"] = w;
            },
            "layout has 1 tensor dims but the shape [64, 32] has 2",
        ),
        (
            "indivisible.json",
            &|v| {
                let mut w = w1(v);
                w["tensor_shape"] = serde_json::json!([63, 32]);
                v["parallel_layout_item"]["net.w1"] = w;
            },
            "dim 0 of shape [63, 32] has size 63, which is not divisible by 2",
        ),
        (
            "zero_split.json",
            &|v| {
                let items = v["parallel_strategy_item"].as_object_mut().unwrap();
                let op = items.values_mut().next().unwrap();
                op["parallel_strategy"] = serde_json::json!([[0, 4], [4, 1]]);
            },
            "in_strategy tuple 0 [0, 4] has split factor 0 at dim 0",
        ),
    ];
    for (name, edit, rule) in cases {
        let out = show(name, edit);
        assert!(!out.status.success(), "{name} should fail");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains(name) && err.contains(rule), "{name}: {err}");
        if name != "zero_split.json" {
            assert!(err.contains("\"net.w1\""), "{err}");
        }
    }
}
