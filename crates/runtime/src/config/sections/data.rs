//! `[data]`: the dataset's format and where it is, with the image and the text formats' keys.

use std::path::{Path, PathBuf};

use super::discard_unused;
use crate::config::values::{
    config_error, path_reader, read_at_most, read_bool, read_enum, read_float, read_positive,
    Section, MAX_EVAL_BATCHES,
};
use crate::config::{DataConfig, DataFormat, TextDataKeys};
use crate::data::{Normalize, TokenDtype};
use crate::error::RuntimeError;

/// `[data]`'s keys.
pub(in crate::config) const DATA_KEYS: &[&str] = &[
    "format",
    "dir",
    "batch_size",
    "shuffle",
    "pixel_max",
    "normalize",
    "path",
    "tokenizer",
    "val_fraction",
    "dtype",
    "vocab_size",
    "steps_per_epoch",
    "eval_batches",
];

/// The keys only the text formats read.
const TEXT_DATA_KEYS: &[&str] = &[
    "path",
    "tokenizer",
    "val_fraction",
    "dtype",
    "vocab_size",
    "steps_per_epoch",
    "eval_batches",
];

/// The keys only the image format reads.
const IDX_DATA_KEYS: &[&str] = &["dir", "pixel_max", "normalize"];

/// Reads `[data]`; the keys of the other formats are reported in `warnings` and dropped.
pub(super) fn read_data(
    mut s: Section,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<DataConfig, RuntimeError> {
    let format = s.or("format", DataFormat::Idx, |key, v| {
        read_enum(key, v, &["idx", "text", "tokens"], |t| match t {
            "idx" => Some(DataFormat::Idx),
            "text" => Some(DataFormat::Text),
            "tokens" => Some(DataFormat::Tokens),
            _ => None,
        })
    })?;
    if format != DataFormat::Idx {
        let why = format!("with data.format = \"{}\"", format.name());
        discard_unused(&mut s, "data", IDX_DATA_KEYS, &why, warnings);
        let text = read_text_keys(&mut s, format, base, warnings)?;
        return Ok(DataConfig {
            format,
            dir: PathBuf::new(),
            batch_size: s.require("batch_size", read_positive)?,
            shuffle: s.or("shuffle", true, read_bool)?,
            pixel_max: None,
            normalize: Normalize::Standardize,
            text: Some(text),
            batch_cuts: Vec::new(),
        });
    }
    discard_unused(
        &mut s,
        "data",
        TEXT_DATA_KEYS,
        "with data.format = \"idx\"",
        warnings,
    );
    let dir = s.require("dir", path_reader(base))?;
    let batch_size = s.require("batch_size", read_positive)?;
    let shuffle = s.or("shuffle", true, read_bool)?;
    let pixel_max = s.get("pixel_max", |key, v| {
        let x = read_float(key, v)?;
        if x.is_finite() && x > 0.0 && x <= f64::from(f32::MAX) {
            Ok(x as f32)
        } else {
            Err(config_error(
                key,
                format!("{x} is out of range: it must be finite and > 0"),
            ))
        }
    })?;
    let normalize = s.or("normalize", Normalize::Standardize, |key, v| {
        read_enum(key, v, &["standardize", "scale"], Normalize::parse)
    })?;
    Ok(DataConfig {
        format,
        dir,
        batch_size,
        shuffle,
        pixel_max,
        normalize,
        text: None,
        batch_cuts: Vec::new(),
    })
}

/// The text formats' keys of `[data]`.
fn read_text_keys(
    s: &mut Section,
    format: DataFormat,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<TextDataKeys, RuntimeError> {
    let path = s.require("path", path_reader(base))?;
    let char_tokens = s.or("tokenizer", false, |key, v| {
        read_enum(key, v, &["byte", "char"], |t| match t {
            "byte" => Some(false),
            "char" => Some(true),
            _ => None,
        })
    })?;
    let val_fraction = s.or("val_fraction", 0.1, read_float)?;
    if !(0.0..1.0).contains(&val_fraction) {
        return Err(config_error(
            "data.val_fraction",
            format!("{val_fraction} is out of range: it must be at least 0 and below 1"),
        ));
    }
    let dtype_given = s.has("dtype");
    let dtype = s.or("dtype", TokenDtype::U16, |key, v| {
        read_enum(key, v, &["u16", "u32"], TokenDtype::parse)
    })?;
    let vocab_size = s.get("vocab_size", read_positive)?;
    if format == DataFormat::Text {
        let unused = [("dtype", dtype_given), ("vocab_size", vocab_size.is_some())];
        for (key, _) in unused.iter().filter(|(_, given)| *given) {
            warnings.push(format!(
                "data.{key} has no effect with data.format = \"text\" (the tokenizer sets the tokens)"
            ));
        }
    } else if char_tokens {
        warnings.push(
            "data.tokenizer has no effect with data.format = \"tokens\" (the ids are given)"
                .to_string(),
        );
    }
    Ok(TextDataKeys {
        path,
        char_tokens,
        val_fraction,
        dtype,
        vocab_size: if format == DataFormat::Text {
            None
        } else {
            vocab_size
        },
        steps_per_epoch: s.or("steps_per_epoch", 100, |key, v| {
            read_positive(key, v).map(|n| n as u64)
        })?,
        eval_batches: s.or("eval_batches", 4, |key, v| {
            read_at_most(
                key,
                v,
                MAX_EVAL_BATCHES,
                "validation batches per evaluation",
            )
            .map(|n| n as u64)
        })?,
    })
}
