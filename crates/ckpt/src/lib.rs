//! Tessera's distributed checkpoints: the on-disk formats (safetensors, MindSpore `.ckpt`,
//! MindSpore strategy and group-info files, Tessera strategy JSON) and the operations on them
//! (convert, merge, load, dedup, verify, minimal rank lists), compatible with MindSpore's
//! `mindspore.parallel` checkpoint tools.
//!
//! # Brief overview
//! - [`Strategy`] is a strategy file of any flavour, read into one model: per parameter and per
//!   pipeline stage, a [`layout::Layout`] over the stage's ranks plus an optimizer-shard group
//!   size. [`ResolvedStrategy`] binds global shapes, so every rank's [`layout::SliceBox`] of
//!   every parameter is known ([`ParamLayout`]).
//! - [`CheckpointFile`] is one checkpoint file, indexed once (header only) and read by
//!   positioned reads. [`SourceSet`] finds the files of a checkpoint directory (`rank_<N>/`) or
//!   of a unified checkpoint.
//! - [`detect()`] names the [`FileFormat`] of any file from its first bytes, or says why each
//!   was ruled out; [`inspect`] reads the file with that format's reader.
//! - Operations: [`convert_checkpoints`] / [`convert_checkpoint_by_rank`],
//!   [`convert_checkpoint_files`] (a `{rank: file}` map in, one named file out),
//!   [`minimal_rank_list`] and [`conversion_plan`] (which source ranks hold each piece a
//!   destination rank needs), [`unified_safetensors`], [`load_distributed_checkpoint`],
//!   [`load_segmented_checkpoints`], [`dedup_checkpoints`] with [`parameter_redundancy`] and
//!   [`remove_param_redundancy`], [`verify_checkpoints`], [`merge_pipeline_strategies`],
//!   [`restore_group_info_list`], and [`diff_checkpoints`] (two checkpoints of any strategies,
//!   tensor by tensor, merged on the fly: largest differences and bitwise equality).
//! - In memory: [`load_rank_from_files`] and [`load_rank_from_unified`] read one destination
//!   rank's tensors (for the Python package's `load_distributed_checkpoint`); their `_with`
//!   forms take a [`Strategy`] built in memory (MindSpore's layout dict,
//!   [`Strategy::from_layout_lists`]) and, for `.ckpt` files, a [`Decryption`].
//! - Encrypted MindSpore `.ckpt` files ([`crypto`]): [`CheckpointFile::open_with`] and
//!   [`SourceSet::with_decryption`] read them (AES-GCM, AES-CBC, SM4-CBC).
//! - For the training runtime: [`save_rank_checkpoint`], [`save_rank_checkpoint_in_set`],
//!   [`save_param_strategy_file`], [`load_rank_tensors`] and [`for_each_rank_tensor`]
//!   (convert on load, from a set saved under a strategy or unsharded: [`SourceStrategy`]).
//! - Checkpoint sets: [`SetWriter`] (lock, stage, commit), [`check_set`] / [`audit_set`]
//!   (readers' checks), [`abandon_pending_sets`] (for signal handlers). [`Durability`] says
//!   whether a write fsyncs (the default) or leaves its data to the page cache (the writers'
//!   `fsync: false` option: still atomic against a failing process, not against a power loss).
//!
//! # Example
//! ```
//! use ckpt::{save_rank_checkpoint, CheckpointFile};
//! use tensor::Tensor;
//! let dir = tempfile::tempdir()?;
//! let w = Tensor::from_vec(&[2, 2], vec![1f32, 2., 3., 4.])?;
//! let path = save_rank_checkpoint(dir.path(), 0, &[("w", &w)], false)?;
//! let file = CheckpointFile::open(&path)?;
//! assert_eq!(file.read_tensor("w")?.as_f32()?, &[1., 2., 3., 4.]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Architecture invariant
//! Only `ckpt` knows on-disk checkpoint and strategy formats. It never talks to a communicator
//! and never executes a reshard: it plans with the layout algebra and [`reshard::source_pieces`]
//! (the planner shared with runtime resharding) and moves bytes between files. It draws
//! nothing: progress goes through the [`Progress`] trait, implemented by the command line (and
//! by the Python package, whose sink can also ask an operation to stop before its commit:
//! [`Progress::stop_requested`]).
//!
//! # Layers
//! The folders are the layers, each using only those listed before it:
//! - `io`: atomic writes, [`Durability`], mappings, the registry of unfinished writes. Knows
//!   files, nothing of tensors or formats.
//! - `model`: tensor records ([`StoredTensor`], [`TensorMeta`]) and strategies ([`Strategy`],
//!   [`ResolvedStrategy`]). Plain data; no file is opened and no format's bytes are known.
//! - `format`: one module per file format, each reading into and writing from the model and
//!   never importing a sibling format (they share only the wire and JSON codecs), plus the one
//!   detection step ([`detect()`]) that looks at a file once and picks exactly one reader.
//!   MindSpore's records ([`MsStrategyFile`], [`GroupInfo`]) stay here, converted to and from
//!   the model at this edge.
//! - `set`: checkpoint sets that commit atomically ([`SetWriter`], [`check_set`]).
//! - `source`: where tensors are read from ([`CheckpointFile`], [`RankFiles`], [`SourceSet`]).
//! - `ops`: the operations, over the shared planning and writing machinery of `ops::engine`.
//!
//! # Key design decisions
//!
//! ## Conversion streams box intersections
//! - **Constraints.** A checkpoint can be larger than memory; MindSpore's tools load whole
//!   source files (and every source rank) and replay simulated collectives on the host, peaking
//!   at several times the checkpoint size.
//! - **Solution.** Each destination tensor's box is intersected with the source layout's
//!   distinct boxes ([`reshard::source_pieces`]); each piece is read with positioned reads from
//!   one holder's file straight into the destination buffer (through a bounded scratch buffer
//!   when its contiguous runs are short, or from a small read-only mapping of the range when it
//!   is a megabyte or more), in chunks of rows of at most 64 MiB. Safetensors output skips the
//!   buffer: each chunk is a list of runs pointing into read-only mappings of the source files,
//!   written with `pwritev` by two threads (the kernel copies each byte once, as `cp` does);
//!   `.ckpt` output is assembled in two circulating buffers while a writer thread writes. A
//!   committer thread fsyncs and renames one finished file while the next is written. Holders are
//!   chosen so that the set of source files opened is a minimum set cover of the pieces needed.
//! - **Pros.** Memory is bounded by one chunk whatever the checkpoint size; every byte is read
//!   once and written once; unneeded source ranks are never opened.
//! - **Cons.** Many small pieces mean many small reads; the planner's per-piece bookkeeping is
//!   proportional to the number of distinct source boxes a destination box touches. Mapped reads
//!   assume source files are not truncated by another process during the conversion (the
//!   kernel would raise SIGBUS); lengths are re-checked just before each mapping.
//! - **Compatibility.** Output files hold the same tensors, names, dtypes, shapes and values as
//!   MindSpore's, in MindSpore's order (source order for `.ckpt`, the safetensors library's
//!   order for safetensors).
//!
//! ## A checkpoint directory is a set, switched in by one rename
//! - **Constraints.** A save or a conversion writes many files; an interruption between two of
//!   them (SIGINT, a crash, a full disk) must not leave a directory that mixes two checkpoints,
//!   which every reader (and MindSpore's) would accept. Two writers into one destination must not
//!   interleave. A run folder also holds files that are not the checkpoint's (the metrics log,
//!   a user's notes), which no writer may delete.
//! - **Solution.** [`SetWriter`] (module `set`): an `flock` on a sibling lock file, every file
//!   written into a sibling staging directory, a marker listing the set's files, sizes and id,
//!   and one `renameat2` (`RENAME_EXCHANGE` over an existing directory) as the commit point;
//!   entries of the old directory that belong to no set move into the new one, the old set's
//!   entries (stale rank folders included) are removed. Readers check the marker
//!   ([`check_set`]) and each safetensors file's `tessera_set` id.
//! - **Pros.** Readers see the old set or the new one, never a mix; cleanup after SIGKILL is
//!   done by the next writer; the lock names its holder.
//! - **Cons.** The destination's parent must be writable and on the same filesystem as the
//!   destination (the staging directory lives there). `--rank` conversions replace the whole
//!   set rather than adding ranks to it. Filesystems without `renameat2` fall back to two
//!   renames, between which the destination is briefly absent (never mixed).
//! - **Compatibility.** Directories without a marker (MindSpore's) are read as before; output
//!   files differ from MindSpore's only by the extra safetensors metadata key.
//!
//! ## One placement model, shapes resolved once
//! - **Constraints.** MindSpore's protobuf strategy has no global shape; its JSON flavour has one
//!   but stores multi-axis layouts expanded; pipeline files prefix names with stages; optimizer
//!   sharding is two integers.
//! - **Solution.** Every flavour becomes [`StagePlacement`]s (a layout over the stage's ranks and
//!   an optimizer-shard size, checked against `opt_weight_shard_step`). Shapes are resolved once
//!   ([`Strategy::resolve`]): from the file, from a source slice × split factors, or from the
//!   source by name; any disagreement is an error naming the parameter.
//! - **Pros.** One code path for flat, multi-axis, optimizer-sharded and pipelined parameters.
//! - **Cons.** A MindSpore protobuf strategy cannot be used without either a checkpoint or
//!   another strategy that knows the shapes (placement questions use scale-free shapes).
//! - **Compatibility.** Tessera's own JSON records shape and dtype, so it is self-describing.
//!
//! # File formats
//!
//! ## Per-rank directories
//! `DIR/rank_<N>/` holds rank `N`'s file. With several `.ckpt` files the lexicographically last
//! is used; with several `.safetensors` files the one whose last two numbers in the name are
//! largest. Formats may not be mixed. Converted output is `DIR/rank_<r>/<prefix><r>.<ext>`.
//!
//! ## safetensors
//! ```text
//! [u64 little-endian N][N bytes of UTF-8 JSON header, padded with spaces][data buffer]
//! ```
//! The header is an object: `"__metadata__"` (optional, string → string; MindSpore writes
//! `{"format": "ms"}`, plus `"remove_redundancy": "True"|"False"` and `"crc_num"`), and per
//! tensor `{"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}` relative to the data
//! buffer. Allowed: empty tensors, 0-dim tensors. Rules enforced on read: `N` ≤ 100 MB; the
//! header fits in the file; dtype one of `F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL`;
//! `end - begin` = dtype size × shape product (computed without overflow); the tensors sorted by
//! offset tile the buffer from 0 with no hole and no overlap; the buffer ends at the last `end`.
//! Writers order tensors like the reference library (dtype descending, then name) and pad the
//! header to a multiple of 8. MindSpore's `crc_num` is CRC32 chained over each tensor's name then
//! data, in name order.
//!
//! ## MindSpore `.ckpt` (proto2, no package)
//! ```text
//! message Checkpoint { message Value { required string tag = 1;
//!                                      oneof value { TensorProto tensor = 2; MapTensorProto maptensor = 3; } }
//!                      repeated Value value = 1; }
//! message TensorProto { repeated int64 dims = 1; required string tensor_type = 2; required bytes tensor_content = 3; }
//! ```
//! A file is the concatenation of one serialized `Checkpoint{value}` per tensor (on the wire,
//! one `Checkpoint`). Tensors over 512 MiB are split into consecutive values with the same tag
//! and full dims; readers join them. `tensor_type` is `Float32 Float16 BFloat16 Float64 Int8..Int64
//! UInt8..UInt64 Bool` (Tessera also keeps `str`, `Int4`, … as opaque values it copies whole).
//! Content is raw little-endian row-major. A 0-dim tensor is stored with `dims [0]`. Optional
//! trailer: the 7 ASCII bytes `crc_num` and a 10-byte big-endian CRC32 (zlib) of everything
//! before it; it is verified on read and written on request. The scanner never copies
//! contents: it records each value's byte range.
//!
//! ## MindSpore strategy files (`ParallelStrategyMap`, proto2, package `mindspore.straspb`)
//! ```text
//! ParallelStrategyMap  { required uint32 current_stage = 1; repeated ParallelStrategyItem parallel_strategy_item = 2;
//!                        repeated ParallelLayoutItem parallel_layout_item = 3; }
//! ParallelStrategyItem { required string node_name = 1; required ParallelStrategys parallel_strategys = 2; }
//! ParallelStrategys    { required uint32 stage = 1; repeated ParallelStrategy parallel_strategy = 2; } // {repeated uint32 dim = 1}
//! ParallelLayoutItem   { required string param_name = 1; required ParallelLayouts parallel_layouts = 2; }
//! ParallelLayouts      { repeated DevMatrix dev_matrix = 1; repeated TensorMap tensor_map = 2;
//!                        repeated ParamSplitShape param_split_shape = 3; repeated IndicesOffset indices_offset = 4;
//!                        required int32 field = 5; required int32 opt_weight_shard_step = 6;
//!                        required int32 opt_weight_shard_size = 7; }
//! ```
//! `tensor_map` is one flat map (one value per dim, counted from the right of `dev_matrix`,
//! `-1` = not split) or one list per dim (multi-axis; a 1-D tensor gets a trailing empty list).
//! Writers reproduce MindSpore's bytes: repeated scalars unpacked, `-1` as a 10-byte varint,
//! one empty `ParamSplitShape` and `IndicesOffset`. Readers accept packed fields. Merged
//! pipeline files name parameters `"<stage>-<name>"`; Tessera splits at the first `-` and only
//! when every name has a numeric prefix. The JSON flavour is
//! `{"current_stage", "parallel_strategy_item": {node: {"stage", "parallel_strategy"}},
//! "parallel_layout_item": {name: {"dev_matrix", "tensor_map", "tensor_shape", "field",
//! "opt_weight_shard_step", "opt_weight_shard_size"}}}`.
//!
//! ## MindSpore group-info files (`ParallelGroupMap`)
//! ```text
//! ParallelGroupMap { repeated ParallelGroupItem parallel_group_item = 1; required ParallelGroupRanks ckpt_restore_rank_list = 2; }
//! ParallelGroupItem { required string group_name = 1; required ParallelGroupRanks parallel_group_ranks = 2; } // {repeated uint32 dim = 1}
//! ```
//!
//! ## Tessera strategy JSON (version 2; version 1 is read too)
//! ```text
//! {"format": "tessera-strategy", "version": 2,
//!  "tensors": [{"name": "w", "shape": [64, 32], "dtype": "f32",
//!               "placements": [{"stage": 0,
//!                               "mesh": {"axes": [["dp", 2], ["mp", 4]], "rank_range": [0, 8]},
//!                               "dims": [["dp"], ["mp"]],
//!                               "optimizer_shard": 1}]}],
//!  "ops": [{"name": "matmul2", "stage": 0, "in_strategy": [[1, 8], [8, 1]],
//!           "out_strategy": [[8, 1]]}]}
//! ```
//! A mesh gives its ranks, in slot order, as exactly one of `"rank_list"` (every rank) or
//! `"rank_range": [start, count]` (the consecutive ranks `start..start+count`; `count` must be
//! the product of the axis sizes), which the writer uses whenever the ranks are consecutive (a
//! full list of 8 192 ranks per tensor made a thousand-tensor file megabytes). The reader
//! streams: each tensor is checked and built as it is read, never a tree of the whole file,
//! within bounds far above any real model (4 194 304 tensors and as many ops, 65 536
//! placements per tensor, rank lists up to the rank limit, names of at most 64 KiB). Version 1 (written before `"rank_range"`) is still read; there a mesh
//! may give neither key, meaning ranks `0..n`. A version-1 reader refuses version 2 instead of
//! taking a `"rank_range"` mesh for ranks `0..n`.
//! `dims` lists, per tensor dim, the mesh axes splitting it, outer first (`[]` = not split).
//! `optimizer_shard` is the group size `k` of the parallel optimizer (1 = none): dim 0 is further
//! split over the innermost `k` ranks of the replica group, so `k` must divide the number of ranks
//! holding each slice. A parameter in several pipeline stages has one placement per stage (a
//! stage placed twice is an error naming the tensor and the stage). Tensors are a list, so file
//! order is kept. `ops` (optional; absent in files from before it existed) records each
//! operator's `shard` strategy:
//! `in_strategy` as MindSpore's `parallel_strategy_item` does, and `out_strategy` (or `null`),
//! which MindSpore's files cannot hold; an op has at most one record per stage (a second is an
//! error naming the op and the stage).
#![deny(missing_docs)]

mod error;
mod format;
mod io;
mod model;
mod ops;
mod progress;
mod set;
mod source;

pub use crate::error::{CkptError, Result};
pub use crate::format::crypto;
pub use crate::format::crypto::{CipherMode, Decryption};
pub use crate::format::group_info::{group_name, restore_group_info_list, GroupInfo, GroupItem};
pub use crate::format::ms_strategy::{
    to_ms_strategy, LayoutList, MsLayout, MsLayoutItem, MsStrategyFile, MsStrategyItem,
};
pub use crate::format::op_strategy::{
    read_operator_strategy_file, write_operator_strategy_file, MAX_OP_STRATEGY_FILE_BYTES,
};
pub use crate::format::tessera_strategy::rank_range;
pub use crate::format::unified_index::{HYPER_PARAM_FILE, PARAM_NAME_MAP};
pub use crate::format::{detect, detect_bytes, Detected, FileFormat, Format};
pub use crate::io::atomic_write::CreatedDirs;
pub use crate::io::durability::Durability;
pub use crate::model::{
    OpStrategyRecord, ParamLayout, ResolvedParam, ResolvedStrategy, ShapeHint, StagePlacement,
    StoredTensor, StoredType, Strategy, StrategyFlavour, StrategyParam, TensorMeta,
};
pub use crate::ops::by_files::{
    convert_checkpoint_files, load_rank_from_files, load_rank_from_files_allowing,
    load_rank_from_files_with, load_rank_from_unified, load_rank_from_unified_with,
};
pub use crate::ops::convert::{
    convert_checkpoint_by_rank, convert_checkpoints, convert_unsharded,
    load_distributed_checkpoint, load_distributed_checkpoint_with, ConvertOptions, ConvertReport,
    RankReport,
};
pub use crate::ops::dedup::{
    dedup_checkpoints, parameter_redundancy, redundancy_of_file, remove_param_redundancy,
    DedupReport, RedundancyMap,
};
pub use crate::ops::diff::{
    compare_tensors, diff_checkpoints, DiffReport, DiffSide, DiffStats, TensorComparison,
    TensorDiff,
};
pub use crate::ops::engine::cover::{HeldPiece, RankCover};
pub use crate::ops::engine::options::DEFAULT_CHUNK_BYTES;
pub use crate::ops::inspect::{inspect, inspect_detected, InspectedFile};
pub use crate::ops::load::{
    for_each_rank_tensor, load_rank_tensors, load_segmented_checkpoints,
    load_segmented_checkpoints_with, write_segmented, SegmentedEntry, SourceStrategy,
};
pub use crate::ops::merge::{
    split_range, unified_safetensors, ChoiceFn, MergeOptions, MergeReport, ParamChoice,
    DEFAULT_PART_BYTES,
};
pub use crate::ops::merge_stages::{merge_pipeline_strategies, MergeStagesReport};
pub use crate::ops::ranks::{
    conversion_plan, minimal_rank_list, resolve_scale_free_pair, ParamPieces, PlanShapes,
    RankConversionPlan,
};
pub use crate::ops::save::{
    save_param_strategy_file, save_rank_checkpoint, save_rank_checkpoint_in_set, save_safetensors,
    save_side_file,
};
pub use crate::ops::verify::{verify_checkpoints, Fault, VerifyReport};
pub use crate::progress::{NoProgress, Progress};
pub use crate::set::{
    abandon_pending_sets, audit_set, check_set, DestLock, SetAudit, SetFile, SetMarker, SetWriter,
    SET_ID_KEY, SET_MARKER, SET_STRATEGY_FILE,
};
pub use crate::source::{rank_file_path, CheckpointFile, RankFiles, SourceSet};

/// Parsers exposed for fuzzing and tests: each takes untrusted bytes and must return an error,
/// never panic or allocate without bound.
pub mod parse {
    use std::path::Path;

    /// Parses a safetensors header held in memory, as if the data buffer had `data_len` bytes.
    pub fn safetensors_header(header: &[u8], data_len: u64) -> crate::Result<usize> {
        crate::format::safetensors::parse_header(Path::new("<memory>"), header, data_len, 0)
            .map(|h| h.tensors.len())
    }

    /// Parses a MindSpore strategy file (any flavour) held in memory.
    pub fn strategy(bytes: &[u8]) -> crate::Result<crate::Strategy> {
        crate::Strategy::from_bytes(Path::new("<memory>"), bytes)
    }

    /// Parses a group-info file held in memory.
    pub fn group_info(bytes: &[u8]) -> crate::Result<crate::GroupInfo> {
        crate::GroupInfo::decode(Path::new("<memory>"), bytes)
    }
}
