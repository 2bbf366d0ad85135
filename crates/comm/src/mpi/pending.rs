//! MPI's nonblocking collectives (`MPI_Iallreduce`, `MPI_Ireduce_scatter`, `MPI_Iallgather`)
//! as a [`crate::PendingCollective`]: started on the calling thread, advanced by each `test`
//! (OpenMPI progresses a nonblocking collective inside `MPI_Test`), finished by `wait` within
//! the communicator's deadline, watching for failure notices as every polled call does.

use std::sync::Arc;
use std::time::Duration;

use tensor::Tensor;

use super::raw::{Request, WaitError};
use super::runtime::Runtime;
use crate::error::{CommError, Site};
use crate::pending::InFlight;

/// What MPI reads until a request completes besides the result buffer: the send buffer of a
/// reduce-scatter or all-gather, and a reduce-scatter's counts. Leaked with the result if the
/// request is abandoned.
#[derive(Default)]
pub(super) struct Kept {
    #[expect(
        dead_code,
        reason = "held, never read: MPI reads it until the request completes"
    )]
    pub(super) send: Option<Tensor>,
    #[expect(
        dead_code,
        reason = "held, never read: MPI reads it until the request completes"
    )]
    pub(super) counts: Vec<i32>,
}

/// A collective MPI runs in the background on buffers it owns until it completes.
pub(super) struct MpiInFlight {
    pub(super) runtime: Arc<Runtime>,
    /// `None` once completed.
    pub(super) request: Option<Request>,
    /// The buffer MPI writes the result into; leaked if the request is abandoned (MPI may
    /// still write it).
    pub(super) data: Option<Tensor>,
    /// Buffers MPI may still read.
    pub(super) kept: Kept,
    /// The group's members as world ranks, in group-rank order (to name a failed peer).
    pub(super) members: Vec<usize>,
    pub(super) timeout: Duration,
    pub(super) site: Site,
}

impl std::fmt::Debug for MpiInFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiInFlight")
            .field("site", &self.site)
            .field("done", &self.request.is_none())
            .finish_non_exhaustive()
    }
}

// SAFETY: the request handle is used only under the runtime's MPI lock, and by one owner.
unsafe impl Send for MpiInFlight {}

impl MpiInFlight {
    fn error(&self, err: WaitError) -> CommError {
        let err = super::runtime::wait_error(err, self.site.clone(), self.timeout, Vec::new());
        self.runtime.fail(err)
    }
}

impl InFlight for MpiInFlight {
    fn test(&mut self) -> Result<bool, CommError> {
        let Some(request) = self.request.as_mut() else {
            return Ok(true);
        };
        let raw = self.runtime.raw.lock().unwrap_or_else(|e| e.into_inner());
        let in_call = self.runtime.enter_progress(self.site.op, &self.site.group);
        let done = raw.test(request);
        drop(in_call);
        drop(raw);
        match done {
            Ok(true) => {
                self.request = None;
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err((code, message)) => Err(self.error(WaitError::Mpi(code, message))),
        }
    }

    fn wait(mut self: Box<Self>) -> Result<Tensor, CommError> {
        if let Some(request) = self.request.take() {
            let members = self.members.clone();
            let mut raw = self.runtime.raw.lock().unwrap_or_else(|e| e.into_inner());
            let in_call = self.runtime.enter_progress(self.site.op, &self.site.group);
            let polled = raw.poll(request, self.timeout, |world_rank| {
                members.iter().position(|&m| m == world_rank)
            });
            drop(in_call);
            drop(raw);
            if let Err(err) = polled {
                // MPI may still use the buffers: abandon them.
                self.abandon();
                return Err(self.error(err));
            }
        }
        self.kept = Kept::default();
        Ok(self.data.take().expect("the data stays until taken"))
    }
}

impl MpiInFlight {
    /// Leaks the buffers of a request that never completed: MPI may still use them.
    fn abandon(&mut self) {
        std::mem::forget(self.data.take());
        std::mem::forget(std::mem::take(&mut self.kept));
    }
}

impl Drop for MpiInFlight {
    fn drop(&mut self) {
        if self.request.is_some() {
            self.abandon();
        }
    }
}
