//! `stage_config` keys naming cells below a layer of `layer_of`: a loss cell of one's own
//! (`NetWithLoss` holding `self.net` and `self.loss`) whose network is split into stages, as
//! MindSpore assigns stages per cell at any depth.

use graph::{Graph, GraphBuilder, Initializer};
use parallel::pipeline::{
    layers_of_stage, node_stages, stage_of_ranks, NodeStages, PipelineConfig, PipelineError,
    Scheduler,
};
use parallel::{compile_training, ParallelConfig, ParallelMode};
use tensor::DType;

/// `net.fc1` (matmul, gelu) → `net.act` (a shared activation cell) → `net.fc2` (matmul) →
/// `net.act` again when `act_twice` → `loss`, as a loss cell of one's own traces it.
fn loss_cell(act_twice: bool) -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[4, 8], DType::F32).unwrap();
    let w1 = b
        .parameter("net.fc1.weight", &[8, 8], Initializer::normal(1.0))
        .unwrap();
    let h = b.matmul("net.fc1.matmul", x, w1).unwrap();
    let h = b.gelu("net.act.gelu", h, true).unwrap();
    let w2 = b
        .parameter("net.fc2.weight", &[8, 8], Initializer::normal(1.0))
        .unwrap();
    let mut h = b.matmul("net.fc2.matmul", h, w2).unwrap();
    if act_twice {
        h = b.gelu("net.act.gelu_1", h, true).unwrap();
    }
    b.gelu("loss.gelu", h, true).unwrap();
    b.finish()
}

fn staged(stages: usize, keys: &[(&str, usize)]) -> PipelineConfig {
    keys.iter().fold(
        PipelineConfig::new(stages, 2, Scheduler::GPipe),
        |c, (k, s)| c.with_stage(*k, *s),
    )
}

/// [`NodeStages::layers`] with borrowed names.
fn layers(placed: &NodeStages) -> Vec<(&str, usize)> {
    placed
        .layers
        .iter()
        .map(|(n, s)| (n.as_str(), *s))
        .collect()
}

/// Every node's stage, by name.
fn stage_by_node(graph: &Graph, config: &PipelineConfig) -> Vec<(String, usize)> {
    let placed = node_stages(graph, config).unwrap();
    graph
        .nodes()
        .iter()
        .zip(&placed.nodes)
        .filter(|(n, _)| n.role == graph::NodeRole::Forward)
        .map(|(n, s)| (n.name.clone(), *s))
        .collect()
}

#[test]
fn keys_naming_cells_inside_a_loss_cells_network_split_it_into_stages() {
    let g = loss_cell(false);
    let config = staged(2, &[("net.fc1", 0), ("net.fc2", 1)]);
    let placed = node_stages(&g, &config).unwrap();
    // net.act inherits fc1's stage, loss fc2's.
    assert_eq!(
        layers(&placed),
        vec![("net.fc1", 0), ("net.act", 0), ("net.fc2", 1), ("loss", 1)]
    );
    assert_eq!(
        stage_by_node(&g, &config),
        [
            ("net.fc1.matmul", 0),
            ("net.act.gelu", 0),
            ("net.fc2.matmul", 1),
            ("loss.gelu", 1)
        ]
        .map(|(n, s)| (n.to_string(), s))
    );
    // The backward of every node and the gradient of every parameter follow their stage.
    let w2 = g.value_by_name("net.fc2.weight").unwrap();
    assert_eq!(placed.values[w2.0], 1);
    // A key above the cut and one below it: the longest wins, the rest of `net` takes `net`'s.
    let config = staged(2, &[("net", 0), ("net.fc2", 1)]);
    assert_eq!(
        node_stages(&g, &config)
            .unwrap()
            .layers
            .iter()
            .map(|(_, s)| *s)
            .collect::<Vec<_>>(),
        vec![0, 0, 1, 1]
    );
    // Automatic cuts and keys naming whole layers are unchanged: `net` stays one layer.
    let auto = node_stages(&g, &PipelineConfig::new(2, 2, Scheduler::GPipe)).unwrap();
    assert_eq!(
        auto.layers,
        vec![("net".to_string(), 0), ("loss".to_string(), 1)]
    );
    let whole = node_stages(&g, &staged(2, &[("net", 0), ("loss", 1)])).unwrap();
    assert_eq!(
        whole.layers,
        vec![("net".to_string(), 0), ("loss".to_string(), 1)]
    );
}

#[test]
fn a_cell_called_again_after_a_later_stages_cell_runs_on_the_later_stage() {
    let g = loss_cell(true);
    // The shared cell takes fc1's stage, but its second call reads fc2's output: raised to
    // fc2's stage (MindSpore's colouring), not run on stage 0 with data flowing back, which
    // deadlocked 1F1B.
    let config = staged(2, &[("net.fc1", 0), ("net.fc2", 1)]);
    assert_eq!(
        stage_by_node(&g, &config),
        [
            ("net.fc1.matmul", 0),
            ("net.act.gelu", 0),
            ("net.fc2.matmul", 1),
            ("net.act.gelu_1", 1),
            ("loss.gelu", 1)
        ]
        .map(|(n, s)| (n.to_string(), s))
    );
    // The per-stage listing (`--explain`'s) says what each stage runs: the shared cell under
    // stage 0 for its first call and under stage 1 for its raised second call.
    let placed = node_stages(&g, &config).unwrap();
    assert_eq!(
        layers(&placed),
        vec![
            ("net.fc1", 0),
            ("net.act", 0),
            ("net.fc2", 1),
            ("net.act", 1),
            ("loss", 1)
        ]
    );
    assert_eq!(layers_of_stage(&placed.layers, 0), ["net.fc1", "net.act"]);
    assert_eq!(
        layers_of_stage(&placed.layers, 1),
        ["net.fc2", "net.act", "loss"]
    );
    // The same without stage_config (the cut by parameter counts, `net` one layer) and with
    // keys naming whole layers: every op after a later stage's op runs on that stage.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[4, 8], DType::F32).unwrap();
    let w1 = b
        .parameter("fc1.weight", &[8, 8], Initializer::normal(1.0))
        .unwrap();
    let h = b.matmul("fc1.matmul", x, w1).unwrap();
    let h = b.gelu("act.gelu", h, true).unwrap();
    let w2 = b
        .parameter("fc2.weight", &[8, 8], Initializer::normal(1.0))
        .unwrap();
    let h = b.matmul("fc2.matmul", h, w2).unwrap();
    let h = b.gelu("act.gelu_1", h, true).unwrap();
    b.gelu("loss.gelu", h, true).unwrap();
    let top = b.finish();
    for config in [
        PipelineConfig::new(2, 2, Scheduler::OneFOneB),
        staged(2, &[("fc1", 0), ("fc2", 1)]),
    ] {
        assert_eq!(
            stage_by_node(&top, &config),
            [
                ("fc1.matmul", 0),
                ("act.gelu", 0),
                ("fc2.matmul", 1),
                ("act.gelu_1", 1),
                ("loss.gelu", 1)
            ]
            .map(|(n, s)| (n.to_string(), s)),
            "{config:?}"
        );
        assert_eq!(
            layers(&node_stages(&top, &config).unwrap()),
            [("fc1", 0), ("act", 0), ("fc2", 1), ("act", 1), ("loss", 1)],
            "{config:?}"
        );
    }
    // A key giving the shared cell the earlier stage is refused, naming the op and its input.
    let error = node_stages(
        &g,
        &staged(2, &[("net.fc1", 0), ("net.act", 0), ("net.fc2", 1)]),
    )
    .unwrap_err();
    assert_eq!(
        error,
        PipelineError::CellSplitBetweenStages {
            node: "net.act.gelu_1".to_string(),
            cell: "net.act".to_string(),
            stage: 0,
            input: "net.fc2.matmul".to_string(),
            input_stage: 1,
        }
    );
    assert!(
        error.to_string().starts_with(
            "parallel.pipeline.stage_config: op \"net.act.gelu_1\" of cell \"net.act\" is \
             given stage 0, but it reads the output of op \"net.fc2.matmul\" on stage 1"
        ),
        "{error}"
    );
    // Given fc2's stage by its own key, both calls of the shared cell follow fc1 (stage 0).
    let placed = node_stages(&g, &staged(2, &[("net.fc1", 0), ("net.act", 1)])).unwrap();
    assert_eq!(
        placed.layers,
        vec![
            ("net.fc1".to_string(), 0),
            ("net.act".to_string(), 1),
            ("net.fc2".to_string(), 1),
            ("loss".to_string(), 1)
        ]
    );
    // Keys in decreasing order, overlapping or not, are refused naming the cell.
    let error = node_stages(&g, &staged(2, &[("net.fc1", 1), ("net.fc2", 0)])).unwrap_err();
    assert!(
        matches!(&error, PipelineError::StageOrderDecreasing { cell, .. } if cell == "net.fc2"),
        "{error}"
    );
    let error = node_stages(&g, &staged(2, &[("net", 1), ("net.fc2", 0)])).unwrap_err();
    assert!(
        matches!(&error, PipelineError::StageOrderDecreasing { cell, .. } if cell == "net.fc2"),
        "{error}"
    );
}

#[test]
fn hostile_keys_below_a_layer_are_refused_naming_the_key_and_the_cells() {
    let g = loss_cell(false);
    for typo in [
        "net.fc3",
        "net.fc1.matmul.x",
        "net.",
        "net..fc1",
        "nett.fc1",
        "net.fc",
    ] {
        let error = node_stages(&g, &staged(2, &[("net.fc1", 0), (typo, 1)])).unwrap_err();
        match &error {
            PipelineError::StageConfigMatchesNoLayer { prefix, layers } => {
                assert_eq!(prefix, typo);
                assert!(layers.contains("net.fc1"), "{error}");
            }
            other => panic!("{typo}: {other}"),
        }
        assert!(error.to_string().contains(&format!("{typo:?}")), "{error}");
    }
    // A key naming a cell with ops on a stage that leaves another stage empty.
    let error = node_stages(&g, &staged(3, &[("net.fc1", 0), ("net.fc2", 2)])).unwrap_err();
    assert_eq!(
        error,
        PipelineError::EmptyStage {
            stage: 1,
            keys: Vec::new()
        }
    );
    // A key for a stage that does not exist.
    let error = node_stages(&g, &staged(2, &[("net.fc1", 0), ("net.fc2", 5)])).unwrap_err();
    assert!(
        matches!(error, PipelineError::StageConfigOutOfRange { stage: 5, .. }),
        "{error}"
    );
    // A stage holding only a parameter-less cell before one with parameters.
    let error = node_stages(
        &g,
        &staged(3, &[("net.fc1", 0), ("net.act", 1), ("net.fc2", 2)]),
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("stage 1 holds no trainable parameter (its cells: net.act)"),
        "{error}"
    );
}

/// A cell holding a parameter (`net.shift`, adding `net.shift.bias`) called after `net.fc1` on
/// stage 0 and again after `net.fc2` on stage 1: its second call runs on stage 1, so
/// `--explain` lists the cell under both stages, and the parameter it reads there is held by
/// stage 1 as a shared parameter's copy (`net.shift.bias@stage1`), as a tied embedding's is.
/// The per-stage listing and the parameters' stages agree with where the ops run.
#[test]
fn explain_lists_a_raised_call_under_the_stage_that_runs_it() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[4, 8], DType::F32).unwrap();
    let w1 = b
        .parameter("net.fc1.weight", &[8, 8], Initializer::normal(1.0))
        .unwrap();
    let bias = b
        .parameter("net.shift.bias", &[8], Initializer::normal(1.0))
        .unwrap();
    let w2 = b
        .parameter("net.fc2.weight", &[8, 8], Initializer::normal(1.0))
        .unwrap();
    let h = b.matmul("net.fc1.matmul", x, w1).unwrap();
    let h = b.add("net.shift.add", h, bias).unwrap();
    let h = b.matmul("net.fc2.matmul", h, w2).unwrap();
    let h = b.add("net.shift.add_1", h, bias).unwrap();
    let loss = b.reduce_sum("loss.sum", h, &[], false).unwrap();
    let g = b.finish();
    let pipeline = staged(2, &[("net.fc1", 0), ("net.fc2", 1)]);
    assert_eq!(
        layers(&node_stages(&g, &pipeline).unwrap()),
        [
            ("net.fc1", 0),
            ("net.shift", 0),
            ("net.fc2", 1),
            ("net.shift", 1),
            ("loss", 1)
        ]
    );

    let mut config = ParallelConfig::new(ParallelMode::DataParallel, 4);
    config.pipeline = Some(pipeline);
    let program = compile_training(&g, loss, &config).unwrap();
    let explain = program.explain();
    assert!(
        explain.contains("\n  stage 0: ranks 0..2: net.fc1, net.shift\n"),
        "{explain}"
    );
    assert!(
        explain.contains("\n  stage 1: ranks 2..4: net.fc2, net.shift, loss\n"),
        "{explain}"
    );
    // Every parameter is held where the ops reading it run: the owner on stage 0, the copy
    // the raised call reads on stage 1; the other parameters are not copied.
    let stage_of_param: Vec<(&str, usize)> = program
        .params
        .iter()
        .map(|p| (p.name.as_str(), stage_of_ranks(p.layout.mesh())))
        .collect();
    assert_eq!(
        stage_of_param,
        [
            ("net.fc1.weight", 0),
            ("net.shift.bias", 0),
            ("net.fc2.weight", 1),
            ("net.shift.bias@stage1", 1)
        ]
    );
    let placed = &program.placed;
    let raised = placed.graph.node_by_name("net.shift.add_1").unwrap();
    let read = placed.graph.nodes()[raised.0].inputs[1];
    assert_eq!(placed.graph.values()[read.0].name, "net.shift.bias@stage1");
}
