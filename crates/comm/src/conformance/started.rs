//! Collectives started together and finished later, against their blocking forms.

use tensor::{DType, Tensor};

use super::reference::{expect_eq, inputs, reference_reduce};
use super::CaseResult;
use crate::{Communicator, ReduceOp};

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
