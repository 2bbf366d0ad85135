//! All-reduce (buffers, tensors and slices) and reduce-scatter against the serial reference.

use tensor::{DType, Tensor};

use super::reference::{concat0, expect_eq, inputs, reference_reduce, rows};
use super::CaseResult;
use crate::{split_counts, Buf, BufMut, Communicator, CommunicatorExt, ReduceOp};

/// All-reduce: every op × numeric dtype × length (empty, 1, uneven, larger than a block), and
/// a few multi-megabyte buffers.
pub fn all_reduce(comm: &dyn Communicator) -> CaseResult {
    let n = comm.size();
    let dtypes = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::I8,
        DType::U8,
        DType::U64,
    ];
    for op in ReduceOp::ALL {
        for dtype in dtypes {
            for len in [0, 1, n + 1, 1_000, 40_003] {
                let all = inputs(dtype, &[len], n, len + 1);
                let mut t = all[comm.rank()].clone();
                comm.all_reduce(&mut t, op)?;
                let want = reference_reduce(&all, op);
                expect_eq(comm, &format!("all_reduce {op} {dtype}[{len}]"), &t, &want)?;
            }
        }
    }
    // Buffers of several megabytes: algorithms that pipeline large transfers in segments.
    for (dtype, op) in [
        (DType::F32, ReduceOp::Sum),
        (DType::F64, ReduceOp::Max),
        (DType::BF16, ReduceOp::Mean),
        (DType::I32, ReduceOp::Min),
    ] {
        let len = 1_200_007;
        let all = inputs(dtype, &[len], n, 11);
        let mut t = all[comm.rank()].clone();
        comm.all_reduce(&mut t, op)?;
        let want = reference_reduce(&all, op);
        expect_eq(comm, &format!("all_reduce {op} {dtype}[{len}]"), &t, &want)?;
    }
    for op in [ReduceOp::Max, ReduceOp::Min] {
        let all = inputs(DType::Bool, &[37], n, 3);
        let mut t = all[comm.rank()].clone();
        comm.all_reduce(&mut t, op)?;
        expect_eq(
            comm,
            &format!("all_reduce {op} bool"),
            &t,
            &reference_reduce(&all, op),
        )?;
    }
    Ok(())
}

/// Tensor-level all-reduce on a 2-d tensor and the slice helper.
pub fn all_reduce_tensor_and_slices(comm: &dyn Communicator) -> CaseResult {
    let n = comm.size();
    let all = inputs(DType::F32, &[3, 5], n, 9);
    let mut t = all[comm.rank()].clone();
    comm.all_reduce(&mut t, ReduceOp::Mean)?;
    expect_eq(
        comm,
        "all_reduce mean f32[3,5]",
        &t,
        &reference_reduce(&all, ReduceOp::Mean),
    )?;
    let all = inputs(DType::F64, &[1_001], n, 4);
    let mut grads = all[comm.rank()].as_slice::<f64>().expect("f64").to_vec();
    comm.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
    let got = Tensor::from_vec(&[1_001], grads).expect("len");
    expect_eq(
        comm,
        "all_reduce_in_place f64",
        &got,
        &reference_reduce(&all, ReduceOp::Sum),
    )
}

/// Reduce-scatter along dim 0 with uneven row counts (fewer rows than ranks, remainders, and
/// megabytes per rank).
pub fn reduce_scatter(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    for d0 in [0, 1, n.saturating_sub(1), n, 2 * n + 1, 1_003, 400_009] {
        for dtype in [DType::F32, DType::I64, DType::BF16] {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Mean] {
                let all = inputs(dtype, &[d0, 3], n, d0);
                let got = comm.reduce_scatter(&all[me], op)?;
                let counts = split_counts(d0, n);
                let start: usize = counts[..me].iter().sum();
                let want = rows(&reference_reduce(&all, op), start, counts[me]);
                expect_eq(
                    comm,
                    &format!("reduce_scatter {op} {dtype}[{d0},3]"),
                    &got,
                    &want,
                )?;
            }
        }
    }
    // The slice helper, on an element count that does not divide.
    let len = 10 * n + 3;
    let all = inputs(DType::F32, &[len], n, 5);
    let counts = split_counts(len, n);
    let mut part = vec![0f32; counts[me]];
    comm.reduce_scatter_into(all[me].as_f32().expect("f32"), &mut part, ReduceOp::Sum)?;
    let start: usize = counts[..me].iter().sum();
    let want = rows(&reference_reduce(&all, ReduceOp::Sum), start, counts[me]);
    let got = Tensor::from_vec(&[counts[me]], part).expect("len");
    expect_eq(comm, "reduce_scatter_into f32", &got, &want)?;
    // Interleaved parts: `[rows, n, segment]`, rank `j`'s part `[:, j, :]`.
    for (n_rows, segment) in [(1, 4), (3, 5), (4, 0), (7, 1)] {
        for dtype in [DType::F32, DType::I64, DType::BF16] {
            let op = ReduceOp::Sum;
            let all = inputs(dtype, &[n_rows, n, segment], n, n_rows + segment);
            let mut got = Tensor::zeros(dtype, &[n_rows, 1, segment]);
            comm.reduce_scatter_rows(
                Buf::from_tensor(&all[me]),
                BufMut::from_tensor(&mut got),
                n_rows,
                op,
            )?;
            let flat = reference_reduce(&all, op)
                .reshape(&[n_rows * n, segment])
                .expect("same elements");
            let mine: Vec<Tensor> = (0..n_rows).map(|r| rows(&flat, r * n + me, 1)).collect();
            let want = concat0(&mine)
                .reshape(&[n_rows, 1, segment])
                .expect("same elements");
            expect_eq(
                comm,
                &format!("reduce_scatter_rows {dtype}[{n_rows},{n},{segment}]"),
                &got,
                &want,
            )?;
        }
    }
    Ok(())
}
