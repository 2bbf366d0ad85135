//! Strategies given as layouts (MindSpore's `Layout(device_matrix, alias_name)` applied per
//! input): the same placement as the equivalent strategy tuples, multi-axis dims, and the
//! errors bad layouts get.

use layout::{DimSpec, Layout, SliceBox, TensorLayout};
use parallel::{place, DatasetStrategy, ParallelConfig, ParallelMode, PlacedGraph};
use reshard::DistLayout;

fn seed_training() -> graph::TrainingGraph {
    crate::rules::seed_training(32, 64)
}

/// MindSpore's `Layout((2, 2, 2), ("dp", "sp", "mp"))`.
fn base() -> Layout {
    Layout::new(&[2, 2, 2], &["dp", "sp", "mp"], None).unwrap()
}

/// `base()(entries…)`, entries as `"dp"`, `"None"` or `"dp+sp"` for a multi-axis dim.
fn lay(entries: &[&str]) -> Layout {
    let specs: Vec<DimSpec> = entries.iter().map(|e| DimSpec::parse(e)).collect();
    base().apply(&specs).unwrap()
}

/// Every rank's box.
fn boxes(t: &TensorLayout) -> Vec<SliceBox> {
    (0..t.mesh().n_devices())
        .map(|r| t.rank_box(r).unwrap())
        .collect()
}

/// Every rank's box and the groups of ranks holding parts of one pending sum.
fn dist_boxes(d: &DistLayout) -> (Vec<SliceBox>, Vec<Vec<usize>>) {
    (boxes(d.layout()), d.partial_slot_groups())
}

/// Asserts that every node and leaf of `a` and `b` hold the same boxes on every rank.
fn assert_same_placement(a: &PlacedGraph, b: &PlacedGraph) {
    for (node, (pa, pb)) in a.graph.nodes().iter().zip(a.nodes.iter().zip(&b.nodes)) {
        for (i, (x, y)) in pa.inputs.iter().zip(&pb.inputs).enumerate() {
            assert_eq!(boxes(x), boxes(y), "{} input {i}", node.name);
        }
        for (j, (x, y)) in pa.outputs.iter().zip(&pb.outputs).enumerate() {
            assert_eq!(dist_boxes(x), dist_boxes(y), "{} output {j}", node.name);
        }
        for j in 0..pa.outputs.len() {
            assert_eq!(
                dist_boxes(&pa.delivered(j)),
                dist_boxes(&pb.delivered(j)),
                "{} delivered {j}",
                node.name
            );
        }
        assert_eq!(pa.strategy, pb.strategy, "{}", node.name);
    }
    for (v, (x, y)) in a.leaves.iter().zip(&b.leaves).enumerate() {
        match (x, y) {
            (Some(x), Some(y)) => assert_eq!(boxes(x), boxes(y), "leaf {v}"),
            _ => assert_eq!(x.is_none(), y.is_none(), "leaf {v}"),
        }
    }
}

#[test]
fn layouts_place_as_the_equivalent_strategy_tuples() {
    let training = seed_training();
    // ((2, 2), (2, 1)) on 8 devices is dev [2, 2] plus a repeat axis on the right: the mesh
    // (dp, sp, mp) with mp unused.
    let tuples = ParallelConfig::new(ParallelMode::SemiAuto, 8)
        .shard("matmul1", &[&[2, 2], &[2, 1]])
        .shard("matmul2", &[&[2, 1], &[1, 4]]);
    let layouts = ParallelConfig::new(ParallelMode::SemiAuto, 8)
        .shard_layouts(
            "matmul1",
            vec![lay(&["dp", "sp"]), lay(&["sp", "None"])],
            None,
        )
        .shard_layouts(
            "matmul2",
            vec![lay(&["dp", "None"]), lay(&["None", "sp+mp"])],
            None,
        );
    let a = place(&training.graph, &tuples).unwrap();
    let b = place(&training.graph, &layouts).unwrap();
    assert_same_placement(&a, &b);
    // With an out_strategy: the reduce-scatter of ((2, 2), (2, 1)) onto (4, 1).
    let tuples = ParallelConfig::new(ParallelMode::SemiAuto, 8).shard_with_out(
        "matmul1",
        &[&[2, 2], &[2, 1]],
        &[&[4, 1]],
    );
    let layouts = ParallelConfig::new(ParallelMode::SemiAuto, 8).shard_layouts(
        "matmul1",
        vec![lay(&["dp", "sp"]), lay(&["sp", "None"])],
        Some(vec![lay(&["dp+sp", "None"])]),
    );
    let a = place(&training.graph, &tuples).unwrap();
    let b = place(&training.graph, &layouts).unwrap();
    assert_same_placement(&a, &b);
}

#[test]
fn a_multi_axis_batch_dim_places_outer_axis_first() {
    let training = seed_training();
    let config = ParallelConfig::new(ParallelMode::SemiAuto, 8).shard_layouts(
        "matmul1",
        vec![lay(&["dp+sp", "None"]), lay(&["None", "mp"])],
        None,
    );
    let placed = place(&training.graph, &config).unwrap();
    let p = &placed.nodes[training.graph.node_by_name("matmul1").unwrap().0];
    assert_eq!(p.strategy, Some(vec![vec![4, 1], vec![1, 2]]));
    assert_eq!(p.mesh().device_matrix(), vec![2, 2, 2]);
    // Rank r = 4·dp + 2·sp + mp holds rows block 2·dp + sp (of 8 rows) and, of the output,
    // columns block mp (of 32 columns); nothing is pending.
    let out = &p.outputs[0];
    assert!(!out.is_partial());
    for r in 0..8 {
        let (dp, sp, mp) = (r / 4, (r / 2) % 2, r % 2);
        let x = p.inputs[0].rank_box(r).unwrap();
        assert_eq!(x, SliceBox::new(vec![(2 * dp + sp) * 8, 0], vec![8, 64]));
        let y = out.layout().rank_box(r).unwrap();
        assert_eq!(
            y,
            SliceBox::new(vec![(2 * dp + sp) * 8, mp * 32], vec![8, 32])
        );
    }
    // The weight takes its consumer's layout: columns over mp, replicated over dp and sp.
    let w = training.graph.value_by_name("fc1_weight").unwrap();
    let w = placed.leaves[w.0].as_ref().unwrap();
    assert_eq!(w.slice_shape(), &[64, 32]);
    assert_eq!(w.replica_groups()[0], vec![0, 2, 4, 6]);
}

#[test]
fn dataset_layouts_split_the_inputs() {
    let training = seed_training();
    let mut config = ParallelConfig::new(ParallelMode::SemiAuto, 8);
    config.dataset_strategy =
        DatasetStrategy::Layouts(vec![lay(&["dp+sp", "None", "None"]), lay(&["dp+sp"])]);
    let placed = place(&training.graph, &config).unwrap();
    let images = placed.leaves[training.graph.inputs()[0].0]
        .as_ref()
        .unwrap();
    let labels = placed.leaves[training.graph.inputs()[1].0]
        .as_ref()
        .unwrap();
    for r in 0..8 {
        let block = (r / 2) * 8;
        assert_eq!(images.rank_box(r).unwrap().offset[..], [block, 0, 0]);
        assert_eq!(
            labels.rank_box(r).unwrap(),
            SliceBox::new(vec![block], vec![8])
        );
    }
    // The same split as the tuples [[4, 1, 1], [4]] would give, but on the user's axes.
    config.dataset_strategy = DatasetStrategy::Layouts(vec![lay(&["dp+sp", "None"])]);
    let err = place(&training.graph, &config).unwrap_err().to_string();
    assert!(
        err.contains("dataset_strategy") && err.contains("has 2 dims"),
        "{err}"
    );
    config.dataset_strategy = DatasetStrategy::Layouts(vec![lay(&["dp", "None", "None"])]);
    let err = place(&training.graph, &config).unwrap_err().to_string();
    assert!(err.contains("no layout for labels"), "{err}");
}

#[test]
fn bad_layouts_name_the_op_and_the_rule() {
    let training = seed_training();
    let check = |config: ParallelConfig, needles: &[&str]| {
        let err = place(&training.graph, &config).unwrap_err().to_string();
        for needle in needles {
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
    };
    let semi = || ParallelConfig::new(ParallelMode::SemiAuto, 8);
    check(
        semi().shard_layouts(
            "matmul1",
            vec![lay(&["dp", "None", "None"]), lay(&["None", "mp"])],
            None,
        ),
        &["matmul1", "input 0 has 3 dims"],
    );
    check(
        semi().shard_layouts("matmul1", vec![lay(&["dp", "None"])], None),
        &["matmul1", "has 1 layouts but the op has 2 inputs"],
    );
    check(
        semi().shard_layouts(
            "matmul1",
            vec![lay(&["dp", "sp"]), lay(&["mp", "None"])],
            None,
        ),
        &["matmul1", "reduction dims"],
    );
    let small = Layout::new(&[2, 2], &["dp", "mp"], None).unwrap();
    let l = |e: &[&str]| {
        small
            .apply(&e.iter().map(|&x| x.into()).collect::<Vec<_>>())
            .unwrap()
    };
    check(
        semi().shard_layouts(
            "matmul1",
            vec![l(&["dp", "None"]), l(&["None", "mp"])],
            None,
        ),
        &["matmul1", "holds 4 devices, but the run has 8"],
    );
    check(
        semi().shard_layouts(
            "relu1",
            vec![lay(&["dp", "None"])],
            Some(vec![lay(&["dp", "None"]), lay(&["dp", "None"])]),
        ),
        &[
            "relu1",
            "out_strategy has 2 layouts but the op has 1 outputs",
        ],
    );
}
