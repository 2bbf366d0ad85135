//! Recognising what a file holds (`tessera ckpt inspect`): the detection step picks its format
//! ([`crate::format::detect()`]) and exactly one reader reads it.

use std::path::Path;

use crate::error::{CkptError, Result};
use crate::format::group_info::GroupInfo;
use crate::format::{detect, FileFormat};
use crate::model::Strategy;
use crate::source::CheckpointFile;

/// What a file turned out to be.
#[derive(Debug)]
pub enum InspectedFile {
    /// A checkpoint (safetensors or `.ckpt`).
    Checkpoint(CheckpointFile),
    /// A strategy file (any flavour).
    Strategy(Box<Strategy>),
    /// A MindSpore group-info file.
    GroupInfo(GroupInfo),
}

/// Recognises and reads `path`: a checkpoint, a strategy file or a group-info file, told apart
/// by content (MindSpore names strategy files `.ckpt` too). A file that matches no format is an
/// error listing why each was ruled out; one that starts like a format but does not parse as it
/// is an error naming the format and the reader's fault.
pub fn inspect(path: &Path) -> Result<InspectedFile> {
    inspect_detected(path).map(|(file, _)| file)
}

/// [`inspect`], also saying which format was detected and why.
pub fn inspect_detected(path: &Path) -> Result<(InspectedFile, String)> {
    let detected = detect(path)?;
    let failed = |source: CkptError| CkptError::NotParsedAs {
        path: path.to_path_buf(),
        n_bytes: detected.n_bytes,
        format: detected.format.to_string(),
        evidence: detected.evidence.clone(),
        source: Box::new(source),
    };
    match detected.format {
        FileFormat::Safetensors | FileFormat::MsCkpt | FileFormat::MsCkptEncrypted(_) => {
            let f = CheckpointFile::open_as(path, detected.format.checkpoint_format(), None)
                .map_err(failed)?;
            let why = if detected.format == FileFormat::Safetensors {
                format!(
                    "safetensors: an 8-byte header length and a valid JSON header describing {} tensors that tile the data",
                    f.tensors().len()
                )
            } else {
                format!(
                    "MindSpore .ckpt: protobuf Checkpoint messages holding {} well-formed tensors{}",
                    f.tensors().len(),
                    if f.crc().is_some() { " and a matching crc_num trailer" } else { "" }
                )
            };
            Ok((InspectedFile::Checkpoint(f), why))
        }
        FileFormat::MsStrategy | FileFormat::MsStrategyJson | FileFormat::TesseraStrategy => {
            let s = Strategy::load(path).map_err(failed)?;
            let why = format!(
                "{:?} strategy file: {} parameter layouts and {} operator strategies",
                s.flavour,
                s.params.len(),
                s.ops.len()
            );
            Ok((InspectedFile::Strategy(Box::new(s)), why))
        }
        FileFormat::GroupInfo => {
            let g = GroupInfo::read(path).map_err(failed)?;
            let why = format!(
                "MindSpore group-info file: protobuf with only ParallelGroupMap fields ({} groups{})",
                g.groups.len(),
                if g.restore_rank_list.is_some() { ", a ckpt_restore_rank_list" } else { "" }
            );
            Ok((InspectedFile::GroupInfo(g), why))
        }
        FileFormat::OperatorStrategy | FileFormat::UnifiedIndex => Err(CkptError::NotInspectable {
            path: path.to_path_buf(),
            format: detected.format.to_string(),
            evidence: detected.evidence,
        }),
    }
}
