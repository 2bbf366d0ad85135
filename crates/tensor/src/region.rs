//! Copying a box between two row-major buffers, at the byte level.
//!
//! This is the one routine every slicing, assembly, reshard and checkpoint conversion goes
//! through. It works on bytes and an element size, so it moves every dtype (and dtypes this crate
//! cannot compute with) without converting them.

use layout::SliceBox;

/// Where a box sits in a row-major buffer: the buffer's full shape and the box's offset in it.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    /// Shape of the whole buffer, in elements.
    pub shape: &'a [usize],
    /// Offset of the region inside the buffer, in elements.
    pub offset: &'a [usize],
}

/// Copies a region of `extent` elements per dim from `src` (placed at `src_at`) to `dst` (placed at
/// `dst_at`). Both buffers are row-major with `elem_size`-byte elements.
///
/// Trailing dims that both buffers hold whole are merged, so each `memcpy` is as long as the
/// layouts allow (a whole contiguous block when the region is a run of full rows).
///
/// # Panics
/// If the region does not fit in either buffer or a buffer is shorter than its shape says; callers
/// validate boxes first (see [`check_region`]).
pub fn copy_region(
    src: &[u8],
    src_at: Placement<'_>,
    dst: &mut [u8],
    dst_at: Placement<'_>,
    extent: &[usize],
    elem_size: usize,
) {
    let ndim = extent.len();
    assert!(src_at.shape.len() == ndim && dst_at.shape.len() == ndim);
    if extent.contains(&0) {
        return;
    }
    if ndim == 0 {
        dst[..elem_size].copy_from_slice(&src[..elem_size]);
        return;
    }
    // Merge trailing dims into one contiguous run while both sides hold them whole.
    let mut run_dims = 1; // number of trailing dims in the run
    let mut run = extent[ndim - 1];
    while run_dims < ndim {
        let d = ndim - run_dims; // innermost dim of the run
        let whole = extent[d] == src_at.shape[d] && extent[d] == dst_at.shape[d];
        if !whole {
            break;
        }
        run *= extent[d - 1];
        run_dims += 1;
    }
    let outer = ndim - run_dims; // dims iterated by the odometer
    let src_strides = layout::row_major_strides(src_at.shape);
    let dst_strides = layout::row_major_strides(dst_at.shape);
    let base = |offset: &[usize], strides: &[usize]| -> usize {
        offset.iter().zip(strides).map(|(o, s)| o * s).sum()
    };
    let mut src_pos = base(src_at.offset, &src_strides);
    let mut dst_pos = base(dst_at.offset, &dst_strides);
    let run_bytes = run * elem_size;
    let mut counter = vec![0usize; outer];
    loop {
        let s = src_pos * elem_size;
        let t = dst_pos * elem_size;
        dst[t..t + run_bytes].copy_from_slice(&src[s..s + run_bytes]);
        // Advance the odometer over the outer dims.
        let mut d = outer;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            counter[d] += 1;
            src_pos += src_strides[d];
            dst_pos += dst_strides[d];
            if counter[d] < extent[d] {
                break;
            }
            src_pos -= src_strides[d] * extent[d];
            dst_pos -= dst_strides[d] * extent[d];
            counter[d] = 0;
        }
    }
}

/// Whether `region` (offset and extent) lies inside a buffer of `shape`.
pub fn check_region(region: &SliceBox, shape: &[usize]) -> bool {
    region.ndim() == shape.len()
        && region
            .offset
            .iter()
            .zip(&region.shape)
            .zip(shape)
            .all(|((o, l), s)| o.checked_add(*l).is_some_and(|end| end <= *s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(
        src: &[u32],
        src_shape: &[usize],
        src_off: &[usize],
        dst: &mut [u32],
        dst_shape: &[usize],
        dst_off: &[usize],
        extent: &[usize],
    ) {
        let n: usize = extent.iter().product();
        let ss = layout::row_major_strides(src_shape);
        let ds = layout::row_major_strides(dst_shape);
        let es = layout::row_major_strides(extent);
        for i in 0..n {
            let idx: Vec<usize> = (0..extent.len()).map(|d| (i / es[d]) % extent[d]).collect();
            let s: usize = (0..idx.len()).map(|d| (idx[d] + src_off[d]) * ss[d]).sum();
            let t: usize = (0..idx.len()).map(|d| (idx[d] + dst_off[d]) * ds[d]).sum();
            dst[t] = src[s];
        }
    }

    #[test]
    fn matches_naive_copy() {
        let src_shape = [4, 6, 5];
        let src: Vec<u32> = (0..120).collect();
        // (source offset, destination shape, destination offset, extent)
        type Case = (
            &'static [usize],
            &'static [usize],
            &'static [usize],
            &'static [usize],
        );
        let cases: [Case; 4] = [
            (&[1, 2, 0], &[3, 6, 5], &[0, 0, 0], &[2, 4, 5]),
            (&[0, 0, 0], &[4, 6, 5], &[0, 0, 0], &[4, 6, 5]),
            (&[2, 1, 3], &[2, 4, 2], &[0, 1, 0], &[2, 3, 2]),
            (&[0, 5, 4], &[4, 1, 1], &[0, 0, 0], &[4, 1, 1]),
        ];
        for (src_off, dst_shape, dst_off, extent) in cases {
            let n: usize = dst_shape.iter().product();
            let mut fast = vec![u32::MAX; n];
            let mut slow = vec![u32::MAX; n];
            copy_region(
                bytemuck::cast_slice(&src),
                Placement {
                    shape: &src_shape,
                    offset: src_off,
                },
                bytemuck::cast_slice_mut(&mut fast),
                Placement {
                    shape: dst_shape,
                    offset: dst_off,
                },
                extent,
                4,
            );
            naive(
                &src, &src_shape, src_off, &mut slow, dst_shape, dst_off, extent,
            );
            assert_eq!(
                fast, slow,
                "extent {extent:?} from {src_off:?} to {dst_off:?}"
            );
        }
    }
}
