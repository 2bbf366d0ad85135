//! The conformance suite every backend runs: each operation against a serial reference.
//!
//! A case is a function every rank of a communicator calls with its own communicator. Inputs
//! are a pure function of (rank, index, salt), so each rank computes the serial reference for
//! the whole group by itself and checks its own output exactly (the values are small integers,
//! exact in every dtype and in any summation order). Sizes are chosen to be uneven: lengths
//! that do not divide by the rank count, fewer rows than ranks, empty buffers, and buffers
//! larger than one reduction block.
//!
//! Backends instantiate the suite the way burn's `testgen_all!` does: [`testgen!`] expands to
//! one `#[test]` per case calling a runner the backend writes (the local backend runs each case
//! on 1, 2, 3, 4 and 8 ranks), and [`CASES`] lists the same cases for runners that are not
//! libtest (the MPI runner under `mpirun`).
//!
//! [`testgen!`]: crate::testgen

use std::fmt;

use tensor::{DType, Tensor};

use crate::{
    split_counts, Buf, BufMut, CommError, Communicator, CommunicatorExt, ReduceOp, MAX_TAG,
};

/// Why a case failed on one rank.
#[derive(Debug)]
pub enum CaseFailure {
    /// A call returned an error.
    Comm(CommError),
    /// A call returned a wrong result.
    Wrong {
        /// The rank that saw it.
        rank: usize,
        /// The group size.
        size: usize,
        /// Which check, and the first difference.
        detail: String,
    },
}

impl fmt::Display for CaseFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseFailure::Comm(err) => write!(f, "{err}"),
            CaseFailure::Wrong { rank, size, detail } => {
                write!(f, "rank {rank} of {size}: wrong result: {detail}")
            }
        }
    }
}

impl std::error::Error for CaseFailure {}

impl From<CommError> for CaseFailure {
    fn from(err: CommError) -> CaseFailure {
        CaseFailure::Comm(err)
    }
}

/// The result of one case on one rank.
pub type CaseResult = Result<(), CaseFailure>;

/// One conformance case.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The case's name (its function's name).
    pub name: &'static str,
    /// Runs the case on this rank.
    pub run: fn(&dyn Communicator) -> CaseResult,
}

/// Calls `$callback!(prefix…; case, case, …)` with the list of case functions.
#[doc(hidden)]
#[macro_export]
macro_rules! __comm_case_list {
    ($callback:ident ! ($($prefix:tt)*)) => {
        $crate::$callback!($($prefix)*
            barrier, broadcast, all_reduce, all_reduce_tensor_and_slices, reduce_scatter,
            all_reduce_deterministic, all_reduce_in_element_type, started_collectives,
            all_gather, all_gather_v, all_to_all, all_to_all_v, send_recv, split_and_groups,
            concurrent_groups, invalid_arguments_poison_nothing
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __comm_case_array {
    ($($case:ident),*) => {
        /// Every case, in a stable order.
        pub const CASES: &[Case] = &[$(Case { name: stringify!($case), run: $case }),*];
    };
}

__comm_case_list!(__comm_case_array!());

/// Expands to one `#[test]` per conformance case, each calling `runner(&Case)`.
///
/// ```
/// fn run_local(case: &comm::conformance::Case) {
///     for result in comm::LocalCluster::new(2).unwrap().run(|c| (case.run)(&c)) {
///         result.unwrap().unwrap();
///     }
/// }
/// comm::testgen!(run_local);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! testgen {
    ($runner:path) => {
        $crate::__comm_case_list!(testgen!(@tests $runner;));
    };
    (@tests $runner:path; $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                $runner(&$crate::conformance::Case {
                    name: stringify!($case),
                    run: $crate::conformance::$case,
                });
            }
        )*
    };
}

// ---------------------------------------------------------------------------------------------
// Inputs and references.

/// Rank `rank`'s input: small integers (0..=10, or -5..=5 for signed and float dtypes), exact
/// in every dtype even when summed over 8 ranks.
fn input(dtype: DType, shape: &[usize], rank: usize, salt: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let signed = !matches!(
        dtype,
        DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::Bool
    );
    let values: Vec<f64> = (0..n)
        .map(|i| {
            let v = ((rank * 7 + i * 3 + salt * 5) % 11) as f64;
            if signed {
                v - 5.0
            } else {
                v
            }
        })
        .collect();
    Tensor::from_vec(shape, values)
        .expect("shape matches")
        .to_dtype(dtype)
}

fn inputs(dtype: DType, shape: &[usize], size: usize, salt: usize) -> Vec<Tensor> {
    (0..size).map(|r| input(dtype, shape, r, salt)).collect()
}

/// The serial reduction of `inputs` (rank order), with the semantics of [`ReduceOp`].
fn reference_reduce(inputs: &[Tensor], op: ReduceOp) -> Tensor {
    let first = &inputs[0];
    let values: Vec<Vec<f64>> = inputs.iter().map(|t| t.to_f64_vec()).collect();
    let out: Vec<f64> = (0..first.n_elements())
        .map(|i| {
            let column = values.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => column.sum(),
                ReduceOp::Mean if first.dtype().is_float() => {
                    column.sum::<f64>() / values.len() as f64
                }
                ReduceOp::Mean => (column.sum::<f64>() / values.len() as f64).trunc(),
                ReduceOp::Max => column.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => column.fold(f64::INFINITY, f64::min),
            }
        })
        .collect();
    Tensor::from_vec(first.shape(), out)
        .expect("shape matches")
        .to_dtype(first.dtype())
}

/// `count` rows of dim 0 from row `start`.
fn rows(t: &Tensor, start: usize, count: usize) -> Tensor {
    let row_bytes = t.shape()[1..].iter().product::<usize>() * t.dtype().size_in_bytes();
    let mut shape = t.shape().to_vec();
    shape[0] = count;
    let bytes = &t.as_bytes()[start * row_bytes..(start + count) * row_bytes];
    Tensor::from_bytes(t.dtype(), &shape, bytes).expect("rows in range")
}

fn concat0(parts: &[Tensor]) -> Tensor {
    if parts[0].ndim() == 0 {
        let values: Vec<f64> = parts.iter().flat_map(|t| t.to_f64_vec()).collect();
        return Tensor::from_vec(&[parts.len()], values)
            .expect("one per part")
            .to_dtype(parts[0].dtype());
    }
    Tensor::concat(parts, 0).expect("same trailing dims")
}

fn wrong(comm: &dyn Communicator, detail: String) -> CaseFailure {
    CaseFailure::Wrong {
        rank: comm.rank(),
        size: comm.size(),
        detail,
    }
}

/// Checks `got == want` exactly (dtype, shape and bytes).
fn expect_eq(comm: &dyn Communicator, what: &str, got: &Tensor, want: &Tensor) -> CaseResult {
    if got.dtype() != want.dtype() || got.shape() != want.shape() {
        return Err(wrong(
            comm,
            format!(
                "{what}: got {} {:?}, want {} {:?}",
                got.dtype(),
                got.shape(),
                want.dtype(),
                want.shape()
            ),
        ));
    }
    if got.as_bytes() != want.as_bytes() {
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        let i = (0..g.len())
            .find(|&i| g[i].to_bits() != w[i].to_bits())
            .unwrap_or(0);
        return Err(wrong(
            comm,
            format!(
                "{what}: element {i} is {} but should be {} ({} elements)",
                g.get(i).copied().unwrap_or(f64::NAN),
                w.get(i).copied().unwrap_or(f64::NAN),
                g.len()
            ),
        ));
    }
    Ok(())
}

fn expect(comm: &dyn Communicator, ok: bool, what: impl FnOnce() -> String) -> CaseResult {
    if ok {
        Ok(())
    } else {
        Err(wrong(comm, what()))
    }
}

// ---------------------------------------------------------------------------------------------
// The cases.

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

/// Collectives started together and finished later ([`Communicator::start_all_reduce`],
/// [`Communicator::start_reduce_scatter_v`], [`Communicator::start_all_gather_bytes`]), as
/// fused gradient buckets and prefetched weight gathers are while the steps compute: several
/// all-reduces, reduce-scatters (uneven parts, some empty) and all-gathers in flight at once,
/// of the dtypes and ops a backend runs in the background and of those it runs at once, tested
/// a few times and waited for in order, each equal to the serial reference.
pub fn started_collectives(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    let cases = [
        (DType::F32, ReduceOp::Sum, 40_003, false),
        (DType::F32, ReduceOp::Sum, 0, true),
        (DType::F64, ReduceOp::Max, 17, false),
        (DType::F64, ReduceOp::Sum, 5, true),
        (DType::F32, ReduceOp::Min, 0, false),
        (DType::BF16, ReduceOp::Sum, 1_000, false),
        (DType::F32, ReduceOp::Max, 30_011, true),
        (DType::BF16, ReduceOp::Sum, 999, true),
        (DType::F32, ReduceOp::Mean, n + 1, false),
        (DType::F32, ReduceOp::Mean, 7, true),
    ];
    let mut pending = Vec::new();
    for (i, &(dtype, op, len, scatter)) in cases.iter().enumerate() {
        let all = inputs(dtype, &[len], n, 20 + i);
        let mine = all[me].clone();
        let want = reference_reduce(&all, op);
        pending.push(match scatter {
            false => (comm.start_all_reduce(mine, op)?, want),
            true => {
                // Uneven parts: member k gets about len·(k+1)/Σ, the last the rest.
                let total: usize = (1..=n).sum();
                let mut counts: Vec<usize> = (0..n).map(|k| len * (k + 1) / total).collect();
                counts[n - 1] = len - counts[..n - 1].iter().sum::<usize>();
                let w = dtype.size_in_bytes();
                let at: usize = counts[..me].iter().sum();
                let part = &want.as_bytes()[at * w..(at + counts[me]) * w];
                let part = Tensor::from_bytes(dtype, &[counts[me]], part).expect("part");
                (comm.start_reduce_scatter_v(mine, &counts, op)?, part)
            }
        });
    }
    // All-gathers of bytes, in flight with the reductions: rank r sends `len` bytes of its own.
    let gathers = [0usize, 1, 10_007];
    let bytes_of = |rank: usize, len: usize| -> Vec<u8> {
        (0..len).map(|i| (i * 7 + rank * 31 + len) as u8).collect()
    };
    let mut gathered = Vec::new();
    for &len in &gathers {
        let want: Vec<u8> = (0..n).flat_map(|r| bytes_of(r, len)).collect();
        let want = Tensor::from_vec(&[want.len()], want).expect("len");
        gathered.push((comm.start_all_gather_bytes(bytes_of(me, len))?, want));
    }
    for _ in 0..3 {
        for (p, _) in pending.iter_mut().chain(gathered.iter_mut()) {
            p.test()?;
        }
    }
    for ((p, want), len) in gathered.into_iter().zip(gathers) {
        expect_eq(
            comm,
            &format!("started all_gather u8[{len}]"),
            &p.wait()?,
            &want,
        )?;
    }
    for ((p, want), &(dtype, op, len, scatter)) in pending.into_iter().zip(&cases) {
        let got = p.wait()?;
        let what = if scatter {
            "reduce_scatter"
        } else {
            "all_reduce"
        };
        expect_eq(
            comm,
            &format!("started {what} {op} {dtype}[{len}]"),
            &got,
            &want,
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
    expect_eq(comm, "reduce_scatter_into f32", &got, &want)
}

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
    })
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

/// Point-to-point: a ring of tensors, in-order delivery per tag, tags received out of order,
/// and a message to oneself.
pub fn send_recv(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let shapes: [&[usize]; 3] = [&[], &[4], &[2, 3]];
    for (i, shape) in shapes.iter().enumerate() {
        let t = input(DType::ALL[i * 4], shape, me, i);
        comm.send(next, 7, &t)?;
    }
    comm.send_bytes(next, 1, b"first")?;
    comm.send_bytes(next, 1, b"second")?;
    comm.send_bytes(next, MAX_TAG, b"last tag")?;
    for (i, shape) in shapes.iter().enumerate() {
        let got = comm.recv(prev, 7)?;
        expect_eq(
            comm,
            "send/recv tensor",
            &got,
            &input(DType::ALL[i * 4], shape, prev, i),
        )?;
    }
    let last = comm.recv_bytes(prev, MAX_TAG)?;
    let first = comm.recv_bytes(prev, 1)?;
    let second = comm.recv_bytes(prev, 1)?;
    expect(
        comm,
        (&first[..], &second[..], &last[..]) == (b"first", b"second", b"last tag"),
        || "messages on one tag out of order, or tags mixed".to_string(),
    )?;
    comm.send_bytes(me, 3, &[me as u8])?;
    let own = comm.recv_bytes(me, 3)?;
    expect(comm, own == [me as u8], || {
        "a message to oneself was lost".to_string()
    })?;
    // Leave no message in flight for the next case.
    comm.barrier()?;
    Ok(())
}

/// `split` by parity, `group` with a custom order, and a group of a group.
pub fn split_and_groups(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    let half = comm.split(Some((me % 2) as u32))?.ok_or_else(|| {
        wrong(
            comm,
            "split gave no group to a rank with a color".to_string(),
        )
    })?;
    let members: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
    expect(
        comm,
        half.size() == members.len() && half.rank() == me / 2,
        || {
            format!(
                "split: rank {} of {} in the parity group",
                half.rank(),
                half.size()
            )
        },
    )?;
    let mut x = vec![me as i64; 3];
    half.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    let want = members.iter().sum::<usize>() as i64;
    expect(comm, x == vec![want; 3], || {
        format!("sum over the parity group: {x:?}")
    })?;

    // Only rank 0 opts out.
    let rest = comm.split(if me == 0 { None } else { Some(1) })?;
    expect(comm, rest.is_none() == (me == 0), || {
        "split(None) gave a group".to_string()
    })?;
    if let Some(rest) = rest {
        let mut y = [1u32];
        rest.all_reduce_in_place(&mut y, ReduceOp::Sum)?;
        expect(comm, y[0] as usize == n - 1, || {
            format!("{} ranks counted themselves", y[0])
        })?;
    }

    // Reversed order: world rank n-1 becomes group rank 0.
    let reversed: Vec<usize> = (0..n).rev().collect();
    let rev = comm.group(&reversed)?;
    expect(comm, rev.rank() == n - 1 - me, || {
        format!("reversed group rank {}", rev.rank())
    })?;
    let got = rev.all_gather(&Tensor::from_vec(&[1], vec![me as i32]).expect("one"))?;
    let want: Vec<i32> = reversed.iter().map(|&r| r as i32).collect();
    expect(comm, got.as_slice::<i32>().ok() == Some(&want[..]), || {
        format!("gather in reversed group order: {got:?}")
    })?;
    // A group of the reversed group: its first two ranks (world ranks n-1, n-2).
    if n >= 2 && rev.rank() < 2 {
        let pair = rev.group(&[0, 1])?;
        let got = pair.all_gather(&Tensor::from_vec(&[1], vec![me as i32]).expect("one"))?;
        let want = [(n - 1) as i32, (n - 2) as i32];
        expect(comm, got.as_slice::<i32>().ok() == Some(&want[..]), || {
            format!("nested group gather: {got:?}")
        })?;
    }
    comm.barrier()?;
    Ok(())
}

/// Groups used at the same time: parity groups interleave different collectives and
/// point-to-point messages with the same tags as the world; overlapping pair groups exchange
/// on the same tag and are received in the opposite order.
pub fn concurrent_groups(comm: &dyn Communicator) -> CaseResult {
    let (n, me) = (comm.size(), comm.rank());
    let parity: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
    let group = comm.group(&parity)?;
    for round in 0..20 {
        let mut x = vec![(me + round) as f32; 257];
        if me % 2 == 0 {
            group.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
            let want: usize = parity.iter().map(|r| r + round).sum();
            expect(comm, x.iter().all(|&v| v == want as f32), || {
                format!("round {round}: even group sum {}", x[0])
            })?;
        } else {
            let got = group.all_gather(&Tensor::from_vec(&[257], x).expect("len"))?;
            expect(comm, got.shape() == [257 * parity.len()], || {
                format!("round {round}: odd group gather shape {:?}", got.shape())
            })?;
        }
        // The same tag on the group and on the world, received in the opposite order.
        let gn = group.size();
        let (gnext, gprev) = ((group.rank() + 1) % gn, (group.rank() + gn - 1) % gn);
        group.send_bytes(gnext, 5, &[round as u8, 1])?;
        comm.send_bytes((me + 1) % n, 5, &[round as u8, 2])?;
        let from_world = comm.recv_bytes((me + n - 1) % n, 5)?;
        let from_group = group.recv_bytes(gprev, 5)?;
        expect(
            comm,
            from_world == [round as u8, 2] && from_group == [round as u8, 1],
            || format!("round {round}: world got {from_world:?}, group got {from_group:?}"),
        )?;
    }
    // Overlapping pairs: {2k, 2k+1} and {2k+1, 2k+2 mod n}, same tag on both.
    if n >= 4 && n % 2 == 0 {
        let a = comm.group(&[me & !1, me | 1])?;
        let b_members = if me % 2 == 1 {
            [me, (me + 1) % n]
        } else {
            [(me + n - 1) % n, me]
        };
        let b = comm.group(&b_members)?;
        a.send_bytes(1 - a.rank(), 9, b"via a")?;
        b.send_bytes(1 - b.rank(), 9, b"via b")?;
        let from_b = b.recv_bytes(1 - b.rank(), 9)?;
        let from_a = a.recv_bytes(1 - a.rank(), 9)?;
        expect(comm, from_a == b"via a" && from_b == b"via b", || {
            "messages crossed between overlapping groups".to_string()
        })?;
    }
    comm.barrier()?;
    Ok(())
}

/// Bad arguments are reported on the caller before any communication and leave the
/// communicator usable.
pub fn invalid_arguments_poison_nothing(comm: &dyn Communicator) -> CaseResult {
    let n = comm.size();
    let is_invalid = |r: Result<(), CommError>| matches!(r, Err(CommError::InvalidArgument { .. }));
    let mut buf = [0u8; 4];
    expect(comm, is_invalid(comm.broadcast_bytes(&mut buf, n)), || {
        "root out of range".into()
    })?;
    let mut small = vec![0u8; 4 * n - 1];
    expect(
        comm,
        is_invalid(comm.all_gather_bytes(&buf, &mut small)),
        || "short recv".into(),
    )?;
    expect(comm, is_invalid(comm.group(&[n]).map(|_| ())), || {
        "group rank out of range".into()
    })?;
    expect(comm, is_invalid(comm.group(&[0, 0]).map(|_| ())), || {
        "repeated group rank".into()
    })?;
    expect(comm, is_invalid(comm.send_bytes(n, 0, &buf)), || {
        "send to rank n".into()
    })?;
    expect(
        comm,
        is_invalid(comm.send_bytes(0, MAX_TAG + 1, &buf)),
        || "tag too big".into(),
    )?;
    let odd = [0u8; 1];
    let mut recv = [0u8; 1];
    if n > 1 {
        expect(
            comm,
            is_invalid(comm.all_to_all_bytes(&odd, &mut recv)),
            || "all_to_all of an indivisible buffer".into(),
        )?;
    }
    let flags = [true];
    let mut bools = Tensor::from_bools(&[1], &flags).expect("one");
    let unsupported = comm.all_reduce(&mut bools, ReduceOp::Sum);
    expect(
        comm,
        matches!(unsupported, Err(CommError::UnsupportedReduction { .. })),
        || format!("sum of bools: {unsupported:?}"),
    )?;
    let counts = vec![1; n + 1];
    let mut out = [0f32; 1];
    let rs = comm.reduce_scatter_v(
        Buf::new(&[0f32; 1]),
        crate::BufMut::new(&mut out),
        &counts,
        ReduceOp::Sum,
    );
    expect(comm, is_invalid(rs), || {
        "reduce_scatter counts of the wrong length".into()
    })?;
    // Still usable.
    let mut x = [1u64];
    comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    expect(comm, x[0] == n as u64, || {
        format!("all_reduce after argument errors: {}", x[0])
    })
}
