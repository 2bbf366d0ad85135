//! The one error type of the search crate.

use std::path::PathBuf;

use parallel::ParallelError;

use crate::cost::ProfileError;

/// Everything that can stop a plan: a rule of the parallel pass, a memory budget no plan fits,
/// a bad device profile, a bad plan setting, or the caller's model failing to rebuild.
///
/// Messages name the setting, file or op and the rule broken, as the configuration errors
/// of the runtime do (the runtime converts this type into its own, keeping the message).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SearchError {
    /// The parallel pass rejected a strategy, a setting or an op (while building the problem,
    /// costing a candidate or checking the dataset strategy).
    #[error(transparent)]
    Parallel(#[from] ParallelError),
    /// No plan fits the device memory.
    #[error(
        "no strategy fits in {available} bytes of device memory ({profile}): the smallest plan \
         needs {needed} bytes per device; raise parallel.max_device_memory (or pick a profile \
         with more memory) to at least {needed} bytes, or use more devices"
    )]
    MemoryExceeded {
        /// Bytes per device the smallest plan needs.
        needed: u64,
        /// Bytes per device available.
        available: u64,
        /// The device profile.
        profile: String,
    },
    /// A device profile whose figures are out of range (a search checks it first).
    #[error("parallel.device_profile: profile {profile}: {source}")]
    InvalidProfile {
        /// The profile's name.
        profile: String,
        /// The figure out of range.
        #[source]
        source: ProfileError,
    },
    /// A cost the model computed from the device profile that is not a finite number (an
    /// infinite or NaN time or size): the searches refuse it rather than choose or print a plan
    /// on it. `what` names the op (and the strategy, or the edge) it was computed for.
    #[error(
        "parallel.device_profile: profile {profile}: {what} is {value}, not a finite \
         number: the profile's rates and latencies are outside what the cost model can use"
    )]
    NonFiniteCost {
        /// The profile's name.
        profile: String,
        /// What was costed (`the compute time of op x under strategy [[1, 1]]`).
        what: String,
        /// The value computed.
        value: f64,
    },
    /// A device profile file that is malformed: the file, the key and the rule broken.
    #[error("{} ({key}): {reason}", path.display())]
    ProfileFile {
        /// The file.
        path: PathBuf,
        /// The key (`matmul[0].flops_per_s`, `(syntax, line 3)`, `(file)`).
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A device profile file that cannot be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A plan setting that cannot be followed (`parallel.auto_pipeline`,
    /// `parallel.load_operator_strategy_file`, `parallel.mode`): the key and the rule broken.
    #[error("config {key}: {reason}")]
    Config {
        /// The key, `section.key`.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The caller's model could not be rebuilt for one micro-batch
    /// ([`crate::PlanModel::with_batch_size`]); the caller's own error is the source.
    #[error("rebuilding the model for one micro-batch: {0}")]
    Model(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl SearchError {
    /// Whether the error is the device profile's (out of range, or costs that are not
    /// finite): no other stage count or candidate can avoid it, so a search trying several
    /// reports it as it is.
    pub(crate) fn is_profile_fault(&self) -> bool {
        matches!(
            self,
            SearchError::InvalidProfile { .. } | SearchError::NonFiniteCost { .. }
        )
    }
}
