//! Errors of parameter-server training.

use std::path::PathBuf;

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
    #[error("{call} to {peer} failed after {attempts} attempt(s): {last}")]
    Rpc {
        /// The call (`Pull`).
        call: String,
        /// Who was called (`server 1 at 127.0.0.1:4000`).
        peer: String,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: String,
    },
    /// A message from the network that breaks the protocol (named field and rule).
    #[error("protocol: {0}")]
    Protocol(String),
    /// A snapshot file that cannot be written or read.
    #[error("snapshot {path}: {reason}")]
    Snapshot {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A socket, runtime or child process that could not be set up.
    #[error("{what}: {reason}")]
    Io {
        /// What was being done.
        what: String,
        /// What went wrong.
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
    /// An [`PsError::Io`] for `what`.
    pub fn io(what: impl Into<String>, reason: impl std::fmt::Display) -> PsError {
        PsError::Io {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}

impl From<runtime::ExecError> for PsError {
    /// An executor or optimizer error is a runtime error, as it was before `exec` was split
    /// out of `runtime`.
    fn from(e: runtime::ExecError) -> PsError {
        PsError::Runtime(e.into())
    }
}
