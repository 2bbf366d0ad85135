//! Recognising what a file holds (`tessera ckpt inspect`): the detection step picks its format
//! ([`crate::format::detect()`]) and exactly one reader reads it.

use std::path::Path;

use crate::error::{CkptError, Result};
use crate::format::detect::detect_read;
use crate::format::group_info::GroupInfo;
use crate::format::FileFormat;
use crate::model::Strategy;
use crate::source::CheckpointFile;

/// ", N of them of types Tessera moves only whole (…)" when `file` holds tensors whose
/// `tensor_type` Tessera cannot slice or convert, naming the types; empty otherwise.
fn opaque_note(file: &CheckpointFile) -> String {
    let opaque: Vec<&str> = file
        .tensors()
        .iter()
        .filter(|t| t.ty.dtype().is_none())
        .map(|t| t.ty.mindspore_name())
        .collect();
    if opaque.is_empty() {
        return String::new();
    }
    let types: std::collections::BTreeSet<&str> = opaque.iter().copied().collect();
    format!(
        " ({} of a type Tessera moves only whole between .ckpt files and cannot slice or convert: {})",
        opaque.len(),
        types.into_iter().collect::<Vec<_>>().join(", ")
    )
}

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
/// is an error naming the format and the reader's fault. A strategy file whose layouts do not
/// fit the shapes it records (a split that does not divide its dim, a shape of another rank) is
/// an error naming the tensor and the rule, as a conversion would refuse it.
pub fn inspect(path: &Path) -> Result<InspectedFile> {
    inspect_detected(path).map(|(file, _)| file)
}

/// [`inspect`], also saying which format was detected and why.
pub fn inspect_detected(path: &Path) -> Result<(InspectedFile, String)> {
    let (detected, bytes) = detect_read(path)?;
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
                    "MindSpore .ckpt: protobuf Checkpoint messages holding {} well-formed tensors{}{}",
                    f.tensors().len(),
                    opaque_note(&f),
                    if f.crc().is_some() { " and a matching crc_num trailer" } else { "" }
                )
            };
            Ok((InspectedFile::Checkpoint(f), why))
        }
        FileFormat::MsStrategy | FileFormat::MsStrategyJson | FileFormat::TesseraStrategy => {
            // Detection read a JSON file whole (and a protobuf one, if small): it is not read
            // again.
            let s = match bytes.len() as u64 == detected.n_bytes {
                true => Strategy::from_bytes(path, &bytes),
                false => Strategy::load(path),
            }
            .map_err(failed)?;
            // The file parsed; a layout that does not fit its tensor's recorded shape is that
            // tensor's fault, named as a conversion of the file would name it.
            s.check_recorded_shapes()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ms_ckpt::value_header;

    #[test]
    fn a_tensor_of_a_type_tessera_cannot_convert_is_named_in_the_evidence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("odd.ckpt");
        let mut bytes = value_header("w", &[2], "Float32", 8);
        bytes.extend_from_slice(&[0; 8]);
        bytes.extend_from_slice(&value_header("odd", &[2], "Float99", 8));
        bytes.extend_from_slice(&[0; 8]);
        std::fs::write(&path, bytes).unwrap();
        let (file, why) = inspect_detected(&path).unwrap();
        assert!(matches!(file, InspectedFile::Checkpoint(_)));
        assert!(
            why.contains("2 well-formed tensors (1 of a type Tessera moves only whole")
                && why.contains("Float99"),
            "{why}"
        );
    }
}
