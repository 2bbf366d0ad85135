//! The one error type of the checkpoint crate.
//!
//! Every variant names its culprit in the payload: the file, the tensor and the rule that was
//! broken, so the message can be shown to a user as is. Variants are grouped by category: I/O,
//! safetensors, MindSpore `.ckpt`, protobuf and strategy files, and checkpoint operations.

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
    #[error("{path}: tensor {tensor:?} has dtype {dtype:?}, which is not supported (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL)")]
    UnknownDType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype name found.
        dtype: String,
    },
    /// A tensor's shape times its element size overflows.
    #[error("{path}: tensor {tensor:?} has shape {shape:?}, whose byte size overflows 64 bits")]
    ShapeOverflow {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shape.
        shape: Vec<u64>,
    },
    /// `data_offsets` that leave a hole, overlap, run backwards or do not start at 0.
    #[error("{path}: tensor {tensor:?}: data_offsets {offsets:?} break the rule that tensors tile the data buffer without holes or overlaps (expected to start at byte {expected_start})")]
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
    #[error("{path}: tensor {tensor:?} is {dtype} of shape {shape:?} = {expected} bytes, but its data_offsets span {got} bytes")]
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
    #[error("{path}: tensor {tensor:?}: {rule}")]
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
    #[error("{path}: parameter {tensor:?}: {rule}")]
    StrategyParam {
        /// The strategy file.
        path: PathBuf,
        /// The parameter.
        tensor: String,
        /// The rule broken.
        rule: String,
    },
    /// A layout that the layout algebra rejects, for one parameter.
    #[error("{path}: parameter {tensor:?}: {source}")]
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
    /// A rank the operation needs is missing from the source directory.
    #[error("{path}: source rank {rank} is needed but rank_{rank}/ holds no checkpoint file")]
    MissingRank {
        /// The source directory.
        path: PathBuf,
        /// The rank.
        rank: usize,
    },
    /// Rank folders the strategy has no rank for (a strategy for fewer devices than the
    /// checkpoint was saved on).
    #[error("{path}: holds rank folders {extra:?}, but {strategy} describes only {n_ranks} ranks (0..{n_ranks}); a strategy must match the checkpoint's device count")]
    RankCountMismatch {
        /// The checkpoint directory.
        path: PathBuf,
        /// The strategy file.
        strategy: PathBuf,
        /// The strategy's rank count.
        n_ranks: usize,
        /// Rank folders beyond it.
        extra: Vec<usize>,
    },
    /// `.ckpt` and `.safetensors` files mixed in one checkpoint.
    #[error(
        "{path}: mixes .ckpt and .safetensors files ({detail}); a checkpoint must use one format"
    )]
    MixedFormats {
        /// The directory.
        path: PathBuf,
        /// Which files.
        detail: String,
    },
    /// A tensor the strategy places on a rank is missing from that rank's file.
    #[error("{path}: tensor {tensor:?} is not in this file, but {rule}")]
    TensorMissing {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Why it was expected.
        rule: String,
    },
    /// A tensor whose stored shape disagrees with the strategy.
    #[error("{path}: tensor {tensor:?} has shape {found:?} but the strategy gives this rank a slice of shape {expected:?}")]
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
    #[error("{path}: tensor {tensor:?} is {found} but {expected} was expected ({reason})")]
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
    #[error("parameter {tensor:?}: {reason}")]
    GlobalShape {
        /// The parameter.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor that a target format cannot hold (e.g. a MindSpore string in safetensors).
    #[error("{path}: tensor {tensor:?}: {reason}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Why.
        reason: String,
    },
    /// A request that makes no sense (a rank outside the destination, an empty prefix, …).
    #[error("{0}")]
    InvalidRequest(String),
}

/// Shorthand for results of this crate.
pub type Result<T, E = CkptError> = std::result::Result<T, E>;

/// Wraps an `io::Error` with the path and operation.
pub(crate) fn io_err(
    path: impl Into<PathBuf>,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> CkptError {
    let path = path.into();
    move |source| CkptError::Io { path, op, source }
}
