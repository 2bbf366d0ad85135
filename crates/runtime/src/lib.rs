//! Tessera's runtime: running per-rank programs, optimizers, datasets, the training loop and
//! its callbacks.
//!
//! # Architecture invariant
//! The runtime executes what `parallel` planned; it makes no sharding decision of its own.
#![deny(missing_docs)]

mod error;
mod executor;

pub use crate::error::RuntimeError;
pub use crate::executor::RankExecutor;
