//! The file formats, one module each: [`safetensors`], MindSpore `.ckpt` ([`ms_ckpt`], its
//! encrypted form in [`crypto`]), MindSpore strategy files in protobuf and JSON
//! ([`ms_strategy`]), group-info files ([`group_info`]), Tessera's strategy JSON
//! ([`tessera_strategy`]), MindSpore's operator strategy files ([`op_strategy`]) and the index
//! of a unified checkpoint ([`unified_index`]); the shared wire and JSON codecs
//! ([`codec`]); and the one detection step ([`detect()`]).
//!
//! # Architecture invariant
//! A format module reads into and writes from the [`crate::model`] types and the byte-level
//! helpers of [`crate::io`]; it never imports a sibling format (only [`codec`]), the file
//! sources, checkpoint sets or the operations. Choosing between formats happens in one place:
//! [`detect()`] looks at a file once, and this module's [`Strategy::load`] follows it to
//! exactly one reader.

pub(crate) mod codec;
pub mod crypto;
pub(crate) mod detect;
pub(crate) mod group_info;
pub(crate) mod kind;
pub(crate) mod ms_ckpt;
pub(crate) mod ms_strategy;
pub(crate) mod op_strategy;
pub(crate) mod safetensors;
pub(crate) mod tessera_strategy;
pub(crate) mod unified_index;

use std::path::Path;

pub use detect::{detect, detect_bytes, Detected};
pub use kind::{FileFormat, Format};

use self::codec::json::starts_object;
use self::ms_strategy::MsStrategyFile;
use crate::error::{io_err, CkptError, Result};
use crate::model::{Strategy, StrategyFlavour};

impl Strategy {
    /// Reads a strategy file of any flavour, detected by content (see [`Strategy::from_bytes`]).
    pub fn load(path: &Path) -> Result<Strategy> {
        #[cfg(test)]
        detect::FILE_READS.with(|n| n.set(n.get() + 1));
        let bytes = layout::limits::read_bounded(path, layout::limits::MAX_STRATEGY_FILE_BYTES)
            .map_err(io_err(path, "read"))?;
        Strategy::from_bytes(path, &bytes)
    }

    /// Parses strategy bytes. The detection step picks the reader: JSON (`{`) is Tessera's if it
    /// says `"format": "tessera-strategy"`, MindSpore's if it has `parallel_layout_item`, and
    /// any other JSON is refused naming what it is. A file that opens with
    /// `{"format": "tessera-strategy"` (as Tessera writes them) is read in one pass: detection
    /// runs only if it fails to read, and then decides the message as for any other file.
    /// MindSpore's protobuf strategy files carry no magic number, so every other file is read as
    /// one, and the protobuf reader names the fault.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Strategy> {
        if starts_object(bytes) {
            let invalid = |reason: String| CkptError::InvalidStrategy {
                path: path.to_path_buf(),
                reason,
            };
            // A file that declares itself a Tessera strategy first is read in one pass; the
            // detection step looks at it only when it fails to read.
            let declared = match tessera_strategy::declared_first(bytes) {
                true => match tessera_strategy::read(path, bytes) {
                    Ok(strategy) => return Ok(strategy),
                    Err(e) => Some(e),
                },
                false => None,
            };
            return match detect::json_format(bytes, bytes.len() as u64) {
                Ok(d) if d.format == FileFormat::TesseraStrategy => match declared {
                    Some(e) => Err(e),
                    None => tessera_strategy::read(path, bytes),
                },
                Ok(d) if d.format == FileFormat::MsStrategyJson => {
                    MsStrategyFile::from_json_bytes(path, bytes)?
                        .into_strategy(path, StrategyFlavour::MsJson)
                }
                Ok(d) => Err(invalid(format!(
                    "JSON that is neither a Tessera strategy (\"format\": \"tessera-strategy\") nor a MindSpore one (\"parallel_layout_item\"): a {} ({})",
                    d.format, d.evidence
                ))),
                Err(why) => Err(invalid(why)),
            };
        }
        MsStrategyFile::decode(path, bytes)?.into_strategy(path, StrategyFlavour::MsProtobuf)
    }
}
