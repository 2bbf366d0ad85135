//! The [`Communicator`] trait, its tensor-level provided methods and the generic slice helpers.

use std::fmt;
use std::time::Duration;

use tensor::{DType, Element, Tensor};

use crate::buf::{Buf, BufMut};
use crate::deterministic::Combine;
use crate::error::{CommError, Site};
use crate::op::ReduceOp;

/// A point-to-point message tag (`0..=MAX_TAG`).
pub type Tag = u32;

/// The largest tag every backend accepts (MPI guarantees at least 32767).
pub const MAX_TAG: Tag = 32_767;

/// The tag of the `instance`-th creation of a group of `members` (world ranks) on one parent
/// communicator: a hash in `0..=MAX_TAG` that tells concurrent creations by different member
/// lists apart. Wrapping arithmetic: a group of 13 or more members overflowed a plain
/// `h * 31 + m + 1` (a debug build panicked on 16 ranks; a release build wrapped, which this
/// keeps, so both builds give the same tag).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn group_creation_tag(instance: usize, members: &[usize]) -> Tag {
    let hash = members.iter().fold(instance, |h, &m| {
        h.wrapping_mul(31).wrapping_add(m).wrapping_add(1)
    });
    (hash % (MAX_TAG as usize + 1)) as Tag
}

/// `send` as `rows` rows of `n` equal segments, laid part by part at the start of `out`: part
/// `j` (segment `j` of every row, rows in order) after part `j - 1`, as `reduce_scatter_v` takes
/// the parts of [`Communicator::reduce_scatter_rows`]; one pass over the bytes. `out` must hold
/// `send`.
pub fn parts_one_after_another(send: &[u8], (rows, n): (usize, usize), out: &mut [u8]) {
    let row = send.len() / rows.max(1);
    let segment = row / n.max(1);
    let mut dst = out[..send.len()].chunks_exact_mut(segment.max(1));
    for j in 0..n {
        for r in 0..rows {
            if let Some(run) = dst.next() {
                let at = r * row + j * segment;
                run.copy_from_slice(&send[at..at + segment]);
            }
        }
    }
}

/// The segment length (elements) of [`Communicator::reduce_scatter_rows`] over `n` ranks, or an
/// error naming `site` when `send` (elements) is not `rows` rows of `n` segments of which `recv`
/// holds one per row.
pub(crate) fn check_rows(
    site: Site,
    send: usize,
    recv: usize,
    (rows, n): (usize, usize),
) -> Result<usize, CommError> {
    let segment = recv.checked_div(rows).unwrap_or(0);
    let fits = rows > 0 && recv.is_multiple_of(rows) && recv.checked_mul(n) == Some(send);
    if !fits {
        return Err(CommError::InvalidArgument {
            site,
            reason: format!(
                "send ({send} elements) must be {rows} rows of {n} equal segments and recv \
                 ({recv} elements) one segment of every row"
            ),
        });
    }
    Ok(segment)
}

/// Splits `total` items into `parts` counts as evenly as possible: the first `total % parts`
/// parts get one more. This is how [`Communicator::reduce_scatter`] splits dim 0.
///
/// ```
/// assert_eq!(comm::split_counts(10, 4), vec![3, 3, 2, 2]);
/// assert_eq!(comm::split_counts(2, 3), vec![1, 1, 0]);
/// ```
pub fn split_counts(total: usize, parts: usize) -> Vec<usize> {
    if parts == 0 {
        return Vec::new();
    }
    let (q, m) = (total / parts, total % parts);
    (0..parts).map(|p| q + usize::from(p < m)).collect()
}

/// A group of ranks that run collectives together; one value per rank.
///
/// Every collective must be called by every rank of the group, in the same order, with
/// matching arguments. Calls block until the collective is complete on this rank, or fail with
/// a [`CommError`] when a peer fails or the [timeout](Communicator::timeout) passes — never a
/// hang. The trait is object safe: the runtime holds `Box<dyn Communicator>` or
/// `Arc<dyn Communicator>`; generic slice helpers live in [`CommunicatorExt`].
///
/// Buffers are bytes ([`&[u8]`](slice)) for the moves, which work on any dtype, and typed views
/// ([`Buf`], [`BufMut`]) for the reductions. Counts in `_v` methods are bytes for byte buffers
/// and elements for typed buffers. On error the contents of output buffers are unspecified.
pub trait Communicator: Send + Sync + fmt::Debug {
    /// `"local"` or `"mpi"`.
    fn backend(&self) -> &'static str;

    /// This rank's number in the group, `0..size()`.
    fn rank(&self) -> usize;

    /// The number of ranks in the group.
    fn size(&self) -> usize;

    /// The group's label for messages: `world`, or `world[0,2,3]` (members as world ranks).
    fn label(&self) -> &str;

    /// How long any single wait may last before the call fails with [`CommError::Timeout`].
    fn timeout(&self) -> Duration;

    /// A communicator over `ranks` (ranks of this group; the new group numbers them `0..` in
    /// the order given). Called by exactly the listed ranks, the same number of times with the
    /// same list; the groups are independent: messages and collectives never mix across groups,
    /// even when they run concurrently.
    fn group(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError>;

    /// Blocks until every rank of the group has called it.
    fn barrier(&self) -> Result<(), CommError>;

    /// Copies `root`'s `buf` into every other rank's `buf` (all the same length).
    fn broadcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<(), CommError>;

    /// Reduces `buf` element-wise over all ranks, in place; every rank gets the same bits.
    fn all_reduce_buf(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<(), CommError>;

    /// Reduces `send` element-wise over all ranks and leaves part `rank()` in `recv`: `send` is
    /// split into consecutive parts of `counts[0], counts[1], …` elements (`counts` has
    /// `size()` entries summing to `send.len()`; `recv.len() == counts[rank()]`).
    fn reduce_scatter_v(
        &self,
        send: Buf<'_>,
        recv: BufMut<'_>,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<(), CommError>;

    /// [`reduce_scatter_v`](Communicator::reduce_scatter_v) of parts that interleave: `send` is
    /// `rows` rows, each `size()` equal segments, and rank `j`'s part is segment `j` of every
    /// row, in row order (a tensor split along a dim that is not its first: sequence
    /// parallel's `[B, S, H]` split along `S` is `B` rows). `recv` (`send.len() / size()`
    /// elements) gets this rank's part of the sum; the same sums, member by member, as
    /// `reduce_scatter_v` over the parts laid one after another. The local backend reads the
    /// segments where they lie; the default lays the parts one after another first.
    fn reduce_scatter_rows(
        &self,
        send: Buf<'_>,
        recv: BufMut<'_>,
        rows: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let n = self.size();
        check_rows(
            self.site("reduce_scatter_rows"),
            send.len(),
            recv.len(),
            (rows, n),
        )?;
        let counts = vec![recv.len(); n];
        if rows == 1 {
            return self.reduce_scatter_v(send, recv, &counts, op);
        }
        let mut packed = Tensor::zeros(send.dtype(), &[send.len()]);
        parts_one_after_another(send.bytes(), (rows, n), packed.as_bytes_mut());
        self.reduce_scatter_v(Buf::from_tensor(&packed), recv, &counts, op)
    }

    /// Concatenates every rank's `send` (all the same length) in rank order into `recv`
    /// (`size()` times as long).
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError>;

    /// Hands every rank's `send` (all the same length), this rank's included, to `visit(rank,
    /// bytes)`, each rank's exactly once, in no particular order: an all-gather whose receiver
    /// places the pieces itself (a sequence block into its rows), without a gathered copy in
    /// between where the backend can lend the peers' bytes (the local backend does; the
    /// default gathers into a buffer first).
    fn all_gather_visit(
        &self,
        send: &[u8],
        visit: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), CommError> {
        let n = self.size();
        let total = send
            .len()
            .checked_mul(n)
            .ok_or_else(|| CommError::InvalidArgument {
                site: self.site("all_gather_visit"),
                reason: format!(
                    "{n} ranks × {} bytes overflow the address space",
                    send.len()
                ),
            })?;
        let mut recv = vec![0u8; total];
        self.all_gather_bytes(send, &mut recv)?;
        for rank in 0..n {
            visit(rank, &recv[rank * send.len()..(rank + 1) * send.len()]);
        }
        Ok(())
    }

    /// Concatenates every rank's `send` in rank order into `recv`; rank `j` sends `counts[j]`
    /// bytes.
    fn all_gather_v_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
    ) -> Result<(), CommError>;

    /// Equal-sized exchange: `send` is `size()` chunks, chunk `j` goes to rank `j`; `recv` gets
    /// rank `j`'s chunk for this rank at chunk `j`. Lengths must be divisible by `size()`.
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError>;

    /// Variable-sized exchange: `send` holds consecutive pieces of `send_counts[j]` bytes for
    /// rank `j`; `recv` gets consecutive pieces of `recv_counts[j]` bytes from rank `j`.
    /// `recv_counts[j]` must equal rank `j`'s `send_counts[rank()]`.
    fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
    ) -> Result<(), CommError>;

    /// Sends `data` to rank `dst` with `tag`. Returns once the message is handed off (the local
    /// backend copies it into `dst`'s mailbox; MPI buffers small messages and, for large ones,
    /// waits for the matching receive). Messages between two ranks with one tag arrive in order.
    fn send_bytes(&self, dst: usize, tag: Tag, data: &[u8]) -> Result<(), CommError>;

    /// Receives the next message from rank `src` with `tag`.
    fn recv_bytes(&self, src: usize, tag: Tag) -> Result<Vec<u8>, CommError>;

    /// The [`Site`] of a call named `op` on this communicator, for errors.
    fn site(&self, op: &'static str) -> Site {
        Site {
            backend: self.backend(),
            group: self.label().to_string(),
            rank: self.rank(),
            size: self.size(),
            op,
        }
    }

    /// MPI-style split: ranks passing the same `Some(color)` form a group (ordered by rank);
    /// ranks passing `None` get `Ok(None)`. Collective over this group.
    fn split(&self, color: Option<u32>) -> Result<Option<Box<dyn Communicator>>, CommError> {
        let mine = color.map_or(u64::MAX, u64::from);
        let mut colors = vec![0u64; self.size()];
        self.all_gather_bytes(
            bytemuck::bytes_of(&mine),
            bytemuck::cast_slice_mut(&mut colors),
        )?;
        let Some(color) = color else {
            return Ok(None);
        };
        let members: Vec<usize> = (0..self.size())
            .filter(|&r| colors[r] == u64::from(color))
            .collect();
        self.group(&members).map(Some)
    }

    /// [`all_reduce_buf`](Communicator::all_reduce_buf) on a tensor, in place.
    fn all_reduce(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<(), CommError> {
        self.all_reduce_buf(BufMut::from_tensor(tensor), op)
    }

    /// Starts [`all_reduce`](Communicator::all_reduce) of `tensor`, to finish with
    /// [`PendingCollective::wait`] after the caller has computed meanwhile (every member starts
    /// its reductions in the same order). A backend that can run it in the background does
    /// (MPI's nonblocking all-reduce, advanced at each [`PendingCollective::test`]); the
    /// default runs it now.
    fn start_all_reduce(
        &self,
        mut tensor: Tensor,
        op: ReduceOp,
    ) -> Result<crate::PendingCollective, CommError> {
        self.all_reduce(&mut tensor, op)?;
        Ok(crate::PendingCollective::done(tensor))
    }

    /// Starts [`reduce_scatter_v`](Communicator::reduce_scatter_v) of `send`, to finish with
    /// [`PendingCollective::wait`], which returns this rank's part (`counts[rank()]`
    /// elements). Every member starts its collectives in the same order. A backend that can
    /// run it in the background does (MPI's nonblocking reduce-scatter); the default runs it
    /// now.
    fn start_reduce_scatter_v(
        &self,
        send: Tensor,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<crate::PendingCollective, CommError> {
        let mine = counts.get(self.rank()).copied().unwrap_or(0);
        let mut recv = Tensor::zeros(send.dtype(), &[mine]);
        self.reduce_scatter_v(
            Buf::from_tensor(&send),
            BufMut::from_tensor(&mut recv),
            counts,
            op,
        )?;
        Ok(crate::PendingCollective::done(recv))
    }

    /// Starts [`all_gather_bytes`](Communicator::all_gather_bytes) of `send`, to finish with
    /// [`PendingCollective::wait`], which returns the gathered bytes as a `u8` tensor
    /// (`size()` times as long, in rank order). Every member starts its collectives in the
    /// same order. A backend that can run it in the background does (MPI's nonblocking
    /// all-gather); the default runs it now.
    fn start_all_gather_bytes(&self, send: Vec<u8>) -> Result<crate::PendingCollective, CommError> {
        let mut recv = vec![0u8; send.len() * self.size()];
        self.all_gather_bytes(&send, &mut recv)?;
        let len = recv.len();
        let gathered = Tensor::from_vec(&[len], recv).expect("the length is the shape");
        Ok(crate::PendingCollective::done(gathered))
    }

    /// Reduces `buf` element-wise over all ranks, in place, in the canonical summation tree
    /// (deterministic mode, issue 17): every element becomes `tree(x_0, …, x_{n-1})` over the
    /// members in group-rank order, with the tree of [`tensor::kernels::tree::tree_reduce`]
    /// (left subtree = the largest power of two below `n`; `Mean` divides the tree's sum by
    /// `n`). The bits depend on the inputs and the member order alone: not on arrival order,
    /// backend or buffer length, and they equal `tree_reduce` over the `n` parts on one
    /// process. 16-bit floats accumulate in f32 and round once, as in
    /// [`all_reduce_buf`](Communicator::all_reduce_buf); every dtype and op that it accepts is
    /// accepted (`sum`/`mean` on bool fail with [`CommError::UnsupportedReduction`]).
    ///
    /// The provided algorithm is a reduce-scatter plus an all-gather: the owner of each
    /// [`split_counts`] chunk receives the members' chunks
    /// ([`all_to_all_v_bytes`](Communicator::all_to_all_v_bytes)), combines them in the tree,
    /// and the reduced chunks are all-gathered
    /// ([`all_gather_v_bytes`](Communicator::all_gather_v_bytes)): `2(n−1)/n` of the buffer
    /// per rank, like a ring all-reduce. A backend may override it with a faster schedule of
    /// the same arithmetic.
    fn all_reduce_deterministic_buf(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        crate::deterministic::all_reduce(
            self,
            ("all_reduce_deterministic", Combine::CanonicalTree),
            buf,
            op,
        )
    }

    /// Reduces `buf` element-wise over all ranks, in place, accumulating in the buffer's own
    /// element type: every element becomes `(…((x_0 ⊕ x_1) ⊕ x_2) …) ⊕ x_{n-1}` over the members
    /// in group-rank order, every partial result rounded to the dtype (`Mean` then divides the
    /// rounded sum by `n` and rounds again). For bf16 and f16 this is a half-precision
    /// all-reduce — each addition rounds to the half type, as a ring all-reduce in that type
    /// does, where [`all_reduce_buf`](Communicator::all_reduce_buf) accumulates in f32 and
    /// rounds once; for f32 and f64 it is a left-to-right sum in member order. The bits depend
    /// on the inputs and the member order alone, on every backend. `sum`/`mean` on bool fail
    /// with [`CommError::UnsupportedReduction`].
    ///
    /// The provided algorithm is the deterministic all-reduce's
    /// ([`all_reduce_deterministic_buf`](Communicator::all_reduce_deterministic_buf)) with this
    /// fold in place of the tree: the owner of each [`split_counts`] chunk receives the
    /// members' chunks, folds them in member order, and the reduced chunks are all-gathered.
    fn all_reduce_in_element_type_buf(
        &self,
        buf: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        crate::deterministic::all_reduce(
            self,
            (
                "all_reduce_in_element_type",
                Combine::MemberOrderInElementType,
            ),
            buf,
            op,
        )
    }

    /// [`reduce_scatter_v`](Communicator::reduce_scatter_v) accumulating in the element type:
    /// `recv` gets part `rank()` of the result that
    /// [`all_reduce_in_element_type_buf`](Communicator::all_reduce_in_element_type_buf) gives,
    /// with the same arguments and checks as `reduce_scatter_v`.
    fn reduce_scatter_in_element_type_v(
        &self,
        send: Buf<'_>,
        recv: BufMut<'_>,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        crate::deterministic::reduce_scatter_v(
            self,
            (
                "reduce_scatter_in_element_type",
                Combine::MemberOrderInElementType,
            ),
            send,
            recv,
            counts,
            op,
        )
    }

    /// [`all_reduce_in_element_type_buf`](Communicator::all_reduce_in_element_type_buf) on a
    /// tensor, in place: every partial sum rounded to the tensor's dtype, in member order.
    fn all_reduce_in_element_type(
        &self,
        tensor: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.all_reduce_in_element_type_buf(BufMut::from_tensor(tensor), op)
    }

    /// [`reduce_scatter_v`](Communicator::reduce_scatter_v) in the canonical summation tree:
    /// `recv` gets part `rank()` of the result that
    /// [`all_reduce_deterministic_buf`](Communicator::all_reduce_deterministic_buf) gives, with
    /// the same arguments and checks as `reduce_scatter_v`. The provided algorithm is the
    /// all-to-all-v half of the deterministic all-reduce.
    fn reduce_scatter_deterministic_v(
        &self,
        send: Buf<'_>,
        recv: BufMut<'_>,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        crate::deterministic::reduce_scatter_v(
            self,
            ("reduce_scatter_deterministic", Combine::CanonicalTree),
            send,
            recv,
            counts,
            op,
        )
    }

    /// [`all_reduce_deterministic_buf`](Communicator::all_reduce_deterministic_buf) on a
    /// tensor, in place: the canonical-tree all-reduce of deterministic mode.
    fn all_reduce_deterministic(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<(), CommError> {
        self.all_reduce_deterministic_buf(BufMut::from_tensor(tensor), op)
    }

    /// [`broadcast_bytes`](Communicator::broadcast_bytes) on a tensor (same shape and dtype on
    /// every rank).
    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), CommError> {
        self.broadcast_bytes(tensor.as_bytes_mut(), root)
    }

    /// Concatenates every rank's tensor (all of one shape and dtype) along dim 0, in rank order:
    /// `[d0, …]` becomes `[size·d0, …]`; a 0-dim tensor becomes `[size]`.
    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CommError> {
        let mut shape = tensor.shape().to_vec();
        match shape.first_mut() {
            Some(d0) => *d0 *= self.size(),
            None => shape.push(self.size()),
        }
        let mut out = Tensor::zeros(tensor.dtype(), &shape);
        self.all_gather_bytes(tensor.as_bytes(), out.as_bytes_mut())?;
        Ok(out)
    }

    /// Concatenates tensors whose dim 0 differs by rank (`rows[j]` rows on rank `j`; the other
    /// dims and the dtype agree) along dim 0. The inverse of [`reduce_scatter`]: gather with
    /// `rows = split_counts(total_rows, size)`.
    ///
    /// [`reduce_scatter`]: Communicator::reduce_scatter
    fn all_gather_v(&self, tensor: &Tensor, rows: &[usize]) -> Result<Tensor, CommError> {
        let site = || self.site("all_gather_v");
        let (&d0, rest) =
            tensor
                .shape()
                .split_first()
                .ok_or_else(|| CommError::InvalidArgument {
                    site: site(),
                    reason: "a 0-dim tensor has no dim 0 to gather along".to_string(),
                })?;
        if rows.len() != self.size() || rows[self.rank()] != d0 {
            return Err(CommError::InvalidArgument {
                site: site(),
                reason: format!(
                    "rows {rows:?} must have one entry per rank and entry {} must be this \
                     rank's dim 0 ({d0})",
                    self.rank()
                ),
            });
        }
        let row_bytes = rest.iter().product::<usize>() * tensor.dtype().size_in_bytes();
        let counts: Vec<usize> = rows.iter().map(|r| r * row_bytes).collect();
        let mut shape = tensor.shape().to_vec();
        shape[0] = rows.iter().sum();
        let mut out = Tensor::zeros(tensor.dtype(), &shape);
        self.all_gather_v_bytes(tensor.as_bytes(), out.as_bytes_mut(), &counts)?;
        Ok(out)
    }

    /// Reduces the tensors of all ranks and gives rank `r` rows `split_counts(d0, size)[r]` of
    /// the result along dim 0 (the first `d0 % size` ranks get one row more; ranks past `d0`
    /// get zero rows).
    fn reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, CommError> {
        let (counts, mut out) = scatter_rows(self, tensor, "reduce_scatter")?;
        self.reduce_scatter_v(
            Buf::from_tensor(tensor),
            BufMut::from_tensor(&mut out),
            &counts,
            op,
        )?;
        Ok(out)
    }

    /// [`reduce_scatter`](Communicator::reduce_scatter) in the canonical summation tree: rank
    /// `r` gets rows `split_counts(d0, size)[r]` of what
    /// [`all_reduce_deterministic`](Communicator::all_reduce_deterministic) computes.
    fn reduce_scatter_deterministic(
        &self,
        tensor: &Tensor,
        op: ReduceOp,
    ) -> Result<Tensor, CommError> {
        let (counts, mut out) = scatter_rows(self, tensor, "reduce_scatter_deterministic")?;
        self.reduce_scatter_deterministic_v(
            Buf::from_tensor(tensor),
            BufMut::from_tensor(&mut out),
            &counts,
            op,
        )?;
        Ok(out)
    }

    /// Splits dim 0 into `size` equal blocks, sends block `j` to rank `j`, and stacks the blocks
    /// received in rank order (same shape as the input).
    fn all_to_all(&self, tensor: &Tensor) -> Result<Tensor, CommError> {
        let d0 = tensor.shape().first().copied().unwrap_or(0);
        if tensor.ndim() == 0 || d0 % self.size() != 0 {
            return Err(CommError::InvalidArgument {
                site: self.site("all_to_all"),
                reason: format!(
                    "dim 0 of shape {:?} must be divisible by the group size {}",
                    tensor.shape(),
                    self.size()
                ),
            });
        }
        let mut out = Tensor::zeros(tensor.dtype(), tensor.shape());
        self.all_to_all_bytes(tensor.as_bytes(), out.as_bytes_mut())?;
        Ok(out)
    }

    /// Sends a tensor (dtype, shape and data) to `dst`; see [`send_bytes`](Communicator::send_bytes).
    fn send(&self, dst: usize, tag: Tag, tensor: &Tensor) -> Result<(), CommError> {
        let mut header = Vec::with_capacity(8 * (tensor.ndim() + 1));
        header.extend_from_slice(&(dtype_code(tensor.dtype()) as u64).to_le_bytes());
        for &d in tensor.shape() {
            header.extend_from_slice(&(d as u64).to_le_bytes());
        }
        self.send_bytes(dst, tag, &header)?;
        self.send_bytes(dst, tag, tensor.as_bytes())
    }

    /// Receives a tensor sent with [`send`](Communicator::send).
    fn recv(&self, src: usize, tag: Tag) -> Result<Tensor, CommError> {
        let header = self.recv_bytes(src, tag)?;
        let bad = |reason: String| CommError::Mismatch {
            site: self.site("recv"),
            peer: src,
            reason,
        };
        if header.is_empty() || header.len() % 8 != 0 {
            return Err(bad(format!(
                "a tensor header of {} bytes is malformed (a plain send_bytes?)",
                header.len()
            )));
        }
        let words: Vec<u64> = header
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
            .collect();
        let dtype = usize::try_from(words[0])
            .ok()
            .and_then(|i| DType::ALL.get(i).copied())
            .ok_or_else(|| bad(format!("unknown dtype code {}", words[0])))?;
        let shape: Vec<usize> = words[1..]
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| bad(format!("dim {d} overflows usize"))))
            .collect::<Result<_, _>>()?;
        let data = self.recv_bytes(src, tag)?;
        Tensor::from_bytes(dtype, &shape, &data).map_err(|source| CommError::Tensor {
            site: self.site("recv"),
            source: Box::new(source),
        })
    }
}

/// The index of `dtype` in [`DType::ALL`], its wire code.
/// A reduce-scatter of `tensor` along dim 0: each rank's element count (rows
/// `split_counts(d0, size)`, whole rows) and this rank's zeroed result.
fn scatter_rows<C: Communicator + ?Sized>(
    comm: &C,
    tensor: &Tensor,
    op: &'static str,
) -> Result<(Vec<usize>, Tensor), CommError> {
    let (&d0, rest) = tensor
        .shape()
        .split_first()
        .ok_or_else(|| CommError::InvalidArgument {
            site: comm.site(op),
            reason: "a 0-dim tensor has no dim 0 to scatter along".to_string(),
        })?;
    let row_len: usize = rest.iter().product();
    let rows = split_counts(d0, comm.size());
    let counts = rows.iter().map(|r| r * row_len).collect();
    let mut shape = tensor.shape().to_vec();
    shape[0] = rows[comm.rank()];
    Ok((counts, Tensor::zeros(tensor.dtype(), &shape)))
}

fn dtype_code(dtype: DType) -> usize {
    DType::ALL
        .iter()
        .position(|&d| d == dtype)
        .expect("DType::ALL lists every dtype")
}

/// Generic slice helpers over any [`Communicator`] (including `dyn Communicator`): thin typed
/// wrappers around the object-safe methods.
pub trait CommunicatorExt: Communicator {
    /// All-reduces a slice in place (the training runtime's gradient reduction).
    fn all_reduce_in_place<T: Element>(
        &self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.all_reduce_buf(BufMut::new(data), op)
    }

    /// Deterministic all-reduce of a slice in place
    /// ([`all_reduce_deterministic_buf`](Communicator::all_reduce_deterministic_buf)): the
    /// gradient reduction of deterministic mode.
    fn all_reduce_deterministic_in_place<T: Element>(
        &self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.all_reduce_deterministic_buf(BufMut::new(data), op)
    }

    /// Reduce-scatter of a slice split by [`split_counts`]; `recv` holds this rank's part.
    fn reduce_scatter_into<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let counts = split_counts(send.len(), self.size());
        self.reduce_scatter_v(Buf::new(send), BufMut::new(recv), &counts, op)
    }

    /// All-gather of equal slices into `recv` (`size()` times as long).
    fn all_gather_into<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        self.all_gather_bytes(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv))
    }
}

impl<C: Communicator + ?Sized> CommunicatorExt for C {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group of 1,024 members gets a tag in range (16 members overflowed the hash), the same
    /// one every time, and one member list's tag differs from its next creation's.
    #[test]
    fn group_tags_of_large_groups_are_in_range() {
        let members: Vec<usize> = (0..1024).collect();
        let tag = group_creation_tag(0, &members);
        assert!(tag <= MAX_TAG);
        assert_eq!(tag, group_creation_tag(0, &members));
        assert_ne!(tag, group_creation_tag(1, &members));
        let small = group_creation_tag(0, &[0, 1]);
        // The small groups' tags are what the plain arithmetic gave: ((0·31 + 1) · 31 + 2).
        assert_eq!(small, 33);
    }

    #[test]
    fn split_counts_front_loads_the_remainder() {
        assert_eq!(split_counts(7, 3), vec![3, 2, 2]);
        assert_eq!(split_counts(0, 2), vec![0, 0]);
        assert_eq!(split_counts(5, 1), vec![5]);
        assert!(split_counts(5, 0).is_empty());
        for (total, parts) in [(100, 7), (3, 8), (64, 8)] {
            let c = split_counts(total, parts);
            assert_eq!(c.iter().sum::<usize>(), total);
            assert!(c.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1));
        }
    }
}
