//! Executing ops and graphs on one device.
//!
//! - [`eval_op`]: the single dispatch from an [`crate::Op`] to `tensor::kernels`, on whatever
//!   (local) shapes its tensors have. A per-rank executor reuses it unchanged.
//! - [`eval_in_place`]: the ops computed over a dying input's buffer.
//! - [`eval_product_with_bias`]: a product and the bias add over its output as one kernel.
//! - [`eval_with_bias_grad`], [`eval_in_place_with_bias_grad`]: an elementwise op and the bias
//!   gradient over its output in one pass.
//! - [`Executor`]: a graph's schedule with preallocated, liveness-shared buffers.
//! - [`dropout_mask_keeps`]: the counter-based dropout mask, for anyone who must reproduce it.

/// Runs `$body` with `$ids` bound to the i32 or i64 entries of `$tensor`.
macro_rules! with_ids {
    ($tensor:expr, $ctx:expr, $op:expr, |$ids:ident| $body:expr) => {
        match $tensor.storage() {
            Storage::I32(v) => {
                let $ids = v.as_slice();
                $body
            }
            Storage::I64(v) => {
                let $ids = v.as_slice();
                $body
            }
            other => Err(GraphError::InputDType {
                node: $ctx.node.to_string(),
                op: $op.kind(),
                value: "indices".to_string(),
                got: other.dtype(),
                expected: "integer indices (i32 or i64)".to_string(),
            }),
        }
    };
}

mod attention;
mod bias_grad;
mod deterministic;
mod dropout;
mod epilogue;
mod eval;
mod executor;
mod in_place;
mod moe_route;
mod one_hot;
mod operands;
mod pieces;
mod reduce_max;
mod select;

pub use self::bias_grad::{eval_in_place_with_bias_grad, eval_with_bias_grad};
pub use self::dropout::{dropout_key, dropout_mask_keeps};
pub use self::epilogue::eval_product_with_bias;
pub use self::eval::{eval_op, EvalCtx, InputBlock, Placement};
pub use self::executor::Executor;
pub use self::in_place::eval_in_place;
