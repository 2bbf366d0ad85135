//! The crate's entry, `plan`, without a runtime: a model given as a `PlanModel`, its strategies
//! searched, loaded or configured, and the plan applied to the parallel configuration.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use graph::models::{seed_mlp, Model};
use graph::Graph;
use parallel::{ParallelConfig, ParallelMode};
use search::{
    plan, profiles, Hints, LoadedLayouts, LoadedOp, LoadedStrategies, PlanModel, PlanRequest,
    SearchError, SearchMode, Strategies,
};

/// The seed MLP of a batch of `batch`, rebuilt for any other batch.
struct Mlp {
    batch: usize,
    model: Model,
}

impl Mlp {
    fn new(batch: usize) -> Mlp {
        Mlp {
            batch,
            model: seed_mlp(batch, &[4, 4], 8, 4).expect("the seed MLP"),
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
        Ok(Box::new(Mlp::new(batch_size)))
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

#[test]
fn a_loaded_strategy_for_an_op_the_model_lacks_names_the_file_and_the_op() {
    let model = Mlp::new(8);
    let parallel = ParallelConfig::new(ParallelMode::Auto(SearchMode::DynamicProgramming), 4);
    let loaded = LoadedStrategies {
        file: PathBuf::from("ops.json"),
        ops: vec![LoadedOp {
            name: "no_such_op".to_string(),
            stage: 0,
            inputs: vec![vec![4, 1]],
            layouts: LoadedLayouts {
                inputs: None,
                outputs: None,
            },
        }],
    };
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
