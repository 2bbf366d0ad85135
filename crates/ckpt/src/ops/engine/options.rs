//! How output files are written ([`WriteOptions`]) and what writing one did ([`FileStats`]),
//! shared by the writing paths ([`super::execute`], [`super::direct`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::plan::OutItem;
use crate::format::Format;
use crate::io::atomic_write::Committer;
use crate::io::durability::Durability;
use crate::progress::Progress;

/// Largest piece of one output tensor assembled in memory at once (64 MiB): large enough that
/// writes are long and sequential, small enough that memory stays far below the checkpoint size.
pub const DEFAULT_CHUNK_BYTES: usize = 64 << 20;

/// How output files are written.
#[derive(Clone, Copy)]
pub struct WriteOptions<'a> {
    /// Output format.
    pub format: Format,
    /// Replace existing destination files.
    pub force: bool,
    /// Append MindSpore's `crc_num` trailer to `.ckpt` output.
    pub crc: bool,
    /// Largest chunk of one tensor assembled in memory.
    pub chunk_bytes: usize,
    /// Where progress goes, and whether to stop ([`Progress::stop_requested`], polled after
    /// every chunk and before the commit).
    pub progress: &'a dyn Progress,
    /// Whether finished files are fsynced before they are renamed into place.
    pub(crate) durability: Durability,
    /// Commit finished files on this background committer instead of inline.
    pub(crate) committer: Option<&'a Committer>,
    /// Output names of renamed tensors (source name → name written); sources are still read
    /// under their own names.
    pub(crate) rename: Option<&'a BTreeMap<String, String>>,
}

impl std::fmt::Debug for WriteOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteOptions")
            .field("format", &self.format)
            .field("force", &self.force)
            .field("crc", &self.crc)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("durability", &self.durability)
            .finish()
    }
}

/// [`WriteOptions`] without the progress sink, which need not be `Sync`: what the threads
/// writing several files at once share ([`super::fan_out`]).
#[derive(Clone, Copy)]
pub(crate) struct WriteSettings<'a> {
    format: Format,
    force: bool,
    crc: bool,
    chunk_bytes: usize,
    durability: Durability,
    committer: Option<&'a Committer>,
    rename: Option<&'a BTreeMap<String, String>>,
}

impl<'a> WriteOptions<'a> {
    /// These options without their progress sink.
    pub(crate) fn settings(&self) -> WriteSettings<'a> {
        WriteSettings {
            format: self.format,
            force: self.force,
            crc: self.crc,
            chunk_bytes: self.chunk_bytes,
            durability: self.durability,
            committer: self.committer,
            rename: self.rename,
        }
    }
}

impl<'a> WriteSettings<'a> {
    /// The options of a write reporting to `progress`.
    pub(crate) fn with_progress(self, progress: &'a dyn Progress) -> WriteOptions<'a> {
        WriteOptions {
            format: self.format,
            force: self.force,
            crc: self.crc,
            chunk_bytes: self.chunk_bytes,
            progress,
            durability: self.durability,
            committer: self.committer,
            rename: self.rename,
        }
    }
}

/// What writing one file did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileStats {
    /// The file written.
    pub path: PathBuf,
    /// Tensors written.
    pub n_tensors: usize,
    /// Bytes of tensor data written.
    pub data_bytes: u64,
}

/// Total bytes of tensor data `items` will write.
pub(crate) fn data_bytes(items: &[OutItem<'_>]) -> u64 {
    items.iter().map(|i| i.meta.n_bytes).sum()
}
