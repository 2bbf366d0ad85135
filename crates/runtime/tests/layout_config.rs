//! Layout-valued strategies in the config: `[parallel.mesh]` and per-dim alias entries in
//! `[parallel.shard]`, `[parallel.out_shard]` and `parallel.dataset_strategy`; and
//! `parallel.strategy_file_only_for_trainable_params`.

use layout::{DimSpec, Layout};
use parallel::{DatasetStrategy, OpStrategy, ParallelConfig, ParallelMode};

use crate::config::{file_error, parse_with, MINIMAL};

/// `MINIMAL` with a `[parallel]` section of `body` (semi_auto on 8 devices).
fn with_parallel(body: &str) -> String {
    format!("{MINIMAL}[parallel]\ndevices = 8\nmode = \"semi_auto\"\n{body}\n")
}

const MESH: &str =
    "[parallel.mesh]\ndevice_matrix = [2, 2, 2]\nalias_name = [\"dp\", \"sp\", \"mp\"]";

fn lay(entries: &[&str]) -> Layout {
    let base = Layout::new(&[2, 2, 2], &["dp", "sp", "mp"], None).unwrap();
    let specs: Vec<DimSpec> = entries.iter().map(|e| DimSpec::parse(e)).collect();
    base.apply(&specs).unwrap()
}

#[test]
fn layout_entries_parse_beside_tuple_entries() {
    let text = with_parallel(&format!(
        "dataset_strategy = [[[\"dp\", \"sp\"], \"None\", \"None\"], [[\"dp\", \"sp\"]]]\n{MESH}\n\
         [parallel.shard]\n\
         matmul1 = [[[\"dp\", \"sp\"], \"None\"], [\"None\", \"mp\"]]\n\
         \"blocks.*.mlp.fc1.matmul\" = [[\"dp\", \"None\", \"None\"], [\"mp\", \"None\"]]\n\
         matmul2 = [[2, 4], [4, 1]]\n\
         [parallel.out_shard]\n\
         matmul2 = [[[\"dp\", \"sp\", \"mp\"], \"None\"]]"
    ));
    let config = parse_with(&text, &[]).unwrap();
    let mut want = ParallelConfig::new(ParallelMode::SemiAuto, 8)
        .shard_layouts(
            "matmul1",
            vec![lay(&["dp+sp", "None"]), lay(&["None", "mp"])],
            None,
        )
        .shard_layouts(
            "blocks.*.mlp.fc1.matmul",
            vec![lay(&["dp", "None", "None"]), lay(&["mp", "None"])],
            None,
        );
    want.strategies.insert(
        "matmul2".to_string(),
        OpStrategy::from_tuples(vec![vec![2, 4], vec![4, 1]], None)
            .with_out_layouts(vec![lay(&["dp+sp+mp", "None"])]),
    );
    want.dataset_strategy =
        DatasetStrategy::Layouts(vec![lay(&["dp+sp", "None", "None"]), lay(&["dp+sp"])]);
    assert_eq!(config.parallel_config(), want);
    // The split tuples strategy files record come from the layouts.
    let matmul1 = &config.parallel_config().strategies["matmul1"];
    assert_eq!(matmul1.inputs, vec![vec![4, 1], vec![1, 2]]);
    assert_eq!(
        config.parallel_config().strategies["matmul2"].outputs,
        Some(vec![vec![8, 1]])
    );
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    // A mesh no entry uses is warned about.
    let text = with_parallel(MESH);
    let config = parse_with(&text, &[]).unwrap();
    assert!(
        config
            .warnings()
            .iter()
            .any(|w| w.contains("[parallel.mesh] has no effect")),
        "{:?}",
        config.warnings()
    );
    // An override sets a layout entry too.
    let config = parse_with(&text, &["parallel.shard.relu1=[[\"dp\", \"mp\"]]"]).unwrap();
    assert_eq!(
        config.parallel_config().strategies["relu1"].in_layouts,
        Some(vec![lay(&["dp", "mp"])])
    );
}

/// The warnings of `text` that name `[parallel.mesh]`.
fn mesh_warnings(text: &str) -> Vec<String> {
    let config = parse_with(text, &[]).unwrap();
    let warnings = config.warnings().into_iter();
    warnings.filter(|w| w.contains("[parallel.mesh]")).collect()
}

#[test]
fn a_mesh_only_ignored_entries_name_is_warned_about_in_that_mode() {
    let shard =
        format!("{MESH}\n[parallel.shard]\nmatmul1 = [[\"dp\", \"None\"], [\"None\", \"mp\"]]");
    let dataset = format!("dataset_strategy = [[\"dp\", \"None\", \"None\"], [\"dp\"]]\n{MESH}");
    for (mode, body, ignored) in [
        ("stand_alone", &shard, true),
        ("stand_alone", &dataset, true),
        ("data_parallel", &shard, true),
        ("data_parallel", &dataset, false),
        ("semi_auto", &shard, false),
        ("semi_auto", &dataset, false),
    ] {
        let text = format!("{MINIMAL}[parallel]\ndevices = 8\nmode = \"{mode}\"\n{body}\n");
        let warnings = mesh_warnings(&text);
        let want = format!("[parallel.mesh] has no effect in mode \"{mode}\"");
        assert_eq!(
            warnings.iter().any(|w| w.contains(&want)),
            ignored,
            "{mode} with\n{body}\n: {warnings:?}"
        );
    }
}

#[test]
fn bad_layout_entries_name_the_key_and_the_rule() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "[parallel.shard]\nmatmul1 = [[\"dp\", \"None\"], [\"None\", \"mp\"]]",
            "parallel.shard.matmul1",
            "needs [parallel.mesh]",
        ),
        (
            "dataset_strategy = [[\"dp\", \"None\", \"None\"], [\"dp\"]]",
            "parallel.dataset_strategy",
            "needs [parallel.mesh]",
        ),
        (
            &format!("{MESH}\n[parallel.shard]\nmatmul1 = [[\"xp\", \"None\"], [\"None\", \"mp\"]]"),
            "parallel.shard.matmul1",
            "[0]: The axis xp is not found in ('dp', 'sp', 'mp')",
        ),
        (
            &format!("{MESH}\n[parallel.shard]\nmatmul1 = [[\"dp\", \"None\"], [\"mp\", \"mp\"]]"),
            "parallel.shard.matmul1",
            "[1]: The axis mp has been set more than one",
        ),
        (
            &format!("{MESH}\n[parallel.shard]\nmatmul1 = [[[\"dp\", \"sp\"], \"dp\"], [\"None\", \"mp\"]]"),
            "parallel.shard.matmul1",
            "The axis dp has been set more than one",
        ),
        (
            &format!("{MESH}\n[parallel.shard]\nmatmul1 = [[\"dp\", \"None\"], [1, 2]]"),
            "parallel.shard.matmul1",
            "mixes split tuples and layouts",
        ),
        (
            &format!("{MESH}\n[parallel.shard]\nmatmul1 = [[\"dp\", 2], [\"None\", \"mp\"]]"),
            "parallel.shard.matmul1",
            "[0][1] is integer 2: a layout dim is an alias, \"None\" or a non-empty list of aliases",
        ),
        (
            &format!("{MESH}\n[parallel.shard]\nmatmul1 = [[[], \"None\"], [\"None\", \"mp\"]]"),
            "parallel.shard.matmul1",
            "[0][0] is array []",
        ),
        (
            "[parallel.mesh]\ndevice_matrix = [2, 4]\nalias_name = [\"dp\", \"dp\"]",
            "parallel.mesh.alias_name",
            "dp",
        ),
        (
            "[parallel.mesh]\ndevice_matrix = [2, 4]\nalias_name = [\"dp\", \"None\"]",
            "parallel.mesh.alias_name",
            "None",
        ),
        (
            "[parallel.mesh]\ndevice_matrix = [2, 4]\nalias_name = [\"dp\"]",
            "parallel.mesh.alias_name",
            "",
        ),
        (
            "[parallel.mesh]\ndevice_matrix = [2, 0]\nalias_name = [\"dp\", \"mp\"]",
            "parallel.mesh.device_matrix[1]",
            "must be ≥ 1",
        ),
        (
            "[parallel.mesh]\ndevice_matrix = [4194304, 4194304]\nalias_name = [\"dp\", \"mp\"]",
            "parallel.mesh.device_matrix",
            "",
        ),
        (
            "[parallel.mesh]\ndevice_matrix = [8]",
            "parallel.mesh.alias_name",
            "missing required key",
        ),
        (
            "[parallel.mesh]\ndevice_matrix = [8]\nalias_name = [\"dp\"]\nrank_list = [0]",
            "parallel.mesh.rank_list",
            "unknown key",
        ),
    ];
    for (body, want_key, needle) in cases {
        let (key, reason) = file_error(parse_with(&with_parallel(body), &[]));
        assert_eq!(&key, want_key, "{body}: {reason}");
        assert!(
            reason.contains(needle),
            "{body}: {reason:?} lacks {needle:?}"
        );
    }
}

#[test]
fn strategy_file_only_for_trainable_params_defaults_to_true() {
    let config = parse_with(&with_parallel(""), &[]).unwrap();
    assert!(config.strategy_file_only_for_trainable_params());
    let config = parse_with(
        &with_parallel("strategy_file_only_for_trainable_params = false"),
        &[],
    )
    .unwrap();
    assert!(!config.strategy_file_only_for_trainable_params());
    let (key, reason) = file_error(parse_with(
        &with_parallel("strategy_file_only_for_trainable_params = 1"),
        &[],
    ));
    assert_eq!(key, "parallel.strategy_file_only_for_trainable_params");
    assert!(reason.contains("expected a boolean"), "{reason}");
}

/// The seed MLP on the 4 devices of the mesh `a × b` with the `[parallel.shard]` body `shard`,
/// `steps` steps with `optimizer` in deterministic mode: bitwise one device's run.
fn assert_bitwise_on_mesh(what: &str, shard: &str, optimizer: &str, steps: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let max_steps = format!("train.max_steps={steps}");
    let det = ["train.deterministic=true", max_steps.as_str()];
    let one = crate::run_util::seed_mlp(
        &tmp.path().join("one"),
        optimizer,
        "mode = \"stand_alone\"",
        &det,
    );
    let reference = crate::run_util::train_run(&one, steps).1;
    let parallel = format!(
        "devices = 4\nmode = \"semi_auto\"\n[parallel.mesh]\ndevice_matrix = [2, 2]\n\
         alias_name = [\"a\", \"b\"]\n[parallel.shard]\n{shard}"
    );
    let config = crate::run_util::seed_mlp(&tmp.path().join("four"), optimizer, &parallel, &det);
    let run = crate::run_util::train_run(&config, steps).1;
    crate::run_util::assert_bitwise_run(what, &run, &reference);
}

#[test]
fn axes_listed_out_of_mesh_order_are_summed_in_the_dims_order() {
    // A dim split over mesh axes listed out of the mesh's order (`["b", "a"]` on the mesh
    // `a × b`) lies along the dim in that order: deterministic mode adds its parts so, bitwise
    // one device's. (The pending sum kept its axes in the mesh's order, and added the parts of
    // a weight gradient — or of a product over a split reduction — in another order.)
    assert_bitwise_on_mesh(
        "batch over (b, a)",
        "matmul1 = [[[\"b\", \"a\"], \"None\"], [\"None\", \"None\"]]",
        "momentum",
        6,
    );
    assert_bitwise_on_mesh(
        "reduction over (b, a)",
        "matmul2 = [[\"None\", [\"b\", \"a\"]], [[\"b\", \"a\"], \"None\"]]",
        "momentum",
        6,
    );
}

#[test]
fn sums_over_one_group_in_two_orders_keep_their_own_order() {
    // Two pending sums over the same ranks, one over `(b, a)` and one over `(a, b)` (the
    // reduction dims of matmul1 and matmul2), on the same shapes: the lowering shared one
    // reshard plan between them (its key left the order out), so one sum was added in the
    // other's order and the weights drifted from one device's by an ulp.
    assert_bitwise_on_mesh(
        "sums over (b, a) then (a, b)",
        "matmul1 = [[\"None\", [\"b\", \"a\"]], [[\"b\", \"a\"], \"None\"]]\n\
         matmul2 = [[\"None\", [\"a\", \"b\"]], [[\"a\", \"b\"], \"None\"]]",
        "sgd",
        3,
    );
}

#[test]
fn layouts_breaking_a_matmuls_rule_name_the_key_and_the_dims() {
    let tmp = tempfile::tempdir().unwrap();
    let mesh = "[parallel.mesh]\ndevice_matrix = [2, 2]\nalias_name = [\"a\", \"b\"]";
    for (shard, needles) in [
        (
            // x's reduction dim is not split, w's is.
            "matmul1 = [[\"a\", \"None\"], [\"b\", \"None\"]]",
            &[
                "the reduction dims of its inputs are split differently: dim 1 of input 0 by \
                 None and dim 0 of input 1 by b",
                "the strategy comes from parallel.shard.matmul1",
            ][..],
        ),
        (
            // The output's rows and columns would both be split by `b`.
            "matmul2 = [[\"b\", \"a\"], [\"a\", \"b\"]]",
            &[
                "its output's rows and columns would both be split by mesh axis b",
                "the strategy comes from parallel.shard.matmul2",
            ][..],
        ),
        (
            // An out layout splitting the 10 classes 4 ways.
            "matmul3 = [[\"a\", \"None\"], [\"None\", \"None\"]]\n[parallel.out_shard]\n\
             matmul3 = [[\"None\", [\"a\", \"b\"]]]",
            &[
                "out_strategy ((1, 4),): the layout (None, a+b) for output 0",
                "the strategy comes from parallel.shard.matmul3, its out_strategy from \
                 parallel.out_shard.matmul3",
            ][..],
        ),
    ] {
        let parallel =
            format!("devices = 4\nmode = \"semi_auto\"\n{mesh}\n[parallel.shard]\n{shard}");
        let config = crate::run_util::seed_mlp(tmp.path(), "sgd", &parallel, &[]);
        let err = match runtime::Session::new(&config) {
            Ok(_) => panic!("{shard}: the session built"),
            Err(e) => e.to_string(),
        };
        for needle in needles {
            assert!(err.contains(needle), "{shard}: {err:?} lacks {needle:?}");
        }
    }
}
