//! Embedding lookup (gathering rows of a table by integer index) and its gradient (scatter-adding
//! rows back into a table-shaped buffer).
//!
//! Indices are i32 or i64 tensors of any shape; every index is checked against the table size
//! before anything is written, and the first bad one is reported with its position.

use crate::error::TensorError;
use crate::kernels::check;
use crate::kernels::float::{with_float, Float};
use crate::tensor::{Storage, Tensor};

/// An integer type usable as an index or class label: `i32` or `i64`.
pub trait IndexElement: Copy + Send + Sync + 'static {
    /// The value as i64.
    fn to_i64(self) -> i64;
}

impl IndexElement for i32 {
    #[inline(always)]
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
}

impl IndexElement for i64 {
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self
    }
}

/// `Ok` when every entry of `indices` lies in `0..bound`; otherwise the first offender.
pub fn check_indices<I: IndexElement>(
    op: &'static str,
    indices: &[I],
    bound: usize,
) -> Result<(), TensorError> {
    match indices
        .iter()
        .position(|&i| usize::try_from(i.to_i64()).map_or(true, |i| i >= bound))
    {
        None => Ok(()),
        Some(position) => Err(TensorError::IndexOutOfRange {
            op,
            position,
            index: indices[position].to_i64(),
            bound,
        }),
    }
}

/// The entries of an index tensor, borrowed in their own integer type.
pub(crate) enum IndexSlice<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl<'a> IndexSlice<'a> {
    /// The entries of `tensor`, or [`TensorError::IndexDType`] unless it is i32 or i64.
    pub(crate) fn of(op: &'static str, tensor: &'a Tensor) -> Result<IndexSlice<'a>, TensorError> {
        match tensor.storage() {
            Storage::I32(v) => Ok(IndexSlice::I32(v)),
            Storage::I64(v) => Ok(IndexSlice::I64(v)),
            other => Err(TensorError::IndexDType {
                op,
                got: other.dtype(),
            }),
        }
    }
}

/// Runs `$body` with `$v` bound to the typed index slice inside an [`IndexSlice`].
macro_rules! with_indices {
    ($indices:expr, |$v:ident| $body:expr) => {
        match $indices {
            $crate::kernels::embedding::IndexSlice::I32($v) => $body,
            $crate::kernels::embedding::IndexSlice::I64($v) => $body,
        }
    };
}
pub(crate) use with_indices;

/// `out[p, :] = table[indices[p], :]` for a table of rows of `dim` elements (any element type).
pub fn gather_rows_into<T: Copy + Default, I: IndexElement>(
    table: &[T],
    dim: usize,
    indices: &[I],
    out: &mut [T],
) -> Result<(), TensorError> {
    let rows = table.len().checked_div(dim).unwrap_or(0);
    gather_block_rows_into(table, RowBlock::whole(rows), dim, indices, out)
}

/// The rows of a `vocab`-row table one shard holds: `first..first + rows` (a vocabulary-parallel
/// embedding splits its table's rows over ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowBlock {
    /// The global index of the block's first row.
    pub first: usize,
    /// Rows of the whole table; indices are checked against it.
    pub vocab: usize,
}

impl RowBlock {
    /// The whole table of `vocab` rows.
    pub fn whole(vocab: usize) -> RowBlock {
        RowBlock { first: 0, vocab }
    }

    /// The block row of global row `row`, if the block (of `rows` rows) holds it.
    #[inline(always)]
    fn local(self, row: usize, rows: usize) -> Option<usize> {
        row.checked_sub(self.first).filter(|&r| r < rows)
    }

    /// `Ok` when `rows` rows from `first` fit in the table.
    fn check(self, op: &'static str, rows: usize) -> Result<(), TensorError> {
        if self.first + rows > self.vocab {
            return Err(TensorError::InvalidArgument {
                op,
                reason: format!(
                    "a block of {rows} rows from row {} does not fit a table of {} rows",
                    self.first, self.vocab
                ),
            });
        }
        Ok(())
    }
}

/// [`gather_rows_into`] on the block `block` of a table (`table` holds its rows of `dim`
/// elements): an index in the block copies its row, any other valid index writes zeros (the
/// rank holding that row writes it; the shards' outputs sum to the lookup).
pub fn gather_block_rows_into<T: Copy + Default, I: IndexElement>(
    table: &[T],
    block: RowBlock,
    dim: usize,
    indices: &[I],
    out: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "embedding";
    check::buffer_len(OP, "out", indices.len() * dim, out.len())?;
    let Some(n_rows) = table.len().checked_div(dim) else {
        // Rows of nothing: there is nothing to copy and no row count to check against.
        return Ok(());
    };
    check::buffer_len(OP, "table", n_rows * dim, table.len())?;
    block.check(OP, n_rows)?;
    check_indices(OP, indices, block.vocab)?;
    for (dst, &i) in out.chunks_exact_mut(dim).zip(indices) {
        match block.local(i.to_i64() as usize, n_rows) {
            Some(row) => dst.copy_from_slice(&table[row * dim..(row + 1) * dim]),
            None => dst.fill(T::default()),
        }
    }
    Ok(())
}

/// `table_grad[indices[p], :] += src[p, :]`: accumulates rows of `dim` elements (repeated indices
/// add up). Nothing is written if an index is out of range.
pub fn scatter_add_rows<T: Float, I: IndexElement>(
    table_grad: &mut [T],
    dim: usize,
    indices: &[I],
    src: &[T],
) -> Result<(), TensorError> {
    let rows = table_grad.len().checked_div(dim).unwrap_or(0);
    scatter_add_block_rows(table_grad, RowBlock::whole(rows), dim, indices, src)
}

/// [`scatter_add_rows`] into the block `block` of a table gradient: only indices in the block
/// are accumulated (into their block rows); every index is checked against the whole table.
pub fn scatter_add_block_rows<T: Float, I: IndexElement>(
    table_grad: &mut [T],
    block: RowBlock,
    dim: usize,
    indices: &[I],
    src: &[T],
) -> Result<(), TensorError> {
    const OP: &str = "scatter_add";
    check::buffer_len(OP, "src", indices.len() * dim, src.len())?;
    let Some(n_rows) = table_grad.len().checked_div(dim) else {
        // Rows of nothing: there is nothing to copy and no row count to check against.
        return Ok(());
    };
    check::buffer_len(OP, "table_grad", n_rows * dim, table_grad.len())?;
    block.check(OP, n_rows)?;
    check_indices(OP, indices, block.vocab)?;
    for (row_src, &i) in src.chunks_exact(dim).zip(indices) {
        let Some(row) = block.local(i.to_i64() as usize, n_rows) else {
            continue;
        };
        for (d, &v) in table_grad[row * dim..(row + 1) * dim]
            .iter_mut()
            .zip(row_src)
        {
            *d += v;
        }
    }
    Ok(())
}

/// Looks up rows of `table` (`[vocab, dim]`, any dtype) by `indices` (i32 or i64, any shape):
/// the result has shape `[indices.shape()..., dim]` and `table`'s dtype.
pub fn embedding(table: &Tensor, indices: &Tensor) -> Result<Tensor, TensorError> {
    const OP: &str = "embedding";
    if table.ndim() != 2 {
        return Err(TensorError::InvalidArgument {
            op: OP,
            reason: format!("the table must be 2-D, got shape {:?}", table.shape()),
        });
    }
    let (vocab, dim) = (table.shape()[0], table.shape()[1]);
    let ids = IndexSlice::of(OP, indices)?;
    let mut out_shape = indices.shape().to_vec();
    out_shape.push(dim);
    let mut out = Tensor::zeros(table.dtype(), &out_shape);
    // A row copy moves bytes: one gather serves every dtype.
    let row_bytes = dim * table.dtype().size_in_bytes();
    let table_bytes = table.as_bytes();
    let out_bytes = out.as_bytes_mut();
    with_indices!(ids, |v| {
        check_indices(OP, v, vocab)?;
        gather_rows_into(table_bytes, row_bytes, v, out_bytes)
    })?;
    Ok(out)
}

/// The gradient of the table of [`embedding`]: a `[vocab, dim]` tensor holding, for every row,
/// the sum of the rows of `dy` (`[indices.shape()..., dim]`) gathered from it.
pub fn embedding_grad(dy: &Tensor, indices: &Tensor, vocab: usize) -> Result<Tensor, TensorError> {
    const OP: &str = "embedding_grad";
    check::min_rank(OP, dy, 1)?;
    let dim = dy.shape()[dy.ndim() - 1];
    let mut expected = indices.shape().to_vec();
    expected.push(dim);
    if dy.shape() != expected.as_slice() {
        return Err(TensorError::ShapeMismatch {
            op: OP,
            lhs: expected,
            rhs: dy.shape().to_vec(),
        });
    }
    let ids = IndexSlice::of(OP, indices)?;
    with_float!(OP, dy.dtype(), |T| {
        let g = T::read(OP, dy)?;
        let mut table_grad = vec![T::ZERO; vocab * dim];
        with_indices!(ids, |v| {
            check_indices(OP, v, vocab)?;
            scatter_add_rows::<T, _>(&mut table_grad, dim, v, &g)
        })?;
        Ok(T::write(&[vocab, dim], table_grad, dy.dtype()))
    })
}
