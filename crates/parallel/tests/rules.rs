//! MindSpore's sharding rules: the device matrices and layouts strategies give, and the errors
//! invalid strategies get.

use graph::models::seed_mlp;
use graph::{GraphBuilder, NodeRole};
use parallel::{place, ParallelConfig, ParallelError, ParallelMode, StrategySource};
use tensor::DType;

pub(crate) fn seed_training(batch: usize, hidden: usize) -> graph::TrainingGraph {
    let model = seed_mlp(batch, &[8, 8], hidden, 10).unwrap();
    graph::grad(
        &model.graph,
        model.loss,
        &model.graph.trainable_parameters(),
    )
    .unwrap()
}

fn seed_config() -> ParallelConfig {
    ParallelConfig::new(ParallelMode::SemiAuto, 8)
        .shard("matmul1", &[&[2, 4], &[4, 1]])
        .shard("relu1", &[&[4, 1]])
        .shard("matmul2", &[&[1, 8], &[8, 1]])
        .shard("relu2", &[&[8, 1]])
}

#[test]
fn matmul_device_matrix_and_maps_follow_mindspore() {
    // SEMANTICS §2.2: ((2,4),(4,1)) on 8 devices: dev [2,4,1] -> normalised [2,4];
    // A map [1,0], B map [0,-1], output [1,-1] with a pending sum over the k axis.
    let training = seed_training(32, 512);
    let placed = place(&training.graph, &seed_config()).unwrap();
    let id = training.graph.node_by_name("matmul1").unwrap();
    let p = &placed.nodes[id.0];
    assert_eq!(p.source, StrategySource::User);
    assert_eq!(p.mesh().device_matrix(), vec![2, 4]);
    assert_eq!(p.inputs[0].layout().ms_flat_tensor_map(), Some(vec![1, 0]));
    assert_eq!(p.inputs[1].layout().ms_flat_tensor_map(), Some(vec![0, -1]));
    assert_eq!(
        p.outputs[0].layout().layout().ms_flat_tensor_map(),
        Some(vec![1, -1])
    );
    assert_eq!(p.outputs[0].partial_axes(), &[1]);
    // The parameter takes its consumer's layout: fc1_weight split 4 ways on dim 0, 2 copies.
    let w1 = training.graph.value_by_name("fc1_weight").unwrap();
    let l = placed.leaves[w1.0].as_ref().unwrap();
    assert_eq!(l.slice_shape(), &[16, 512]);
    assert_eq!(l.replica_groups()[0], vec![0, 4]);
}

#[test]
fn repeated_calculation_axis_goes_on_the_right() {
    // ((2,1),(1,1)) on 8 devices: dev [2,1,1,4] -> [2,4]; A [1,-1], B replicated.
    let training = seed_training(32, 64);
    let config =
        ParallelConfig::new(ParallelMode::SemiAuto, 8).shard("matmul1", &[&[2, 1], &[1, 1]]);
    let placed = place(&training.graph, &config).unwrap();
    let p = &placed.nodes[training.graph.node_by_name("matmul1").unwrap().0];
    assert_eq!(p.mesh().device_matrix(), vec![2, 4]);
    assert_eq!(p.inputs[0].layout().ms_flat_tensor_map(), Some(vec![1, -1]));
    assert_eq!(p.inputs[0].replica_groups()[0], vec![0, 1, 2, 3]);
    assert_eq!(p.inputs[1].replica_count(), 8);
}

#[test]
fn backward_nodes_run_on_their_forward_op_device_matrix() {
    let training = seed_training(32, 512);
    let placed = place(&training.graph, &seed_config()).unwrap();
    let forward = training.graph.node_by_name("matmul1").unwrap();
    let mut n_backward = 0;
    for (node, p) in training.graph.nodes().iter().zip(&placed.nodes) {
        if let NodeRole::Backward(g) = &node.role {
            if g.forward == forward {
                n_backward += 1;
                assert_eq!(p.source, StrategySource::Backward(forward));
                assert_eq!(p.mesh(), placed.nodes[forward.0].mesh());
            }
        }
    }
    assert!(n_backward >= 1);
}

fn expect_invalid(config: ParallelConfig, needle: &str) {
    let training = seed_training(32, 512);
    let err = place(&training.graph, &config).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(needle), "{text:?} should contain {needle:?}");
}

#[test]
fn invalid_strategies_name_the_op_and_the_rule() {
    expect_invalid(
        ParallelConfig::new(ParallelMode::SemiAuto, 8).shard("matmul1", &[&[2, 4], &[2, 1]]),
        "matmul1 (MatMul): strategy ((2, 4), (2, 1)): the split of the first input's reduction dim (4) must equal the second's (2)",
    );
    expect_invalid(
        ParallelConfig::new(ParallelMode::SemiAuto, 8).shard("matmul1", &[&[3, 1], &[1, 1]]),
        "dim 0 of input 0 has size 32, which 3 does not divide",
    );
    expect_invalid(
        ParallelConfig::new(ParallelMode::SemiAuto, 8).shard("matmul1", &[&[2, 2], &[2, 3]]),
        "dim 1 of input 1 has size 512, which 3 does not divide",
    );
    expect_invalid(
        ParallelConfig {
            dataset_strategy: parallel::DatasetStrategy::FullBatch,
            ..ParallelConfig::new(ParallelMode::SemiAuto, 6).shard("matmul1", &[&[4, 1], &[1, 1]])
        },
        "it uses 4 devices, which does not divide the 6 devices",
    );
    expect_invalid(
        ParallelConfig::new(ParallelMode::SemiAuto, 8).shard("relu1", &[&[4, 1, 1]]),
        "input 0 has 2 dims",
    );
    expect_invalid(
        ParallelConfig::new(ParallelMode::SemiAuto, 8).shard("matmul9", &[&[1, 1], &[1, 1]]),
        "a strategy is set for op \"matmul9\", but the graph has no op of that name",
    );
    expect_invalid(
        ParallelConfig::new(ParallelMode::SemiAuto, 8).shard_with_out(
            "matmul1",
            &[&[2, 4], &[4, 1]],
            &[&[4, 1]],
        ),
        "dim 0 of output 0 can only be split [2, 8] ways",
    );
}

#[test]
fn softmax_axis_and_cross_entropy_classes_cannot_be_split() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[8, 4], DType::F32).unwrap();
    b.softmax("softmax", x).unwrap();
    let g = b.finish();
    let config = ParallelConfig::new(ParallelMode::SemiAuto, 4).shard("softmax", &[&[1, 4]]);
    let err = place(&g, &config).unwrap_err();
    assert!(matches!(err, ParallelError::InvalidStrategy { .. }));
    assert!(err
        .to_string()
        .contains("the last dim (the softmax axis) cannot be split"));

    let config = ParallelConfig::new(ParallelMode::SemiAuto, 8).shard("loss", &[&[4, 2], &[4]]);
    let training = seed_training(32, 64);
    let err = place(&training.graph, &config).unwrap_err();
    assert!(err
        .to_string()
        .contains("the class dim of the logits cannot be split"));
}

#[test]
fn dataset_strategy_must_divide_the_batch() {
    let training = seed_training(30, 64);
    let err = place(
        &training.graph,
        &ParallelConfig::new(ParallelMode::DataParallel, 8),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("30 is not divisible by 8"),
        "{err}"
    );
}

#[test]
fn stand_alone_ignores_strategies() {
    let training = seed_training(32, 64);
    let mut config = seed_config();
    config.mode = ParallelMode::StandAlone;
    let placed = place(&training.graph, &config).unwrap();
    assert!(placed.nodes.iter().all(|p| p.mesh().n_devices() == 1));
}

#[test]
fn rank_views_account_for_every_byte_of_every_reshard() {
    let model = seed_mlp(32, &[8, 8], 512, 10).unwrap();
    let program = parallel::compile_training(&model.graph, model.loss, &seed_config()).unwrap();
    let views: Vec<parallel::RankProgram> = (0..8).map(|r| program.for_rank(r)).collect();
    let reshards: Vec<&parallel::ReshardStep> = program
        .steps
        .iter()
        .filter_map(|s| match s {
            parallel::Step::Reshard(r) => Some(r),
            parallel::Step::Kernel(_) => None,
        })
        .collect();
    let mut k = 0;
    for (i, step) in program.steps.iter().enumerate() {
        let parallel::Step::Reshard(r) = step else {
            continue;
        };
        let (mut sent, mut received) = (0, 0);
        for view in &views {
            if let parallel::RankStep::Reshard {
                sends, receives, ..
            } = &view.steps[i]
            {
                sent += sends.iter().map(|(_, b)| b).sum::<usize>();
                received += receives.iter().map(|(_, b)| b).sum::<usize>();
            } else {
                panic!("step {i} is a reshard in the program but not in a rank's view");
            }
        }
        assert_eq!(sent, received);
        let transfer_bytes: usize = r
            .plan
            .transfers()
            .filter(|t| !t.is_local())
            .map(|t| r.plan.transfer_bytes(&t))
            .sum();
        assert_eq!(received, transfer_bytes);
        k += 1;
    }
    assert_eq!(k, reshards.len());
    assert!(views[3]
        .to_string()
        .contains("reshard matmul2: reduce-scatter along dim 0"));
}

#[test]
fn reshape_strategies_keep_outermost_splits_and_name_refused_dims() {
    let semi = |devices: usize, s: &[&[usize]]| ParallelConfig {
        dataset_strategy: parallel::DatasetStrategy::FullBatch,
        ..ParallelConfig::new(ParallelMode::SemiAuto, devices).shard("reshape", s)
    };
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[4, 6, 12], DType::F32).unwrap();
    b.reshape("reshape", x, &[4, 6, 3, 4]).unwrap();
    let g = b.finish();
    // Dim 2 (H·D = 12) split 3 ways becomes the head dim (3) split 3 ways.
    let config = semi(6, &[&[2, 1, 3]]);
    let placed = place(&g, &config).unwrap();
    let p = &placed.nodes[g.node_by_name("reshape").unwrap().0];
    assert_eq!(p.outputs[0].layout().slice_shape(), &[2, 6, 1, 4]);
    // The lowered kernel reshapes this rank's block to its local shape.
    let x = g.value_by_name("reshape").unwrap();
    let program = parallel::compile_forward(&g, &[x], &semi(6, &[&[2, 1, 3]])).unwrap();
    let local: Vec<_> = program
        .steps
        .iter()
        .filter_map(|s| match s {
            parallel::Step::Kernel(k) => Some(k.op.clone()),
            parallel::Step::Reshard(_) => None,
        })
        .collect();
    assert_eq!(
        local,
        vec![graph::Op::Reshape {
            shape: vec![2, 6, 1, 4]
        }]
    );
    // Splitting 12 six ways does not divide the 3 heads.
    let config = semi(6, &[&[1, 1, 6]]);
    let err = place(&g, &config).unwrap_err().to_string();
    assert!(
        err.contains(
            "dim 2 of the input is split 6 ways, which does not divide output dim 2 (size 3)"
        ),
        "{err}"
    );
    // A merge keeps only the outer dim's split.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[4, 6], DType::F32).unwrap();
    b.reshape("reshape", x, &[24]).unwrap();
    let g = b.finish();
    let config = semi(2, &[&[1, 2]]);
    let err = place(&g, &config).unwrap_err().to_string();
    assert!(
        err.contains("dim 1 of the input is split 2 ways, but only the outermost dim"),
        "{err}"
    );
}

#[test]
fn reduce_max_leaves_a_pending_max_and_one_hot_splits_its_classes() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[4, 6], DType::F32).unwrap();
    let labels = b.input("labels", &[4], DType::I32).unwrap();
    b.reduce_max("max", x, &[1], true).unwrap();
    b.one_hot("hot", labels, 6).unwrap();
    let g = b.finish();
    let semi = |hot: &[usize]| ParallelConfig {
        dataset_strategy: parallel::DatasetStrategy::FullBatch,
        ..ParallelConfig::new(ParallelMode::SemiAuto, 4)
            .shard("max", &[&[2, 2]])
            .shard("hot", &[hot])
    };
    let placed = place(&g, &semi(&[2, 2])).unwrap();
    let max = &placed.nodes[g.node_by_name("max").unwrap().0].outputs[0];
    assert_eq!(max.pending_op(), reshard::PendingOp::Max);
    assert_eq!(max.partial_axes(), &[1]);
    assert_eq!(max.layout().slice_shape(), &[2, 1]);
    let hot = &placed.nodes[g.node_by_name("hot").unwrap().0];
    assert_eq!(hot.inputs[0].slice_shape(), &[2]);
    assert_eq!(hot.outputs[0].layout().slice_shape(), &[2, 3]);
    assert!(!hot.outputs[0].is_partial());
    let err = place(&g, &semi(&[2])).unwrap_err().to_string();
    assert!(
        err.contains("output 0 has 2 dims ([4, 6]) but its strategy has 1 entries"),
        "{err}"
    );
    let err = place(&g, &semi(&[1, 4])).unwrap_err().to_string();
    assert!(
        err.contains("dim 1 of output 0 has size 6, which 4 does not divide"),
        "{err}"
    );
}

#[test]
fn summary_is_the_explain_output_as_data() {
    let model = seed_mlp(32, &[8, 8], 512, 10).unwrap();
    let program = parallel::compile_training(&model.graph, model.loss, &seed_config()).unwrap();
    let summary = program.summary();
    let explain = program.explain();
    assert!(explain.starts_with(&format!(
        "mode {} on {} device(s); {} steps, {} reshards, {} bytes moved per training step",
        summary.mode,
        summary.devices,
        summary.steps.len(),
        summary.reshards,
        summary.bytes_per_step
    )));
    assert_eq!(summary.mode, "semi_auto");
    assert_eq!(summary.devices, 8);
    assert_eq!(summary.steps.len(), program.steps.len());
    assert!(summary.reshards > 0);
    let reshards = summary
        .steps
        .iter()
        .filter(|s| matches!(s, parallel::StepSummary::Reshard { .. }))
        .count();
    assert_eq!(reshards, summary.reshards);
    assert_eq!(summary.params.len(), program.params.len());
    for p in &summary.params {
        // Every parameter's line of the explain text carries the same name, shape, map and mesh.
        let line = format!(
            "{:<20} {:?} as {} over {}",
            p.name, p.shape, p.layout, p.mesh
        );
        assert!(explain.contains(&line), "{line}");
        // Its distinct slices, each held `replicas` times, fill the devices.
        let (whole, slice) = (
            p.shape.iter().product::<usize>(),
            p.slice_shape.iter().product::<usize>(),
        );
        assert_eq!(whole % slice, 0, "{}", p.name);
        assert_eq!(whole / slice * p.replicas, summary.devices, "{}", p.name);
    }
    for s in &summary.steps {
        if let parallel::StepSummary::Reshard {
            value,
            communication,
            bytes,
            reason,
        } = s
        {
            let line = format!("-> reshard {value}: {communication} ({bytes} B/step): {reason}");
            assert!(explain.contains(&line), "{line}");
        }
    }
}
