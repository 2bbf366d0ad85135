//! Collectives that run while the caller computes: an all-reduce, reduce-scatter or all-gather
//! started now and finished later ([`crate::Communicator::start_all_reduce`],
//! [`crate::Communicator::start_reduce_scatter_v`],
//! [`crate::Communicator::start_all_gather_bytes`]). A backend whose collectives progress
//! only inside its calls (MPI's nonblocking collectives advance in `MPI_Test`) advances it at
//! every [`PendingCollective::test`]; one without returns it already done.

use std::fmt;

use tensor::Tensor;

use crate::error::CommError;

/// A backend's collective in flight.
pub trait InFlight: Send + fmt::Debug {
    /// Advances the reduction; whether it has completed.
    fn test(&mut self) -> Result<bool, CommError>;

    /// Waits (within the communicator's deadline) and returns the result.
    fn wait(self: Box<Self>) -> Result<Tensor, CommError>;
}

/// A collective started by one of the communicator's `start_*` calls.
#[derive(Debug)]
pub struct PendingCollective {
    state: State,
}

#[derive(Debug)]
enum State {
    Done(Tensor),
    InFlight(Box<dyn InFlight>),
}

impl PendingCollective {
    /// One that completed when it started.
    pub fn done(result: Tensor) -> PendingCollective {
        PendingCollective {
            state: State::Done(result),
        }
    }

    /// One a backend runs in the background.
    pub fn in_flight(op: Box<dyn InFlight>) -> PendingCollective {
        PendingCollective {
            state: State::InFlight(op),
        }
    }

    /// Whether it ran in the background (it did not complete when it started).
    pub fn is_background(&self) -> bool {
        matches!(self.state, State::InFlight(_))
    }

    /// Advances it; whether it has completed.
    pub fn test(&mut self) -> Result<bool, CommError> {
        match &mut self.state {
            State::Done(_) => Ok(true),
            State::InFlight(op) => op.test(),
        }
    }

    /// Waits for it and returns the result: the reduced tensor, this rank's part of a
    /// reduce-scatter, or an all-gather's bytes (a `u8` tensor).
    pub fn wait(self) -> Result<Tensor, CommError> {
        match self.state {
            State::Done(t) => Ok(t),
            State::InFlight(op) => op.wait(),
        }
    }
}
