//! Column sums taken while the rows are produced: a bias's gradient (`BiasAddGrad`, the sum of
//! `dY` over its rows) summed by the kernel that writes `dY`, each row added while it is in L1,
//! instead of by a second pass that reads `dY` back from memory.
//!
//! [`RowSums`] adds the rows it is given in the order of the op it stands in for: in order from
//! zeros (the ordinary `BiasAddGrad`, `super::sum_to_shape_into`'s walk) or, in deterministic
//! mode, in canonical blocks joined in the canonical tree ([`super::det`]'s `det_sum_rows`). The
//! bits are those of the separate sum either way.

use super::det::{local_blocks, TreeStack};
use super::float::Float;
use super::wide::widest;
use crate::error::TensorError;

/// The order in which [`RowSums`] adds a column's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// Every row in order, from zeros: the ordinary mode's sum.
    Sequential,
    /// Canonical blocks of `block_len` rows, each summed in order from zeros, the blocks joined
    /// in the canonical tree: deterministic mode's sum.
    Canonical {
        /// Rows per canonical block.
        block_len: usize,
    },
}

/// The sums over rows of `cols` columns, fed one row at a time ([`RowSums::add_row`]).
#[derive(Debug)]
pub struct RowSums<T> {
    /// The current block's sums (every row's, in [`RowOrder::Sequential`]).
    acc: Vec<T>,
    order: RowOrder,
    /// Rows the sums expect in all, and rows added so far.
    rows: usize,
    added: usize,
    /// Finished blocks joined as far as the canonical tree allows.
    tree: TreeStack<Vec<T>>,
    /// Joined blocks' buffers, reused for the next blocks.
    spare: Vec<Vec<T>>,
}

impl<T: Float> RowSums<T> {
    /// Sums over `rows` rows of `cols` columns in `order`. A canonical order needs the rows to
    /// be whole blocks, a power-of-two count of them (an aligned run of a longer dim's blocks):
    /// otherwise an error naming `op` and the rule, as the separate sum would give.
    pub fn new(
        op: &'static str,
        (rows, cols): (usize, usize),
        order: RowOrder,
    ) -> Result<Self, TensorError> {
        if let RowOrder::Canonical { block_len } = order {
            if rows > 0 {
                local_blocks(op, rows, block_len)?;
            }
        }
        Ok(RowSums {
            acc: vec![T::ZERO; cols],
            order,
            rows,
            added: 0,
            tree: TreeStack::new(),
            spare: Vec::new(),
        })
    }

    /// Columns per row.
    pub fn cols(&self) -> usize {
        self.acc.len()
    }

    /// Rows the sums expect in all.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Adds the next row (`cols` elements; the caller keeps to [`RowSums::rows`] rows).
    #[inline(always)]
    pub fn add_row(&mut self, row: &[T]) {
        debug_assert_eq!(row.len(), self.acc.len());
        debug_assert!(self.added < self.rows, "more rows than the sums expect");
        for (a, &v) in self.acc.iter_mut().zip(row) {
            *a += v;
        }
        self.added += 1;
        if let RowOrder::Canonical { block_len } = self.order {
            if self.added.is_multiple_of(block_len) {
                self.close_block();
            }
        }
    }

    /// Adds `rows` (whole rows of [`RowSums::cols`], in order) on the widest vector unit the
    /// CPU has: the bits of [`RowSums::add_row`] on each.
    pub fn add_rows(&mut self, rows: &[T]) {
        if self.cols() > 0 {
            add_rows_widest(self, rows);
        }
    }

    /// The finished block's sums to the tree, a fresh block from zeros.
    #[inline(never)]
    fn close_block(&mut self) {
        let cols = self.acc.len();
        let mut next = self.spare.pop().unwrap_or_default();
        next.clear();
        next.resize(cols, T::ZERO);
        let block = std::mem::replace(&mut self.acc, next);
        let spare = &mut self.spare;
        self.tree.push(block, |mut left, right| {
            for (l, r) in left.iter_mut().zip(&right) {
                *l += *r;
            }
            spare.push(right);
            left
        });
    }

    /// The sums, once every row was added, into `out` (`cols` elements).
    pub fn finish(mut self, op: &'static str, out: &mut [T]) -> Result<(), TensorError> {
        super::check::buffer_len(op, "sums", self.acc.len(), out.len())?;
        if self.added != self.rows {
            return Err(TensorError::InvalidArgument {
                op,
                reason: format!("{} of {} rows were summed", self.added, self.rows),
            });
        }
        match (self.order, self.tree.take_root()) {
            (RowOrder::Canonical { .. }, Some(root)) => out.copy_from_slice(&root),
            _ => out.copy_from_slice(&self.acc),
        }
        Ok(())
    }
}

widest! {
    /// [`RowSums::add_rows`]' loop, on the widest vector unit the CPU has.
    fn add_rows_widest<T>(sums: &mut RowSums<T>, rows: &[T]) => add_rows_loop
}

/// [`add_rows_widest`]'s loop (`cols > 0`).
#[inline(always)]
fn add_rows_loop<T: Float>(sums: &mut RowSums<T>, rows: &[T]) {
    let cols = sums.cols();
    debug_assert!(rows.len().is_multiple_of(cols));
    for row in rows.chunks_exact(cols) {
        sums.add_row(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919) % 1013) as f32 / 101.0 - 4.9)
            .collect()
    }

    /// Row by row, both orders give the bits of the separate sums: the ordinary sum over
    /// leading dims and deterministic mode's canonical one, including a run of blocks that is
    /// a subtree of a longer dim's.
    #[test]
    fn rows_fed_one_by_one_sum_as_the_separate_kernels() {
        let (rows, cols) = (96, 37);
        let x = values(rows * cols);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let feed = |order| {
            let mut sums = RowSums::new("test", (rows, cols), order).unwrap();
            // One row, then runs of rows.
            let (first, rest) = x.split_at(cols);
            sums.add_row(first);
            rest.chunks(5 * cols).for_each(|run| sums.add_rows(run));
            let mut out = vec![f32::NAN; cols];
            sums.finish("test", &mut out).unwrap();
            out
        };
        let mut want = vec![0f32; cols];
        super::super::sum_to_shape_into(&x, &[rows, cols], &[cols], &mut want).unwrap();
        assert_eq!(bits(&feed(RowOrder::Sequential)), bits(&want));
        for block_len in [3, 6, 12, 48, 96] {
            let mut want = vec![0f32; cols];
            super::super::det::det_sum_rows(&x, rows, cols, block_len, &mut want).unwrap();
            let got = feed(RowOrder::Canonical { block_len });
            assert_eq!(bits(&got), bits(&want), "blocks of {block_len}");
        }
    }

    /// The producers that feed the sums row by row give the bits of the producer and then the
    /// separate sum: an activation's gradient and an elementwise op in place, in both orders.
    #[test]
    fn producers_summing_rows_give_the_two_passes_bits() {
        use super::super::{binary_in_place, unary_grad_into, BinaryOp, GeluForm, UnaryOp};
        let (rows, cols) = (64, 50);
        let (x, dy) = (values(rows * cols), values(rows * cols + 3)[3..].to_vec());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let separate_sum = |v: &[f32], order| {
            let mut sums = vec![0f32; cols];
            match order {
                RowOrder::Sequential => {
                    super::super::sum_to_shape_into(v, &[rows, cols], &[cols], &mut sums).unwrap()
                }
                RowOrder::Canonical { block_len } => {
                    super::super::det::det_sum_rows(v, rows, cols, block_len, &mut sums).unwrap()
                }
            }
            sums
        };
        for order in [RowOrder::Sequential, RowOrder::Canonical { block_len: 8 }] {
            let op = UnaryOp::Gelu(GeluForm::Tanh);
            let mut want = vec![0f32; x.len()];
            unary_grad_into(op, &x, &dy, &mut want).unwrap();
            let mut got = vec![f32::NAN; x.len()];
            let mut sums = RowSums::new("gelu", (rows, cols), order).unwrap();
            super::super::unary_grad_summing_rows(op, &x, &dy, &mut got, &mut sums).unwrap();
            let mut db = vec![f32::NAN; cols];
            sums.finish("gelu", &mut db).unwrap();
            assert_eq!(bits(&got), bits(&want), "{order:?}: dx");
            assert_eq!(
                bits(&db),
                bits(&separate_sum(&want, order)),
                "{order:?}: dx's sums"
            );

            for acc_is_lhs in [true, false] {
                let mut want = x.clone();
                binary_in_place(BinaryOp::Add, &mut want, &dy, acc_is_lhs).unwrap();
                let mut got = x.clone();
                let mut sums = RowSums::new("add", (rows, cols), order).unwrap();
                super::super::binary_in_place_summing_rows(
                    BinaryOp::Add,
                    &mut got,
                    &dy,
                    acc_is_lhs,
                    &mut sums,
                )
                .unwrap();
                let mut db = vec![f32::NAN; cols];
                sums.finish("add", &mut db).unwrap();
                assert_eq!(bits(&got), bits(&want), "{order:?}: sum");
                assert_eq!(
                    bits(&db),
                    bits(&separate_sum(&want, order)),
                    "{order:?}: its sums"
                );
            }
        }
    }

    /// Rows that are not whole canonical blocks, or too few rows, are refused by name.
    #[test]
    fn misaligned_or_missing_rows_are_errors() {
        let err = RowSums::<f32>::new("bias_grad", (10, 4), RowOrder::Canonical { block_len: 4 })
            .unwrap_err();
        assert!(err.to_string().contains("bias_grad"), "{err}");
        let mut sums = RowSums::<f32>::new("bias_grad", (3, 2), RowOrder::Sequential).unwrap();
        sums.add_row(&[1.0, 2.0]);
        let err = sums.finish("bias_grad", &mut [0.0; 2]).unwrap_err();
        assert!(err.to_string().contains("1 of 3 rows"), "{err}");
    }
}
