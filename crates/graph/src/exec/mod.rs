//! Executing ops and graphs on one device.
//!
//! - [`eval_op`]: the single dispatch from an [`crate::Op`] to `tensor::kernels`, on whatever
//!   (local) shapes its tensors have. A per-rank executor reuses it unchanged.
//! - [`Executor`]: a graph's schedule with preallocated, liveness-shared buffers.
//! - [`dropout_mask_keeps`]: the counter-based dropout mask, for anyone who must reproduce it.

mod dropout;
mod eval;
mod executor;
mod one_hot;
mod pieces;
mod reduce_max;
mod select;

pub use self::dropout::{dropout_key, dropout_mask_keeps};
pub use self::eval::{eval_op, EvalCtx, InputBlock, Placement};
pub use self::executor::Executor;
