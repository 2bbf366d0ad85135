//! The collectives that move data without reducing it — broadcast, all-gather(v),
//! all-to-all(v) — and the barrier.

use tensor::{DType, Tensor};

use super::reference::{concat0, expect, expect_eq, input, inputs, reference_reduce, rows};
use super::CaseResult;
use crate::{split_counts, Communicator, CommunicatorExt, ReduceOp};

/// Barriers, repeated.
pub fn barrier(comm: &dyn Communicator) -> CaseResult {
    for _ in 0..3 {
        comm.barrier()?;
    }
    Ok(())
}

/// Broadcast from every root, several dtypes and lengths (including empty).
pub fn broadcast(comm: &dyn Communicator) -> CaseResult {
    for root in 0..comm.size() {
        for dtype in [DType::F32, DType::U8, DType::I64, DType::BF16] {
            for len in [0, 1, 13, 5_000] {
                let want = input(dtype, &[len], root, len);
                let mut t = if comm.rank() == root {
                    want.clone()
                } else {
                    Tensor::zeros(dtype, &[len])
                };
                comm.broadcast(&mut t, root)?;
                expect_eq(
                    comm,
                    &format!("broadcast {dtype}[{len}] from {root}"),
                    &t,
                    &want,
                )?;
            }
        }
    }
    Ok(())
}

/// All-gather along dim 0, any dtype, including 0-dim tensors and empty ones.
pub fn all_gather(comm: &dyn Communicator) -> CaseResult {
    let n = comm.size();
    for dtype in [DType::F32, DType::Bool, DType::U16, DType::F64] {
        for shape in [&[][..], &[1], &[0, 4], &[2, 3], &[1_000, 3]] {
            let all = inputs(dtype, shape, n, shape.len());
            let got = comm.all_gather(&all[comm.rank()])?;
            expect_eq(
                comm,
                &format!("all_gather {dtype}{shape:?}"),
                &got,
                &concat0(&all),
            )?;
        }
    }
    let mut recv = vec![0u32; 5 * n];
    let mine: Vec<u32> = (0..5).map(|i| (comm.rank() * 10 + i) as u32).collect();
    comm.all_gather_into(&mine, &mut recv)?;
    let want: Vec<u32> = (0..n)
        .flat_map(|r| (0..5).map(move |i| (r * 10 + i) as u32))
        .collect();
    expect(comm, recv == want, || {
        format!("all_gather_into: {recv:?} != {want:?}")
    })?;
    // Visited: every rank's bytes exactly once, empty pieces too.
    for len in [5, 0] {
        let mine: Vec<u8> = (0..len).map(|i| (comm.rank() * 10 + i) as u8).collect();
        let mut seen = vec![None; n];
        let mut repeated = false;
        comm.all_gather_visit(&mine, &mut |rank, bytes| {
            repeated |= seen[rank].replace(bytes.to_vec()).is_some();
        })?;
        let want: Vec<Option<Vec<u8>>> = (0..n)
            .map(|r| Some((0..len).map(|i| (r * 10 + i) as u8).collect()))
            .collect();
        expect(comm, !repeated && seen == want, || {
            format!("all_gather_visit of {len} bytes: {seen:?} != {want:?}")
        })?;
    }
    Ok(())
}

/// Uneven all-gather, and reduce-scatter followed by its inverse.
pub fn all_gather_v(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    let row_counts: Vec<usize> = (0..n).map(|r| r % 3).collect();
    let all: Vec<Tensor> = (0..n)
        .map(|r| input(DType::I32, &[row_counts[r], 2], r, 1))
        .collect();
    let got = comm.all_gather_v(&all[me], &row_counts)?;
    expect_eq(comm, "all_gather_v i32", &got, &concat0(&all))?;
    let full = inputs(DType::F32, &[2 * n + 1, 4], n, 2);
    let part = comm.reduce_scatter(&full[me], ReduceOp::Sum)?;
    let back = comm.all_gather_v(&part, &split_counts(2 * n + 1, n))?;
    expect_eq(
        comm,
        "all_gather_v ∘ reduce_scatter",
        &back,
        &reference_reduce(&full, ReduceOp::Sum),
    )
}

/// Equal all-to-all along dim 0.
pub fn all_to_all(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    for k in [0, 1, 3] {
        for dtype in [DType::F32, DType::U8] {
            let all = inputs(dtype, &[n * k, 3], n, k);
            let got = comm.all_to_all(&all[me])?;
            let blocks: Vec<Tensor> = (0..n).map(|j| rows(&all[j], me * k, k)).collect();
            let want = if n * k == 0 {
                all[me].clone()
            } else {
                Tensor::concat(&blocks, 0).expect("blocks")
            };
            expect_eq(
                comm,
                &format!("all_to_all {dtype}[{},3]", n * k),
                &got,
                &want,
            )?;
        }
    }
    Ok(())
}

/// Variable all-to-all: every pair exchanges a different number of bytes (some none).
pub fn all_to_all_v(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    let piece = |src: usize, dst: usize| -> Vec<u8> {
        let len = (src + 2 * dst) % 5 * 1_000 + (src + dst) % 3;
        (0..len).map(|i| (src * 31 + dst * 7 + i) as u8).collect()
    };
    let send: Vec<u8> = (0..n).flat_map(|dst| piece(me, dst)).collect();
    let send_counts: Vec<usize> = (0..n).map(|dst| piece(me, dst).len()).collect();
    let recv_counts: Vec<usize> = (0..n).map(|src| piece(src, me).len()).collect();
    let mut recv = vec![0u8; recv_counts.iter().sum()];
    comm.all_to_all_v_bytes(&send, &send_counts, &mut recv, &recv_counts)?;
    let want: Vec<u8> = (0..n).flat_map(|src| piece(src, me)).collect();
    expect(comm, recv == want, || {
        "all_to_all_v: received bytes differ".to_string()
    })
}
