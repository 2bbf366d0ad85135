//! Tessera's benchmark harnesses: `tessera bench …` parses its arguments into one of this
//! crate's requests and calls one function, which measures and returns a report.
//!
//! Every benchmark times Tessera next to its baseline in the same run (`cp -r` and `sync` for
//! checkpoint conversion, the MPI library's own collectives, all-reduce data parallelism for
//! the parameter server, …) and reports medians with their spread. Figures go in
//! `docs/PERFORMANCE.md` with the command that produced them; no test asserts a time.
//!
//! A report is data (the measured times and sizes) whose `Display` is the text `tessera bench`
//! prints. A long benchmark hands each finished piece of its report (a header, a row) to a
//! [`Progress`] as soon as it is measured, so a caller can show it at once; the pieces, in
//! order, are the report's text. This crate never writes to stdout or stderr itself.
//!
//! A caller whose report has nowhere to go any more (the reader of a pipe gone, a full disk)
//! says so through [`Progress::stop`]: the benchmark stops at its next step or round (a row, a
//! repetition, a trial), still removing what it created and stopping what it started, and
//! returns [`BenchError::Stopped`].
//!
//! - [`memcpy`]: single-thread copy bandwidth, the ceiling of every copy.
//! - [`ckpt_convert`]: checkpoint conversion next to `cp -r` (+ `sync`).
//! - [`collectives`]: bus bandwidth of all-reduce and all-gather over a `comm` backend.
//! - [`reshard`]: time and bytes of resharding between layouts; [`reshard_check`] runs a
//!   reshard plan on local ranks and checks every rank's result (`tessera reshard --run`).
//! - [`train_step`] and [`gpt_step`]: training-step time of the seed MLP and of the GPT;
//!   [`gpt_paced`]: the GPT's 1-rank step paced line by line by a driver that alternates it
//!   with another engine's.
//! - [`ps`] and [`ps_embedding`]: parameter-server steps/s, recovery times and embedding bytes.
//! - [`elastic`]: recovery time and snapshot cost of elastic collective training (real
//!   processes under `tessera launch`).
//! - [`profile`]: this machine measured as a device profile for the searches.
//!
//! # Architecture invariant
//! Harnesses only: every number measured here comes from running the library crates' public
//! API; nothing a benchmark needs is implemented here instead of in the crate it measures.
#![deny(missing_docs)]

use std::fmt;

pub mod ckpt_convert;
pub mod collectives;
pub mod elastic;
mod error;
pub mod gpt_paced;
pub mod gpt_step;
pub mod machine;
pub mod memcpy;
pub mod mfu;
pub mod profile;
pub mod ps;
pub mod ps_embedding;
pub mod reshard;
pub mod reshard_check;
pub mod timing;
pub mod train_step;

pub use crate::error::BenchError;

/// Where a running benchmark shows its report as it is measured.
///
/// `Send`, because a multi-rank benchmark reports from the thread of its rank 0.
pub trait Progress: Send {
    /// A finished piece of the report (a header, a row, a closing line), in report order; the
    /// pieces together are the report's text.
    fn piece(&mut self, piece: &dyn fmt::Display);
    /// What runs now, not part of the report (`generating the source…`).
    fn note(&mut self, note: &dyn fmt::Display);
    /// Whether the benchmark should stop at its next step or round because its report has
    /// nowhere to go (the reader of a pipe gone, a full disk). A benchmark asked to stop
    /// removes what it created, stops what it started and returns [`BenchError::Stopped`]
    /// (one that cannot fail returns the report so far). Never, unless a caller says so.
    fn stop(&mut self) -> bool {
        false
    }
}

/// [`BenchError::Stopped`] when `progress` asks the benchmark to stop, else `Ok`: called at
/// every step or round.
pub(crate) fn go_on(progress: &mut dyn Progress) -> Result<(), BenchError> {
    if progress.stop() {
        Err(BenchError::Stopped)
    } else {
        Ok(())
    }
}

/// A [`Progress`] that shows nothing: for callers that only want the returned report.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Progress for Silent {
    fn piece(&mut self, _: &dyn fmt::Display) {}

    fn note(&mut self, _: &dyn fmt::Display) {}
}

/// A report made of pieces in the order they were measured; its text is theirs, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Pieces<T>(pub Vec<T>);

impl<T> Default for Pieces<T> {
    fn default() -> Pieces<T> {
        Pieces(Vec::new())
    }
}

impl<T: fmt::Display> Pieces<T> {
    /// Shows `piece` and adds it to the report; [`BenchError::Stopped`] when `progress` then
    /// asks the benchmark to stop.
    pub(crate) fn show(&mut self, progress: &mut dyn Progress, piece: T) -> Result<(), BenchError> {
        progress.piece(&piece);
        self.0.push(piece);
        go_on(progress)
    }
}

impl<T: fmt::Display> fmt::Display for Pieces<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|piece| piece.fmt(f))
    }
}

/// What the unit tests share.
#[cfg(test)]
pub(crate) mod testing {
    use std::fmt;

    /// A [`crate::Progress`] that keeps the text of every piece shown.
    #[derive(Default)]
    pub(crate) struct Record(pub String);

    impl crate::Progress for Record {
        fn piece(&mut self, piece: &dyn fmt::Display) {
            self.0.push_str(&piece.to_string());
        }

        fn note(&mut self, _: &dyn fmt::Display) {}
    }

    /// A [`crate::Progress`] whose reader goes away after `pieces` pieces: it keeps their text
    /// and asks the benchmark to stop from then on.
    pub(crate) struct GoneAfter {
        /// Pieces shown before the reader went away.
        pub pieces: usize,
        /// The text of the pieces shown, every one (also those after the stop was asked).
        pub shown: Vec<String>,
        /// How often the benchmark asked whether to stop.
        pub asked: usize,
    }

    impl GoneAfter {
        /// A reader that goes away after `pieces` pieces.
        pub(crate) fn new(pieces: usize) -> GoneAfter {
            GoneAfter {
                pieces,
                shown: Vec::new(),
                asked: 0,
            }
        }
    }

    impl crate::Progress for GoneAfter {
        fn piece(&mut self, piece: &dyn fmt::Display) {
            self.shown.push(piece.to_string());
        }

        fn note(&mut self, _: &dyn fmt::Display) {}

        fn stop(&mut self) -> bool {
            self.asked += 1;
            self.shown.len() >= self.pieces
        }
    }
}
