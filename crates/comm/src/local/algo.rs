//! The collectives of the local backend.
//!
//! Every collective has the same shape: each rank lends its input buffer (`publish`, step
//! `lend`), waits until all peers lent theirs, works directly on the peers' memory under leases,
//! announces it is done (step `done`), and waits until every peer is done with *its* buffer
//! before returning. No staging copies: all-gather and all-to-all copy each byte once, from the
//! sender's buffer into the receiver's.
//!
//! All-reduce is a reduce-scatter fused with an all-gather: rank `r` owns chunk `r` of the
//! element range, sums that chunk over all ranks' buffers (in rank order, so the result does
//! not depend on who computes it) and writes the sum into chunk `r` of *every* buffer. Each
//! rank reads `S` bytes and writes `S` bytes for an `S`-byte buffer, whatever the rank count,
//! and the work is spread evenly. Chunks are processed in cache-sized blocks, so the sum is
//! written out to the `n` buffers while it is still in cache. The deterministic all-reduce
//! (issue 17) is the same schedule with the canonical summation tree over the ranks in place of
//! the left-to-right fold ([`Order`]).

use std::ops::Range;

use tensor::DType;

use super::shared::{OpKind, Publication};
use super::Ctx;
use crate::buf::{Buf, BufMut};
use crate::error::CommError;
use crate::op::{reduce_sources, store_acc, with_reducible, ReduceOp, Reducible};

/// Elements are reduced in blocks of this many bytes per source: the accumulator and the block
/// of the source being folded in stay in L1, and the sum is written out to the `n` buffers from
/// there. Measured (`tessera bench collectives --backend local`, the ordinary all-reduce's time
/// over the deterministic one's, whose tree works in blocks of 2,048 elements) on an Ice Lake
/// Xeon with a 48 KiB L1: blocks of 32 KiB ran the ordinary all-reduce 1.26–1.54× slower than
/// the deterministic one from 64 KiB to 4 MiB on 2 ranks (1.19–1.49× on 4), blocks of 8 KiB
/// 0.99–1.11× (1.00–1.20×); see `docs/PERFORMANCE.md`.
const BLOCK_BYTES: usize = 8 << 10;

/// The element range rank `rank` of `n` reduces in an all-reduce of `n_elems` elements. Chunk
/// boundaries fall on cache lines so no two ranks write the same line.
fn owned_range(n_elems: usize, n: usize, rank: usize, dtype: DType) -> Range<usize> {
    let align = (64 / dtype.size_in_bytes()).max(1);
    let per = n_elems.div_ceil(n).div_ceil(align).max(1) * align;
    let start = (rank * per).min(n_elems);
    start..(start + per).min(n_elems)
}

fn prefix_sums(counts: &[usize]) -> Vec<usize> {
    let mut offsets = Vec::with_capacity(counts.len());
    let mut total = 0;
    for &c in counts {
        offsets.push(total);
        total += c;
    }
    offsets
}

/// For every `i < len`: writes `⊕ over s of srcs[s][src_off + i]` (sources in order) to
/// `dsts[d][dst_off + i]` for every `d`. Offsets and lengths are in elements of `T`.
///
/// # Safety
/// Every pointer is aligned for `T` and valid for the ranges touched; no other thread touches
/// those ranges meanwhile.
unsafe fn reduce_chunk<T: Reducible>(
    srcs: &[*const u8],
    dsts: &[*mut u8],
    (src_off, dst_off, len): (usize, usize, usize),
    op: ReduceOp,
    n_ranks: usize,
) {
    let block = (BLOCK_BYTES / std::mem::size_of::<T>()).max(1);
    let mut acc = vec![T::Acc::default(); block.min(len)];
    let mut sources: Vec<&[T]> = Vec::with_capacity(srcs.len());
    let mut done = 0;
    while done < len {
        let m = block.min(len - done);
        for &p in srcs {
            sources.push(std::slice::from_raw_parts(
                p.cast::<T>().add(src_off + done),
                m,
            ));
        }
        reduce_sources(&sources, &mut acc[..m], op, n_ranks);
        // The shared views end here, before the same memory may be written.
        sources.clear();
        for &d in dsts {
            let dst = std::slice::from_raw_parts_mut(d.cast::<T>().add(dst_off + done), m);
            store_acc(&acc[..m], dst);
        }
        done += m;
    }
}

pub(super) fn broadcast(ctx: &mut Ctx<'_>, buf: &mut [u8], root: usize) -> Result<(), CommError> {
    let (n, me) = (ctx.size(), ctx.rank());
    if root >= n {
        return Err(ctx.invalid(format!("root {root} is outside the group (size {n})")));
    }
    let lend = ctx.next_step();
    let done = ctx.next_step();
    let len = buf.len();
    let mine = Publication::new(OpKind::Broadcast, buf.as_mut_ptr(), len);
    if me == root {
        // SAFETY: `buf` outlives the guard, and peers only read it.
        let _lent = unsafe { ctx.publish(mine, lend) };
        let others: Vec<usize> = (0..n).filter(|&p| p != me).collect();
        return ctx.wait_for(&others, done);
    }
    ctx.wait_for(&[root], lend)?;
    let lease = ctx.lease_matching(root, lend, &mine)?;
    if lease.publication.len != len {
        return Err(ctx.mismatch(
            root,
            format!(
                "the root broadcasts {} bytes but this rank's buffer has {len}",
                lease.publication.len
            ),
        ));
    }
    // SAFETY: the lease keeps the root's `len` bytes valid and unwritten.
    unsafe { std::ptr::copy_nonoverlapping(lease.publication.ptr, buf.as_mut_ptr(), len) };
    drop(lease);
    ctx.arrive(done);
    Ok(())
}

/// The order in which an all-reduce's owner combines the ranks' chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    /// Left to right in rank order (`all_reduce`).
    RankOrder,
    /// The canonical summation tree over the ranks (`all_reduce_deterministic`, issue 17).
    CanonicalTree,
}

/// For every `i < len`: writes `tree over s of srcs[s][off + i]` (the canonical summation tree,
/// see `crate::deterministic`) to `dsts[d][off + i]` for every `d`.
///
/// # Safety
/// As [`reduce_chunk`].
unsafe fn reduce_chunk_tree<T: Reducible>(
    srcs: &[*const u8],
    dsts: &[*mut u8],
    (off, len): (usize, usize),
    op: ReduceOp,
) {
    let parts = |p: usize| srcs[p].cast::<T>().add(off);
    crate::deterministic::tree_combine_with::<T>(srcs.len(), &parts, len, op, &mut |start, acc| {
        for &d in dsts {
            let dst = std::slice::from_raw_parts_mut(d.cast::<T>().add(off + start), acc.len());
            store_acc::<T>(acc, dst);
        }
    });
}

/// The fused all-reduce: rank `r` reduces chunk `r` of every buffer in `order` and writes the
/// result into chunk `r` of every buffer.
pub(super) fn all_reduce(
    ctx: &mut Ctx<'_>,
    mut buf: BufMut<'_>,
    op: ReduceOp,
    order: Order,
) -> Result<(), CommError> {
    let dtype = buf.dtype();
    if !op.supports(dtype) {
        return Err(CommError::UnsupportedReduction {
            site: ctx.site(),
            reduce: op,
            dtype,
        });
    }
    let (n, me) = (ctx.size(), ctx.rank());
    let len = buf.bytes().len();
    // From here on the buffer is touched only through `ptr`: peers write their chunks of it.
    let ptr = buf.bytes_mut().as_mut_ptr();
    let lend = ctx.next_step();
    let done = ctx.next_step();
    let kind = match order {
        Order::RankOrder => OpKind::AllReduce,
        Order::CanonicalTree => OpKind::AllReduceDeterministic,
    };
    let mut mine = Publication::new(kind, ptr, len);
    mine.dtype = Some(dtype);
    mine.reduce = Some(op);
    // SAFETY: `buf` outlives the guard and is not used through a reference while it lives.
    let _lent = unsafe { ctx.publish(mine, lend) };
    ctx.wait_all(lend)?;
    let mut leases = Vec::with_capacity(n);
    let mut ptrs = Vec::with_capacity(n);
    for peer in 0..n {
        if peer == me {
            ptrs.push(ptr);
            continue;
        }
        let lease = ctx.lease_matching(peer, lend, &mine)?;
        if lease.publication.len != len {
            return Err(ctx.mismatch(
                peer,
                format!(
                    "it reduces {} bytes but this rank {len}",
                    lease.publication.len
                ),
            ));
        }
        ptrs.push(lease.publication.ptr);
        leases.push(lease);
    }
    #[cfg(test)]
    if tests::PANIC_INSIDE_ALL_REDUCE.with(|armed| armed.get()) {
        panic!("injected fault inside all_reduce");
    }
    let range = owned_range(len / dtype.size_in_bytes(), n, me, dtype);
    let srcs: Vec<*const u8> = ptrs.iter().map(|p| p.cast_const()).collect();
    // SAFETY: every buffer is leased (or ours) and aligned for the dtype (it came from a typed
    // `BufMut`); chunk `me` of every buffer is touched by this rank only.
    with_reducible!(dtype, T => unsafe {
        match order {
            Order::RankOrder => {
                reduce_chunk::<T>(&srcs, &ptrs, (range.start, range.start, range.len()), op, n)
            }
            Order::CanonicalTree => {
                reduce_chunk_tree::<T>(&srcs, &ptrs, (range.start, range.len()), op)
            }
        }
    });
    drop(leases);
    ctx.arrive(done);
    ctx.wait_all(done)
}

pub(super) fn reduce_scatter(
    ctx: &mut Ctx<'_>,
    send: Buf<'_>,
    recv: BufMut<'_>,
    counts: &[usize],
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, me) = (ctx.size(), ctx.rank());
    check_reduction(ctx, &send, &recv, op)?;
    if counts.len() != n || counts.iter().sum::<usize>() != send.len() || recv.len() != counts[me] {
        return Err(ctx.invalid(format!(
            "counts {counts:?} must have {n} entries summing to the send length {} and entry \
             {me} equal to the recv length {}",
            send.len(),
            recv.len()
        )));
    }
    let offset: usize = counts[..me].iter().sum();
    sum_parts(ctx, (send, recv), op, counts, &[(offset, 0, counts[me])])
}

/// [`reduce_scatter`] of parts that interleave ([`crate::Communicator::reduce_scatter_rows`]):
/// every row's segment of this rank summed over the ranks' buffers where they lie, the rows one
/// after another into `recv`; the same sums, source by source, as `reduce_scatter`.
pub(super) fn reduce_scatter_rows(
    ctx: &mut Ctx<'_>,
    send: Buf<'_>,
    recv: BufMut<'_>,
    rows: usize,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, me) = (ctx.size(), ctx.rank());
    check_reduction(ctx, &send, &recv, op)?;
    let segment = crate::communicator::check_rows(ctx.site(), send.len(), recv.len(), (rows, n))?;
    let row = segment * n;
    let runs: Vec<(usize, usize, usize)> = (0..rows)
        .map(|r| (r * row + me * segment, r * segment, segment))
        .collect();
    sum_parts(ctx, (send, recv), op, &[rows], &runs)
}

/// A reduction's buffers agree in dtype and `op` can reduce it; else the caller's error.
fn check_reduction(
    ctx: &Ctx<'_>,
    send: &Buf<'_>,
    recv: &BufMut<'_>,
    op: ReduceOp,
) -> Result<(), CommError> {
    let dtype = send.dtype();
    if recv.dtype() != dtype {
        return Err(ctx.invalid(format!("send is {dtype} but recv is {}", recv.dtype())));
    }
    if !op.supports(dtype) {
        return Err(CommError::UnsupportedReduction {
            site: ctx.site(),
            reduce: op,
            dtype,
        });
    }
    Ok(())
}

/// A reduce-scatter's exchange: `send` lent to the peers, whose calls must agree on its length
/// and on `agreed` (the counts, or the rows); then this rank's `runs` (`(source offset, recv
/// offset, length)` in elements) summed over every rank's buffer, sources in rank order, into
/// `recv`.
fn sum_parts(
    ctx: &mut Ctx<'_>,
    (send, mut recv): (Buf<'_>, BufMut<'_>),
    op: ReduceOp,
    agreed: &[usize],
    runs: &[(usize, usize, usize)],
) -> Result<(), CommError> {
    let (n, me) = (ctx.size(), ctx.rank());
    let dtype = send.dtype();
    let lend = ctx.next_step();
    let done = ctx.next_step();
    let send_ptr = send.bytes().as_ptr();
    let mut mine = Publication::new(
        OpKind::ReduceScatter,
        send_ptr.cast_mut(),
        send.bytes().len(),
    );
    mine.dtype = Some(dtype);
    mine.reduce = Some(op);
    mine.counts = agreed.as_ptr();
    mine.n_counts = agreed.len();
    // SAFETY: `send` and `agreed` outlive the guard; peers only read them.
    let _lent = unsafe { ctx.publish(mine, lend) };
    ctx.wait_all(lend)?;
    let mut leases = Vec::with_capacity(n);
    let mut srcs = Vec::with_capacity(n);
    for peer in 0..n {
        if peer == me {
            srcs.push(send_ptr);
            continue;
        }
        let lease = ctx.lease_matching(peer, lend, &mine)?;
        // SAFETY: under the lease.
        let theirs = unsafe { lease.publication.counts() };
        if lease.publication.len != mine.len || theirs != agreed {
            return Err(ctx.mismatch(
                peer,
                format!(
                    "it scatters {} bytes as {theirs:?} but this rank {} bytes as {agreed:?}",
                    lease.publication.len, mine.len
                ),
            ));
        }
        srcs.push(lease.publication.ptr.cast_const());
        leases.push(lease);
    }
    let dst = [recv.bytes_mut().as_mut_ptr()];
    // SAFETY: sources are leased (or ours) and typed; `recv` is ours alone; the callers checked
    // that every run lies inside the buffers.
    with_reducible!(dtype, T => unsafe {
        for &run in runs {
            reduce_chunk::<T>(&srcs, &dst, run, op, n);
        }
    });
    drop(leases);
    ctx.arrive(done);
    ctx.wait_all(done)
}

pub(super) fn all_gather(
    ctx: &mut Ctx<'_>,
    send: &[u8],
    recv: &mut [u8],
    counts: &[usize],
) -> Result<(), CommError> {
    let (n, me) = (ctx.size(), ctx.rank());
    if counts.len() != n || counts[me] != send.len() || counts.iter().sum::<usize>() != recv.len() {
        return Err(ctx.invalid(format!(
            "counts {counts:?} must have {n} entries, entry {me} equal to the send length {} \
             and sum to the recv length {}",
            send.len(),
            recv.len()
        )));
    }
    let lend = ctx.next_step();
    let done = ctx.next_step();
    let mine = Publication::new(OpKind::AllGather, send.as_ptr().cast_mut(), send.len());
    // SAFETY: `send` outlives the guard; peers only read it.
    let _lent = unsafe { ctx.publish(mine, lend) };
    ctx.wait_all(lend)?;
    let offsets = prefix_sums(counts);
    let stream = n.saturating_mul(recv.len()) > super::stream_copy::STREAM_ABOVE;
    // Start with the next rank so the ranks do not all read rank 0 first.
    for peer in (0..n).map(|k| (me + k) % n) {
        let dst = &mut recv[offsets[peer]..offsets[peer] + counts[peer]];
        if peer == me {
            super::stream_copy::copy(dst, send, stream);
            continue;
        }
        let lease = ctx.lease_matching(peer, lend, &mine)?;
        if lease.publication.len != counts[peer] {
            return Err(ctx.mismatch(
                peer,
                format!(
                    "it sends {} bytes but this rank expects {}",
                    lease.publication.len, counts[peer]
                ),
            ));
        }
        // SAFETY: the lease keeps the peer's bytes valid and unwritten.
        let src = unsafe { std::slice::from_raw_parts(lease.publication.ptr, counts[peer]) };
        super::stream_copy::copy(dst, src, stream);
    }
    ctx.arrive(done);
    ctx.wait_all(done)
}

/// Every rank's `send` (all the same length) handed to `visit` under its lease: nothing is
/// copied here, the visitor reads the peers' bytes where they lie.
pub(super) fn all_gather_visit(
    ctx: &mut Ctx<'_>,
    send: &[u8],
    visit: &mut dyn FnMut(usize, &[u8]),
) -> Result<(), CommError> {
    let (n, me) = (ctx.size(), ctx.rank());
    let lend = ctx.next_step();
    let done = ctx.next_step();
    let mine = Publication::new(OpKind::AllGather, send.as_ptr().cast_mut(), send.len());
    // SAFETY: `send` outlives the guard; peers only read it.
    let _lent = unsafe { ctx.publish(mine, lend) };
    ctx.wait_all(lend)?;
    // Start with the next rank so the ranks do not all read rank 0 first.
    for peer in (0..n).map(|k| (me + k) % n) {
        if peer == me {
            visit(me, send);
            continue;
        }
        let lease = ctx.lease_matching(peer, lend, &mine)?;
        if lease.publication.len != send.len() {
            return Err(ctx.mismatch(
                peer,
                format!(
                    "it sends {} bytes but this rank {}",
                    lease.publication.len,
                    send.len()
                ),
            ));
        }
        // SAFETY: the lease keeps the peer's bytes valid and unwritten while it lives.
        let theirs = unsafe { std::slice::from_raw_parts(lease.publication.ptr, send.len()) };
        visit(peer, theirs);
    }
    ctx.arrive(done);
    ctx.wait_all(done)
}

pub(super) fn all_to_all(
    ctx: &mut Ctx<'_>,
    send: &[u8],
    send_counts: &[usize],
    recv: &mut [u8],
    recv_counts: &[usize],
) -> Result<(), CommError> {
    let (n, me) = (ctx.size(), ctx.rank());
    if send_counts.len() != n
        || recv_counts.len() != n
        || send_counts.iter().sum::<usize>() != send.len()
        || recv_counts.iter().sum::<usize>() != recv.len()
        || send_counts[me] != recv_counts[me]
    {
        return Err(ctx.invalid(format!(
            "send counts {send_counts:?} and recv counts {recv_counts:?} must have {n} entries \
             each, sum to the buffer lengths ({} and {}) and agree on this rank's own piece",
            send.len(),
            recv.len()
        )));
    }
    let lend = ctx.next_step();
    let done = ctx.next_step();
    let mut mine = Publication::new(OpKind::AllToAll, send.as_ptr().cast_mut(), send.len());
    mine.counts = send_counts.as_ptr();
    mine.n_counts = n;
    // SAFETY: `send` and `send_counts` outlive the guard; peers only read them.
    let _lent = unsafe { ctx.publish(mine, lend) };
    ctx.wait_all(lend)?;
    let recv_offsets = prefix_sums(recv_counts);
    for peer in (0..n).map(|k| (me + k) % n) {
        let dst = &mut recv[recv_offsets[peer]..recv_offsets[peer] + recv_counts[peer]];
        if peer == me {
            let offset: usize = send_counts[..me].iter().sum();
            dst.copy_from_slice(&send[offset..offset + send_counts[me]]);
            continue;
        }
        let lease = ctx.lease_matching(peer, lend, &mine)?;
        // SAFETY: under the lease.
        let theirs = unsafe { lease.publication.counts() };
        if theirs.len() != n || theirs[me] != recv_counts[peer] {
            return Err(ctx.mismatch(
                peer,
                format!(
                    "it sends this rank {} bytes but this rank expects {}",
                    theirs.get(me).copied().unwrap_or(0),
                    recv_counts[peer]
                ),
            ));
        }
        let offset: usize = theirs[..me].iter().sum();
        // SAFETY: the lease keeps the peer's bytes valid; the counts sum to its length.
        let src = unsafe {
            std::slice::from_raw_parts(lease.publication.ptr.add(offset), recv_counts[peer])
        };
        dst.copy_from_slice(src);
    }
    ctx.arrive(done);
    ctx.wait_all(done)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::{CommError, Communicator, CommunicatorExt, LocalCluster, PeerFailure};

    thread_local! {
        /// Makes this thread's next all-reduce panic after it leased its peers' buffers.
        pub(crate) static PANIC_INSIDE_ALL_REDUCE: std::cell::Cell<bool> =
            const { std::cell::Cell::new(false) };
    }

    #[test]
    fn a_panic_inside_a_collective_fails_the_peers_and_leaves_no_lease_behind() {
        let results = LocalCluster::new(4).unwrap().run(|comm| {
            if comm.rank() == 1 {
                PANIC_INSIDE_ALL_REDUCE.with(|armed| armed.set(true));
            }
            // Large enough that the peers are still writing rank 1's buffer when it panics.
            let mut x = vec![1f32; 1 << 20];
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
        });
        for (rank, r) in results.into_iter().enumerate() {
            match (rank, r) {
                (1, Err(CommError::RankPanicked { message, .. })) => {
                    assert!(message.contains("injected"))
                }
                (_, Ok(Err(CommError::PeerFailed { peer: 1, cause, .. }))) => {
                    assert_eq!(cause, PeerFailure::Panicked)
                }
                (rank, other) => panic!("rank {rank}: {other:?}"),
            }
        }
    }

    #[test]
    fn owned_ranges_tile_the_buffer_on_cache_lines() {
        for (len, n) in [(0, 3), (1, 4), (1000, 3), (4096, 8), (17, 2)] {
            let ranges: Vec<_> = (0..n).map(|r| owned_range(len, n, r, DType::F32)).collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[n - 1].end, len);
            for w in ranges.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            assert!(ranges.iter().all(|r| r.start % 16 == 0 || r.start == len));
        }
    }
}
