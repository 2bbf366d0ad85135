//! Kernels that cut tensors into pieces and join them: [`crate::Op::Concat`] and
//! [`crate::Op::Split`] along one axis.
//!
//! Along `axis`, a tensor of `shape` is `outer = Π shape[..axis]` blocks, each `shape[axis]`
//! rows of `inner = Π shape[axis + 1..]` elements; piece `p` holds `sizes[p]` rows of every
//! block, so joining and cutting are the same walk over contiguous runs in opposite directions.

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

    /// Checks the lengths of the whole and of every piece; then calls
    /// `f(piece, piece_offset, whole_offset, len)` for every contiguous run, in the whole's order.
    fn walk(
        &self,
        whole_len: usize,
        piece_lens: impl Iterator<Item = usize>,
        ctx: &EvalCtx<'_>,
        mut f: impl FnMut(usize, usize, usize, usize),
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
        check_len(ctx, "the piece count", self.sizes.len(), n_pieces)?;
        let mut whole = 0;
        for o in 0..self.outer {
            for (p, &size) in self.sizes.iter().enumerate() {
                let len = size * self.inner;
                f(p, o * len, whole, len);
                whole += len;
            }
        }
        Ok(())
    }
}

/// `out` = the pieces joined along the axis.
pub(crate) fn concat_into<T: Copy>(
    pieces: &[&[T]],
    axis: AxisPieces<'_>,
    out: &mut [T],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    axis.walk(
        out.len(),
        pieces.iter().map(|p| p.len()),
        ctx,
        |p, at, whole, len| {
            out[whole..whole + len].copy_from_slice(&pieces[p][at..at + len]);
        },
    )
}

/// `outs` = `x` cut along the axis.
pub(crate) fn split_into<T: Copy>(
    x: &[T],
    axis: AxisPieces<'_>,
    outs: &mut [&mut [T]],
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    let lens: Vec<usize> = outs.iter().map(|o| o.len()).collect();
    axis.walk(x.len(), lens.into_iter(), ctx, |p, at, whole, len| {
        outs[p][at..at + len].copy_from_slice(&x[whole..whole + len]);
    })
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
