//! Sharding rules of the transformer ops: which splits they accept, the layouts their inputs
//! get, and the errors naming the broken rule.

use graph::{Graph, GraphBuilder, Initializer, ValueId};
use layout::TensorLayout;
use parallel::rules::{infer, OpContext};
use parallel::{place, ParallelConfig, ParallelMode, PlacedGraph};

/// A graph of f32 parameters `x [4, 4, 8]` and whatever `build` adds.
fn graph_with(build: impl FnOnce(&mut GraphBuilder, ValueId)) -> Graph {
    let mut b = GraphBuilder::new();
    let x = b
        .parameter("x", &[4, 4, 8], Initializer::normal(1.0))
        .unwrap();
    build(&mut b, x);
    b.finish()
}

fn placed(g: &Graph, op: &str, strategy: &[&[usize]], devices: usize) -> PlacedGraph {
    let config = ParallelConfig::new(ParallelMode::SemiAuto, devices).shard(op, strategy);
    place(g, &config).unwrap()
}

fn error(g: &Graph, op: &str, strategy: &[&[usize]], devices: usize) -> String {
    let config = ParallelConfig::new(ParallelMode::SemiAuto, devices).shard(op, strategy);
    place(g, &config).unwrap_err().to_string()
}

fn map(layout: &TensorLayout) -> Vec<i64> {
    layout.layout().ms_flat_tensor_map().unwrap()
}

#[test]
fn triu_is_computed_whole_and_takes_no_strategy() {
    let g = graph_with(|b, x| {
        let mask = b.triu("mask", &[4, 8], 1).unwrap();
        b.masked_fill("fill", x, mask, -1e9).unwrap();
    });
    let p = placed(&g, "fill", &[&[2, 2, 2], &[2, 2]], 8);
    let triu = &p.nodes[g.node_by_name("mask").unwrap().0];
    assert_eq!(triu.outputs[0].layout().replica_count(), 8);
    // The mask follows x's split on the dims it has.
    let fill = &p.nodes[g.node_by_name("fill").unwrap().0];
    assert_eq!(map(&fill.inputs[0]), vec![2, 1, 0]);
    assert_eq!(map(&fill.inputs[1]), vec![1, 0]);
    let err = error(&g, "mask", &[], 8);
    assert!(err.contains("mask (Triu)"), "{err}");
    assert!(err.contains("takes no strategy"), "{err}");
}

#[test]
fn masked_fill_mask_must_be_split_like_x() {
    let g = graph_with(|b, x| {
        let mask = b.triu("mask", &[1, 8], 1).unwrap();
        b.masked_fill("fill", x, mask, 0.0).unwrap();
    });
    let err = error(&g, "fill", &[&[1, 1, 2], &[1, 1]], 2);
    assert!(
        err.contains("fill (MaskedFill)")
            && err.contains("dim 2 is split 2 ways in one input and 1"),
        "{err}"
    );
    let err = error(&g, "fill", &[&[1, 2, 1], &[2, 1]], 2);
    assert!(
        err.contains("dim 0 of input 1 has size 1, which 2 does not divide"),
        "{err}"
    );
    // The mask's broadcast dim stays whole while x's dim 1 is split.
    let p = placed(&g, "fill", &[&[1, 2, 2], &[1, 2]], 4);
    let fill = &p.nodes[g.node_by_name("fill").unwrap().0];
    assert_eq!(map(&fill.inputs[1]), vec![-1, 0]);
}

#[test]
fn scaled_softmax_keeps_its_last_dim_whole() {
    let g = graph_with(|b, x| {
        b.scaled_softmax("attn", x, 0.5).unwrap();
    });
    let err = error(&g, "attn", &[&[1, 1, 2]], 2);
    assert!(
        err.contains("attn (ScaledSoftmax)")
            && err.contains("the last dim (the softmax axis) cannot be split"),
        "{err}"
    );
    let p = placed(&g, "attn", &[&[2, 2, 1]], 4);
    let attn = &p.nodes[g.node_by_name("attn").unwrap().0];
    assert_eq!(map(attn.outputs[0].layout()), vec![1, 0, -1]);
    // The output rule refuses a split last dim, whoever asks.
    let node = &g.nodes()[g.node_by_name("attn").unwrap().0];
    let ctx = OpContext::of(&g, node);
    let mesh = layout::Mesh::line("dp", 2).unwrap();
    let split_last = layout::Layout::from_mesh(mesh.clone(), vec![vec![], vec![], vec![0]])
        .unwrap()
        .bind(&[4, 4, 8])
        .unwrap();
    let err = infer::output_layouts(&ctx, &[split_last], &mesh).unwrap_err();
    assert!(err
        .to_string()
        .contains("the softmax axis (the last dim) cannot be split"));
}

#[test]
fn where_splits_x_and_y_alike_and_the_condition_with_them() {
    let g = graph_with(|b, x| {
        let y = b
            .parameter("y", &[4, 4, 8], Initializer::normal(1.0))
            .unwrap();
        let cond = b.triu("cond", &[4, 8], 0).unwrap();
        b.select("where", cond, x, y).unwrap();
    });
    let err = error(&g, "where", &[&[1, 2], &[2, 1, 2], &[1, 1, 2]], 4);
    assert!(
        err.contains("where (Select)") && err.contains("dim 0 is split 2 ways in one input and 1"),
        "{err}"
    );
    let p = placed(&g, "where", &[&[2, 1], &[2, 2, 1], &[2, 2, 1]], 4);
    let node = &p.nodes[g.node_by_name("where").unwrap().0];
    assert_eq!(map(&node.inputs[0]), vec![0, -1]);
    assert_eq!(map(&node.inputs[2]), vec![1, 0, -1]);
}

#[test]
fn concat_and_split_keep_their_axis_whole() {
    let g = graph_with(|b, x| {
        let y = b
            .parameter("y", &[4, 2, 8], Initializer::normal(1.0))
            .unwrap();
        let joined = b.concat("concat", &[x, y], 1).unwrap();
        b.split("split", joined, 2, &[3, 5]).unwrap();
    });
    let err = error(&g, "concat", &[&[1, 2, 1], &[1, 2, 1]], 2);
    assert!(
        err.contains("concat (Concat)")
            && err.contains("dim 1 of input 0 is the concat axis and cannot be split"),
        "{err}"
    );
    let err = error(&g, "concat", &[&[2, 1, 1], &[1, 1, 2]], 2);
    assert!(err.contains("input 1 must be split like input 0"), "{err}");
    let err = error(&g, "split", &[&[1, 1, 2]], 2);
    assert!(err.contains("the split axis and cannot be split"), "{err}");
    let p = placed(&g, "split", &[&[2, 3, 1]], 6);
    let split = &p.nodes[g.node_by_name("split").unwrap().0];
    assert_eq!(split.outputs.len(), 2);
    for out in &split.outputs {
        assert_eq!(map(out.layout()), vec![1, 0, -1]);
    }
}

#[test]
fn strided_slice_splits_only_dims_taken_whole() {
    let g = graph_with(|b, x| {
        b.strided_slice("slice", x, &[0, 1, 0], &[4, 4, 8], &[1, 1, 1])
            .unwrap();
    });
    let err = error(&g, "slice", &[&[1, 2, 1]], 2);
    assert!(
        err.contains("slice (StridedSlice)")
            && err.contains("dim 1 is sliced (3 of 4 elements), so it cannot be split"),
        "{err}"
    );
    let p = placed(&g, "slice", &[&[2, 1, 4]], 8);
    let slice = &p.nodes[g.node_by_name("slice").unwrap().0];
    assert_eq!(map(slice.outputs[0].layout()), vec![1, -1, 0]);
}

#[test]
fn cast_keeps_the_layout_of_its_input() {
    let g = graph_with(|b, x| {
        b.cast("cast", x, tensor::DType::BF16).unwrap();
    });
    let p = placed(&g, "cast", &[&[2, 1, 4]], 8);
    let cast = &p.nodes[g.node_by_name("cast").unwrap().0];
    assert_eq!(map(&cast.inputs[0]), vec![1, -1, 0]);
    assert_eq!(map(cast.outputs[0].layout()), vec![1, -1, 0]);
}

#[test]
fn moe_route_splits_only_its_groups() {
    let g = graph_with(|b, x| {
        b.moe_route("route", x, 2, 3).unwrap();
    });
    // The groups split 4 ways: every output keeps the split on dim 0, the rest whole.
    let p = placed(&g, "route", &[&[4, 1, 1]], 4);
    let route = &p.nodes[g.node_by_name("route").unwrap().0];
    assert_eq!(route.outputs[0].layout().shape(), [4, 4, 8, 3]);
    assert_eq!(map(route.outputs[0].layout()), vec![0, -1, -1, -1]);
    assert_eq!(map(route.outputs[1].layout()), vec![0, -1, -1]);
    assert_eq!(map(route.outputs[2].layout()), vec![0, -1, -1]);
    for strategy in [[1, 2, 1], [1, 1, 2]] {
        let err = error(&g, "route", &[&strategy], 2);
        assert!(
            err.contains("route (MoeRoute)") && err.contains("only dim 0 (the groups)"),
            "{err}"
        );
    }
}

#[test]
fn flash_attention_splits_batch_heads_and_sequence_and_refuses_the_head_dim() {
    let mut b = GraphBuilder::new();
    let qkv: Vec<ValueId> = ["q", "k", "v"]
        .iter()
        .map(|n| {
            b.parameter(n, &[2, 4, 6, 8], Initializer::normal(1.0))
                .unwrap()
        })
        .collect();
    b.flash_attention("flash", (qkv[0], qkv[1], qkv[2]), true, 0.5)
        .unwrap();
    let g = b.finish();
    let heads: &[usize] = &[2, 2, 1, 1];
    let p = placed(&g, "flash", &[heads, heads, heads], 4);
    let flash = &p.nodes[g.node_by_name("flash").unwrap().0];
    for layout in &flash.inputs {
        assert_eq!(map(layout), vec![1, 0, -1, -1]);
    }
    assert_eq!(map(flash.outputs[0].layout()), vec![1, 0, -1, -1]);
    assert_eq!(map(flash.outputs[1].layout()), vec![1, 0, -1]);
    // A split sequence (context parallel) is placed as given: the executor runs it as ring
    // attention; lse follows q's rows.
    let seq: &[usize] = &[1, 1, 2, 1];
    let p = placed(&g, "flash", &[seq, seq, seq], 2);
    let flash = &p.nodes[g.node_by_name("flash").unwrap().0];
    for layout in &flash.inputs {
        assert_eq!(map(layout), vec![-1, -1, 0, -1]);
    }
    assert_eq!(map(flash.outputs[0].layout()), vec![-1, -1, 0, -1]);
    assert_eq!(map(flash.outputs[1].layout()), vec![-1, -1, 0]);
    let width: &[usize] = &[1, 1, 1, 2];
    let err = error(&g, "flash", &[width, width, width], 2);
    assert!(
        err.contains("the head dim (dim 3) cannot be split"),
        "{err}"
    );
    let err = error(&g, "flash", &[heads, &[1, 1, 1, 1], heads], 4);
    assert!(err.contains("input 1 must be split like q"), "{err}");
    // The output rule refuses a split head dim, whoever asks.
    let node = &g.nodes()[g.node_by_name("flash").unwrap().0];
    let ctx = OpContext::of(&g, node);
    let mesh = layout::Mesh::line("mp", 2).unwrap();
    let split_width =
        layout::Layout::from_mesh(mesh.clone(), vec![vec![], vec![], vec![], vec![0]])
            .unwrap()
            .bind(&[2, 4, 6, 8])
            .unwrap();
    let err = infer::output_layouts(
        &ctx,
        &[split_width.clone(), split_width.clone(), split_width],
        &mesh,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("the head dim of attention"), "{err}");
}

#[test]
fn flash_attention_by_default_splits_the_batch_and_never_a_lone_sequence() {
    for (shape, map_q) in [
        (&[4, 2, 6, 8][..], vec![0, -1, -1, -1]),
        (&[6, 8][..], vec![-1, -1]),
    ] {
        let mut b = GraphBuilder::new();
        let qkv: Vec<ValueId> = ["q", "k", "v"]
            .iter()
            .map(|n| b.parameter(n, shape, Initializer::normal(1.0)).unwrap())
            .collect();
        b.flash_attention("flash", (qkv[0], qkv[1], qkv[2]), false, 0.5)
            .unwrap();
        let g = b.finish();
        let p = place(&g, &ParallelConfig::new(ParallelMode::DataParallel, 2)).unwrap();
        let flash = &p.nodes[g.node_by_name("flash").unwrap().0];
        assert_eq!(map(&flash.inputs[0]), map_q, "{shape:?}");
    }
}

#[test]
fn packed_attention_splits_batch_and_heads_and_refuses_the_sequence_and_the_width() {
    let mut b = GraphBuilder::new();
    let qkv = b
        .parameter("qkv", &[4, 6, 4, 24], Initializer::normal(1.0))
        .unwrap();
    b.packed_attention("packed", qkv, true, 0.5).unwrap();
    let g = b.finish();
    let p = placed(&g, "packed", &[&[2, 1, 2, 1]], 4);
    let packed = &p.nodes[g.node_by_name("packed").unwrap().0];
    assert_eq!(map(&packed.inputs[0]), vec![1, -1, 0, -1]);
    assert_eq!(map(packed.outputs[0].layout()), vec![1, -1, 0, -1]);
    assert_eq!(map(packed.outputs[1].layout()), vec![1, -1, 0]);
    let err = error(&g, "packed", &[&[1, 2, 1, 1]], 2);
    assert!(
        err.contains("the sequence dim (dim 1) of packed attention cannot be split"),
        "{err}"
    );
    let err = error(&g, "packed", &[&[1, 1, 1, 2]], 2);
    assert!(
        err.contains("the q|k|v dim (dim 3) cannot be split"),
        "{err}"
    );
    // The output rule refuses a split sequence, whoever asks.
    let node = &g.nodes()[g.node_by_name("packed").unwrap().0];
    let ctx = OpContext::of(&g, node);
    let mesh = layout::Mesh::line("cp", 2).unwrap();
    let split_seq = layout::Layout::from_mesh(mesh.clone(), vec![vec![], vec![0], vec![], vec![]])
        .unwrap()
        .bind(&[4, 6, 4, 24])
        .unwrap();
    let err = infer::output_layouts(&ctx, &[split_seq], &mesh)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the sequence dim of packed attention"),
        "{err}"
    );
    // Data parallel splits the batch.
    let p = place(&g, &ParallelConfig::new(ParallelMode::DataParallel, 2)).unwrap();
    let packed = &p.nodes[g.node_by_name("packed").unwrap().0];
    assert_eq!(map(&packed.inputs[0]), vec![0, -1, -1, -1]);
}

/// `y = h·hᵀ` with `h = x·W` trainable, then a loss: one value is both operands of a product
/// whose gradient flows into it.
fn self_product(transpose_b: bool) -> (Graph, ValueId) {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[8, 6], tensor::DType::F32).unwrap();
    let labels = b.input("labels", &[8], tensor::DType::I32).unwrap();
    let w = b.parameter("w", &[6, 8], Initializer::normal(1.0)).unwrap();
    let h = b.matmul("h", x, w).unwrap();
    let y = b.matmul_with("hh", h, h, false, transpose_b).unwrap();
    let loss = b.sparse_softmax_cross_entropy("loss", y, labels).unwrap();
    (b.finish(), loss)
}

#[test]
fn a_value_read_as_both_operands_gets_each_operand_s_layout_in_the_gradient() {
    // The gradient of one operand reads the other: with both the same value, each backward
    // node must take the layout of the place it reads it at (the first place was taken for
    // both, and the product's gradient refused its own inputs' reduction splits, even on one
    // device with no strategy).
    for transpose_b in [true, false] {
        let (g, loss) = self_product(transpose_b);
        let one = ParallelConfig::new(ParallelMode::SemiAuto, 1);
        parallel::compile_training(&g, loss, &one).unwrap();
        let rows_split = ParallelConfig::new(ParallelMode::SemiAuto, 4).shard(
            "hh",
            if transpose_b {
                &[&[1, 1], &[4, 1]]
            } else {
                &[&[4, 1], &[1, 1]]
            },
        );
        parallel::compile_training(&g, loss, &rows_split).unwrap();
    }
}

#[test]
fn sigmoid_takes_any_split_and_its_gradient_follows_it() {
    // Elementwise: every dim may be split; the backward SigmoidGrad reads the forward output
    // and dy with the forward's layout.
    let mut b = GraphBuilder::new();
    let x = b
        .parameter("x", &[4, 4, 8], Initializer::normal(1.0))
        .unwrap();
    let y = b.sigmoid("act", x).unwrap();
    let loss = b.reduce_sum("loss", y, &[0, 1, 2], false).unwrap();
    let g = b.finish();
    let training = graph::grad(&g, loss, &[x]).unwrap();
    let tg = &training.graph;
    for strategy in [[2, 2, 2], [1, 1, 8], [4, 1, 2], [1, 4, 2]] {
        let p = placed(tg, "act", &[&strategy], 8);
        let act = &p.nodes[tg.node_by_name("act").unwrap().0];
        let want = map(act.outputs[0].layout());
        let split: Vec<bool> = want.iter().map(|&a| a >= 0).collect();
        let strategy_split: Vec<bool> = strategy.iter().map(|&f| f > 1).collect();
        assert_eq!(split, strategy_split, "{strategy:?}: {want:?}");
        assert_eq!(map(&act.inputs[0]), want, "{strategy:?}");
        let (i, node) = tg
            .nodes()
            .iter()
            .enumerate()
            .find(|(_, n)| n.op.kind() == "SigmoidGrad")
            .expect("a SigmoidGrad node");
        assert_eq!(node.op, graph::Op::SigmoidGrad);
        for input in &p.nodes[i].inputs {
            assert_eq!(map(input), want, "{strategy:?}");
        }
    }
    let config = ParallelConfig::new(ParallelMode::SemiAuto, 8).shard("act", &[&[2, 2, 2]]);
    parallel::compile_training(&g, loss, &config).unwrap();
}
