//! The crate's entry, `plan`, without a runtime: a model given as a `PlanModel`, its strategies
//! searched, loaded or configured, and the plan applied to the parallel configuration.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use graph::models::{nested_mlp, seed_mlp, Model};
use graph::Graph;
use parallel::pipeline::{layers_of_stage, node_stages, PipelineConfig, Scheduler};
use parallel::{ParallelConfig, ParallelMode};
use search::{
    plan, profiles, Hints, LoadedLayouts, LoadedOp, LoadedStrategies, PlanModel, PlanReport,
    PlanRequest, SearchError, SearchMode, Strategies,
};

/// The seed MLP of a batch of `batch`, rebuilt for any other batch; `nested`: its ops named as
/// the cells of a loss cell of one's own name them (`net.fc1.matmul`, ... inside the engine's
/// pipeline layer `net`); `shared_act`: (nested only) one activation cell `net.act` called after
/// `net.fc1` and again after `net.fc2`.
struct Mlp {
    batch: usize,
    image: [usize; 2],
    hidden: usize,
    nested: bool,
    shared_act: bool,
    /// The cell the nested MLP's cells are called in (`"net"`, or `""` for none).
    within: &'static str,
    model: Model,
}

impl Mlp {
    fn new(batch: usize) -> Mlp {
        Mlp::wide(batch, [4, 4], 8)
    }

    /// The seed MLP of `image`-shaped inputs and `hidden` features.
    fn wide(batch: usize, image: [usize; 2], hidden: usize) -> Mlp {
        Mlp {
            batch,
            image,
            hidden,
            nested: false,
            shared_act: false,
            within: "",
            model: seed_mlp(batch, &image, hidden, 4).expect("the seed MLP"),
        }
    }

    /// An MLP like the seed's, of `Dense` cells called inside a cell `net` (ops
    /// `net.flatten`, `net.fc<i>.matmul`, ..., `net.loss`).
    fn nested(batch: usize, image: [usize; 2], hidden: usize) -> Mlp {
        Mlp::nested_with(batch, image, hidden, false)
    }

    /// [`Mlp::nested`], its ReLUs one cell `net.act` called after `net.fc1` and `net.fc2` when
    /// `shared_act`.
    fn nested_with(batch: usize, image: [usize; 2], hidden: usize, shared_act: bool) -> Mlp {
        Mlp::cells(batch, image, hidden, shared_act, "net")
    }

    /// `graph::models::nested_mlp` with its cells called in the cell `within`.
    fn cells(
        batch: usize,
        image: [usize; 2],
        hidden: usize,
        shared_act: bool,
        within: &'static str,
    ) -> Mlp {
        Mlp {
            batch,
            image,
            hidden,
            nested: true,
            shared_act,
            within,
            model: nested_mlp(batch, &image, hidden, 4, shared_act, within)
                .expect("the nested MLP"),
        }
    }
}

impl PlanModel for Mlp {
    fn graph(&self) -> &Graph {
        &self.model.graph
    }

    fn hints(&self, _devices: usize) -> Hints {
        Hints::new()
    }

    fn batch_size(&self) -> usize {
        self.batch
    }

    fn with_batch_size(&self, batch_size: usize) -> Result<Box<dyn PlanModel>, SearchError> {
        Ok(Box::new(match self.nested {
            true => Mlp::cells(
                batch_size,
                self.image,
                self.hidden,
                self.shared_act,
                self.within,
            ),
            false => Mlp::wide(batch_size, self.image, self.hidden),
        }))
    }
}

fn request<'a>(
    model: &'a Mlp,
    parallel: &'a ParallelConfig,
    strategies: Strategies,
) -> PlanRequest<'a> {
    PlanRequest {
        model,
        parallel,
        profile: profiles::built_in("h100-nvlink-ib").expect("a built-in profile"),
        max_device_memory: None,
        optimizer_states: 1,
        time_budget: Duration::from_secs(60),
        auto_pipeline: false,
        strategies,
    }
}

#[test]
fn a_searched_plan_gives_every_forward_op_a_strategy_and_applies_as_user_strategies() {
    let model = Mlp::new(8);
    let parallel = ParallelConfig::new(ParallelMode::Auto(SearchMode::DynamicProgramming), 4);
    let report = plan(&request(&model, &parallel, Strategies::Search)).expect("a plan");
    assert_eq!(report.mode, "dynamic_programming");
    assert_eq!(report.devices, 4);
    assert!(report.n_ops > 0 && report.strategies.len() == report.n_ops);
    assert!(report.step_ms() > 0.0);
    assert!(report.pipeline.is_none());
    let names: Vec<String> = report.strategies.iter().map(|(n, _)| n.clone()).collect();
    let mut applied = parallel.clone();
    report.apply_to(&mut applied).expect("applied");
    for name in names {
        assert!(applied.strategies.contains_key(&name), "{name} is placed");
    }
}

#[test]
fn configured_strategies_are_only_costed_under_the_configured_mode() {
    let model = Mlp::new(8);
    let parallel = ParallelConfig::new(ParallelMode::DataParallel, 4);
    let report = plan(&request(
        &model,
        &parallel,
        Strategies::Configured(BTreeMap::new()),
    ))
    .expect("a costed plan");
    assert_eq!(report.mode, "data_parallel");
    assert_eq!(report.search_ms, 0.0);
    // A mode that does not search cannot be asked to.
    let err = plan(&request(&model, &parallel, Strategies::Search)).expect_err("no search");
    assert!(
        matches!(&err, SearchError::Config { key, .. } if key == "parallel.mode"),
        "{err}"
    );
}

/// A loaded entry of split tuples only (no layouts): op `name` on `stage`.
fn tuples_op(
    name: String,
    stage: usize,
    inputs: Vec<Vec<usize>>,
    outputs: Option<Vec<Vec<usize>>>,
) -> LoadedOp {
    LoadedOp {
        name,
        stage,
        inputs,
        outputs,
        layouts: LoadedLayouts {
            inputs: None,
            outputs: None,
        },
    }
}

/// A loaded operator strategy file `ops.json` holding `op` alone.
fn ops_file(op: LoadedOp) -> LoadedStrategies {
    LoadedStrategies {
        file: PathBuf::from("ops.json"),
        ops: vec![op],
    }
}

#[test]
fn a_loaded_strategy_for_an_op_the_model_lacks_names_the_file_and_the_op() {
    let model = Mlp::new(8);
    let parallel = ParallelConfig::new(ParallelMode::Auto(SearchMode::DynamicProgramming), 4);
    let loaded = ops_file(tuples_op(
        "no_such_op".to_string(),
        0,
        vec![vec![4, 1]],
        None,
    ));
    let err = plan(&request(&model, &parallel, Strategies::Loaded(loaded))).expect_err("refused");
    match &err {
        SearchError::Config { key, reason } => {
            assert_eq!(key, "parallel.load_operator_strategy_file");
            assert!(
                reason.contains("ops.json") && reason.contains("no_such_op"),
                "{reason}"
            );
        }
        other => panic!("{other}"),
    }
}

/// Stages configured by `[parallel.pipeline]` in a search mode are planned one by one, each
/// on its own devices, on the stages `parallel::pipeline::node_stages` places the ops on: the
/// plan's memory is its fullest stage's, so a budget every stage fits but the whole model on a
/// stage's devices does not is planned, and the pipeline is applied as configured.
#[test]
fn configured_pipeline_stages_are_searched_stage_by_stage() {
    // Two weights of 256 × 256 (and a small one): the even cut puts one on each stage.
    let model = Mlp::wide(8, [16, 16], 256);
    let mode = ParallelMode::Auto(SearchMode::DynamicProgramming);
    let pipeline = PipelineConfig::new(2, 4, Scheduler::OneFOneB);
    let mut parallel = ParallelConfig::new(mode, 4);
    parallel.pipeline = Some(pipeline.clone());
    let report = plan(&request(&model, &parallel, Strategies::Search)).expect("a staged plan");
    let staged = report.pipeline.as_ref().expect("the stages are planned");
    assert_eq!(staged.config, pipeline, "the configured pipeline, as given");
    assert_eq!(report.devices, 2);
    assert_eq!(report.strategies.len(), report.n_ops);
    let fullest = assert_staged_as_the_run_places(&model, &pipeline, &report);

    // The whole model on one stage's 2 devices needs more than the fullest stage.
    let whole = ParallelConfig::new(mode, 2);
    let flat = plan(&request(&model, &whole, Strategies::Search)).expect("a flat plan");
    assert!(
        report.cost.memory.parameters < 0.75 * flat.cost.memory.parameters,
        "a stage holds {} parameter bytes, the whole model {}",
        report.cost.memory.parameters,
        flat.cost.memory.parameters
    );
    let budget = fullest.ceil() as u64;
    let tight = |parallel| {
        let mut r = request(&model, parallel, Strategies::Search);
        r.max_device_memory = Some(budget);
        plan(&r)
    };
    let err = tight(&whole).expect_err("the whole model does not fit");
    assert!(matches!(err, SearchError::MemoryExceeded { .. }), "{err}");
    let fits = tight(&parallel).expect("every stage fits");
    assert!(fits.cost.memory.total() <= budget as f64);
    let mut applied = parallel.clone();
    fits.apply_to(&mut applied).expect("applied");
    assert_eq!(applied.pipeline, Some(pipeline));
}

/// `model` planned by dynamic programming on 4 devices in 2 stages of 1F1B (4 micro-batches)
/// whose `stage_config` puts `net.fc1` on stage 0 and `net.fc2` on stage 1, checked to cost every
/// op on the stage the run places it on.
fn planned_with_stages_below_net(model: &Mlp) -> PlanReport {
    let parallel = stages_below_net();
    let report = plan(&request(model, &parallel, Strategies::Search)).expect("a staged plan");
    let pipeline = parallel.pipeline.as_ref().expect("the pipeline");
    assert_staged_as_the_run_places(model, pipeline, &report);
    report
}

/// Dynamic programming on 4 devices in 2 stages of 1F1B (4 micro-batches) whose `stage_config`
/// puts `net.fc1` on stage 0 and `net.fc2` on stage 1.
fn stages_below_net() -> ParallelConfig {
    let mode = ParallelMode::Auto(SearchMode::DynamicProgramming);
    let mut pipeline = PipelineConfig::new(2, 4, Scheduler::OneFOneB);
    pipeline.stage_config = vec![("net.fc1".to_string(), 0), ("net.fc2".to_string(), 1)];
    let mut parallel = ParallelConfig::new(mode, 4);
    parallel.pipeline = Some(pipeline);
    parallel
}

/// The operator strategy file `report` saves (`parallel.save_operator_strategy_file`: every
/// op with its split tuples and its stage), as `parallel.load_operator_strategy_file` reads it.
fn saved_file(report: &PlanReport) -> LoadedStrategies {
    let ops = report
        .strategies
        .iter()
        .map(|(name, inputs)| tuples_op(name.clone(), report.stage_of(name), inputs.clone(), None))
        .collect();
    LoadedStrategies {
        file: PathBuf::from("saved.json"),
        ops,
    }
}

/// A plan saved under a pipeline cut below the layer `net` (`stage_config` keys `net.fc1`,
/// `net.fc2`; with `shared_act`, a cell whose second call is raised to stage 1 too) loads back
/// under the same pipeline: the same strategies on the same stages, the pipeline kept as
/// configured, every op costed where the run places it, and applied as the searched plan is.
/// The ops of `net` name both stages, which the loader refused before checking the configured
/// placement.
#[test]
fn a_plan_staged_below_a_layer_loads_back_under_its_pipeline() {
    for shared_act in [false, true] {
        let model = Mlp::nested_with(8, [16, 16], 256, shared_act);
        let parallel = stages_below_net();
        let pipeline = parallel.pipeline.clone().expect("the pipeline");
        let searched = planned_with_stages_below_net(&model);
        let file = saved_file(&searched);
        assert!(
            file.ops.iter().any(|op| op.stage == 1),
            "the file has stages"
        );
        let loaded = plan(&request(&model, &parallel, Strategies::Loaded(file)))
            .unwrap_or_else(|e| panic!("shared_act {shared_act}: the saved plan loads: {e}"));
        assert_eq!(loaded.loaded_from, Some(PathBuf::from("saved.json")));
        assert_eq!(loaded.strategies, searched.strategies);
        let (got, want) = (
            loaded.pipeline.as_ref().expect("stages"),
            searched.pipeline.as_ref().expect("stages"),
        );
        assert_eq!(got.config, pipeline, "the pipeline kept as configured");
        assert_eq!(got.stage_of_op, want.stage_of_op);
        assert_eq!(got.layers, want.layers);
        assert_staged_as_the_run_places(&model, &pipeline, &loaded);
        if shared_act {
            assert_eq!(loaded.stage_of("net.act.relu"), 0);
            assert_eq!(loaded.stage_of("net.act.relu_1"), 1);
        }
        let (mut from_file, mut from_search) = (parallel.clone(), parallel.clone());
        loaded.apply_to(&mut from_file).expect("applied");
        searched.apply_to(&mut from_search).expect("applied");
        assert_eq!(from_file.pipeline, from_search.pipeline);
        assert_eq!(from_file.strategies, from_search.strategies);
    }
}

/// A file whose entries name stages keeps the layout-form strategies of its ops (MindSpore's
/// `parallel_layout_value_item` / `parallel_out_layout_value_item`, here on `net.fc2.matmul`
/// of stage 1): the plan reports them and applies them, not their split factors alone (a mesh
/// `(a, b) = (1, 2)` with the batch split over both axes, which the split tuple `[2, 1]` places
/// on a mesh `(2, 1)`). They were dropped on this path, kept only without stages in the file.
#[test]
fn layouts_of_a_file_with_stages_are_kept_and_applied() {
    let model = Mlp::nested(8, [16, 16], 256);
    let parallel = stages_below_net();
    let mut file = saved_file(&planned_with_stages_below_net(&model));
    let mesh = layout::Layout::new(&[1, 2], &["a", "b"], None).expect("a mesh");
    let batch_over_both = |ndim: usize| {
        let mut dims = vec![layout::DimSpec::from(["a", "b"])];
        dims.resize(ndim, layout::DimSpec::Replicated);
        mesh.apply(&dims).expect("a layout")
    };
    let ins = vec![
        batch_over_both(2),
        mesh.apply(&["None".into(), "None".into()])
            .expect("a layout"),
    ];
    let outs = vec![batch_over_both(2)];
    let op = file
        .ops
        .iter_mut()
        .find(|op| op.name == "net.fc2.matmul")
        .expect("the op has an entry");
    assert_eq!(op.stage, 1, "the op is on the second stage");
    op.inputs = ins.iter().map(layout::Layout::split_factors).collect();
    assert_eq!(op.inputs, vec![vec![2, 1], vec![1, 1]]);
    assert_ne!(
        ins[0],
        layout::Layout::from_strategy(&op.inputs[0], 2).expect("the split's layout"),
        "the layout is not the one its split factors give"
    );
    op.layouts = LoadedLayouts {
        inputs: Some(ins.clone()),
        outputs: Some(outs.clone()),
    };
    let report =
        plan(&request(&model, &parallel, Strategies::Loaded(file))).expect("the file loads");
    assert!(report.pipeline.is_some(), "planned stage by stage");
    assert_eq!(report.stage_of("net.fc2.matmul"), 1);
    assert_eq!(
        report.layouts.get("net.fc2.matmul"),
        Some(&LoadedLayouts {
            inputs: Some(ins.clone()),
            outputs: Some(outs.clone()),
        }),
        "the file's layouts are reported"
    );
    let mut applied = parallel.clone();
    report.apply_to(&mut applied).expect("applied");
    let strategy = &applied.strategies["net.fc2.matmul"];
    assert_eq!(
        strategy.in_layouts,
        Some(ins),
        "placed by the file's layouts"
    );
    assert_eq!(strategy.out_layouts, Some(outs));
    assert_eq!(strategy.inputs, vec![vec![2, 1], vec![1, 1]]);
}

/// A file whose stage for an op is not the one the configured pipeline places it on is
/// refused, naming the file, the op and both stages: the raised call `net.act.relu_1` (stage 1
/// under the configuration) written on stage 0.
#[test]
fn a_loaded_stage_the_configured_pipeline_does_not_place_is_refused_naming_the_op() {
    let model = Mlp::nested_with(8, [16, 16], 256, true);
    let parallel = stages_below_net();
    let mut file = saved_file(&planned_with_stages_below_net(&model));
    let moved = file
        .ops
        .iter_mut()
        .find(|op| op.name == "net.act.relu_1")
        .expect("the raised call has an entry");
    assert_eq!(moved.stage, 1);
    moved.stage = 0;
    let err = plan(&request(&model, &parallel, Strategies::Loaded(file))).expect_err("refused");
    match &err {
        SearchError::Config { key, reason } => {
            assert_eq!(key, "parallel.load_operator_strategy_file");
            assert!(
                reason.contains("saved.json")
                    && reason.contains("op \"net.act.relu_1\" is on stage 0 in the file")
                    && reason.contains("places it on stage 1"),
                "{reason}"
            );
        }
        other => panic!("{other}"),
    }
}

/// Configured stages without `stage_config` (a stage count, the layers cut by parameter counts)
/// that cut elsewhere than a loaded file (a plan of `parallel.auto_pipeline`, loaded under its
/// stage count): the file's pipeline is placed, every layer on the stage of its ops.
#[test]
fn a_loaded_cut_under_a_configured_stage_count_is_placed_as_the_file_says() {
    let model = Mlp::cells(8, [16, 16], 256, false, "");
    let mode = ParallelMode::Auto(SearchMode::DynamicProgramming);
    let mut parallel = ParallelConfig::new(mode, 4);
    parallel.pipeline = Some(PipelineConfig::new(2, 4, Scheduler::OneFOneB));
    let searched = plan(&request(&model, &parallel, Strategies::Search)).expect("a staged plan");
    assert_eq!(
        searched.stage_of("fc2.matmul"),
        1,
        "the cut by parameter counts"
    );
    let mut file = saved_file(&searched);
    for op in &mut file.ops {
        op.stage = usize::from(op.name.starts_with("fc3") || op.name.starts_with("loss"));
    }
    let loaded = plan(&request(&model, &parallel, Strategies::Loaded(file))).expect("placed");
    assert_eq!(loaded.stage_of("fc1.matmul"), 0);
    assert_eq!(loaded.stage_of("fc2.matmul"), 0);
    assert_eq!(loaded.stage_of("fc3.matmul"), 1);
}

/// Without configured stages (`[parallel.pipeline]` only cutting the batch, or stages chosen by
/// `parallel.auto_pipeline`) each layer runs on the stage of its ops: a file whose ops of the
/// layer `net` name two stages is refused naming the layer, an op on each stage and what to
/// configure.
#[test]
fn a_layer_cut_by_loaded_stages_without_a_configured_pipeline_is_refused_naming_it() {
    let model = Mlp::nested(8, [16, 16], 256);
    let file = saved_file(&planned_with_stages_below_net(&model));
    let mut batch_cut = stages_below_net();
    batch_cut.pipeline = Some(PipelineConfig::new(1, 4, Scheduler::OneFOneB));
    let configured = stages_below_net();
    let mut auto = request(&model, &configured, Strategies::Loaded(file.clone()));
    auto.auto_pipeline = true;
    for (what, request) in [
        (
            "one stage",
            request(&model, &batch_cut, Strategies::Loaded(file)),
        ),
        ("auto_pipeline", auto),
    ] {
        let err = plan(&request).expect_err("refused");
        let reason = match &err {
            SearchError::Config { key, reason }
                if key == "parallel.load_operator_strategy_file" =>
            {
                reason
            }
            other => panic!("{what}: {other}"),
        };
        assert!(
            reason.contains("the ops of layer \"net\" name several stages")
                && reason.contains("\"net.flatten\" stage 0")
                && reason.contains("\"net.fc2.matmul\" stage 1")
                && reason.contains("[parallel.pipeline]"),
            "{what}: {reason}"
        );
    }
}

/// A configured pipeline whose `stage_config` keys name cells below one of the engine's pipeline
/// layers (`net.fc1`, `net.fc2` inside the layer `net`, as a loss cell of one's own names them)
/// is planned with every op on the stage the run places it on: the search grouped the ops by
/// the layers alone and charged all of `net` to stage 0.
#[test]
fn configured_stages_below_a_layer_are_planned_where_the_run_places_them() {
    let model = Mlp::nested(8, [16, 16], 256);
    let report = planned_with_stages_below_net(&model);
    assert_eq!(report.stage_of("net.fc1.matmul"), 0);
    assert_eq!(report.stage_of("net.fc2.matmul"), 1);
}

/// One activation cell called after `net.fc1` (stage 0) and again after `net.fc2` (stage 1):
/// its second call runs on stage 1, and `tessera plan` costs it there and lists the cell under
/// both stages, as `tessera train --explain` does (`NodeStages::layers`).
#[test]
fn a_cell_called_on_two_stages_is_planned_and_listed_on_both() {
    let model = Mlp::nested_with(8, [16, 16], 256, true);
    let report = planned_with_stages_below_net(&model);
    assert_eq!(report.stage_of("net.act.relu"), 0);
    assert_eq!(report.stage_of("net.act.relu_1"), 1);
    let layers = &report.pipeline.as_ref().expect("the stages").layers;
    assert_eq!(
        layers_of_stage(layers, 0),
        ["net.flatten", "net.fc1", "net.act"]
    );
    assert_eq!(
        layers_of_stage(layers, 1),
        ["net.fc2", "net.act", "net.fc3", "net.loss"]
    );
}

/// Every op of `report` is on the stage the run places it on under `pipeline`, some op is on
/// stage 1, and the plan's memory is its fullest stage's, which is returned.
#[track_caller]
fn assert_staged_as_the_run_places(
    model: &Mlp,
    pipeline: &PipelineConfig,
    report: &PlanReport,
) -> f64 {
    let staged = report.pipeline.as_ref().expect("the stages are planned");
    let placed = node_stages(&model.model.graph, pipeline).expect("the run's stages");
    assert_eq!(
        staged.layers, placed.layers,
        "the plan's layers per stage are those the run's --explain lists"
    );
    for (name, _) in &report.strategies {
        let id = model.model.graph.node_by_name(name).expect("an op");
        assert_eq!(report.stage_of(name), placed.nodes[id.0], "{name}");
    }
    assert!(staged.stage_of_op.values().any(|&s| s == 1));
    let fullest = staged
        .stage_costs
        .iter()
        .map(|c| c.memory.total())
        .fold(0.0, f64::max);
    assert_eq!(report.cost.memory.total(), fullest);
    fullest
}

/// Configured strategies (a mode that does not search) on stages configured by
/// `[parallel.pipeline]` are costed stage by stage, each stage's ops with their strategies on
/// the stage's devices (they were the whole model costed on one stage's devices): the memory
/// is the fullest stage's, about half the whole model's parameters, and a budget it exceeds
/// is reported, not refused.
#[test]
fn configured_strategies_on_configured_stages_are_costed_stage_by_stage() {
    let model = Mlp::wide(8, [16, 16], 256);
    let pipeline = PipelineConfig::new(2, 4, Scheduler::OneFOneB);
    let mut parallel = ParallelConfig::new(ParallelMode::SemiAuto, 4);
    parallel.pipeline = Some(pipeline.clone());
    let whole = ParallelConfig::new(ParallelMode::SemiAuto, 2);
    let configured = || Strategies::Configured(BTreeMap::new());
    let flat = plan(&request(&model, &whole, configured())).expect("a flat plan");
    let report = plan(&request(&model, &parallel, configured())).expect("a staged plan");
    assert_eq!(report.mode, "semi_auto");
    assert_eq!(report.search_ms, 0.0);
    assert_eq!(report.devices, 2);
    let staged = report.pipeline.as_ref().expect("the stages are costed");
    assert_eq!(staged.config, pipeline, "the configured pipeline, as given");
    let fullest = assert_staged_as_the_run_places(&model, &pipeline, &report);
    assert!(
        report.cost.memory.parameters < 0.75 * flat.cost.memory.parameters,
        "a stage holds {} parameter bytes, the whole model {}",
        report.cost.memory.parameters,
        flat.cost.memory.parameters
    );
    // The configured strategies are kept: every op unsplit.
    let unsplit: BTreeMap<String, Vec<Vec<usize>>> = report
        .strategies
        .iter()
        .map(|(n, s)| (n.clone(), s.iter().map(|t| vec![1; t.len()]).collect()))
        .collect();
    let kept = plan(&request(
        &model,
        &parallel,
        Strategies::Configured(unsplit.clone()),
    ))
    .expect("a staged plan");
    assert!(kept.pipeline.is_some());
    assert!(!unsplit.is_empty() && kept.strategies.len() == unsplit.len());
    for (name, s) in &kept.strategies {
        assert_eq!(Some(s), unsplit.get(name), "{name}");
    }
    // A budget the fullest stage exceeds is reported, not refused.
    let mut tight = request(&model, &parallel, configured());
    tight.max_device_memory = Some((fullest / 2.0) as u64);
    let over = plan(&tight).expect("costed whatever its memory");
    assert!(over.cost.memory.total() > over.memory_budget as f64);
    assert!(over.pipeline.is_some());
}

/// A `[parallel.shard]` strategy (kept fixed by the search) that does not fit the devices of
/// its op's pipeline stage is refused by every search naming that stage and where its device
/// count comes from, as the run's compile names it: the search said only "the 4 devices", and
/// the runtime had to run the op's rule again to say which stage they were.
#[test]
fn a_fixed_strategy_wider_than_its_stage_is_refused_naming_the_stage() {
    let model = Mlp::wide(8, [16, 16], 256);
    let pipeline = PipelineConfig::new(2, 4, Scheduler::OneFOneB);
    let graph = &model.model.graph;
    let placed = node_stages(graph, &pipeline).expect("the run's stages");
    for wanted in [0, 1] {
        // A product of the stage, its batch (8) split over all 8 devices.
        let (name, arity) = graph
            .nodes()
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.op, graph::Op::MatMul { .. }))
            .find(|(id, _)| placed.nodes[*id] == wanted)
            .map(|(_, n)| (n.name.clone(), n.inputs.len()))
            .expect("a product on the stage");
        assert_eq!(arity, 2);
        for mode in [
            SearchMode::ShardingPropagation,
            SearchMode::RecursiveProgramming,
            SearchMode::DynamicProgramming,
        ] {
            let mut parallel = ParallelConfig::new(ParallelMode::Auto(mode), 8);
            parallel.pipeline = Some(pipeline.clone());
            parallel.strategies.insert(
                name.clone(),
                parallel::OpStrategy::from_tuples(vec![vec![8, 1], vec![1, 1]], None),
            );
            let err = plan(&request(&model, &parallel, Strategies::Search))
                .expect_err("the strategy needs 8 devices, the stage has 4");
            let expected = format!(
                "it uses 8 devices, which does not divide the 4 devices of pipeline stage \
                 {wanted} (parallel.devices 8 / parallel.pipeline.stages 2)"
            );
            match &err {
                SearchError::Parallel(parallel::ParallelError::InvalidStrategy {
                    op,
                    rule,
                    ..
                }) => {
                    assert_eq!(op, &name, "{mode:?}");
                    assert_eq!(rule, &expected, "{mode:?}");
                }
                other => panic!("{mode:?}: {other}"),
            }
        }
    }
    // Without stages the devices are the run's, said plainly.
    let mut flat = ParallelConfig::new(ParallelMode::Auto(SearchMode::DynamicProgramming), 4);
    flat.strategies.insert(
        "matmul1".to_string(),
        parallel::OpStrategy::from_tuples(vec![vec![8, 1], vec![1, 1]], None),
    );
    let err = plan(&request(&model, &flat, Strategies::Search)).expect_err("8 devices of 4");
    let text = err.to_string();
    assert!(
        text.contains("which does not divide the 4 devices") && !text.contains("pipeline stage"),
        "{text}"
    );
}

/// `auto_pipeline` keeps to the stage counts the run can place: the dataset strategy splits
/// each micro-batch's rows over one stage's devices before anything else, so a batch of 2 rows
/// on 4 devices cannot run as one stage (2 rows over 4 devices) but can as 2 (over 2). The
/// plan found must be one the run places (a guard: on this model the search's own candidates
/// already avoid the one stage; on the GPT under a tight `max_device_memory` the search chose
/// a stage count the batch did not split over, and the run refused it).
#[test]
fn the_automatic_pipeline_keeps_to_stage_counts_the_batch_splits_over() {
    let model = Mlp::wide(2, [16, 16], 256);
    let mut parallel = ParallelConfig::new(ParallelMode::Auto(SearchMode::DynamicProgramming), 4);
    parallel.pipeline = Some(PipelineConfig::new(1, 1, Scheduler::OneFOneB));
    let mut auto = request(&model, &parallel, Strategies::Search);
    auto.auto_pipeline = true;
    let report = plan(&auto).expect("a pipeline of 2 or 4 stages");
    let stages = report.pipeline.as_ref().map_or(1, |p| p.config.stages);
    let per_stage = 4 / stages;
    assert!(
        parallel::check_dataset_strategy(&model.model.graph, &parallel, per_stage).is_ok(),
        "{stages} stage(s) of {per_stage} devices cannot split 2 rows"
    );
}

/// When no stage count of `auto_pipeline` gives a plan within `max_device_memory`, the error
/// names the setting and says why each count tried has none (one stage: no strategy fits; two:
/// a stage's or the cut's memory), not only the first count's failure.
#[test]
fn an_automatic_pipeline_nothing_fits_says_why_for_every_stage_count() {
    let model = Mlp::wide(64, [16, 16], 256);
    let mut parallel = ParallelConfig::new(ParallelMode::Auto(SearchMode::DynamicProgramming), 2);
    parallel.pipeline = Some(PipelineConfig::new(1, 2, Scheduler::OneFOneB));
    let mut auto = request(&model, &parallel, Strategies::Search);
    auto.auto_pipeline = true;
    auto.max_device_memory = Some(1000);
    let err = plan(&auto).expect_err("nothing fits 1,000 bytes");
    let text = err.to_string();
    assert!(
        matches!(&err, SearchError::Config { key, .. } if key == "parallel.auto_pipeline"),
        "{text}"
    );
    assert!(
        text.contains("1 stage(s): no strategy fits in 1000 bytes")
            && text.contains("2 stage(s): "),
        "{text}"
    );
    // With room for a pipeline of two stages, the same search finds one.
    auto.max_device_memory = None;
    plan(&auto).expect("a plan without a budget");
}

/// `plan` refuses a profile whose costs overflow, whether it searches, costs configured
/// strategies or cuts a pipeline: before, it returned a plan of `NaN` ms (compute `inf`).
#[test]
fn a_profile_whose_costs_overflow_gives_an_error_not_a_nan_plan() {
    let model = Mlp::new(8);
    let searched = ParallelConfig::new(ParallelMode::Auto(SearchMode::DynamicProgramming), 4);
    let configured = ParallelConfig::new(ParallelMode::DataParallel, 4);
    for (parallel, strategies, auto_pipeline) in [
        (&searched, Strategies::Search, false),
        (&configured, Strategies::Configured(BTreeMap::new()), false),
        (&searched, Strategies::Search, true),
    ] {
        let mut request = request(&model, parallel, strategies);
        request.auto_pipeline = auto_pipeline;
        request.profile.name = "overflowing".to_string();
        request.profile.matmul[0].flops_per_s = f64::MIN_POSITIVE;
        let err = plan(&request)
            .map(|r| r.step_ms())
            .expect_err("no plan on an infinite cost");
        assert!(
            matches!(err, SearchError::NonFiniteCost { .. })
                && err.to_string().contains("profile overflowing"),
            "{err}"
        );
    }
}

/// `parallel.auto_pipeline` cuts only where the run accepts the `stage_config` it emits (one
/// naming every layer): never between two calls of one cell (`act`, called after `fc1` and
/// again after the heavy `fc2`: the balanced cut between `act` and `fc2` left `act.relu_1`,
/// which reads `fc2`, on stage 0, `CellSplitBetweenStages`) and never leaving a stage before
/// the last without parameters (4 stages put `act` alone on one, `StageWithoutParameters`).
/// Every op runs on the stage the plan costed it on.
#[test]
fn an_automatic_pipeline_cuts_where_the_run_accepts_its_stages() {
    for devices in [2, 4] {
        let model = Mlp::cells(1, [4, 4], 512, true, "");
        let mode = ParallelMode::Auto(SearchMode::DynamicProgramming);
        let mut parallel = ParallelConfig::new(mode, devices);
        parallel.pipeline = Some(PipelineConfig::new(1, 1, Scheduler::OneFOneB));
        let mut auto = request(&model, &parallel, Strategies::Search);
        auto.auto_pipeline = true;
        let report = plan(&auto).expect("a plan");
        let staged = report.pipeline.as_ref().expect("the stages");
        assert_eq!(staged.config.stages, devices, "the batch of 1 is pipelined");
        let placed = node_stages(&model.model.graph, &staged.config)
            .unwrap_or_else(|e| panic!("{devices} devices: the run refuses the stages: {e}"));
        for (name, &stage) in &staged.stage_of_op {
            let id = model.model.graph.node_by_name(name).expect("an op");
            assert_eq!(placed.nodes[id.0], stage, "{devices} devices: {name}");
        }
        assert_eq!(report.stage_of("act.relu"), report.stage_of("act.relu_1"));
    }
}

/// An out_strategy a loaded file gives as split tuples (MindSpore's
/// `parallel_out_strategy_item` without layouts) is kept with its op, in a file without stages
/// and in one with: the report holds it and applies it as the op's out_strategy. It was
/// dropped on every path (`LoadedOp` had no outputs).
#[test]
fn loaded_out_strategy_tuples_are_kept_and_applied() {
    // Without stages: matmul1's partial sums reduce-scattered onto (4, 1).
    let model = Mlp::new(8);
    let parallel = ParallelConfig::new(ParallelMode::Auto(SearchMode::DynamicProgramming), 4);
    let loaded = ops_file(tuples_op(
        "matmul1".to_string(),
        0,
        vec![vec![2, 2], vec![2, 1]],
        Some(vec![vec![4, 1]]),
    ));
    let report =
        plan(&request(&model, &parallel, Strategies::Loaded(loaded))).expect("the file loads");
    assert_eq!(
        report.out_strategies.get("matmul1"),
        Some(&vec![vec![4, 1]])
    );
    let mut applied = parallel.clone();
    report.apply_to(&mut applied).expect("applied");
    let strategy = &applied.strategies["matmul1"];
    assert_eq!(strategy.outputs, Some(vec![vec![4, 1]]));
    assert_eq!(strategy.out_layouts, None);

    // With stages: `net.fc2.matmul` of stage 1 given its output's split.
    let model = Mlp::nested(8, [16, 16], 256);
    let parallel = stages_below_net();
    let mut file = saved_file(&planned_with_stages_below_net(&model));
    let op = file
        .ops
        .iter_mut()
        .find(|op| op.name == "net.fc2.matmul")
        .expect("the op has an entry");
    assert_eq!(op.stage, 1, "the op is on the second stage");
    let outs = vec![vec![op.inputs[0][0], op.inputs[1][1]]];
    op.outputs = Some(outs.clone());
    let report =
        plan(&request(&model, &parallel, Strategies::Loaded(file))).expect("the file loads");
    assert!(report.pipeline.is_some(), "planned stage by stage");
    assert_eq!(report.out_strategies.get("net.fc2.matmul"), Some(&outs));
    let mut applied = parallel.clone();
    report.apply_to(&mut applied).expect("applied");
    assert_eq!(applied.strategies["net.fc2.matmul"].outputs, Some(outs));
}
