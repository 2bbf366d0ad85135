//! Tessera's reshard engine: moving a tensor from one layout to another with the fewest bytes.
//!
//! # Brief overview
//! - [`plan()`] intersects boxes: every destination slot receives exactly the elements its device
//!   lacks, from the least-loaded source replica, and copies locally what it already holds. The
//!   result, a [`ReshardPlan`], is data: it knows its bytes per rank, its lower bound, and
//!   [`ReshardPlan::explain`] prints every transfer with its reason.
//! - [`source_pieces`] answers the question checkpoint conversion asks: which source slots hold
//!   which part of a region.
//!
//! # Example
//! ```
//! use layout::Layout;
//! use tensor::DType;
//! let src = Layout::new(&[2, 2], &["dp", "tp"], None)?.apply(&["dp".into(), "tp".into()])?.bind(&[8, 8])?;
//! let dst = Layout::new(&[2, 2], &["dp", "tp"], None)?.apply(&["tp".into(), "dp".into()])?.bind(&[8, 8])?;
//! let plan = reshard::plan(&src, &dst, DType::F32)?;
//! assert_eq!(plan.bytes_total(), plan.bytes_lower_bound());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Architecture invariant
//! Planning is pure (layouts in, plan out); only execution talks to a communicator.
#![deny(missing_docs)]

mod error;
mod execute;
mod lower;
mod partial;
mod plan;

pub use crate::error::ReshardError;
pub use crate::execute::{reshard, DistTensor, ReshardRunner};
pub use crate::lower::{lower, Exchange, ExchangeKind};
pub use crate::partial::{DistLayout, ReduceKind, ReduceStep};
pub use crate::plan::{plan, plan_from, source_pieces, ReshardPlan, SourcePiece, Transfer};
