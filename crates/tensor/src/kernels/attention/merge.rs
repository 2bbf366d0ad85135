//! Combining partial attention results: two `(out, lse)` pairs over disjoint sets of keys give
//! the pair over their union.

use super::{check_lengths, row_elements};
use crate::error::TensorError;
use crate::kernels::float::Float;

/// Merges the partial result `(other_out, other_lse)` into `(out, lse)`, both from the same
/// queries over disjoint key blocks (rows of `head_dim` elements; `lse` one entry per row):
/// `lse ← ln(e^lse + e^other_lse)` and `out ← e^(lse_old − lse)·out + e^(other_lse − lse)·other_out`.
///
/// A row that saw no key in one of them (`lse = -inf`, `out = 0`) takes the other's values;
/// a row that saw none in either stays `0` with `-inf`.
pub fn merge_attention_into<T: Float>(
    out: &mut [T],
    lse: &mut [T],
    other_out: &[T],
    other_lse: &[T],
    head_dim: usize,
) -> Result<(), TensorError> {
    const OP: &str = "merge_attention";
    let rows = lse.len();
    let elements = row_elements(OP, rows, head_dim)?;
    check_lengths(
        OP,
        &[
            ("out", elements, out.len()),
            ("other_out", elements, other_out.len()),
            ("other_lse", rows, other_lse.len()),
        ],
    )?;
    for (r, (lse, &other)) in lse.iter_mut().zip(other_lse).enumerate() {
        let top = lse.max(other);
        if top == T::NEG_INFINITY {
            continue; // no key in either
        }
        let (own_weight, other_weight) = ((*lse - top).exp(), (other - top).exp());
        let total = own_weight + other_weight;
        let (own_weight, other_weight) = (own_weight / total, other_weight / total);
        *lse = top + total.ln();
        let range = r * head_dim..(r + 1) * head_dim;
        for (o, &x) in out[range.clone()].iter_mut().zip(&other_out[range]) {
            *o = own_weight * *o + other_weight * x;
        }
    }
    Ok(())
}
