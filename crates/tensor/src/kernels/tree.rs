//! The canonical summation tree of deterministic mode.
//!
//! A sum over `n` parts (canonical blocks of a dim, or the members of a reduction group in
//! block order) is combined in one fixed binary tree that depends on `n` alone: the left subtree
//! holds the largest power of two strictly below `n` parts, the right one the rest. For a power
//! of two that is the perfect balanced tree, so a rank holding an aligned run of `2^j` parts
//! computes exactly one subtree, and a reduction over ranks completes the same tree that one
//! device computes over all parts.

/// Folds parts `0..n` (`n ≥ 1`) in the canonical tree: `leaf(i)` gives part `i`,
/// `combine(left, right)` joins two subtrees (left holds the lower indices).
pub fn tree_reduce<T>(
    n: usize,
    leaf: &mut impl FnMut(usize) -> T,
    combine: &mut impl FnMut(T, T) -> T,
) -> T {
    tree_reduce_range(0, n, leaf, combine)
}

fn tree_reduce_range<T>(
    first: usize,
    n: usize,
    leaf: &mut impl FnMut(usize) -> T,
    combine: &mut impl FnMut(T, T) -> T,
) -> T {
    assert!(n >= 1, "a tree needs at least one part");
    if n == 1 {
        return leaf(first);
    }
    let left = split_point(n);
    let l = tree_reduce_range(first, left, leaf, combine);
    let r = tree_reduce_range(first + left, n - left, leaf, combine);
    combine(l, r)
}

/// Parts in the left subtree of a tree over `n ≥ 2` parts: the largest power of two below `n`.
pub fn split_point(n: usize) -> usize {
    debug_assert!(n >= 2);
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

/// Sums `parts` (each `len` long, part `i` at `parts[i*len..]`) element-wise in the canonical
/// tree into `out`. The combination is done in place, pairwise, so its cost is `n - 1` vector
/// additions.
pub fn tree_sum_parts<T: Copy + std::ops::Add<Output = T>>(
    parts: &mut [T],
    len: usize,
    out: &mut [T],
) {
    let n = parts.len().checked_div(len).unwrap_or(0);
    assert_eq!(out.len(), len, "the result has one part's length");
    if n == 0 {
        return;
    }
    // Fold the subtree [first, first + count) into part `first`.
    fn fold<T: Copy + std::ops::Add<Output = T>>(
        parts: &mut [T],
        len: usize,
        first: usize,
        count: usize,
    ) {
        if count == 1 {
            return;
        }
        let left = split_point(count);
        fold(parts, len, first, left);
        fold(parts, len, first + left, count - left);
        let (head, tail) = parts.split_at_mut((first + left) * len);
        let dst = &mut head[first * len..(first + 1) * len];
        for (d, &s) in dst.iter_mut().zip(&tail[..len]) {
            *d = *d + s;
        }
    }
    fold(parts, len, 0, n);
    out.copy_from_slice(&parts[..len]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_points_are_the_largest_power_of_two_below() {
        assert_eq!(split_point(2), 1);
        assert_eq!(split_point(3), 2);
        assert_eq!(split_point(4), 2);
        assert_eq!(split_point(5), 4);
        assert_eq!(split_point(8), 4);
        assert_eq!(split_point(9), 8);
    }

    #[test]
    fn the_tree_is_balanced_for_powers_of_two() {
        let s = tree_reduce(8, &mut |i| i.to_string(), &mut |a, b| format!("({a}+{b})"));
        assert_eq!(s, "(((0+1)+(2+3))+((4+5)+(6+7)))");
        let s = tree_reduce(3, &mut |i| i.to_string(), &mut |a, b| format!("({a}+{b})"));
        assert_eq!(s, "((0+1)+2)");
    }

    /// Subtrees computed apart and joined in the tree over their roots give the same bits.
    #[test]
    fn aligned_subtrees_complete_the_same_tree() {
        let values: Vec<f32> = (0..64).map(|i| 1.0 / (i as f32 + 0.37)).collect();
        let whole = tree_reduce(64, &mut |i| values[i], &mut |a, b| a + b);
        for ranks in [2usize, 4, 8, 16] {
            let per = 64 / ranks;
            let roots: Vec<f32> = (0..ranks)
                .map(|r| tree_reduce(per, &mut |i| values[r * per + i], &mut |a, b| a + b))
                .collect();
            let joined = tree_reduce(ranks, &mut |i| roots[i], &mut |a, b| a + b);
            assert_eq!(joined.to_bits(), whole.to_bits(), "{ranks} ranks");
        }
        let mut parts: Vec<f32> = values.clone();
        let mut out = [0.0f32; 4];
        tree_sum_parts(&mut parts, 4, &mut out);
        for (j, o) in out.iter().enumerate() {
            let want = tree_reduce(16, &mut |i| values[i * 4 + j], &mut |a, b| a + b);
            assert_eq!(o.to_bits(), want.to_bits());
        }
    }
}
