//! Tessera's automatic parallel (MindSpore's `AUTO_PARALLEL`): the cost model and device
//! profiles, the strategy searches over a graph's forward ops, and pipeline auto-staging. One
//! entry: a plan request in, a plan out.
//!
//! # Brief overview
//! - [`plan`]: the entry. A [`PlanRequest`] names the model ([`PlanModel`]: its graph, its own
//!   candidate strategies, how to rebuild it for one micro-batch), the [`parallel::ParallelConfig`]
//!   (its mode picks the algorithm, its `[parallel.shard]` strategies stay fixed), the device
//!   profile and memory budget, and where the strategies come from ([`Strategies`]: searched,
//!   loaded from an operator strategy file, or configured and only costed). The
//!   [`PlanReport`] holds every forward op's strategy, the predicted cost of one step and the
//!   pipeline chosen (`parallel.auto_pipeline`, [`PipelinePlan`]);
//!   [`PlanReport::apply_to`] puts it into the parallel configuration, placed then as
//!   `semi_auto` places a user's strategies.
//! - [`cost`]: [`DeviceProfile`]s and the α–β times of collectives; [`profiles`]: the built-in
//!   profiles from public figures; [`device_profile`]: the profile TOML files (`tessera bench
//!   profile` writes them, `parallel.device_profile` reads them).
//! - The forward ops of a graph become a [`SearchProblem`]: per op its candidate strategies
//!   (from its sharding rule), each costed ([`Evaluated`]: compute, communication inside the
//!   op, memory), and per pair of connected ops the redistribution time of every pair of
//!   choices. Forward and backward are both counted: an op's backward runs on its device
//!   matrix, so its cost follows from the forward choice.
//! - [`search()`] solves it with one of three algorithms ([`SearchMode`]): sharding
//!   propagation, recursive bisection (forking over the order of batch and model halvings), or
//!   dynamic programming by graph elimination (exact on series-parallel graphs, otherwise
//!   approximate with a reported gap). All keep the memory per device under the budget, or
//!   fail naming the least memory that would do ([`SearchError::MemoryExceeded`]).
//! - [`search_deterministic`]: [`search()`] for a run in deterministic mode: every searched op
//!   keeps only the candidates whose summed-dim splits (of the op and of its backward ops) the
//!   canonical blocks can serve ([`parallel::check_deterministic_strategy`]); [`plan`] uses it
//!   when the [`parallel::ParallelConfig`] is deterministic.
//! - [`anchored_strategies`]: the strategies of ops whose operands are laid out by the caller
//!   (functional `shard`), from which sharding propagation places the rest.
//!
//! # Example
//! ```
//! use search::{profiles, search, SearchMode, SearchRequest};
//! let model = graph::models::seed_mlp(8, &[4, 4], 8, 4).unwrap();
//! let profile = profiles::built_in("h100-nvlink-ib").unwrap();
//! let request = SearchRequest {
//!     mode: SearchMode::DynamicProgramming,
//!     profile: &profile,
//!     devices: 4,
//!     memory_budget: None,
//!     optimizer_states: 2,
//!     fixed: Default::default(),
//!     hints: Default::default(),
//!     time_budget: None,
//!     only: None,
//! };
//! let found = search(&model.graph, &request)?;
//! assert_eq!(found.strategies.len(), found.n_ops);
//! # Ok::<(), search::SearchError>(())
//! ```
//!
//! # Architecture invariant
//! Plans only, from split factors: the searches never see meshes or ranks, so the work grows
//! with the ops and their candidates, never with the devices. The clock is read only for
//! dynamic programming's deadline and to report the search's own time (`search_ms`); nothing
//! it decides depends on it but the deadline. The only file read is a device profile named by
//! path. It knows
//! neither the training configuration, the built-in networks nor the checkpoint formats: the
//! caller builds the model ([`PlanModel`]) and reads operator strategy files
//! ([`LoadedStrategies`]).
#![deny(missing_docs)]

mod anchors;
mod budget;
mod candidates;
pub mod cost;
pub mod device_profile;
mod elimination;
mod error;
mod evaluate;
mod exhaustive;
mod footprint;
mod greedy;
mod held;
mod pipeline;
mod plan;
mod problem;
pub mod profiles;
mod recursive;
mod solve;

pub use parallel::SearchMode;

pub use crate::anchors::{anchored_strategies, Anchor};
pub use crate::candidates::{batch_splits, candidates};
pub use crate::cost::{DeviceProfile, Link, LocalLink, MatmulRate, ProfileError};
pub use crate::error::SearchError;
pub use crate::evaluate::{
    evaluate, evaluate_on_stage, redistribution, EvalSettings, Evaluated, Split,
};
pub use crate::exhaustive::{brute_force, MAX_COMBINATIONS};
pub use crate::footprint::{plan_memory, MemoryEstimate};
pub use crate::held::HeldValues;
pub use crate::pipeline::PipelinePlan;
pub use crate::plan::{
    plan, Hints, LoadedLayouts, LoadedOp, LoadedStrategies, PlanModel, PlanReport, PlanRequest,
    Strategies,
};
pub use crate::problem::{PlanCost, SearchEdge, SearchNode, SearchProblem};
pub use crate::solve::{
    evaluate_strategies, search, search_deterministic, SearchRequest, SearchResult,
};
