//! The in-memory models every format reads into and writes from, and every operation plans
//! with: tensor records ([`tensor`]), strategies as read ([`strategy`]) and with their shapes
//! bound ([`resolved`]).
//!
//! Plain data and arithmetic over layouts: nothing here opens a file or knows a format's bytes
//! (the format modules convert at the edge, so a MindSpore record never travels inside a
//! model).

pub(crate) mod resolved;
pub(crate) mod strategy;
pub(crate) mod tensor;

pub use resolved::{ParamLayout, ResolvedParam, ResolvedStrategy};
pub(crate) use strategy::{check_tuple_count, check_unique_ops, MAX_OP_TUPLES};
pub use strategy::{
    OpStrategyRecord, ShapeHint, StagePlacement, Strategy, StrategyFlavour, StrategyParam,
};
pub use tensor::{StoredTensor, StoredType, TensorMeta};
