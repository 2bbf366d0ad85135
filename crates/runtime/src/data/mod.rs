//! Datasets and the order they are read in.
//!
//! - [`Dataset`]: what a session reads batches through — samples by index, each a row of every
//!   column (an input and a label by default) — and [`feed_rows`], which feeds a rank's rows of
//!   a batch of any data set, each graph input from the column bound to it. The IDX
//!   images and the token windows ([`TokenWindows`]) implement it; so can a caller's data set.
//!
//! - [`IdxDataset`]: an image/label split in MNIST's IDX format. Each rank reads only its share
//!   of a batch, with positioned reads of just those samples; one open dataset can be shared by
//!   every rank thread of a process (reads never move a shared file cursor).
//! - [`BatchPlan`]: for an epoch, the **global** batches as lists of sample indices, the same on
//!   every rank and for every device count: shuffled with a seeded deterministic generator for
//!   training (the last incomplete batch dropped), in order and padded for evaluation (each
//!   [`Batch`] says how many of its rows are real, so accuracy is exact on any device count).
//!
//! - [`TokenCorpus`]: a token stream for language modelling (text by byte or character, plain
//!   or gzip; or a `u16`/`u32` token file), split into training and validation parts, read in
//!   windows whose starts are a pure function of the seed, the epoch and the step. Not yet
//!   wired into the configuration (the GPT model that consumes it comes next).
//!
//! A training step therefore reads: `plan.batch(i)` → this rank's rows of it (the dim-0 range
//! of its input layout box) → [`IdxDataset::read_images`] / [`IdxDataset::read_labels`].

mod batch;
mod dataset;
mod idx;
mod text;

pub use self::batch::{Batch, BatchPlan};
pub(crate) use self::dataset::column_of;
pub use self::dataset::{feed_rows, Dataset, SampleSpec, TokenWindows};
pub use self::idx::{IdxDataset, Normalize, Split};
pub use self::text::{TokenCorpus, TokenDtype, TokenSplit, Tokenizer, MAX_TEXT_BYTES};
