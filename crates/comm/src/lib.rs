//! Tessera's communicators: collectives and point-to-point messages between ranks, on host
//! buffers and [`tensor::Tensor`]s.
//!
//! # Brief overview
//! - [`Communicator`]: the object-safe trait every backend implements — rank, size, sub-groups
//!   ([`group`](Communicator::group), [`split`](Communicator::split)), barrier, broadcast,
//!   all-reduce, reduce-scatter, all-gather, all-to-all (equal and `_v`), send/recv. Tensor-level
//!   calls are provided methods; [`CommunicatorExt`] adds generic slice helpers such as
//!   [`all_reduce_in_place`](CommunicatorExt::all_reduce_in_place) for gradients.
//! - [`LocalCluster`] / [`LocalComm`]: the `local` backend — N ranks as threads of one process,
//!   exchanging through shared memory with zero staging copies. The default, and what tests use.
//! - `mpi::MpiComm` (cargo feature `mpi`): one rank per process over the system's MPI library,
//!   started by `mpirun`.
//! - [`CommError`]: every failure, each naming the call's [`Site`] (backend, group, rank, op).
//! - [`conformance`]: the one test suite every backend runs, each op against a serial reference.
//!
//! # Semantics
//! - **Collectives** are called by every rank of a group in the same order with matching
//!   arguments. All-gather concatenates along dim 0 (a 0-dim tensor gathers into `[size]`);
//!   reduce-scatter splits dim 0 with [`split_counts`] (the first `d0 % size` ranks get one row
//!   more, ranks past `d0` get none); all-to-all splits dim 0 into `size` equal blocks, and
//!   [`all_to_all_v_bytes`](Communicator::all_to_all_v_bytes) exchanges pieces of any sizes
//!   (what the reshard engine uses to move boxes). Reductions ([`ReduceOp`]: sum, mean, max,
//!   min) work on every numeric dtype (f16/bf16 accumulate in f32; bool takes max/min only);
//!   moves work on any dtype as bytes.
//! - **Deterministic reductions** (issue 17):
//!   [`all_reduce_deterministic`](Communicator::all_reduce_deterministic) and
//!   [`reduce_scatter_deterministic`](Communicator::reduce_scatter_deterministic) combine the
//!   members' elements in the canonical summation tree of `tensor::kernels::tree`, in member
//!   order, so the bits equal `tree_reduce` over the members' inputs on one process, on every
//!   backend and whatever the arrival order. Provided methods (an all-to-all-v of chunks to
//!   their owners, the tree, an all-gather-v); the local backend overrides the all-reduce with
//!   its fused lend-based schedule of the same arithmetic.
//! - **Reductions in the element type**:
//!   [`all_reduce_in_element_type`](Communicator::all_reduce_in_element_type) and
//!   [`reduce_scatter_in_element_type_v`](Communicator::reduce_scatter_in_element_type_v) fold
//!   the members' elements left to right in member order and round every partial result to the
//!   dtype: for bf16 and f16 a half-precision all-reduce (the gradient sums of
//!   `gradient_fp32_sync = false`). Provided methods, the deterministic reductions' schedule
//!   with this fold in place of the tree, so every backend computes the same bits.
//! - **Groups**: [`group`](Communicator::group) takes ranks of the parent and numbers them in
//!   the order given; only the listed ranks call it. Each group has its own channels, so
//!   concurrent groups never mix messages or collectives.
//! - **Failure**: no call waits longer than the communicator's timeout. A peer that panics,
//!   drops its communicator or abandons the group after an error makes every call waiting on
//!   it fail with [`CommError::PeerFailed`] on all other ranks, at once; a peer that never
//!   joins makes them fail with [`CommError::Timeout`]. After such an error the communicator
//!   is poisoned ([`CommError::Poisoned`]) — like an NCCL communicator after an abort, it is
//!   rebuilt, not retried. Argument errors are found before any communication and poison
//!   nothing.
//!
//! # Key design decision: lend, don't copy
//! The local backend never stages data. A rank *lends* its buffer to its peers for the duration
//! of a call (a raw pointer published in shared memory, guarded by a lease counter), and peers
//! work on it directly: all-gather copies each byte once, from sender to receiver, and
//! all-reduce is a fused reduce-scatter/all-gather in which rank `r` sums chunk `r` over all
//! buffers and writes the result into chunk `r` of every buffer — each rank reads and writes
//! `S` bytes for an `S`-byte buffer, and no rank funnels the data. The price is that a call may
//! not return while a peer still uses its buffer; leases are held only while copying, never
//! while waiting, so even a failing call returns within one chunk's copy time of its timeout.
//!
//! # Example
//! ```
//! use comm::{Communicator, LocalCluster, ReduceOp};
//! use tensor::Tensor;
//! let results = LocalCluster::new(4)?.run(|comm| -> Result<Tensor, comm::CommError> {
//!     // Each rank holds 3 rows; gather them all, then sum and scatter rows back.
//!     let mine = Tensor::from_vec(&[3, 2], vec![comm.rank() as f32; 6]).unwrap();
//!     let all = comm.all_gather(&mine)?;                  // [12, 2]
//!     let pairs = comm.group(&[comm.rank() & !1, comm.rank() | 1])?; // {0,1}, {2,3}
//!     let mut t = all.clone();
//!     pairs.all_reduce(&mut t, ReduceOp::Max)?;
//!     comm.reduce_scatter(&all, ReduceOp::Sum)            // rows 3·r .. 3·r+3, times 4
//! });
//! for (rank, r) in results.into_iter().enumerate() {
//!     let part = r??;
//!     assert_eq!(part.shape(), &[3, 2]);
//!     assert_eq!(part.as_f32()?, &[4.0 * rank as f32; 6]);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Architecture invariant
//! `comm` moves and reduces buffers between ranks. It knows nothing about checkpoints, layouts,
//! meshes or graphs: a group is a list of ranks, a buffer is bytes with a dtype. Only `tensor`
//! is below it.
#![deny(missing_docs)]

mod buf;
mod communicator;
pub mod conformance;
mod deterministic;
mod error;
mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
mod op;
mod pending;
// Used by the MPI backend; built (and tested) without it too.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
mod progress;
mod schedule;
pub mod start_notice;

pub use crate::buf::{Buf, BufMut};
pub use crate::communicator::{
    parts_one_after_another, split_counts, Communicator, CommunicatorExt, Tag, MAX_TAG,
};
pub use crate::error::{CommError, PeerFailure, Site};
pub use crate::local::{thread_wait_time, LocalCluster, LocalComm};
pub use crate::op::ReduceOp;
pub use crate::pending::{InFlight, PendingCollective};
