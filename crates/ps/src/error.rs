//! Errors of parameter-server training.
//!
//! One type, [`PsError`], whose variants keep apart who is at fault:
//!
//! - the outside world: the process contract ([`PsError::Env`]), the configuration
//!   ([`PsError::Config`]), a peer's message that breaks the protocol ([`PsError::Message`],
//!   [`PsError::Rows`]), a peer that cannot be reached ([`PsError::Rpc`]) or a job whose
//!   processes are lost ([`PsError::Job`]);
//! - the machine: sockets, processes and files ([`PsError::Io`], [`PsError::SnapshotIo`],
//!   and a snapshot whose content breaks a rule, [`PsError::Snapshot`]);
//! - Tessera itself: a tensor operation that failed ([`PsError::Tensor`]), a parameter or a
//!   gradient a program lacks ([`PsError::MissingParameter`], [`PsError::NoGradient`]) and
//!   any other broken invariant ([`PsError::Invariant`]).
//!
//! Every variant names its culprit (the tensor, table, peer, file or call) and the rule broken.
//! A variant that wraps an error keeps it as its `source()` and quotes it in its text too, as
//! the runtime's errors do (`RuntimeError::Io`); `tessera` prints a cause already quoted once.
//!
//! A server answers a call that fails with [`PsError::Message`] or [`PsError::Rows`] with
//! `InvalidArgument` (the caller sent something wrong) and with `Internal` otherwise.

use std::path::PathBuf;

/// A boxed error of any kind, kept as the source of an [`PsError`] whose causes vary (an
/// `std::io::Error`, a `tonic` transport error, a checkpoint error).
pub type BoxedSource = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What can go wrong in a scheduler, server or worker.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    /// A bad or missing environment variable of the process contract.
    #[error("environment {var}: {reason}")]
    Env {
        /// The variable (`TESSERA_ROLE`).
        var: String,
        /// The rule broken.
        reason: String,
    },
    /// A configuration that contradicts the environment or itself.
    #[error("config {key}: {reason}")]
    Config {
        /// The key (`ps.workers`).
        key: String,
        /// The rule broken.
        reason: String,
    },
    /// A call that failed after every retry.
    ///
    /// `last` is text: an attempt ends in a `tonic::Status` or in no answer at all, and the
    /// retry loop compares and keeps those outcomes as text (a stale route is recognised by
    /// [`crate::migrate::STALE_ROUTE`] in it).
    #[error("{call} to {peer} failed after {attempts} attempt(s): {last}")]
    Rpc {
        /// The call (`Pull`).
        call: String,
        /// Who was called (`server 1 at 127.0.0.1:4000`).
        peer: String,
        /// Attempts made.
        attempts: u32,
        /// The last error (`Unavailable: …`, `no answer within 500 ms`).
        last: String,
    },
    /// A message from a peer (a worker's push, a server's pull reply, the scheduler's step or
    /// partition map) that breaks the protocol.
    #[error("protocol: {what}: {rule}")]
    Message {
        /// The message or its field (`tensor fc1.weight`, `Pull reply of server 1`).
        what: String,
        /// The rule broken (`shape [1], expected [2, 2]`).
        rule: String,
    },
    /// Rows of a server-resident table (a pull's ids, a push's row-sparse gradient, a
    /// server's block) that break the table's rules.
    #[error("table {table}: {rule}")]
    Rows {
        /// The table (`embedding.embedding_table`).
        table: String,
        /// The rule broken (`row id 10 is out of range (the table has 10 rows)`).
        rule: String,
    },
    /// A tensor operation failed.
    #[error("{what}: {source}")]
    Tensor {
        /// What was being done (`the pulled rows of table t`).
        what: String,
        /// The tensor error.
        #[source]
        source: tensor::TensorError,
    },
    /// A parameter of the job that a program or a collection lacks: a bug, not bad input.
    #[error("parameter {name} is missing from {place}")]
    MissingParameter {
        /// The parameter (`fc1.weight`).
        name: String,
        /// Where it was looked for (`the evaluation program`).
        place: String,
    },
    /// A trainable parameter whose gradient the training program did not produce.
    #[error("parameter {name} has no gradient")]
    NoGradient {
        /// The parameter.
        name: String,
    },
    /// A broken invariant or a call against a function's contract: a bug in Tessera, not bad
    /// input.
    #[error("{what}: {rule}")]
    Invariant {
        /// What broke it (`a gradient`, `step 4`).
        what: String,
        /// The rule broken (`needs rows`).
        rule: String,
    },
    /// A snapshot file whose content breaks a rule.
    #[error("snapshot {path}: {rule}")]
    Snapshot {
        /// The file.
        path: PathBuf,
        /// The rule broken (`ps_version has 3 values, expected 2`).
        rule: String,
    },
    /// A snapshot file that cannot be written or read.
    #[error("snapshot {path}: {what}: {source}")]
    SnapshotIo {
        /// The file.
        path: PathBuf,
        /// What was being done (`reading fc1.weight`).
        what: String,
        /// The error (a checkpoint error, an `std::io::Error`).
        #[source]
        source: BoxedSource,
    },
    /// A socket, runtime, address or child process that could not be set up.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (`binding server 1 to 0.0.0.0:4000`).
        what: String,
        /// The error (an `std::io::Error`, a `tonic` transport error).
        #[source]
        source: BoxedSource,
    },
    /// A job that cannot go on: its processes were lost, never registered, or make no
    /// progress.
    #[error("{what}: {reason}")]
    Job {
        /// What was being waited for (`the parameter-server job`, `waiting for the servers`).
        what: String,
        /// Why it cannot go on, naming the processes.
        reason: String,
    },
    /// The job was stopped because the process that started it received `signal`.
    #[error("interrupted by signal {signal}; every process of the job was stopped")]
    Stopped {
        /// The signal number.
        signal: i32,
    },
    /// An error of the runtime (programs, data, optimizer).
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
}

impl From<runtime::launch_env::EnvError> for PsError {
    fn from(err: runtime::launch_env::EnvError) -> PsError {
        PsError::Env {
            var: err.var.to_string(),
            reason: err.reason,
        }
    }
}

impl PsError {
    /// A [`PsError::Io`]: `what` failed with `source`.
    pub fn io(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> PsError {
        PsError::Io {
            what: what.into(),
            source: Box::new(source),
        }
    }

    /// A [`PsError::Job`]: `what` cannot go on, for `reason`.
    pub fn job(what: impl Into<String>, reason: impl Into<String>) -> PsError {
        PsError::Job {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// A [`PsError::Message`]: `what` breaks `rule`.
    pub fn message(what: impl Into<String>, rule: impl Into<String>) -> PsError {
        PsError::Message {
            what: what.into(),
            rule: rule.into(),
        }
    }

    /// A [`PsError::Rows`]: rows of `table` break `rule`.
    pub fn rows(table: impl Into<String>, rule: impl Into<String>) -> PsError {
        PsError::Rows {
            table: table.into(),
            rule: rule.into(),
        }
    }

    /// A [`PsError::Invariant`]: `what` breaks `rule`.
    pub fn invariant(what: impl Into<String>, rule: impl Into<String>) -> PsError {
        PsError::Invariant {
            what: what.into(),
            rule: rule.into(),
        }
    }

    /// A [`PsError::MissingParameter`]: `name` is not in `place`.
    pub fn missing_parameter(name: impl Into<String>, place: impl Into<String>) -> PsError {
        PsError::MissingParameter {
            name: name.into(),
            place: place.into(),
        }
    }

    /// A [`PsError::Tensor`]: `what` failed with `source`.
    pub fn tensor(what: impl Into<String>, source: tensor::TensorError) -> PsError {
        PsError::Tensor {
            what: what.into(),
            source,
        }
    }

    /// Whether the error is the caller's: a message that breaks the protocol or a table's
    /// rules. A server answers such a call with `InvalidArgument`, any other failure with
    /// `Internal`.
    pub fn is_bad_request(&self) -> bool {
        matches!(self, PsError::Message { .. } | PsError::Rows { .. })
    }
}

impl From<runtime::ExecError> for PsError {
    /// An executor or optimizer error is a runtime error, as it was before `exec` was split
    /// out of `runtime`.
    fn from(e: runtime::ExecError) -> PsError {
        PsError::Runtime(e.into())
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_tensor_failure_keeps_the_tensor_error_as_its_source() {
        let err = tensor::Tensor::from_vec(&[3], vec![1.0f32])
            .map_err(|e| PsError::tensor("the rows of table t", e))
            .unwrap_err();
        assert!(
            err.to_string().starts_with("the rows of table t: "),
            "{err}"
        );
        let source = err.source().expect("a source");
        assert!(source.downcast_ref::<tensor::TensorError>().is_some());
        assert!(err.to_string().ends_with(&source.to_string()), "{err}");
    }

    #[test]
    fn a_bad_address_keeps_the_transport_error_as_its_source() {
        let err =
            crate::net::channel("no such\naddress", std::time::Duration::from_secs(1)).unwrap_err();
        assert!(matches!(&err, PsError::Io { what, .. } if what.contains("no such")));
        let source = err.source().expect("a source");
        assert!(
            source.downcast_ref::<tonic::transport::Error>().is_some(),
            "{source:?}"
        );
    }

    #[test]
    fn a_missing_snapshot_keeps_the_checkpoint_error_as_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server_0.safetensors");
        let config = runtime::OptimizerConfig {
            kind: runtime::OptimizerKind::Sgd,
            learning_rate: 0.1,
            weight_decay: 0.0,
        };
        let mut optimizer = runtime::Optimizer::new(config, &[]).unwrap();
        let err = crate::snapshot::load(&path, &[], &mut [], &mut optimizer).unwrap_err();
        assert!(err.to_string().contains("server_0.safetensors"), "{err}");
        let source = err.source().expect("a source");
        assert!(
            source.downcast_ref::<ckpt::CkptError>().is_some(),
            "{source:?}"
        );
    }

    #[test]
    fn only_bad_messages_are_the_callers_fault() {
        assert!(PsError::message("tensor w", "shape [1], expected [2]").is_bad_request());
        assert!(PsError::rows("t", "row id 9 appears twice").is_bad_request());
        assert!(!PsError::invariant("a gradient", "needs rows").is_bad_request());
        assert!(!PsError::io("x", std::io::Error::other("y")).is_bad_request());
    }
}
