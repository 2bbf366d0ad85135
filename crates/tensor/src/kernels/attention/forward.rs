//! The forward pass: the online softmax over key tiles into a running state (unnormalised
//! output, row maximum, row sum), its normalisation into `(out, lse)`, and [`AttentionState`],
//! the state kept across key/value blocks.

use super::tile_product::tile_product;
use super::{
    check_lengths, row_bands, sizes, slice_flops, tile_scores, tiles, AttentionDims,
    AttentionParams,
};
use super::{TILE_K, TILE_Q};
use crate::error::TensorError;
use crate::kernels::float::Float;
use crate::kernels::matmul::GemmShape;
use crate::kernels::permute::transpose_rows_into;
use crate::kernels::reduce::{max_slice, sum_slice};
use crate::kernels::threads::for_each_slices;
use crate::kernels::wide::widest;

/// One slice's running state: the unnormalised output (`q_len` rows of `head_dim`, `stride`
/// apart), and per row the maximum scaled score seen (`-inf` before any) and the sum of
/// `exp(score − maximum)`.
pub(super) struct Running<'a, T> {
    pub(super) acc: &'a mut [T],
    /// Elements from one row of `acc` to the next.
    pub(super) stride: usize,
    pub(super) max: &'a mut [T],
    pub(super) sum: &'a mut [T],
}

/// One slice's query, key and value rows, each `stride` elements after the one before
/// (`head_dim` when they are contiguous).
#[derive(Clone, Copy)]
pub(super) struct SliceInputs<'a, T> {
    pub(super) q: &'a [T],
    pub(super) k: &'a [T],
    pub(super) v: &'a [T],
    /// Elements from one row to the next.
    pub(super) stride: usize,
}

/// One thread's scratch tiles for the forward: a tile of scores and a key tile transposed.
pub(super) struct ForwardScratch<T> {
    scores: Vec<T>,
    keys_t: Vec<T>,
}

impl<T: Float> ForwardScratch<T> {
    /// Tiles for rows of `head_dim`.
    pub(super) fn new(head_dim: usize) -> ForwardScratch<T> {
        ForwardScratch {
            scores: vec![T::ZERO; TILE_Q * TILE_K],
            keys_t: vec![T::ZERO; TILE_K * head_dim],
        }
    }
}

widest! {
    /// Adds one slice's keys and values to its running state, tile by tile (`scratch` holds a
    /// tile of scores and a key tile transposed), on the widest vector unit the CPU has.
    pub(super) fn accumulate_slice<T>(
        input: SliceInputs<'_, T>,
        dims: AttentionDims,
        params: &AttentionParams<T>,
        state: Running<'_, T>,
        scratch: &mut ForwardScratch<T>,
    ) -> Result<(), TensorError> => accumulate_slice_loop
}

/// [`accumulate_slice`]'s loop.
#[inline(always)]
fn accumulate_slice_loop<T: Float>(
    input: SliceInputs<'_, T>,
    dims: AttentionDims,
    params: &AttentionParams<T>,
    state: Running<'_, T>,
    scratch: &mut ForwardScratch<T>,
) -> Result<(), TensorError> {
    let ForwardScratch { scores, keys_t } = scratch;
    let (d, ld, acc_ld) = (dims.head_dim, input.stride, state.stride);
    // Key tiles outside, query tiles inside: each key tile is transposed once for every query
    // tile that sees it, and each row still adds its key tiles in order (the same arithmetic
    // as query tiles outside).
    for (k0, bk) in tiles(dims.kv_len, TILE_K) {
        let keys_t = &mut keys_t[..d * bk];
        transpose_rows_into((&input.k[k0 * ld..], ld), (bk, d), keys_t);
        for (q0, bq) in tiles(dims.q_len, TILE_Q) {
            // Rows see prefixes that grow with the row: the last row sees the most.
            if k0 >= params.visible_keys(q0 + bq - 1, dims.kv_len) {
                continue; // this tile lies above the causal diagonal
            }
            let s = &mut scores[..bq * bk];
            let (bands, count) = row_bands(params, (q0, bq), (k0, bk), dims.kv_len);
            let bands = &bands[..count];
            for band in bands.iter().filter(|band| band.cols > 0) {
                let q_rows = (&input.q[(q0 + band.rows.start) * ld..], ld);
                let s_rows = (&mut s[band.rows.start * bk..], bk);
                let shape = (band.rows.len(), band.cols, d);
                tile_scores(q_rows, (&*keys_t, bk), shape, params.scale, s_rows)?;
            }
            let acc_tile = &mut state.acc[q0 * acc_ld..];
            for r in 0..bq {
                let row = &mut s[r * bk..(r + 1) * bk];
                let seen = params
                    .visible_keys(q0 + r, dims.kv_len)
                    .saturating_sub(k0)
                    .min(bk);
                let (visible, hidden) = row.split_at_mut(seen);
                hidden.fill(T::ZERO);
                if seen == 0 {
                    continue; // the row sees no key of this tile: its state is untouched
                }
                let old_max = state.max[q0 + r];
                let new_max = old_max.max(max_slice(visible));
                for x in visible.iter_mut() {
                    *x = (*x - new_max).exp_vectorizable();
                }
                let rescale = if old_max == T::NEG_INFINITY {
                    T::ZERO
                } else {
                    (old_max - new_max).exp()
                };
                state.sum[q0 + r] = rescale * state.sum[q0 + r] + sum_slice(visible);
                state.max[q0 + r] = new_max;
                if rescale != T::ONE {
                    acc_tile[r * acc_ld..r * acc_ld + d]
                        .iter_mut()
                        .for_each(|a| *a *= rescale);
                }
            }
            let v_tile = &input.v[k0 * ld..];
            // A band's rows add the keys they see (the rows' later columns hold zeros).
            for band in bands.iter().filter(|band| band.cols > 0) {
                tile_product(
                    GemmShape::new(band.rows.len(), d, band.cols),
                    T::ONE,
                    (&s[band.rows.start * bk..], bk),
                    (v_tile, ld),
                    T::ONE,
                    (&mut acc_tile[band.rows.start * acc_ld..], acc_ld),
                )?;
            }
        }
    }
    Ok(())
}

/// Normalises running states in place: each row of `acc` (`head_dim` elements, `stride` apart)
/// divided by its sum, and `max_to_lse` (the row maxima) turned into the log-sum-exp
/// `max + ln sum`; a row that saw no key becomes `0` with `lse = -inf`.
pub(super) fn normalize<T: Float>(
    (acc, stride): (&mut [T], usize),
    max_to_lse: &mut [T],
    sum: &[T],
    head_dim: usize,
) {
    for (r, (lse, &total)) in max_to_lse.iter_mut().zip(sum).enumerate() {
        let row = &mut acc[r * stride..r * stride + head_dim];
        if total > T::ZERO {
            let inv = T::ONE / total;
            row.iter_mut().for_each(|a| *a *= inv);
            *lse += total.ln();
        } else {
            row.fill(T::ZERO);
            *lse = T::NEG_INFINITY;
        }
    }
}

/// Adds keys and values to the running states of every slice, slices shared out among the
/// threads. `acc`, `max` and `sum` hold every slice's state; the inputs are checked.
fn accumulate_all<T: Float>(
    input: SliceInputs<'_, T>,
    dims: AttentionDims,
    params: &AttentionParams<T>,
    (acc, max, sum): (&mut [T], &mut [T], &mut [T]),
    finish: bool,
) -> Result<(), TensorError> {
    let (q_len, d) = (dims.q_len, dims.head_dim);
    let (q_step, kv_step) = (q_len * d, dims.kv_len * d);
    for_each_slices(
        dims.slices,
        slice_flops(dims, 2),
        (acc, q_step),
        (max, q_len),
        (sum, q_len),
        |first, count, acc, max, sum| {
            let mut scratch = ForwardScratch::new(d);
            for i in 0..count {
                let slice = first + i;
                let slice_input = SliceInputs {
                    q: &input.q[slice * q_step..(slice + 1) * q_step],
                    k: &input.k[slice * kv_step..(slice + 1) * kv_step],
                    v: &input.v[slice * kv_step..(slice + 1) * kv_step],
                    stride: d,
                };
                let (outs, rows) = (i * q_step..(i + 1) * q_step, i * q_len..(i + 1) * q_len);
                let state = Running {
                    acc: &mut acc[outs.clone()],
                    stride: d,
                    max: &mut max[rows.clone()],
                    sum: &mut sum[rows.clone()],
                };
                accumulate_slice(slice_input, dims, params, state, &mut scratch)?;
                if finish {
                    normalize((&mut acc[outs], d), &mut max[rows.clone()], &sum[rows], d);
                }
            }
            Ok(())
        },
    )
}

/// Attention of `q` over all of `k` and `v` (see the [module docs](super)): writes `out`
/// (`q`'s size) and `lse` (`slices · q_len`). With offsets, `k` and `v` may be one block of the
/// keys: `(out, lse)` is then that block's partial result, which [`super::merge_attention_into`]
/// combines with the other blocks'.
pub fn flash_attention_into<T: Float>(
    (q, k, v): (&[T], &[T], &[T]),
    dims: AttentionDims,
    params: AttentionParams<T>,
    out: &mut [T],
    lse: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "flash_attention";
    let n = sizes(OP, dims, &params)?;
    check_lengths(
        OP,
        &[
            ("q", n.q, q.len()),
            ("k", n.kv, k.len()),
            ("v", n.kv, v.len()),
            ("out", n.q, out.len()),
            ("lse", n.rows, lse.len()),
        ],
    )?;
    out.fill(T::ZERO);
    lse.fill(T::NEG_INFINITY);
    let mut sum = vec![T::ZERO; n.rows];
    let input = SliceInputs {
        q,
        k,
        v,
        stride: dims.head_dim,
    };
    accumulate_all(input, dims, &params, (out, lse, &mut sum), true)
}

/// The running state of attention for a block of queries while key/value blocks arrive one at
/// a time (ring attention): the unnormalised output and each row's maximum score and sum.
/// Blocks may come in any order; the result agrees with one call over all keys to rounding.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionState<T> {
    slices: usize,
    q_len: usize,
    head_dim: usize,
    acc: Vec<T>,
    max: Vec<T>,
    sum: Vec<T>,
}

impl<T: Float> AttentionState<T> {
    /// The state before any key: `slices` slices of `q_len` query rows of `head_dim`.
    pub fn new(
        slices: usize,
        q_len: usize,
        head_dim: usize,
    ) -> Result<AttentionState<T>, TensorError> {
        let dims = AttentionDims {
            slices,
            q_len,
            kv_len: 0,
            head_dim,
        };
        let n = sizes(
            "attention_state",
            dims,
            &AttentionParams::new(false, T::ONE),
        )?;
        Ok(AttentionState {
            slices,
            q_len,
            head_dim,
            acc: vec![T::ZERO; n.q],
            max: vec![T::NEG_INFINITY; n.rows],
            sum: vec![T::ZERO; n.rows],
        })
    }

    /// Adds one key/value block (`k`, `v`: `slices · kv_len · head_dim` each) seen by the
    /// queries `q` (`slices · q_len · head_dim`, the same at every call). `params` carries the
    /// global positions of the first query and first key row: keys a row does not see
    /// (causal) change nothing in that row.
    pub fn accumulate(
        &mut self,
        (q, k, v): (&[T], &[T], &[T]),
        kv_len: usize,
        params: AttentionParams<T>,
    ) -> Result<(), TensorError> {
        const OP: &str = "attention_accumulate";
        let dims = AttentionDims {
            slices: self.slices,
            q_len: self.q_len,
            kv_len,
            head_dim: self.head_dim,
        };
        let n = sizes(OP, dims, &params)?;
        check_lengths(
            OP,
            &[
                ("q", n.q, q.len()),
                ("k", n.kv, k.len()),
                ("v", n.kv, v.len()),
            ],
        )?;
        let input = SliceInputs {
            q,
            k,
            v,
            stride: dims.head_dim,
        };
        let state = (&mut self.acc[..], &mut self.max[..], &mut self.sum[..]);
        accumulate_all(input, dims, &params, state, false)
    }

    /// Elements the state holds (its output rows, and each row's maximum and sum): what a
    /// caller accounting its memory counts.
    pub fn held_elements(&self) -> usize {
        self.acc.len() + self.max.len() + self.sum.len()
    }

    /// The unnormalised output (`Σ exp(score − max) · v` per row).
    pub fn unnormalized(&self) -> &[T] {
        &self.acc
    }

    /// Each row's largest scaled score so far (`-inf` before any visible key).
    pub fn row_max(&self) -> &[T] {
        &self.max
    }

    /// Each row's `Σ exp(score − row_max)` so far.
    pub fn row_sum(&self) -> &[T] {
        &self.sum
    }

    /// Writes the attention over every block added: `out` (`slices · q_len · head_dim`) and
    /// `lse` (`slices · q_len`); a row that saw no key gets `0` and `-inf`.
    pub fn finish_into(&self, out: &mut [T], lse: &mut [T]) -> Result<(), TensorError> {
        const OP: &str = "attention_finish";
        check_lengths(
            OP,
            &[
                ("out", self.acc.len(), out.len()),
                ("lse", self.max.len(), lse.len()),
            ],
        )?;
        out.copy_from_slice(&self.acc);
        lse.copy_from_slice(&self.max);
        normalize((out, self.head_dim), lse, &self.sum, self.head_dim);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatched slice (AVX-512 or AVX2 where the CPU has it) gives the portable loop's
    /// bits: the same running state after two key blocks, causal, with offsets.
    #[test]
    fn the_wide_slice_gives_the_portable_bits() {
        let (q_len, kv_len, d) = (37, 45, 9);
        let value = |i: usize, m: usize| ((i * m) % 101) as f32 / 13.0 - 3.5;
        let q: Vec<f32> = (0..q_len * d).map(|i| value(i, 7)).collect();
        let k: Vec<f32> = (0..kv_len * d).map(|i| value(i, 11)).collect();
        let v: Vec<f32> = (0..kv_len * d).map(|i| value(i, 17)).collect();
        let dims = AttentionDims {
            slices: 1,
            q_len,
            kv_len,
            head_dim: d,
        };
        let run = |wide: bool| {
            let (mut acc, mut max, mut sum) = (
                vec![0f32; q_len * d],
                vec![f32::NEG_INFINITY; q_len],
                vec![0f32; q_len],
            );
            let mut scratch = ForwardScratch::new(d);
            for k_offset in [0, kv_len] {
                let params = AttentionParams {
                    q_offset: 50,
                    k_offset,
                    ..AttentionParams::new(true, 0.3)
                };
                let input = SliceInputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    stride: d,
                };
                let state = Running {
                    acc: &mut acc,
                    stride: d,
                    max: &mut max,
                    sum: &mut sum,
                };
                if wide {
                    accumulate_slice(input, dims, &params, state, &mut scratch).unwrap();
                } else {
                    accumulate_slice_loop(input, dims, &params, state, &mut scratch).unwrap();
                }
            }
            [acc, max, sum].map(|x| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        };
        assert_eq!(run(true), run(false));
    }
}
