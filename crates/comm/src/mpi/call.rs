//! [`Call`], one call in progress: it holds the MPI lock and the endpoint's state, checks
//! arguments, polls waits against the deadline, and poisons the process on failure.

use std::sync::MutexGuard;

use tensor::DType;

use super::p2p;
use super::raw::{self, Datatype, MpiError, Raw, Request};
use super::runtime::wait_error;
use super::watchdog::Watched;
use super::world::EndpointState;
use super::{MpiComm, OnTimeout};
use crate::communicator::{Communicator, Tag, MAX_TAG};
use crate::error::{CommError, Site};
use crate::progress::InCall;

/// One call in progress: holds the MPI lock and poisons the process on failure.
pub(super) struct Call<'a> {
    /// The progress gauge entered for this call (dropped first, while the MPI lock is held).
    pub(super) _in_call: Option<InCall<'a>>,
    pub(super) comm: &'a MpiComm,
    pub(super) raw: MutexGuard<'a, Raw>,
    pub(super) state: MutexGuard<'a, EndpointState>,
    pub(super) op: &'static str,
}

impl Call<'_> {
    pub(super) fn site(&self) -> Site {
        self.comm.site(self.op)
    }

    pub(super) fn invalid(&self, reason: String) -> CommError {
        CommError::InvalidArgument {
            site: self.site(),
            reason,
        }
    }

    /// Poisons the process's MPI state with `err` (unless it is an argument error).
    pub(super) fn fail(&self, err: CommError) -> CommError {
        self.comm.runtime.fail(err)
    }

    pub(super) fn check<T>(&self, rc: Result<T, (i32, String)>) -> Result<T, CommError> {
        rc.map_err(|(code, message)| {
            self.fail(CommError::Mpi {
                site: self.site(),
                code,
                message,
            })
        })
    }

    /// A count as MPI's `int`.
    pub(super) fn count(&self, n: usize) -> Result<i32, CommError> {
        i32::try_from(n).map_err(|_| {
            self.invalid(format!(
                "{n} items is more than MPI can address in one call"
            ))
        })
    }

    pub(super) fn counts(&self, counts: &[usize]) -> Result<(Vec<i32>, Vec<i32>), CommError> {
        let mut displs = Vec::with_capacity(counts.len());
        let mut total = 0usize;
        for &c in counts {
            displs.push(self.count(total)?);
            total += c;
        }
        self.count(total)?;
        let counts = counts
            .iter()
            .map(|&c| self.count(c))
            .collect::<Result<_, _>>()?;
        Ok((counts, displs))
    }

    /// The error for a wait that ended without completion (`waiting_for`: the peer waited
    /// for, when known), poisoning the process.
    pub(super) fn wait_error(&self, err: raw::WaitError, waiting_for: Vec<usize>) -> CommError {
        self.fail(wait_error(err, self.site(), self.comm.timeout, waiting_for))
    }

    /// Polls `request` to completion, watching for failure notices and the deadline. On
    /// failure the request is abandoned, never freed: MPI may still own its buffers.
    pub(super) fn wait(&mut self, request: Request) -> Result<(), CommError> {
        let members = &self.comm.members;
        let polled = self.raw.poll(request, self.comm.timeout, |world_rank| {
            members.iter().position(|&m| m == world_rank)
        });
        polled.map_err(|err| self.wait_error(err, Vec::new()))
    }

    /// Runs one collective: under [`OnTimeout::AbortJob`] the blocking MPI call, watched by
    /// the process's watchdog; otherwise `polled`.
    pub(super) fn run(
        &mut self,
        blocking: impl FnOnce(&Raw) -> Result<(), MpiError>,
        polled: impl FnOnce(&mut Self) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let comm = self.comm;
        match (comm.on_timeout, comm.runtime.watchdog.get()) {
            (OnTimeout::AbortJob, Some(watchdog)) => {
                let armed = watchdog.arm(&Watched {
                    op: self.op,
                    group: comm.label.clone(),
                    rank: comm.rank,
                    size: comm.size,
                    timeout: comm.timeout,
                });
                let done = blocking(&self.raw);
                drop(armed);
                self.check(done)
            }
            _ => polled(self),
        }
    }

    /// A collective that MPI serves in both modes: blocking (see [`Call::run`]) or
    /// nonblocking, polled against the deadline.
    pub(super) fn collective(
        &mut self,
        blocking: impl FnOnce(&Raw) -> Result<(), MpiError>,
        nonblocking: impl FnOnce(&mut Raw) -> Result<Request, MpiError>,
    ) -> Result<(), CommError> {
        self.run(blocking, |call| {
            let request = nonblocking(&mut call.raw);
            let request = call.check(request)?;
            call.wait(request)
        })
    }

    /// Runs one of the [`p2p`] collectives on the communicator's collective twin, with the
    /// call's deadline and the endpoint's scratch space.
    pub(super) fn point_to_point(
        &mut self,
        collective: impl FnOnce(&mut p2p::Peers<'_>, &mut Vec<u64>) -> Result<(), raw::WaitError>,
    ) -> Result<(), CommError> {
        let comm = self.comm;
        let member = |world_rank: usize| comm.members.iter().position(|&m| m == world_rank);
        let state = &mut *self.state;
        let mut peers = p2p::Peers {
            raw: &mut self.raw,
            comm: &comm.coll,
            rank: comm.rank,
            size: comm.size,
            timeout: comm.timeout,
            started: None,
            step: &mut state.step,
            piece: p2p::MAX_MESSAGE,
            member: &member,
        };
        let done = collective(&mut peers, &mut state.scratch);
        done.map_err(|err| {
            // MPI may still own the scratch space: leak it rather than free it.
            std::mem::forget(std::mem::take(&mut self.state.scratch));
            self.wait_error(err, Vec::new())
        })
    }

    /// Refuses an all-gather whose receive length is not the group size times the send length
    /// (both counted in `unit`).
    pub(super) fn check_gather(
        &self,
        send: usize,
        recv: usize,
        unit: &str,
    ) -> Result<(), CommError> {
        let size = self.comm.size;
        if recv == send * size {
            return Ok(());
        }
        Err(self.invalid(format!(
            "recv has {recv} {unit} but {size} ranks × {send} {unit} sent need {}",
            send * size
        )))
    }

    pub(super) fn check_peer(&self, peer: usize, tag: Tag) -> Result<(), CommError> {
        if peer >= self.comm.size {
            return Err(self.invalid(format!(
                "peer rank {peer} is outside the group (size {})",
                self.comm.size
            )));
        }
        if tag > MAX_TAG {
            return Err(self.invalid(format!("tag {tag} is above the maximum {MAX_TAG}")));
        }
        Ok(())
    }
}

/// The MPI type a buffer of `dtype` travels as (16-bit floats as f32 copies, bools as bytes).
pub(super) fn datatype(dtype: DType) -> Datatype {
    match dtype {
        DType::F64 => Datatype::F64,
        DType::F32 | DType::F16 | DType::BF16 => Datatype::F32,
        DType::I64 => Datatype::I64,
        DType::I32 => Datatype::I32,
        DType::I16 => Datatype::I16,
        DType::I8 => Datatype::I8,
        DType::U64 => Datatype::U64,
        DType::U32 => Datatype::U32,
        DType::U16 => Datatype::U16,
        DType::U8 | DType::Bool => Datatype::U8,
    }
}
