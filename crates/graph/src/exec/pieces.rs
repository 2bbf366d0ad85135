//! Kernels that cut tensors into pieces and join them: [`crate::Op::Concat`] and
//! [`crate::Op::Split`] along one axis, [`crate::Op::StridedSlice`] and its scatter back
//! ([`crate::Op::StridedSliceGrad`]).
//!
//! Along `axis`, a tensor of `shape` is `outer = Π shape[..axis]` blocks, each `shape[axis]`
//! rows of `inner = Π shape[axis + 1..]` elements; piece `p` holds `sizes[p]` rows of every
//! block, so joining and cutting are the same walk over contiguous runs in opposite directions.

use tensor::kernels::threads;
use tensor::TensorError;

use crate::error::GraphError;
use crate::exec::eval::EvalCtx;

/// How a whole tensor is made of pieces along one axis.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AxisPieces<'a> {
    /// Blocks before the axis.
    pub outer: usize,
    /// Elements of one row along the axis (the dims after it).
    pub inner: usize,
    /// Every piece's size along the axis.
    pub sizes: &'a [usize],
}

impl<'a> AxisPieces<'a> {
    /// The pieces of sizes `sizes` along `axis` of a whole tensor of `shape`.
    pub(crate) fn new(shape: &[usize], axis: usize, sizes: &'a [usize]) -> AxisPieces<'a> {
        AxisPieces {
            outer: shape[..axis].iter().product(),
            inner: shape[axis + 1..].iter().product(),
            sizes,
        }
    }

    /// Checks the lengths of the whole and of every piece.
    fn check(
        &self,
        whole_len: usize,
        piece_lens: impl Iterator<Item = usize>,
        ctx: &EvalCtx<'_>,
    ) -> Result<(), GraphError> {
        let rows: usize = self.sizes.iter().sum();
        check_len(
            ctx,
            "the whole tensor",
            self.outer * rows * self.inner,
            whole_len,
        )?;
        let mut n_pieces = 0;
        for (p, len) in piece_lens.enumerate() {
            let expected = self.outer * self.sizes.get(p).copied().unwrap_or(0) * self.inner;
            check_len(ctx, "a piece", expected, len)?;
            n_pieces += 1;
        }
        check_len(ctx, "the piece count", self.sizes.len(), n_pieces)
    }

    /// Calls `f(piece, piece_offset, whole_offset, len)` for every contiguous run of the outer
    /// blocks `blocks`, in the whole's order (lengths checked by [`AxisPieces::check`]).
    fn runs(&self, blocks: std::ops::Range<usize>, mut f: impl FnMut(usize, usize, usize, usize)) {
        let rows: usize = self.sizes.iter().sum();
        let mut whole = blocks.start * rows * self.inner;
        for o in blocks {
            for (p, &size) in self.sizes.iter().enumerate() {
                let len = size * self.inner;
                f(p, o * len, whole, len);
                whole += len;
            }
        }
    }
}

/// `out` = the pieces joined along the axis; large joins cut `out` into runs of whole outer
/// blocks, one per thread of the rank (each element is copied once either way).
pub(crate) fn concat_into<T: Copy + Send + Sync>(
    pieces: &[&[T]],
    axis: AxisPieces<'_>,
    out: &mut [T],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    axis.check(out.len(), pieces.iter().map(|p| p.len()), ctx)?;
    let block = out.len() / axis.outer.max(1);
    let per = threads::rows_per_part(axis.outer, block);
    if per >= axis.outer || block == 0 {
        axis.runs(0..axis.outer, |p, at, whole, len| {
            out[whole..whole + len].copy_from_slice(&pieces[p][at..at + len]);
        });
        return Ok(());
    }
    let parts: Vec<&mut [T]> = out.chunks_mut(per * block).collect();
    threads::for_each_part(parts, |i, part| {
        let first = i * per;
        let blocks = first..first + part.len() / block;
        axis.runs(blocks, |p, at, whole, len| {
            let whole = whole - first * block;
            part[whole..whole + len].copy_from_slice(&pieces[p][at..at + len]);
        });
    });
    Ok(())
}

/// `outs` = `x` cut along the axis.
pub(crate) fn split_into<T: Copy + Send + Sync>(
    x: &[T],
    axis: AxisPieces<'_>,
    outs: &mut [&mut [T]],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    axis.check(x.len(), outs.iter().map(|o| o.len()), ctx)?;
    let block = x.len() / axis.outer.max(1);
    let per = threads::rows_per_part(axis.outer, block);
    if per >= axis.outer || block == 0 {
        axis.runs(0..axis.outer, |p, at, whole, len| {
            outs[p][at..at + len].copy_from_slice(&x[whole..whole + len]);
        });
        return Ok(());
    }
    // Part `i` takes outer blocks `i·per ..` of every piece.
    let mut chunks: Vec<_> = outs
        .iter_mut()
        .zip(axis.sizes)
        .map(|(o, &size)| o.chunks_mut((per * size * axis.inner).max(1)))
        .collect();
    let parts: Vec<Vec<&mut [T]>> = (0..axis.outer.div_ceil(per))
        .map(|_| {
            chunks
                .iter_mut()
                .map(|c| c.next().unwrap_or_default())
                .collect()
        })
        .collect();
    threads::for_each_part(parts, |i, mut part| {
        let first = i * per;
        let blocks = first..(first + per).min(axis.outer);
        axis.runs(blocks, |p, at, whole, len| {
            let at = at - first * axis.sizes[p] * axis.inner;
            part[p][at..at + len].copy_from_slice(&x[whole..whole + len]);
        });
    });
    Ok(())
}

/// `out` = the strided slice of `x` (of `x_shape`) starting at `begin` with `strides`; the
/// slice's extent is `out_shape`.
pub(crate) fn strided_slice_into<T: Copy>(
    x: &[T],
    x_shape: &[usize],
    slice: Strided<'_>,
    out: &mut [T],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    check_len(ctx, "x", x_shape.iter().product(), x.len())?;
    check_len(ctx, "out", slice.shape.iter().product(), out.len())?;
    slice.walk(x_shape, ctx, |k, at| out[k] = x[at])
}

/// `dx` = zeros of `dx_shape` with `dy` (the strided slice's extent) at the sliced positions.
pub(crate) fn strided_slice_grad_into<T: Copy + Default>(
    dy: &[T],
    slice: Strided<'_>,
    dx_shape: &[usize],
    dx: &mut [T],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    check_len(ctx, "dx", dx_shape.iter().product(), dx.len())?;
    check_len(ctx, "dy", slice.shape.iter().product(), dy.len())?;
    dx.fill(T::default());
    slice.walk(dx_shape, ctx, |k, at| dx[at] = dy[k])
}

/// A strided slice: where it starts, its steps and its extent (the slice's shape).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Strided<'a> {
    /// First index per dim.
    pub begin: &'a [usize],
    /// Step per dim.
    pub strides: &'a [usize],
    /// Elements taken per dim.
    pub shape: &'a [usize],
}

impl Strided<'_> {
    /// Checks that the slice lies in a tensor of `whole`; then calls `f(k, at)` for every
    /// element `k` of the slice (row-major) with its flat index `at` in the whole tensor.
    fn walk(
        &self,
        whole: &[usize],
        ctx: &EvalCtx<'_>,
        f: impl FnMut(usize, usize),
    ) -> Result<(), GraphError> {
        let ndim = whole.len();
        let fits = [self.begin.len(), self.strides.len(), self.shape.len()] == [ndim; 3]
            && (0..ndim).all(|d| {
                self.shape[d] == 0
                    || self.begin[d] + (self.shape[d] - 1) * self.strides[d] < whole[d]
            });
        if !fits {
            return Err(GraphError::Kernel {
                node: ctx.node.to_string(),
                source: Box::new(TensorError::InvalidArgument {
                    op: "strided_slice",
                    reason: format!(
                        "begin {:?}, strides {:?} and extent {:?} do not fit in shape {whole:?}",
                        self.begin, self.strides, self.shape
                    ),
                }),
            });
        }
        let whole_strides = layout::row_major_strides(whole);
        let step: Vec<usize> = (0..ndim)
            .map(|d| self.strides[d] * whole_strides[d])
            .collect();
        let start = (0..ndim).map(|d| self.begin[d] * whole_strides[d]).sum();
        walk_strided(self.shape, &step, start, f);
        Ok(())
    }
}

/// Calls `f(k, at)` for every flat index `k` of `shape` in row-major order with the offset `at`
/// an operand starting at `start` with `strides` (per dim, in elements; 0 for a broadcast dim)
/// reads there.
pub(crate) fn walk_strided(
    shape: &[usize],
    strides: &[usize],
    start: usize,
    mut f: impl FnMut(usize, usize),
) {
    let n: usize = shape.iter().product();
    let mut counter = vec![0usize; shape.len()];
    let mut at = start;
    for k in 0..n {
        f(k, at);
        for d in (0..shape.len()).rev() {
            counter[d] += 1;
            at += strides[d];
            if counter[d] < shape[d] {
                break;
            }
            at -= strides[d] * shape[d];
            counter[d] = 0;
        }
    }
}

fn check_len(
    ctx: &EvalCtx<'_>,
    buffer: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), GraphError> {
    if expected == got {
        return Ok(());
    }
    Err(GraphError::Kernel {
        node: ctx.node.to_string(),
        source: Box::new(TensorError::BufferLength {
            op: "concat/split",
            buffer,
            expected,
            got,
        }),
    })
}
