//! The suite's inputs and serial references, and the checks that turn a difference into a
//! [`CaseFailure`].

use tensor::{DType, Tensor};

use super::{CaseFailure, CaseResult};
use crate::{Communicator, ReduceOp};

/// Rank `rank`'s input: small integers (0..=10, or -5..=5 for signed and float dtypes), exact
/// in every dtype even when summed over 8 ranks.
pub(super) fn input(dtype: DType, shape: &[usize], rank: usize, salt: usize) -> Tensor {
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

pub(super) fn inputs(dtype: DType, shape: &[usize], size: usize, salt: usize) -> Vec<Tensor> {
    (0..size).map(|r| input(dtype, shape, r, salt)).collect()
}

/// The serial reduction of `inputs` (rank order), with the semantics of [`ReduceOp`].
pub(super) fn reference_reduce(inputs: &[Tensor], op: ReduceOp) -> Tensor {
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
pub(super) fn rows(t: &Tensor, start: usize, count: usize) -> Tensor {
    let row_bytes = t.shape()[1..].iter().product::<usize>() * t.dtype().size_in_bytes();
    let mut shape = t.shape().to_vec();
    shape[0] = count;
    let bytes = &t.as_bytes()[start * row_bytes..(start + count) * row_bytes];
    Tensor::from_bytes(t.dtype(), &shape, bytes).expect("rows in range")
}

pub(super) fn concat0(parts: &[Tensor]) -> Tensor {
    if parts[0].ndim() == 0 {
        let values: Vec<f64> = parts.iter().flat_map(|t| t.to_f64_vec()).collect();
        return Tensor::from_vec(&[parts.len()], values)
            .expect("one per part")
            .to_dtype(parts[0].dtype());
    }
    Tensor::concat(parts, 0).expect("same trailing dims")
}

pub(super) fn wrong(comm: &dyn Communicator, detail: String) -> CaseFailure {
    CaseFailure::Wrong {
        rank: comm.rank(),
        size: comm.size(),
        detail,
    }
}

/// Checks `got == want` exactly (dtype, shape and bytes).
pub(super) fn expect_eq(
    comm: &dyn Communicator,
    what: &str,
    got: &Tensor,
    want: &Tensor,
) -> CaseResult {
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

pub(super) fn expect(
    comm: &dyn Communicator,
    ok: bool,
    what: impl FnOnce() -> String,
) -> CaseResult {
    if ok {
        Ok(())
    } else {
        Err(wrong(comm, what()))
    }
}
