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
    #[cfg(target_arch = "x86_64")]
    let whole_tiles = size_of::<T>() == 4 && align_of::<T>() == 4 && avx512_tile::available();
    for r0 in (0..rows).step_by(TILE) {
        let r1 = (r0 + TILE).min(rows);
        for c0 in (0..cols).step_by(TILE) {
            let c1 = (c0 + TILE).min(cols);
            #[cfg(target_arch = "x86_64")]
            if whole_tiles && r1 - r0 == TILE && c1 - c0 == TILE {
                let (first, last) = ((r0 + TILE - 1) * ld + c0, (c0 + TILE - 1) * rows + r0);
                assert!(first + TILE <= x.len() && last + TILE <= out.len());
                // SAFETY: the CPU has AVX-512F; `T` is 4 bytes and 4-aligned, moved as bits
                // (the permutes never look at them as numbers); the tile's 16 rows of `x`
                // (`ld` apart from `r0·ld + c0`) and of `out` (`rows` apart from `c0·rows +
                // r0`) lie inside the slices (their last rows checked above).
                unsafe {
                    avx512_tile::transpose16(
                        (x.as_ptr().add(r0 * ld + c0).cast::<f32>(), ld),
                        (out.as_mut_ptr().add(c0 * rows + r0).cast::<f32>(), rows),
                    )
                };
                continue;
            }
            for c in c0..c1 {
                let dst = &mut out[c * rows + r0..c * rows + r1];
                for (d, r) in dst.iter_mut().zip(r0..r1) {
                    *d = x[r * ld + c];
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512_tile {
    //! A 16 × 16 tile of 4-byte elements transposed in AVX-512 registers: four stages, stage
    //! `k` swapping bit `k` of the row index with bit `k` of the column index between each pair
    //! of rows `2^k` apart (two `vpermt2ps` per pair), so after the four every element at `(r,
    //! c)` stands at `(c, r)`.
    #![allow(clippy::needless_range_loop)]

    use std::arch::x86_64::{
        __m512i, _mm512_loadu_epi32, _mm512_loadu_ps, _mm512_permutex2var_ps, _mm512_setzero_ps,
        _mm512_storeu_ps,
    };

    /// Elements per side.
    const SIDE: usize = 16;

    /// Whether this CPU runs [`transpose16`].
    pub(super) fn available() -> bool {
        std::is_x86_feature_detected!("avx512f")
    }

    /// The two index vectors of stage `k` for `_mm512_permutex2var_ps(low, idx, high)` (the rows
    /// with bit `k` clear and set): column `c` of the new low row is `low[c]` when `c`'s bit
    /// `k` is clear, else `high[c − 2^k]`; of the new high row `low[c + 2^k]` when clear, else
    /// `high[c]` (an index of 16 or more picks from `high`).
    const fn stage_indices(k: usize) -> [[i32; SIDE]; 2] {
        let step = 1 << k;
        let mut idx = [[0; SIDE]; 2];
        let mut c = 0;
        while c < SIDE {
            let (low, high) = if c & step == 0 {
                (c, c + step)
            } else {
                (SIDE + c - step, SIDE + c)
            };
            idx[0][c] = low as i32;
            idx[1][c] = high as i32;
            c += 1;
        }
        idx
    }

    /// The four stages' index vectors.
    const INDICES: [[[i32; SIDE]; 2]; 4] = [
        stage_indices(0),
        stage_indices(1),
        stage_indices(2),
        stage_indices(3),
    ];

    /// `out[c·ld_out + r] = x[r·ld_x + c]` for `r, c < 16`, as bits.
    ///
    /// # Safety
    /// AVX-512F; 16 rows of 16 elements at `x` (`ld_x` apart) readable and at `out` (`ld_out`
    /// apart) writable.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose16(
        (x, ld_x): (*const f32, usize),
        (out, ld_out): (*mut f32, usize),
    ) {
        // SAFETY: the caller's rows are in bounds.
        unsafe {
            let mut rows = [_mm512_setzero_ps(); SIDE];
            for r in 0..SIDE {
                rows[r] = _mm512_loadu_ps(x.add(r * ld_x));
            }
            for (k, [low_idx, high_idx]) in INDICES.iter().enumerate() {
                let low_idx: __m512i = _mm512_loadu_epi32(low_idx.as_ptr());
                let high_idx: __m512i = _mm512_loadu_epi32(high_idx.as_ptr());
                let step = 1 << k;
                for r in 0..SIDE {
                    if r & step == 0 {
                        let (low, high) = (rows[r], rows[r + step]);
                        rows[r] = _mm512_permutex2var_ps(low, low_idx, high);
                        rows[r + step] = _mm512_permutex2var_ps(low, high_idx, high);
                    }
                }
            }
            for (c, row) in rows.iter().enumerate() {
                _mm512_storeu_ps(out.add(c * ld_out), *row);
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

    /// Rows a stride apart come out as contiguous columns, for sizes off the tiles of 16 and
    /// on them (the AVX-512 tiles where the CPU has them); the padding between the source rows
    /// is never read into the result; 4-byte elements move as bits (NaN payloads kept), and
    /// elements of other sizes take the portable loop.
    #[test]
    fn strided_rows_transpose_moves_every_element_once() {
        fn check<T: Copy + PartialEq + std::fmt::Debug>(value: impl Fn(usize) -> T, fill: T) {
            let shapes = [
                (1, 1, 1),
                (9, 17, 20),
                (64, 64, 192),
                (13, 8, 8),
                (16, 16, 16),
                (33, 48, 50),
                (48, 33, 40),
            ];
            for (rows, cols, ld) in shapes {
                let src: Vec<T> = (0..rows * ld).map(&value).collect();
                let mut dst = vec![fill; rows * cols];
                transpose_rows_into((&src, ld), (rows, cols), &mut dst);
                for r in 0..rows {
                    for c in 0..cols {
                        let (got, want) = (dst[c * rows + r], src[r * ld + c]);
                        assert_eq!(got, want, "({r}, {c}) of {rows}×{cols}");
                    }
                }
            }
        }
        check(|i| i as f32, f32::NAN);
        // Signalling and quiet NaNs with payloads, as bits.
        check(|i| 0x7f80_0001u32.wrapping_add(i as u32 * 0x0101), 0);
        check(|i| i as f64, f64::NAN);
        check(|i| i as u16, u16::MAX);
    }
}
