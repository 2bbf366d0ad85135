//! The operations on checkpoints, each one module: converting between strategies
//! ([`convert`], and by named files, [`by_files`]), merging into a unified checkpoint
//! ([`merge`]) and pipeline strategy files into one ([`merge_stages`]), loading ([`load`]),
//! saving for the training runtime ([`save`]), minimal rank lists ([`ranks`]), removing
//! redundant copies ([`dedup`]), checking a checkpoint against its strategy ([`verify`]),
//! comparing two checkpoints ([`diff`]) and recognising a file ([`inspect`]). They share the
//! planning and writing machinery of [`engine`].
//!
//! # Architecture invariant
//! The top layer: operations use the model, the formats, the file sources and checkpoint sets;
//! nothing below imports from here.

pub(crate) mod by_files;
pub(crate) mod convert;
pub(crate) mod dedup;
pub(crate) mod diff;
pub(crate) mod engine;
pub(crate) mod inspect;
pub(crate) mod load;
pub(crate) mod merge;
pub(crate) mod merge_stages;
pub(crate) mod ranks;
pub(crate) mod save;
pub(crate) mod verify;
