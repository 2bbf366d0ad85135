//! Fused attention against a naive reference (scores materialised, masked, softmaxed,
//! multiplied), forward and backward, causal or not, at sizes that are not multiples of the
//! tiles; key/value blocks processed one by one in any order (ring attention) against one call;
//! rows that see no key; the bits on one and two threads and on any split of the slices.

use tensor::kernels::{self, AttentionDims, AttentionParams, AttentionState};
use tensor::{Tensor, TensorError};

use super::reference::{assert_close, to_f32, Rng};

/// One case's inputs (f64) and sizes.
struct Case {
    dims: AttentionDims,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    dout: Vec<f64>,
}

fn case(seed: u64, slices: usize, q_len: usize, kv_len: usize, head_dim: usize) -> Case {
    let mut rng = Rng::new(seed);
    let dims = AttentionDims {
        slices,
        q_len,
        kv_len,
        head_dim,
    };
    Case {
        dims,
        q: rng.vec(slices * q_len * head_dim, -2.0, 2.0),
        k: rng.vec(slices * kv_len * head_dim, -2.0, 2.0),
        v: rng.vec(slices * kv_len * head_dim, -1.0, 1.0),
        dout: rng.vec(slices * q_len * head_dim, -1.0, 1.0),
    }
}

/// The reference's results: output, log-sum-exp, and the three gradients.
struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

/// The textbook attention: per slice the full `[q_len, kv_len]` scores, the mask by global
/// positions, softmax, product; the backward through the materialised probabilities.
fn reference(c: &Case, p: AttentionParams<f64>) -> Reference {
    let AttentionDims {
        slices,
        q_len: sq,
        kv_len: sk,
        head_dim: d,
    } = c.dims;
    let mut r = Reference {
        out: vec![0.0; slices * sq * d],
        lse: vec![f64::NEG_INFINITY; slices * sq],
        dq: vec![0.0; slices * sq * d],
        dk: vec![0.0; slices * sk * d],
        dv: vec![0.0; slices * sk * d],
    };
    for s in 0..slices {
        let q = |i: usize, x: usize| c.q[(s * sq + i) * d + x];
        let k = |j: usize, x: usize| c.k[(s * sk + j) * d + x];
        let v = |j: usize, x: usize| c.v[(s * sk + j) * d + x];
        let dout = |i: usize, x: usize| c.dout[(s * sq + i) * d + x];
        let visible = |i: usize, j: usize| !p.causal || p.k_offset + j <= p.q_offset + i;
        // Probabilities, zero where masked (a row with no visible key is all zero).
        let mut probs = vec![0.0; sq * sk];
        for i in 0..sq {
            let scores: Vec<f64> = (0..sk)
                .map(|j| {
                    if visible(i, j) {
                        p.scale * (0..d).map(|x| q(i, x) * k(j, x)).sum::<f64>()
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if max == f64::NEG_INFINITY {
                continue;
            }
            let total: f64 = scores.iter().map(|&x| (x - max).exp()).sum();
            r.lse[s * sq + i] = max + total.ln();
            for j in 0..sk {
                probs[i * sk + j] = (scores[j] - max).exp() / total;
            }
        }
        for i in 0..sq {
            for x in 0..d {
                r.out[(s * sq + i) * d + x] = (0..sk).map(|j| probs[i * sk + j] * v(j, x)).sum();
            }
        }
        // dP = dO·Vᵀ; dS = P ∘ (dP − rowsum(P ∘ dP)).
        for i in 0..sq {
            let dp: Vec<f64> = (0..sk)
                .map(|j| (0..d).map(|x| dout(i, x) * v(j, x)).sum())
                .collect();
            let inner: f64 = (0..sk).map(|j| probs[i * sk + j] * dp[j]).sum();
            for j in 0..sk {
                let pij = probs[i * sk + j];
                let ds = pij * (dp[j] - inner);
                for x in 0..d {
                    r.dq[(s * sq + i) * d + x] += p.scale * ds * k(j, x);
                    r.dk[(s * sk + j) * d + x] += p.scale * ds * q(i, x);
                    r.dv[(s * sk + j) * d + x] += pij * dout(i, x);
                }
            }
        }
    }
    r
}

/// The kernels' results in f64.
fn fused(c: &Case, p: AttentionParams<f64>) -> Reference {
    let dims = c.dims;
    let mut out = vec![0.0; c.q.len()];
    let mut lse = vec![0.0; dims.slices * dims.q_len];
    kernels::flash_attention_into((&c.q, &c.k, &c.v), dims, p, &mut out, &mut lse).unwrap();
    let (mut dq, mut dk, mut dv) = (
        vec![0.0; c.q.len()],
        vec![0.0; c.k.len()],
        vec![0.0; c.v.len()],
    );
    let input = kernels::AttentionGradInputs {
        q: &c.q,
        k: &c.k,
        v: &c.v,
        out: &out,
        lse: &lse,
        dout: &c.dout,
    };
    let grads = kernels::AttentionGradBuffers {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    kernels::flash_attention_grad_into(input, dims, p, grads).unwrap();
    Reference {
        out,
        lse,
        dq,
        dk,
        dv,
    }
}

/// `(slices, q_len, kv_len, head_dim)`: single elements, tile-sized, odd sizes across several
/// tiles, more queries than keys and the reverse.
const SIZES: [(usize, usize, usize, usize); 6] = [
    (1, 1, 1, 1),
    (2, 64, 64, 8),
    (2, 70, 70, 5),
    (3, 65, 130, 17),
    (2, 130, 67, 8),
    (1, 3, 200, 3),
];

/// [`assert_close`] for log-sum-exps: `-inf` (a row that sees no key) must match exactly.
#[track_caller]
fn assert_lse(got: &[f64], want: &[f64], rtol: f64, atol: f64, what: &str) {
    let finite = |x: &[f64]| -> Vec<f64> {
        x.iter()
            .map(|&v| if v == f64::NEG_INFINITY { -1e300 } else { v })
            .collect()
    };
    assert_close(&finite(got), &finite(want), rtol, atol, what);
}

#[track_caller]
fn assert_results(got: &Reference, want: &Reference, rtol: f64, atol: f64, what: &str) {
    assert_close(&got.out, &want.out, rtol, atol, &format!("{what}: out"));
    assert_lse(&got.lse, &want.lse, rtol, atol, &format!("{what}: lse"));
    assert_close(&got.dq, &want.dq, rtol, atol, &format!("{what}: dq"));
    assert_close(&got.dk, &want.dk, rtol, atol, &format!("{what}: dk"));
    assert_close(&got.dv, &want.dv, rtol, atol, &format!("{what}: dv"));
}

#[test]
fn f64_forward_and_backward_match_the_reference() {
    for (n, &(slices, sq, sk, d)) in SIZES.iter().enumerate() {
        let c = case(n as u64, slices, sq, sk, d);
        for causal in [false, true] {
            let p = AttentionParams::new(causal, 1.0 / (d as f64).sqrt());
            let what = format!("{slices}x{sq}x{sk}x{d} causal {causal}");
            assert_results(&fused(&c, p), &reference(&c, p), 1e-10, 1e-12, &what);
        }
    }
}

#[test]
fn f32_forward_and_backward_match_the_reference() {
    for (n, &(slices, sq, sk, d)) in SIZES.iter().enumerate() {
        let c = case(10 + n as u64, slices, sq, sk, d);
        for causal in [false, true] {
            let p = AttentionParams::new(causal, 1.0 / (d as f64).sqrt());
            let want = reference(&c, p);
            let p32 = AttentionParams::new(causal, p.scale as f32);
            let (q, k, v, dout) = (to_f32(&c.q), to_f32(&c.k), to_f32(&c.v), to_f32(&c.dout));
            let mut out = vec![0f32; q.len()];
            let mut lse = vec![0f32; slices * sq];
            kernels::flash_attention_into((&q, &k, &v), c.dims, p32, &mut out, &mut lse).unwrap();
            let (mut dq, mut dk, mut dv) = (
                vec![0f32; q.len()],
                vec![0f32; k.len()],
                vec![0f32; v.len()],
            );
            let input = kernels::AttentionGradInputs {
                q: &q,
                k: &k,
                v: &v,
                out: &out,
                lse: &lse,
                dout: &dout,
            };
            let grads = kernels::AttentionGradBuffers {
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            };
            kernels::flash_attention_grad_into(input, c.dims, p32, grads).unwrap();
            let widen = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
            let got = Reference {
                out: widen(&out),
                lse: widen(&lse),
                dq: widen(&dq),
                dk: widen(&dk),
                dv: widen(&dv),
            };
            let what = format!("f32 {slices}x{sq}x{sk}x{d} causal {causal}");
            assert_results(&got, &want, 1e-5, 1e-5, &what);
        }
    }
}

/// The key/value rows `range` of every slice of `x` (`[slices, len, d]`).
fn rows_of(
    x: &[f64],
    slices: usize,
    len: usize,
    d: usize,
    range: std::ops::Range<usize>,
) -> Vec<f64> {
    (0..slices)
        .flat_map(|s| x[(s * len + range.start) * d..(s * len + range.end) * d].to_vec())
        .collect()
}

/// Query block at global positions 64..114 against keys 0..150 cut into three blocks: the last
/// block (100..150) is hidden from the rows before 100, the first seen by all.
const Q_OFFSET: usize = 64;
const BLOCKS: [std::ops::Range<usize>; 3] = [0..40, 40..100, 100..150];
const ORDERS: [[usize; 3]; 4] = [[0, 1, 2], [2, 0, 1], [1, 2, 0], [2, 1, 0]];

#[test]
fn key_value_blocks_in_any_order_give_the_one_call_result() {
    let c = case(30, 3, 50, 150, 9);
    let (slices, sq, sk, d) = (3, 50, 150, 9);
    let scale = 1.0 / 3.0;
    let whole = AttentionParams {
        q_offset: Q_OFFSET,
        ..AttentionParams::new(true, scale)
    };
    let want = fused(&c, whole);
    assert_results(&want, &reference(&c, whole), 1e-10, 1e-12, "offset queries");
    let block_params = |b: usize| AttentionParams {
        q_offset: Q_OFFSET,
        k_offset: BLOCKS[b].start,
        ..AttentionParams::new(true, scale)
    };
    let block_dims = |b: usize| AttentionDims {
        kv_len: BLOCKS[b].len(),
        ..c.dims
    };
    let k_of = |b: usize| rows_of(&c.k, slices, sk, d, BLOCKS[b].clone());
    let v_of = |b: usize| rows_of(&c.v, slices, sk, d, BLOCKS[b].clone());
    // The partial result of every block alone: finite everywhere, `-inf` lse for hidden rows.
    let partial: Vec<(Vec<f64>, Vec<f64>)> = (0..3)
        .map(|b| {
            let (mut out, mut lse) = (vec![0.0; c.q.len()], vec![0.0; slices * sq]);
            kernels::flash_attention_into(
                (&c.q, &k_of(b), &v_of(b)),
                block_dims(b),
                block_params(b),
                &mut out,
                &mut lse,
            )
            .unwrap();
            assert!(out.iter().all(|x| x.is_finite()), "block {b}: out");
            (out, lse)
        })
        .collect();
    for s in 0..slices {
        for i in 0..sq {
            let hidden = Q_OFFSET + i < BLOCKS[2].start;
            assert_eq!(
                partial[2].1[s * sq + i] == f64::NEG_INFINITY,
                hidden,
                "row {i}"
            );
        }
    }
    for order in ORDERS {
        // A running state, one block at a time.
        let mut state = AttentionState::new(slices, sq, d).unwrap();
        for &b in &order {
            state
                .accumulate((&c.q, &k_of(b), &v_of(b)), BLOCKS[b].len(), block_params(b))
                .unwrap();
        }
        let (mut out, mut lse) = (vec![0.0; c.q.len()], vec![0.0; slices * sq]);
        state.finish_into(&mut out, &mut lse).unwrap();
        assert_close(
            &out,
            &want.out,
            1e-12,
            1e-14,
            &format!("{order:?}: state out"),
        );
        assert_lse(
            &lse,
            &want.lse,
            1e-12,
            1e-14,
            &format!("{order:?}: state lse"),
        );
        // Partial results merged.
        let (mut out, mut lse) = partial[order[0]].clone();
        for &b in &order[1..] {
            kernels::merge_attention_into(&mut out, &mut lse, &partial[b].0, &partial[b].1, d)
                .unwrap();
        }
        assert_close(
            &out,
            &want.out,
            1e-12,
            1e-14,
            &format!("{order:?}: merged out"),
        );
        assert_lse(
            &lse,
            &want.lse,
            1e-12,
            1e-14,
            &format!("{order:?}: merged lse"),
        );
        // The backward per block: dq accumulated, each block's dk and dv in place.
        let mut delta = vec![0.0; slices * sq];
        kernels::attention_delta_into(&want.out, &c.dout, d, &mut delta).unwrap();
        let mut dq = vec![0.0; c.q.len()];
        let (mut dk, mut dv) = (vec![f64::NAN; c.k.len()], vec![f64::NAN; c.v.len()]);
        for &b in &order {
            let (kb, vb) = (k_of(b), v_of(b));
            let (mut dkb, mut dvb) = (vec![f64::NAN; kb.len()], vec![f64::NAN; vb.len()]);
            let input = kernels::BlockGradInputs {
                q: &c.q,
                k: &kb,
                v: &vb,
                dout: &c.dout,
                lse: &want.lse,
                delta: &delta,
            };
            let grads = kernels::AttentionGradBuffers {
                dq: &mut dq,
                dk: &mut dkb,
                dv: &mut dvb,
            };
            kernels::attention_backward_block(input, block_dims(b), block_params(b), grads)
                .unwrap();
            let len = BLOCKS[b].len();
            for s in 0..slices {
                let at = (s * sk + BLOCKS[b].start) * d;
                dk[at..at + len * d].copy_from_slice(&dkb[s * len * d..(s + 1) * len * d]);
                dv[at..at + len * d].copy_from_slice(&dvb[s * len * d..(s + 1) * len * d]);
            }
        }
        assert_close(&dq, &want.dq, 1e-12, 1e-14, &format!("{order:?}: dq"));
        assert_close(&dk, &want.dk, 1e-12, 1e-14, &format!("{order:?}: dk"));
        assert_close(&dv, &want.dv, 1e-12, 1e-14, &format!("{order:?}: dv"));
    }
}

/// The accumulating backward adds a key block's gradients into accumulators that already hold
/// something: split into two query blocks, each adding its part, it gives the initial values
/// plus the gradients one call over all the queries writes.
#[test]
fn the_accumulating_block_backward_adds_each_query_block_s_part() {
    let c = case(31, 3, 50, 150, 9);
    let (slices, sq, sk, d) = (3, 50, 150, 9);
    let params = |q_offset: usize, k_offset: usize| AttentionParams {
        q_offset,
        k_offset,
        ..AttentionParams::new(true, 1.0 / 3.0)
    };
    let whole = params(Q_OFFSET, 0);
    let want = fused(&c, whole);
    let mut delta = vec![0.0; slices * sq];
    kernels::attention_delta_into(&want.out, &c.dout, d, &mut delta).unwrap();
    let b = 1;
    let (kb, vb) = (
        rows_of(&c.k, slices, sk, d, BLOCKS[b].clone()),
        rows_of(&c.v, slices, sk, d, BLOCKS[b].clone()),
    );
    let len = BLOCKS[b].len();
    // The overwriting call over every query.
    let (mut dq_all, mut dk_want, mut dv_want) = (
        vec![0.0; c.q.len()],
        vec![f64::NAN; kb.len()],
        vec![f64::NAN; vb.len()],
    );
    let input = kernels::BlockGradInputs {
        q: &c.q,
        k: &kb,
        v: &vb,
        dout: &c.dout,
        lse: &want.lse,
        delta: &delta,
    };
    let dims = AttentionDims {
        kv_len: len,
        ..c.dims
    };
    let grads = kernels::AttentionGradBuffers {
        dq: &mut dq_all,
        dk: &mut dk_want,
        dv: &mut dv_want,
    };
    kernels::attention_backward_block(input, dims, params(Q_OFFSET, BLOCKS[b].start), grads)
        .unwrap();
    // Two query blocks adding into accumulators that start at 1.
    let (mut dk, mut dv) = (vec![1.0; kb.len()], vec![1.0; vb.len()]);
    for half in [0..20, 20..50] {
        let rows = |x: &[f64], w: usize| rows_of(x, slices, sq, w, half.clone());
        let (q, dout, lse, dl) = (
            rows(&c.q, d),
            rows(&c.dout, d),
            rows(&want.lse, 1),
            rows(&delta, 1),
        );
        let mut dq = vec![0.0; q.len()];
        let input = kernels::BlockGradInputs {
            q: &q,
            k: &kb,
            v: &vb,
            dout: &dout,
            lse: &lse,
            delta: &dl,
        };
        let dims = AttentionDims {
            q_len: half.len(),
            kv_len: len,
            ..c.dims
        };
        let grads = kernels::AttentionGradBuffers {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        let p = params(Q_OFFSET + half.start, BLOCKS[b].start);
        kernels::attention_backward_block_accumulate(input, dims, p, grads).unwrap();
        assert_close(&dq, &rows(&dq_all, d), 1e-12, 1e-14, "dq of a query block");
    }
    let added = |acc: &[f64]| acc.iter().map(|x| x - 1.0).collect::<Vec<_>>();
    assert_close(&added(&dk), &dk_want, 1e-12, 1e-12, "dk added");
    assert_close(&added(&dv), &dv_want, 1e-12, 1e-12, "dv added");
}

#[test]
fn rows_that_see_no_key_give_zero_and_minus_infinity_never_nan() {
    // Keys at global positions 10..30, queries at 0..20: rows 0..10 see nothing.
    let c = case(40, 2, 20, 20, 4);
    let p = AttentionParams {
        k_offset: 10,
        ..AttentionParams::new(true, 0.5)
    };
    let got = fused(&c, p);
    assert_results(&got, &reference(&c, p), 1e-10, 1e-12, "late keys");
    for s in 0..2 {
        for i in 0..20 {
            let row = s * 20 + i;
            let blind = i < 10;
            assert_eq!(got.lse[row] == f64::NEG_INFINITY, blind, "row {i}");
            let out_row = &got.out[row * 4..(row + 1) * 4];
            let dq_row = &got.dq[row * 4..(row + 1) * 4];
            if blind {
                assert!(out_row.iter().chain(dq_row).all(|&x| x == 0.0), "row {i}");
            }
        }
    }
    for x in [&got.out, &got.dq, &got.dk, &got.dv] {
        assert!(x.iter().all(|v| v.is_finite()));
    }
    // A state that saw no key finishes to zeros and -inf.
    let state = AttentionState::<f64>::new(2, 3, 4).unwrap();
    let (mut out, mut lse) = (vec![1.0; 24], vec![1.0; 6]);
    state.finish_into(&mut out, &mut lse).unwrap();
    assert!(out.iter().all(|&x| x == 0.0) && lse.iter().all(|&x| x == f64::NEG_INFINITY));
}

/// Forward and backward bits (f32) of `c` on the current thread setting.
fn bits(c: &Case, causal: bool) -> Vec<Vec<u32>> {
    let (q, k, v, dout) = (to_f32(&c.q), to_f32(&c.k), to_f32(&c.v), to_f32(&c.dout));
    let p = AttentionParams::new(causal, 0.25f32);
    let mut out = vec![0f32; q.len()];
    let mut lse = vec![0f32; c.dims.slices * c.dims.q_len];
    kernels::flash_attention_into((&q, &k, &v), c.dims, p, &mut out, &mut lse).unwrap();
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; q.len()],
        vec![0f32; k.len()],
        vec![0f32; v.len()],
    );
    let input = kernels::AttentionGradInputs {
        q: &q,
        k: &k,
        v: &v,
        out: &out,
        lse: &lse,
        dout: &dout,
    };
    let grads = kernels::AttentionGradBuffers {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    kernels::flash_attention_grad_into(input, c.dims, p, grads).unwrap();
    [out, lse, dq, dk, dv]
        .iter()
        .map(|x| x.iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn one_and_two_threads_give_the_same_bits() {
    // 8 slices of 4·80·80·40 flops each: above the threshold that splits the slices.
    let c = case(50, 8, 80, 80, 40);
    for causal in [false, true] {
        kernels::threads::set_threads(1);
        let one = bits(&c, causal);
        kernels::threads::set_threads(2);
        let two = bits(&c, causal);
        kernels::threads::set_threads(1);
        assert!(one == two, "causal {causal}");
    }
}

#[test]
fn each_slice_alone_gives_the_bits_of_all_slices_together() {
    // What deterministic mode needs of a batch/heads split: a slice's bits do not depend on
    // which other slices share the call.
    let c = case(60, 3, 70, 70, 6);
    let all = bits(&c, true);
    let d = c.dims.head_dim;
    for s in 0..3 {
        let q_rows = |x: &[f64]| x[s * 70 * d..(s + 1) * 70 * d].to_vec();
        let alone = Case {
            dims: AttentionDims {
                slices: 1,
                ..c.dims
            },
            q: q_rows(&c.q),
            k: q_rows(&c.k),
            v: q_rows(&c.v),
            dout: q_rows(&c.dout),
        };
        let one = bits(&alone, true);
        for (t, (whole, part)) in all.iter().zip(&one).enumerate() {
            let n = part.len();
            assert_eq!(
                &whole[s * n..(s + 1) * n],
                &part[..],
                "slice {s}, result {t}"
            );
        }
    }
}

#[test]
fn tensor_level_matches_slice_level_and_checks_shapes() {
    let c = case(70, 6, 33, 33, 7);
    let shape = [2, 3, 33, 7];
    let t = |x: &[f64]| Tensor::from_vec(&shape, x.to_vec()).unwrap();
    let (q, k, v, dout) = (t(&c.q), t(&c.k), t(&c.v), t(&c.dout));
    let scale = 0.3;
    let (out, lse) = kernels::flash_attention(&q, &k, &v, true, scale).unwrap();
    assert_eq!(lse.shape(), &[2, 3, 33]);
    let grads =
        kernels::flash_attention_grad((&q, &k, &v), &out, &lse, &dout, true, scale).unwrap();
    let want = fused(&c, AttentionParams::new(true, scale));
    assert_eq!(out.to_f64_vec(), want.out);
    assert_eq!(lse.to_f64_vec(), want.lse);
    assert_eq!(grads.dq.to_f64_vec(), want.dq);
    assert_eq!(grads.dk.to_f64_vec(), want.dk);
    assert_eq!(grads.dv.to_f64_vec(), want.dv);
    let narrow = Tensor::from_vec(&[2, 3, 33, 6], vec![0.0f64; 2 * 3 * 33 * 6]).unwrap();
    assert!(matches!(
        kernels::flash_attention(&q, &narrow, &narrow, true, scale),
        Err(TensorError::ShapeMismatch { .. })
    ));
}

#[test]
fn bad_buffers_and_scales_are_errors() {
    let c = case(80, 1, 4, 4, 2);
    let p = AttentionParams::new(true, 1.0);
    let (mut out, mut lse) = (vec![0.0; 8], vec![0.0; 4]);
    let short = &c.k[..6];
    assert!(matches!(
        kernels::flash_attention_into((&c.q, short, &c.v), c.dims, p, &mut out, &mut lse),
        Err(TensorError::BufferLength { buffer: "k", .. })
    ));
    let nan = AttentionParams::new(true, f64::NAN);
    assert!(matches!(
        kernels::flash_attention_into((&c.q, &c.k, &c.v), c.dims, nan, &mut out, &mut lse),
        Err(TensorError::InvalidArgument { .. })
    ));
    let huge = AttentionDims {
        slices: usize::MAX,
        ..c.dims
    };
    assert!(matches!(
        kernels::flash_attention_into((&c.q, &c.k, &c.v), huge, p, &mut out, &mut lse),
        Err(TensorError::InvalidArgument { .. })
    ));
    let mut lse_short = vec![0.0; 3];
    assert!(matches!(
        kernels::merge_attention_into(&mut out, &mut lse_short, &c.q, &lse, 2),
        Err(TensorError::BufferLength { .. })
    ));
}
