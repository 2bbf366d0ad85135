//! Reordering dims: 2-D [`transpose`] and N-D [`permute`], for every dtype (they move elements,
//! never convert them).
//!
//! `permute(x, axes)` returns `y` with `y.shape[d] = x.shape[axes[d]]` (NumPy's `transpose(x,
//! axes)`). Before copying, dims of size 1 are dropped and dims that stay neighbours are merged,
//! so the work is one of: a plain copy, contiguous runs, a cache-blocked 2-D transpose (possibly
//! batched), or a general strided gather.

use crate::error::TensorError;
use crate::kernels::check;
use crate::tensor::Tensor;

/// Side of the square tiles of the blocked transpose: 16×16 f32 tiles are 1 KiB each way, well
/// inside L1, and a tile row is one 64-byte cache line.
const TILE: usize = 16;

/// Transposes a row-major `rows × cols` matrix `x` into `out` (`cols × rows`), tile by tile.
pub fn transpose_into<T: Copy>(
    x: &[T],
    rows: usize,
    cols: usize,
    out: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "transpose";
    check::buffer_len(OP, "x", rows * cols, x.len())?;
    check::buffer_len(OP, "out", rows * cols, out.len())?;
    transpose_block(x, rows, cols, out);
    Ok(())
}

/// The blocked transpose, lengths already checked.
fn transpose_block<T: Copy>(x: &[T], rows: usize, cols: usize, out: &mut [T]) {
    transpose_rows_into((x, cols), (rows, cols), out);
}

/// `out[c·rows + r] = x[r·ld + c]`: `rows` rows of `cols` elements lying `ld` apart (`ld ≥
/// cols`, e.g. one head's columns of wider rows) transposed into `cols` contiguous rows of
/// `rows`, tile by tile. The caller sizes the buffers.
pub(crate) fn transpose_rows_into<T: Copy>(
    (x, ld): (&[T], usize),
    (rows, cols): (usize, usize),
    out: &mut [T],
) {
    for r0 in (0..rows).step_by(TILE) {
        let r1 = (r0 + TILE).min(rows);
        for c0 in (0..cols).step_by(TILE) {
            let c1 = (c0 + TILE).min(cols);
            for c in c0..c1 {
                let dst = &mut out[c * rows + r0..c * rows + r1];
                for (d, r) in dst.iter_mut().zip(r0..r1) {
                    *d = x[r * ld + c];
                }
            }
        }
    }
}

/// `axes` as a validated permutation of `0..ndim`.
fn check_axes(op: &'static str, axes: &[usize], ndim: usize) -> Result<(), TensorError> {
    let mut seen = vec![false; ndim];
    let valid = axes.len() == ndim
        && axes
            .iter()
            .all(|&a| a < ndim && !std::mem::replace(&mut seen[a], true));
    if valid {
        Ok(())
    } else {
        Err(TensorError::InvalidArgument {
            op,
            reason: format!("axes {axes:?} are not a permutation of 0..{ndim}"),
        })
    }
}

/// The shape of `permute(x, axes)` for `x` of `shape` (axes must be valid).
pub fn permuted_shape(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    axes.iter().map(|&a| shape[a]).collect()
}

/// Writes `x` (of `shape`) with its dims reordered by `axes` into `out`.
pub fn permute_into<T: Copy + Send + Sync>(
    x: &[T],
    shape: &[usize],
    axes: &[usize],
    out: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "permute";
    check_axes(OP, axes, shape.len())?;
    let n: usize = shape.iter().product();
    check::buffer_len(OP, "x", n, x.len())?;
    check::buffer_len(OP, "out", n, out.len())?;
    if n == 0 {
        return Ok(());
    }
    let in_strides = layout::row_major_strides(shape);
    // Output dims (size > 1) with the input stride each one walks, merged where they stay
    // neighbours in the input.
    let mut dims: Vec<(usize, usize)> = Vec::with_capacity(axes.len());
    for &a in axes {
        let (size, stride) = (shape[a], in_strides[a]);
        if size == 1 {
            continue;
        }
        match dims.last_mut() {
            Some((prev_size, prev_stride)) if *prev_stride == stride * size => {
                *prev_size *= size;
                *prev_stride = stride;
            }
            _ => dims.push((size, stride)),
        }
    }
    match dims.as_slice() {
        [] | [(_, 1)] => out.copy_from_slice(x),
        [.., (len, 1)] => gather(x, &dims[..dims.len() - 1], out, |src, dst| {
            dst.copy_from_slice(&src[..*len])
        }),
        [.., (cols, 1), (rows, row_stride)] if row_stride == cols => {
            // Each batch element is an input `rows × cols` matrix written transposed.
            let (rows, cols) = (*rows, *cols);
            let batch = &dims[..dims.len() - 2];
            gather(x, batch, out, |src, dst| {
                transpose_block(&src[..rows * cols], rows, cols, dst)
            });
        }
        [.., (_, stride)] => {
            // A strided gather along the innermost output dim.
            let stride = *stride;
            gather(x, &dims[..dims.len() - 1], out, |src, dst| {
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = src[i * stride];
                }
            })
        }
    }
    Ok(())
}

/// Fills `out` block by block: the output is the outer `dims` (size, input stride) around an
/// inner block of `out.len() / prod(sizes)` contiguous output elements, and `block(src, dst)`
/// fills one block from the input starting at the block's input offset. Large outputs are cut
/// into runs of whole blocks, one per thread of the rank.
fn gather<T: Copy + Send + Sync>(
    x: &[T],
    dims: &[(usize, usize)],
    out: &mut [T],
    block: impl Fn(&[T], &mut [T]) + Sync,
) {
    let n_blocks: usize = dims.iter().map(|d| d.0).product();
    let block_len = out.len() / n_blocks;
    super::threads::for_each_rows(out, block_len, |start, part| {
        // The input offset of this part's first block, from its index's digits.
        let mut counter = vec![0usize; dims.len()];
        let mut index = start / block_len;
        let mut offset = 0usize;
        for (d, &(size, stride)) in dims.iter().enumerate().rev() {
            counter[d] = index % size;
            offset += counter[d] * stride;
            index /= size;
        }
        for dst in part.chunks_exact_mut(block_len) {
            block(&x[offset..], dst);
            for d in (0..dims.len()).rev() {
                let (size, stride) = dims[d];
                counter[d] += 1;
                offset += stride;
                if counter[d] < size {
                    break;
                }
                counter[d] = 0;
                offset -= stride * size;
            }
        }
    });
}

/// `x` with its dims reordered: `y.shape[d] = x.shape[axes[d]]`. Works for every dtype.
pub fn permute(x: &Tensor, axes: &[usize]) -> Result<Tensor, TensorError> {
    const OP: &str = "permute";
    check_axes(OP, axes, x.ndim())?;
    let shape = permuted_shape(x.shape(), axes);
    let mut out = Tensor::zeros(x.dtype(), &shape);
    let (src, dst) = (x.as_bytes(), out.as_bytes_mut());
    // Storage vectors are aligned for their element type, so these casts cannot fail.
    match x.dtype().size_in_bytes() {
        1 => permute_into(src, x.shape(), axes, dst),
        2 => permute_into::<u16>(
            bytemuck::cast_slice(src),
            x.shape(),
            axes,
            bytemuck::cast_slice_mut(dst),
        ),
        4 => permute_into::<u32>(
            bytemuck::cast_slice(src),
            x.shape(),
            axes,
            bytemuck::cast_slice_mut(dst),
        ),
        _ => permute_into::<u64>(
            bytemuck::cast_slice(src),
            x.shape(),
            axes,
            bytemuck::cast_slice_mut(dst),
        ),
    }?;
    Ok(out)
}

/// The transpose of a 2-D tensor (any dtype).
pub fn transpose(x: &Tensor) -> Result<Tensor, TensorError> {
    if x.ndim() != 2 {
        return Err(TensorError::InvalidArgument {
            op: "transpose",
            reason: format!("needs a 2-D tensor, got shape {:?}", x.shape()),
        });
    }
    permute(x, &[1, 0])
}

/// The inverse permutation of `axes`: `permute(permute(x, axes), inverse_axes(axes)) == x`.
pub fn inverse_axes(axes: &[usize]) -> Vec<usize> {
    let mut inverse = vec![0; axes.len()];
    for (d, &a) in axes.iter().enumerate() {
        inverse[a] = d;
    }
    inverse
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows a stride apart come out as contiguous columns, for sizes off the blocks of 8; the
    /// padding between the source rows is never read into the result.
    #[test]
    fn strided_rows_transpose_moves_every_element_once() {
        for (rows, cols, ld) in [(1, 1, 1), (9, 17, 20), (64, 64, 192), (13, 8, 8)] {
            let src: Vec<f32> = (0..rows * ld).map(|i| i as f32).collect();
            let mut dst = vec![f32::NAN; rows * cols];
            transpose_rows_into((&src, ld), (rows, cols), &mut dst);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        dst[c * rows + r],
                        src[r * ld + c],
                        "({r}, {c}) of {rows}×{cols}"
                    );
                }
            }
        }
    }
}
