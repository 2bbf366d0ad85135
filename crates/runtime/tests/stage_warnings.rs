//! Errors and warnings that only the compiled program can give: a `[parallel.shard]` strategy
//! using more devices than a pipeline stage has names the stage, the arithmetic and the key (a
//! `parallel.strategy_file` strategy names that key and the file); and
//! `parallel.hsdp.shard_size` capped by the replicas a strategy gives a parameter (which the
//! configuration's own warnings cannot see) is reported by the session, once per cause, and
//! not again when the configuration's warnings already say it; so is a
//! `train.elastic_interval` beyond the run's last step.

use std::path::Path;

use runtime::{Session, TrainConfig};

use crate::run_util;

/// The small GPT of `run_util` on 8 devices in `semi_auto` with the `[parallel]` lines `extra`,
/// `[parallel.hsdp]` sharding every parameter (threshold 0) with `shard_size`, and
/// command-line style `overrides`.
fn gpt(out: &Path, extra: &str, shard_size: i64, overrides: &[&str]) -> TrainConfig {
    let parallel = format!(
        "devices = 8\nmode = \"semi_auto\"\n{extra}\n[parallel.hsdp]\nthreshold = 0\nshard_size = {shard_size}\n"
    );
    let mut all = vec!["train.max_steps=1".to_string()];
    all.extend(overrides.iter().map(|o| o.to_string()));
    run_util::small_gpt(out, "adam", "", &parallel, &all)
}

/// The session's error for `config`.
fn session_error(config: &TrainConfig) -> String {
    match Session::new(config) {
        Ok(_) => panic!("the session builds"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_strategy_wider_than_a_stage_names_the_stage_and_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    // The first block on the first stage, the second on the second.
    let staged = "data_parallel = 2\nmodel_parallel = 2\n[parallel.pipeline]\nstages = 2\n\
                  micro_batches = 2\n[parallel.pipeline.stage_config]\n\"blocks.0\" = 0\n\
                  \"blocks.1\" = 1";
    let pattern = gpt(
        tmp.path(),
        staged,
        -1,
        &[r#"parallel.shard."blocks.*.mlp.fc1"=[[2,1,1],[4,1]]"#],
    );
    let e = session_error(&pattern);
    for part in [
        "blocks.0.mlp.fc1.matmul",
        "it uses 8 devices",
        "the 4 devices of pipeline stage 0 (parallel.devices 8 / parallel.pipeline.stages 2)",
        r#"parallel.shard."blocks.*.mlp.fc1""#,
    ] {
        assert!(e.contains(part), "{part:?} missing from: {e}");
    }
    // An exact op name as the key, on the second stage.
    let exact = gpt(
        tmp.path(),
        staged,
        -1,
        &[r#"parallel.shard."blocks.1.mlp.fc1.matmul"=[[2,1,1],[4,1]]"#],
    );
    let e = session_error(&exact);
    for part in [
        "blocks.1.mlp.fc1.matmul",
        "the 4 devices of pipeline stage 1 (parallel.devices 8 / parallel.pipeline.stages 2)",
        r#"parallel.shard."blocks.1.mlp.fc1.matmul""#,
    ] {
        assert!(e.contains(part), "{part:?} missing from: {e}");
    }
    // Without stages the devices are the run's, said plainly.
    let flat = gpt(
        tmp.path(),
        "model_parallel = 2",
        -1,
        &[r#"parallel.shard."blocks.*.mlp.fc1"=[[4,1,1],[4,1]]"#],
    );
    let e = session_error(&flat);
    assert!(
        e.contains("which does not divide the 8 devices;") && !e.contains("pipeline stage"),
        "{e}"
    );
    // A layout-valued strategy whose device matrix holds the run's 8 devices, not the 4 of
    // its stage: it said "the run has 4".
    let layouts = gpt(
        tmp.path(),
        &format!("{staged}\n[parallel.mesh]\ndevice_matrix = [2, 2, 2]\nalias_name = [\"dp\", \"sp\", \"mp\"]"),
        -1,
        &[r#"parallel.shard."blocks.*.mlp.fc1"=[["dp","None","None"],["mp","None"]]"#],
    );
    let e = session_error(&layouts);
    for part in [
        "blocks.0.mlp.fc1.matmul",
        "holds 8 devices, but the op runs on the 4 devices of pipeline stage 0 (parallel.devices 8 / parallel.pipeline.stages 2)",
        r#"parallel.shard."blocks.*.mlp.fc1""#,
    ] {
        assert!(e.contains(part), "{part:?} missing from: {e}");
    }
}

#[test]
fn a_cap_only_the_compiled_layout_shows_is_a_session_warning() {
    let tmp = tempfile::tempdir().unwrap();
    // model_parallel 2 on 8 devices: the split weights have 4 replicas, which shard_size 4
    // divides, so the configuration has nothing to say ...
    let plain = gpt(tmp.path(), "model_parallel = 2", 4, &[]);
    assert!(
        plain
            .warnings()
            .iter()
            .all(|w| !w.contains("parallel.hsdp.shard_size")),
        "{:?}",
        plain.warnings()
    );
    let session = Session::new(&plain).expect("the session builds");
    assert!(session.warnings().is_empty(), "{:?}", session.warnings());
    // ... but a [parallel.shard] strategy splitting fc1's weight 4 ways leaves it 2 replicas:
    // those are sharded over 2, not 4.
    let split = gpt(
        tmp.path(),
        "model_parallel = 2",
        4,
        &[r#"parallel.shard."blocks.*.mlp.fc1"=[[2,1,1],[4,1]]"#],
    );
    assert!(
        split
            .warnings()
            .iter()
            .all(|w| !w.contains("parallel.hsdp.shard_size")),
        "{:?}",
        split.warnings()
    );
    let session = Session::new(&split).expect("the session builds");
    let capped: Vec<(String, usize)> = session
        .train
        .params
        .iter()
        .filter_map(|p| Some((p.name.clone(), p.optimizer_shard()?.size)))
        .filter(|(_, size)| *size < 4)
        .collect();
    let warned = session.warnings();
    assert_eq!(warned.len(), 1, "{warned:?}");
    let expected_count = format!("{} parameters", capped.len());
    for part in [
        "parallel.hsdp.shard_size = 4",
        "capped to 2",
        expected_count.as_str(),
        capped[0].0.as_str(),
    ] {
        assert!(warned[0].contains(part), "{part:?} missing from {warned:?}");
    }
}

#[test]
fn a_cap_the_configuration_already_reports_is_not_repeated() {
    let tmp = tempfile::tempdir().unwrap();
    // shard_size 8 on 8 devices with model_parallel 2: the configuration says the split
    // weights' 4 replicas cap it; the session has nothing to add.
    let config = gpt(tmp.path(), "model_parallel = 2", 8, &[]);
    let said: Vec<String> = config
        .warnings()
        .into_iter()
        .filter(|w| w.contains("parallel.hsdp.shard_size"))
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("capped to 4"), "{said:?}");
    let session = Session::new(&config).expect("the session builds");
    assert!(
        session
            .train
            .params
            .iter()
            .any(|p| p.optimizer_shard().is_some_and(|s| s.size == 4)),
        "the split weights are sharded over their 4 replicas"
    );
    assert!(session.warnings().is_empty(), "{:?}", session.warnings());
}

/// A search-mode run loading its strategies from a file: the file's split of `matmul1`'s
/// weight leaves it 2 replicas on 4 devices, which only the compiled program knows; with a
/// file that keeps it whole there is nothing to say.
#[test]
fn a_cap_from_a_loaded_strategy_file_is_a_session_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, weight: &str| {
        let file = tmp.path().join(format!("{name}.json"));
        std::fs::write(
            &file,
            format!(
                r#"{{"current_stage": 0, "parallel_strategy_item": {{"matmul1": {{"stage": 0, "parallel_strategy": [[2, 1], {weight}]}}}}}}"#
            ),
        )
        .unwrap();
        let config = run_util::seed_mlp(
            &tmp.path().join(name),
            "momentum",
            &format!(
                "devices = 4\nmode = \"dynamic_programming\"\nload_operator_strategy_file = \"{}\"\n\
                 [parallel.hsdp]\nthreshold = 0\nshard_size = 4",
                file.display()
            ),
            &[],
        );
        let said = config.warnings();
        assert!(
            said.iter().all(|w| !w.contains("parallel.hsdp.shard_size")),
            "{said:?}"
        );
        Session::new(&config)
            .expect("the session builds")
            .warnings()
    };
    let warned = run("split", "[1, 2]");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("parallel.hsdp.shard_size = 4 is capped to 2")
            && warned[0].contains("1 parameter (fc1_weight)"),
        "{warned:?}"
    );
    assert_eq!(run("whole", "[1, 1]"), Vec::<String>::new());
}

/// A strategy `parallel.strategy_file` gave an op that breaks the op's rule names that key
/// and the file (it named nothing: only `[parallel.shard]` keys were looked for), and
/// `tessera plan` says so as the run does (it ignored the file, costing the data-parallel
/// default the run does not use). A `[parallel.shard]` pattern covering the op wins over the
/// file's entry for it, as `parallel.strategy_file` is documented (the file's exact op name
/// won over the pattern).
#[test]
fn a_strategy_from_the_strategy_file_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("ops.json");
    let write = |matmul1: &str| {
        std::fs::write(
            &file,
            format!(
                r#"{{"format": "tessera-strategy", "version": 1, "tensors": [], "ops": [{{"name": "matmul1", "stage": 0, "in_strategy": {matmul1}, "out_strategy": null}}]}}"#
            ),
        )
        .unwrap()
    };
    let config = |shard: &str| {
        let parallel = format!(
            "devices = 8\nmode = \"semi_auto\"\nstrategy_file = {:?}\n{shard}",
            file.display().to_string()
        );
        run_util::seed_mlp(&tmp.path().join("out"), "momentum", &parallel, &[])
    };
    let matmul1 = |report: &runtime::PlanReport| {
        report
            .strategies
            .iter()
            .find(|(name, _)| name == "matmul1")
            .map(|(_, s)| s.clone())
            .expect("matmul1 is planned")
    };
    write("[[16, 1], [1, 1]]");
    let plain = config("");
    let from_file = format!(
        "the strategy comes from parallel.strategy_file {}",
        file.display()
    );
    let train = session_error(&plain);
    let plan = match runtime::plan(&plain) {
        Ok(_) => panic!("tessera plan accepts the file's strategy"),
        Err(e) => e.to_string(),
    };
    for e in [&train, &plan] {
        assert!(
            e.contains("matmul1")
                && e.contains("it uses 16 devices, which does not divide the 8 devices")
                && e.contains(&from_file)
                && !e.contains("parallel.shard"),
            "{e}"
        );
    }
    // A pattern of [parallel.shard] over the op: the file's entry is not used.
    let pattern = config("[parallel.shard]\n\"matmul1*\" = [[8, 1], [1, 1]]");
    Session::new(&pattern).expect("the pattern's strategy, not the file's");
    let planned = runtime::plan(&pattern).expect("a plan");
    assert_eq!(matmul1(&planned), vec![vec![8, 1], vec![1, 1]]);
    // A file strategy that fits is the one tessera plan costs, as the run uses it.
    write("[[2, 4], [4, 1]]");
    let planned = runtime::plan(&config("")).expect("a plan");
    assert_eq!(matmul1(&planned), vec![vec![2, 4], vec![4, 1]]);
}

/// `parallel.strategy_file` in a search mode: the search keeps the file's strategies fixed,
/// as it keeps `[parallel.shard]`'s (they were overwritten by the searched ones, silently), and
/// the run compiles them; in a mode that uses no op strategies the key is a warning.
#[test]
fn a_search_keeps_the_strategy_files_strategies() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("ops.json");
    std::fs::write(
        &file,
        r#"{"format": "tessera-strategy", "version": 1, "tensors": [], "ops": [{"name": "matmul1", "stage": 0, "in_strategy": [[2, 4], [4, 1]], "out_strategy": null}]}"#,
    )
    .unwrap();
    let config = |mode: &str| {
        let parallel = format!(
            "devices = 8\nmode = \"{mode}\"\nstrategy_file = {:?}\n",
            file.display().to_string()
        );
        run_util::seed_mlp(&tmp.path().join(mode), "momentum", &parallel, &[])
    };
    let file_strategy = vec![vec![2, 4], vec![4, 1]];
    for mode in [
        "sharding_propagation",
        "recursive_programming",
        "dynamic_programming",
    ] {
        let config = config(mode);
        let planned = runtime::plan(&config).expect("a plan");
        let matmul1 = planned
            .strategies
            .iter()
            .find(|(name, _)| name == "matmul1")
            .map(|(_, s)| s.clone());
        assert_eq!(matmul1, Some(file_strategy.clone()), "{mode}");
        let session = Session::new(&config).expect("the session builds");
        let compiled = session
            .op_strategies()
            .into_iter()
            .find(|op| op.name == "matmul1")
            .map(|op| op.inputs);
        assert_eq!(compiled, Some(file_strategy.clone()), "{mode}");
        assert!(
            !config
                .warnings()
                .iter()
                .any(|w| w.contains("strategy_file")),
            "{mode}: {:?}",
            config.warnings()
        );
    }
    let data_parallel = config("data_parallel");
    assert!(
        data_parallel
            .warnings()
            .iter()
            .any(|w| w.contains("parallel.strategy_file has no effect in mode \"data_parallel\"")),
        "{:?}",
        data_parallel.warnings()
    );
}

/// `train.elastic` with a `train.elastic_interval` beyond the run's last step takes no
/// snapshot, so the switch would do nothing: the session says so, naming both figures; an
/// interval the run reaches says nothing.
#[test]
fn an_elastic_interval_beyond_the_run_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |interval: u64| {
        let overrides = [
            "train.max_steps=3".to_string(),
            "train.elastic=true".to_string(),
            format!("train.elastic_interval={interval}"),
        ];
        let parallel = "devices = 2\nmode = \"semi_auto\"\nmodel_parallel = 2\n";
        let config = run_util::small_gpt(tmp.path(), "adam", "", parallel, &overrides);
        Session::new(&config)
            .expect("the session builds")
            .warnings()
    };
    let warned = run(1_000_000);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("train.elastic_interval = 1000000 is beyond the run's 3 step(s)"),
        "{warned:?}"
    );
    assert_eq!(run(3), Vec::<String>::new());
}
