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
    for (i, &v) in x.iter().enumerate() {
        let o: usize = strides
            .iter()
            .zip(shape)
            .map(|(&(from, to), &size)| (i / from) % size * to)
            .sum();
        let slot = &mut out[o];
        // Greater, or NaN (v != v), which then stays.
        if v > *slot || v.partial_cmp(&v).is_none() {
            *slot = v;
        }
    }
    Ok(())
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
        let mut nan = [0.0; 1];
        reduce_max_into(&[1.0, f64::NAN, 2.0], &[3], &[0], &mut nan).unwrap();
        assert!(nan[0].is_nan());
    }
}
