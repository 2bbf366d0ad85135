//! Collectives built from point-to-point messages, for the polled mode
//! ([`super::OnTimeout::ReturnError`]): all-reduce, reduce-scatter and all-gather.
//!
//! A deadline can only watch a call it can poll, so the polled mode cannot use MPI's blocking
//! collectives; and MPI's nonblocking ones (OpenMPI's `libnbc`) ran 20–30 % below the
//! blocking ones even with the best algorithm chosen per call (docs/PERFORMANCE.md). These are
//! the blocking collectives' own algorithms — recursive doubling for small buffers, a ring
//! for large ones — written over `MPI_Isend`/`MPI_Irecv` on a communicator of their own. Every
//! wait polls against the call's deadline and for failure notices, reductions run in
//! Tessera's kernels. (Receiving ring steps in L2-sized segments, reducing each while the next
//! arrives, measured slower on shared memory than whole-chunk messages: 1.7 vs 2.5 GB/s at
//! 16 MiB on 2 ranks.)
//!
//! Every member computes the same schedule from the buffer length and the group size, and
//! messages between two ranks on one communicator and tag arrive in the order sent, so steps
//! (and successive calls) never cross. The result is bitwise the same on every rank: a ring
//! reduces each chunk once and then copies it, and both partners of a recursive-doubling
//! exchange combine the lower rank's data first.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::raw::{Comm, Raw, Request, WaitError};
use crate::schedule::{
    all_reduce_algorithm, balanced_chunks, chunks_of, pieces, AllReduceAlgorithm,
};

/// The longest single message: MPI counts are `int`s, so longer transfers go in pieces.
pub(super) const MAX_MESSAGE: usize = 1 << 30;
/// Buffers up to this size travel in [`EAGER_PIECE`]s: OpenMPI's shared-memory transport
/// sends messages below 4 KiB eagerly and larger ones by rendezvous (a round trip more), so
/// two 2 KiB messages beat one of 4 KiB (measured on 2 ranks: 4 KiB all-reduce 1.6 vs 1.35
/// GB/s; 1 KiB pieces were slower again, and at 16 KiB one message wins).
const SMALL_BUFFER: usize = 8 << 10;
/// See [`SMALL_BUFFER`].
const EAGER_PIECE: usize = 2 << 10;

const TAG_FOLD: i32 = 1;
const TAG_DOUBLING: i32 = 2;
const TAG_UNFOLD: i32 = 3;
const TAG_REDUCE_SCATTER: i32 = 4;
const TAG_ALL_GATHER: i32 = 5;

/// The reduction over bytes: `dst = dst ⊕ src`, or `src ⊕ dst` when the flag is set.
pub(super) type Combine<'a> = &'a dyn Fn(&mut [u8], &[u8], bool);

/// The messages of one step of a schedule: the started requests, and for each receive the
/// peer and the length the schedule expects. Kept across calls, so steps do not allocate.
#[derive(Default)]
pub(super) struct Step {
    requests: Vec<Request>,
    /// `(request index, peer, bytes expected)` of every receive.
    receives: Vec<(usize, usize, usize)>,
    /// Bytes each request received, once the step completed (`None`: more than expected).
    received: Vec<Option<usize>>,
}

/// One direction of a message, with the buffer it reads or fills.
#[derive(Clone, Copy)]
enum Transfer {
    Send(*const u8),
    Recv(*mut u8),
}

/// One rank's side of a point-to-point collective.
pub(super) struct Peers<'a> {
    /// The process's MPI state (held under the runtime lock).
    pub raw: &'a mut Raw,
    /// The communicator reserved for these collectives.
    pub comm: &'a Comm,
    /// This rank in `comm`.
    pub rank: usize,
    /// Members of `comm`.
    pub size: usize,
    /// The whole call's time budget, counted from `started`.
    pub timeout: Duration,
    /// When the call's first wait began to take long (set by the first wait that reads the
    /// clock; calls that finish quickly never read it).
    pub started: Option<Instant>,
    /// The current step's requests and what they expect (kept, so steps do not allocate).
    pub step: &'a mut Step,
    /// The longest message to send or receive as one ([`MAX_MESSAGE`] unless a schedule
    /// chooses smaller pieces); both sides of a transfer split it the same way.
    pub piece: usize,
    /// Maps a world rank to its rank in `comm`, for failure notices.
    pub member: &'a dyn Fn(usize) -> Option<usize>,
}

impl Peers<'_> {
    /// Starts `transfer` of `len` bytes with `peer`, in messages of at most
    /// [`Peers::piece`] bytes, adding the requests to the step's.
    ///
    /// # Safety
    /// The buffer stays valid for `len` bytes until the requests complete: readable for a
    /// send; writable, and touched by nothing else, for a receive.
    unsafe fn post(
        &mut self,
        peer: usize,
        transfer: Transfer,
        len: usize,
        tag: i32,
    ) -> Result<(), WaitError> {
        for range in pieces(len, self.piece) {
            let count = range.len() as i32;
            let request = match transfer {
                Transfer::Send(buf) => {
                    self.raw
                        .isend(self.comm, buf.add(range.start), count, peer, tag)
                }
                Transfer::Recv(buf) => {
                    let index = self.step.requests.len();
                    self.step.receives.push((index, peer, range.len()));
                    self.raw
                        .irecv(self.comm, buf.add(range.start), count, peer, tag)
                }
            }?;
            self.step.requests.push(request);
        }
        Ok(())
    }

    /// Polls the step's requests to completion within the call's budget, checks that every
    /// receive got the length the schedule expects (ranks that called the collective with
    /// different lengths disagree here, and every one of them learns it), and clears the step.
    fn wait_step(&mut self) -> Result<(), WaitError> {
        let step = &mut *self.step;
        let budget = (self.timeout, &mut self.started);
        let polled = self
            .raw
            .poll_all(&mut step.requests, &mut step.received, budget, self.member);
        let disagreement = |&(index, peer, expected): &(usize, usize, usize)| {
            let sent = match step.received.get(index).copied().flatten() {
                Some(got) if got == expected => return None,
                Some(got) => format!("{got} bytes"),
                None => "more bytes".to_string(),
            };
            Some(WaitError::Mismatch {
                peer,
                reason: format!(
                    "it sent {sent} where this rank expected {expected}: the ranks called the \
                     collective with different lengths"
                ),
            })
        };
        let outcome = polled.and_then(|()| match step.receives.iter().find_map(disagreement) {
            Some(mismatch) => Err(mismatch),
            None => Ok(()),
        });
        step.requests.clear();
        step.receives.clear();
        outcome
    }

    /// Sends `send` to `to` and receives `recv` from `from` at the same time; runs `meanwhile`
    /// once both are under way, then waits for both.
    ///
    /// # Safety
    /// Both ranges are valid (`recv` writable and not overlapping `send`) for the whole call,
    /// and `meanwhile` touches neither.
    unsafe fn exchange_and(
        &mut self,
        (to, send): (usize, (*const u8, usize)),
        (from, recv): (usize, (*mut u8, usize)),
        tag: i32,
        meanwhile: impl FnOnce(),
    ) -> Result<(), WaitError> {
        self.post(from, Transfer::Recv(recv.0), recv.1, tag)?;
        self.post(to, Transfer::Send(send.0), send.1, tag)?;
        meanwhile();
        self.wait_step()
    }

    /// [`Peers::exchange_and`] with nothing to do meanwhile.
    ///
    /// # Safety
    /// As [`Peers::exchange_and`].
    unsafe fn exchange(
        &mut self,
        to: (usize, (*const u8, usize)),
        from: (usize, (*mut u8, usize)),
        tag: i32,
    ) -> Result<(), WaitError> {
        self.exchange_and(to, from, tag, || {})
    }

    fn send(&mut self, to: usize, buf: &[u8], tag: i32) -> Result<(), WaitError> {
        // SAFETY: `buf` is borrowed until the wait returns (on failure the process's MPI state
        // is poisoned and the request never progressed again).
        unsafe { self.post(to, Transfer::Send(buf.as_ptr()), buf.len(), tag)? };
        self.wait_step()
    }

    fn recv(&mut self, from: usize, buf: &mut [u8], tag: i32) -> Result<(), WaitError> {
        // SAFETY: as in `send`, and `buf` is borrowed mutably.
        unsafe { self.post(from, Transfer::Recv(buf.as_mut_ptr()), buf.len(), tag)? };
        self.wait_step()
    }
}

/// At least `bytes` bytes of 8-byte-aligned scratch, kept across calls.
fn scratch_bytes(scratch: &mut Vec<u64>, bytes: usize) -> &mut [u8] {
    let words = bytes.div_ceil(8);
    if scratch.len() < words {
        scratch.resize(words, 0);
    }
    &mut bytemuck::cast_slice_mut(scratch.as_mut_slice())[..bytes]
}

/// All-reduce of `buf` (whole elements of `elem` bytes) in place.
pub(super) fn all_reduce(
    peers: &mut Peers<'_>,
    buf: &mut [u8],
    elem: usize,
    scratch: &mut Vec<u64>,
    combine: Combine<'_>,
) -> Result<(), WaitError> {
    if peers.size == 1 {
        return Ok(());
    }
    match all_reduce_algorithm(buf.len()) {
        AllReduceAlgorithm::RecursiveDoubling => {
            let tmp = scratch_bytes(scratch, buf.len());
            recursive_doubling(peers, buf, tmp, combine)
        }
        AllReduceAlgorithm::Ring => {
            let chunks = balanced_chunks(buf.len() / elem, peers.size, elem);
            let tmp = scratch_bytes(scratch, chunks[0].len());
            ring_reduce_scatter(peers, buf, &chunks, tmp, combine)?;
            ring_all_gather(peers, buf, &chunks, None)
        }
    }
}

/// Reduce-scatter: `send` holds every rank's contribution to the chunks `counts` (elements of
/// `elem` bytes); `recv` gets this rank's chunk, reduced.
pub(super) fn reduce_scatter(
    peers: &mut Peers<'_>,
    (send, recv): (&[u8], &mut [u8]),
    (counts, elem): (&[usize], usize),
    scratch: &mut Vec<u64>,
    combine: Combine<'_>,
) -> Result<(), WaitError> {
    let chunks = chunks_of(counts, elem);
    let own = chunks[peers.rank].clone();
    if peers.size == 1 {
        recv.copy_from_slice(&send[own]);
        return Ok(());
    }
    let largest = chunks.iter().map(|c| c.len()).max().unwrap_or(0);
    let space = scratch_bytes(scratch, send.len() + largest);
    let (work, tmp) = space.split_at_mut(send.len());
    work.copy_from_slice(send);
    ring_reduce_scatter(peers, work, &chunks, tmp, combine)?;
    recv.copy_from_slice(&work[own]);
    Ok(())
}

/// All-gather: `recv` is split into `chunks`, one per rank; this rank's chunk gets `own`,
/// and every other chunk its rank's.
///
/// Groups of a power-of-two size gather small buffers by recursive doubling (`log p` steps);
/// everything else goes around the ring (`p − 1` steps, each of one chunk).
pub(super) fn all_gather(
    peers: &mut Peers<'_>,
    own: &[u8],
    recv: &mut [u8],
    chunks: &[Range<usize>],
) -> Result<(), WaitError> {
    if peers.size > 2 && peers.size.is_power_of_two() && recv.len() < 256 << 10 {
        doubling_all_gather(peers, own, recv, chunks)
    } else {
        ring_all_gather(peers, recv, chunks, Some(own))
    }
}

/// Recursive doubling over `p` ranks; when `p` is not a power of two, the first `2·rem` ranks
/// first fold in pairs (even into odd) and the odd ones hand the result back at the end.
fn recursive_doubling(
    peers: &mut Peers<'_>,
    buf: &mut [u8],
    tmp: &mut [u8],
    combine: Combine<'_>,
) -> Result<(), WaitError> {
    let (rank, size) = (peers.rank, peers.size);
    if buf.len() <= SMALL_BUFFER {
        peers.piece = EAGER_PIECE;
    }
    let pof2 = 1usize << size.ilog2();
    let rem = size - pof2;
    let folded = rank < 2 * rem;
    let new_rank = match (folded, rank % 2) {
        (true, 0) => {
            peers.send(rank + 1, buf, TAG_FOLD)?;
            None
        }
        (true, _) => {
            peers.recv(rank - 1, tmp, TAG_FOLD)?;
            combine(buf, tmp, true);
            Some(rank / 2)
        }
        (false, _) => Some(rank - rem),
    };
    if let Some(new_rank) = new_rank {
        let mut mask = 1;
        while mask < pof2 {
            let partner = new_rank ^ mask;
            let peer = if partner < rem {
                2 * partner + 1
            } else {
                partner + rem
            };
            // SAFETY: `buf` is read and `tmp` written, two distinct borrowed buffers, for the
            // whole exchange.
            unsafe {
                peers.exchange(
                    (peer, (buf.as_ptr(), buf.len())),
                    (peer, (tmp.as_mut_ptr(), buf.len())),
                    TAG_DOUBLING,
                )?;
            }
            combine(buf, &tmp[..buf.len()], peer < rank);
            mask <<= 1;
        }
    }
    match (folded, rank % 2) {
        (true, 0) => peers.recv(rank + 1, buf, TAG_UNFOLD),
        (true, _) => peers.send(rank - 1, buf, TAG_UNFOLD),
        (false, _) => Ok(()),
    }
}

/// Ring reduce-scatter in place: at step `s` rank `r` sends chunk `r−s−1` to its right and
/// reduces chunk `r−s−2` from its left into its own; after `p−1` steps chunk `r` holds the
/// reduction of every rank's chunk `r`. `tmp` holds the largest chunk.
fn ring_reduce_scatter(
    peers: &mut Peers<'_>,
    buf: &mut [u8],
    chunks: &[Range<usize>],
    tmp: &mut [u8],
    combine: Combine<'_>,
) -> Result<(), WaitError> {
    let (rank, size) = (peers.rank, peers.size);
    let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
    for step in 0..size - 1 {
        let send = chunks[(rank + 2 * size - step - 1) % size].clone();
        let recv = chunks[(rank + 2 * size - step - 2) % size].clone();
        // SAFETY: `buf` is read and `tmp` written, two distinct borrowed buffers, for the
        // whole exchange.
        unsafe {
            peers.exchange(
                (right, (buf.as_ptr().add(send.start), send.len())),
                (left, (tmp.as_mut_ptr(), recv.len())),
                TAG_REDUCE_SCATTER,
            )?;
        }
        combine(&mut buf[recv.clone()], &tmp[..recv.len()], true);
    }
    Ok(())
}

/// Ring all-gather in place: at step `s` rank `r` sends chunk `r−s` to its right and receives
/// chunk `r−s−1` from its left. With `own`, this rank's chunk is not in `buf` yet: the first
/// step sends it from `own` and copies it into place while the messages are under way.
fn ring_all_gather(
    peers: &mut Peers<'_>,
    buf: &mut [u8],
    chunks: &[Range<usize>],
    own: Option<&[u8]>,
) -> Result<(), WaitError> {
    let (rank, size) = (peers.rank, peers.size);
    let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
    let mine = chunks[rank].clone();
    let base = buf.as_mut_ptr();
    let place_own = |own: &[u8]| {
        // SAFETY: this rank's chunk of `buf`, which no message of the step touches.
        unsafe { std::ptr::copy_nonoverlapping(own.as_ptr(), base.add(mine.start), mine.len()) }
    };
    for step in 0..size - 1 {
        let send = chunks[(rank + size - step) % size].clone();
        let recv = chunks[(rank + 2 * size - step - 1) % size].clone();
        let (source, first) = match own {
            Some(own) if step == 0 => (own.as_ptr(), Some(own)),
            // SAFETY: `send` is a chunk of `buf`.
            _ => (unsafe { base.add(send.start) }.cast_const(), None),
        };
        // SAFETY: the received chunk differs from the sent one and from this rank's, and
        // `buf` (and `own`) are borrowed for the whole exchange.
        unsafe {
            peers.exchange_and(
                (right, (source, send.len())),
                (left, (base.add(recv.start), recv.len())),
                TAG_ALL_GATHER,
                || first.into_iter().for_each(place_own),
            )?;
        }
    }
    if size == 1 {
        own.into_iter().for_each(place_own);
    }
    Ok(())
}

/// Recursive-doubling all-gather over a power-of-two group: at step `k` rank `r` swaps the
/// `2^k` consecutive chunks it holds with rank `r xor 2^k`. `own` is sent at the first step
/// and copied into place while that step's messages are under way.
fn doubling_all_gather(
    peers: &mut Peers<'_>,
    own: &[u8],
    buf: &mut [u8],
    chunks: &[Range<usize>],
) -> Result<(), WaitError> {
    let rank = peers.rank;
    let base = buf.as_mut_ptr();
    // Chunks `first .. first + count` as one byte range (chunks follow each other in order).
    let block = |first: usize, count: usize| chunks[first].start..chunks[first + count - 1].end;
    let mut mask = 1;
    while mask < peers.size {
        let peer = rank ^ mask;
        let held = block(rank & !(mask - 1), mask);
        let wanted = block(peer & !(mask - 1), mask);
        let source = if mask == 1 {
            own.as_ptr()
        } else {
            // SAFETY: `held` is a range of `buf`.
            unsafe { base.add(held.start) }.cast_const()
        };
        let place_own = || {
            if mask == 1 {
                // SAFETY: this rank's chunk, which the step's receive does not touch.
                unsafe {
                    std::ptr::copy_nonoverlapping(own.as_ptr(), base.add(held.start), own.len())
                }
            }
        };
        // SAFETY: the held and wanted blocks are disjoint ranges of `buf`, borrowed for the
        // whole exchange.
        unsafe {
            peers.exchange_and(
                (peer, (source, held.len())),
                (peer, (base.add(wanted.start), wanted.len())),
                TAG_ALL_GATHER,
                place_own,
            )?;
        }
        mask <<= 1;
    }
    Ok(())
}
