//! Elastic collective training (`train.elastic`): every `train.elastic_interval` steps each
//! rank writes its shard of the training state (parameters, optimizer state, step, loss scale;
//! the data position and the random streams are functions of the step) into its node's
//! in-memory store ([`store`]), and a copy into the store of the next node ([`recovery`]). A
//! restarted job gathers what the stores hold, picks the newest snapshot that survived whole,
//! moves the missing files between nodes and resumes from it — converting to the new job's
//! strategy when its ranks changed — so a run that lost a rank continues from its last
//! snapshot, in deterministic mode to the bits of a run that never failed. When no snapshot
//! survived whole (a node and the node holding its copies both lost) the run falls back to the
//! newest periodic checkpoint on disk, saying so.
//!
//! The session does the writing and the exchange (`session::elastic`); this module holds the
//! store, the decisions and the test hook [`fault`].

pub mod fault;
pub mod recovery;
pub mod store;

/// Steps between snapshots when `train.elastic_interval` is not given: at most this many steps
/// are taken again after a failure, and the snapshots cost under 3 % of the GPT example's
/// steps/s (`docs/PERFORMANCE.md`, "Elastic training").
pub const DEFAULT_INTERVAL: u64 = 50;

/// The variable naming this node's store (set by `tessera launch` for every rank).
pub const STORE_VAR: &str = crate::launch_env::ELASTIC_DIR;

/// This process's node store from [`STORE_VAR`]; an error naming `train.elastic` without one.
pub fn node_store() -> Result<store::NodeStore, crate::error::RuntimeError> {
    match std::env::var_os(STORE_VAR) {
        Some(dir) => store::NodeStore::open(dir.into()),
        None => Err(crate::error::RuntimeError::Config {
            key: "train.elastic".to_string(),
            reason: format!(
                "an elastic run keeps its snapshots in the in-memory store `tessera launch` gives each node, and {STORE_VAR} is not set: run it under `tessera launch --nproc N` (or set {STORE_VAR} to a directory on a memory file system)"
            ),
        }),
    }
}
