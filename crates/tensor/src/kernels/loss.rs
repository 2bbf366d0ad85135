//! Sparse softmax cross entropy: logits `[N, C]` against integer class labels `[N]`, averaged over
//! the batch (MindSpore's `SparseSoftmaxCrossEntropyWithLogits` with `is_grad=False`).
//!
//! `loss = (1/N) Σ_n (logsumexp(logits[n]) - logits[n, labels[n]])`; its gradient wrt the logits is
//! `(softmax(logits) - onehot(labels)) / N`, times the upstream gradient of the loss.

use crate::error::TensorError;
use crate::kernels::check;
use crate::kernels::embedding::{check_indices, with_indices, IndexElement, IndexSlice};
use crate::kernels::float::{with_float, Float};
use crate::kernels::softmax::{log_sum_exp_widest, softmax_row};
use crate::kernels::wide::widest;
use crate::tensor::Tensor;

const LOSS_OP: &str = "sparse_softmax_cross_entropy";
const GRAD_OP: &str = "sparse_softmax_cross_entropy_grad";

/// Checks logits of `classes` columns against one label per row; returns the batch size.
fn batch_size<T, I: IndexElement>(
    op: &'static str,
    logits: &[T],
    classes: usize,
    labels: &[I],
) -> Result<usize, TensorError> {
    let n = labels.len();
    if n == 0 || classes == 0 {
        return Err(TensorError::InvalidArgument {
            op,
            reason: format!("needs at least one row and one class, got {n} rows of {classes}"),
        });
    }
    check::buffer_len(op, "logits", n * classes, logits.len())?;
    check_indices(op, labels, classes)?;
    Ok(n)
}

/// The mean cross-entropy loss of `logits` (rows of `classes`) against `labels`.
pub fn sparse_softmax_cross_entropy_slice<T: Float, I: IndexElement>(
    logits: &[T],
    classes: usize,
    labels: &[I],
) -> Result<T, TensorError> {
    let n = batch_size(LOSS_OP, logits, classes, labels)?;
    let term = |row: &[T], label: &I| log_sum_exp_widest(row) - row[label.to_i64() as usize];
    let mut total = T::ZERO;
    let per = super::threads::rows_per_part(n, classes);
    if per >= n {
        // One thread: no buffer for the terms (a training step allocates nothing here).
        let rows = logits.chunks_exact(classes).zip(labels);
        rows.for_each(|(row, label)| total += term(row, label));
    } else {
        // Each row's term on the rank's threads, then summed in row order on this one: the
        // bits are the one thread's.
        let parts: Vec<_> = logits
            .chunks(per * classes)
            .zip(labels.chunks(per))
            .collect();
        let terms = super::threads::for_each_part(parts, |_, (logits, labels)| {
            let part = logits.chunks_exact(classes).zip(labels);
            part.map(|(row, label)| term(row, label))
                .collect::<Vec<T>>()
        });
        terms.into_iter().flatten().for_each(|t| total += t);
    }
    Ok(total / T::from_usize(n))
}

widest! {
    /// [`softmax_row`] on the widest vector unit the CPU has (its exponential's fused
    /// multiply-adds are single instructions there).
    fn softmax_row_widest<T>(row: &[T], out: &mut [T]) => softmax_row
}

/// `dlogits = dloss · (softmax(logits) - onehot(labels)) / N`.
pub fn sparse_softmax_cross_entropy_grad_into<T: Float, I: IndexElement>(
    logits: &[T],
    classes: usize,
    labels: &[I],
    dloss: T,
    dlogits: &mut [T],
) -> Result<(), TensorError> {
    let n = batch_size(GRAD_OP, logits, classes, labels)?;
    check::buffer_len(GRAD_OP, "dlogits", logits.len(), dlogits.len())?;
    let scale = dloss / T::from_usize(n);
    super::threads::for_each_rows(dlogits, classes, |start, part| {
        let rows = start / classes..(start + part.len()) / classes;
        for ((out, row), &label) in part
            .chunks_exact_mut(classes)
            .zip(logits[start..].chunks_exact(classes))
            .zip(&labels[rows])
        {
            softmax_row_widest(row, out);
            out[label.to_i64() as usize] -= T::ONE;
            for v in out.iter_mut() {
                *v *= scale;
            }
        }
    });
    Ok(())
}

/// Checks `[N, C]` logits against `[N]` labels.
fn check_shapes(op: &'static str, logits: &Tensor, labels: &Tensor) -> Result<usize, TensorError> {
    if logits.ndim() != 2 || labels.ndim() != 1 || labels.shape()[0] != logits.shape()[0] {
        return Err(TensorError::ShapeMismatch {
            op,
            lhs: logits.shape().to_vec(),
            rhs: labels.shape().to_vec(),
        });
    }
    Ok(logits.shape()[1])
}

/// The mean loss over the batch as a 0-dim tensor of the logits' dtype; `labels` is i32 or i64.
pub fn sparse_softmax_cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
) -> Result<Tensor, TensorError> {
    let classes = check_shapes(LOSS_OP, logits, labels)?;
    let ids = IndexSlice::of(LOSS_OP, labels)?;
    with_float!(LOSS_OP, logits.dtype(), |T| {
        let xs = T::read(LOSS_OP, logits)?;
        let loss = with_indices!(ids, |v| sparse_softmax_cross_entropy_slice::<T, _>(
            &xs, classes, v
        ))?;
        Ok(T::write(&[], vec![loss], logits.dtype()))
    })
}

/// The gradient wrt the logits, scaled by `dloss` (the upstream gradient of the loss: a float
/// tensor with one element, 1 when the loss is the objective).
pub fn sparse_softmax_cross_entropy_grad(
    logits: &Tensor,
    labels: &Tensor,
    dloss: &Tensor,
) -> Result<Tensor, TensorError> {
    let classes = check_shapes(GRAD_OP, logits, labels)?;
    let ids = IndexSlice::of(GRAD_OP, labels)?;
    if dloss.n_elements() != 1 {
        return Err(TensorError::InvalidArgument {
            op: GRAD_OP,
            reason: format!("dloss must hold one element, got shape {:?}", dloss.shape()),
        });
    }
    check::same_dtype(GRAD_OP, logits, dloss)?;
    with_float!(GRAD_OP, logits.dtype(), |T| {
        let xs = T::read(GRAD_OP, logits)?;
        let scale = T::read(GRAD_OP, dloss)?[0];
        let mut dx = vec![T::ZERO; xs.len()];
        with_indices!(ids, |v| sparse_softmax_cross_entropy_grad_into::<T, _>(
            &xs, classes, v, scale, &mut dx
        ))?;
        Ok(T::write(logits.shape(), dx, logits.dtype()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rows` rows of `classes` logits in [-6, 8.5) and a label for each.
    fn operands(rows: usize, classes: usize) -> (Vec<f32>, Vec<i64>) {
        let logits = (0..rows * classes)
            .map(|i| ((i * 37) % 101) as f32 / 7.0 - 6.0)
            .collect();
        let labels = (0..rows as i64)
            .map(|r| (r * 11) % classes as i64)
            .collect();
        (logits, labels)
    }

    /// The gradient's rows, whose softmax runs on the widest vector unit, give the bits of the
    /// portable softmax row by row: `dloss · (softmax − onehot) / N`.
    #[test]
    fn the_gradient_gives_the_portable_softmax_bits() {
        let (rows, classes) = (7, 45);
        let (logits, labels) = operands(rows, classes);
        let mut got = vec![0f32; logits.len()];
        sparse_softmax_cross_entropy_grad_into(&logits, classes, &labels, 0.5, &mut got).unwrap();
        let scale = 0.5 / rows as f32;
        for (r, (row, got)) in logits
            .chunks_exact(classes)
            .zip(got.chunks_exact(classes))
            .enumerate()
        {
            let mut want = vec![0f32; classes];
            softmax_row(row, &mut want);
            want[labels[r] as usize] -= 1.0;
            want.iter_mut().for_each(|v| *v *= scale);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got), bits(&want), "row {r}");
        }
    }

    /// The loss, whose rows' log-sum-exp runs on the widest vector unit, gives the bits of the
    /// portable rows summed in order, on rows of whole lanes and rows with a tail.
    #[test]
    fn the_loss_gives_the_portable_log_sum_exp_bits() {
        for classes in [64, 45, 3] {
            let rows = 9;
            let (logits, labels) = operands(rows, classes);
            let got = sparse_softmax_cross_entropy_slice(&logits, classes, &labels).unwrap();
            let mut total = 0f32;
            for (row, &label) in logits.chunks_exact(classes).zip(&labels) {
                total += crate::kernels::softmax::log_sum_exp(row) - row[label as usize];
            }
            let want = total / rows as f32;
            assert_eq!(got.to_bits(), want.to_bits(), "{classes} classes");
        }
    }
}
