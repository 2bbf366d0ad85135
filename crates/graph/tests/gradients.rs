//! Every op's backward rule against central finite differences (see `util::check_gradients` for
//! the tolerance), each in a tiny graph.

use graph::{GraphBuilder, GraphError, Initializer, Op, ValueId};
use tensor::{DType, Tensor};

use crate::util::{check_gradients, indices, uniform};

/// A trainable f64 parameter drawn from N(0, 1).
fn param(b: &mut GraphBuilder, name: &str, shape: &[usize]) -> Result<ValueId, GraphError> {
    b.parameter(name, shape, Initializer::normal(1.0))
}

/// Checks the single-output op `op` applied to fresh N(0, 1) parameters of `shapes`.
fn check_op(label: &str, op: Op, shapes: &[&[usize]]) {
    check_gradients(label, |b| {
        let inputs: Vec<ValueId> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| param(b, &format!("in{i}"), s))
            .collect::<Result<_, _>>()?;
        Ok((b.node("op", op, &inputs)?[0], Vec::new()))
    })
    .unwrap();
}

#[test]
fn matmul_every_transpose_combination() {
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a: &[usize] = if ta { &[4, 3] } else { &[3, 4] };
        let b: &[usize] = if tb { &[5, 4] } else { &[4, 5] };
        let op = Op::MatMul {
            transpose_a: ta,
            transpose_b: tb,
        };
        check_op(&format!("matmul ta={ta} tb={tb}"), op, &[a, b]);
    }
}

#[test]
fn batch_matmul_with_broadcast_batches() {
    let cases: [(&[usize], &[usize], bool, bool); 8] = [
        (&[2, 3, 4], &[2, 4, 5], false, false),
        // b shared by every batch (a weight): its gradient is one BatchMatMulSum, folded into
        // one product (transposed a) or accumulated, for every transpose combination.
        (&[2, 3, 4], &[4, 5], false, false),
        (&[2, 3, 4], &[5, 4], false, true),
        (&[2, 4, 3], &[4, 5], true, false),
        (&[2, 4, 3], &[5, 4], true, true),
        (&[2, 2, 3, 4], &[5, 4], false, true),
        (&[2, 1, 4, 3], &[3, 5, 4], true, true), // batch dims broadcast both ways
        (&[3, 4], &[2, 4, 5], false, false),     // a shared
    ];
    for (a, b, ta, tb) in cases {
        let op = Op::BatchMatMul {
            transpose_a: ta,
            transpose_b: tb,
        };
        check_op(&format!("batch_matmul {a:?}·{b:?}"), op, &[a, b]);
    }
}

#[test]
fn add_sub_mul_with_broadcasting() {
    for op in [Op::Add, Op::Sub, Op::Mul] {
        let label = op.kind();
        check_op(
            &format!("{label} same shape"),
            op.clone(),
            &[&[2, 3], &[2, 3]],
        );
        check_op(&format!("{label} row"), op.clone(), &[&[2, 3], &[3]]);
        check_op(
            &format!("{label} both ways"),
            op.clone(),
            &[&[2, 1, 4], &[3, 1]],
        );
        check_op(&format!("{label} scalar lhs"), op, &[&[], &[2, 2]]);
    }
}

#[test]
fn div_with_broadcasting() {
    // Denominators kept away from 0: uniform in [1.5, 2.5].
    for (a, bshape) in [
        (&[2usize, 3][..], &[2usize, 3][..]),
        (&[2, 3], &[3]),
        (&[3], &[2, 3]),
    ] {
        check_gradients("div", |b| {
            let x = param(b, "a", a)?;
            let y = param(b, "b", bshape)?;
            let denominator = uniform(bshape, 5)
                .to_f64_vec()
                .iter()
                .map(|v| v * 0.5 + 2.0)
                .collect();
            let out = b.div("div", x, y)?;
            Ok((
                out,
                vec![(y, Tensor::from_vec(bshape, denominator).unwrap())],
            ))
        })
        .unwrap();
    }
}

#[test]
fn unary_activations() {
    check_op("neg", Op::Neg, &[&[2, 5]]);
    check_op("relu", Op::Relu, &[&[3, 7]]);
    check_op("tanh", Op::Tanh, &[&[3, 7]]);
    check_op("sigmoid", Op::Sigmoid, &[&[3, 7]]);
    check_op("gelu erf", Op::Gelu { approximate: false }, &[&[3, 7]]);
    check_op("gelu tanh", Op::Gelu { approximate: true }, &[&[3, 7]]);
}

#[test]
fn bias_add() {
    check_op("bias_add 2-D", Op::BiasAdd, &[&[4, 3], &[3]]);
    check_op("bias_add 3-D", Op::BiasAdd, &[&[2, 4, 3], &[3]]);
}

#[test]
fn softmax_and_log_softmax() {
    check_op("softmax", Op::Softmax, &[&[3, 5]]);
    check_op("log_softmax", Op::LogSoftmax, &[&[2, 2, 5]]);
}

#[test]
fn shape_ops() {
    check_op("flatten", Op::Flatten { shape: vec![2, 12] }, &[&[2, 3, 4]]);
    check_op("reshape", Op::Reshape { shape: vec![4, 6] }, &[&[2, 3, 4]]);
    check_op(
        "transpose",
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        &[&[2, 3, 4]],
    );
    check_op(
        "broadcast_to",
        Op::BroadcastTo {
            shape: vec![2, 3, 4],
        },
        &[&[3, 1]],
    );
    check_op(
        "sum_to_shape",
        Op::SumToShape { shape: vec![3, 1] },
        &[&[2, 3, 4]],
    );
}

#[test]
fn reduce_sum_axes_and_keep_dims() {
    for (axes, keep_dims) in [
        (vec![], false),
        (vec![1], false),
        (vec![0, 2], true),
        (vec![0, 2], false),
    ] {
        let op = Op::ReduceSum {
            axes: axes.clone(),
            keep_dims,
        };
        check_op(
            &format!("reduce_sum {axes:?} keep={keep_dims}"),
            op,
            &[&[2, 3, 4]],
        );
    }
}

#[test]
fn layer_norm_all_three_inputs() {
    check_gradients("layer_norm", |b| {
        let x = param(b, "x", &[3, 6])?;
        let gamma = param(b, "gamma", &[6])?;
        let beta = param(b, "beta", &[6])?;
        Ok((b.layer_norm("ln", x, gamma, beta, 1e-5)?, Vec::new()))
    })
    .unwrap();
}

#[test]
fn embedding_scatter_adds_repeated_rows() {
    check_gradients("embedding", |b| {
        let table = param(b, "table", &[5, 3])?;
        let ids = b.input("ids", &[2, 4], DType::I64)?;
        let feed = Tensor::from_vec(&[2, 4], vec![0i64, 3, 3, 1, 4, 0, 3, 2]).unwrap();
        Ok((b.embedding("embed", table, ids)?, vec![(ids, feed)]))
    })
    .unwrap();
}

#[test]
fn dropout_reuses_its_mask() {
    check_gradients("dropout", |b| {
        let x = param(b, "x", &[4, 8])?;
        Ok((b.dropout("drop", x, 0.6, 3)?, Vec::new()))
    })
    .unwrap();
}

#[test]
fn sparse_softmax_cross_entropy() {
    check_gradients("cross entropy", |b| {
        let logits = param(b, "logits", &[4, 5])?;
        let labels = b.input("labels", &[4], DType::I32)?;
        let loss = b.sparse_softmax_cross_entropy("loss", logits, labels)?;
        Ok((loss, vec![(labels, indices(&[4], 5, 1))]))
    })
    .unwrap();
}

#[test]
fn fan_out_gradients_accumulate() {
    check_gradients("fan-out", |b| {
        let x = param(b, "x", &[3, 4])?;
        let r = b.relu("relu", x)?;
        let t = b.tanh("tanh", x)?;
        let s = b.mul("square", x, x)?;
        let sum = b.add("sum", r, t)?;
        Ok((b.add("total", sum, s)?, Vec::new()))
    })
    .unwrap();
}

#[test]
fn masked_fill_with_broadcast_masks_of_any_dtype() {
    // A float causal mask broadcast over the batch, and an i32 mask fed per batch and column.
    check_gradients("masked_fill triu mask", |b| {
        let x = param(b, "x", &[2, 3, 4])?;
        let mask = b.triu("mask", &[3, 4], 1)?;
        Ok((b.masked_fill("fill", x, mask, -5.0)?, Vec::new()))
    })
    .unwrap();
    check_gradients("masked_fill i32 mask", |b| {
        let x = param(b, "x", &[2, 3, 4])?;
        let mask = b.input("mask", &[2, 1, 4], DType::I32)?;
        let feed = indices(&[2, 1, 4], 2, 5);
        Ok((b.masked_fill("fill", x, mask, 2.5)?, vec![(mask, feed)]))
    })
    .unwrap();
}

#[test]
fn scaled_softmax_alone_and_after_a_causal_mask() {
    check_op(
        "scaled_softmax",
        Op::ScaledSoftmax { scale: 0.35 },
        &[&[3, 5]],
    );
    check_gradients("causal attention weights", |b| {
        let scores = param(b, "scores", &[2, 4, 4])?;
        let mask = b.triu("causal", &[4, 4], 1)?;
        let masked = b.masked_fill("masked", scores, mask, f64::NEG_INFINITY)?;
        Ok((b.scaled_softmax("attn", masked, 0.5)?, Vec::new()))
    })
    .unwrap();
}

#[test]
fn flash_attention_causal_and_not_with_more_keys_than_queries() {
    for (causal, kv_len) in [(true, 5), (false, 5), (false, 7), (true, 7)] {
        check_gradients(
            &format!("flash_attention causal {causal} kv {kv_len}"),
            |b| {
                let q = param(b, "q", &[2, 2, 5, 3])?;
                let k = param(b, "k", &[2, 2, kv_len, 3])?;
                let v = param(b, "v", &[2, 2, kv_len, 3])?;
                let (out, _) = b.flash_attention("attn", (q, k, v), causal, 0.6)?;
                Ok((out, Vec::new()))
            },
        )
        .unwrap();
    }
}

#[test]
fn flash_attention_equals_the_unfused_ops_and_its_lse_has_no_gradient() {
    use graph::{grad, Executor};
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let q = param(&mut b, "q", &[2, 3, 6, 4]).unwrap();
    let k = param(&mut b, "k", &[2, 3, 6, 4]).unwrap();
    let v = param(&mut b, "v", &[2, 3, 6, 4]).unwrap();
    let (fused, lse) = b.flash_attention("flash", (q, k, v), true, 0.5).unwrap();
    let scores = b.batch_matmul("scores", q, k, false, true).unwrap();
    let mask = b.triu("mask", &[6, 6], 1).unwrap();
    let masked = b.masked_fill("masked", scores, mask, -1e9).unwrap();
    let probs = b.scaled_softmax("softmax", masked, 0.5).unwrap();
    let unfused = b.batch_matmul("context", probs, v, false, false).unwrap();
    b.output(fused).unwrap();
    b.output(unfused).unwrap();
    b.output(lse).unwrap();
    let lse_sum = b.reduce_sum("lse_sum", lse, &[], false).unwrap();
    let g = b.finish();
    let mut exec = Executor::new(&g).unwrap();
    exec.init_parameters(3).unwrap();
    exec.run().unwrap();
    let (f, u) = (
        exec.value(fused).unwrap().to_f64_vec(),
        exec.value(unfused).unwrap().to_f64_vec(),
    );
    for (i, (a, b)) in f.iter().zip(&u).enumerate() {
        assert!(
            (a - b).abs() < 1e-12,
            "element {i}: fused {a} vs unfused {b}"
        );
    }
    let err = grad(&g, lse_sum, &g.trainable_parameters())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("flash:1") && err.contains("no gradient rule"),
        "{err}"
    );
}

#[test]
fn packed_attention_causal_and_not() {
    for causal in [true, false] {
        check_gradients(&format!("packed_attention causal {causal}"), |b| {
            // [batch 2, seq 5, heads 2, 3 · head_dim 3]
            let qkv = param(b, "qkv", &[2, 5, 2, 9])?;
            let (out, _) = b.packed_attention("attn", qkv, causal, 0.6)?;
            Ok((out, Vec::new()))
        })
        .unwrap();
    }
}

/// `PackedAttention` over `qkv [B, S, N, 3·d]` gives the bits of `FlashAttention` over q, k
/// and v cut from it and transposed to `[B, N, S, d]` (its context transposed back), forward
/// and backward, and its lse has no gradient.
#[test]
fn packed_attention_is_flash_attention_on_the_cut_and_transposed_qkv_bit_for_bit() {
    use graph::{grad, Executor};
    for causal in [true, false] {
        let mut b = GraphBuilder::with_float_dtype(DType::F64);
        let qkv = param(&mut b, "qkv", &[3, 70, 2, 12]).unwrap();
        let (packed, lse) = b.packed_attention("packed", qkv, causal, 0.5).unwrap();
        let parts = b.split("cut", qkv, 3, &[4, 4, 4]).unwrap();
        let t = |b: &mut GraphBuilder, name: &str, x| b.transpose(name, x, &[0, 2, 1, 3]).unwrap();
        let (q, k, v) = (
            t(&mut b, "q", parts[0]),
            t(&mut b, "k", parts[1]),
            t(&mut b, "v", parts[2]),
        );
        let (flash, flash_lse) = b.flash_attention("flash", (q, k, v), causal, 0.5).unwrap();
        let flash = t(&mut b, "back", flash);
        let flash_lse = b.transpose("lse_back", flash_lse, &[0, 2, 1]).unwrap();
        // A loss per path: each one's gradient of qkv goes through its own ops only.
        let sum = |b: &mut GraphBuilder, name: &str, x| b.reduce_sum(name, x, &[], false).unwrap();
        let (ps, fs) = (sum(&mut b, "ps", packed), sum(&mut b, "fs", flash));
        let lse_sum = sum(&mut b, "lse_sum", lse);
        b.output(packed).unwrap();
        b.output(flash).unwrap();
        b.output(lse).unwrap();
        b.output(flash_lse).unwrap();
        b.output(ps).unwrap();
        b.output(fs).unwrap();
        let g = b.finish();
        let bits = |e: &Executor, v| {
            let t: &Tensor = e.value(v).unwrap();
            t.to_f64_vec()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        };
        let mut exec = Executor::new(&g).unwrap();
        exec.init_parameters(3).unwrap();
        exec.run().unwrap();
        assert!(
            bits(&exec, packed) == bits(&exec, flash),
            "out, causal {causal}"
        );
        assert!(
            bits(&exec, lse) == bits(&exec, flash_lse),
            "lse, causal {causal}"
        );
        // The gradients of qkv through either path.
        let params = g.trainable_parameters();
        let grads = |loss| {
            let training = grad(&g, loss, &params).unwrap();
            let mut e = Executor::new(&training.graph).unwrap();
            e.init_parameters(3).unwrap();
            e.run().unwrap();
            bits(&e, training.grads[0].1)
        };
        assert!(grads(ps) == grads(fs), "dqkv, causal {causal}");
        let err = grad(&g, lse_sum, &params).unwrap_err().to_string();
        assert!(
            err.contains("packed:1") && err.contains("no gradient rule"),
            "{err}"
        );
    }
}

#[test]
fn where_routes_the_gradient_by_the_condition() {
    check_gradients("where", |b| {
        let x = param(b, "x", &[2, 3, 4])?;
        let y = param(b, "y", &[2, 3, 4])?;
        let cond = b.input("cond", &[3, 1], DType::U8)?;
        let feed = Tensor::from_vec(&[3, 1], vec![1u8, 0, 7]).unwrap();
        Ok((b.select("where", cond, x, y)?, vec![(cond, feed)]))
    })
    .unwrap();
    // Only y trainable: the rule still routes dy through the mask.
    check_gradients("where, y only", |b| {
        let x = b.fill("x", &[3, 4], 2.0)?;
        let y = param(b, "y", &[3, 4])?;
        let cond = b.triu("cond", &[3, 4], 0)?;
        Ok((b.select("where", cond, x, y)?, Vec::new()))
    })
    .unwrap();
}

#[test]
fn concat_along_any_axis() {
    check_op(
        "concat axis 0",
        Op::Concat { axis: 0, n: 2 },
        &[&[2, 3], &[1, 3]],
    );
    check_op(
        "concat axis 1 of 3",
        Op::Concat { axis: 1, n: 3 },
        &[&[2, 1, 4], &[2, 3, 4], &[2, 2, 4]],
    );
    check_op(
        "concat last axis",
        Op::Concat { axis: 2, n: 2 },
        &[&[2, 3, 1], &[2, 3, 2]],
    );
}

#[test]
fn split_with_used_and_unused_pieces() {
    // Every piece used, reordered.
    check_gradients("split all", |b| {
        let x = param(b, "x", &[4, 6])?;
        let p = b.split("split", x, 1, &[1, 2, 3])?;
        Ok((b.concat("join", &[p[2], p[1], p[0]], 1)?, Vec::new()))
    })
    .unwrap();
    // The middle piece unused: its gradient is zero.
    check_gradients("split some", |b| {
        let x = param(b, "x", &[2, 5, 3])?;
        let p = b.split("split", x, 1, &[2, 1, 2])?;
        Ok((b.concat("join", &[p[2], p[0]], 0)?, Vec::new()))
    })
    .unwrap();
    check_gradients("split one piece", |b| {
        let x = param(b, "x", &[2, 3])?;
        Ok((b.split("split", x, 0, &[2])?[0], Vec::new()))
    })
    .unwrap();
}

#[test]
fn strided_slice_scatters_back() {
    let op = Op::StridedSlice {
        begin: vec![1, 0, 0],
        end: vec![5, 6, 3],
        strides: vec![2, 1, 2],
    };
    check_op("strided_slice", op, &[&[5, 6, 4]]);
    check_gradients("strided_slice empty and whole dims", |b| {
        let x = param(b, "x", &[3, 4])?;
        let y = b.strided_slice("slice", x, &[0, 1], &[3, 4], &[1, 3])?;
        Ok((y, Vec::new()))
    })
    .unwrap();
}

#[test]
fn exp_and_log() {
    check_op("exp", Op::Exp, &[&[3, 4]]);
    check_gradients("log", |b| {
        // ln(x² + 1): a positive argument for any x.
        let x = param(b, "x", &[3, 4])?;
        let square = b.mul("square", x, x)?;
        let one = b.fill("one", &[], 1.0)?;
        let positive = b.add("positive", square, one)?;
        Ok((b.log("log", positive)?, Vec::new()))
    })
    .unwrap();
}

#[test]
fn sqrt_of_a_positive_argument() {
    check_gradients("sqrt", |b| {
        // √(x² + 1): a positive argument for any x.
        let x = param(b, "x", &[3, 4])?;
        let square = b.mul("square", x, x)?;
        let one = b.fill("one", &[], 1.0)?;
        let positive = b.add("positive", square, one)?;
        Ok((b.sqrt("sqrt", positive)?, Vec::new()))
    })
    .unwrap();
}

#[test]
fn cast_gradients_cast_back() {
    // f64 to f64: the rule's graph against finite differences.
    check_op("cast f64", Op::Cast { dtype: DType::F64 }, &[&[2, 3]]);
    // Through f32 (finite differences would see f32's rounding): d sum(cast(x)·p) / dx is p,
    // cast back to f64.
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let x = param(&mut b, "x", &[2, 3]).unwrap();
    let low = b.cast("low", x, DType::F32).unwrap();
    let probe = b
        .parameter_with(
            "probe",
            &[2, 3],
            DType::F32,
            Initializer::normal(1.0),
            false,
        )
        .unwrap();
    let weighted = b.mul("weighted", low, probe).unwrap();
    let loss = b.reduce_sum("loss", weighted, &[], false).unwrap();
    let forward = b.finish();
    let training = graph::grad(&forward, loss, &[x]).unwrap();
    let dx = training.grad_of(x).unwrap();
    assert_eq!(training.graph.value(dx).unwrap().dtype, DType::F64);
    let mut exec = graph::Executor::new(&training.graph).unwrap();
    exec.init_parameters(3).unwrap();
    exec.run().unwrap();
    let expected = exec.value(probe).unwrap().to_f64_vec();
    assert_eq!(exec.value(dx).unwrap().to_f64_vec(), expected);
}

#[test]
fn cast_rounds_to_nearest_even() {
    let run = |values: Vec<f64>, dtype: DType| -> Vec<f64> {
        let n = values.len();
        let x = Tensor::from_vec(&[n], values).unwrap();
        let mut out = Tensor::zeros(dtype, &[n]);
        let ctx = graph::EvalCtx {
            node: "cast",
            step: 0,
            placement: None,
            input_blocks: &[],
            deterministic: None,
        };
        graph::eval_op(
            &Op::Cast { dtype },
            &[&x],
            std::slice::from_mut(&mut out),
            &ctx,
        )
        .unwrap();
        assert_eq!(out.dtype(), dtype);
        out.to_f64_vec()
    };
    let tie = 1.0 + 2f64.powi(-11); // halfway between two f16 values
    assert_eq!(
        run(
            vec![tie, tie + 2f64.powi(-30), 1.0 + 3.0 * 2f64.powi(-11)],
            DType::F16
        ),
        vec![1.0, 1.0 + 2f64.powi(-10), 1.0 + 4.0 * 2f64.powi(-11)]
    );
    let tie = 1.0 + 2f64.powi(-8); // halfway between two bf16 values
    assert_eq!(
        run(vec![tie, tie + 2f64.powi(-30), -3.5], DType::BF16),
        vec![1.0, 1.0 + 2f64.powi(-7), -3.5]
    );
    let tie = 1.0 + 2f64.powi(-24); // halfway between two f32 values
    assert_eq!(
        run(vec![tie, 0.1], DType::F32),
        vec![1.0, f64::from(0.1f32)]
    );
}

#[test]
fn the_composite_cross_entropy_matches_finite_differences() {
    // The max shift is a constant to autodiff, but the loss does not depend on it: finite
    // differences (which do move the max) agree.
    check_gradients("composite cross entropy", |b| {
        let logits = param(b, "logits", &[4, 5])?;
        let labels = b.input("labels", &[4], DType::I32)?;
        let loss = b.vocab_parallel_cross_entropy("xent", logits, labels, 4)?;
        Ok((loss, vec![(labels, indices(&[4], 5, 1))]))
    })
    .unwrap();
}
