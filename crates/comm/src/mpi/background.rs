//! Collectives started in the background: MPI's nonblocking all-reduce, reduce-scatter and
//! all-gather, returned as pending collectives (with the blocking path where MPI cannot run
//! them in the background).

use tensor::DType;

use super::call::datatype;
use super::{pending, raw, MpiComm, OnTimeout};
use crate::buf::{Buf, BufMut};
use crate::communicator::Communicator;
use crate::error::{CommError, Site};
use crate::op::ReduceOp;

impl MpiComm {
    /// Whether a started collective of `dtype` and `op` runs in the background: under polled
    /// collectives, on the types and operations MPI reduces natively.
    fn runs_in_background(&self, dtype: DType, op: ReduceOp) -> bool {
        self.on_timeout == OnTimeout::ReturnError
            && matches!(dtype, DType::F32 | DType::F64)
            && matches!(op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min)
    }

    /// A started request, whose result MPI writes into `data`, as a pending collective.
    fn in_flight(
        &self,
        request: raw::Request,
        data: tensor::Tensor,
        kept: pending::Kept,
        site: Site,
    ) -> crate::PendingCollective {
        crate::PendingCollective::in_flight(Box::new(pending::MpiInFlight {
            runtime: self.runtime.clone(),
            request: Some(request),
            data: Some(data),
            kept,
            members: self.members.clone(),
            timeout: self.timeout,
            site,
        }))
    }

    /// MPI's nonblocking all-reduce for f32 and f64 sums, maxima and minima under polled
    /// collectives ([`OnTimeout::ReturnError`]); the blocking path otherwise.
    pub(super) fn start_all_reduce_nonblocking(
        &self,
        mut tensor: tensor::Tensor,
        op: ReduceOp,
    ) -> Result<crate::PendingCollective, CommError> {
        if !self.runs_in_background(tensor.dtype(), op) {
            self.all_reduce(&mut tensor, op)?;
            return Ok(crate::PendingCollective::done(tensor));
        }
        let call = self.enter("start_all_reduce")?;
        let count = call.count(tensor.n_elements())?;
        let ptr = tensor.as_bytes_mut().as_mut_ptr();
        // SAFETY: the tensor's heap buffer moves into the pending reduction with it and is
        // neither read, written nor freed until the request completes (it is leaked if the
        // request is abandoned).
        let started = unsafe {
            call.raw
                .iallreduce(&self.comm, (ptr, count, datatype(tensor.dtype())), op)
        };
        let request = call.check(started)?;
        let site = call.site();
        drop(call);
        Ok(self.in_flight(request, tensor, pending::Kept::default(), site))
    }

    /// MPI's nonblocking reduce-scatter for f32 and f64 sums, maxima and minima under polled
    /// collectives ([`OnTimeout::ReturnError`]); the blocking path otherwise.
    pub(super) fn start_reduce_scatter_v_nonblocking(
        &self,
        send: tensor::Tensor,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<crate::PendingCollective, CommError> {
        let dtype = send.dtype();
        let valid = counts.len() == self.size && counts.iter().sum::<usize>() == send.n_elements();
        if !valid || !self.runs_in_background(dtype, op) {
            // The blocking call checks the counts and names what is wrong.
            let mine = counts.get(self.rank).copied().unwrap_or(0);
            let mut recv = tensor::Tensor::zeros(dtype, &[mine]);
            self.reduce_scatter_v(
                Buf::from_tensor(&send),
                BufMut::from_tensor(&mut recv),
                counts,
                op,
            )?;
            return Ok(crate::PendingCollective::done(recv));
        }
        let call = self.enter("start_reduce_scatter")?;
        let (mpi_counts, _) = call.counts(counts)?;
        let mut recv = tensor::Tensor::zeros(dtype, &[counts[self.rank]]);
        let (send_ptr, recv_ptr) = (send.as_bytes().as_ptr(), recv.as_bytes_mut().as_mut_ptr());
        // SAFETY: both tensors' heap buffers and the counts move into the pending reduction
        // and are neither read, written nor freed until the request completes (they are leaked
        // if the request is abandoned).
        let started = unsafe {
            call.raw.ireduce_scatter(
                &self.comm,
                (send_ptr, recv_ptr),
                &mpi_counts,
                datatype(dtype),
                op,
            )
        };
        let request = call.check(started)?;
        let site = call.site();
        drop(call);
        let kept = pending::Kept {
            send: Some(send),
            counts: mpi_counts,
        };
        Ok(self.in_flight(request, recv, kept, site))
    }

    /// MPI's nonblocking all-gather under polled collectives ([`OnTimeout::ReturnError`]); the
    /// blocking path otherwise.
    pub(super) fn start_all_gather_bytes_nonblocking(
        &self,
        send: Vec<u8>,
    ) -> Result<crate::PendingCollective, CommError> {
        let len = send.len();
        let send = tensor::Tensor::from_vec(&[len], send).expect("the length is the shape");
        if self.on_timeout != OnTimeout::ReturnError {
            let mut recv = vec![0u8; len * self.size];
            self.all_gather_bytes(send.as_bytes(), &mut recv)?;
            let gathered = tensor::Tensor::from_vec(&[recv.len()], recv).expect("shape");
            return Ok(crate::PendingCollective::done(gathered));
        }
        let call = self.enter("start_all_gather")?;
        let count = call.count(len)?;
        call.count(len * self.size)?;
        let mut recv = tensor::Tensor::zeros(DType::U8, &[len * self.size]);
        let (send_ptr, recv_ptr) = (send.as_bytes().as_ptr(), recv.as_bytes_mut().as_mut_ptr());
        // SAFETY: both tensors' heap buffers move into the pending collective and are neither
        // read, written nor freed until the request completes (they are leaked if the request
        // is abandoned).
        let started = unsafe { call.raw.iallgather(&self.comm, send_ptr, count, recv_ptr) };
        let request = call.check(started)?;
        let site = call.site();
        drop(call);
        let kept = pending::Kept {
            send: Some(send),
            counts: Vec::new(),
        };
        Ok(self.in_flight(request, recv, kept, site))
    }
}
