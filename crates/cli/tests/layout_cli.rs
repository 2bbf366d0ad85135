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

/// Asserts a clean refusal (exit code 1, no panic) whose one-line message holds every fragment.
#[track_caller]
fn assert_refused_with(out: &std::process::Output, fragments: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for fragment in fragments {
        assert!(err.contains(fragment), "missing {fragment:?} in:\n{err}");
    }
}

/// `--from-partial tp+tp` was taken as `tp` without a word (the planner takes a set of axes);
/// an axis listed twice is refused as in `--from`/`--to`, naming the flag and the axis.
#[test]
fn reshard_refuses_a_partial_axis_listed_twice() {
    let args = |partial: &'static str| {
        [
            "reshard",
            "--shape",
            "8,8",
            "--from-mesh",
            "dp=2,tp=2",
            "--from",
            "dp,None",
            "--from-partial",
            partial,
            "--to",
            "tp,dp",
        ]
    };
    assert_ok(&tessera(&args("tp")));
    assert_refused_with(
        &tessera(&args("tp+tp")),
        &[
            "--from-partial \"tp+tp\"",
            "axis tp is listed more than once",
        ],
    );
}

/// A pending sum of `bool` values was planned and printed, and `--run` failed on rank 0 with
/// the backend's reduction error; it is refused while planning, naming the dtype.
#[test]
fn reshard_refuses_a_pending_sum_of_bools() {
    let args = |dtype: &'static str| {
        [
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
            "--dtype",
            dtype,
        ]
    };
    assert_ok(&tessera(&args("u8")));
    assert_refused_with(&tessera(&args("bool")), &["pending sum of bool"]);
}

/// With no `--to-mesh` the destination is the source mesh: `--from-rank-list 5,6` used to be
/// dropped, so the destination sat on ranks 0 and 1 and the plan moved the whole tensor. It
/// now stays on the source's ranks (nothing moves); `--to-mesh` or `--to-rank-list` still
/// choose other ranks.
#[test]
fn reshard_without_to_mesh_keeps_the_source_ranks() {
    let plan = |extra: &[&str]| {
        let mut args = vec![
            "reshard",
            "--shape",
            "8",
            "--from-mesh",
            "dp=2",
            "--from-rank-list",
            "5,6",
            "--from",
            "dp",
            "--to",
            "dp",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = tessera(&args);
        assert_ok(&out);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let same = plan(&[]);
    assert_eq!(same["bytes_total"], 0, "{same}");
    assert_eq!(same["ranks"], serde_json::json!([5, 6]), "{same}");
    let moved = plan(&["--to-mesh", "dp=2"]);
    assert_eq!(moved["bytes_total"], 32, "{moved}");
    assert_eq!(moved["ranks"], serde_json::json!([0, 1]), "{moved}");
    let listed = plan(&["--to-rank-list", "6,5"]);
    assert_eq!(listed["bytes_total"], 32, "{listed}");
}

/// `layout --json` over the rank ceiling's 1,048,576 ranks built one `serde_json::Value`
/// object per slot, 2 GB for 179 MB of text: under a 1.2 GB address-space limit (`ulimit -v`,
/// as a batch system sets one) it aborted on allocation (SIGABRT). Its slots are now
/// serialized from small structs and the command succeeds within the limit.
#[test]
fn layout_json_over_a_million_ranks_fits_in_1_2_gb() {
    let script = format!(
        "ulimit -v 1200000 && exec {} layout --mesh a=1024,b=1024 --map a,b --shape 1024,1024 \
         --json > /dev/null",
        crate::util::tessera_path()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .expect("running sh");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{}: {err}", out.status);
}

/// A pending sum over an interleaved axis puts two parts of one sum on one device, which the
/// executor cannot add: `--run` used to start every rank, allocate the tensor and its slices,
/// and fail on rank 0. It is refused before any rank starts, naming `--run` and the rule.
#[test]
fn reshard_run_refuses_a_sum_over_an_interleaved_axis_before_starting() {
    let args = |partial: &'static str| {
        [
            "reshard",
            "--shape",
            "8,8",
            "--from-mesh",
            "dp=2,interleaved_parallel=2",
            "--from",
            "None,None",
            "--from-partial",
            partial,
            "--to",
            "dp,None",
            "--run",
        ]
    };
    assert_ok(&tessera(&args("dp")));
    let out = tessera(&args("interleaved_parallel"));
    assert_refused_with(
        &out,
        &["--run: the source", "pending sum over an interleaved axis"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("rank 0:"), "{err}");
}
