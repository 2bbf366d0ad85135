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
