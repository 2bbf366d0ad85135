//! The one-hot kernel, on a block of the output's columns (a class dim split over ranks).

use tensor::kernels::{check_indices, Float, IndexElement};
use tensor::TensorError;

/// The block of columns a one-hot output holds: `first..first + local` of `depth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Columns {
    /// The global index of the block's first column.
    pub first: usize,
    /// Columns in the block.
    pub local: usize,
    /// Columns of the whole output (the number of classes).
    pub depth: usize,
}

/// `out[r, c] = 1` where `labels[r] == first + c`, else 0; every label is checked against
/// `0..depth` before anything is written.
pub(crate) fn one_hot_into<T: Float, I: IndexElement>(
    labels: &[I],
    columns: Columns,
    out: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "one_hot";
    if columns.first + columns.local > columns.depth || labels.len() * columns.local != out.len() {
        return Err(TensorError::InvalidArgument {
            op: OP,
            reason: format!(
                "an output of {} elements cannot hold columns {}..{} of {} for {} labels",
                out.len(),
                columns.first,
                columns.first + columns.local,
                columns.depth,
                labels.len()
            ),
        });
    }
    check_indices(OP, labels, columns.depth)?;
    out.fill(T::ZERO);
    if columns.local == 0 {
        return Ok(());
    }
    for (row, &label) in out.chunks_exact_mut(columns.local).zip(labels) {
        let column = (label.to_i64() as usize).checked_sub(columns.first);
        if let Some(c) = column.filter(|&c| c < columns.local) {
            row[c] = T::ONE;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_of_columns_holds_its_ones() {
        let mut out = [0.0f64; 6];
        let columns = Columns {
            first: 2,
            local: 2,
            depth: 5,
        };
        one_hot_into(&[3i32, 0, 2], columns, &mut out).unwrap();
        assert_eq!(out, [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]);
        let err = one_hot_into(&[5i32, 0, 2], columns, &mut out).unwrap_err();
        assert!(err.to_string().contains('5'), "{err}");
    }
}
