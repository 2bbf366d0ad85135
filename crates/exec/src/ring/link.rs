//! A ring step's link to its members: messages to and from them by the step's tag, and the
//! spans (attending, waiting) the step reports.

use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::time::{Duration, Instant};

use comm::{Communicator, Tag};
use tensor::Element;

use crate::error::ExecError;
use parallel::ring::Ring;

/// One span of a ring step on this rank: attending (`wait == false`) or waiting for a
/// message, during pass `pass` (0 = the rank's own keys; the moves to and from the zigzag
/// placement count as the first and last pass's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSpan {
    /// The pass.
    pub pass: usize,
    /// Waiting for a message rather than attending.
    pub wait: bool,
    /// When it started.
    pub from: Instant,
    /// When it ended.
    pub to: Instant,
}

/// What a ring step reports: the time it waited for messages, its spans, and the working
/// memory it held.
#[derive(Debug, Clone, Default)]
pub struct RingTiming {
    /// Time blocked in receives.
    pub waited: Duration,
    /// Attending and waiting, in order.
    pub spans: Vec<RingSpan>,
    /// Bytes of the working buffers the step allocated (all held until it ended; messages in
    /// flight are not counted): [`parallel::ring::RingCall::workspace_elements`] predicts it.
    pub workspace_bytes: usize,
}

/// This rank's ring, the step's message tag, the pass under way, the time spent waiting
/// for blocks and the working memory allocated.
pub(super) struct Link<'a> {
    pub(super) comm: &'a dyn Communicator,
    pub(super) ring: &'a Ring,
    pub(super) tag: Tag,
    pub(super) pass: Cell<usize>,
    pub(super) timing: RefCell<RingTiming>,
}

impl<'a> Link<'a> {
    pub(super) fn of(comm: &'a dyn Communicator, ring: &'a Ring, tag: Tag) -> Link<'a> {
        Link {
            comm,
            ring,
            tag,
            pass: Cell::new(0),
            timing: RefCell::new(RingTiming::default()),
        }
    }

    /// Records a span of the pass under way.
    pub(super) fn record(&self, wait: bool, from: Instant) {
        let to = Instant::now();
        let mut timing = self.timing.borrow_mut();
        if wait {
            timing.waited += to - from;
        }
        timing.spans.push(RingSpan {
            pass: self.pass.get(),
            wait,
            from,
            to,
        });
    }

    /// Runs `attend` as the pass under way's attention.
    pub(super) fn attend<R>(&self, attend: impl FnOnce() -> R) -> R {
        let from = Instant::now();
        let result = attend();
        self.record(false, from);
        result
    }

    /// What the step reports.
    pub(super) fn into_timing(self) -> RingTiming {
        self.timing.into_inner()
    }

    /// A zeroed working buffer of `len` elements, counted in the step's working memory.
    pub(super) fn alloc<T: Element>(&self, len: usize) -> Vec<T> {
        self.count::<T>(len);
        vec![T::zeroed(); len]
    }

    /// Counts `len` elements of `T` allocated elsewhere for the step (an attention state).
    pub(super) fn count<T>(&self, len: usize) {
        self.timing.borrow_mut().workspace_bytes += len * std::mem::size_of::<T>();
    }

    /// Sends `block` to member `member` (posted, not waited for).
    pub(super) fn send_to<T: Element>(&self, member: usize, block: &[T]) -> Result<(), ExecError> {
        self.comm.send_bytes(
            self.ring.members[member],
            self.tag,
            bytemuck::cast_slice(block),
        )?;
        Ok(())
    }

    /// Receives the next message from member `member` into `dst`, which it must fill exactly.
    pub(super) fn receive_into<T: Element>(
        &self,
        member: usize,
        dst: &mut [T],
    ) -> Result<(), ExecError> {
        let from = self.ring.members[member];
        let started = Instant::now();
        let bytes = self.comm.recv_bytes(from, self.tag)?;
        self.record(true, started);
        let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
        if bytes.len() != dst.len() {
            return Err(ExecError::Mismatch {
                what: format!("a ring attention message from rank {from}"),
                expected: format!("{} bytes", dst.len()),
                got: format!("{} bytes", bytes.len()),
            });
        }
        dst.copy_from_slice(&bytes);
        Ok(())
    }

    /// The previous and the next member.
    fn neighbours(&self) -> (usize, usize) {
        let n = self.ring.n();
        (
            (self.ring.position + n - 1) % n,
            (self.ring.position + 1) % n,
        )
    }

    /// Sends each of `parts` of `data` to the next member, one message each.
    pub(super) fn pass_on<T: Element>(
        &self,
        data: &[T],
        parts: &[Range<usize>],
    ) -> Result<(), ExecError> {
        let next = self.neighbours().1;
        parts
            .iter()
            .try_for_each(|p| self.send_to(next, &data[p.clone()]))
    }

    /// Receives one message from the previous member into each of `parts` of `data`.
    pub(super) fn receive<T: Element>(
        &self,
        data: &mut [T],
        parts: &[Range<usize>],
    ) -> Result<(), ExecError> {
        let prev = self.neighbours().0;
        parts
            .iter()
            .try_for_each(|p| self.receive_into(prev, &mut data[p.clone()]))
    }
}
