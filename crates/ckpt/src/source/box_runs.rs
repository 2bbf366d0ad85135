//! The contiguous runs of a box copied between two row-major arrays: what a positioned read
//! ([`crate::CheckpointFile::read_box`]) and a gathered write ([`crate::ops::engine::direct`])
//! both walk.

/// How many trailing dims of `extent` both sides hold whole (at least 1), and the number of
/// elements one contiguous run then spans.
pub(crate) fn contiguous_run(
    extent: &[usize],
    src_shape: &[usize],
    dst_shape: &[usize],
) -> (usize, usize) {
    let ndim = extent.len();
    let mut run_dims = 1;
    let mut run = extent[ndim - 1];
    while run_dims < ndim {
        let d = ndim - run_dims;
        if extent[d] != src_shape[d] || extent[d] != dst_shape[d] {
            break;
        }
        run *= extent[d - 1];
        run_dims += 1;
    }
    (run_dims, run)
}

/// Calls `f(src_elem, dst_elem, len)` for every contiguous run, in row-major order, of the box
/// `extent` copied from a row-major array of `src_shape` (the box at `src_off`) to one of
/// `dst_shape` (at `dst_off`); offsets and `len` count elements. `extent` has at least one dim.
pub(crate) fn for_each_run<E>(
    src_shape: &[usize],
    src_off: &[usize],
    dst_shape: &[usize],
    dst_off: &[usize],
    extent: &[usize],
    mut f: impl FnMut(usize, usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let ndim = extent.len();
    let (run_dims, run) = contiguous_run(extent, src_shape, dst_shape);
    let src_strides = layout::row_major_strides(src_shape);
    let dst_strides = layout::row_major_strides(dst_shape);
    let outer = ndim - run_dims;
    let mut counter = vec![0usize; outer];
    loop {
        let at = |off: &[usize], strides: &[usize]| -> usize {
            (0..ndim)
                .map(|d| (off[d] + if d < outer { counter[d] } else { 0 }) * strides[d])
                .sum()
        };
        f(at(src_off, &src_strides), at(dst_off, &dst_strides), run)?;
        let mut k = outer;
        loop {
            if k == 0 {
                return Ok(());
            }
            k -= 1;
            counter[k] += 1;
            if counter[k] < extent[k] {
                break;
            }
            counter[k] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_whole_trailing_dims_and_visit_every_row() {
        // A [2, 4] box of a [4, 4] source into a [2, 8] destination at column 4: rows stay
        // separate (the trailing dims differ), each 4 elements long.
        let mut runs = Vec::new();
        for_each_run::<()>(&[4, 4], &[1, 0], &[2, 8], &[0, 4], &[2, 4], |s, d, n| {
            runs.push((s, d, n));
            Ok(())
        })
        .unwrap();
        assert_eq!(runs, vec![(4, 4, 4), (8, 12, 4)]);
        // Whole rows on both sides merge into one run.
        assert_eq!(contiguous_run(&[2, 4], &[4, 4], &[2, 4]), (2, 8));
    }
}
