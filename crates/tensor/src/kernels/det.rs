//! Deterministic-mode kernels: sums in the canonical order, whatever the shapes around them.
//!
//! A dim summed over is cut into `nb` canonical blocks of `block_len` elements
//! ([`canonical_blocks`] picks `nb` from the dim's *global* length alone). Each block is summed
//! in index order, one fused multiply-add (or add) per element, and the block sums are joined in
//! the canonical tree ([`super::tree`]). A kernel given an aligned run of whole blocks computes
//! their subtree, so a reduction split across ranks and completed by a deterministic
//! collective gives the bits one device gives.
//!
//! The per-element order depends only on the summed dim: not on the other dims' sizes (a
//! data-parallel split halves a product's rows), the thread count or the SIMD width. Fused
//! multiply-adds round once with or without the hardware instruction; where it is missing the
//! same bits are computed in software, slowly.

mod gemm;
#[cfg(target_arch = "x86_64")]
mod gemm_avx2;
#[cfg(target_arch = "x86_64")]
mod gemm_avx512;

pub(crate) use self::gemm::chain_gemm;
pub use self::gemm::{det_gemm, det_gemm_bias};

use super::float::Float;
use super::tree::split_point;
use crate::error::TensorError;

/// The canonical block count of a summed dim of `len` elements: the largest power of two that
/// is at most `max_blocks` and divides `len` (1 for an empty dim).
pub fn canonical_blocks(len: usize, max_blocks: usize) -> usize {
    let mut nb = 1;
    while nb * 2 <= max_blocks.max(1) && len > 0 && len.is_multiple_of(nb * 2) {
        nb *= 2;
    }
    nb
}

/// Checks that `local` elements of a dim are whole blocks of `block_len`, a power-of-two count.
pub(crate) fn local_blocks(
    op: &'static str,
    local: usize,
    block_len: usize,
) -> Result<usize, TensorError> {
    let bad = |reason: String| TensorError::InvalidArgument { op, reason };
    if block_len == 0 {
        return Err(bad("the canonical block length is 0".to_string()));
    }
    if !local.is_multiple_of(block_len) {
        return Err(bad(format!(
            "the summed dim holds {local} elements here, not whole canonical blocks of {block_len}"
        )));
    }
    let n = local / block_len;
    if n > 1 && !n.is_power_of_two() {
        return Err(bad(format!(
            "{n} canonical blocks here (of {block_len}): a subtree needs a power of two"
        )));
    }
    Ok(n)
}

/// A binary-counter stack that joins block results in the canonical tree as they arrive.
#[derive(Debug)]
pub(crate) struct TreeStack<V> {
    /// `(level, value)`: a complete subtree of `2^level` blocks.
    items: Vec<(u32, V)>,
}

impl<V> TreeStack<V> {
    pub(crate) fn new() -> TreeStack<V> {
        TreeStack { items: Vec::new() }
    }

    /// Pushes the next block's value and joins equal-sized subtrees (left = earlier).
    pub(crate) fn push(&mut self, mut value: V, mut join: impl FnMut(V, V) -> V) {
        let mut level = 0;
        while let Some(&(top, _)) = self.items.last() {
            if top != level {
                break;
            }
            let (_, left) = self.items.pop().expect("checked non-empty");
            value = join(left, value);
            level += 1;
        }
        self.items.push((level, value));
    }

    /// The root (the block count was a power of two, so one subtree remains).
    fn finish(mut self) -> Option<V> {
        self.take_root()
    }

    /// [`finish`](TreeStack::finish), leaving the stack empty for the next tree.
    pub(crate) fn take_root(&mut self) -> Option<V> {
        debug_assert!(self.items.len() <= 1);
        self.items.pop().map(|(_, v)| v)
    }
}

/// `out[c] = Σ_r x[r, c]` over the `rows` rows of `x` (`[rows, cols]`) in canonical blocks of
/// `block_len` rows: the deterministic sum behind bias and LayerNorm gradients, `ReduceSum`
/// and the loss's mean.
pub fn det_sum_rows<T: Float>(
    x: &[T],
    rows: usize,
    cols: usize,
    block_len: usize,
    out: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "det_sum_rows";
    super::check::buffer_len(OP, "x", rows * cols, x.len())?;
    super::check::buffer_len(OP, "out", cols, out.len())?;
    if rows == 0 {
        out.fill(T::ZERO);
        return Ok(());
    }
    let nb = local_blocks(OP, rows, block_len)?;
    let mut stack: TreeStack<Vec<T>> = TreeStack::new();
    for blk in 0..nb {
        let mut acc = vec![T::ZERO; cols];
        for r in blk * block_len..(blk + 1) * block_len {
            for (a, &v) in acc.iter_mut().zip(&x[r * cols..(r + 1) * cols]) {
                *a += v;
            }
        }
        stack.push(acc, |mut l, r| {
            for (a, b) in l.iter_mut().zip(&r) {
                *a += *b;
            }
            l
        });
    }
    out.copy_from_slice(&stack.finish().expect("at least one block"));
    Ok(())
}

/// LayerNorm's gradient ([`super::layer_norm_grad_into`]) with `dgamma` and `dbeta` summed
/// over the rows in canonical blocks of `block_len` rows: each block's rows added in order from
/// zero, the blocks joined in the canonical tree. `dx` is row by row, as always.
pub fn det_layer_norm_grad_into<T: Float>(
    saved: super::LayerNormSaved<'_, T>,
    dy: &[T],
    grads: super::LayerNormGradBuffers<'_, T>,
    block_len: usize,
) -> Result<(), TensorError> {
    const OP: &str = "det_layer_norm_grad";
    let rows = super::norm::check_grad_buffers(OP, &saved, dy, &grads)?;
    let cols = saved.gamma.len();
    if rows == 0 {
        grads.dgamma.fill(T::ZERO);
        grads.dbeta.fill(T::ZERO);
        return Ok(());
    }
    let nb = local_blocks(OP, rows, block_len)?;
    let mut stack: TreeStack<(Vec<T>, Vec<T>)> = TreeStack::new();
    for blk in 0..nb {
        let (mut g, mut b) = (vec![T::ZERO; cols], vec![T::ZERO; cols]);
        let span = blk * block_len..(blk + 1) * block_len;
        super::norm::layer_norm_grad_rows(&saved, dy, grads.dx, span, (&mut g, &mut b));
        stack.push((g, b), |(mut lg, mut lb), (rg, rb)| {
            for (l, r) in lg.iter_mut().zip(&rg).chain(lb.iter_mut().zip(&rb)) {
                *l += *r;
            }
            (lg, lb)
        });
    }
    let (g, b) = stack.finish().expect("at least one block");
    grads.dgamma.copy_from_slice(&g);
    grads.dbeta.copy_from_slice(&b);
    Ok(())
}

/// `out` = `x` (of `shape`) summed over `axes` (ascending, each `< shape.len()`) in the canonical
/// order of the flattened summed index space (the summed axes in order, row-major), in blocks of
/// `block_len`. `out` holds the kept axes in order.
pub fn det_sum_axes<T: Float>(
    x: &[T],
    shape: &[usize],
    axes: &[usize],
    block_len: usize,
    out: &mut [T],
) -> Result<(), TensorError> {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let rows: usize = axes.iter().map(|&d| shape[d]).product();
    let cols: usize = kept.iter().map(|&d| shape[d]).product();
    let perm: Vec<usize> = axes.iter().chain(&kept).copied().collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return det_sum_rows(x, rows, cols, block_len, out);
    }
    if kept.iter().enumerate().all(|(i, &d)| i == d) {
        // The summed axes trail: each output's terms lie contiguous, in canonical order.
        return det_sum_segments(x, (cols, rows), block_len, out);
    }
    let mut moved = vec![T::ZERO; x.len()];
    super::permute::permute_into(x, shape, &perm, &mut moved)?;
    det_sum_rows(&moved, rows, cols, block_len, out)
}

/// `out[c] = Σ_j x[c·len + j]` for each of the `segments` runs of `len` elements, in canonical
/// blocks of `block_len`: the bits of [`det_sum_rows`] over the transposed `[len, segments]`
/// matrix (each block added in order from zero, the blocks joined in the canonical tree),
/// without transposing it (a loss's sum over the vocabulary of every row's logits).
fn det_sum_segments<T: Float>(
    x: &[T],
    (segments, len): (usize, usize),
    block_len: usize,
    out: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "det_sum_axes";
    super::check::buffer_len(OP, "x", segments * len, x.len())?;
    super::check::buffer_len(OP, "out", segments, out.len())?;
    if len == 0 {
        out.fill(T::ZERO);
        return Ok(());
    }
    local_blocks(OP, len, block_len)?;
    let mut stack: TreeStack<T> = TreeStack::new();
    for (o, segment) in out.iter_mut().zip(x.chunks_exact(len)) {
        for block in segment.chunks_exact(block_len) {
            let mut acc = T::ZERO;
            for &v in block {
                acc += v;
            }
            stack.push(acc, |l, r| l + r);
        }
        *o = stack.take_root().expect("at least one block");
    }
    Ok(())
}

/// The gradient of an embedding lookup in canonical order: `table_grad` (the rows of `block`,
/// `dim` wide) receives, per row, the sum of the `src` rows whose index names it, positions cut
/// into canonical blocks of `block_len` (each block summed in position order, blocks joined in
/// the canonical tree).
pub fn det_scatter_add_block_rows<T: Float, I: super::embedding::IndexElement>(
    table_grad: &mut [T],
    block: super::embedding::RowBlock,
    dim: usize,
    indices: &[I],
    src: &[T],
    block_len: usize,
) -> Result<(), TensorError> {
    const OP: &str = "det_scatter_add";
    super::check::buffer_len(OP, "src", indices.len() * dim, src.len())?;
    table_grad.fill(T::ZERO);
    let Some(n_rows) = table_grad.len().checked_div(dim) else {
        return Ok(());
    };
    super::embedding::check_indices(OP, indices, block.vocab)?;
    if indices.is_empty() {
        return Ok(());
    }
    let nb = local_blocks(OP, indices.len(), block_len)?;
    // Rows of this block that some position names, and per canonical block the sums.
    let local = |i: I| {
        (i.to_i64() as usize)
            .checked_sub(block.first)
            .filter(|&r| r < n_rows)
    };
    let mut touched: Vec<usize> = indices.iter().filter_map(|&i| local(i)).collect();
    touched.sort_unstable();
    touched.dedup();
    // A block that names a row gives it a leaf; the others give it a zero leaf (`None`), which
    // joins as the `+0` vector would: `x + 0` (turning `-0` into `+0`). Spent leaves are reused.
    let mut stacks: Vec<TreeStack<Option<Vec<T>>>> =
        touched.iter().map(|_| TreeStack::new()).collect();
    let mut leaves: Vec<Option<Vec<T>>> = vec![None; touched.len()];
    let mut spare: Vec<Vec<T>> = Vec::new();
    let plus_zero = |mut v: Vec<T>| {
        for x in v.iter_mut() {
            *x += T::ZERO;
        }
        v
    };
    for blk in 0..nb {
        for p in blk * block_len..(blk + 1) * block_len {
            if let Some(row) = local(indices[p]) {
                let t = touched
                    .binary_search(&row)
                    .expect("every named row is touched");
                let leaf = leaves[t].get_or_insert_with(|| {
                    let mut v = spare.pop().unwrap_or_default();
                    v.clear();
                    v.resize(dim, T::ZERO);
                    v
                });
                for (d, &v) in leaf.iter_mut().zip(&src[p * dim..(p + 1) * dim]) {
                    *d += v;
                }
            }
        }
        for (stack, leaf) in stacks.iter_mut().zip(leaves.iter_mut()) {
            stack.push(leaf.take(), |l, r| match (l, r) {
                (None, None) => None,
                (Some(v), None) | (None, Some(v)) => Some(plus_zero(v)),
                (Some(mut l), Some(r)) => {
                    for (a, b) in l.iter_mut().zip(&r) {
                        *a += *b;
                    }
                    spare.push(r);
                    Some(l)
                }
            });
        }
    }
    for (stack, &row) in stacks.into_iter().zip(&touched) {
        let sum = stack.finish().expect("at least one block");
        let sum = sum.expect("a touched row has a leaf");
        table_grad[row * dim..(row + 1) * dim].copy_from_slice(&sum);
    }
    Ok(())
}

/// The cross entropy of `logits` (`[rows, classes]`) against `labels`, each row's loss times
/// `scale`, summed over the rows in canonical blocks of `block_len`.
pub fn det_cross_entropy_sum<T: Float, I: super::embedding::IndexElement>(
    logits: &[T],
    classes: usize,
    labels: &[I],
    scale: T,
    block_len: usize,
) -> Result<T, TensorError> {
    const OP: &str = "det_cross_entropy";
    super::check::buffer_len(OP, "logits", labels.len() * classes, logits.len())?;
    super::embedding::check_indices(OP, labels, classes)?;
    let losses: Vec<T> = logits
        .chunks_exact(classes.max(1))
        .zip(labels)
        .map(|(row, &label)| {
            (super::softmax::log_sum_exp(row) - row[label.to_i64() as usize]) * scale
        })
        .collect();
    let mut out = [T::ZERO];
    det_sum_rows(&losses, losses.len(), 1, block_len, &mut out)?;
    Ok(out[0])
}

/// The canonical tree over `n ≥ 1` values.
pub fn det_tree_sum<T: Float>(values: &[T]) -> T {
    fn go<T: Float>(v: &[T]) -> T {
        match v.len() {
            0 => T::ZERO,
            1 => v[0],
            n => {
                let left = split_point(n);
                go(&v[..left]) + go(&v[left..])
            }
        }
    }
    go(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::GemmShape;
    use crate::kernels::tree::tree_reduce;

    /// The fused LayerNorm gradient: `dx` as the ordinary kernel's; `dgamma` and `dbeta` the
    /// canonical row sums of `dy·x̂` and `dy`; and a run of whole blocks gives its subtree.
    #[test]
    fn layer_norm_grad_sums_rows_in_canonical_order() {
        let (rows, cols, bl) = (24, 5, 3);
        let val = |i: usize, s: usize| ((i * s) % 97) as f32 / 97.0 - 0.4;
        let x: Vec<f32> = (0..rows * cols).map(|i| val(i, 31)).collect();
        let dy: Vec<f32> = (0..rows * cols).map(|i| val(i, 17) * 3.0).collect();
        let mean: Vec<f32> = (0..rows).map(|r| val(r, 7) * 0.1).collect();
        let rstd: Vec<f32> = (0..rows).map(|r| 1.0 + val(r, 5)).collect();
        let gamma: Vec<f32> = (0..cols).map(|c| 1.0 + val(c, 3)).collect();
        let saved = |lo: usize, hi: usize| crate::kernels::LayerNormSaved {
            x: &x[lo * cols..hi * cols],
            mean: &mean[lo..hi],
            rstd: &rstd[lo..hi],
            gamma: &gamma,
        };
        let run = |lo: usize, hi: usize, det: bool| {
            let (mut dx, mut dg, mut db) = (
                vec![0f32; (hi - lo) * cols],
                vec![0f32; cols],
                vec![0f32; cols],
            );
            let grads = crate::kernels::LayerNormGradBuffers {
                dx: &mut dx,
                dgamma: &mut dg,
                dbeta: &mut db,
            };
            let dy = &dy[lo * cols..hi * cols];
            if det {
                det_layer_norm_grad_into(saved(lo, hi), dy, grads, bl).unwrap();
            } else {
                crate::kernels::layer_norm_grad_into(saved(lo, hi), dy, grads).unwrap();
            }
            (dx, dg, db)
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (dx, dg, db) = run(0, rows, true);
        assert_eq!(bits(&dx), bits(&run(0, rows, false).0));
        let prod: Vec<f32> = (0..rows * cols)
            .map(|i| dy[i] * ((x[i] - mean[i / cols]) * rstd[i / cols]))
            .collect();
        let (mut want_g, mut want_b) = (vec![0f32; cols], vec![0f32; cols]);
        det_sum_rows(&prod, rows, cols, bl, &mut want_g).unwrap();
        det_sum_rows(&dy, rows, cols, bl, &mut want_b).unwrap();
        assert_eq!(bits(&dg), bits(&want_g));
        assert_eq!(bits(&db), bits(&want_b));
        // Two halves of four blocks each, joined: the whole tree's bits.
        let (_, g0, b0) = run(0, rows / 2, true);
        let (_, g1, b1) = run(rows / 2, rows, true);
        let joined = |l: &[f32], r: &[f32]| l.iter().zip(r).map(|(a, b)| a + b).collect::<Vec<_>>();
        assert_eq!(bits(&joined(&g0, &g1)), bits(&dg));
        assert_eq!(bits(&joined(&b0, &b1)), bits(&db));
        // Rows that are not whole blocks are refused.
        let grads = crate::kernels::LayerNormGradBuffers {
            dx: &mut vec![0f32; 4 * cols],
            dgamma: &mut vec![0f32; cols],
            dbeta: &mut vec![0f32; cols],
        };
        assert!(det_layer_norm_grad_into(saved(0, 4), &dy[..4 * cols], grads, bl).is_err());
    }

    /// The embedding gradient: per row, the canonical tree over the position blocks of each
    /// block's sum in position order (`+0` for a block that does not name the row), signed
    /// zeros included; the rows outside this rank's block are left out; and two aligned halves
    /// of the positions, joined row by row, give the whole's bits.
    #[test]
    fn scatter_add_sums_each_row_in_canonical_order() {
        let (vocab, dim, positions, bl) = (6, 3, 32, 4);
        let ids: Vec<i64> = (0..positions)
            .map(|p| ((p * 7 + p / 5) % vocab) as i64)
            .collect();
        let src: Vec<f32> = (0..positions * dim)
            .map(|i| match i % 11 {
                0 => -0.0,
                1 => 0.0,
                k => (k as f32 - 5.5) * 0.37 + (i as f32) * 1e-3,
            })
            .collect();
        let reference = |pos: std::ops::Range<usize>, row: usize| -> Vec<f32> {
            let nb = pos.len() / bl;
            tree_reduce(
                nb,
                &mut |blk| {
                    let mut acc = vec![0f32; dim];
                    for p in pos.start + blk * bl..pos.start + (blk + 1) * bl {
                        if ids[p] as usize == row {
                            for (a, &v) in acc.iter_mut().zip(&src[p * dim..(p + 1) * dim]) {
                                *a += v;
                            }
                        }
                    }
                    acc
                },
                &mut |l: Vec<f32>, r: Vec<f32>| l.iter().zip(&r).map(|(a, b)| a + b).collect(),
            )
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let scatter = |pos: std::ops::Range<usize>, first: usize, rows: usize| {
            let mut out = vec![f32::NAN; rows * dim];
            let block = crate::kernels::RowBlock { first, vocab };
            let (ids, src) = (&ids[pos.clone()], &src[pos.start * dim..pos.end * dim]);
            det_scatter_add_block_rows(&mut out, block, dim, ids, src, bl).unwrap();
            out
        };
        let whole = scatter(0..positions, 0, vocab);
        for row in 0..vocab {
            let want = reference(0..positions, row);
            assert_eq!(
                bits(&whole[row * dim..(row + 1) * dim]),
                bits(&want),
                "row {row}"
            );
        }
        // Rows 2..5 only: the same bits for those rows.
        let part = scatter(0..positions, 2, 3);
        assert_eq!(bits(&part), bits(&whole[2 * dim..5 * dim]));
        let (lo, hi) = (scatter(0..16, 0, vocab), scatter(16..32, 0, vocab));
        let joined: Vec<f32> = lo.iter().zip(&hi).map(|(a, b)| a + b).collect();
        assert_eq!(bits(&joined), bits(&whole));
    }

    /// `x` (`[rows, cols]` row-major) transposed to `[cols, rows]`.
    fn transposed(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let mut out = vec![0.0; x.len()];
        for r in 0..rows {
            for c in 0..cols {
                out[c * rows + r] = x[r * cols + c];
            }
        }
        out
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32;
                (x / 16_777_216.0 - 0.5) * 10f32.powi((i % 7) as i32 - 3)
            })
            .collect()
    }

    #[test]
    fn canonical_blocks_are_powers_of_two_dividing_the_dim() {
        assert_eq!(canonical_blocks(768, 8), 8);
        assert_eq!(canonical_blocks(4, 8), 4);
        assert_eq!(canonical_blocks(12, 16), 4);
        assert_eq!(canonical_blocks(7, 8), 1);
        assert_eq!(canonical_blocks(0, 8), 1);
        assert_eq!(canonical_blocks(64, 1), 1);
    }

    /// Split K into aligned runs of blocks, multiply each run, join the partials in the tree:
    /// the bits of the whole product. And the rows of C do not change any element's bits.
    #[test]
    fn k_splits_and_row_splits_give_the_same_bits() {
        // One pass of 8 blocks; 16 short blocks; 8 long blocks in 4 passes of 2 (a pass covers
        // about 256 elements), joined across passes.
        for (m, k, nb) in [(9, 64, 8), (70, 64, 8), (13, 64, 16), (9, 1024, 8)] {
            k_and_row_splits(m, k, nb);
        }
    }

    fn k_and_row_splits(m: usize, k: usize, nb: usize) {
        let n = 21;
        let bl = k / nb;
        let (a, b) = (values(m * k, 1), values(k * n, 2));
        let mut whole = vec![0.0f32; m * n];
        det_gemm(GemmShape::new(m, n, k), &a, &b, &mut whole, bl).unwrap();
        // Reference: per element, tree over blocks of sequential fused sums.
        for i in 0..m {
            for j in 0..n {
                let want = tree_reduce(
                    nb,
                    &mut |blk| {
                        (blk * bl..(blk + 1) * bl)
                            .fold(0.0f32, |acc, kk| a[i * k + kk].mul_add(b[kk * n + j], acc))
                    },
                    &mut |x, y| x + y,
                );
                assert_eq!(whole[i * n + j].to_bits(), want.to_bits());
            }
        }
        for parts in [2usize, 4, 8] {
            let kp = k / parts;
            let partials: Vec<Vec<f32>> = (0..parts)
                .map(|p| {
                    let ap: Vec<f32> = (0..m)
                        .flat_map(|i| a[i * k + p * kp..i * k + (p + 1) * kp].to_vec())
                        .collect();
                    let bp = b[p * kp * n..(p + 1) * kp * n].to_vec();
                    let mut c = vec![0.0f32; m * n];
                    det_gemm(GemmShape::new(m, n, kp), &ap, &bp, &mut c, bl).unwrap();
                    c
                })
                .collect();
            for e in 0..m * n {
                let joined = tree_reduce(parts, &mut |p| partials[p][e], &mut |x, y| x + y);
                assert_eq!(joined.to_bits(), whole[e].to_bits(), "{parts} parts");
            }
        }
        // Rows 3..7 alone.
        let mut some = vec![0.0f32; 4 * n];
        det_gemm(GemmShape::new(4, n, k), &a[3 * k..7 * k], &b, &mut some, bl).unwrap();
        assert_eq!(some, whole[3 * n..7 * n]);
        // Transposed operands give the same bits.
        let at = transposed(&a, m, k);
        let bt = transposed(&b, k, n);
        let mut t = vec![0.0f32; m * n];
        let shape = GemmShape {
            trans_a: true,
            trans_b: true,
            ..GemmShape::new(m, n, k)
        };
        det_gemm(shape, &at, &bt, &mut t, bl).unwrap();
        assert_eq!(t, whole);
    }

    #[test]
    fn row_sums_split_into_aligned_runs_join_to_the_same_bits() {
        let (rows, cols, bl) = (32, 5, 4);
        let x = values(rows * cols, 3);
        let mut whole = vec![0.0f32; cols];
        det_sum_rows(&x, rows, cols, bl, &mut whole).unwrap();
        for parts in [2usize, 4, 8] {
            let rp = rows / parts;
            let partials: Vec<Vec<f32>> = (0..parts)
                .map(|p| {
                    let mut o = vec![0.0f32; cols];
                    det_sum_rows(&x[p * rp * cols..(p + 1) * rp * cols], rp, cols, bl, &mut o)
                        .unwrap();
                    o
                })
                .collect();
            for c in 0..cols {
                let joined = tree_reduce(parts, &mut |p| partials[p][c], &mut |x, y| x + y);
                assert_eq!(joined.to_bits(), whole[c].to_bits());
            }
        }
        let err = det_sum_rows(&x[..6 * cols], 6, cols, bl, &mut whole).unwrap_err();
        assert!(
            err.to_string().contains("not whole canonical blocks of 4"),
            "{err}"
        );
    }

    /// Each column is its blocks' rows added in order from zero, the blocks joined in the
    /// canonical tree, whatever the vector unit: the sums equal a scalar reference bit for bit
    /// (37 columns leave a remainder after every vector width).
    #[test]
    fn row_sums_are_the_canonical_order_column_by_column() {
        let (rows, cols, bl) = (64, 37, 8);
        let x = values(rows * cols, 11);
        let mut got = vec![0.0f32; cols];
        det_sum_rows(&x, rows, cols, bl, &mut got).unwrap();
        for c in 0..cols {
            let block =
                |b: usize| (b * bl..(b + 1) * bl).fold(0.0f32, |acc, r| acc + x[r * cols + c]);
            let want = tree_reduce(rows / bl, &mut |b| block(b), &mut |l, r| l + r);
            assert_eq!(got[c].to_bits(), want.to_bits(), "column {c}");
        }
    }

    /// Summed axes that trail (a loss's sum over the vocabulary) are summed in place with the
    /// bits of the same sum over the transposed tensor, for one, several and the most blocks.
    #[test]
    fn trailing_axes_sum_in_place_as_transposed() {
        let shape = [3, 5, 64];
        let x = values(shape.iter().product(), 13);
        for (axes, kept) in [(&[2usize][..], &[0usize, 1][..]), (&[1, 2], &[0])] {
            let len: usize = axes.iter().map(|&d| shape[d]).product();
            let segments = x.len() / len;
            let perm: Vec<usize> = axes.iter().chain(kept).copied().collect();
            let mut moved = vec![0.0f32; x.len()];
            crate::kernels::permute::permute_into(&x, &shape, &perm, &mut moved).unwrap();
            for bl in [len, len / 4, if len.is_multiple_of(5) { 5 } else { 1 }] {
                let mut want = vec![0.0f32; segments];
                det_sum_rows(&moved, len, segments, bl, &mut want).unwrap();
                let mut got = vec![f32::NAN; segments];
                det_sum_axes(&x, &shape, axes, bl, &mut got).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "axes {axes:?}, blocks of {bl}");
            }
        }
    }
}
