//! Ring attention over threads of one process: each rank's block of the result equals one
//! device's (bitwise in the canonical order), and each call's working buffers are the bytes
//! [`parallel::ring::RingCall`] predicts.

use comm::LocalCluster;
use parallel::ring::RingCall;
use tensor::kernels::{
    attention_backward_block, attention_delta_into, flash_attention_into, AttentionDims,
    AttentionGradBuffers, AttentionParams, BlockGradInputs,
};

use super::*;

const SLICES: usize = 2;
const HEAD_DIM: usize = 4;

/// A ring of `lengths.len()` ranks, rank `position` of it.
fn ring(lengths: &[usize], position: usize) -> Ring {
    let offsets = lengths
        .iter()
        .scan(0, |at, &l| {
            *at += l;
            Some(*at - l)
        })
        .collect();
    Ring {
        members: (0..lengths.len()).collect(),
        offsets,
        lengths: lengths.to_vec(),
        position,
    }
}

/// `[SLICES, seq, width]` values, distinct per `salt`.
fn operand(seq: usize, width: usize, salt: usize) -> Vec<f64> {
    (0..SLICES * seq * width)
        .map(|i| (((i * 7 + salt * 13) % 23) as f64 - 11.0) / 9.0)
        .collect()
}

/// Rows `from .. from + len` of every slice of a `[SLICES, seq, width]` operand.
fn rows(data: &[f64], seq: usize, width: usize, from: usize, len: usize) -> Vec<f64> {
    (0..SLICES)
        .flat_map(|s| data[(s * seq + from) * width..(s * seq + from + len) * width].to_vec())
        .collect()
}

fn tensor(data: Vec<f64>, seq: usize, width: usize, dtype: DType) -> Tensor {
    Tensor::from_vec(&[SLICES, seq, width], data)
        .unwrap()
        .to_dtype(dtype)
}

/// One device's forward and backward over the whole sequence.
struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    grads: [Vec<f64>; 3],
}

fn reference(seq: usize, causal: bool, [q, k, v, dout]: [&[f64]; 4]) -> Reference {
    let dims = AttentionDims {
        slices: SLICES,
        q_len: seq,
        kv_len: seq,
        head_dim: HEAD_DIM,
    };
    let params = AttentionParams::new(causal, 0.5);
    let (mut out, mut lse) = (vec![0.0; q.len()], vec![0.0; SLICES * seq]);
    flash_attention_into((q, k, v), dims, params, &mut out, &mut lse).unwrap();
    let mut delta = vec![0.0; lse.len()];
    attention_delta_into(&out, dout, HEAD_DIM, &mut delta).unwrap();
    let mut grads = [vec![0.0; q.len()], vec![0.0; q.len()], vec![0.0; q.len()]];
    let [dq, dk, dv] = &mut grads;
    let input = BlockGradInputs {
        q,
        k,
        v,
        dout,
        lse: &lse,
        delta: &delta,
    };
    attention_backward_block(input, dims, params, AttentionGradBuffers { dq, dk, dv }).unwrap();
    Reference { out, lse, grads }
}

fn close(what: &str, got: &[f64], want: &[f64], exact: bool) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if exact {
            g.to_bits() == w.to_bits() || (g.is_infinite() && g == w)
        } else {
            (g - w).abs() <= 1e-9 * (1.0 + w.abs()) || (g.is_infinite() && g == w)
        };
        assert!(ok, "{what}[{i}]: {g} against one device's {w}");
    }
}

/// Every ring shape: even blocks (the zigzag placement under the causal mask), uneven blocks
/// (each attends its own), the canonical order; f64 and f32. Blocks of 24 and 40 rows, or 32
/// and 96, put the kernel's causal tiles' row bands at other rows than one device's (a row's
/// products then run over other numbers of masked key columns); blocks of 40 and 90, 70 and
/// 70, or of 1 and 2 rows cut its tiles into pieces of 1 to 26 rows or keys, whose products
/// are small enough for the `gemm` crate's special paths. All must still give its bits.
#[test]
fn every_rank_s_block_is_one_device_s_and_its_workspace_is_the_predicted_bytes() {
    let shapes: &[&[usize]] = &[
        &[4, 4],
        &[2, 2, 2],
        &[4, 3, 3],
        &[2, 2, 2, 2],
        &[3, 5],
        &[24, 40],
        &[32, 96],
        &[40, 90],
        &[70, 70],
        &[1, 2, 125, 2],
    ];
    for lengths in shapes {
        let seq: usize = lengths.iter().sum();
        let [q, k, v, dout] = [0, 1, 2, 3].map(|salt| operand(seq, HEAD_DIM, salt));
        for causal in [true, false] {
            let want = reference(seq, causal, [&q, &k, &v, &dout]);
            for (canonical, dtype) in [(false, DType::F64), (true, DType::F64), (false, DType::F32)]
            {
                let case =
                    format!("{lengths:?}, causal {causal}, canonical {canonical}, {dtype:?}");
                let n = lengths.len();
                let results = LocalCluster::new(n).unwrap().run(|comm| {
                    let me = comm.rank();
                    let ring = ring(lengths, me);
                    let (from, len) = (ring.offsets[me], ring.lengths[me]);
                    let block = |data: &[f64], width| {
                        tensor(rows(data, seq, width, from, len), len, width, dtype)
                    };
                    let (qb, kb, vb, db) = (
                        block(&q, HEAD_DIM),
                        block(&k, HEAD_DIM),
                        block(&v, HEAD_DIM),
                        block(&dout, HEAD_DIM),
                    );
                    let how = RingAttention {
                        causal,
                        scale: 0.5,
                        canonical,
                    };
                    let mut out = Tensor::zeros(dtype, &[SLICES, len, HEAD_DIM]);
                    let mut lse = Tensor::zeros(dtype, &[SLICES, len, 1]);
                    let fwd = forward(&comm, &ring, 7, how, (&qb, &kb, &vb), (&mut out, &mut lse))
                        .unwrap();
                    let mut grads =
                        [0, 1, 2].map(|_| Tensor::zeros(dtype, &[SLICES, len, HEAD_DIM]));
                    let [dq, dk, dv] = &mut grads;
                    let bwd = backward(
                        &comm,
                        &ring,
                        8,
                        how,
                        [&qb, &kb, &vb, &out, &lse, &db],
                        [dq, dk, dv],
                    )
                    .unwrap();
                    let predicted = |forward| {
                        let call = RingCall {
                            slices: SLICES,
                            head_dim: HEAD_DIM,
                            forward,
                            canonical,
                        };
                        call.workspace_elements(&ring) * dtype.size_in_bytes()
                    };
                    assert_eq!(
                        fwd.workspace_bytes,
                        predicted(true),
                        "{case}: rank {me}'s forward workspace"
                    );
                    assert_eq!(
                        bwd.workspace_bytes,
                        predicted(false),
                        "{case}: rank {me}'s backward workspace"
                    );
                    let [dq, dk, dv] = grads.map(|g| g.to_f64_vec());
                    (from, len, out.to_f64_vec(), lse.to_f64_vec(), [dq, dk, dv])
                });
                for result in results {
                    let (from, len, out, lse, [dq, dk, dv]) = result.unwrap();
                    // f32 runs are compared to f64's one device at f32's precision.
                    let check = |what: &str, got: &[f64], want: &[f64], width| {
                        let want = rows(want, seq, width, from, len);
                        if dtype == DType::F32 {
                            for (g, w) in got.iter().zip(&want) {
                                assert!(
                                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()) || g == w,
                                    "{case}: {what}: {g} vs {w}"
                                );
                            }
                        } else {
                            close(
                                &format!("{case}: {what} from {from}"),
                                got,
                                &want,
                                canonical,
                            );
                        }
                    };
                    check("out", &out, &want.out, HEAD_DIM);
                    check("lse", &lse, &want.lse, 1);
                    check("dq", &dq, &want.grads[0], HEAD_DIM);
                    check("dk", &dk, &want.grads[1], HEAD_DIM);
                    check("dv", &dv, &want.grads[2], HEAD_DIM);
                }
            }
        }
    }
}
