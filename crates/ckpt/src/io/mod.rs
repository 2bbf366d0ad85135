//! Byte-level plumbing every layer above uses: atomic file writes ([`atomic_write`]), whether
//! writes reach stable storage ([`durability`]), read-only mappings of file ranges ([`mmap`]),
//! and the registry of this process's unfinished writes that an interrupted command cleans up
//! ([`pending`]).
//!
//! # Architecture invariant
//! Knows files and directories, nothing of tensors, formats or strategies.

pub(crate) mod atomic_write;
pub(crate) mod durability;
pub(crate) mod mmap;
pub(crate) mod pending;
