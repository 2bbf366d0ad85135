//! Attention over the packed `qkv` layout of a fused QKV projection, without transposes.
//!
//! # Layout
//! `qkv` is `[batch, seq, heads, 3·head_dim]`, row-major and contiguous: for every
//! `(batch, position, head)` the query, key and value rows side by side (the query at columns
//! `0..d`, the key at `d..2d`, the value at `2d..3d`, `d = head_dim`). The forward writes
//! `out [batch, seq, heads, head_dim]` and `lse [batch, seq, heads]`; the backward reads the
//! output's gradient `dout [batch, seq, heads, head_dim]` and writes
//! `dqkv [batch, seq, heads, 3·head_dim]`, `dq | dk | dv` side by side like `qkv`. Every
//! `(batch, head)` pair is one slice of `seq` query rows attending over `seq` key rows: its rows
//! lie `heads · 3·d` elements apart in `qkv`, `heads · d` apart in `out`, `heads` apart in `lse`.
//!
//! # The same bits as the transposing path
//! For every slice the results are bit for bit those of [`flash_attention_into`] and
//! [`flash_attention_grad_into`] on `q`, `k`, `v` split off and transposed to
//! `[batch, heads, seq, d]` (`slices = batch · heads`, `q_len = kv_len = seq`), with the results
//! transposed back. No arithmetic is new: per slice the very per-slice loops of those entry
//! points run on the rows where they lie, their tile products by `tile_product` (the bits of
//! the contiguous products). `out` accumulates in place from zero as there; only the slice's
//! `lse` goes through a row of scratch. The backward writes every gradient as those entry
//! points do (each row's first tile product written, the later ones added); its
//! `delta = rowsum(dout ∘ out)` is [`attention_delta_into`] itself, run once per batch element
//! over the contiguous `[seq, heads, head_dim]` rows of all heads.
//!
//! # Threads
//! Whole batch elements are shared out among the allowed threads ([`crate::kernels::threads`]),
//! each slice computed by one thread in one fixed order: the bits do not depend on the thread
//! count.
//!
//! [`flash_attention_into`]: super::flash_attention_into
//! [`flash_attention_grad_into`]: super::flash_attention_grad_into

use super::backward::{
    attention_delta_into, backward_slice, InputStrides, Scratch, SliceGrads, Written,
};
use super::forward::{accumulate_slice, normalize, ForwardScratch, Running, SliceInputs};
use super::{check_lengths, sizes, slice_flops, AttentionDims, AttentionParams, BlockGradInputs};
use crate::error::TensorError;
use crate::kernels::float::Float;
use crate::kernels::row_sums::RowSums;
use crate::kernels::threads::{for_each_part, threads_for};

/// The sizes of attention over the packed layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedDims {
    /// Batch elements.
    pub batch: usize,
    /// Positions per sequence (query and key rows of every slice).
    pub seq: usize,
    /// Attention heads.
    pub heads: usize,
    /// Width of every query, key and value row.
    pub head_dim: usize,
}

/// Element counts of the packed buffers of a call, overflow-checked.
#[derive(Debug, Clone, Copy)]
struct PackedSizes {
    /// `qkv`, `dqkv`: `batch · seq · heads · 3·head_dim`.
    qkv: usize,
    /// `out`, `dout`: `batch · seq · heads · head_dim`.
    out: usize,
    /// `lse`: `batch · seq · heads`.
    lse: usize,
    /// One batch element's `out` (`seq · heads · head_dim`).
    out_step: usize,
    /// One batch element's `lse` (`seq · heads`).
    lse_step: usize,
    /// One batch element's `qkv` (`seq · heads · 3·head_dim`).
    qkv_step: usize,
}

/// The buffer sizes of `dims`, checked for overflow, and the scale checked (by [`sizes`], as
/// the transposing entry points check them).
fn packed_sizes<T: Float>(
    op: &'static str,
    dims: PackedDims,
    params: &AttentionParams<T>,
) -> Result<PackedSizes, TensorError> {
    // One batch element as `heads` slices of the transposing layout.
    let per_batch = sizes(op, slice_dims(dims, dims.heads), params)?;
    let overflow = || TensorError::InvalidArgument {
        op,
        reason: format!("the sizes {dims:?} overflow the address space"),
    };
    let qkv_step = per_batch.q.checked_mul(3).ok_or_else(overflow)?;
    dims.head_dim.checked_mul(3).ok_or_else(overflow)?;
    let total = |step: usize| step.checked_mul(dims.batch).ok_or_else(overflow);
    Ok(PackedSizes {
        qkv: total(qkv_step)?,
        out: total(per_batch.q)?,
        lse: total(per_batch.rows)?,
        out_step: per_batch.q,
        lse_step: per_batch.rows,
        qkv_step,
    })
}

/// The transposing layout's dims of `slices` slices of `dims`.
fn slice_dims(dims: PackedDims, slices: usize) -> AttentionDims {
    AttentionDims {
        slices,
        q_len: dims.seq,
        kv_len: dims.seq,
        head_dim: dims.head_dim,
    }
}

/// Batch elements per thread part: all of them (one part) when the work is too small to split
/// or one thread is allowed; at least 1.
fn batch_per_part(batch: usize, flops_per_batch: u64) -> usize {
    let n = threads_for(flops_per_batch.saturating_mul(batch as u64)).min(batch);
    if n < 2 {
        batch.max(1)
    } else {
        batch.div_ceil(n)
    }
}

/// Copies `N` side-by-side column blocks of strided rows into contiguous buffers, in one pass
/// over the rows: row `s` of `dst[p]` (`width` elements) from
/// `src[s·stride + column + p·width..][..width]`, for the `dst[p].len() / width` rows.
fn gather_rows<T: Copy, const N: usize>(
    src: &[T],
    (stride, column): (usize, usize),
    width: usize,
    mut dst: [&mut [T]; N],
) {
    let rows = match dst.first() {
        Some(first) if width > 0 => first.len() / width,
        _ => return,
    };
    for s in 0..rows {
        let at = s * stride + column;
        for (p, rows) in dst.iter_mut().enumerate() {
            let from = at + p * width;
            rows[s * width..(s + 1) * width].copy_from_slice(&src[from..from + width]);
        }
    }
}

/// [`gather_rows`]'s inverse: the contiguous rows of the `src` buffers into `dst`, row `s` of
/// `src[p]` at `dst[s·stride + column + p·width..][..width]`.
fn scatter_rows<T: Copy, const N: usize>(
    src: [&[T]; N],
    width: usize,
    dst: &mut [T],
    (stride, column): (usize, usize),
) {
    let rows = match src.first() {
        Some(first) if width > 0 => first.len() / width,
        _ => return,
    };
    for s in 0..rows {
        let at = s * stride + column;
        for (p, rows) in src.iter().enumerate() {
            let to = at + p * width;
            dst[to..to + width].copy_from_slice(&rows[s * width..(s + 1) * width]);
        }
    }
}

/// Attention over the packed layout of a fused QKV projection (see the
/// [module docs](super#packed-layout)): reads `qkv [batch, seq, heads, 3·head_dim]` (per
/// `(batch, position, head)` the query, key and value rows side by side, at columns `0..d`,
/// `d..2d`, `2d..3d`) and writes `out [batch, seq, heads, head_dim]` and
/// `lse [batch, seq, heads]`: bit for bit what [`super::flash_attention_into`] gives on `q`,
/// `k`, `v` transposed to `[batch, heads, seq, head_dim]` (`slices = batch · heads`,
/// `q_len = kv_len = seq`), transposed back, on any number of threads. `params` (mask, scale,
/// offsets) means what it means there. A wrong buffer length or scale, or sizes that overflow,
/// are errors.
pub fn packed_attention_into<T: Float>(
    qkv: &[T],
    dims: PackedDims,
    params: AttentionParams<T>,
    out: &mut [T],
    lse: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "packed_attention";
    let n = packed_sizes(OP, dims, &params)?;
    check_lengths(
        OP,
        &[
            ("qkv", n.qkv, qkv.len()),
            ("out", n.out, out.len()),
            ("lse", n.lse, lse.len()),
        ],
    )?;
    let flops = slice_flops(slice_dims(dims, 1), 2).saturating_mul(dims.heads as u64);
    let run = |first: usize, out: &mut [T], lse: &mut [T]| {
        forward_part(qkv, dims, &params, first, out, lse)
    };
    if n.out_step == 0 || n.lse_step == 0 {
        // Nothing to cut into parts (and with `head_dim` 0 only `lse` to write).
        return run(0, out, lse);
    }
    let per = batch_per_part(dims.batch, flops);
    let parts: Vec<_> = out
        .chunks_mut(per * n.out_step)
        .zip(lse.chunks_mut(per * n.lse_step))
        .collect();
    for_each_part(parts, |i, (out, lse)| run(i * per, out, lse))
        .into_iter()
        .collect()
}

/// The forward of the batch elements from `first` on whose `out` and `lse` rows `out` and
/// `lse` hold (one thread's part): the running outputs in place in `out`, the other state in
/// scratch allocated once.
fn forward_part<T: Float>(
    qkv: &[T],
    dims: PackedDims,
    params: &AttentionParams<T>,
    first: usize,
    out: &mut [T],
    lse: &mut [T],
) -> Result<(), TensorError> {
    let PackedDims {
        seq,
        heads,
        head_dim: d,
        ..
    } = dims;
    let rows = seq * heads;
    if rows == 0 {
        return Ok(());
    }
    let count = lse.len() / rows;
    let slice = slice_dims(dims, 1);
    let (mut max, mut sum) = (vec![T::ZERO; seq], vec![T::ZERO; seq]);
    let mut scratch = ForwardScratch::new(d);
    for b in 0..count {
        let packed = &qkv[(first + b) * rows * 3 * d..(first + b + 1) * rows * 3 * d];
        let (out_b, lse_b) = (
            &mut out[b * rows * d..(b + 1) * rows * d],
            &mut lse[b * rows..(b + 1) * rows],
        );
        // The running outputs, in place in `out`, start as `flash_attention_into` starts them.
        out_b.fill(T::ZERO);
        for h in 0..heads {
            let column = h * 3 * d;
            max.fill(T::NEG_INFINITY);
            sum.fill(T::ZERO);
            let input = SliceInputs {
                q: &packed[column..],
                k: &packed[column + d..],
                v: &packed[column + 2 * d..],
                stride: heads * 3 * d,
            };
            let state = Running {
                acc: &mut out_b[h * d..],
                stride: heads * d,
                max: &mut max,
                sum: &mut sum,
            };
            accumulate_slice(input, slice, params, state, &mut scratch)?;
            normalize((&mut out_b[h * d..], heads * d), &mut max, &sum, d);
            scatter_rows([&max], 1, lse_b, (heads, h));
        }
    }
    Ok(())
}

/// The backward of [`packed_attention_into`]: reads `qkv`, the forward's `out` and `lse`, and
/// the output's gradient `dout` (`[batch, seq, heads, head_dim]`), and writes every element of
/// `dqkv` (`[batch, seq, heads, 3·head_dim]`, `dq | dk | dv` side by side like `qkv`), bit for
/// bit what [`super::flash_attention_grad_into`] gives on the transposed operands, transposed
/// back (`dq` accumulated from zero, `dk` and `dv` written), on any number of threads. A wrong
/// buffer length or scale, or sizes that overflow, are errors.
pub fn packed_attention_grad_into<T: Float>(
    qkv: &[T],
    out: &[T],
    lse: &[T],
    dout: &[T],
    dims: PackedDims,
    params: AttentionParams<T>,
    dqkv: &mut [T],
) -> Result<(), TensorError> {
    let input = PackedGradInputs::from((qkv, out, lse, dout));
    let Some(qkv_step) = checked_grad(input, dims, &params, dqkv.len())? else {
        return Ok(()); // `dqkv` is empty
    };
    let flops = slice_flops(slice_dims(dims, 1), 5).saturating_mul(dims.heads as u64);
    let per = batch_per_part(dims.batch, flops);
    let parts: Vec<_> = dqkv.chunks_mut(per * qkv_step).collect();
    for_each_part(parts, |i, dqkv| {
        backward_part(input, dims, &params, (i * per, dqkv), None)
    })
    .into_iter()
    .collect()
}

/// [`packed_attention_grad_into`] on one thread with `sums` taking `dqkv`'s rows (each
/// position's `heads · 3 · head_dim` gradients, [`RowSums::cols`] of them) batch element by
/// batch element, as each is finished and in L2: the bits of [`packed_attention_grad_into`]
/// and then the separate sum of the rows (the `qkv` projection's bias gradient).
pub fn packed_attention_grad_summing_rows<T: Float>(
    inputs: (&[T], &[T], &[T], &[T]),
    dims: PackedDims,
    params: AttentionParams<T>,
    dqkv: &mut [T],
    sums: &mut RowSums<T>,
) -> Result<(), TensorError> {
    let input = PackedGradInputs::from(inputs);
    let row = dims.heads * 3 * dims.head_dim;
    check_lengths(
        "packed_attention_grad",
        &[
            ("summed rows", sums.rows() * sums.cols(), dqkv.len()),
            ("summed columns", row, sums.cols()),
        ],
    )?;
    match checked_grad(input, dims, &params, dqkv.len())? {
        Some(_) => backward_part(input, dims, &params, (0, dqkv), Some(sums)),
        None => Ok(()),
    }
}

/// The backward's sizes checked against its buffers (`dqkv` of `dqkv_len` elements): `None`
/// when there is nothing to compute, else the elements of one batch element's `qkv`.
fn checked_grad<T: Float>(
    input: PackedGradInputs<'_, T>,
    dims: PackedDims,
    params: &AttentionParams<T>,
    dqkv_len: usize,
) -> Result<Option<usize>, TensorError> {
    const OP: &str = "packed_attention_grad";
    let n = packed_sizes(OP, dims, params)?;
    check_lengths(
        OP,
        &[
            ("qkv", n.qkv, input.qkv.len()),
            ("out", n.out, input.out.len()),
            ("lse", n.lse, input.lse.len()),
            ("dout", n.out, input.dout.len()),
            ("dqkv", n.qkv, dqkv_len),
        ],
    )?;
    Ok((n.qkv_step > 0).then_some(n.qkv_step))
}

/// What the packed backward reads, in the packed layout.
#[derive(Clone, Copy)]
struct PackedGradInputs<'a, T> {
    qkv: &'a [T],
    out: &'a [T],
    lse: &'a [T],
    dout: &'a [T],
}

impl<'a, T> From<(&'a [T], &'a [T], &'a [T], &'a [T])> for PackedGradInputs<'a, T> {
    /// `(qkv, out, lse, dout)`, as the entry points take them.
    fn from((qkv, out, lse, dout): (&'a [T], &'a [T], &'a [T], &'a [T])) -> Self {
        PackedGradInputs {
            qkv,
            out,
            lse,
            dout,
        }
    }
}

/// The backward of the batch elements from `first` on whose gradient rows `dqkv` holds (one
/// thread's part); its scratch allocated once. `sums`, if given, takes each batch element's
/// rows once they are written.
fn backward_part<T: Float>(
    input: PackedGradInputs<'_, T>,
    dims: PackedDims,
    params: &AttentionParams<T>,
    (first, dqkv): (usize, &mut [T]),
    mut sums: Option<&mut RowSums<T>>,
) -> Result<(), TensorError> {
    let PackedDims {
        seq,
        heads,
        head_dim: d,
        ..
    } = dims;
    let rows = seq * heads;
    let count = dqkv.len() / (rows * 3 * d);
    let slice = slice_dims(dims, 1);
    // Every row is read and written in place.
    let strides = InputStrides {
        qkv: heads * 3 * d,
        dout: heads * d,
    };
    let (mut lse, mut delta) = (vec![T::ZERO; seq], vec![T::ZERO; seq]);
    // Every (position, head) row's `delta`, in `out`'s row order.
    let mut deltas = vec![T::ZERO; rows];
    let mut scratch = Scratch::new(d);
    for b in 0..count {
        let global = first + b;
        let packed = &input.qkv[global * rows * 3 * d..(global + 1) * rows * 3 * d];
        let out_b = &input.out[global * rows * d..(global + 1) * rows * d];
        let dout_b = &input.dout[global * rows * d..(global + 1) * rows * d];
        let lse_b = &input.lse[global * rows..(global + 1) * rows];
        let dqkv_b = &mut dqkv[b * rows * 3 * d..(b + 1) * rows * 3 * d];
        // As `flash_attention_grad_into`, every gradient written: each row's first product
        // lands as it is, so `dqkv` is never zeroed first (every element is written).
        // `attention_delta_into`'s rows, all heads in one pass over the contiguous rows.
        attention_delta_into(out_b, dout_b, d, &mut deltas)?;
        for h in 0..heads {
            let column = h * 3 * d;
            gather_rows(lse_b, (heads, h), 1, [&mut lse]);
            gather_rows(&deltas, (heads, h), 1, [&mut delta]);
            let block = BlockGradInputs {
                q: &packed[column..],
                k: &packed[column + d..],
                v: &packed[column + 2 * d..],
                dout: &dout_b[h * d..],
                lse: &lse,
                delta: &delta,
            };
            let grads = SliceGrads::SideBySide {
                dqkv: &mut dqkv_b[column..],
                stride: heads * 3 * d,
            };
            let written = Written {
                dq: true,
                keys: true,
            };
            backward_slice(
                block,
                slice,
                strides,
                params,
                grads,
                (&mut scratch, written),
            )?;
        }
        if let Some(sums) = sums.as_deref_mut() {
            sums.add_rows(dqkv_b);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gathering one head's query, key and value rows of packed rows and scattering them back
    /// restores exactly those elements and leaves the others alone.
    #[test]
    fn gather_then_scatter_moves_exactly_one_head_s_rows() {
        let (seq, heads, d) = (5, 3, 4);
        let packed: Vec<f32> = (0..seq * heads * 3 * d).map(|i| i as f32).collect();
        for head in 0..heads {
            let column = head * 3 * d;
            let (mut q, mut k, mut v) = (
                vec![0f32; seq * d],
                vec![0f32; seq * d],
                vec![0f32; seq * d],
            );
            gather_rows(
                &packed,
                (heads * 3 * d, column),
                d,
                [&mut q, &mut k, &mut v],
            );
            for s in 0..seq {
                let at = (s * heads + head) * 3 * d;
                for (part, rows) in [&q, &k, &v].into_iter().enumerate() {
                    let from = at + part * d;
                    assert_eq!(&rows[s * d..(s + 1) * d], &packed[from..from + d]);
                }
            }
            let mut back = vec![-1f32; packed.len()];
            scatter_rows([&q, &k, &v], d, &mut back, (heads * 3 * d, column));
            let written = back.iter().filter(|&&x| x >= 0.0).count();
            assert_eq!(written, 3 * seq * d);
            for (i, &x) in back.iter().enumerate() {
                assert!(x < 0.0 || x == packed[i], "element {i}");
            }
        }
        // Zero-width rows move nothing (and do not panic).
        gather_rows(&packed, (1, 0), 0, [&mut []]);
        scatter_rows([&[] as &[f32]], 0, &mut [], (1, 0));
    }

    /// Small calls stay whole on one part; every part holds at least one batch element.
    /// The backward summing its rows gives `packed_attention_grad_into`'s bits and then those
    /// of the separate row sums, in both orders.
    #[test]
    fn the_backward_summing_rows_gives_the_two_passes_bits() {
        use crate::kernels::row_sums::RowOrder;
        let dims = PackedDims {
            batch: 4,
            seq: 8,
            heads: 2,
            head_dim: 4,
        };
        let cols = dims.heads * 3 * dims.head_dim;
        let rows = dims.batch * dims.seq;
        let value = |i: usize, s: usize| ((i * s) % 97) as f32 / 48.0 - 1.0;
        let qkv: Vec<f32> = (0..rows * cols).map(|i| value(i, 31)).collect();
        let dout: Vec<f32> = (0..rows * cols / 3).map(|i| value(i, 17)).collect();
        let params = AttentionParams::new(true, 0.5f32);
        let (mut out, mut lse) = (vec![0f32; dout.len()], vec![0f32; rows * dims.heads]);
        packed_attention_into(&qkv, dims, params, &mut out, &mut lse).unwrap();
        let mut want = vec![0f32; qkv.len()];
        packed_attention_grad_into(&qkv, &out, &lse, &dout, dims, params, &mut want).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for order in [RowOrder::Sequential, RowOrder::Canonical { block_len: 4 }] {
            let mut sums = RowSums::new("test", (rows, cols), order).unwrap();
            let mut got = vec![f32::NAN; qkv.len()];
            let inputs = (&qkv[..], &out[..], &lse[..], &dout[..]);
            packed_attention_grad_summing_rows(inputs, dims, params, &mut got, &mut sums).unwrap();
            assert_eq!(bits(&got), bits(&want), "{order:?}");
            let mut db = vec![f32::NAN; cols];
            sums.finish("test", &mut db).unwrap();
            let mut separate = RowSums::new("test", (rows, cols), order).unwrap();
            want.chunks_exact(cols).for_each(|r| separate.add_row(r));
            let mut want_db = vec![0f32; cols];
            separate.finish("test", &mut want_db).unwrap();
            assert_eq!(bits(&db), bits(&want_db), "{order:?}");
        }
    }

    #[test]
    fn small_calls_stay_on_one_part() {
        assert_eq!(batch_per_part(7, 1), 7);
        assert_eq!(batch_per_part(0, u64::MAX), 1);
    }
}
