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
    const OP: &str = "reduce_max";
    let reduced = |d: usize| axes.is_empty() || axes.contains(&d);
    let kept: usize = (0..shape.len())
        .filter(|&d| !reduced(d))
        .map(|d| shape[d])
        .product();
    let n: usize = shape.iter().product();
    if x.len() != n || out.len() != kept || axes.iter().any(|&a| a >= shape.len()) {
        return Err(TensorError::InvalidArgument {
            op: OP,
            reason: format!(
                "{} elements of shape {shape:?} reduced over {axes:?} into {} elements",
                x.len(),
                out.len()
            ),
        });
    }
    out.fill(T::NEG_INFINITY);
    // The output index of every input element: its kept coordinates, row-major.
    let mut coords = vec![0usize; shape.len()];
    for &v in x {
        let mut o = 0;
        for (d, &c) in coords.iter().enumerate() {
            if !reduced(d) {
                o = o * shape[d] + c;
            }
        }
        let slot = &mut out[o];
        // Greater, or NaN (v != v), which then stays.
        if v > *slot || v.partial_cmp(&v).is_none() {
            *slot = v;
        }
        for d in (0..shape.len()).rev() {
            coords[d] += 1;
            if coords[d] < shape[d] {
                break;
            }
            coords[d] = 0;
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
    }
}
