//! Global semantics under sharding: initializers and dropout masks give every box of a global
//! tensor the values the whole tensor holds there; the cross entropy's explicit divisor makes
//! per-shard losses sum to the global mean; `Graph::rewrite` derives local-shape graphs.

use graph::models::seed_mlp;
use graph::{eval_op, EvalCtx, GraphError, Initializer, Op, Placement};
use layout::SliceBox;
use proptest::prelude::*;
use tensor::{DType, Tensor};

use crate::util::{indices, uniform};

/// A global shape (0 to 3 dims of 1 to 7) and a grid of boxes tiling it, cut at random points.
fn arb_tiling() -> impl Strategy<Value = (Vec<usize>, Vec<SliceBox>)> {
    proptest::collection::vec(1usize..=7, 0..=3).prop_flat_map(|shape| {
        let cuts: Vec<_> = shape
            .iter()
            .map(|&size| proptest::collection::vec(any::<bool>(), size - 1))
            .collect();
        (Just(shape), cuts).prop_map(|(shape, cuts)| {
            // Per dim, the intervals between cut points.
            let intervals: Vec<Vec<(usize, usize)>> = shape
                .iter()
                .zip(&cuts)
                .map(|(&size, cut)| {
                    let mut points = vec![0];
                    points.extend((1..size).filter(|&i| cut[i - 1]));
                    points.push(size);
                    points.windows(2).map(|w| (w[0], w[1] - w[0])).collect()
                })
                .collect();
            let mut boxes = vec![SliceBox::new(Vec::new(), Vec::new())];
            for dim in &intervals {
                boxes = boxes
                    .iter()
                    .flat_map(|b| {
                        dim.iter().map(move |&(offset, len)| {
                            let mut next = b.clone();
                            next.offset.push(offset);
                            next.shape.push(len);
                            next
                        })
                    })
                    .collect();
            }
            (shape, boxes)
        })
    })
}

fn ctx(placement: Option<Placement<'_>>) -> EvalCtx<'_> {
    EvalCtx {
        node: "drop",
        step: 3,
        placement,
        input_blocks: &[],
        deterministic: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn initializers_are_sharding_independent((shape, boxes) in arb_tiling(), seed in any::<u64>()) {
        let mut inits = vec![
            Initializer::normal(0.3),
            Initializer::Uniform { scale: 0.5 },
            Initializer::Constant(1.5),
        ];
        if shape.len() >= 2 {
            inits.push(Initializer::he_uniform());
            inits.push(Initializer::XavierUniform { gain: 1.0 });
        }
        for init in inits {
            for dtype in [DType::F32, DType::F64] {
                let full = init.fill(&shape, &SliceBox::full(&shape), dtype, seed, "layer.w").unwrap();
                let mut assembled = Tensor::zeros(dtype, &shape);
                for region in &boxes {
                    let piece = init.fill(&shape, region, dtype, seed, "layer.w").unwrap();
                    assembled.insert_box(region, &piece).unwrap();
                }
                prop_assert_eq!(&assembled, &full, "{} {:?}", init.name(), dtype);
            }
        }
    }

    #[test]
    fn dropout_masks_are_sharding_independent((shape, boxes) in arb_tiling(), seed in any::<u64>()) {
        let x = uniform(&shape, seed).to_dtype(DType::F32);
        let op = Op::Dropout { keep_prob: 0.5, seed };
        let mut global = Tensor::zeros(DType::F32, &shape);
        eval_op(&op, &[&x], std::slice::from_mut(&mut global), &ctx(None)).unwrap();
        let mut assembled = Tensor::zeros(DType::F32, &shape);
        for region in &boxes {
            let local_x = x.extract_box(region).unwrap();
            let mut local = Tensor::zeros(DType::F32, &region.shape);
            let placement = Placement { offset: &region.offset, global_shape: &shape };
            eval_op(&op, &[&local_x], std::slice::from_mut(&mut local), &ctx(Some(placement))).unwrap();
            assembled.insert_box(region, &local).unwrap();
        }
        prop_assert_eq!(assembled, global);
    }
}

#[test]
fn dropout_keeps_the_expected_fraction_and_changes_with_the_step() -> Result<(), GraphError> {
    let x = Tensor::from_vec(&[100, 100], vec![1.0f32; 10_000]).unwrap();
    let op = Op::Dropout {
        keep_prob: 0.8,
        seed: 9,
    };
    let mut masks = Vec::new();
    for step in [0, 1] {
        let mut out = Tensor::zeros(DType::F32, &[100, 100]);
        let ctx = EvalCtx {
            node: "drop",
            step,
            placement: None,
            input_blocks: &[],
            deterministic: None,
        };
        eval_op(&op, &[&x], std::slice::from_mut(&mut out), &ctx)?;
        let values = out.as_f32().unwrap().to_vec();
        let kept = values.iter().filter(|&&v| v != 0.0).count();
        // Binomial(10000, 0.8): standard deviation 40.
        assert!((kept as i64 - 8000).abs() < 200, "kept {kept}");
        assert!(values.iter().all(|&v| v == 0.0 || (v - 1.25).abs() < 1e-6));
        masks.push(values);
    }
    assert_ne!(masks[0], masks[1], "each step draws a new mask");
    let misplaced = Placement {
        offset: &[99, 0],
        global_shape: &[100, 100],
    };
    let err = eval_op(
        &op,
        &[&x],
        &mut [Tensor::zeros(DType::F32, &[100, 100])],
        &EvalCtx {
            node: "drop",
            step: 0,
            placement: Some(misplaced),
            input_blocks: &[],
            deterministic: None,
        },
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "drop: region [99:199, 0:100] does not fit in the global shape [100, 100]"
    );
    Ok(())
}

#[test]
fn cross_entropy_shards_sum_to_the_global_mean() -> Result<(), GraphError> {
    let logits = uniform(&[8, 5], 1);
    let labels = indices(&[8], 5, 2);
    let ctx = EvalCtx {
        node: "loss",
        step: 0,
        placement: None,
        input_blocks: &[],
        deterministic: None,
    };
    let loss_op = Op::SparseSoftmaxCrossEntropy { batch_divisor: 8 };
    let grad_op = Op::SparseSoftmaxCrossEntropyGrad { batch_divisor: 8 };
    let dloss = Tensor::from_vec(&[], vec![1.0f64]).unwrap();
    let mut global = [Tensor::zeros(DType::F64, &[])];
    eval_op(&loss_op, &[&logits, &labels], &mut global, &ctx)?;
    let mut global_grad = [Tensor::zeros(DType::F64, &[8, 5])];
    eval_op(
        &grad_op,
        &[&logits, &labels, &dloss],
        &mut global_grad,
        &ctx,
    )?;
    let mut total = 0.0;
    let mut grads = Vec::new();
    for (start, rows) in [(0, 3), (3, 5)] {
        let local_logits = logits
            .extract_box(&SliceBox::new(vec![start, 0], vec![rows, 5]))
            .unwrap();
        let local_labels = labels
            .extract_box(&SliceBox::new(vec![start], vec![rows]))
            .unwrap();
        let mut loss = [Tensor::zeros(DType::F64, &[])];
        eval_op(&loss_op, &[&local_logits, &local_labels], &mut loss, &ctx)?;
        total += loss[0].to_f64_vec()[0];
        let mut grad = [Tensor::zeros(DType::F64, &[rows, 5])];
        eval_op(
            &grad_op,
            &[&local_logits, &local_labels, &dloss],
            &mut grad,
            &ctx,
        )?;
        let [grad] = grad;
        grads.push(grad);
    }
    let expected = global[0].to_f64_vec()[0];
    assert!((total - expected).abs() < 1e-12, "{total} vs {expected}");
    let joined = Tensor::concat(&grads, 0).unwrap().to_f64_vec();
    for (a, b) in joined.iter().zip(global_grad[0].to_f64_vec()) {
        assert!((a - b).abs() < 1e-15);
    }
    Ok(())
}

#[test]
fn rewrite_derives_a_local_graph() -> Result<(), GraphError> {
    let model = seed_mlp(8, &[4, 4], 16, 3)?;
    let g = &model.graph;
    // Data parallel over 2 ranks: the batch dim of the data is halved.
    let local_leaf = |_, v: &graph::Value| {
        let mut shape = v.shape.clone();
        if v.kind == graph::ValueKind::Input {
            shape[0] /= 2;
        }
        shape
    };
    let local = g.rewrite(local_leaf, |_, node| match &node.op {
        Op::Flatten { shape } => Op::Flatten {
            shape: vec![shape[0] / 2, shape[1]],
        },
        op => op.clone(),
    })?;
    assert_eq!(
        local.value(local.value_by_name("matmul1").unwrap())?.shape,
        [4, 16]
    );
    assert_eq!(local.value(model.loss)?.shape, [] as [usize; 0]);
    // The divisor stays global.
    assert_eq!(
        local.node(local.node_by_name("loss").unwrap())?.op,
        Op::SparseSoftmaxCrossEntropy { batch_divisor: 8 }
    );
    // Forgetting to rewrite a shape attribute is reported at its node.
    let err = g
        .rewrite(local_leaf, |_, node| node.op.clone())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "flatten: attribute `shape` is [8, 16], but flattening `x` [4, 4, 4] gives [4, 16]"
    );
    Ok(())
}

#[test]
fn eval_op_rejects_bad_operands_without_panicking() {
    let ctx = EvalCtx {
        node: "mm",
        step: 0,
        placement: None,
        input_blocks: &[],
        deterministic: None,
    };
    let op = Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    let v = Tensor::from_vec(&[3], vec![1.0f32; 3]).unwrap();
    let m = Tensor::zeros(DType::F32, &[3, 3]);
    let mut out = [Tensor::zeros(DType::F32, &[3, 3])];
    let err = eval_op(&op, &[&m], &mut out, &ctx).unwrap_err();
    assert_eq!(err.to_string(), "mm: MatMul takes 2 inputs, got 1");
    let err = eval_op(&op, &[&v, &m], &mut out, &ctx).unwrap_err();
    assert!(err.to_string().contains("needs at least 2 dims"), "{err}");
    let err = eval_op(
        &op,
        &[&m, &m],
        &mut [Tensor::zeros(DType::F32, &[2, 3])],
        &ctx,
    )
    .unwrap_err();
    assert!(matches!(err, GraphError::Kernel { .. }), "{err}");
    let err = eval_op(
        &op,
        &[&m, &m],
        &mut [Tensor::zeros(DType::I32, &[3, 3])],
        &ctx,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "mm: MatMul cannot execute on dtype i32 (the executor computes in f32 and f64, and in bf16 and f16 through f32)"
    );
    let err = eval_op(&op, &[&m, &m], &mut [], &ctx).unwrap_err();
    assert_eq!(
        err.to_string(),
        "mm: MatMul produces 1 outputs, got 0 output buffers"
    );
}

#[test]
fn triu_blocks_hold_the_values_of_the_whole() {
    let shape = [2, 5, 6];
    for diagonal in [-2, 0, 1, 4] {
        let op = Op::Triu {
            shape: shape.to_vec(),
            diagonal,
            dtype: DType::F32,
        };
        let mut whole = Tensor::zeros(DType::F32, &shape);
        eval_op(&op, &[], std::slice::from_mut(&mut whole), &ctx(None)).unwrap();
        let values = whole.as_f32().unwrap();
        for (k, &v) in values.iter().enumerate() {
            let (i, j) = ((k / 6 % 5) as i64, (k % 6) as i64);
            assert_eq!(v, if j - i >= diagonal { 1.0 } else { 0.0 }, "{k}");
        }
        let region = SliceBox::new(vec![1, 2, 3], vec![1, 3, 2]);
        let mut block = Tensor::zeros(DType::F32, &region.shape);
        let placement = Placement {
            offset: &region.offset,
            global_shape: &shape,
        };
        eval_op(
            &op,
            &[],
            std::slice::from_mut(&mut block),
            &ctx(Some(placement)),
        )
        .unwrap();
        assert_eq!(
            block,
            whole.extract_box(&region).unwrap(),
            "diagonal {diagonal}"
        );
    }
}

#[test]
fn flash_attention_masks_a_block_by_its_global_positions() {
    use graph::InputBlock;
    use tensor::kernels::{self, AttentionDims, AttentionParams};
    let op = Op::FlashAttention {
        causal: true,
        scale: 0.5,
    };
    let values = |n: usize, shift: f64| {
        (0..n)
            .map(|i| ((i as f64) * 0.37 + shift).sin())
            .collect::<Vec<f64>>()
    };
    let shape = [1, 2, 6, 3];
    let (q, k, v) = (values(36, 0.0), values(36, 1.0), values(36, 2.0));
    let t = |s: &[usize], x: &[f64]| Tensor::from_vec(s, x.to_vec()).unwrap();
    let (qt, kt, vt) = (t(&shape, &q), t(&shape, &k), t(&shape, &v));
    let mut whole = [
        Tensor::zeros(DType::F64, &shape),
        Tensor::zeros(DType::F64, &[1, 2, 6]),
    ];
    eval_op(&op, &[&qt, &kt, &vt], &mut whole, &ctx(None)).unwrap();
    // Query rows 2..5 of the sequence (both heads) against every key.
    let rows = SliceBox::new(vec![0, 0, 2, 0], vec![1, 2, 3, 3]);
    let q_block = qt.extract_box(&rows).unwrap();
    let mut block = [
        Tensor::zeros(DType::F64, &rows.shape),
        Tensor::zeros(DType::F64, &[1, 2, 3]),
    ];
    let placement = Placement {
        offset: &rows.offset,
        global_shape: &shape,
    };
    eval_op(
        &op,
        &[&q_block, &kt, &vt],
        &mut block,
        &ctx(Some(placement)),
    )
    .unwrap();
    assert_eq!(block[0], whole[0].extract_box(&rows).unwrap());
    // Keys 3..6 only, given as input 1's block: the kernel's partial result at offset 3.
    let keys = SliceBox::new(vec![0, 0, 3, 0], vec![1, 2, 3, 3]);
    let (k_block, v_block) = (
        kt.extract_box(&keys).unwrap(),
        vt.extract_box(&keys).unwrap(),
    );
    let block_of = |b: &SliceBox| InputBlock {
        offset: b.offset.to_vec(),
        global_shape: shape.to_vec(),
    };
    let blocks = [InputBlock::default(), block_of(&keys), block_of(&keys)];
    let block_ctx = EvalCtx {
        input_blocks: &blocks,
        ..ctx(None)
    };
    let mut partial = [
        Tensor::zeros(DType::F64, &shape),
        Tensor::zeros(DType::F64, &[1, 2, 6]),
    ];
    eval_op(&op, &[&qt, &k_block, &v_block], &mut partial, &block_ctx).unwrap();
    let dims = AttentionDims {
        slices: 2,
        q_len: 6,
        kv_len: 3,
        head_dim: 3,
    };
    let params = AttentionParams {
        k_offset: 3,
        ..AttentionParams::new(true, 0.5)
    };
    let (mut out, mut lse) = (vec![0.0; 36], vec![0.0; 12]);
    let (kb, vb) = (k_block.to_f64_vec(), v_block.to_f64_vec());
    kernels::flash_attention_into((&q, &kb, &vb), dims, params, &mut out, &mut lse).unwrap();
    assert_eq!(partial[0].to_f64_vec(), out);
    // Rows 0..3 see none of keys 3..6.
    let lse_got = partial[1].to_f64_vec();
    assert!(lse_got[..3].iter().all(|&x| x == f64::NEG_INFINITY) && lse_got[3].is_finite());
}

#[test]
fn embedding_blocks_of_rows_sum_to_the_lookup_and_scatter_into_their_rows() {
    use graph::InputBlock;
    let table = Tensor::from_vec(&[6, 2], (0..12).map(|i| i as f64).collect()).unwrap();
    let ids = Tensor::from_vec(&[4], vec![5i32, 0, 3, 3]).unwrap();
    let dy = Tensor::from_vec(&[4, 2], (0..8).map(|i| 1.0 + i as f64).collect()).unwrap();
    let whole = |op: &Op, inputs: &[&Tensor], shape: &[usize]| {
        let mut out = [Tensor::zeros(DType::F64, shape)];
        eval_op(op, inputs, &mut out, &ctx(None)).unwrap();
        let [out] = out;
        out
    };
    let lookup = whole(&Op::Embedding, &[&table, &ids], &[4, 2]);
    let grad = whole(&Op::EmbeddingGrad, &[&table, &ids, &dy], &[6, 2]);
    let mut summed = vec![0.0; 8];
    let mut assembled = Tensor::zeros(DType::F64, &[6, 2]);
    for first in [0, 3] {
        let region = SliceBox::new(vec![first, 0], vec![3, 2]);
        let block = table.extract_box(&region).unwrap();
        let blocks = [
            InputBlock {
                offset: region.offset.to_vec(),
                global_shape: vec![6, 2],
            },
            InputBlock::default(),
            InputBlock::default(),
        ];
        let placement = Placement {
            offset: &region.offset,
            global_shape: &[6, 2],
        };
        let c = EvalCtx {
            input_blocks: &blocks,
            deterministic: None,
            ..ctx(Some(placement))
        };
        let mut out = [Tensor::zeros(DType::F64, &[4, 2])];
        eval_op(&Op::Embedding, &[&block, &ids], &mut out, &c).unwrap();
        for (s, x) in summed.iter_mut().zip(out[0].to_f64_vec()) {
            *s += x;
        }
        let mut g = [Tensor::zeros(DType::F64, &[3, 2])];
        eval_op(&Op::EmbeddingGrad, &[&block, &ids, &dy], &mut g, &c).unwrap();
        assembled.insert_box(&region, &g[0]).unwrap();
        // An id past the whole table is an error on every block, not a silent zero.
        let bad = Tensor::from_vec(&[4], vec![5i32, 6, 0, 0]).unwrap();
        let err = eval_op(&Op::Embedding, &[&block, &bad], &mut out, &c).unwrap_err();
        assert!(err.to_string().contains('6'), "{err}");
    }
    assert_eq!(summed, lookup.to_f64_vec());
    assert_eq!(assembled.to_f64_vec(), grad.to_f64_vec());
}
