//! Fused scaled dot-product attention, FlashAttention's blocking on the CPU:
//! `out = softmax(scale · q·kᵀ + mask) · v` computed tile by tile, the `[q_len, kv_len]` scores
//! never materialised, and its backward pass.
//!
//! # Layout
//! `q` is `[slices, q_len, head_dim]`, `k` and `v` are `[slices, kv_len, head_dim]`, row-major
//! and contiguous; the slices are the flattened leading dims (batch × heads) and independent of
//! each other. The forward writes `out [slices, q_len, head_dim]` and the log-sum-exp of every
//! row's scaled, masked scores, `lse [slices, q_len]`, from which the backward pass recomputes
//! the probabilities (`p = exp(scale · q·kᵀ − lse)`).
//!
//! # Masks are functions of global positions
//! With [`AttentionParams::causal`], query row `i` sees key row `j` iff
//! `k_offset + j ≤ q_offset + i`, where the offsets are the global positions of the call's first
//! query and first key row. A rank holding query block `i` and given key/value block `j` of
//! another rank (ring attention) therefore masks exactly as one call over the whole sequence.
//!
//! A row that sees no key of a call contributes nothing to it (its running state is untouched,
//! never NaN). A row that sees no key at all gets `out = 0` and `lse = -inf`; the backward pass
//! gives it zero gradients. Causal self-attention (equal offsets) never has such a row: every
//! query sees at least its own position.
//!
//! # Entry points
//! - one call over all keys: [`flash_attention_into`] and [`flash_attention_grad_into`] (tensor
//!   level: [`flash_attention`], [`flash_attention_grad`]);
//! - key/value blocks one at a time (ring attention), forward: an [`AttentionState`] that
//!   [`AttentionState::accumulate`]s each block (any order) and is
//!   [`AttentionState::finish_into`]ed once, or per block a [`flash_attention_into`] whose partial
//!   `(out, lse)` results are combined by [`merge_attention_into`]; backward:
//!   [`attention_delta_into`] once, then [`attention_backward_block`] per block, which accumulates
//!   `dq` and returns the block's `dk` and `dv`;
//! - the packed `qkv [batch, seq, heads, 3·head_dim]` of a fused QKV projection, read in place
//!   (no transposes), with the bits of the one-call entry points on the transposed operands:
//!   [`packed_attention_into`] and [`packed_attention_grad_into`] (tensor level:
//!   [`packed_attention`], [`packed_attention_grad`]).
//!
//! # Packed layout
//! [`packed_attention_into`] and [`packed_attention_grad_into`] read the output of a fused QKV
//! projection in place: `qkv [batch, seq, heads, 3·head_dim]`, for every (batch, position, head)
//! the query, key and value rows side by side (columns `0..d`, `d..2d`, `2d..3d`); they write
//! `out [batch, seq, heads, head_dim]`, `lse [batch, seq, heads]` and
//! `dqkv [batch, seq, heads, 3·head_dim]` (`dq | dk | dv` like `qkv`). The one-call entry points'
//! per-slice loops run on each (batch, head) slice's rows where they lie, their tile products
//! reading and writing rows a stride apart (`tile_product`, the bits of `gemm_strided` and so
//! of the contiguous products): the bits are exactly those of
//! [`flash_attention_into`] and [`flash_attention_grad_into`] on `q`, `k`, `v` transposed to
//! `[batch, heads, seq, head_dim]`, transposed back, on any number of threads.
//!
//! # Algorithm
//! Tiles of [`TILE_Q`] query rows × [`TILE_K`] key rows. Forward: per tile the scores by
//! [`gemm`](fn@crate::kernels::gemm), then the online softmax: a running row maximum `m`, a
//! running sum `l` of `exp(s − m)` and an unnormalised output, rescaled by `exp(m_old − m_new)`
//! when the maximum grows; at the end `out = acc / l`, `lse = m + ln l`. Tiles wholly above the
//! causal diagonal are skipped. Backward (FlashAttention-2): per key tile, over the query tiles
//! that see it, `P` recomputed from `lse`, `dV += Pᵀ·dO`, `dP = dO·Vᵀ`, `dS = P ∘ (dP − D)`,
//! `dQ += scale·dS·K`, `dK += scale·dSᵀ·Q`, with `D = rowsum(dO ∘ O)`.
//!
//! # Threads
//! Slices are shared out whole among the allowed threads ([`super::threads`]); a slice's
//! arithmetic runs in one fixed order whatever the number of slices or threads, so the bits are
//! the same on one thread, on several, and on any split of the slices over ranks.

mod backward;
mod forward;
mod merge;
mod packed;
mod tensor_level;
mod tile_product;

use self::tile_product::tile_product;
use crate::error::TensorError;
use crate::kernels::check;
use crate::kernels::float::Float;
use crate::kernels::matmul::GemmShape;

pub use self::backward::{
    attention_backward_block, attention_backward_block_accumulate, attention_delta_into,
    flash_attention_grad_into, AttentionGradBuffers, AttentionGradInputs, BlockGradInputs,
};
pub use self::forward::{flash_attention_into, AttentionState};
pub use self::merge::merge_attention_into;
pub use self::packed::{
    packed_attention_grad_into, packed_attention_grad_summing_rows, packed_attention_into,
    PackedDims,
};
pub use self::tensor_level::{
    flash_attention, flash_attention_grad, packed_attention, packed_attention_grad, AttentionGrads,
};

/// Query rows per tile.
pub const TILE_Q: usize = 64;
/// Key rows per tile.
pub const TILE_K: usize = 64;

/// The sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    /// Independent slices (batch × heads).
    pub slices: usize,
    /// Query rows per slice.
    pub q_len: usize,
    /// Key (and value) rows per slice.
    pub kv_len: usize,
    /// Width of every query, key and value row.
    pub head_dim: usize,
}

/// What a call computes: the mask, the scale, and where its rows lie in the global sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams<T> {
    /// Hide the keys after each query's position (by global positions).
    pub causal: bool,
    /// The factor of the scores, finite and positive (`1/√head_dim` for attention).
    pub scale: T,
    /// Global position of the first query row (0 for a whole sequence).
    pub q_offset: usize,
    /// Global position of the first key row (0 for a whole sequence).
    pub k_offset: usize,
}

impl<T: Float> AttentionParams<T> {
    /// Attention over whole sequences (both offsets 0).
    pub fn new(causal: bool, scale: T) -> AttentionParams<T> {
        AttentionParams {
            causal,
            scale,
            q_offset: 0,
            k_offset: 0,
        }
    }

    /// How many of the `kv_len` keys query row `row` (local) sees: always a prefix of them.
    pub fn visible_keys(&self, row: usize, kv_len: usize) -> usize {
        if !self.causal {
            return kv_len;
        }
        self.q_offset
            .saturating_add(row)
            .saturating_add(1)
            .saturating_sub(self.k_offset)
            .min(kv_len)
    }
}

/// Element counts of the buffers of a call.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// `q`, `out`, `dout`, `dq`: `slices · q_len · head_dim`.
    q: usize,
    /// `k`, `v`, `dk`, `dv`: `slices · kv_len · head_dim`.
    kv: usize,
    /// `lse`, `delta`: `slices · q_len`.
    rows: usize,
}

/// The buffer sizes of `dims`, checked for overflow, and the scale checked.
fn sizes<T: Float>(
    op: &'static str,
    dims: AttentionDims,
    params: &AttentionParams<T>,
) -> Result<Sizes, TensorError> {
    crate::kernels::softmax::check_scale(op, params.scale)?;
    let product = |a: usize, b: usize, c: usize| a.checked_mul(b).and_then(|x| x.checked_mul(c));
    match (
        product(dims.slices, dims.q_len, dims.head_dim),
        product(dims.slices, dims.kv_len, dims.head_dim),
        product(dims.slices, dims.q_len, 1),
    ) {
        (Some(q), Some(kv), Some(rows)) => Ok(Sizes { q, kv, rows }),
        _ => Err(TensorError::InvalidArgument {
            op,
            reason: format!("the sizes {dims:?} overflow the address space"),
        }),
    }
}

/// Elements of `rows` rows of `head_dim`, or an error naming `op` when that overflows.
fn row_elements(op: &'static str, rows: usize, head_dim: usize) -> Result<usize, TensorError> {
    rows.checked_mul(head_dim)
        .ok_or_else(|| TensorError::InvalidArgument {
            op,
            reason: format!("{rows} rows of {head_dim} overflow the address space"),
        })
}

/// `Ok` when every `(name, expected, got)` buffer length matches.
fn check_lengths(
    op: &'static str,
    buffers: &[(&'static str, usize, usize)],
) -> Result<(), TensorError> {
    buffers
        .iter()
        .try_for_each(|&(name, expected, got)| check::buffer_len(op, name, expected, got))
}

/// Floating-point operations of one slice's forward (two products of `q_len·kv_len·head_dim`).
fn slice_flops(dims: AttentionDims, products: u64) -> u64 {
    products
        .saturating_mul(2)
        .saturating_mul(dims.q_len as u64)
        .saturating_mul(dims.kv_len as u64)
        .saturating_mul(dims.head_dim.max(1) as u64)
}

/// The tiles of `len` rows, `tile` at a time: `(first row, rows)`.
fn tiles(len: usize, tile: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(tile)
        .map(move |first| (first, tile.min(len - first)))
}

/// A band of a tile's query rows (`rows`, from the tile's first row) and how many of the
/// tile's key columns its products run over (`cols`; 0 when its rows see none).
#[derive(Debug, Clone, PartialEq, Eq)]
struct RowBand {
    rows: std::ops::Range<usize>,
    cols: usize,
}

/// The smallest query tile a causal tile is cut into bands for, and the step a band's key
/// columns are rounded up to: below it the products' calls would cost more than the masked
/// columns they skip.
const BAND_STEP: usize = 32;

/// The row bands of a `(q0, bq) × (k0, bk)` tile, in row order, with the key columns their
/// products run over: one band of every row when the tile's middle row sees as many columns as
/// its last (no causal diagonal inside), else its two halves. A band's products skip the key
/// columns none of its rows sees (masked, their probabilities zero: about a quarter of a
/// diagonal tile's arithmetic).
///
/// The same bits as products over the whole tile: a skipped term is always an exact zero at the
/// end (or, in the key gradients' sums over rows, the start) of a fused multiply-add chain, which
/// leaves the sum as it is; products small enough for the `gemm` crate's other paths are padded
/// onto its tiled kernels by `gemm_strided`. A band's columns are those its last row sees rounded
/// up to a multiple of [`BAND_STEP`] (or the whole tile), so that its products stay at least
/// that large: the test of one device's bits against a context-parallel ring's passes with or
/// without the rounding, which only keeps small products, and their padding, rare.
fn row_bands<T: Float>(
    params: &AttentionParams<T>,
    (q0, bq): (usize, usize),
    (k0, bk): (usize, usize),
    kv_len: usize,
) -> ([RowBand; 2], usize) {
    let cols = |row: usize| {
        let seen = params.visible_keys(q0 + row, kv_len).saturating_sub(k0);
        match seen {
            0 => 0,
            seen => seen.next_multiple_of(BAND_STEP).min(bk),
        }
    };
    let whole = RowBand {
        rows: 0..bq,
        cols: bk,
    };
    let half = bq / 2;
    if bk < BAND_STEP || bq < BAND_STEP || cols(half - 1) == cols(bq - 1) {
        return ([whole.clone(), whole], 1);
    }
    let bands = [
        RowBand {
            rows: 0..half,
            cols: cols(half - 1),
        },
        RowBand {
            rows: half..bq,
            cols: cols(bq - 1),
        },
    ];
    (bands, 2)
}

/// `s = scale · q_rows · keys_t` for `rows` query rows of `head_dim` (`ld` apart) and a key
/// tile transposed (`permute::transpose_rows_into`: `head_dim` rows of at least `cols` keys), into `s`'s
/// rows `ld` apart. The key tile transposed once serves every query tile that sees it, where
/// the product of `q·kᵀ` would have the `gemm` crate gather the keys' columns for each.
fn tile_scores<T: Float>(
    q_rows: (&[T], usize),
    keys_t: (&[T], usize),
    (rows, cols, head_dim): (usize, usize, usize),
    scale: T,
    s: (&mut [T], usize),
) -> Result<(), TensorError> {
    let shape = GemmShape::new(rows, cols, head_dim);
    tile_product(shape, scale, q_rows, keys_t, T::ZERO, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn causal(q_offset: usize, k_offset: usize) -> AttentionParams<f32> {
        AttentionParams {
            q_offset,
            k_offset,
            ..AttentionParams::new(true, 1.0)
        }
    }

    /// A diagonal tile is cut into halves, each with the key columns its last row sees; a tile
    /// every row sees whole, a small tile and a non-causal tile stay one band.
    #[test]
    fn row_bands_cut_only_tiles_the_diagonal_crosses() {
        let band = |rows: std::ops::Range<usize>, cols| RowBand { rows, cols };
        let (bands, n) = row_bands(&causal(0, 0), (64, 64), (64, 64), 128);
        assert_eq!(&bands[..n], &[band(0..32, 32), band(32..64, 64)]);
        let (bands, n) = row_bands(&causal(0, 0), (64, 64), (0, 64), 128);
        assert_eq!(&bands[..n], &[band(0..64, 64)]);
        let (bands, n) = row_bands(&AttentionParams::new(false, 1.0), (0, 64), (0, 64), 64);
        assert_eq!(&bands[..n], &[band(0..64, 64)]);
        let (bands, n) = row_bands(&causal(0, 0), (0, 31), (0, 31), 31);
        assert_eq!(&bands[..n], &[band(0..31, 31)]);
        // Keys from global position 40 on: the first half sees none, the last row 24 of them
        // (rounded up to 32).
        let (bands, n) = row_bands(&causal(0, 40), (0, 64), (0, 64), 64);
        assert_eq!(&bands[..n], &[band(0..32, 0), band(32..64, 32)]);
        // Offsets off the step: the first half's 7 keys become 32 columns.
        let (bands, n) = row_bands(&causal(7, 32), (0, 64), (0, 64), 64);
        assert_eq!(&bands[..n], &[band(0..32, 32), band(32..64, 64)]);
        // A key tile under the step stays whole.
        let (bands, n) = row_bands(&causal(0, 0), (0, 64), (0, 20), 20);
        assert_eq!(&bands[..n], &[band(0..64, 20)]);
    }
}
