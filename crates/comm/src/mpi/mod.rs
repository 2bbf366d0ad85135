//! The `mpi` backend (cargo feature `mpi`): one rank per process over the system's MPI library
//! (OpenMPI or MPICH), started by `mpirun`.
//!
//! ```no_run
//! use comm::{Communicator, CommunicatorExt, ReduceOp};
//! // Run as `mpirun -np 4 ./program`.
//! let world = comm::mpi::MpiComm::world(comm::mpi::DEFAULT_TIMEOUT)?;
//! let mut grads = vec![1.0f32; 1024];
//! world.all_reduce_in_place(&mut grads, ReduceOp::Mean)?;
//! # Ok::<(), comm::CommError>(())
//! ```
//!
//! # How calls map to MPI
//! Collectives run in one of two modes ([`OnTimeout`]). In the default, polled mode,
//! all-reduce, reduce-scatter and all-gather(v) are Tessera's own algorithms over
//! `MPI_Isend`/`MPI_Irecv` (recursive doubling for small buffers, rings for large ones; see
//! the `p2p` module), on a duplicate of the group's communicator reserved for them; broadcast,
//! all-to-all(v) and barrier are the nonblocking MPI collectives (`MPI_Ibcast`,
//! `MPI_Ialltoallv`, `MPI_Ibarrier`). Every wait is an `MPI_Test` loop with a deadline, so a
//! call can give up. Under [`OnTimeout::AbortJob`] every collective is the blocking MPI call.
//! Mean is a sum divided locally; f16 and bf16, which MPI has no type for, are reduced as f32
//! copies.
//! `send` copies the message and starts an `MPI_Isend` that completes in the background (so,
//! as on the local backend, a send never waits for its receive); `recv` is `MPI_Improbe` and
//! `MPI_Imrecv`, polled. Groups are `MPI_Comm_create_group` over the parent's communicator; the
//! world communicator is a duplicate of `MPI_COMM_WORLD`, so Tessera's traffic never mixes
//! with the application's. Only rsmpi's raw `ffi` layer is used: its safe request scopes panic
//! when a request is abandoned, and abandoning one is exactly what a timeout must do.
//!
//! # Failure, and its limits
//! - A peer that **never joins** a call: every waiting rank gets [`CommError::Timeout`] after
//!   the timeout (MPI does not say which rank is missing, so `waiting_for` is empty).
//! - A peer that **panics**: while unwinding, its communicator sends a failure notice to every
//!   world rank on a private control communicator; waiting peers poll for notices and return
//!   [`CommError::PeerFailed`] at once. The panicking process then exits and `mpirun`
//!   terminates the job, as OpenMPI does for any rank that exits abnormally.
//! - A peer whose work **returns an error** sends a notice with its error message when it calls
//!   [`MpiComm::announce_failure`] before it exits, as `runtime::train_mpi` does: the waiting
//!   peers' [`CommError::PeerFailed`] carries that message. Without it, its peers would wait
//!   for it until the timeout.
//! - Ranks that call all-reduce, reduce-scatter or all-gather with **different lengths**
//!   (polled mode): a rank whose messages do not have the lengths its schedule expects gets
//!   [`CommError::Mismatch`] naming the peer; a rank whose own messages happen to fit then
//!   waits for a peer that gave up and gets [`CommError::Timeout`]. None completes with a
//!   wrong result.
//! - A peer **killed** by a signal cannot send a notice: `mpirun` (OpenMPI's default) tears the
//!   job down. Nothing hangs, but the surviving ranks see no error either.
//! - MPI cannot cancel a started collective. After any error the process's MPI state is
//!   poisoned: every communicator of the process refuses further calls
//!   ([`CommError::Poisoned`]), the abandoned operation is never progressed again (so it cannot
//!   write into a buffer that was returned to the caller, as long as the transport only moves
//!   data inside MPI calls, which is true of OpenMPI's shared-memory and TCP transports), and
//!   `MPI_Finalize` is skipped (it could wait for the abandoned operation). The process should
//!   report its error and exit; `mpirun` then ends the job.
//! - Group creation (`MPI_Comm_create_group`) has no nonblocking form: a member that never calls
//!   [`group`](Communicator::group) blocks the others in it.
//! - Calls are serialised per process: MPI is initialised with `MPI_THREAD_SERIALIZED`, or
//!   `MPI_THREAD_SINGLE` when the application asks for it ([`prefer_thread_level`]; calls from
//!   other threads are then refused).
//!
//! # Modules
//! `runtime` is the process's MPI state (initialisation, thread level, poisoning); `world`
//! the communicator and its world constructor; `call` one call in progress under the MPI
//! lock; `collectives` the [`Communicator`] implementation, with `group` (sub-communicators),
//! `messages` (send and recv) and `background` (collectives started nonblocking) beside it;
//! `widen` the f32 copies of 16-bit float buffers; `library` the library's own collectives
//! used as a benchmark baseline. `p2p` holds the polled mode's algorithms, `pending` a
//! started collective, `watchdog` the abort-job watchdog, and `raw` the FFI edge.

mod background;
mod call;
mod collectives;
mod group;
mod library;
mod messages;
mod p2p;
mod pending;
mod raw;
mod runtime;
mod watchdog;
mod widen;
mod world;

use std::fmt;
use std::time::Duration;

#[cfg(doc)]
use crate::communicator::Communicator;
#[cfg(doc)]
use crate::error::CommError;

pub use self::runtime::prefer_thread_level;
pub use self::world::MpiComm;

/// The timeout [`MpiComm::world`] callers usually pass.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

const BACKEND: &str = "mpi";

/// What a collective does when it cannot complete within the timeout: the choice between
/// errors that every rank can handle and OpenMPI's fastest algorithms. Point-to-point calls
/// (`send`/`recv`) and group creation behave the same under both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnTimeout {
    /// The call returns [`CommError::Timeout`] (or [`CommError::PeerFailed`] when a peer
    /// announced a panic) on every waiting rank. All-reduce, reduce-scatter and all-gather are
    /// Tessera's algorithms over point-to-point messages (as fast as OpenMPI's blocking calls
    /// or faster: docs/PERFORMANCE.md), the other collectives MPI's nonblocking ones, all
    /// polled against the deadline. The default.
    #[default]
    ReturnError,
    /// The call cannot time out: collectives are the blocking MPI calls (OpenMPI's `tuned`
    /// algorithms), and a watchdog thread ends the whole MPI job (`MPI_Abort`)
    /// when one runs past the timeout, after printing which rank and call hung — the
    /// semantics of NCCL's watchdog. A peer that panics ends the job too (its process exits
    /// and `mpirun` tears the job down). Nothing hangs, but no error is returned either.
    AbortJob,
}

/// The thread support Tessera asks for when it is the one to initialise MPI (see
/// [`prefer_thread_level`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThreadLevel {
    /// `MPI_THREAD_SERIALIZED`: communicators may be used from any thread (Tessera's lock lets
    /// one call through at a time). The default.
    #[default]
    Serialized,
    /// `MPI_THREAD_SINGLE`: only the thread that initialises MPI (the one creating the first
    /// communicator) may use Tessera's MPI communicators; a call from any other thread is
    /// refused with [`CommError::InvalidArgument`], and a communicator dropped there is leaked
    /// rather than freed. OpenMPI then skips its own thread safety, which makes calls of a few
    /// kilobytes about 20 % faster (docs/PERFORMANCE.md). Under [`OnTimeout::AbortJob`] the
    /// watchdog still calls `MPI_Abort` from its own thread to end a hung job.
    Single,
}

impl fmt::Display for ThreadLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ThreadLevel::Serialized => "MPI_THREAD_SERIALIZED",
            ThreadLevel::Single => "MPI_THREAD_SINGLE",
        })
    }
}
