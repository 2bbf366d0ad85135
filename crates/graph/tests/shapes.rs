//! Shape inference: valid graphs get the right shapes, invalid ones an error naming the node,
//! the values and the rule.

use graph::{nn, GraphBuilder, GraphError, Initializer, Op, ValueId};
use tensor::DType;

/// Builds `[x: [32, 512] f32, w: [256, 10] f32, ids: [4, 6] i32]` and applies `build`.
fn build(
    f: impl FnOnce(&mut GraphBuilder, [ValueId; 3]) -> Result<ValueId, GraphError>,
) -> Result<Vec<usize>, GraphError> {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[32, 512], DType::F32)?;
    let w = b.parameter("w", &[256, 10], Initializer::Zeros)?;
    let ids = b.input("ids", &[4, 6], DType::I32)?;
    let y = f(&mut b, [x, w, ids])?;
    Ok(b.shape(y)?.to_vec())
}

fn error(f: impl FnOnce(&mut GraphBuilder, [ValueId; 3]) -> Result<ValueId, GraphError>) -> String {
    build(f).unwrap_err().to_string()
}

#[test]
fn valid_shapes() -> Result<(), GraphError> {
    let mut b = GraphBuilder::new();
    let a = b.input("a", &[2, 3, 4, 5], DType::F32)?;
    let c = b.input("c", &[3, 5, 6], DType::F32)?;
    let bm = b.batch_matmul("bmm", a, c, false, false)?;
    assert_eq!(b.shape(bm)?, &[2, 3, 4, 6]);
    let bt = b.batch_matmul("bmm_t", a, a, true, false)?;
    assert_eq!(b.shape(bt)?, &[2, 3, 5, 5]);
    let row = b.input("row", &[6], DType::F32)?;
    let sum = b.add("add", bm, row)?;
    assert_eq!(b.shape(sum)?, &[2, 3, 4, 6]);
    let flat = b.flatten("flatten", sum)?;
    assert_eq!(b.shape(flat)?, &[2, 72]);
    let r = b.reduce_sum("sum_keep", sum, &[1, 3], true)?;
    assert_eq!(b.shape(r)?, &[2, 1, 4, 1]);
    let r = b.reduce_sum("sum_drop", sum, &[1, 3], false)?;
    assert_eq!(b.shape(r)?, &[2, 4]);
    let all = b.reduce_sum("sum_all", sum, &[], false)?;
    assert_eq!(b.shape(all)?, &[] as &[usize]);
    let t = b.transpose("transpose", sum, &[3, 0, 2, 1])?;
    assert_eq!(b.shape(t)?, &[6, 2, 4, 3]);
    let ids = b.input("ids", &[2, 7], DType::I64)?;
    let emb = b.call("embed", &nn::Embedding::new(100, 16), ids)?;
    assert_eq!(b.shape(emb)?, &[2, 7, 16]);
    let ln = b.call("norm", &nn::LayerNorm::new(16), emb)?;
    let g = b.graph();
    let node = g.node(g.producer(ln).unwrap())?;
    let stats: Vec<&[usize]> = node
        .outputs
        .iter()
        .map(|v| g.values()[v.0].shape.as_slice())
        .collect();
    assert_eq!(stats, vec![&[2, 7, 16][..], &[2, 7], &[2, 7]]);
    assert_eq!(g.value(node.outputs[1])?.name, "norm.layer_norm:1");
    let dense = b.call("proj", &nn::Dense::new(16, 8), ln)?;
    assert_eq!(b.shape(dense)?, &[2, 7, 8]);
    Ok(())
}

#[test]
fn matmul_inner_dims() {
    assert_eq!(
        error(|b, [x, w, _]| b.scope("layer2", |b| b.matmul("matmul", x, w))),
        "layer2.matmul: inner dims 512 and 256 differ (`x` [32, 512], `w` [256, 10])"
    );
    assert_eq!(
        error(|b, [x, _, _]| b.matmul("mm", x, x)),
        "mm: inner dims 512 and 32 differ (`x` [32, 512], `x` [32, 512])"
    );
    assert_eq!(
        build(|b, [x, _, _]| b.matmul_with("mm", x, x, false, true)).unwrap(),
        [32, 32]
    );
    assert_eq!(
        error(|b, [_, w, ids]| b.matmul("mm", ids, w)),
        "mm: input `ids` has dtype i32, but MatMul needs a floating-point dtype"
    );
    assert_eq!(
        error(|b, [x, _, _]| {
            let v = b.input("v", &[512], DType::F32)?;
            b.matmul("mm", x, v)
        }),
        "mm: input `v` has shape [512], but MatMul needs a 2-D matrix"
    );
}

#[test]
fn broadcasting_and_dtypes() {
    assert_eq!(
        error(|b, [x, w, _]| b.add("add", x, w)),
        "add: `x` [32, 512] and `w` [256, 10] cannot be broadcast together"
    );
    assert_eq!(
        error(|b, [x, _, _]| {
            let y = b.input("y", &[512], DType::F64)?;
            b.mul("mul", x, y)
        }),
        "mul: input `y` has dtype f64, but Mul needs the dtype of `x` (f32)"
    );
    assert_eq!(
        error(|b, [x, _, _]| {
            let bias = b.parameter("bias", &[10], Initializer::Zeros)?;
            b.bias_add("bias_add", x, bias)
        }),
        "bias_add: channel dim and bias length 512 and 10 differ (`x` [32, 512], `bias` [10])"
    );
}

#[test]
fn attribute_rules() {
    assert_eq!(
        error(|b, [x, _, _]| b.reshape("r", x, &[3, 5])),
        "r: attribute `shape` [3, 5] holds 15 elements, but `x` [32, 512] holds 16384"
    );
    assert_eq!(
        error(|b, [x, _, _]| b.transpose("t", x, &[0, 0])),
        "t: attribute `perm` [0, 0] is not a permutation of the 2 dims of `x` [32, 512]"
    );
    assert_eq!(
        error(|b, [x, _, _]| b.dropout("drop", x, 0.0, 1)),
        "drop: attribute `keep_prob` must lie in (0, 1], got 0"
    );
    assert_eq!(
        error(|b, [x, _, _]| b.reduce_sum("s", x, &[1, 0], false)),
        "s: attribute `axes` [1, 0] must be ascending, distinct and below the rank 2 of `x`"
    );
    assert_eq!(
        error(|b, [x, _, _]| b
            .node(
                "f",
                Op::Flatten {
                    shape: vec![16, 1024]
                },
                &[x]
            )
            .map(|v| v[0])),
        "f: attribute `shape` is [16, 1024], but flattening `x` [32, 512] gives [32, 512]"
    );
}

#[test]
fn embedding_and_loss_inputs() {
    assert_eq!(
        error(|b, [x, w, _]| b.embedding("embed", w, x)),
        "embed: input `x` has dtype f32, but Embedding needs integer indices (i32 or i64)"
    );
    assert_eq!(
        build(|b, [_, w, ids]| b.embedding("embed", w, ids)).unwrap(),
        [4, 6, 10]
    );
    assert_eq!(
        error(|b, [x, _, _]| {
            let labels = b.input("labels", &[16], DType::I32)?;
            b.sparse_softmax_cross_entropy("loss", x, labels)
        }),
        "loss: batch sizes 32 and 16 differ (`x` [32, 512], `labels` [16])"
    );
    assert_eq!(
        error(|b, [x, _, ids]| b.sparse_softmax_cross_entropy("loss", x, ids)),
        "loss: input `ids` has shape [4, 6], but SparseSoftmaxCrossEntropy needs 1-D labels [batch]"
    );
}

#[test]
fn graph_structure_errors() {
    assert_eq!(
        error(|b, [x, _, _]| b.relu("relu", ValueId(x.0 + 100))),
        "relu: value id 100 does not exist (the graph has 3 values)"
    );
    assert_eq!(
        error(|b, [x, _, _]| b.node("n", Op::Add, &[x]).map(|v| v[0])),
        "n: Add takes 2 inputs, got 1"
    );
    assert_eq!(
        error(|b, [x, _, _]| {
            b.relu("w", x)?;
            unreachable!()
        }),
        "`w` is already defined in this graph"
    );
    let err = GraphBuilder::new()
        .parameter("bias", &[10], Initializer::he_uniform())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "parameter `bias`: initializer HeUniform needs at least 2 dims to compute fan_in and \
         fan_out, got shape [10]"
    );
}

#[test]
fn failed_nodes_leave_the_builder_unchanged() -> Result<(), GraphError> {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[2, 3], DType::F32)?;
    let before = b.graph().clone();
    assert!(b.reshape("r", x, &[4]).is_err());
    assert_eq!(b.graph(), &before);
    // The name was not claimed by the failed node.
    b.reshape("r", x, &[3, 2])?;
    Ok(())
}

#[test]
fn transformer_ops_name_the_broken_rule() {
    // Valid shapes first.
    let shape =
        |f: fn(&mut GraphBuilder, [ValueId; 3]) -> Result<ValueId, GraphError>| build(f).unwrap();
    assert_eq!(shape(|b, _| b.triu("mask", &[2, 3, 4], 1)), vec![2, 3, 4]);
    assert_eq!(
        shape(|b, [x, _, _]| {
            let m = b.triu("m", &[1, 512], 0)?;
            b.masked_fill("fill", x, m, f64::NEG_INFINITY)
        }),
        vec![32, 512]
    );
    assert_eq!(
        shape(|b, [x, _, _]| b.concat("cat", &[x, x, x], 1)),
        vec![32, 1536]
    );
    assert_eq!(
        shape(|b, [x, _, _]| Ok(b.split("split", x, 0, &[2, 30])?[1])),
        vec![30, 512]
    );
    assert_eq!(
        shape(|b, [x, _, _]| b.strided_slice("s", x, &[1, 0], &[32, 512], &[2, 3])),
        vec![16, 171]
    );
    assert_eq!(
        shape(|b, [x, _, _]| Ok(b.flash_attention("flash", (x, x, x), true, 0.5)?.1)),
        vec![32]
    );
    fn packed(b: &mut GraphBuilder, shape: &[usize], lse: bool) -> Result<ValueId, GraphError> {
        let qkv = b.input("qkv", shape, DType::F32)?;
        let (out, l) = b.packed_attention("packed", qkv, true, 0.5)?;
        Ok(if lse { l } else { out })
    }
    assert_eq!(
        shape(|b, _| packed(b, &[2, 16, 4, 24], false)),
        vec![2, 16, 4, 8]
    );
    assert_eq!(
        shape(|b, _| packed(b, &[2, 16, 4, 24], true)),
        vec![2, 16, 4]
    );
    // Errors.
    let cases: Vec<(String, &str)> = vec![
        (
            error(|b, _| b.triu("mask", &[4], 0)),
            "mask: attribute `shape` [4] needs at least 2 dims",
        ),
        (
            error(|b, [x, w, _]| b.masked_fill("fill", x, w, 0.0)),
            "fill: input `w` has shape [256, 10], but MaskedFill needs a mask shape that broadcasts to x's shape",
        ),
        (
            error(|b, [x, w, _]| Ok(b.flash_attention("flash", (x, w, w), true, 0.5)?.0)),
            "flash: head dim 512 and 10 differ (`x` [32, 512], `w` [256, 10])",
        ),
        (
            error(|b, _| packed(b, &[2, 16, 4, 20], false)),
            "packed: input `qkv` has shape [2, 16, 4, 20], but PackedAttention needs a last dim of 3·head_dim",
        ),
        (
            error(|b, [x, _, _]| Ok(b.packed_attention("packed", x, true, 0.5)?.0)),
            "packed: input `x` has shape [32, 512], but PackedAttention needs at least 3 dims",
        ),
        (
            error(|b, [x, _, _]| b.scaled_softmax("attn", x, 0.0)),
            "attn: attribute `scale` must be finite and > 0, got 0",
        ),
        (
            error(|b, [x, w, _]| b.select("sel", x, w, w)),
            "sel: input `x` has shape [32, 512], but Select needs a condition shape that broadcasts to x's shape",
        ),
        (
            error(|b, [x, _, _]| b.concat("cat", &[x], 0)),
            "cat: attribute `n` must be from 2 to 8 inputs, got 1",
        ),
        (
            error(|b, [x, w, _]| b.concat("cat", &[x, w], 0)),
            "cat: input `w` has shape [256, 10], but Concat needs the shape of the first input in every dim but the concat axis",
        ),
        (
            error(|b, [x, _, _]| Ok(b.split("split", x, 1, &[500, 10])?[0])),
            "split: attribute `sizes` [500, 10] add up to 510, but dim 1 of `x` [32, 512] is 512",
        ),
        (
            error(|b, [x, _, _]| b.strided_slice("s", x, &[0, 0], &[33, 512], &[1, 1])),
            "s: attribute `end` dim 0: 0..33 is not a range within its size 32",
        ),
        (
            error(|b, [x, _, _]| b.strided_slice("s", x, &[0, 0], &[32, 512], &[1, 0])),
            "s: attribute `strides` [1, 0]: dim 1 is 0",
        ),
        (
            error(|b, [x, _, _]| b.cast("c", x, DType::I32)),
            "c: attribute `dtype` must be f32, f64, f16 or bf16, got i32",
        ),
    ];
    for (got, expected) in cases {
        assert!(
            got.contains(expected),
            "{got:?} should contain {expected:?}"
        );
    }
}

#[test]
fn moe_route_shapes_and_rules() {
    let routed = |top_k: usize, capacity: usize| {
        build(|b, [x, _, _]| {
            let probs = b.reshape("probs", x, &[4, 8, 512])?;
            Ok(b.moe_route("route", probs, top_k, capacity)?[0])
        })
    };
    assert_eq!(routed(2, 3).unwrap(), vec![4, 8, 512, 3]);
    let err = routed(513, 3).unwrap_err().to_string();
    assert!(
        err.contains("route") && err.contains("top_k") && err.contains("1..=512"),
        "{err}"
    );
    let err = routed(0, 3).unwrap_err().to_string();
    assert!(err.contains("top_k"), "{err}");
    let err = routed(1, 0).unwrap_err().to_string();
    assert!(
        err.contains("capacity") && err.contains("at least 1"),
        "{err}"
    );
    let err = error(|b, [x, _, _]| Ok(b.moe_route("route", x, 1, 1)?[0]));
    assert!(err.contains("route") && err.contains("3 dims"), "{err}");
    let err = error(|b, [_, _, ids]| {
        let ids = b.reshape("ids3", ids, &[4, 6, 1])?;
        Ok(b.moe_route("route", ids, 1, 1)?[0])
    });
    assert!(err.contains("route"), "{err}");
}
