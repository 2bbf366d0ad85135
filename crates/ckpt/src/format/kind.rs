//! The names of formats: [`Format`], the two formats a checkpoint (tensor) file is written in,
//! and [`FileFormat`], every format the detection step ([`super::detect()`]) recognises.

use std::fmt;
use std::path::Path;

use super::crypto::CipherMode;
use crate::error::{CkptError, Result};

/// The on-disk format of a checkpoint file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Safetensors (`.safetensors`).
    Safetensors,
    /// MindSpore's protobuf checkpoint (`.ckpt`).
    Ckpt,
}

impl Format {
    /// The file extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Safetensors => "safetensors",
            Format::Ckpt => "ckpt",
        }
    }

    /// The format a file name's extension names, if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "safetensors" => Some(Format::Safetensors),
            "ckpt" => Some(Format::Ckpt),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.extension())
    }
}

impl std::str::FromStr for Format {
    type Err = CkptError;
    fn from_str(s: &str) -> Result<Format> {
        match s {
            "safetensors" => Ok(Format::Safetensors),
            "ckpt" => Ok(Format::Ckpt),
            other => Err(CkptError::InvalidOption {
                option: "format",
                rule: format!(
                    "{other:?} is not a checkpoint format (expected safetensors or ckpt)"
                ),
            }),
        }
    }
}
/// Every format the detection step recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileFormat {
    /// A safetensors checkpoint.
    Safetensors,
    /// A MindSpore `.ckpt` checkpoint.
    MsCkpt,
    /// A MindSpore `.ckpt` checkpoint encrypted with this cipher (see [`crate::crypto`]).
    MsCkptEncrypted(CipherMode),
    /// A MindSpore strategy file in protobuf (`ParallelStrategyMap`).
    MsStrategy,
    /// A MindSpore strategy file in its JSON flavour.
    MsStrategyJson,
    /// Tessera's strategy JSON.
    TesseraStrategy,
    /// MindSpore's operator strategy file (JSON).
    OperatorStrategy,
    /// A MindSpore group-info file (`ParallelGroupMap`).
    GroupInfo,
    /// The index of a unified checkpoint (`param_name_map.json`).
    UnifiedIndex,
}

impl FileFormat {
    /// The checkpoint format of a checkpoint file, `None` for the other files.
    pub fn checkpoint_format(self) -> Option<Format> {
        match self {
            FileFormat::Safetensors => Some(Format::Safetensors),
            FileFormat::MsCkpt | FileFormat::MsCkptEncrypted(_) => Some(Format::Ckpt),
            _ => None,
        }
    }
}

impl fmt::Display for FileFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileFormat::Safetensors => f.write_str("safetensors file"),
            FileFormat::MsCkpt => f.write_str("MindSpore .ckpt file"),
            FileFormat::MsCkptEncrypted(mode) => {
                write!(f, "MindSpore .ckpt file encrypted with {mode}")
            }
            FileFormat::MsStrategy => f.write_str("MindSpore strategy file (protobuf)"),
            FileFormat::MsStrategyJson => f.write_str("MindSpore strategy file (JSON)"),
            FileFormat::TesseraStrategy => f.write_str("Tessera strategy file"),
            FileFormat::OperatorStrategy => f.write_str("MindSpore operator strategy file"),
            FileFormat::GroupInfo => f.write_str("MindSpore group-info file"),
            FileFormat::UnifiedIndex => f.write_str("unified checkpoint index"),
        }
    }
}
