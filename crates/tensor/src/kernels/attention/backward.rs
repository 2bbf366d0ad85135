//! The backward pass (FlashAttention-2): per key tile, over the query tiles that see it, the
//! probabilities recomputed from the saved log-sum-exp, and the tile's contributions to `dq`,
//! `dk` and `dv`.

use super::tile_product::tile_product;
use super::{
    check_lengths, row_bands, row_elements, sizes, slice_flops, tile_scores, tiles, AttentionDims,
    AttentionParams, RowBand,
};
use super::{TILE_K, TILE_Q};
use crate::error::TensorError;
use crate::kernels::float::Float;
use crate::kernels::matmul::GemmShape;
use crate::kernels::permute::transpose_rows_into;
use crate::kernels::reduce::dot_slice;
use crate::kernels::threads::for_each_slices;
use crate::kernels::wide::widest;

/// What the backward pass over one key/value block reads.
#[derive(Debug, Clone, Copy)]
pub struct BlockGradInputs<'a, T> {
    /// The queries, `slices · q_len · head_dim`.
    pub q: &'a [T],
    /// The block's keys, `slices · kv_len · head_dim`.
    pub k: &'a [T],
    /// The block's values, `slices · kv_len · head_dim`.
    pub v: &'a [T],
    /// The gradient of the output, `slices · q_len · head_dim`.
    pub dout: &'a [T],
    /// The forward's log-sum-exp over ALL keys (not the block's), `slices · q_len`.
    pub lse: &'a [T],
    /// `rowsum(dout ∘ out)` ([`attention_delta_into`]), `slices · q_len`.
    pub delta: &'a [T],
}

/// What the one-call backward pass reads.
#[derive(Debug, Clone, Copy)]
pub struct AttentionGradInputs<'a, T> {
    /// The queries, `slices · q_len · head_dim`.
    pub q: &'a [T],
    /// The keys, `slices · kv_len · head_dim`.
    pub k: &'a [T],
    /// The values, `slices · kv_len · head_dim`.
    pub v: &'a [T],
    /// The forward's output, `slices · q_len · head_dim`.
    pub out: &'a [T],
    /// The forward's log-sum-exp, `slices · q_len`.
    pub lse: &'a [T],
    /// The gradient of the output, `slices · q_len · head_dim`.
    pub dout: &'a [T],
}

/// The gradients a backward pass writes.
#[derive(Debug)]
pub struct AttentionGradBuffers<'a, T> {
    /// The queries' gradient, `slices · q_len · head_dim`.
    pub dq: &'a mut [T],
    /// The keys' gradient, `slices · kv_len · head_dim`.
    pub dk: &'a mut [T],
    /// The values' gradient, `slices · kv_len · head_dim`.
    pub dv: &'a mut [T],
}

/// `delta[r] = Σ_c dout[r, c] · out[r, c]` for every row of `head_dim` elements (`D` of
/// FlashAttention-2, computed once per query block before the per-block backward passes).
pub fn attention_delta_into<T: Float>(
    out: &[T],
    dout: &[T],
    head_dim: usize,
    delta: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "attention_delta";
    let rows = delta.len();
    let elements = row_elements(OP, rows, head_dim)?;
    check_lengths(
        OP,
        &[("out", elements, out.len()), ("dout", elements, dout.len())],
    )?;
    row_dots(out, dout, head_dim, delta);
    Ok(())
}

widest! {
    /// `delta[r] = dot_slice(out row r, dout row r)` over rows of `head_dim`, on the widest
    /// vector unit the CPU has (`dot_slice`'s sums in its order, so the same bits on every
    /// unit).
    fn row_dots<T>(out: &[T], dout: &[T], head_dim: usize, delta: &mut [T]) => row_dots_loop
}

/// [`row_dots`]'s loop.
#[inline(always)]
fn row_dots_loop<T: Float>(out: &[T], dout: &[T], head_dim: usize, delta: &mut [T]) {
    for (r, d) in delta.iter_mut().enumerate() {
        let range = r * head_dim..(r + 1) * head_dim;
        *d = dot_slice(&out[range.clone()], &dout[range]);
    }
}

/// Scratch tiles of one thread: the probabilities and the score gradients.
pub(super) struct Scratch<T> {
    pub(super) p: Vec<T>,
    pub(super) ds: Vec<T>,
    /// A key tile transposed.
    keys_t: Vec<T>,
    /// A value tile transposed.
    values_t: Vec<T>,
}

impl<T: Float> Scratch<T> {
    /// Tiles for rows of `head_dim`.
    pub(super) fn new(head_dim: usize) -> Scratch<T> {
        Scratch {
            p: vec![T::ZERO; TILE_Q * TILE_K],
            ds: vec![T::ZERO; TILE_Q * TILE_K],
            keys_t: vec![T::ZERO; TILE_K * head_dim],
            values_t: vec![T::ZERO; TILE_K * head_dim],
        }
    }
}

/// The row strides of one slice's inputs in [`backward_slice`]: of its query, key and value
/// rows, and of its output-gradient rows (`head_dim` each when they are contiguous). Its
/// gradients, `lse` and `delta` are contiguous.
#[derive(Debug, Clone, Copy)]
pub(super) struct InputStrides {
    /// Elements from one query (key, value) row to the next.
    pub(super) qkv: usize,
    /// Elements from one output-gradient row to the next.
    pub(super) dout: usize,
}

impl InputStrides {
    /// Contiguous rows of `head_dim`.
    pub(super) fn contiguous(head_dim: usize) -> InputStrides {
        InputStrides {
            qkv: head_dim,
            dout: head_dim,
        }
    }
}

/// The gradients [`backward_slice`] writes: three buffers of contiguous rows, or the rows of
/// one buffer holding `dq`, `dk` and `dv` side by side.
pub(super) enum SliceGrads<'a, T> {
    /// `dq`, `dk`, `dv` apart, each its rows of `head_dim` one after another.
    Apart(AttentionGradBuffers<'a, T>),
    /// Row `s` of `dq` at `dqkv[s·stride..][..head_dim]`, of `dk` right after it, of `dv` right
    /// after that.
    SideBySide {
        /// The rows, from the first row of `dq` on.
        dqkv: &'a mut [T],
        /// Elements from one row to the next.
        stride: usize,
    },
}

/// One of the three gradients of a [`SliceGrads`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grad {
    /// The queries' gradient.
    Q,
    /// The keys' gradient.
    K,
    /// The values' gradient.
    V,
}

impl<T: Float> SliceGrads<'_, T> {
    /// Gradient `which`'s rows (of `head_dim`) from row `row` on, and their stride.
    fn rows(&mut self, which: Grad, row: usize, head_dim: usize) -> (&mut [T], usize) {
        match self {
            SliceGrads::Apart(grads) => {
                let rows = match which {
                    Grad::Q => &mut *grads.dq,
                    Grad::K => &mut *grads.dk,
                    Grad::V => &mut *grads.dv,
                };
                (&mut rows[row * head_dim..], head_dim)
            }
            SliceGrads::SideBySide { dqkv, stride } => {
                let column = match which {
                    Grad::Q => 0,
                    Grad::K => head_dim,
                    Grad::V => 2 * head_dim,
                };
                (&mut dqkv[row * *stride + column..], *stride)
            }
        }
    }

    /// Zeroes the rows `rows` (of `head_dim`) of gradient `which`.
    fn zero_rows(&mut self, which: Grad, rows: std::ops::Range<usize>, head_dim: usize) {
        let count = rows.len();
        let (buf, stride) = self.rows(which, rows.start, head_dim);
        if stride == head_dim {
            buf[..count * head_dim].fill(T::ZERO); // contiguous rows: one fill
            return;
        }
        for r in 0..count {
            buf[r * stride..r * stride + head_dim].fill(T::ZERO);
        }
    }
}

/// Which gradients a [`backward_slice`] call writes rather than adds to.
///
/// A written gradient's rows take the first tile product that reaches them as it is (a product
/// with no `C` term, so the rows' old values are never read), later ones added; rows no tile
/// reaches (keys hidden from every query, queries that see no key) are zeroed. That is the
/// arithmetic of adding to zeros (a product's sum starts at `+0`, so it is never `-0`, and
/// `0 + x` is `x`) without a pass zeroing the rows first.
#[derive(Debug, Clone, Copy)]
pub(super) struct Written {
    /// `dq` written (else added to).
    pub(super) dq: bool,
    /// `dk` and `dv` written (else added to).
    pub(super) keys: bool,
}

/// Runs `product(keys, rows)` for each segment of a tile's key columns and the query rows that
/// see them: the columns a band sees and the bands before it do not, reduced over the rows from
/// that band to the tile's last (`bands` in row order, each seeing at least the columns of the
/// one before). Returns how many leading key columns some row sees (the rest none do).
fn key_segments(
    bands: &[RowBand],
    (bq, bk): (usize, usize),
    mut product: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>) -> Result<(), TensorError>,
) -> Result<usize, TensorError> {
    let mut done = 0;
    for band in bands {
        let cols = band.cols.min(bk);
        if cols > done {
            product(done..cols, band.rows.start..bq)?;
            done = cols;
        }
    }
    Ok(done)
}

/// One key segment's gradient rows: `out (β)= α · tile[rows, keys]ᵀ · operand[rows]`, where
/// `tile` is the query tile's probabilities or score gradients (rows `ld` apart) and `operand`
/// the query tile's output-gradient or query rows of `head_dim` (from the tile's first row);
/// `out` holds the segment's first gradient row on.
fn segment_product<T: Float>(
    (tile, ld): (&[T], usize),
    (operand, ld_operand, head_dim): (&[T], usize, usize),
    (keys, rows): (std::ops::Range<usize>, std::ops::Range<usize>),
    (alpha, beta): (T, T),
    out: (&mut [T], usize),
) -> Result<(), TensorError> {
    let shape = GemmShape {
        m: keys.len(),
        n: head_dim,
        k: rows.len(),
        trans_a: true,
        trans_b: false,
    };
    let tile = (&tile[rows.start * ld + keys.start..], ld);
    let operand = (&operand[rows.start * ld_operand..], ld_operand);
    tile_product(shape, alpha, tile, operand, beta, out)
}

widest! {
    /// One slice's backward over its key block (its input rows `strides` apart): `dq`, `dk`
    /// and `dv` written or added to (`written`); on the widest vector unit the CPU has.
    pub(super) fn backward_slice<T>(
        input: BlockGradInputs<'_, T>,
        dims: AttentionDims,
        strides: InputStrides,
        params: &AttentionParams<T>,
        grads: SliceGrads<'_, T>,
        scratch: (&mut Scratch<T>, Written),
    ) -> Result<(), TensorError> => backward_slice_loop
}

/// [`backward_slice`]'s loop.
#[inline(always)]
fn backward_slice_loop<T: Float>(
    input: BlockGradInputs<'_, T>,
    dims: AttentionDims,
    strides: InputStrides,
    params: &AttentionParams<T>,
    mut grads: SliceGrads<'_, T>,
    (scratch, written): (&mut Scratch<T>, Written),
) -> Result<(), TensorError> {
    let (d, ld, ld_dout) = (dims.head_dim, strides.qkv, strides.dout);
    // The query tiles whose `dq` rows hold a product yet (all of them when added to).
    let mut dq_started: Vec<bool> = tiles(dims.q_len, TILE_Q).map(|_| !written.dq).collect();
    for (k0, bk) in tiles(dims.kv_len, TILE_K) {
        let k_tile = (&input.k[k0 * ld..], ld);
        // The key and value tiles transposed once for all the query tiles that see them.
        let (keys_t, values_t) = (
            &mut scratch.keys_t[..d * bk],
            &mut scratch.values_t[..d * bk],
        );
        transpose_rows_into(k_tile, (bk, d), keys_t);
        transpose_rows_into((&input.v[k0 * ld..], ld), (bk, d), values_t);
        let (keys_t, values_t) = (&scratch.keys_t[..d * bk], &scratch.values_t[..d * bk]);
        let mut keys_started = !written.keys;
        for (qi, (q0, bq)) in tiles(dims.q_len, TILE_Q).enumerate() {
            if params.visible_keys(q0 + bq - 1, dims.kv_len) <= k0 {
                continue; // no row of this query tile sees this key tile
            }
            // β of the products into `dk`, `dv` (this key tile) and `dq` (this query tile).
            let beta = |started: bool| if started { T::ONE } else { T::ZERO };
            let (keys_beta, dq_beta) = (beta(keys_started), beta(dq_started[qi]));
            keys_started = true;
            dq_started[qi] = true;
            let (bands, count) = row_bands(params, (q0, bq), (k0, bk), dims.kv_len);
            let bands = &bands[..count];
            let seeing = || bands.iter().filter(|band| band.cols > 0);
            let p = &mut scratch.p[..bq * bk];
            for band in seeing() {
                let q_rows = (&input.q[(q0 + band.rows.start) * ld..], ld);
                let p_rows = (&mut p[band.rows.start * bk..], bk);
                let shape = (band.rows.len(), band.cols, d);
                tile_scores(q_rows, (keys_t, bk), shape, params.scale, p_rows)?;
            }
            for r in 0..bq {
                let row = &mut p[r * bk..(r + 1) * bk];
                let seen = params
                    .visible_keys(q0 + r, dims.kv_len)
                    .saturating_sub(k0)
                    .min(bk);
                let lse = input.lse[q0 + r];
                // A row that saw no key at all (lse = -inf) has no probabilities.
                let seen = if lse == T::NEG_INFINITY { 0 } else { seen };
                let (visible, hidden) = row.split_at_mut(seen);
                visible
                    .iter_mut()
                    .for_each(|x| *x = (*x - lse).exp_vectorizable());
                hidden.fill(T::ZERO);
            }
            let p = &scratch.p[..bq * bk];
            // dV += Pᵀ·dO, key columns by the bands that see them.
            key_segments(bands, (bq, bk), |keys, rows| {
                let dout_rows = (&input.dout[q0 * ld_dout..], ld_dout, d);
                let dv = grads.rows(Grad::V, k0 + keys.start, d);
                segment_product((p, bk), dout_rows, (keys, rows), (T::ONE, keys_beta), dv)
            })?;
            // dP = dO·Vᵀ, then dS = P ∘ (dP − D), on the columns each band sees.
            let ds = &mut scratch.ds[..bq * bk];
            for band in seeing() {
                let dout_rows = (&input.dout[(q0 + band.rows.start) * ld_dout..], ld_dout);
                let ds_rows = (&mut ds[band.rows.start * bk..], bk);
                let shape = (band.rows.len(), band.cols, d);
                tile_scores(dout_rows, (values_t, bk), shape, T::ONE, ds_rows)?;
                for r in band.rows.clone() {
                    let delta = input.delta[q0 + r];
                    let range = r * bk..r * bk + band.cols;
                    for (g, &prob) in ds[range.clone()].iter_mut().zip(&p[range]) {
                        *g = prob * (*g - delta);
                    }
                }
            }
            let ds = &scratch.ds[..bq * bk];
            // dQ += scale·dS·K (a band that sees no key adds nothing, or is written zero).
            for band in bands {
                if band.cols == 0 {
                    if dq_beta == T::ZERO {
                        let rows = q0 + band.rows.start..q0 + band.rows.end;
                        grads.zero_rows(Grad::Q, rows, d);
                    }
                    continue;
                }
                tile_product(
                    GemmShape::new(band.rows.len(), d, band.cols),
                    params.scale,
                    (&ds[band.rows.start * bk..], bk),
                    k_tile,
                    dq_beta,
                    grads.rows(Grad::Q, q0 + band.rows.start, d),
                )?;
            }
            // dK += scale·dSᵀ·Q, key columns by the bands that see them.
            let unseen = key_segments(bands, (bq, bk), |keys, rows| {
                let q_rows = (&input.q[q0 * ld..], ld, d);
                let dk = grads.rows(Grad::K, k0 + keys.start, d);
                segment_product(
                    (ds, bk),
                    q_rows,
                    (keys, rows),
                    (params.scale, keys_beta),
                    dk,
                )
            })?;
            if keys_beta == T::ZERO && unseen < bk {
                // Keys no row of this tile sees, written by the tile: zero gradients.
                grads.zero_rows(Grad::K, k0 + unseen..k0 + bk, d);
                grads.zero_rows(Grad::V, k0 + unseen..k0 + bk, d);
            }
        }
        if !keys_started {
            // No query sees these keys: their gradients are zero.
            grads.zero_rows(Grad::K, k0..k0 + bk, d);
            grads.zero_rows(Grad::V, k0..k0 + bk, d);
        }
    }
    for ((q0, bq), started) in tiles(dims.q_len, TILE_Q).zip(dq_started) {
        if !started {
            grads.zero_rows(Grad::Q, q0..q0 + bq, d); // these queries see no key
        }
    }
    Ok(())
}

/// The backward pass over one key/value block (ring attention): adds the block's contribution
/// to `grads.dq` (accumulated: zero it before the first block) and writes the block's `dk` and
/// `dv` (overwritten). `input.lse` is the forward's log-sum-exp over all keys and `input.delta`
/// comes from [`attention_delta_into`]; `params` carries the global positions of the first query
/// and first key row. Summing the blocks' contributions gives the one-call gradients.
pub fn attention_backward_block<T: Float>(
    input: BlockGradInputs<'_, T>,
    dims: AttentionDims,
    params: AttentionParams<T>,
    grads: AttentionGradBuffers<'_, T>,
) -> Result<(), TensorError> {
    let written = Written {
        dq: false,
        keys: true,
    };
    backward_block(input, dims, params, grads, written)
}

/// [`attention_backward_block`] adding the block's `dk` and `dv` into `grads.dk` and
/// `grads.dv` (accumulators of the block's gradients over several query blocks, as ring
/// attention keeps them) instead of overwriting them; `grads.dq` is added to as there. The
/// result is that of adding the overwritten gradients, up to rounding (the tiles' products
/// are added into the accumulators one by one).
pub fn attention_backward_block_accumulate<T: Float>(
    input: BlockGradInputs<'_, T>,
    dims: AttentionDims,
    params: AttentionParams<T>,
    grads: AttentionGradBuffers<'_, T>,
) -> Result<(), TensorError> {
    let written = Written {
        dq: false,
        keys: false,
    };
    backward_block(input, dims, params, grads, written)
}

/// The backward pass over one key/value block, its gradients overwritten or added to.
fn backward_block<T: Float>(
    input: BlockGradInputs<'_, T>,
    dims: AttentionDims,
    params: AttentionParams<T>,
    grads: AttentionGradBuffers<'_, T>,
    written: Written,
) -> Result<(), TensorError> {
    const OP: &str = "attention_backward_block";
    let n = sizes(OP, dims, &params)?;
    check_lengths(
        OP,
        &[
            ("q", n.q, input.q.len()),
            ("k", n.kv, input.k.len()),
            ("v", n.kv, input.v.len()),
            ("dout", n.q, input.dout.len()),
            ("lse", n.rows, input.lse.len()),
            ("delta", n.rows, input.delta.len()),
            ("dq", n.q, grads.dq.len()),
            ("dk", n.kv, grads.dk.len()),
            ("dv", n.kv, grads.dv.len()),
        ],
    )?;
    let (q_step, kv_step, q_len) = (
        dims.q_len * dims.head_dim,
        dims.kv_len * dims.head_dim,
        dims.q_len,
    );
    for_each_slices(
        dims.slices,
        slice_flops(dims, 5),
        (grads.dq, q_step),
        (grads.dk, kv_step),
        (grads.dv, kv_step),
        |first, count, dq, dk, dv| {
            let mut scratch = Scratch::new(dims.head_dim);
            for i in 0..count {
                let s = first + i;
                let (qs, kvs, rows) = (
                    s * q_step..(s + 1) * q_step,
                    s * kv_step..(s + 1) * kv_step,
                    s * q_len..(s + 1) * q_len,
                );
                let slice_input = BlockGradInputs {
                    q: &input.q[qs.clone()],
                    k: &input.k[kvs.clone()],
                    v: &input.v[kvs],
                    dout: &input.dout[qs],
                    lse: &input.lse[rows.clone()],
                    delta: &input.delta[rows],
                };
                let slice_grads = AttentionGradBuffers {
                    dq: &mut dq[i * q_step..(i + 1) * q_step],
                    dk: &mut dk[i * kv_step..(i + 1) * kv_step],
                    dv: &mut dv[i * kv_step..(i + 1) * kv_step],
                };
                backward_slice(
                    slice_input,
                    dims,
                    InputStrides::contiguous(dims.head_dim),
                    &params,
                    SliceGrads::Apart(slice_grads),
                    (&mut scratch, written),
                )?;
            }
            Ok(())
        },
    )
}

/// The backward pass of [`super::flash_attention_into`] over all keys: writes `dq`, `dk` and
/// `dv` from the forward's inputs, output and log-sum-exp and the output's gradient.
pub fn flash_attention_grad_into<T: Float>(
    input: AttentionGradInputs<'_, T>,
    dims: AttentionDims,
    params: AttentionParams<T>,
    grads: AttentionGradBuffers<'_, T>,
) -> Result<(), TensorError> {
    const OP: &str = "flash_attention_grad";
    let n = sizes(OP, dims, &params)?;
    check_lengths(
        OP,
        &[
            ("out", n.q, input.out.len()),
            ("lse", n.rows, input.lse.len()),
        ],
    )?;
    let mut delta = vec![T::ZERO; n.rows];
    attention_delta_into(input.out, input.dout, dims.head_dim, &mut delta)?;
    let block = BlockGradInputs {
        q: input.q,
        k: input.k,
        v: input.v,
        dout: input.dout,
        lse: input.lse,
        delta: &delta,
    };
    let written = Written {
        dq: true,
        keys: true,
    };
    backward_block(block, dims, params, grads, written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each key column goes to exactly one segment, reduced over exactly the rows that see it
    /// (the rows of the bands whose columns include it); the keys no row sees are reported.
    #[test]
    fn key_segments_cover_each_seen_key_once_with_the_rows_that_see_it() {
        let band = |rows: std::ops::Range<usize>, cols| RowBand { rows, cols };
        let cases: [(&[RowBand], usize); 4] = [
            (&[band(0..32, 32), band(32..64, 64)], 64),
            (&[band(0..32, 0), band(32..64, 24)], 24),
            (&[band(0..64, 64)], 64),
            (&[band(0..32, 40), band(32..64, 40)], 40),
        ];
        for (bands, seen) in cases {
            let mut owner = vec![None; 64];
            let unseen = key_segments(bands, (64, 64), |keys, rows| {
                for key in keys {
                    assert!(owner[key].is_none(), "key {key} twice");
                    owner[key] = Some(rows.clone());
                }
                Ok(())
            })
            .unwrap();
            assert_eq!(unseen, seen);
            for (key, rows) in owner.iter().enumerate() {
                let want = bands
                    .iter()
                    .find(|b| b.cols > key)
                    .map(|b| b.rows.start..64);
                assert_eq!(rows, &want, "key {key} of {bands:?}");
            }
        }
    }

    /// One slice's test operands, from fixed formulas.
    struct Operands<T> {
        q: Vec<T>,
        k: Vec<T>,
        v: Vec<T>,
        dout: Vec<T>,
        lse: Vec<T>,
        delta: Vec<T>,
    }

    impl<T: Float> Operands<T> {
        fn new(dims: AttentionDims) -> Operands<T> {
            let (q_len, kv_len, d) = (dims.q_len, dims.kv_len, dims.head_dim);
            let value = |n: usize, m: usize| -> Vec<T> {
                (0..n)
                    .map(|i| T::from_f64(((i * m) % 101) as f64 / 13.0 - 3.5))
                    .collect()
            };
            Operands {
                q: value(q_len * d, 7),
                k: value(kv_len * d, 11),
                v: value(kv_len * d, 17),
                dout: value(q_len * d, 19),
                lse: value(q_len, 23),
                delta: value(q_len, 29),
            }
        }

        fn input(&self) -> BlockGradInputs<'_, T> {
            BlockGradInputs {
                q: &self.q,
                k: &self.k,
                v: &self.v,
                dout: &self.dout,
                lse: &self.lse,
                delta: &self.delta,
            }
        }
    }

    /// Written gradients never read what their buffers held (NaN there stays out), rows no
    /// tile reaches are zero, and the result is bitwise that of adding every product to
    /// zeros — with a key offset past the first query tile (its queries see no key, and the
    /// last key tile is hidden from every query) and with a query offset.
    #[test]
    fn written_gradients_are_the_sums_into_zeros_whatever_the_buffers_held() {
        let (q_len, kv_len, d) = (150, 140, 9);
        let dims = AttentionDims {
            slices: 1,
            q_len,
            kv_len,
            head_dim: d,
        };
        let operands = Operands::<f64>::new(dims);
        let input = operands.input();
        for (q_offset, k_offset) in [(0, 0), (0, 70), (30, 0)] {
            let params = AttentionParams {
                q_offset,
                k_offset,
                ..AttentionParams::new(true, 0.3)
            };
            let run = |fill: f64, written: Written| {
                let (mut dq, mut dk, mut dv) = (
                    vec![fill; q_len * d],
                    vec![fill; kv_len * d],
                    vec![fill; kv_len * d],
                );
                let grads = AttentionGradBuffers {
                    dq: &mut dq,
                    dk: &mut dk,
                    dv: &mut dv,
                };
                backward_block(input, dims, params, grads, written).unwrap();
                [dq, dk, dv].map(|x| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
            };
            let written = run(
                f64::NAN,
                Written {
                    dq: true,
                    keys: true,
                },
            );
            let added = run(
                0.0,
                Written {
                    dq: false,
                    keys: false,
                },
            );
            assert_eq!(written, added, "offsets ({q_offset}, {k_offset})");
            // Some rows are untouched by any product in each case but the first.
            let zero_rows = |bits: &[u64], rows: usize| {
                (0..rows)
                    .filter(|r| bits[r * d..(r + 1) * d].iter().all(|&b| b == 0))
                    .count()
            };
            if k_offset > 0 {
                assert!(
                    zero_rows(&written[0], q_len) >= 64,
                    "queries that see no key"
                );
            }
            if q_offset == 0 && k_offset == 0 {
                assert_eq!(zero_rows(&written[1], kv_len), 0);
            }
        }
    }

    /// The dispatched `delta` rows give the portable loop's bits.
    #[test]
    fn the_wide_row_dots_give_the_portable_bits() {
        let (rows, d) = (37, 67);
        let value = |i: usize, m: usize| ((i * m) % 101) as f32 / 13.0 - 3.5;
        let out: Vec<f32> = (0..rows * d).map(|i| value(i, 7)).collect();
        let dout: Vec<f32> = (0..rows * d).map(|i| value(i, 11)).collect();
        let (mut wide, mut portable) = (vec![0f32; rows], vec![0f32; rows]);
        row_dots(&out, &dout, d, &mut wide);
        row_dots_loop(&out, &dout, d, &mut portable);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&wide), bits(&portable));
        let reference: f32 = (0..d).map(|c| out[5 * d + c] * dout[5 * d + c]).sum();
        assert!((wide[5] - reference).abs() <= 1e-4 * reference.abs().max(1.0));
    }

    /// The dispatched slice (AVX-512 or AVX2 where the CPU has it) gives the portable loop's
    /// bits, its key gradients overwritten and added to.
    #[test]
    fn the_wide_slice_gives_the_portable_bits() {
        let (q_len, kv_len, d) = (37, 45, 9);
        let dims = AttentionDims {
            slices: 1,
            q_len,
            kv_len,
            head_dim: d,
        };
        let operands = Operands::<f32>::new(dims);
        let params = AttentionParams {
            q_offset: 40,
            ..AttentionParams::new(true, 0.3)
        };
        let run = |wide: bool, written: Written| {
            let (mut dq, mut dk, mut dv) = (
                vec![0.5f32; q_len * d],
                vec![0.25f32; kv_len * d],
                vec![0.125f32; kv_len * d],
            );
            let mut scratch = Scratch::new(d);
            let input = operands.input();
            let grads = SliceGrads::Apart(AttentionGradBuffers {
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            });
            let scratch = (&mut scratch, written);
            if wide {
                let strides = InputStrides::contiguous(d);
                backward_slice(input, dims, strides, &params, grads, scratch).unwrap();
            } else {
                let strides = InputStrides::contiguous(d);
                backward_slice_loop(input, dims, strides, &params, grads, scratch).unwrap();
            }
            [dq, dk, dv].map(|x| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        };
        for (dq, keys) in [(false, false), (false, true), (true, false), (true, true)] {
            let written = Written { dq, keys };
            assert_eq!(run(true, written), run(false, written), "{written:?}");
        }
    }
}
