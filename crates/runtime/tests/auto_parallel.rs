//! Automatic parallel: every search mode trains the seed MLP and the GPT as one device does,
//! with the strategies it found (and those strategies saved and loaded again).

use parallel::{ParallelMode, StrategySource};
use runtime::{Session, TrainConfig};

use crate::run_util::{self, Run};

const MODES: [&str; 3] = [
    "sharding_propagation",
    "recursive_programming",
    "dynamic_programming",
];

/// Trains `config` for 20 steps: the losses, and every merged parameter by name. Asserts that
/// the session searched (its forward ops take the strategies the search gave).
fn train_searched(config: &TrainConfig) -> (Session, Run) {
    let (session, run) = run_util::train_run(config, 20);
    let placed = &session.train.placed;
    assert!(matches!(placed.config.mode, ParallelMode::Auto(_)));
    let searched = placed
        .nodes
        .iter()
        .filter(|n| n.source == StrategySource::User)
        .count();
    assert!(searched > 0, "the forward ops take the searched strategies");
    (session, run)
}

fn reference(config: &TrainConfig) -> Run {
    run_util::train_run(config, 20).1
}

/// The small GPT's run on one device (momentum), configured under `dir/alone`.
fn small_gpt_alone(dir: &std::path::Path) -> Run {
    reference(&run_util::small_gpt(
        &dir.join("alone"),
        "momentum",
        "",
        "mode = \"stand_alone\"",
        &[],
    ))
}

/// Every mode on the seed MLP, 8 devices, once with the memory of an H100 and once with 200 kB
/// per device, which data parallelism (every weight whole on every device) exceeds.
#[test]
fn every_search_mode_trains_the_mlp_like_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let alone = reference(&run_util::seed_mlp(
        &tmp.path().join("alone"),
        "momentum",
        "mode = \"stand_alone\"",
        &[],
    ));
    for mode in MODES {
        for (i, memory) in ["\"80GB\"", "200000"].into_iter().enumerate() {
            let out = tmp.path().join(format!("{mode}-{i}"));
            let config = run_util::seed_mlp(
                &out,
                "momentum",
                &format!("devices = 8\nmode = \"{mode}\"\nmax_device_memory = {memory}"),
                &[],
            );
            let (session, run) = train_searched(&config);
            let what = format!("{mode} with {memory} bytes per device");
            run_util::assert_same_run(&what, &run, &alone, 1e-4);
            if memory == "200000" {
                let split_weight = session
                    .train
                    .params
                    .iter()
                    .any(|p| p.layout.replica_count() < 8);
                assert!(split_weight, "{what}: a weight is split to fit");
            }
        }
    }
}

/// Every mode on the small GPT, 4 devices.
#[test]
fn every_search_mode_trains_the_gpt_like_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let alone = small_gpt_alone(tmp.path());
    for mode in MODES {
        let config = run_util::small_gpt(
            &tmp.path().join(mode),
            "momentum",
            "",
            &format!("devices = 4\nmode = \"{mode}\"\nmax_device_memory = 2000000"),
            &[],
        );
        let (_, run) = train_searched(&config);
        run_util::assert_same_run(mode, &run, &alone, 2e-4);
    }
}

/// The strategies a run saves (`save_operator_strategy_file`) load into another run
/// (`load_operator_strategy_file`), which then skips the search and trains alike.
#[test]
fn saved_operator_strategies_load_and_train_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("ops.json");
    let saving = run_util::seed_mlp(
        &tmp.path().join("save"),
        "momentum",
        &format!(
            "devices = 8\nmode = \"dynamic_programming\"\nmax_device_memory = 200000\nsave_operator_strategy_file = \"{}\"",
            file.display()
        ),
        &[],
    );
    let (first, run) = train_searched(&saving);
    let loading = run_util::seed_mlp(
        &tmp.path().join("load"),
        "momentum",
        // A budget no plan fits: loading must not search.
        &format!(
            "devices = 8\nmode = \"dynamic_programming\"\nmax_device_memory = 1\nload_operator_strategy_file = \"{}\"",
            file.display()
        ),
        &[],
    );
    let (second, loaded) = train_searched(&loading);
    run_util::assert_same_run("loaded strategies", &loaded, &run, 1e-6);
    let strategies = |s: &Session| {
        s.train
            .placed
            .nodes
            .iter()
            .map(|n| n.strategy.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(strategies(&first), strategies(&second));
}

/// A budget below the smallest plan fails with a message naming the memory that would fit.
#[test]
fn a_budget_no_plan_fits_names_the_memory_needed() {
    let tmp = tempfile::tempdir().unwrap();
    for mode in MODES {
        let config = run_util::seed_mlp(
            &tmp.path().join(mode),
            "momentum",
            &format!("devices = 8\nmode = \"{mode}\"\nmax_device_memory = 1000"),
            &[],
        );
        let err = Session::new(&config).unwrap_err().to_string();
        assert!(
            err.contains("no strategy fits in 1000 bytes") && err.contains("max_device_memory"),
            "{mode}: {err}"
        );
    }
}

/// A plan is made without ranks and reports what `tessera plan` prints.
#[test]
fn plan_reports_the_step_and_memory_of_its_strategies() {
    let tmp = tempfile::tempdir().unwrap();
    let config = run_util::small_gpt(
        &tmp.path().join("plan"),
        "adamw",
        "",
        "devices = 64\nmode = \"dynamic_programming\"",
        &["data.batch_size=64".to_string()],
    );
    let report = runtime::plan(&config).expect("a plan");
    assert_eq!(report.devices, 64);
    assert!(report.step_ms() > 0.0);
    assert!(report.cost.memory.total() <= report.memory_budget as f64);
    assert!(report.cost.memory.optimizer > 0.0, "adamw keeps state");
    let megatron = runtime::plan(&run_util::small_gpt(
        &tmp.path().join("megatron"),
        "adamw",
        "",
        "devices = 64\nmode = \"semi_auto\"\nmodel_parallel = 8",
        &["data.batch_size=64".to_string()],
    ))
    .expect("a configured plan");
    assert!(
        report.step_ms() <= megatron.step_ms() * (1.0 + 1e-9),
        "dynamic programming ({} ms) is no slower than Megatron's dp × mp ({} ms) under the model",
        report.step_ms(),
        megatron.step_ms()
    );
}

/// A hand-written MindSpore layout-form entry (`parallel_layout_value_item`, the format of
/// `StrategyCheckpointInfo::to_json_layout_value_tuple_item` and
/// `StrategyJsonInfo::LayoutFromJson` in MindSpore's `strategy_checkpoint_info.cc`) loads as
/// the layouts it names: the run places and trains exactly as the same layouts given in
/// `[parallel.shard]`, and the file it saves holds the entry again.
#[test]
fn a_mindspore_layout_entry_loads_like_the_configured_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    // layout = Layout((2, 2), ("dp", "mp")); matmul1.shard((layout("mp", "None"),
    // layout("None", "dp"))): "mp" is axis 0 from the right, "dp" axis 1. Split tuples
    // ([[2, 1], [1, 2]]) would put the batch on the outer axis instead.
    let file = tmp.path().join("ms_ops.json");
    std::fs::write(
        &file,
        r#"{"current_stage": 0, "parallel_layout_value_item": {"matmul1": {
            "0": {"alias_name": ["dp", "mp"], "dev_matrix": [2, 2], "interleaved_parallel": false, "tensor_map": [[0], [-1]]},
            "1": {"alias_name": ["dp", "mp"], "dev_matrix": [2, 2], "interleaved_parallel": false, "tensor_map": [[-1], [1]]}}}}"#,
    )
    .unwrap();
    let configured = run_util::seed_mlp(
        &tmp.path().join("config"),
        "momentum",
        "devices = 4\nmode = \"semi_auto\"\n[parallel.mesh]\ndevice_matrix = [2, 2]\n\
         alias_name = [\"dp\", \"mp\"]\n[parallel.shard]\nmatmul1 = [[\"mp\", \"None\"], [\"None\", \"dp\"]]",
        &[],
    );
    let (want, want_run) = run_util::train_run(&configured, 20);
    let saved = tmp.path().join("saved.json");
    let loading = searching_seed_mlp(&tmp.path().join("load"), &file, &saved);
    let (got, got_run) = train_searched(&loading);
    let placed = |s: &Session| {
        s.train
            .placed
            .nodes
            .iter()
            .map(|n| (n.strategy.clone(), n.inputs.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(placed(&got), placed(&want));
    run_util::assert_same_run("layout entry", &got_run, &want_run, 1e-6);
    let read = |p: &std::path::Path| {
        ckpt::read_operator_strategy_file(p)
            .unwrap()
            .into_iter()
            .find(|r| r.name == "matmul1")
            .unwrap()
    };
    let (loaded, resaved) = (read(&file), read(&saved));
    assert!(resaved.in_layouts.is_some(), "saved as a layout entry");
    assert_eq!(resaved, loaded);
}

/// Recursive bisection lands within 10 % of dynamic programming's predicted step on a GPT (the
/// benchmark's width, 2 layers) at 64 and 1024 devices, where per-op greed that split the batch
/// first used to end 16 % and 14 % above it.
#[test]
fn recursive_programming_is_within_ten_percent_of_dynamic_programming() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = |mode: &str, devices: usize| {
        let config = run_util::small_gpt(
            &tmp.path().join(format!("{mode}-{devices}")),
            "adamw",
            "",
            &format!("devices = {devices}\nmode = \"{mode}\""),
            &[
                "data.batch_size=1024".to_string(),
                "model.hidden=256".to_string(),
                "model.heads=16".to_string(),
                "model.seq_len=64".to_string(),
                "model.ffn_hidden=1024".to_string(),
            ],
        );
        runtime::plan(&config).expect("a plan").step_ms()
    };
    for devices in [64, 1024] {
        let dp = plan("dynamic_programming", devices);
        let recursive = plan("recursive_programming", devices);
        assert!(
            recursive <= dp * 1.10,
            "{devices} devices: recursive {recursive:.3} ms against DP {dp:.3} ms"
        );
        assert!(
            recursive >= dp * (1.0 - 1e-9),
            "DP is optimal under the model"
        );
    }
}

/// `parallel.auto_pipeline` on the seed MLP (batch 8192, 2 devices): with the memory of an H100
/// the plain search is faster than any pipeline, so one stage is kept, with the plain search's
/// plan; with 4 MB per device, which no plan of the two devices together fits (activations of
/// the whole batch), the search cuts the layers into 2 stages whose in-flight micro-batches fit.
#[test]
fn auto_pipeline_keeps_one_stage_unless_memory_forces_stages() {
    let tmp = tempfile::tempdir().unwrap();
    let config = |name: &str, extra: &str| {
        run_util::seed_mlp(
            &tmp.path().join(name),
            "momentum",
            &format!("devices = 2\nmode = \"dynamic_programming\"\n{extra}"),
            &["data.batch_size=8192"],
        )
    };
    let plain = runtime::plan(&config("plain", "")).expect("a plain plan");
    let roomy = runtime::plan(&config("roomy", "auto_pipeline = true")).expect("a plan");
    let pipeline = roomy.pipeline.as_ref().expect("the pipeline chosen");
    assert_eq!(pipeline.config.stages, 1, "one stage is cheaper here");
    assert!((roomy.step_ms() - plain.step_ms()).abs() <= 1e-9 * plain.step_ms());

    let budget = "max_device_memory = 4000000";
    let err = runtime::plan(&config("tight-plain", budget)).unwrap_err();
    assert!(err.to_string().contains("no strategy fits"), "{err}");
    let tight = runtime::plan(&config("tight", &format!("{budget}\nauto_pipeline = true")))
        .expect("a pipelined plan fits");
    let pipeline = tight.pipeline.as_ref().expect("the pipeline chosen");
    assert_eq!(pipeline.config.stages, 2);
    assert_eq!(tight.devices, 1, "one device per stage");
    for (stage, cost) in pipeline.stage_costs.iter().enumerate() {
        assert!(
            cost.memory.total() <= 4e6,
            "stage {stage} holds {} bytes",
            cost.memory.total()
        );
    }
    let stages: Vec<usize> = pipeline.layers.iter().map(|(_, s)| *s).collect();
    assert!(
        stages.windows(2).all(|w| w[0] <= w[1]),
        "contiguous: {stages:?}"
    );
    assert_eq!(stages.first(), Some(&0));
    assert_eq!(stages.last(), Some(&1));
    assert!(tight.bubble_seconds() > 0.0, "a pipeline idles");
    assert!(
        tight.step_ms() > roomy.step_ms(),
        "the pipeline was not the fastest"
    );
    // The operator strategy records carry each op's stage.
    let records = runtime::operator_strategy_records(&tight);
    assert!(records.iter().any(|r| r.stage == 0) && records.iter().any(|r| r.stage == 1));
}

/// Training the pipeline the search chose for the small GPT on 2 ranks (the batch cut into 4
/// micro-batches by `[parallel.pipeline]`) equals `stand_alone`.
#[test]
fn auto_pipeline_plan_trains_like_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let alone = small_gpt_alone(tmp.path());
    let file = tmp.path().join("ops.json");
    let config = run_util::small_gpt(
        &tmp.path().join("auto"),
        "momentum",
        "",
        &format!(
            "devices = 2\nmode = \"dynamic_programming\"\nauto_pipeline = true\nsave_operator_strategy_file = \"{}\"\n[parallel.pipeline]\nstages = 1\nmicro_batches = 4",
            file.display()
        ),
        &[],
    );
    let plan = runtime::plan(&config).expect("a plan");
    let stages = plan.pipeline.as_ref().map_or(1, |p| p.config.stages);
    assert_eq!(stages, 2, "the search pipelines the small GPT on 2 devices");
    let (session, run) = train_searched(&config);
    let placed = session
        .train
        .placed
        .config
        .pipeline
        .as_ref()
        .expect("a pipeline");
    assert_eq!(placed.stages, 2);
    run_util::assert_same_run("searched pipeline", &run, &alone, 1e-4);
    let records = ckpt::read_operator_strategy_file(&file).expect("the saved strategies");
    assert!(
        records.iter().any(|r| r.stage == 1),
        "the file carries the stages"
    );
    // Loading the file (no search) places the same pipeline from the entries' stages.
    let loading = run_util::small_gpt(
        &tmp.path().join("load"),
        "momentum",
        "",
        &format!(
            "devices = 2\nmode = \"dynamic_programming\"\nload_operator_strategy_file = \"{}\"\n[parallel.pipeline]\nstages = 1\nmicro_batches = 4",
            file.display()
        ),
        &[],
    );
    let (loaded_session, loaded) = train_searched(&loading);
    let stage_config = |s: &runtime::Session| {
        s.train
            .placed
            .config
            .pipeline
            .as_ref()
            .map(|p| p.stage_config.clone())
    };
    assert!(stage_config(&session).is_some());
    assert_eq!(stage_config(&loaded_session), stage_config(&session));
    run_util::assert_same_run("loaded pipeline", &loaded, &run, 1e-6);
}

/// Training a pipeline the search chose needs the batch cut into micro-batches before the model
/// is built: without `[parallel.pipeline]` the run fails naming the key and what to add.
#[test]
fn auto_pipeline_training_without_the_pipeline_section_names_what_to_add() {
    let tmp = tempfile::tempdir().unwrap();
    let config = run_util::small_gpt(
        &tmp.path().join("nosec"),
        "momentum",
        "",
        "devices = 2\nmode = \"dynamic_programming\"\nauto_pipeline = true",
        &[],
    );
    let plan = runtime::plan(&config).expect("tessera plan works without the section");
    assert_eq!(plan.pipeline.as_ref().map(|p| p.config.stages), Some(2));
    let err = Session::new(&config).unwrap_err().to_string();
    assert!(
        err.contains("parallel.auto_pipeline") && err.contains("[parallel.pipeline]"),
        "{err}"
    );
    // The same stages loaded from an operator strategy file, without `auto_pipeline`: the
    // refusal names the file's key, not `auto_pipeline` (which is not set).
    let file = tmp.path().join("ops.json");
    ckpt::write_operator_strategy_file(&file, &runtime::operator_strategy_records(&plan)).unwrap();
    let loaded = run_util::small_gpt(
        &tmp.path().join("loaded"),
        "momentum",
        "",
        &format!(
            "devices = 2\nmode = \"dynamic_programming\"\nload_operator_strategy_file = {:?}",
            file.display().to_string()
        ),
        &[],
    );
    let err = Session::new(&loaded).unwrap_err().to_string();
    assert!(
        err.contains("parallel.load_operator_strategy_file")
            && err.contains("ops.json places its ops on 2 pipeline stages")
            && err.contains("[parallel.pipeline]")
            && !err.contains("auto_pipeline"),
        "{err}"
    );
}

/// Pipeline stages configured by `[parallel.pipeline]` in a search mode (2 stages of 2 devices,
/// the small GPT cut into 4 micro-batches) are planned stage by stage, on the stages the run
/// places (every op's plan stage is the stage of its ranks in the session): a stage holds about
/// half of the parameters the whole model on one stage's devices holds, so a memory budget
/// that only the stages fit plans and trains like `stand_alone`; the strategies saved (with
/// their stages) load into the same configured pipeline.
#[test]
fn configured_pipeline_stages_are_planned_stage_by_stage_and_train_like_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let alone = small_gpt_alone(tmp.path());
    let file = tmp.path().join("ops.json");
    let pipeline = "[parallel.pipeline]\nstages = 2\nmicro_batches = 4";
    let config = |name: &str, parallel: &str| {
        run_util::small_gpt(
            &tmp.path().join(name),
            "momentum",
            "",
            &format!("mode = \"dynamic_programming\"\n{parallel}"),
            &[],
        )
    };
    let staged = runtime::plan(&config("staged", &format!("devices = 4\n{pipeline}")))
        .expect("a staged plan");
    let plan = staged.pipeline.as_ref().expect("the stages are planned");
    assert_eq!(plan.config.stages, 2);
    assert!(plan.config.stage_config.is_empty(), "kept as configured");
    assert_eq!(staged.devices, 2, "each stage on its own 2 devices");
    assert_eq!(plan.stage_costs.len(), 2);
    assert!(staged.bubble_seconds() > 0.0);
    // The whole model on one stage's devices (the batch cut alike).
    let whole = runtime::plan(&config(
        "whole",
        "devices = 2\n[parallel.pipeline]\nstages = 1\nmicro_batches = 4",
    ))
    .expect("a plan of the whole model");
    let (stage_params, whole_params) =
        (staged.cost.memory.parameters, whole.cost.memory.parameters);
    assert!(
        stage_params < 0.7 * whole_params,
        "the fullest stage holds {stage_params} parameter bytes, the whole model {whole_params}"
    );
    // A budget the fullest stage fits and the whole model on a stage's devices does not.
    let budget = staged.cost.memory.total().ceil() as u64;
    let err = runtime::plan(&config(
        "whole-tight",
        &format!(
            "devices = 2\nmax_device_memory = {budget}\n[parallel.pipeline]\nstages = 1\nmicro_batches = 4"
        ),
    ))
    .unwrap_err();
    assert!(err.to_string().contains("no strategy fits"), "{err}");
    let tight = config(
        "tight",
        &format!(
            "devices = 4\nmax_device_memory = {budget}\nsave_operator_strategy_file = \"{}\"\n{pipeline}",
            file.display()
        ),
    );
    runtime::plan(&tight).expect("the stages fit the budget");
    // The run predicts more than the search's estimate (the micro-batches in flight): a run
    // over the budget it set is refused; trained with the budget raised to the peak.
    let peak = Session::for_planning(&tight)
        .expect("the session builds")
        .predict_memory_per_stage()
        .expect("a prediction")
        .iter()
        .map(|(_, m)| m.peak as u64)
        .max()
        .expect("stages");
    assert!(peak > budget, "{peak} against {budget}");
    let tight = config(
        "tight",
        &format!(
            "devices = 4\nmax_device_memory = {peak}\nsave_operator_strategy_file = \"{}\"\n{pipeline}",
            file.display()
        ),
    );
    let report = runtime::plan(&tight).expect("the stages fit the budget");
    let stage_of_op = report
        .pipeline
        .as_ref()
        .expect("the stages are planned")
        .stage_of_op
        .clone();
    let (session, run) = train_searched(&tight);
    run_util::assert_same_run("configured stages", &run, &alone, 1e-4);
    // Every op runs on the ranks of the stage the plan gave it.
    let placed = &session.train.placed;
    assert_eq!(placed.config.pipeline.as_ref().map(|p| p.stages), Some(2));
    let mut checked = 0;
    for (name, &stage) in &stage_of_op {
        let id = placed.graph.node_by_name(name).expect("a placed op");
        let node = &placed.nodes[id.0];
        let ranks = node.inputs[0].mesh().rank_list();
        assert!(
            ranks.iter().all(|&r| r / 2 == stage),
            "{name}: planned on stage {stage}, placed on ranks {ranks:?}"
        );
        checked += 1;
    }
    assert!(checked > 0 && stage_of_op.values().any(|&s| s == 1));
    // The saved strategies carry the stages and load into the configured pipeline.
    let records = ckpt::read_operator_strategy_file(&file).expect("the saved strategies");
    assert!(
        records.iter().any(|r| r.stage == 1),
        "the file carries the stages"
    );
    let loading = config(
        "load",
        &format!(
            "devices = 4\nload_operator_strategy_file = \"{}\"\n{pipeline}",
            file.display()
        ),
    );
    let (loaded_session, loaded) = train_searched(&loading);
    assert_eq!(
        loaded_session.train.placed.config.pipeline,
        session.train.placed.config.pipeline
    );
    run_util::assert_same_run("loaded configured stages", &loaded, &run, 1e-6);
}

/// A network of cells inside a cell `net` (`graph::models::nested_mlp`, its ReLU one cell
/// `net.act` called after `net.fc1` and again after `net.fc2`) searched on the 2 stages of a
/// `[parallel.pipeline]` whose `stage_config` names cells below the layer `net` (`net.fc1` on
/// stage 0, `net.fc2` on stage 1, so the second call of `net.act` runs on stage 1): the
/// strategies it saves, whose ops of `net` name both stages, load back under the same
/// configuration (they were refused: "the ops of layer \"net\" name several stages"), are
/// placed alike on the same pipeline and train as the run that searched.
#[test]
fn strategies_saved_with_stages_below_a_layer_load_and_train_as_searched() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("ops.json");
    let config = |name: &str, key: &str| {
        run_util::seed_mlp(
            &tmp.path().join(name),
            "momentum",
            &format!(
                "devices = 4\nmode = \"dynamic_programming\"\n{key} = \"{}\"\n\
                 [parallel.pipeline]\nstages = 2\nmicro_batches = 4\n\
                 stage_config = {{ \"net.fc1\" = 0, \"net.fc2\" = 1 }}",
                file.display()
            ),
            &[],
        )
    };
    let train = |config: &TrainConfig| {
        let model =
            graph::models::nested_mlp(config.data().batch_size, &[8, 8], 128, 10, true, "net")
                .expect("the nested MLP");
        let session = Session::with_model(config, model).expect("the session builds");
        run_util::train_session_run(config, session, 20)
    };
    let (searched, run) = train(&config("search", "save_operator_strategy_file"));
    let records = ckpt::read_operator_strategy_file(&file).expect("the saved strategies");
    let stage = |op: &str| records.iter().find(|r| r.name == op).map(|r| r.stage);
    assert_eq!(stage("net.fc1.matmul"), Some(0));
    assert_eq!(stage("net.act.relu"), Some(0));
    assert_eq!(stage("net.fc2.matmul"), Some(1));
    assert_eq!(stage("net.act.relu_1"), Some(1), "the raised call's stage");
    let (loaded, loaded_run) = train(&config("load", "load_operator_strategy_file"));
    let placed = |s: &Session| {
        let placed = &s.train.placed;
        let nodes: Vec<_> = placed
            .nodes
            .iter()
            .map(|n| (n.strategy.clone(), n.inputs.clone()))
            .collect();
        (placed.config.pipeline.clone(), nodes)
    };
    assert_eq!(placed(&loaded), placed(&searched));
    run_util::assert_same_run("loaded stages below a layer", &loaded_run, &run, 1e-6);
}

/// The seed MLP's config in `dir`: 4 devices, the dynamic-programming search, loading operator
/// strategies from `load` and saving them to `save`.
fn searching_seed_mlp(
    dir: &std::path::Path,
    load: &std::path::Path,
    save: &std::path::Path,
) -> TrainConfig {
    run_util::seed_mlp(
        dir,
        "momentum",
        &format!(
            "devices = 4\nmode = \"dynamic_programming\"\nload_operator_strategy_file = \"{}\"\n\
             save_operator_strategy_file = \"{}\"",
            load.display(),
            save.display()
        ),
        &[],
    )
}

/// Writes a MindSpore operator strategy file (stage 0) giving `op` the split tuples `strategy`
/// and `out_strategy` (JSON arrays).
fn write_op_and_out_strategy(path: &std::path::Path, op: &str, strategy: &str, out_strategy: &str) {
    let item = |s: &str| format!(r#"{{"{op}": {{"stage": 0, "parallel_strategy": {s}}}}}"#);
    let json = format!(
        r#"{{"current_stage": 0, "parallel_strategy_item": {}, "parallel_out_strategy_item": {}}}"#,
        item(strategy),
        item(out_strategy)
    );
    std::fs::write(path, json).unwrap();
}

/// A MindSpore file's out_strategy given as split tuples (`parallel_out_strategy_item`, no
/// layouts) is placed with its op: `matmul1`'s partial sums reduce-scattered onto `(4, 1)`
/// instead of all-reduced, as the same strategy in `[parallel.shard]` and
/// `[parallel.out_shard]` places and trains it; the file the run saves holds it again. It was
/// dropped when read, the op's output left as its in_strategy gives it. An out_strategy the op
/// cannot take is refused naming the op and the file.
#[test]
fn a_loaded_out_strategy_tuple_is_placed_and_saved_back() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("ms_ops.json");
    write_op_and_out_strategy(&file, "matmul1", "[[2, 2], [2, 1]]", "[[4, 1]]");
    let configured = run_util::seed_mlp(
        &tmp.path().join("config"),
        "momentum",
        "devices = 4\nmode = \"semi_auto\"\n[parallel.shard]\nmatmul1 = [[2, 2], [2, 1]]\n\
         [parallel.out_shard]\nmatmul1 = [[4, 1]]",
        &[],
    );
    let (want, want_run) = run_util::train_run(&configured, 20);
    let saved = tmp.path().join("saved.json");
    let loading =
        |dir: &str, file: &std::path::Path| searching_seed_mlp(&tmp.path().join(dir), file, &saved);
    let (got, got_run) = train_searched(&loading("load", &file));
    let matmul1 = |s: &Session| {
        let placed = &s.train.placed;
        let id = placed.graph.node_by_name("matmul1").expect("matmul1");
        let node = &placed.nodes[id.0];
        (node.strategy.clone(), node.out_layouts.clone())
    };
    let (strategy, outs) = matmul1(&got);
    assert_eq!(strategy, Some(vec![vec![2, 2], vec![2, 1]]));
    let outs = outs.expect("matmul1's output is brought to the file's out_strategy");
    assert_eq!(outs[0].split_factors(), vec![4, 1]);
    assert_eq!(matmul1(&got), matmul1(&want));
    run_util::assert_same_run("loaded out_strategy", &got_run, &want_run, 1e-6);
    let resaved = ckpt::read_operator_strategy_file(&saved)
        .unwrap()
        .into_iter()
        .find(|r| r.name == "matmul1")
        .expect("matmul1 saved");
    assert_eq!(resaved.outputs, Some(vec![vec![4, 1]]), "saved back");

    // 10 classes cannot be split 4 ways.
    let bad = tmp.path().join("bad_ops.json");
    write_op_and_out_strategy(&bad, "matmul3", "[[4, 1], [1, 1]]", "[[1, 4]]");
    let err = match Session::new(&loading("bad", &bad)) {
        Ok(_) => panic!("an out_strategy splitting 10 classes 4 ways was placed"),
        Err(e) => e.to_string(),
    };
    for needle in [
        "matmul3",
        "out_strategy [1, 4]",
        &format!(
            "the strategy and its out_strategy come from parallel.load_operator_strategy_file {}",
            bad.display()
        ),
    ] {
        assert!(err.contains(needle), "{err:?} lacks {needle:?}");
    }
}
