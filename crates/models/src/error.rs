//! Errors of building a model or its strategies.

use thiserror::Error;

/// Why a model or its strategies could not be built.
#[derive(Debug, Error)]
pub enum ModelsError {
    /// A configuration value breaks a rule; `key` names the setting (`model.heads`).
    #[error("{key}: {reason}")]
    Config {
        /// The setting, as the config file spells it.
        key: String,
        /// The rule broken.
        reason: String,
    },
    /// Building the graph failed.
    #[error(transparent)]
    Graph(#[from] graph::GraphError),
}
