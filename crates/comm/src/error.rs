//! The one error type of the comm crate.

use std::fmt;
use std::time::Duration;

use tensor::{DType, TensorError};

/// Where an error happened: the backend, the group, the caller's rank in it and the operation.
///
/// Every [`CommError`] about a communicator call carries one, so a message read in the log of
/// one rank out of many says which call on which group failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// `"local"` or `"mpi"`.
    pub backend: &'static str,
    /// The group's label: `world`, or `world[0,2,3]` for a sub-group (members as world ranks).
    pub group: String,
    /// The caller's rank inside the group.
    pub rank: usize,
    /// The number of ranks in the group.
    pub size: usize,
    /// The operation: `all_reduce`, `recv`, `group`, …
    pub op: &'static str,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} rank {} of {} group {} (size {})",
            self.op, self.rank, self.backend, self.group, self.size
        )
    }
}

/// Why a peer can no longer take part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerFailure {
    /// The peer's thread panicked (local backend) or its process reported a panic (MPI backend).
    Panicked,
    /// The peer dropped its communicator (its closure returned) without joining the call.
    Exited,
    /// The peer's own call failed and it abandoned the group; the payload is its error.
    Aborted(String),
}

impl fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerFailure::Panicked => f.write_str("panicked"),
            PeerFailure::Exited => f.write_str("exited without joining"),
            PeerFailure::Aborted(reason) => write!(f, "abandoned the group after: {reason}"),
        }
    }
}

/// Who a timed-out call waited for: the ranks, when the backend knows them (MPI does not say
/// which peer is missing).
fn waited_on(ranks: &[usize]) -> String {
    if ranks.is_empty() {
        "waiting for a peer (the backend does not say which)".to_string()
    } else {
        format!("waiting for rank(s) {ranks:?}")
    }
}

/// Everything that can go wrong in a communicator call.
///
/// After any error except [`CommError::InvalidArgument`] (which is detected before any
/// communication), the communicator is poisoned: later calls return [`CommError::Poisoned`] and
/// peers waiting on this rank get [`CommError::PeerFailed`] at once.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// The call waited longer than the communicator's timeout.
    #[error("{site}: timed out after {timeout:?} {}", waited_on(.waiting_for))]
    Timeout {
        /// The call.
        site: Site,
        /// The configured timeout.
        timeout: Duration,
        /// Ranks (in the group) that had not arrived.
        waiting_for: Vec<usize>,
    },
    /// A peer the call waits on panicked, exited or abandoned the group.
    #[error("{site}: peer rank {peer} {cause}")]
    PeerFailed {
        /// The call.
        site: Site,
        /// The failed peer's rank in the group.
        peer: usize,
        /// What happened to it.
        cause: PeerFailure,
    },
    /// A call on a communicator that an earlier error poisoned.
    #[error("{site}: the communicator is unusable after an earlier error: {first_error}")]
    Poisoned {
        /// The call.
        site: Site,
        /// The error that poisoned it.
        first_error: String,
    },
    /// The caller's arguments are wrong (lengths, root, ranks); nothing was communicated.
    #[error("{site}: {reason}")]
    InvalidArgument {
        /// The call.
        site: Site,
        /// What is wrong.
        reason: String,
    },
    /// The ranks disagree: different collectives, sizes, dtypes or reduction ops.
    #[error("{site}: rank {peer} disagrees: {reason}")]
    Mismatch {
        /// The call.
        site: Site,
        /// The disagreeing peer.
        peer: usize,
        /// What differs.
        reason: String,
    },
    /// A reduction on a dtype the op does not support (e.g. `sum` on `bool`).
    #[error("{site}: reduction {reduce} is not supported for dtype {dtype}")]
    UnsupportedReduction {
        /// The call.
        site: Site,
        /// The reduction.
        reduce: crate::ReduceOp,
        /// The dtype.
        dtype: DType,
    },
    /// A tensor could not be built from the received data.
    #[error("{site}: {source}")]
    Tensor {
        /// The call.
        site: Site,
        /// The tensor error.
        source: Box<TensorError>,
    },
    /// The MPI library returned an error code.
    #[error("{site}: MPI error {code}: {message}")]
    Mpi {
        /// The call.
        site: Site,
        /// The MPI error code.
        code: i32,
        /// MPI's description of it.
        message: String,
    },
    /// A rank's closure panicked (reported by [`crate::LocalCluster::run`] for that rank).
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank (in the world).
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// Setting up a backend failed (e.g. zero ranks, MPI already initialised).
    #[error("{backend} backend setup: {reason}")]
    Setup {
        /// `"local"` or `"mpi"`.
        backend: &'static str,
        /// What went wrong.
        reason: String,
    },
}

impl CommError {
    /// The call site, for errors about a call.
    pub fn site(&self) -> Option<&Site> {
        match self {
            CommError::Timeout { site, .. }
            | CommError::PeerFailed { site, .. }
            | CommError::Poisoned { site, .. }
            | CommError::InvalidArgument { site, .. }
            | CommError::Mismatch { site, .. }
            | CommError::UnsupportedReduction { site, .. }
            | CommError::Tensor { site, .. }
            | CommError::Mpi { site, .. } => Some(site),
            CommError::RankPanicked { .. } | CommError::Setup { .. } => None,
        }
    }

    /// Whether the error leaves the communicator usable (only argument errors, detected before
    /// any communication, do).
    pub fn poisons(&self) -> bool {
        !matches!(
            self,
            CommError::InvalidArgument { .. } | CommError::UnsupportedReduction { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeout names the ranks it waited for, or says the backend does not know them (MPI),
    /// rather than printing an empty list that reads as "waiting for nobody".
    #[test]
    fn a_timeout_says_whom_it_waited_for() {
        let timeout = |waiting_for: Vec<usize>| {
            CommError::Timeout {
                site: Site {
                    backend: "mpi",
                    group: "world".to_string(),
                    rank: 0,
                    size: 2,
                    op: "all_reduce",
                },
                timeout: Duration::from_secs(5),
                waiting_for,
            }
            .to_string()
        };
        assert!(timeout(vec![1]).ends_with("waiting for rank(s) [1]"));
        let unknown = timeout(Vec::new());
        assert!(
            unknown.ends_with("waiting for a peer (the backend does not say which)"),
            "{unknown}"
        );
    }
}
