//! The one detection step: a file's first bytes (the whole text of a JSON file) pick exactly one
//! format, or say why each was ruled out.
//!
//! Each format module recognises its own beginning (`sniff`: an encrypted `.ckpt`'s magic
//! number, safetensors' header length and `{`, a protobuf message's first fields); this module
//! asks them in a fixed order and is the only place that compares formats. JSON files are told
//! apart by their top-level keys. Loaders use it so: [`crate::Strategy::load`] picks its reader
//! from it, a checkpoint loader takes the format its file name declares and asks detection only
//! when the name says nothing ([`checkpoint_format`]), and `inspect` follows it for any file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::codec::json::{object_keys, starts_object};
use super::crypto::{self, CipherMode};
use super::kind::{FileFormat, Format};
use super::{group_info, ms_ckpt, ms_strategy, op_strategy, safetensors, tessera_strategy};
use crate::error::{io_err, CkptError, Result};

/// Bytes read from the start of a file to detect its format (a JSON file is read whole).
pub const HEAD_BYTES: usize = 64 << 10;
/// Largest JSON file the detection step reads whole.
pub const MAX_JSON_BYTES: u64 = op_strategy::MAX_OP_STRATEGY_FILE_BYTES;

/// A format module's recognizer: the evidence that bytes start like its format, or why not.
type Sniff = fn(&[u8]) -> std::result::Result<String, String>;

/// A detected format and the evidence for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    /// The format.
    pub format: FileFormat,
    /// What in the file shows it (for messages).
    pub evidence: String,
    /// The file's size.
    pub n_bytes: u64,
}

/// Opens `path` for reading if it is a regular file, with its length; a device, a FIFO or a
/// directory is [`CkptError::UnknownFormat`] (one reports 0 bytes whatever it holds: not "an
/// empty file"). The kind is checked before opening, because opening a FIFO waits for a
/// writer, forever if none comes, and again on the opened file.
pub(crate) fn open_regular(path: &Path) -> Result<(File, u64)> {
    let not_regular = |n_bytes| CkptError::UnknownFormat {
        path: path.to_path_buf(),
        n_bytes,
        ruled_out: vec!["it is not a regular file (a device, a FIFO or a directory)".to_string()],
    };
    let before = std::fs::metadata(path).map_err(io_err(path, "stat"))?;
    if !before.is_file() {
        return Err(not_regular(before.len()));
    }
    let file = File::open(path).map_err(io_err(path, "open"))?;
    let meta = file.metadata().map_err(io_err(path, "stat"))?;
    if !meta.is_file() {
        return Err(not_regular(meta.len()));
    }
    Ok((file, meta.len()))
}

/// Detects the format of the file at `path`. A file matching no format is
/// [`CkptError::UnknownFormat`], which says why each was ruled out.
pub fn detect(path: &Path) -> Result<Detected> {
    detect_read(path).map(|(detected, _)| detected)
}

/// [`detect()`], also giving the bytes it read: the whole file when it is JSON (or no longer
/// than [`HEAD_BYTES`]), its first [`HEAD_BYTES`] otherwise. A reader given the whole file
/// need not read it again.
pub(crate) fn detect_read(path: &Path) -> Result<(Detected, Vec<u8>)> {
    #[cfg(test)]
    FILE_READS.with(|n| n.set(n.get() + 1));
    let (file, len) = open_regular(path)?;
    let mut bytes = read_head(path, &file, len, HEAD_BYTES)?;
    if starts_object(&bytes) && (bytes.len() as u64) < len && len <= MAX_JSON_BYTES {
        bytes = read_head(path, &file, len, len as usize)?;
    }
    match detect_bytes(&bytes, len) {
        Ok(detected) => Ok((detected, bytes)),
        Err(ruled_out) => Err(CkptError::UnknownFormat {
            path: path.to_path_buf(),
            n_bytes: len,
            ruled_out,
        }),
    }
}

/// The first `max` bytes of `file` (of `len` bytes).
pub(crate) fn read_head(path: &Path, file: &File, len: u64, max: usize) -> Result<Vec<u8>> {
    let mut head = vec![0u8; (len.min(max as u64)) as usize];
    file.read_exact_at(&mut head, 0)
        .map_err(io_err(path, "read"))?;
    Ok(head)
}

/// Detects the format of a file of `len` bytes from `bytes`, its first bytes (or all of it; a
/// JSON file must be given whole). The error lists why each format was ruled out.
pub fn detect_bytes(bytes: &[u8], len: u64) -> std::result::Result<Detected, Vec<String>> {
    let found = |format: FileFormat, evidence: String| Detected {
        format,
        evidence,
        n_bytes: len,
    };
    if len == 0 {
        return Err(vec!["the file is empty".to_string()]);
    }
    if let Some(mode) = crypto::encrypted_mode(bytes) {
        let evidence = format!(
            "it starts with the {mode} magic number 0x{:08X}",
            mode.magic()
        );
        return Ok(found(FileFormat::MsCkptEncrypted(mode), evidence));
    }
    let mut ruled_out = Vec::new();
    match safetensors::sniff(bytes, len) {
        Ok(evidence) => return Ok(found(FileFormat::Safetensors, evidence)),
        Err(why) => ruled_out.push(why),
    }
    if starts_object(bytes) {
        return match json_format(bytes, len) {
            Ok(d) => Ok(d),
            Err(why) => {
                ruled_out.push(why);
                Err(ruled_out)
            }
        };
    }
    ruled_out.push("not JSON: it does not start with '{'".to_string());
    // A group-info file is checked field by field first: a `.ckpt` value or a strategy item
    // would pass a looser look at its first field.
    let protobuf: [(FileFormat, Sniff); 3] = [
        (FileFormat::GroupInfo, group_info::sniff),
        (FileFormat::MsStrategy, ms_strategy::sniff),
        (FileFormat::MsCkpt, ms_ckpt::sniff),
    ];
    for (format, sniff) in protobuf {
        match sniff(bytes) {
            Ok(evidence) => return Ok(found(format, evidence)),
            Err(why) => ruled_out.push(why),
        }
    }
    Err(ruled_out)
}

#[cfg(test)]
thread_local! {
    /// How many times this thread's [`json_format`] walked a JSON text (a pass over the whole
    /// file), for tests that a file is read once.
    pub(crate) static JSON_PASSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// How many times this thread opened a file to detect or read a strategy
    /// ([`detect_read`], [`crate::Strategy::load`]).
    pub(crate) static FILE_READS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The format of a JSON file given whole (`bytes` of `len`), told by its top-level keys, or why
/// it is none.
pub(crate) fn json_format(bytes: &[u8], len: u64) -> std::result::Result<Detected, String> {
    #[cfg(test)]
    JSON_PASSES.with(|n| n.set(n.get() + 1));
    if (bytes.len() as u64) < len {
        return Err(format!(
            "JSON of {len} bytes, over the {MAX_JSON_BYTES}-byte limit of a file read whole"
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "a JSON file must be UTF-8".to_string())?;
    let keys = object_keys(text).map_err(|e| format!("not valid JSON ({e})"))?;
    // In this order: a MindSpore strategy also has "parallel_strategy_item".
    let tessera = keys.format.as_deref() == Some(tessera_strategy::FORMAT_NAME);
    let kinds = [
        (
            tessera,
            FileFormat::TesseraStrategy,
            "\"format\": \"tessera-strategy\"",
        ),
        (
            keys.has("parallel_layout_item"),
            FileFormat::MsStrategyJson,
            "\"parallel_layout_item\"",
        ),
        (
            keys.has("parallel_strategy_item") || keys.has("parallel_layout_value_item"),
            FileFormat::OperatorStrategy,
            "\"parallel_strategy_item\" and no \"parallel_layout_item\"",
        ),
        (
            keys.has("weight_map"),
            FileFormat::UnifiedIndex,
            "\"weight_map\"",
        ),
    ];
    match kinds.into_iter().find(|(matches, _, _)| *matches) {
        Some((_, format, keys)) => Ok(Detected {
            format,
            evidence: format!("a JSON object with {keys}"),
            n_bytes: len,
        }),
        None => Err("JSON that is neither a Tessera strategy (\"format\": \"tessera-strategy\") nor a MindSpore one (\"parallel_layout_item\"), nor an operator strategy file (\"parallel_strategy_item\") or a unified checkpoint index (\"weight_map\")".to_string()),
    }
}

/// The format a checkpoint loader reads `path` in, from its first bytes `head` (of a file of
/// `len` bytes), and the cipher whose magic number the bytes start with, if any. The extension
/// decides when it names a checkpoint format: the name is the caller's declaration, and a
/// damaged file then gets its own format's precise error. A name that says nothing leaves it to the detection step
/// (`.ckpt` unless the bytes start like safetensors).
pub(crate) fn checkpoint_format(
    path: &Path,
    head: &[u8],
    len: u64,
) -> (Format, Option<CipherMode>) {
    let detected = detect_bytes(head, len).ok().map(|d| d.format);
    let format = Format::from_path(path)
        .or_else(|| detected.and_then(FileFormat::checkpoint_format))
        .unwrap_or(Format::Ckpt);
    let cipher = match detected {
        Some(FileFormat::MsCkptEncrypted(mode)) => Some(mode),
        _ => None,
    };
    (format, cipher)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format_of(bytes: &[u8]) -> std::result::Result<FileFormat, Vec<String>> {
        detect_bytes(bytes, bytes.len() as u64).map(|d| d.format)
    }

    #[test]
    fn each_family_is_told_apart() {
        let mut st = 2u64.to_le_bytes().to_vec();
        st.extend_from_slice(b"{}");
        assert_eq!(format_of(&st), Ok(FileFormat::Safetensors));
        assert_eq!(
            format_of(br#" {"format": "tessera-strategy", "version": 1}"#),
            Ok(FileFormat::TesseraStrategy)
        );
        assert_eq!(
            format_of(br#"{"current_stage": 0, "parallel_layout_item": {}}"#),
            Ok(FileFormat::MsStrategyJson)
        );
        assert_eq!(
            format_of(br#"{"parallel_strategy_item": {}}"#),
            Ok(FileFormat::OperatorStrategy)
        );
        assert_eq!(
            format_of(br#"{"weight_map": {}}"#),
            Ok(FileFormat::UnifiedIndex)
        );
        // ParallelStrategyMap: current_stage = 1.
        assert_eq!(format_of(&[0x08, 0x01]), Ok(FileFormat::MsStrategy));
        // ParallelGroupMap: ckpt_restore_rank_list = [0, 2].
        assert_eq!(
            format_of(&[0x12, 0x04, 0x08, 0x00, 0x08, 0x02]),
            Ok(FileFormat::GroupInfo)
        );
        let aes = 0x7F3A_5ED8u32.to_le_bytes();
        assert_eq!(
            format_of(&aes),
            Ok(FileFormat::MsCkptEncrypted(CipherMode::AesGcm))
        );
    }

    #[test]
    fn a_checkpoint_value_is_recognised_from_its_first_bytes() {
        // Checkpoint { value { tag "w", tensor { dims 2, tensor_type "Float32", content … } } },
        // cut inside the content.
        let mut bytes = vec![
            0x0a, 0x1a, 0x0a, 0x01, b'w', 0x12, 0x15, 0x08, 0x02, 0x12, 0x07,
        ];
        bytes.extend_from_slice(b"Float32");
        bytes.extend_from_slice(&[0x1a, 0x08, 0, 0, 0]);
        let d = detect_bytes(&bytes, 1000).unwrap();
        assert_eq!(d.format, FileFormat::MsCkpt);
        assert!(d.evidence.contains("Float32"), "{}", d.evidence);
    }

    #[test]
    fn nothing_matched_names_every_family_ruled_out() {
        let why = format_of(b"\xff\xff\xff garbage").unwrap_err();
        assert!(why.iter().any(|w| w.contains("safetensors")), "{why:?}");
        assert!(why.iter().any(|w| w.contains("JSON")), "{why:?}");
        assert!(why.iter().any(|w| w.contains(".ckpt")), "{why:?}");
        assert_eq!(format_of(b"").unwrap_err(), ["the file is empty"]);
        assert!(format_of(b"{\"a\": ").unwrap_err()[1].contains("not valid JSON"));
    }

    #[test]
    fn a_checkpoint_name_decides_and_content_decides_without_one() {
        let mut st = 2u64.to_le_bytes().to_vec();
        st.extend_from_slice(b"{}");
        let check = |name: &str, bytes: &[u8]| {
            checkpoint_format(Path::new(name), bytes, bytes.len() as u64)
        };
        assert_eq!(check("a.ckpt", &st), (Format::Ckpt, None));
        assert_eq!(check("a.bin", &st), (Format::Safetensors, None));
        assert_eq!(check("a.bin", b"\x0a\x00"), (Format::Ckpt, None));
        let aes = 0x7F3A_5ED9u32.to_le_bytes();
        assert_eq!(
            check("a.ckpt", &aes),
            (Format::Ckpt, Some(CipherMode::AesCbc))
        );
        assert_eq!(
            check("a.safetensors", &aes),
            (Format::Safetensors, Some(CipherMode::AesCbc))
        );
    }
}
