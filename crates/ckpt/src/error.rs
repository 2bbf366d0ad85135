//! The one error type of the checkpoint crate.
//!
//! Every variant names its culprit in the payload: the file, the tensor and the rule that was
//! broken, so the message can be shown to a user as is. Variants are grouped by category: I/O,
//! checkpoint sets, encryption, safetensors, MindSpore `.ckpt`, protobuf and strategy files,
//! checkpoint directories and operations (requests that break a rule), recognising files, a
//! stop the caller asked for, and internal faults (a bug, not bad input). An underlying error is kept as the `source`.

use std::path::PathBuf;

use layout::LayoutError;
use tensor::DType;

/// Everything that can go wrong reading, writing or converting a checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CkptError {
    // ---------------------------------------------------------------- I/O
    /// An operating-system error while touching `path`.
    #[error("{path}: {op} failed: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What we were doing (`open`, `read`, `write`, `rename`, …).
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A destination file exists and `force` was not given.
    #[error(
        "{path}: the destination exists; refusing to overwrite it (pass --force to replace it)"
    )]
    DestinationExists {
        /// The existing file.
        path: PathBuf,
    },

    /// Another process holds the destination's lock.
    #[error("{path}: another writer holds this destination ({holder}); wait for it to finish or write elsewhere")]
    DestinationLocked {
        /// The destination.
        path: PathBuf,
        /// Who holds the lock, as it recorded itself.
        holder: String,
    },
    /// A destination or file name that would leave the destination directory, or overwrite the
    /// source.
    #[error("{path}: {rule}")]
    UnsafeDestination {
        /// The offending path.
        path: PathBuf,
        /// The rule broken.
        rule: String,
    },

    // ---------------------------------------------------------------- checkpoint sets
    /// A set marker that cannot be read.
    #[error("{path}: invalid checkpoint-set marker: {reason}")]
    InvalidSet {
        /// The marker file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A directory holding a set that was never committed.
    #[error("{path}: uncommitted checkpoint set: {reason}")]
    UncommittedSet {
        /// The directory.
        path: PathBuf,
        /// Why it is uncommitted.
        reason: String,
    },
    /// A directory whose files disagree with its set marker.
    #[error(
        "{path}: mixed checkpoint set (the marker says set {id}): {reason}; refusing to read it"
    )]
    MixedSet {
        /// The directory.
        path: PathBuf,
        /// The marker's set id.
        id: String,
        /// The disagreement.
        reason: String,
    },

    /// A source directory that a writer replaced with another set while it was being read, so
    /// its files may come from two sets; or that was removed meanwhile (`removed`: a periodic
    /// set pruned by `keep_checkpoint_max`, say), so its remaining files cannot be read.
    #[error(
        "{path}: the checkpoint set was {} while it was being read{}",
        if *removed { "removed" } else { "replaced" },
        if *removed {
            " (deleted or moved away, e.g. an older periodic set pruned by output.keep_checkpoint_max), so its remaining files cannot be read: read a set that is kept"
        } else {
            " (another writer committed a new set into this directory), so its files may come from two sets; refusing to read it: run again once the writer is done"
        }
    )]
    SetReplaced {
        /// The directory.
        path: PathBuf,
        /// The directory is gone, rather than another set in its place.
        removed: bool,
    },

    // ---------------------------------------------------------------- encryption
    /// An encrypted `.ckpt` file that cannot be decrypted with the key and mode given (or a
    /// plain file read with a key, or a bad key).
    #[error("{path}: cannot decrypt the checkpoint: {reason}")]
    Decrypt {
        /// The file.
        path: PathBuf,
        /// What went wrong (wrong key or mode, tampered data, wrong key length, …).
        reason: String,
    },

    // ---------------------------------------------------------------- safetensors
    /// The file is shorter than the 8-byte header length, or than the header it announces.
    #[error("{path}: truncated safetensors file: {reason}")]
    SafetensorsTruncated {
        /// The file.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The announced JSON header is larger than the cap.
    #[error("{path}: safetensors header of {size} bytes exceeds the {max}-byte limit")]
    HeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// Announced size.
        size: u64,
        /// The cap.
        max: u64,
    },
    /// The JSON header does not parse or has the wrong shape.
    #[error("{path}: invalid safetensors header: {reason}")]
    InvalidHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's dtype name is not one Tessera stores.
    #[error("{path}: tensor {} has dtype {dtype:?}, which is not supported (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL)", quoted(.tensor))]
    UnknownDType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype name found.
        dtype: String,
    },
    /// A tensor's shape times its element size overflows.
    #[error("{path}: tensor {} has shape {shape:?}, whose byte size overflows 64 bits", quoted(.tensor))]
    ShapeOverflow {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shape.
        shape: Vec<u64>,
    },
    /// `data_offsets` that leave a hole, overlap, run backwards or do not start at 0.
    #[error("{path}: tensor {}: data_offsets {offsets:?} break the rule that tensors tile the data buffer without holes or overlaps (expected to start at byte {expected_start})", quoted(.tensor))]
    InvalidOffsets {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its offsets.
        offsets: [u64; 2],
        /// Where it should have started.
        expected_start: u64,
    },
    /// `data_offsets` length disagrees with dtype × shape.
    #[error("{path}: tensor {} is {dtype} of shape {shape:?} = {expected} bytes, but its data_offsets span {got} bytes", quoted(.tensor))]
    TensorByteLength {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: DType,
        /// Its shape.
        shape: Vec<usize>,
        /// Bytes dtype × shape needs.
        expected: u64,
        /// Bytes the offsets give.
        got: u64,
    },
    /// The data buffer's length disagrees with the last tensor's end.
    #[error("{path}: the data buffer holds {actual} bytes but the header describes {described} (trailing garbage or a truncated file)")]
    DataLength {
        /// The file.
        path: PathBuf,
        /// Bytes described by the header.
        described: u64,
        /// Bytes present after the header.
        actual: u64,
    },

    // ---------------------------------------------------------------- protobuf (.ckpt, strategy, group info)
    /// Bytes that are not valid protobuf wire format.
    #[error("{path}: malformed protobuf at byte {offset}: {reason}")]
    Protobuf {
        /// The file.
        path: PathBuf,
        /// Byte offset of the fault.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A `.ckpt` value that breaks MindSpore's checkpoint rules.
    #[error("{path}: tensor {}: {rule}", quoted(.tensor))]
    CkptValue {
        /// The file.
        path: PathBuf,
        /// The value's tag.
        tensor: String,
        /// The rule broken.
        rule: String,
    },
    /// The `crc_num` trailer does not match the file's contents.
    #[error("{path}: CRC32 check failed: the file stores crc_num {stored:#010x} but its contents hash to {computed:#010x}")]
    CrcMismatch {
        /// The file.
        path: PathBuf,
        /// CRC stored in the file.
        stored: u64,
        /// CRC computed over the contents.
        computed: u32,
    },

    // ---------------------------------------------------------------- strategy and group-info files
    /// A strategy file that cannot be read as any known flavour, or breaks a file-level rule.
    #[error("{path}: invalid strategy file: {reason}")]
    InvalidStrategy {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// One parameter of a strategy breaks a rule.
    #[error("{path}: parameter {}: {rule}", quoted(.tensor))]
    StrategyParam {
        /// The strategy file.
        path: PathBuf,
        /// The parameter.
        tensor: String,
        /// The rule broken.
        rule: String,
    },
    /// A layout that the layout algebra rejects, for one parameter.
    #[error("{path}: parameter {}: {source}", quoted(.tensor))]
    Layout {
        /// The strategy file (or the operation's name when no file is involved).
        path: PathBuf,
        /// The parameter.
        tensor: String,
        /// The layout error.
        source: LayoutError,
    },
    /// A group-info file without `ckpt_restore_rank_list`.
    #[error("{path}: the group-info file has no ckpt_restore_rank_list (MindSpore silently returns [] here)")]
    MissingRestoreList {
        /// The file.
        path: PathBuf,
    },

    // ---------------------------------------------------------------- checkpoint directories and operations
    /// A source directory without any `rank_<N>/` checkpoint.
    #[error("{path}: no rank_<N>/ directory with a .ckpt or .safetensors file")]
    NoRankDirs {
        /// The directory.
        path: PathBuf,
    },
    /// Two rank directories whose numbers are the same rank (`rank_0/` and `rank_00/`), each
    /// holding a checkpoint: which one is that rank's would depend on the directory listing.
    #[error("{path}: {first}/ and {second}/ both name rank {rank}, and each holds a checkpoint; keep one")]
    DuplicateRankDir {
        /// The directory holding them.
        path: PathBuf,
        /// The rank.
        rank: usize,
        /// One directory's name (the smaller).
        first: String,
        /// The other's.
        second: String,
    },
    /// A rank the operation needs is missing from the source directory.
    #[error("{path}: source rank {rank} is needed but rank_{rank}/ holds no checkpoint file")]
    MissingRank {
        /// The source directory.
        path: PathBuf,
        /// The rank.
        rank: usize,
    },
    /// Rank folders the strategy has no rank for, holding data it does not account for (a
    /// strategy for fewer devices than the checkpoint was saved on).
    #[error("{path}: holds rank folders {extra:?}, but {strategy} describes only {n_ranks} ranks (0..{n_ranks}) and {reason}; a strategy must match the checkpoint's device count")]
    RankCountMismatch {
        /// The checkpoint directory.
        path: PathBuf,
        /// The strategy file.
        strategy: PathBuf,
        /// The strategy's rank count.
        n_ranks: usize,
        /// Rank folders beyond it holding data the strategy does not account for.
        extra: Vec<usize>,
        /// What the first of them holds.
        reason: String,
    },
    /// `.ckpt` and `.safetensors` files mixed in one checkpoint.
    #[error(
        "{path}: mixes files of two formats ({detail}); they must all use one (.ckpt or .safetensors checkpoints; protobuf or JSON strategy files)"
    )]
    MixedFormats {
        /// The directory.
        path: PathBuf,
        /// Which files.
        detail: String,
    },
    /// A tensor the strategy places on a rank is missing from that rank's file.
    #[error("{path}: tensor {} is not in this file, but {rule}", quoted(.tensor))]
    TensorMissing {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Why it was expected.
        rule: String,
    },
    /// A tensor whose stored shape disagrees with the strategy.
    #[error("{path}: tensor {} has shape {found:?} but the strategy gives this rank a slice of shape {expected:?}", quoted(.tensor))]
    SliceShape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Shape the strategy implies.
        expected: Vec<usize>,
        /// Shape stored.
        found: Vec<usize>,
    },
    /// A tensor whose dtype disagrees between files, or with the strategy.
    #[error("{path}: tensor {} is {found} but {expected} was expected ({reason})", quoted(.tensor))]
    DTypeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Dtype expected.
        expected: DType,
        /// Dtype found.
        found: DType,
        /// Where the expectation comes from.
        reason: String,
    },
    /// The global shape of a parameter cannot be determined, or two sources disagree on it.
    #[error("parameter {}: {reason}", quoted(.tensor))]
    GlobalShape {
        /// The parameter.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor that a target format cannot hold (e.g. a MindSpore string in safetensors).
    #[error("{path}: tensor {}: {reason}", quoted(.tensor))]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Why.
        reason: String,
    },
    /// A checkpoint file name whose extension names no checkpoint format.
    #[error("{path}: {what} must end in .ckpt or .safetensors")]
    UnknownExtension {
        /// The file.
        path: PathBuf,
        /// Which name it is (`a checkpoint file name`, `the output name`).
        what: &'static str,
    },
    /// A directory without any file of the kind an operation reads.
    #[error("{path}: no {what}")]
    NoFiles {
        /// The directory.
        path: PathBuf,
        /// What was looked for (`.ckpt or .safetensors file`, …).
        what: &'static str,
    },
    /// A conversion by file given no source file.
    #[error("no source checkpoint file was given")]
    NoSourceFiles,
    /// A conversion without a source strategy (an unsharded source) given other files than
    /// one, as rank 0.
    #[error("without a source strategy the source is unsharded: it must hold rank 0 alone (one file, or one rank_0/ folder), but it holds ranks {ranks:?}; give the strategy a sharded checkpoint was saved with (--src-strategy)")]
    UnshardedSource {
        /// The ranks given.
        ranks: Vec<usize>,
    },
    /// Source files given per rank (MindSpore's `checkpoint_filenames`, one per training rank
    /// in rank order, or `checkpoint_files_map`, rank → file) that do not fit the ranks of the
    /// strategy they were saved under: too few or too many, a rank without a file, a rank past
    /// the strategy's devices holding data it does not account for, one file for two ranks
    /// holding different data.
    #[error("{argument}: {rule}")]
    RankFileList {
        /// The argument at fault (`checkpoint_filenames`, `checkpoint_files_map`).
        argument: &'static str,
        /// The rule broken, with the counts given and needed and the strategy file.
        rule: String,
    },
    /// A directory read as a unified checkpoint that is not one.
    #[error("{path}: not a unified checkpoint")]
    NotUnified {
        /// The directory.
        path: PathBuf,
    },
    /// A rank asked for that the destination strategy does not have.
    #[error("rank {rank} is not a destination rank ({})", destination_ranks(ranks))]
    NotADestinationRank {
        /// The rank asked for.
        rank: usize,
        /// The destination's ranks.
        ranks: Vec<usize>,
    },
    /// One tensor given twice to be saved into one file.
    #[error("{path}: tensor {} given twice", quoted(.tensor))]
    DuplicateTensor {
        /// The file being written.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// One parameter listed twice in a strategy.
    #[error("parameter {} appears twice in a strategy", quoted(.tensor))]
    DuplicateParam {
        /// The parameter.
        tensor: String,
    },
    /// A parameter whose layout holds several slices per device, which a per-rank checkpoint
    /// cannot store.
    #[error("parameter {}: interleaved_parallel layouts hold several slices per device and cannot be stored in a per-rank checkpoint", quoted(.tensor))]
    InterleavedLayout {
        /// The parameter.
        tensor: String,
    },
    /// An option given a value it does not accept.
    #[error("{option}: {rule}")]
    InvalidOption {
        /// The option (MindSpore's argument name: `split_dst_file`, `dec_mode`, …).
        option: &'static str,
        /// The rule broken, with the value given.
        rule: String,
    },
    /// A `file_suffix` that picks no single file in a rank directory.
    #[error("{path}: file_suffix {suffix:?}: {reason}; set file_suffix to the longest common suffix of the files to merge")]
    FileSuffix {
        /// The rank directory.
        path: PathBuf,
        /// The suffix given.
        suffix: String,
        /// Why it picks no single file.
        reason: String,
    },
    /// A `choice_func` that gives two parameters the same output name.
    #[error("choice_func gives {} and {} the same name {}", quoted(.first), quoted(.second), quoted(.name))]
    DuplicateOutputName {
        /// The first parameter.
        first: String,
        /// The second parameter.
        second: String,
        /// The name both get.
        name: String,
    },
    /// A `choice_func` that failed on a parameter.
    #[error("choice_func({}) failed: {source}", quoted(.param))]
    ChoiceFunc {
        /// The parameter it was called with.
        param: String,
        /// Its failure.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A plain `.ckpt` file to be encrypted that is encrypted already.
    #[error("{path}: the file is already encrypted")]
    AlreadyEncrypted {
        /// The file.
        path: PathBuf,
    },
    /// An empty destination path.
    #[error("the destination path is empty")]
    EmptyDestination,
    /// A committed set whose old directory keeps entries that could not be moved back.
    #[error("the new set is committed in {path}, but {} could not be moved back into it from the old directory, which is kept at {kept}", entries.join(", "))]
    OldSetKept {
        /// The destination, holding the new set.
        path: PathBuf,
        /// The old directory, kept.
        kept: PathBuf,
        /// The entries left in it.
        entries: Vec<String>,
    },

    // ---------------------------------------------------------------- recognising files
    /// A file whose bytes match no format Tessera reads.
    #[error("{path}: matches no format Tessera reads ({n_bytes} bytes): {}", ruled_out.join("; "))]
    UnknownFormat {
        /// The file.
        path: PathBuf,
        /// Its size.
        n_bytes: u64,
        /// Each format family and why it was ruled out.
        ruled_out: Vec<String>,
    },
    /// A file that starts like one format but does not parse as it.
    #[error("{path}: matches no format Tessera reads ({n_bytes} bytes): it starts like a {format} ({evidence}), but reading it as one fails: {source}")]
    NotParsedAs {
        /// The file.
        path: PathBuf,
        /// Its size.
        n_bytes: u64,
        /// The format it starts like (a [`crate::FileFormat`], named).
        format: String,
        /// What it starts with.
        evidence: String,
        /// The reader's error.
        source: Box<CkptError>,
    },
    /// A file of a format `inspect` does not list.
    #[error("{path}: a {format} ({evidence}); inspect lists checkpoints, strategy files and group-info files")]
    NotInspectable {
        /// The file.
        path: PathBuf,
        /// Its format (a [`crate::FileFormat`], named).
        format: String,
        /// What it starts with.
        evidence: String,
    },

    // ---------------------------------------------------------------- a stop the caller asked for
    /// An operation that stopped because its progress sink asked it to
    /// ([`crate::Progress::stop_requested`]): before its commit, having removed everything it
    /// created (a split merge keeps the part files it committed before, as after any failure).
    #[error("stopped at the progress sink's request, before the output was committed (the files staged for it were removed)")]
    Stopped,

    // ---------------------------------------------------------------- internal faults (a bug, not bad input)
    /// A worker thread that panicked.
    #[error("{thread} panicked")]
    ThreadPanicked {
        /// Which thread (`the writing thread`, …).
        thread: &'static str,
    },
    /// A worker thread that stopped before its work was handed over (its own error, if any,
    /// is reported when it is joined).
    #[error("{thread} stopped")]
    ThreadStopped {
        /// Which thread.
        thread: &'static str,
    },
    /// A plan whose pieces do not tile what they should fill.
    #[error("internal error: the pieces of {} {rule}", quoted(.tensor))]
    PlanMismatch {
        /// The tensor.
        tensor: String,
        /// What does not add up.
        rule: String,
    },
    /// A file job of a parallel write that neither ran nor failed.
    #[error("internal error: file job {job} neither ran nor failed")]
    JobNotRun {
        /// The job's index.
        job: usize,
    },
    /// More bytes handed to a file writer than its tensors hold.
    #[error("{path}: more data written than the tensors described")]
    WrittenPastEnd {
        /// The file.
        path: PathBuf,
    },
    /// More bytes handed to a file writer for one tensor than it holds.
    #[error("{path}: tensor {} got more than its {n_bytes} bytes", quoted(.tensor))]
    TensorOverrun {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its size.
        n_bytes: u64,
    },
    /// A file writer finished before a tensor was written whole.
    #[error("{path}: tensor {} was not written whole", quoted(.tensor))]
    TensorIncomplete {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = CkptError> = std::result::Result<T, E>;

/// Wraps an `io::Error` with the path and operation.
/// The destination ranks of [`CkptError::NotADestinationRank`], in words.
fn destination_ranks(ranks: &[usize]) -> String {
    match ranks {
        [] => {
            "the destination strategy places no parameter the source holds on any rank".to_string()
        }
        _ => format!("the destination strategy has ranks {ranks:?}"),
    }
}

pub(crate) fn io_err(
    path: impl Into<PathBuf>,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> CkptError {
    let path = path.into();
    move |source| CkptError::Io { path, op, source }
}

/// The longest name (in characters) a message quotes whole.
pub(crate) const LONGEST_QUOTED_NAME: usize = 200;

/// `name` in quotes, as a message quotes a user's name ([`brief_name`]).
fn quoted(name: &str) -> String {
    format!("{:?}", brief_name(name))
}

/// A user's name (a tensor, an op, an alias, a key) as a message quotes it: whole up to
/// [`LONGEST_QUOTED_NAME`] characters, else cut there with `…` (a file's 1 MB name must not make
/// a 1 MB error line).
pub(crate) fn brief_name(name: &str) -> std::borrow::Cow<'_, str> {
    match name.char_indices().nth(LONGEST_QUOTED_NAME) {
        Some((cut, _)) => format!("{}…", &name[..cut]).into(),
        None => name.into(),
    }
}
