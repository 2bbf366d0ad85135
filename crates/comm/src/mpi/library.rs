//! The MPI library's own blocking collectives, the baseline of
//! `tessera bench collectives --backend mpi`.

use super::raw::Datatype;
use super::MpiComm;
use crate::error::CommError;
use crate::op::ReduceOp;

/// The MPI library's own blocking collectives on a communicator's group, bypassing Tessera's
/// algorithms, timeouts and checks: the baseline `tessera bench collectives --backend mpi`
/// measures the backend against, in the same process, run and buffers.
impl MpiComm {
    /// `MPI_Allreduce(MPI_IN_PLACE, buf, …, MPI_FLOAT, MPI_SUM, …)`.
    pub fn library_all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let call = self.enter("library_all_reduce")?;
        let elems = (
            buf.as_mut_ptr().cast::<u8>(),
            call.count(buf.len())?,
            Datatype::F32,
        );
        // SAFETY: `buf` is borrowed for the whole blocking call.
        let done = unsafe { call.raw.allreduce(&self.comm, elems, ReduceOp::Sum) };
        call.check(done)
    }

    /// `MPI_Allgather` of `send` into `recv` (`send.len() × size` elements).
    pub fn library_all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        let call = self.enter("library_all_gather")?;
        call.check_gather(send.len(), recv.len(), "elements")?;
        let count = call.count(std::mem::size_of_val(send))?;
        call.count(std::mem::size_of_val(recv))?;
        // SAFETY: both buffers are borrowed for the whole blocking call.
        let done = unsafe {
            call.raw.allgather(
                &self.comm,
                send.as_ptr().cast(),
                count,
                recv.as_mut_ptr().cast(),
            )
        };
        call.check(done)
    }
}
