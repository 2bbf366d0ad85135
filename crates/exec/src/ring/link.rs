//! A ring step's link to its members: messages to and from them by the step's tag, and the
//! spans (attending, waiting) the step reports.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use comm::{Communicator, Tag};
use tensor::Element;

use super::Ring;
use crate::error::ExecError;

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

/// What a ring step reports: the time it waited for messages and its spans.
#[derive(Debug, Clone, Default)]
pub struct RingTiming {
    /// Time blocked in receives.
    pub waited: Duration,
    /// Attending and waiting, in order.
    pub spans: Vec<RingSpan>,
}

/// This rank's ring, the step's message tag, the pass under way, and the time spent waiting
/// for blocks.
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

    /// Sends `block` to member `member` (posted, not waited for).
    pub(super) fn send_to<T: Element>(&self, member: usize, block: &[T]) -> Result<(), ExecError> {
        self.comm.send_bytes(
            self.ring.members[member],
            self.tag,
            bytemuck::cast_slice(block),
        )?;
        Ok(())
    }

    /// Receives the next message from member `member`: `count` elements of `T`.
    pub(super) fn receive_from<T: Element>(
        &self,
        member: usize,
        count: usize,
    ) -> Result<Vec<T>, ExecError> {
        let from = self.ring.members[member];
        let started = Instant::now();
        let bytes = self.comm.recv_bytes(from, self.tag)?;
        self.record(true, started);
        let expected = count * std::mem::size_of::<T>();
        if bytes.len() != expected {
            return Err(ExecError::Mismatch {
                what: format!("a ring attention message from rank {from}"),
                expected: format!("{expected} bytes"),
                got: format!("{} bytes", bytes.len()),
            });
        }
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Sends each of `blocks` to the next member, one message each.
    pub(super) fn pass_on<T: Element>(&self, blocks: &[Vec<T>]) -> Result<(), ExecError> {
        let next = (self.ring.position + 1) % self.ring.n();
        blocks.iter().try_for_each(|b| self.send_to(next, b))
    }

    /// Receives one message of `count` elements from the previous member per entry of `counts`.
    pub(super) fn receive<T: Element>(&self, counts: &[usize]) -> Result<Vec<Vec<T>>, ExecError> {
        let prev = (self.ring.position + self.ring.n() - 1) % self.ring.n();
        counts
            .iter()
            .map(|&count| self.receive_from(prev, count))
            .collect()
    }
}
