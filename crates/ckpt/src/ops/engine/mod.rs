//! The machinery the operations share: planning an output file ([`plan`]: which pieces of which
//! source files, over a minimal cover of source ranks, [`cover`]), gathering and writing it in
//! bounded chunks ([`gather`], [`execute`], [`direct`] for safetensors output from mapped
//! pages) with [`options`], and writing several files at once ([`fan_out`]).
//!
//! Layered inside: `cover` ← `plan` ← `gather` ← `direct` ← `execute`; nothing here imports an
//! operation.

pub(crate) mod cover;
pub(crate) mod direct;
pub(crate) mod execute;
pub(crate) mod fan_out;
pub(crate) mod gather;
pub(crate) mod options;
pub(crate) mod plan;
