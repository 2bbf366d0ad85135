//! Where tensors are read from: one checkpoint file of either format, indexed once and read by
//! positioned reads ([`CheckpointFile`]); the per-rank files of a checkpoint directory
//! ([`RankFiles`]); and a set of source files an operation reads, opened once each
//! ([`SourceSet`]).
//!
//! # Architecture invariant
//! Above the formats (it opens a file in the format the detection step or its name gives, and
//! checks a set's marker), below the operations: nothing here plans or writes.

pub(crate) mod box_runs;
pub(crate) mod file;
pub(crate) mod rank_dir;
pub(crate) mod source_set;

pub use file::CheckpointFile;
pub use rank_dir::{rank_file_path, RankFiles};
pub use source_set::SourceSet;
