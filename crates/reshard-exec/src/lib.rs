//! Tessera's reshard executor: runs the plans of the `reshard` planner over a
//! [`comm::Communicator`].
//!
//! # Brief overview
//! - [`ReshardRunner`] runs this rank's part of a [`reshard::ReshardPlan`]: a pending sum is
//!   resolved first (all-reduce or reduce-scatter, in deterministic mode's canonical tree when
//!   asked, half values added as the plan's [`reshard::HalfSum`] says), then the rank copies what
//!   it already holds and the network transfers run as the collectives [`reshard::lower`] found.
//!   It keeps the sub-group communicators it creates, so repeated reshards create none.
//! - [`ReshardRunner::start_into`] / [`ReshardRunner::finish_into`] ([`StartedReshard`]) start a
//!   plan whose network part is one all-gather and finish it later, so that it overlaps compute.
//! - [`PackedReduction`] runs several reductions with one [`reshard::FusionKey`] as one
//!   collective ([`StartedReduction`] when started and finished later).
//! - [`reshard()`] moves a [`DistTensor`] to another layout (plan, then run).
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use comm::{Communicator, LocalCluster};
//! use layout::Layout;
//! use tensor::{DType, Tensor};
//! let mesh = Layout::new(&[2], &["dp"], None)?;
//! let src = mesh.apply(&["dp".into()])?.bind(&[4])?;
//! let dst = mesh.apply(&["None".into()])?.bind(&[4])?;
//! // An all-gather: each of the 2 ranks holds half, and both end with the whole.
//! let plan = reshard::plan(&src, &dst, DType::F32)?;
//! let global = Tensor::from_vec(&[4], vec![1.0f32, 2.0, 3.0, 4.0])?;
//! let results = LocalCluster::new(2)?.run(|comm| {
//!     let rank = comm.rank();
//!     let mut runner = reshard_exec::ReshardRunner::new(Arc::new(comm));
//!     let local = reshard_exec::DistTensor::from_global(&global, &src, rank)?.into_local();
//!     runner.run(&plan, local)
//! });
//! for r in results {
//!     assert_eq!(r??[0], global);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Architecture invariant
//! Only this crate's runner talks to a communicator about reshards; what it runs is decided by
//! the pure `reshard` planner, which does not depend on `comm` (so `ckpt` and `parallel`, which
//! plan, never link a communicator).
#![deny(missing_docs)]

mod error;
mod execute;
mod fuse;
mod started;

pub use crate::error::ExecError;
pub use crate::execute::{reshard, DistTensor, ReshardRunner};
pub use crate::fuse::{PackedReduction, StartedReduction};
pub use crate::started::StartedReshard;
