//! Collectives that run while the caller computes: an all-reduce started now and finished
//! later ([`crate::Communicator::start_all_reduce`]). A backend whose collectives progress
//! only inside its calls (MPI's nonblocking collectives advance in `MPI_Test`) advances it at
//! every [`PendingAllReduce::test`]; one without returns it already done.

use std::fmt;

use tensor::Tensor;

use crate::error::CommError;

/// A backend's all-reduce in flight.
pub trait InFlight: Send + fmt::Debug {
    /// Advances the reduction; whether it has completed.
    fn test(&mut self) -> Result<bool, CommError>;

    /// Waits (within the communicator's deadline) and returns the reduced tensor.
    fn wait(self: Box<Self>) -> Result<Tensor, CommError>;
}

/// An all-reduce started by [`crate::Communicator::start_all_reduce`].
#[derive(Debug)]
pub struct PendingAllReduce {
    state: State,
}

#[derive(Debug)]
enum State {
    Done(Tensor),
    InFlight(Box<dyn InFlight>),
}

impl PendingAllReduce {
    /// One that completed when it started.
    pub fn done(result: Tensor) -> PendingAllReduce {
        PendingAllReduce {
            state: State::Done(result),
        }
    }

    /// One a backend runs in the background.
    pub fn in_flight(op: Box<dyn InFlight>) -> PendingAllReduce {
        PendingAllReduce {
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

    /// Waits for it and returns the reduced tensor.
    pub fn wait(self) -> Result<Tensor, CommError> {
        match self.state {
            State::Done(t) => Ok(t),
            State::InFlight(op) => op.wait(),
        }
    }
}
