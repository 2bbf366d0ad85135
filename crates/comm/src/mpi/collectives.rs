//! [`Communicator`] for [`MpiComm`]: the collectives, each polled or blocking by the
//! communicator's [`OnTimeout`](super::OnTimeout); group creation, point-to-point messages and
//! the started collectives are in `group`, `messages` and `background`.

use std::time::Duration;

use tensor::DType;

use super::call::datatype;
use super::widen::{narrow, widen, widen_read};
use super::{p2p, MpiComm, BACKEND};
use crate::buf::{Buf, BufMut};
use crate::communicator::{Communicator, Tag};
use crate::error::CommError;
use crate::op::ReduceOp;

impl Communicator for MpiComm {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn label(&self) -> &str {
        &self.label
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn group(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        Ok(Box::new(self.create_group(ranks)?))
    }

    fn barrier(&self) -> Result<(), CommError> {
        let mut call = self.enter("barrier")?;
        call.collective(
            |raw| raw.barrier(&self.comm),
            |raw| raw.ibarrier(&self.comm),
        )
    }

    fn broadcast_bytes(&self, buf: &mut [u8], root: usize) -> Result<(), CommError> {
        let mut call = self.enter("broadcast")?;
        if root >= self.size {
            return Err(call.invalid(format!(
                "root {root} is outside the group (size {})",
                self.size
            )));
        }
        let count = call.count(buf.len())?;
        let ptr = buf.as_mut_ptr();
        // SAFETY: `buf` outlives the call (or the wait; on failure the process never calls MPI
        // again).
        call.collective(
            |raw| unsafe { raw.bcast(&self.comm, ptr, count, root) },
            |raw| unsafe { raw.ibcast(&self.comm, ptr, count, root) },
        )
    }
    /// MPI's nonblocking all-reduce for f32 and f64 sums, maxima and minima under polled
    /// collectives; the blocking path otherwise.
    fn start_all_reduce(
        &self,
        tensor: tensor::Tensor,
        op: ReduceOp,
    ) -> Result<crate::PendingCollective, CommError> {
        self.start_all_reduce_nonblocking(tensor, op)
    }

    /// MPI's nonblocking reduce-scatter for f32 and f64 sums, maxima and minima under polled
    /// collectives; the blocking path otherwise.
    fn start_reduce_scatter_v(
        &self,
        send: tensor::Tensor,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<crate::PendingCollective, CommError> {
        self.start_reduce_scatter_v_nonblocking(send, counts, op)
    }

    /// MPI's nonblocking all-gather under polled collectives; the blocking path otherwise.
    fn start_all_gather_bytes(&self, send: Vec<u8>) -> Result<crate::PendingCollective, CommError> {
        self.start_all_gather_bytes_nonblocking(send)
    }

    fn all_reduce_buf(&self, mut buf: BufMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        let mut call = self.enter("all_reduce")?;
        let dtype = buf.dtype();
        if !op.supports(dtype) {
            return Err(CommError::UnsupportedReduction {
                site: call.site(),
                reduce: op,
                dtype,
            });
        }
        // MPI has no 16-bit float type: reduce an f32 copy.
        let mut widened = widen(&buf);
        let storage = if widened.is_some() { DType::F32 } else { dtype };
        let bytes: &mut [u8] = match &mut widened {
            Some(wide) => bytemuck::cast_slice_mut(wide.as_mut_slice()),
            None => buf.bytes_mut(),
        };
        let elem = storage.size_in_bytes();
        let elems = (
            bytes.as_mut_ptr(),
            call.count(bytes.len() / elem)?,
            datatype(dtype),
        );
        let combine = |dst: &mut [u8], src: &[u8], src_first: bool| {
            crate::op::combine_bytes(storage, op, dst, src, src_first)
        };
        // SAFETY: the buffer outlives the call (on failure the process never calls MPI again,
        // and a widened copy is leaked rather than freed).
        let done = call.run(
            |raw| unsafe { raw.allreduce(&self.comm, elems, op) },
            |call| {
                call.point_to_point(|peers, scratch| {
                    p2p::all_reduce(peers, bytes, elem, scratch, &combine)
                })
            },
        );
        if let Err(err) = done {
            std::mem::forget(widened);
            return Err(err);
        }
        match widened {
            Some(wide) => narrow(&wide, &mut buf, op, self.size),
            None if op == ReduceOp::Mean => crate::op::divide_in_place(&mut buf, self.size),
            None => {}
        }
        Ok(())
    }

    fn reduce_scatter_v(
        &self,
        send: Buf<'_>,
        mut recv: BufMut<'_>,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let mut call = self.enter("reduce_scatter")?;
        let dtype = send.dtype();
        if recv.dtype() != dtype {
            return Err(call.invalid(format!("send is {dtype} but recv is {}", recv.dtype())));
        }
        if !op.supports(dtype) {
            return Err(CommError::UnsupportedReduction {
                site: call.site(),
                reduce: op,
                dtype,
            });
        }
        if counts.len() != self.size
            || counts.iter().sum::<usize>() != send.len()
            || recv.len() != counts[self.rank]
        {
            return Err(call.invalid(format!(
                "counts {counts:?} must have {} entries summing to the send length {} and entry \
                 {} equal to the recv length {}",
                self.size,
                send.len(),
                self.rank,
                recv.len()
            )));
        }
        let (mpi_counts, _) = call.counts(counts)?;
        let wide_send = widen_read(&send);
        let mut wide_recv = widen(&recv);
        let storage = if wide_send.is_some() {
            DType::F32
        } else {
            dtype
        };
        let send_bytes: &[u8] = wide_send
            .as_ref()
            .map_or(send.bytes(), |w| bytemuck::cast_slice(w.as_slice()));
        let recv_bytes: &mut [u8] = match &mut wide_recv {
            Some(w) => bytemuck::cast_slice_mut(w.as_mut_slice()),
            None => recv.bytes_mut(),
        };
        let (send_ptr, recv_ptr) = (send_bytes.as_ptr(), recv_bytes.as_mut_ptr());
        let mpi_dtype = datatype(dtype);
        let combine = |dst: &mut [u8], src: &[u8], src_first: bool| {
            crate::op::combine_bytes(storage, op, dst, src, src_first)
        };
        let elem = storage.size_in_bytes();
        // SAFETY: buffers and counts outlive the call, or are leaked on failure.
        let done = call.run(
            |raw| unsafe {
                raw.reduce_scatter(&self.comm, (send_ptr, recv_ptr), &mpi_counts, mpi_dtype, op)
            },
            |call| {
                call.point_to_point(|peers, scratch| {
                    let buffers = (send_bytes, recv_bytes);
                    p2p::reduce_scatter(peers, buffers, (counts, elem), scratch, &combine)
                })
            },
        );
        if let Err(err) = done {
            std::mem::forget((wide_send, wide_recv, mpi_counts));
            return Err(err);
        }
        match wide_recv {
            Some(wide) => narrow(&wide, &mut recv, op, self.size),
            None if op == ReduceOp::Mean => crate::op::divide_in_place(&mut recv, self.size),
            None => {}
        }
        Ok(())
    }

    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        let mut call = self.enter("all_gather")?;
        call.check_gather(send.len(), recv.len(), "bytes")?;
        let count = call.count(send.len())?;
        call.count(recv.len())?;
        let (send_ptr, recv_ptr) = (send.as_ptr(), recv.as_mut_ptr());
        let chunks = crate::schedule::balanced_chunks(recv.len(), self.size, 1);
        // SAFETY: buffers outlive the call (on failure the process never calls MPI again).
        call.run(
            |raw| unsafe { raw.allgather(&self.comm, send_ptr, count, recv_ptr) },
            |call| call.point_to_point(|peers, _| p2p::all_gather(peers, send, recv, &chunks)),
        )
    }

    fn all_gather_v_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
    ) -> Result<(), CommError> {
        let mut call = self.enter("all_gather_v")?;
        if counts.len() != self.size
            || counts[self.rank] != send.len()
            || counts.iter().sum::<usize>() != recv.len()
        {
            return Err(call.invalid(format!(
                "counts {counts:?} must have {} entries, entry {} equal to the send length {} \
                 and sum to the recv length {}",
                self.size,
                self.rank,
                send.len(),
                recv.len()
            )));
        }
        let (mpi_counts, displs) = call.counts(counts)?;
        let sent = (send.as_ptr(), mpi_counts[self.rank]);
        let recv_ptr = recv.as_mut_ptr();
        let chunks = crate::schedule::chunks_of(counts, 1);
        // SAFETY: buffers and counts outlive the call, or are leaked on failure.
        call.run(
            |raw| unsafe { raw.allgatherv(&self.comm, sent, recv_ptr, &mpi_counts, &displs) },
            |call| call.point_to_point(|peers, _| p2p::all_gather(peers, send, recv, &chunks)),
        )
        .inspect_err(|_| {
            std::mem::forget((mpi_counts, displs));
        })
    }

    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        let n = self.size;
        if !send.len().is_multiple_of(n) || recv.len() != send.len() {
            let call = self.enter("all_to_all")?;
            return Err(call.invalid(format!(
                "send ({} bytes) must divide into {n} equal chunks and recv ({} bytes) match it",
                send.len(),
                recv.len()
            )));
        }
        let counts = vec![send.len() / n; n];
        self.all_to_all_v_bytes(send, &counts, recv, &counts)
    }

    fn all_to_all_v_bytes(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
    ) -> Result<(), CommError> {
        let mut call = self.enter("all_to_all_v")?;
        let n = self.size;
        if send_counts.len() != n
            || recv_counts.len() != n
            || send_counts.iter().sum::<usize>() != send.len()
            || recv_counts.iter().sum::<usize>() != recv.len()
            || send_counts[self.rank] != recv_counts[self.rank]
        {
            return Err(call.invalid(format!(
                "send counts {send_counts:?} and recv counts {recv_counts:?} must have {n} \
                 entries each, sum to the buffer lengths ({} and {}) and agree on this rank's \
                 own piece",
                send.len(),
                recv.len()
            )));
        }
        let (scounts, sdispls) = call.counts(send_counts)?;
        let (rcounts, rdispls) = call.counts(recv_counts)?;
        let (send_ptr, recv_ptr) = (send.as_ptr(), recv.as_mut_ptr());
        // SAFETY: buffers and counts outlive the call (or the wait), or are leaked on failure.
        call.collective(
            |raw| unsafe {
                raw.alltoallv(
                    &self.comm,
                    (send_ptr, &scounts, &sdispls),
                    (recv_ptr, &rcounts, &rdispls),
                )
            },
            |raw| unsafe {
                raw.ialltoallv(
                    &self.comm,
                    (send_ptr, &scounts, &sdispls),
                    (recv_ptr, &rcounts, &rdispls),
                )
            },
        )
        .inspect_err(|_| {
            std::mem::forget((scounts, sdispls, rcounts, rdispls));
        })
    }
    fn send_bytes(&self, dst: usize, tag: Tag, data: &[u8]) -> Result<(), CommError> {
        self.send_message(dst, tag, data)
    }

    fn recv_bytes(&self, src: usize, tag: Tag) -> Result<Vec<u8>, CommError> {
        self.recv_message(src, tag)
    }
}
