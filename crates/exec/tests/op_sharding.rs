//! Ops under random valid strategies on a local cluster compute what one device computes: the
//! forward output and the gradient of every input.
//!
//! Each case builds a tiny f64 graph `y = op(params…)` with the loss `sum(y · probe)` (a frozen
//! random `probe`, so every element of `y` has its own weight), shards the op under test with a
//! random strategy that the op's rules accept, and compares `y` and every parameter gradient with
//! the unsharded run.

use std::sync::Arc;

use comm::{Communicator, LocalCluster};
use exec::RankExecutor;
use graph::{Graph, GraphBuilder, GraphError, Initializer, ValueId};
use parallel::{lower, place, LowerRequest, ParallelConfig, ParallelMode};
use proptest::prelude::*;
use tensor::{DType, Tensor};

/// A forward graph under test: `y`, and the scalar loss.
struct Case {
    graph: Graph,
    y: ValueId,
    loss: ValueId,
}

/// Builds a case: `build` creates f64 parameters and returns `y` (the probe takes `y`'s dtype).
fn case(build: impl FnOnce(&mut GraphBuilder) -> Result<ValueId, GraphError>) -> Case {
    let mut b = GraphBuilder::with_float_dtype(DType::F64);
    let y = build(&mut b).unwrap();
    let (shape, dtype) = {
        let v = b.value(y).unwrap();
        (v.shape.clone(), v.dtype)
    };
    let probe = b
        .parameter_with("probe", &shape, dtype, Initializer::normal(1.0), false)
        .unwrap();
    let weighted = b.mul("probe_mul", y, probe).unwrap();
    let loss = b.reduce_sum("probe_sum", weighted, &[], false).unwrap();
    Case {
        graph: b.finish(),
        y,
        loss,
    }
}

/// A trainable f64 parameter drawn from N(0, 1).
fn param(b: &mut GraphBuilder, name: &str, shape: &[usize]) -> Result<ValueId, GraphError> {
    b.parameter(name, shape, Initializer::normal(1.0))
}

/// `y` gathered whole and every trainable parameter's global gradient under `config`.
fn run(case: &Case, config: &ParallelConfig) -> (Tensor, Vec<Tensor>) {
    let trainable = case.graph.trainable_parameters();
    let training = graph::grad(&case.graph, case.loss, &trainable).unwrap();
    let grads = trainable
        .iter()
        .map(|&p| (p, training.grad_of(p).unwrap()))
        .collect();
    let request = LowerRequest {
        grads,
        replicated_outputs: vec![case.loss, case.y],
    };
    let program = Arc::new(lower(&place(&training.graph, config).unwrap(), &request).unwrap());
    let results = LocalCluster::new(program.devices()).unwrap().run(|comm| {
        let world: Arc<dyn Communicator> = Arc::new(comm);
        let mut exec = RankExecutor::new(program.clone(), world).unwrap();
        exec.init_parameters(5).unwrap();
        exec.run().unwrap();
        let grads: Vec<_> = (0..program.params.len())
            .filter(|&i| program.params[i].trainable)
            .map(|i| {
                let b = exec.box_of(&program.params[i].layout).unwrap();
                (i, b, exec.grad(i).unwrap().clone())
            })
            .collect();
        (exec.output(1).clone(), grads)
    });
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    let y = results[0].0.clone();
    let mut grads: Vec<Tensor> = Vec::new();
    for (k, (i, _, _)) in results[0].1.iter().enumerate() {
        let shape = program.params[*i].layout.shape();
        let mut g = Tensor::zeros(results[0].1[k].2.dtype(), shape);
        for r in &results {
            let (_, region, piece) = &r.1[k];
            g.insert_box(region, piece).unwrap();
        }
        grads.push(g);
    }
    (y, grads)
}

fn assert_close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-9 * (1.0 + y.abs()),
            "{what}[{i}]: sharded {x} vs one device {y}"
        );
    }
}

/// Runs `case` with `op` sharded by `strategy` on `devices` devices and on one device.
fn check(case: &Case, op: &str, strategy: &[Vec<usize>], devices: usize) {
    let (y1, grads1) = run(case, &ParallelConfig::stand_alone());
    let tuples: Vec<&[usize]> = strategy.iter().map(Vec::as_slice).collect();
    let config = ParallelConfig::new(ParallelMode::SemiAuto, devices).shard(op, &tuples);
    let (y, grads) = run(case, &config);
    let label = format!("{op} {strategy:?} on {devices} devices");
    assert_close(&y, &y1, &format!("{label}: y"));
    assert_eq!(grads.len(), grads1.len());
    for (i, (g, g1)) in grads.iter().zip(&grads1).enumerate() {
        assert_close(g, g1, &format!("{label}: grad {i}"));
    }
}

/// A strategy for `shape`: per dim `2^wanted[d]` pieces, cut down so that every factor divides
/// its dim, the product divides `devices`, and dims in `whole` stay unsplit.
fn fit(shape: &[usize], wanted: &[u32], devices: usize, whole: &[usize]) -> Vec<usize> {
    let mut left = devices;
    shape
        .iter()
        .enumerate()
        .map(|(d, &size)| {
            let mut f = 1usize << wanted.get(d).copied().unwrap_or(0);
            while f > 1 && (whole.contains(&d) || size % f != 0 || !left.is_multiple_of(f)) {
                f /= 2;
            }
            left /= f;
            f
        })
        .collect()
}

fn devices() -> impl Strategy<Value = usize> {
    prop_oneof![Just(2usize), Just(4), Just(8)]
}

fn exponents(n: usize) -> impl Strategy<Value = Vec<u32>> {
    proptest::collection::vec(0u32..=3, n)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn masked_fill_with_a_causal_triu_mask(devices in devices(), e in exponents(3), diagonal in -1i64..=2) {
        let c = case(|b| {
            let x = param(b, "x", &[4, 4, 8])?;
            let mask = b.triu("mask", &[4, 8], diagonal)?;
            b.masked_fill("fill", x, mask, -3.0)
        });
        let sx = fit(&[4, 4, 8], &e, devices, &[]);
        check(&c, "fill", &[sx.clone(), sx[1..].to_vec()], devices);
    }

    #[test]
    fn where_with_a_broadcast_condition(devices in devices(), e in exponents(3)) {
        let c = case(|b| {
            let x = param(b, "x", &[4, 4, 8])?;
            let y = param(b, "y", &[4, 4, 8])?;
            let cond = b.triu("cond", &[4, 8], 2)?;
            b.select("where", cond, x, y)
        });
        let sx = fit(&[4, 4, 8], &e, devices, &[]);
        check(&c, "where", &[sx[1..].to_vec(), sx.clone(), sx], devices);
    }

    #[test]
    fn concat_with_its_axis_whole(devices in devices(), e in exponents(3), axis in 0usize..3) {
        let mut a = vec![4, 4, 8];
        let mut b2 = a.clone();
        a[axis] = 2;
        b2[axis] = 6;
        let c = case(|b| {
            let x0 = param(b, "x0", &a)?;
            let x1 = param(b, "x1", &b2)?;
            let x2 = param(b, "x2", &a)?;
            b.concat("concat", &[x0, x1, x2], axis)
        });
        let s = fit(&a, &e, devices, &[axis]);
        check(&c, "concat", &[s.clone(), s.clone(), s], devices);
    }

    #[test]
    fn split_with_an_unused_piece(devices in devices(), e in exponents(3), axis in 0usize..3) {
        let mut shape = vec![4, 4, 8];
        shape[axis] = 6;
        let c = case(|b| {
            let x = param(b, "x", &shape)?;
            let p = b.split("split", x, axis, &[1, 2, 3])?;
            b.concat("join", &[p[2], p[0]], axis)
        });
        check(&c, "split", &[fit(&shape, &e, devices, &[axis])], devices);
    }

    #[test]
    fn strided_slice_splits_only_whole_dims(
        devices in devices(),
        e in exponents(3),
        sliced in proptest::collection::vec((any::<bool>(), 0usize..2, 1usize..=3), 3),
    ) {
        let shape = [4, 6, 8];
        let (mut begin, mut end, mut strides, mut cut) = (vec![], vec![], vec![], vec![]);
        for (d, &(is_sliced, b0, step)) in sliced.iter().enumerate() {
            let (b, s) = if is_sliced { (b0, step) } else { (0, 1) };
            begin.push(b);
            end.push(shape[d] - usize::from(is_sliced && step == 1));
            strides.push(s);
            if is_sliced {
                cut.push(d);
            }
        }
        let c = case(|b| {
            let x = param(b, "x", &shape)?;
            b.strided_slice("slice", x, &begin, &end, &strides)
        });
        check(&c, "slice", &[fit(&shape, &e, devices, &cut)], devices);
    }

    #[test]
    fn cast_keeps_its_input_layout(devices in devices(), e in exponents(3), to_bf16 in any::<bool>()) {
        let dtype = if to_bf16 { DType::BF16 } else { DType::F32 };
        let c = case(|b| {
            let x = param(b, "x", &[4, 4, 8])?;
            let low = b.cast("cast", x, dtype)?;
            // Back to f64 so the loss runs in a compute dtype.
            b.cast("back", low, DType::F64)
        });
        check(&c, "cast", &[fit(&[4, 4, 8], &e, devices, &[])], devices);
    }

    #[test]
    fn scaled_softmax_any_split_but_the_last_dim(devices in devices(), e in exponents(3)) {
        let c = case(|b| {
            let x = param(b, "x", &[4, 4, 8])?;
            b.scaled_softmax("attn", x, 0.4)
        });
        check(&c, "attn", &[fit(&[4, 4, 8], &e, devices, &[2])], devices);
    }
}

// The rules of the older ops a GPT uses, under random strategies.
proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Attention's products: batch and head dims, rows, the reduction dim and columns split at
    /// random (the reduction dim's split leaves a pending sum).
    #[test]
    fn batch_matmul_with_split_batch_head_and_reduction_dims(
        devices in devices(),
        e in exponents(5),
        transpose_b in any::<bool>(),
    ) {
        let (b_shape, k_dim): (&[usize], usize) = if transpose_b {
            (&[2, 4, 8, 4], 3)
        } else {
            (&[2, 4, 4, 8], 2)
        };
        let c = case(|b| {
            let q = param(b, "q", &[2, 4, 8, 4])?;
            let k = param(b, "k", b_shape)?;
            b.batch_matmul("scores", q, k, false, transpose_b)
        });
        // [batch, heads, rows, reduction] for q; k follows on batch, heads and reduction.
        let sq = fit(&[2, 4, 8, 4], &e[..4], devices, &[]);
        let left = devices / sq.iter().product::<usize>();
        let cols = fit(&[8], &e[4..], left, &[])[0];
        let mut sk = vec![sq[0], sq[1], 1, 1];
        sk[k_dim] = sq[3];
        sk[if transpose_b { 2 } else { 3 }] = cols;
        check(&c, "scores", &[sq, sk], devices);
    }

    /// A linear layer on `[B, S, H]` with a 2-D weight used transposed: the weight's gradient is
    /// one BatchMatMulSum, whatever dims the strategy splits.
    #[test]
    fn batch_matmul_with_a_shared_weight(devices in devices(), e in exponents(4)) {
        let c = case(|b| {
            let x = param(b, "x", &[4, 8, 8])?;
            let w = param(b, "w", &[16, 8])?;
            b.batch_matmul("linear", x, w, false, true)
        });
        let sx = fit(&[4, 8, 8], &e[..3], devices, &[]);
        let left = devices / sx.iter().product::<usize>();
        let out = fit(&[16], &e[3..], left, &[])[0];
        check(&c, "linear", &[sx.clone(), vec![out, sx[2]]], devices);
    }

    /// Softmax over the last dim with the batch and head dims split.
    #[test]
    fn softmax_with_split_batch_and_head_dims(devices in devices(), e in exponents(3)) {
        let c = case(|b| {
            let x = param(b, "x", &[4, 4, 8])?;
            b.softmax("softmax", x)
        });
        check(&c, "softmax", &[fit(&[4, 4, 8], &e, devices, &[2])], devices);
    }

    /// The fused attention with the batch and head dims of q, k and v split alike (its output
    /// and its gradients, causal or not).
    #[test]
    fn flash_attention_with_split_batch_and_head_dims(
        devices in devices(),
        e in exponents(4),
        causal in any::<bool>(),
    ) {
        let c = case(|b| {
            let q = param(b, "q", &[2, 4, 6, 4])?;
            let k = param(b, "k", &[2, 4, 6, 4])?;
            let v = param(b, "v", &[2, 4, 6, 4])?;
            Ok(b.flash_attention("flash", (q, k, v), causal, 0.5)?.0)
        });
        let s = fit(&[2, 4, 6, 4], &e, devices, &[2, 3]);
        check(&c, "flash", &[s.clone(), s.clone(), s], devices);
    }

    /// The packed attention with the batch and head dims of `qkv [B, S, N, 3·d]` split (its
    /// output and its gradient, causal or not); the sequence and the q|k|v dims whole.
    #[test]
    fn packed_attention_with_split_batch_and_head_dims(
        devices in devices(),
        e in exponents(4),
        causal in any::<bool>(),
    ) {
        let c = case(|b| {
            let qkv = param(b, "qkv", &[4, 6, 4, 12])?;
            Ok(b.packed_attention("packed", qkv, causal, 0.5)?.0)
        });
        check(&c, "packed", &[fit(&[4, 6, 4, 12], &e, devices, &[1, 3])], devices);
    }

    /// LayerNorm with its batch and sequence dims split (sequence parallelism), gamma and beta
    /// whole.
    #[test]
    fn layer_norm_with_split_batch_and_sequence_dims(devices in devices(), e in exponents(3)) {
        let c = case(|b| {
            let x = param(b, "x", &[4, 8, 8])?;
            let gamma = param(b, "gamma", &[8])?;
            let beta = param(b, "beta", &[8])?;
            b.layer_norm("ln", x, gamma, beta, 1e-5)
        });
        check(&c, "ln", &[fit(&[4, 8, 8], &e, devices, &[2]), vec![1], vec![1]], devices);
    }
}
