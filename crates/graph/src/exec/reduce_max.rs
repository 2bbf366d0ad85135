//! The maximum over any set of axes.

use tensor::kernels::Float;
use tensor::TensorError;

/// `out` = the maximum of `x` (of `shape`) over `axes` (every axis when empty); `out` holds the
/// kept dims in order (with or without the reduced ones as size 1: the same elements). A NaN
/// propagates.
pub(crate) fn reduce_max_into<T: Float>(
    x: &[T],
    shape: &[usize],
    axes: &[usize],
    out: &mut [T],
) -> Result<(), TensorError> {
    let reduced = |d: usize| axes.is_empty() || axes.contains(&d);
    // Per dim, the input stride and the output stride (0 for a reduced dim).
    let mut strides = vec![(0usize, 0usize); shape.len()];
    let (mut input, mut output) = (1, 1);
    for d in (0..shape.len()).rev() {
        strides[d] = (input, if reduced(d) { 0 } else { output });
        input *= shape[d];
        if !reduced(d) {
            output *= shape[d];
        }
    }
    if x.len() != input || out.len() != output || axes.iter().any(|&a| a >= shape.len()) {
        return Err(TensorError::InvalidArgument {
            op: "reduce_max",
            reason: format!(
                "{} elements of shape {shape:?} reduced over {axes:?} into {} elements",
                x.len(),
                out.len()
            ),
        });
    }
    out.fill(T::NEG_INFINITY);
    if let Some((outer, run, inner)) = contiguous_axes(shape, axes) {
        // `x` is `[outer, run, inner]`, reduced over `run`: whole rows at a time.
        for o in 0..outer {
            let dst = &mut out[o * inner..(o + 1) * inner];
            for row in x[o * run * inner..(o + 1) * run * inner].chunks_exact(inner.max(1)) {
                for (slot, &v) in dst.iter_mut().zip(row) {
                    take_max(slot, v);
                }
            }
        }
        return Ok(());
    }
    for (i, &v) in x.iter().enumerate() {
        let o: usize = strides
            .iter()
            .zip(shape)
            .map(|(&(from, to), &size)| (i / from) % size * to)
            .sum();
        take_max(&mut out[o], v);
    }
    Ok(())
}

/// `slot` ← `v` when `v` is greater, or NaN (which then stays).
#[inline(always)]
fn take_max<T: Float>(slot: &mut T, v: T) {
    if v > *slot || v.partial_cmp(&v).is_none() {
        *slot = v;
    }
}

/// `(outer, run, inner)` when the reduced axes are one run of neighbouring dims (every dim when
/// `axes` is empty): the input is then `[outer, run, inner]` reduced over `run`.
fn contiguous_axes(shape: &[usize], axes: &[usize]) -> Option<(usize, usize, usize)> {
    if axes.is_empty() {
        return Some((1, shape.iter().product(), 1));
    }
    let (lo, hi) = (*axes.iter().min()?, *axes.iter().max()?);
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != hi - lo + 1 {
        return None;
    }
    let product = |dims: &[usize]| dims.iter().product::<usize>();
    Some((
        product(&shape[..lo]),
        product(&shape[lo..=hi]),
        product(&shape[hi + 1..]),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maxima_over_some_or_all_axes() {
        let x = [1.0f64, 5.0, 2.0, 4.0, 3.0, 0.0];
        let mut rows = [0.0; 2];
        reduce_max_into(&x, &[2, 3], &[1], &mut rows).unwrap();
        assert_eq!(rows, [5.0, 4.0]);
        let mut cols = [0.0; 3];
        reduce_max_into(&x, &[2, 3], &[0], &mut cols).unwrap();
        assert_eq!(cols, [4.0, 5.0, 2.0]);
        let mut all = [0.0; 1];
        reduce_max_into(&x, &[2, 3], &[], &mut all).unwrap();
        assert_eq!(all, [5.0]);
        assert!(reduce_max_into(&x, &[2, 3], &[2], &mut all).is_err());
        // Middle axes of a 4-d tensor, and non-neighbouring axes (the general path).
        let x4: Vec<f64> = (0..24).map(|i| ((i * 7) % 24) as f64).collect();
        let mut mid = [0.0; 4];
        reduce_max_into(&x4, &[2, 3, 2, 2], &[1, 2], &mut mid).unwrap();
        let want: Vec<f64> = (0..4)
            .map(|oi| {
                let (o, i) = (oi / 2, oi % 2);
                (0..6)
                    .map(|r| x4[o * 12 + r * 2 + i])
                    .fold(f64::MIN, f64::max)
            })
            .collect();
        assert_eq!(mid.to_vec(), want);
        let mut apart = [0.0; 6];
        reduce_max_into(&x4, &[2, 3, 2, 2], &[0, 2], &mut apart).unwrap();
        let want: Vec<f64> = (0..6)
            .map(|ji| {
                let (j, l) = (ji / 2, ji % 2);
                let at = |i: usize, k: usize| x4[i * 12 + j * 4 + k * 2 + l];
                [at(0, 0), at(0, 1), at(1, 0), at(1, 1)]
                    .into_iter()
                    .fold(f64::MIN, f64::max)
            })
            .collect();
        assert_eq!(apart.to_vec(), want);
        let mut nan = [0.0; 1];
        reduce_max_into(&[1.0, f64::NAN, 2.0], &[3], &[0], &mut nan).unwrap();
        assert!(nan[0].is_nan());
    }
}
