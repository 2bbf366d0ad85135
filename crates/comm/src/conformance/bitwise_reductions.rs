//! The reductions whose result is bitwise the same on every rank: the deterministic
//! (canonical-tree) all-reduce and reduce-scatter, and those in the element type.

use tensor::{DType, Tensor};

use super::reference::{expect, expect_eq, inputs, reference_reduce, rows};
use super::CaseResult;
use crate::{split_counts, Buf, BufMut, CommError, Communicator, ReduceOp};

/// Rank `rank`'s input for the deterministic reductions: values whose sums round, with
/// magnitudes spread over twelve decades, so that another summation order gives other bits.
fn inexact_input(dtype: DType, len: usize, rank: usize, salt: usize) -> Tensor {
    let values: Vec<f64> = (0..len)
        .map(|i| {
            let k = rank * 7 + i * 3 + salt * 5;
            let sign = if k.is_multiple_of(3) { -1.0 } else { 1.0 };
            sign / (1.0 + (k % 13) as f64) * 10f64.powi((k % 12) as i32 - 6)
        })
        .collect();
    Tensor::from_vec(&[len], values)
        .expect("shape matches")
        .to_dtype(dtype)
}

/// The canonical-tree reduction of `inputs` (member order) computed serially with
/// `tensor::kernels::tree::tree_reduce`, in the dtype (f32 accumulating for 16-bit floats).
fn reference_tree(inputs: &[Tensor], op: ReduceOp) -> Tensor {
    use tensor::kernels::tree::tree_reduce;
    let n = inputs.len();
    let first = &inputs[0];
    fn fold<T: Copy>(
        n: usize,
        len: usize,
        value: impl Fn(usize, usize) -> T,
        combine: impl Fn(T, T) -> T,
    ) -> Vec<T> {
        (0..len)
            .map(|i| tree_reduce(n, &mut |p| value(p, i), &mut |a, b| combine(a, b)))
            .collect()
    }
    let len = first.n_elements();
    match first.dtype() {
        DType::F64 => {
            let v: Vec<&[f64]> = inputs
                .iter()
                .map(|t| t.as_slice::<f64>().expect("f64"))
                .collect();
            let out = match op {
                ReduceOp::Sum | ReduceOp::Mean => fold(n, len, |p, i| v[p][i], |a, b| a + b),
                ReduceOp::Max => fold(n, len, |p, i| v[p][i], f64::max),
                ReduceOp::Min => fold(n, len, |p, i| v[p][i], f64::min),
            };
            let out = out
                .into_iter()
                .map(|x| {
                    if op == ReduceOp::Mean {
                        x / n as f64
                    } else {
                        x
                    }
                })
                .collect();
            Tensor::from_vec(first.shape(), out).expect("shape")
        }
        dtype => {
            // f32, and the 16-bit floats through their f32 accumulator.
            let v: Vec<Vec<f32>> = inputs
                .iter()
                .map(|t| t.to_dtype(DType::F32).as_f32().expect("f32").to_vec())
                .collect();
            let out = match op {
                ReduceOp::Sum | ReduceOp::Mean => fold(n, len, |p, i| v[p][i], |a, b| a + b),
                ReduceOp::Max => fold(n, len, |p, i| v[p][i], f32::max),
                ReduceOp::Min => fold(n, len, |p, i| v[p][i], f32::min),
            };
            let out: Vec<f32> = out
                .into_iter()
                .map(|x| {
                    if op == ReduceOp::Mean {
                        x / n as f32
                    } else {
                        x
                    }
                })
                .collect();
            Tensor::from_vec(first.shape(), out)
                .expect("shape")
                .to_dtype(dtype)
        }
    }
}

/// Deterministic all-reduce and reduce-scatter (issue 17): every rank's result is bitwise the
/// canonical tree over the members' inputs in member order, computed serially; on inexact
/// floats over many decades, for every op, uneven and empty chunks, and megabytes. Integer
/// sums, exact in any order, are checked against the ordinary all-reduce.
pub fn all_reduce_deterministic(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for op in ReduceOp::ALL {
            for len in [0, 1, n.saturating_sub(1), n + 1, 1_000, 40_003] {
                let all: Vec<Tensor> = (0..n).map(|r| inexact_input(dtype, len, r, len)).collect();
                let want = reference_tree(&all, op);
                let mut t = all[me].clone();
                comm.all_reduce_deterministic(&mut t, op)?;
                expect_eq(
                    comm,
                    &format!("all_reduce_deterministic {op} {dtype}[{len}]"),
                    &t,
                    &want,
                )?;
                let part = comm.reduce_scatter_deterministic(&all[me], op)?;
                let counts = split_counts(len, n);
                let start: usize = counts[..me].iter().sum();
                expect_eq(
                    comm,
                    &format!("reduce_scatter_deterministic {op} {dtype}[{len}]"),
                    &part,
                    &rows(&want, start, counts[me]),
                )?;
            }
        }
    }
    let len = 1_200_007;
    let all: Vec<Tensor> = (0..n)
        .map(|r| inexact_input(DType::F32, len, r, 3))
        .collect();
    let mut t = all[me].clone();
    comm.all_reduce_deterministic(&mut t, ReduceOp::Sum)?;
    expect_eq(
        comm,
        &format!("all_reduce_deterministic sum f32[{len}]"),
        &t,
        &reference_tree(&all, ReduceOp::Sum),
    )?;
    let all = inputs(DType::I64, &[777], n, 2);
    let mut t = all[me].clone();
    comm.all_reduce_deterministic(&mut t, ReduceOp::Mean)?;
    expect_eq(
        comm,
        "all_reduce_deterministic mean i64[777]",
        &t,
        &reference_reduce(&all, ReduceOp::Mean),
    )?;
    let mut flags = Tensor::from_bools(&[1], &[true]).expect("one");
    let unsupported = comm.all_reduce_deterministic(&mut flags, ReduceOp::Sum);
    expect(
        comm,
        matches!(unsupported, Err(CommError::UnsupportedReduction { .. })),
        || format!("deterministic sum of bools: {unsupported:?}"),
    )
}

/// The reduction in the element type of `inputs` (member order) computed serially: left to
/// right, every partial result rounded to the dtype (`Mean` divides the rounded sum and rounds
/// again). Floats only.
fn reference_in_element_type(inputs: &[Tensor], op: ReduceOp) -> Tensor {
    let first = &inputs[0];
    let dtype = first.dtype();
    // The result of one operation computed in f64 and rounded to a type of p ≤ 24 bits is the
    // correctly rounded result in that type (53 ≥ 2p + 2: double rounding is innocuous for
    // +, ÷, max and min), which is what adding in the type itself gives.
    let round = |x: f64| -> f64 {
        Tensor::from_vec(&[1], vec![x])
            .expect("one")
            .to_dtype(dtype)
            .to_f64_vec()[0]
    };
    let values: Vec<Vec<f64>> = inputs.iter().map(Tensor::to_f64_vec).collect();
    let out: Vec<f64> = (0..first.n_elements())
        .map(|i| {
            let mut acc = values[0][i];
            for v in &values[1..] {
                acc = round(match op {
                    ReduceOp::Sum | ReduceOp::Mean => acc + v[i],
                    ReduceOp::Max => acc.max(v[i]),
                    ReduceOp::Min => acc.min(v[i]),
                });
            }
            if op == ReduceOp::Mean {
                acc = round(acc / inputs.len() as f64);
            }
            acc
        })
        .collect();
    Tensor::from_vec(first.shape(), out)
        .expect("shape")
        .to_dtype(dtype)
}

/// All-reduce and reduce-scatter in the element type: every rank's result is bitwise the
/// serial left-to-right fold over the members' inputs in member order, each partial result
/// rounded to the dtype, for bf16, f16, f32 and f64, every op, uneven and empty chunks; integer
/// sums equal the ordinary all-reduce's; a sum of bools is refused.
pub fn all_reduce_in_element_type(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    for dtype in [DType::BF16, DType::F16, DType::F32, DType::F64] {
        for op in ReduceOp::ALL {
            for len in [0, 1, n.saturating_sub(1), n + 1, 1_000, 40_003] {
                let all: Vec<Tensor> = (0..n).map(|r| inexact_input(dtype, len, r, len)).collect();
                let want = reference_in_element_type(&all, op);
                let mut t = all[me].clone();
                comm.all_reduce_in_element_type(&mut t, op)?;
                expect_eq(
                    comm,
                    &format!("all_reduce_in_element_type {op} {dtype}[{len}]"),
                    &t,
                    &want,
                )?;
                let counts = split_counts(len, n);
                let mut part = Tensor::zeros(dtype, &[counts[me]]);
                comm.reduce_scatter_in_element_type_v(
                    Buf::from_tensor(&all[me]),
                    BufMut::from_tensor(&mut part),
                    &counts,
                    op,
                )?;
                let start: usize = counts[..me].iter().sum();
                expect_eq(
                    comm,
                    &format!("reduce_scatter_in_element_type {op} {dtype}[{len}]"),
                    &part,
                    &rows(&want, start, counts[me]),
                )?;
            }
        }
    }
    let all = inputs(DType::I32, &[777], n, 4);
    let mut t = all[me].clone();
    comm.all_reduce_in_element_type(&mut t, ReduceOp::Sum)?;
    expect_eq(
        comm,
        "all_reduce_in_element_type sum i32[777]",
        &t,
        &reference_reduce(&all, ReduceOp::Sum),
    )?;
    let mut flags = Tensor::from_bools(&[1], &[true]).expect("one");
    let unsupported = comm.all_reduce_in_element_type(&mut flags, ReduceOp::Sum);
    expect(
        comm,
        matches!(unsupported, Err(CommError::UnsupportedReduction { .. })),
        || format!("sum of bools in the element type: {unsupported:?}"),
    )
}
