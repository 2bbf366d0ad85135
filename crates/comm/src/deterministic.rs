//! Reductions in a fixed order: every element reduced over the group's members in an order
//! fixed by the member order alone, whatever the arrival order or the backend. Two orders exist
//! ([`Combine`]):
//!
//! - **The canonical summation tree** (deterministic mode, issue 17): element by element,
//!   `tree(x_0, x_1, …, x_{n-1})` with the members in group-rank order and the tree of
//!   [`tensor::kernels::tree::tree_reduce`] (left subtree = the largest power of two below `n`),
//!   16-bit floats accumulating in f32. One process that holds the `n` parts computes the same
//!   bits with `tree_reduce`.
//! - **Member order in the element type** (a half-precision all-reduce, MindSpore's gradient sums
//!   with `gradient_fp32_sync` off): `(…((x_0 ⊕ x_1) ⊕ x_2) …) ⊕ x_{n-1}`, every partial result
//!   rounded to the element type (bf16 and f16 round after every addition; the other types
//!   compute in their own type anyway).
//!
//! The generic algorithm (what every backend gets from the provided methods of
//! [`Communicator`]) is a reduce-scatter plus an all-gather: the buffer is cut into `n` chunks by
//! [`split_counts`]; an all-to-all-v gives the owner of chunk `r` every member's chunk `r`; the
//! owner combines them in the chosen order; an all-gather-v hands the reduced chunks to every
//! member. Each rank sends and receives `(n-1)/n` of the buffer in each half, the bytes of a ring
//! all-reduce. The local backend overrides the deterministic all-reduce with the same
//! owner-computes scheme done on lent buffers (no staging copies), see `local::algo`.

use std::ops::Range;

use tensor::kernels::tree::split_point;

use crate::buf::{Buf, BufMut};
use crate::communicator::{split_counts, Communicator};
use crate::error::CommError;
use crate::op::{combine_bytes, divide_in_place, with_reducible, ReduceOp, Reducible};

/// The order in which the owner of a chunk combines the members' parts (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combine {
    /// The canonical summation tree, 16-bit floats accumulating in f32.
    CanonicalTree,
    /// Left to right in member order, every partial result rounded to the element type.
    MemberOrderInElementType,
}

/// Elements per block of the tree combination: small enough that the block's result and its
/// few subtree temporaries ([`scratch_slots`]) stay in L1 while the parts stream through once
/// (8 KiB each for f32), large enough that the per-block recursion costs nothing measurable.
const BLOCK_ELEMS: usize = 2048;

/// The number of block temporaries [`tree_block`] needs at once for a tree over `n` parts:
/// one per nested right subtree of three parts or more (pairs and single leaves are combined
/// straight from the parts): 0 up to 6 parts, 1 up to 14, 2 up to 30.
fn scratch_slots(n: usize) -> usize {
    if n <= 2 {
        return 0;
    }
    let left = split_point(n);
    let right = if n - left <= 2 {
        0
    } else {
        1 + scratch_slots(n - left)
    };
    scratch_slots(left).max(right)
}

/// `out[i] = tree over parts first..first+count of parts[p][range.start + i]`, in the
/// accumulator type. `scratch` holds at least `scratch_slots(count) * out.len()` elements.
fn tree_block<T: Reducible, F: Fn(T::Acc, T::Acc) -> T::Acc + Copy>(
    parts: &dyn Fn(usize) -> *const T,
    range: Range<usize>,
    (first, count): (usize, usize),
    out: &mut [T::Acc],
    scratch: &mut [T::Acc],
    combine: F,
) {
    // SAFETY (every `from_raw_parts` below): `parts(p)` points to a part valid for the whole
    // element range the caller reduces, and no one writes it meanwhile (see `tree_combine`).
    if count == 1 {
        let src = unsafe { std::slice::from_raw_parts(parts(first).add(range.start), out.len()) };
        for (o, &x) in out.iter_mut().zip(src) {
            *o = x.load();
        }
        return;
    }
    if count == 2 {
        // Two leaves in one pass (the same single addition, without a load pass first).
        let (l, r) = unsafe {
            (
                std::slice::from_raw_parts(parts(first).add(range.start), out.len()),
                std::slice::from_raw_parts(parts(first + 1).add(range.start), out.len()),
            )
        };
        for ((o, &x), &y) in out.iter_mut().zip(l).zip(r) {
            *o = combine(x.load(), y.load());
        }
        return;
    }
    let left = split_point(count);
    tree_block::<T, F>(parts, range.clone(), (first, left), out, scratch, combine);
    let len = out.len();
    let part = |p: usize| unsafe { std::slice::from_raw_parts(parts(p).add(range.start), len) };
    match count - left {
        // A right subtree of one leaf or a pair: folded in straight from its parts (the same
        // additions, without a pass through a temporary).
        1 => {
            for (o, &x) in out.iter_mut().zip(part(first + left)) {
                *o = combine(*o, x.load());
            }
            return;
        }
        2 => {
            let (x, y) = (part(first + left), part(first + left + 1));
            for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
                *o = combine(*o, combine(x.load(), y.load()));
            }
            return;
        }
        _ => {}
    }
    let (right, rest) = scratch.split_at_mut(len);
    tree_block::<T, F>(
        parts,
        range,
        (first + left, count - left),
        right,
        rest,
        combine,
    );
    for (o, &r) in out.iter_mut().zip(right.iter()) {
        *o = combine(*o, r);
    }
}

/// Computes `tree(parts(0)[i], …, parts(n-1)[i])` (then `/ n` for `Mean`) for every
/// `i < len`, in blocks of [`BLOCK_ELEMS`], and hands each block to `store(start, block)` in
/// the accumulator type. Every block's parts are read before it is stored, so `store` may
/// write the elements just read (the local backend writes the sum back into the sources).
///
/// # Safety
/// Every `parts(p)` for `p < n` points to `len` elements of `T`, aligned and valid; none of
/// them is written during the call except by `store`, and only at the block it is given.
pub(crate) unsafe fn tree_combine_with<T: Reducible>(
    n: usize,
    parts: &dyn Fn(usize) -> *const T,
    len: usize,
    op: ReduceOp,
    store: &mut dyn FnMut(usize, &[T::Acc]),
) {
    if n == 0 || len == 0 {
        return;
    }
    let block = BLOCK_ELEMS.min(len);
    let depth = scratch_slots(n);
    let mut acc = vec![T::Acc::default(); block * (1 + depth)];
    let (head, scratch) = acc.split_at_mut(block);
    let mut start = 0;
    while start < len {
        let m = block.min(len - start);
        let (acc, scratch) = (&mut head[..m], &mut scratch[..depth * m]);
        let range = start..start + m;
        match op {
            ReduceOp::Sum | ReduceOp::Mean => {
                tree_block::<T, _>(parts, range, (0, n), acc, scratch, T::sum)
            }
            ReduceOp::Max => tree_block::<T, _>(parts, range, (0, n), acc, scratch, T::max),
            ReduceOp::Min => tree_block::<T, _>(parts, range, (0, n), acc, scratch, T::min),
        }
        if op == ReduceOp::Mean {
            for a in acc.iter_mut() {
                *a = T::div(*a, n);
            }
        }
        store(start, acc);
        start += m;
    }
}

/// [`tree_combine_with`] into `out` (`out.len()` elements per part).
///
/// # Safety
/// As [`tree_combine_with`]; `out` does not overlap the parts.
pub(crate) unsafe fn tree_combine<T: Reducible>(
    n: usize,
    parts: &dyn Fn(usize) -> *const T,
    out: &mut [T],
    op: ReduceOp,
) {
    let len = out.len();
    tree_combine_with::<T>(n, parts, len, op, &mut |start, acc| {
        for (d, &a) in out[start..start + acc.len()].iter_mut().zip(acc) {
            *d = T::store(a);
        }
    });
}

/// Checks the arguments of a deterministic reduce-scatter before any communication.
fn check_reduce_scatter<C: Communicator + ?Sized>(
    comm: &C,
    what: &'static str,
    send: &Buf<'_>,
    recv: &BufMut<'_>,
    counts: &[usize],
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, me) = (comm.size(), comm.rank());
    let dtype = send.dtype();
    if recv.dtype() != dtype {
        return Err(CommError::InvalidArgument {
            site: comm.site(what),
            reason: format!("send is {dtype} but recv is {}", recv.dtype()),
        });
    }
    if !op.supports(dtype) {
        return Err(CommError::UnsupportedReduction {
            site: comm.site(what),
            reduce: op,
            dtype,
        });
    }
    if counts.len() != n || counts.iter().sum::<usize>() != send.len() || recv.len() != counts[me] {
        return Err(CommError::InvalidArgument {
            site: comm.site(what),
            reason: format!(
                "counts {counts:?} must have {n} entries summing to the send length {} and \
                 entry {me} equal to the recv length {}",
                send.len(),
                recv.len()
            ),
        });
    }
    Ok(())
}

/// The generic fixed-order reduce-scatter: an all-to-all-v gives this rank every member's
/// part `rank()` (its own included, in member order), which it combines in `combine`'s order.
pub(crate) fn reduce_scatter_v<C: Communicator + ?Sized>(
    comm: &C,
    (what, combine): (&'static str, Combine),
    send: Buf<'_>,
    mut recv: BufMut<'_>,
    counts: &[usize],
    op: ReduceOp,
) -> Result<(), CommError> {
    check_reduce_scatter(comm, what, &send, &recv, counts, op)?;
    let (n, me) = (comm.size(), comm.rank());
    let dtype = send.dtype();
    let size = dtype.size_in_bytes();
    let mine = counts[me];
    let send_counts: Vec<usize> = counts.iter().map(|c| c * size).collect();
    let recv_counts = vec![mine * size; n];
    with_reducible!(dtype, T => {
        let mut received = vec![<T as bytemuck::Zeroable>::zeroed(); n * mine];
        comm.all_to_all_v_bytes(
            send.bytes(),
            &send_counts,
            bytemuck::cast_slice_mut(&mut received),
            &recv_counts,
        )?;
        match combine {
            Combine::CanonicalTree => {
                let out = bytemuck::cast_slice_mut::<u8, T>(recv.bytes_mut());
                let base = received.as_ptr();
                // SAFETY: part `p` is `received[p * mine..][..mine]`, read only; `out` is
                // `recv`.
                unsafe { tree_combine::<T>(n, &|p| base.add(p * mine), out, op) };
            }
            Combine::MemberOrderInElementType => {
                fold_in_element_type(bytemuck::cast_slice(&received), recv.reborrow(), op, n)
            }
        }
    });
    Ok(())
}

/// `recv = (…(part_0 ⊕ part_1) ⊕ …) ⊕ part_{n-1}` (then `/ n` for `Mean`), every partial
/// result rounded to `recv`'s element type: `parts` holds the `n` parts one after another, each
/// `recv.len()` elements of that type.
fn fold_in_element_type(parts: &[u8], mut recv: BufMut<'_>, op: ReduceOp, n: usize) {
    let dtype = recv.dtype();
    let len = recv.bytes().len();
    let out = recv.bytes_mut();
    if len == 0 || n == 0 {
        return;
    }
    out.copy_from_slice(&parts[..len]);
    for part in parts[len..].chunks_exact(len).take(n - 1) {
        combine_bytes(dtype, op, out, part, false);
    }
    if op == ReduceOp::Mean {
        divide_in_place(&mut recv, n);
    }
}

/// The generic fixed-order all-reduce: [`reduce_scatter_v`] over [`split_counts`] chunks, then
/// an all-gather-v of the reduced chunks back into `buf`.
pub(crate) fn all_reduce<C: Communicator + ?Sized>(
    comm: &C,
    (what, combine): (&'static str, Combine),
    mut buf: BufMut<'_>,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, me) = (comm.size(), comm.rank());
    let dtype = buf.dtype();
    if !op.supports(dtype) {
        return Err(CommError::UnsupportedReduction {
            site: comm.site(what),
            reduce: op,
            dtype,
        });
    }
    let counts = split_counts(buf.len(), n);
    let byte_counts: Vec<usize> = counts.iter().map(|c| c * dtype.size_in_bytes()).collect();
    with_reducible!(dtype, T => {
        let mut chunk = vec![<T as bytemuck::Zeroable>::zeroed(); counts[me]];
        reduce_scatter_v(
            comm,
            (what, combine),
            buf.as_buf(),
            BufMut::new(&mut chunk),
            &counts,
            op,
        )?;
        comm.all_gather_v_bytes(bytemuck::cast_slice(&chunk), buf.bytes_mut(), &byte_counts)?;
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensor::kernels::tree::tree_reduce;

    #[test]
    fn tree_combine_matches_tree_reduce_for_every_part_count() {
        for n in 1..=9 {
            let len = 2 * BLOCK_ELEMS + 3;
            let parts: Vec<Vec<f32>> = (0..n)
                .map(|p| {
                    (0..len)
                        .map(|i| ((p * 31 + i * 17) % 97) as f32 * 10f32.powi((i % 13) as i32 - 6))
                        .collect()
                })
                .collect();
            let mut out = vec![0f32; len];
            unsafe { tree_combine::<f32>(n, &|p| parts[p].as_ptr(), &mut out, ReduceOp::Sum) };
            for (i, o) in out.iter().enumerate() {
                let want = tree_reduce(n, &mut |p| parts[p][i], &mut |a, b| a + b);
                assert_eq!(o.to_bits(), want.to_bits(), "n = {n}, element {i}");
            }
        }
    }

    #[test]
    fn scratch_slots_count_the_nested_right_subtrees_of_three_or_more() {
        let slots: Vec<usize> = (1..=17).map(scratch_slots).collect();
        assert_eq!(slots, [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2]);
    }
}
