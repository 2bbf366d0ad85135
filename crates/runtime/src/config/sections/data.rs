//! `[data]`: the dataset's format and where it is, with the image and the text formats' keys.

use std::path::{Path, PathBuf};

use toml::Value;

use super::{check_unused, checked, Check};
use crate::config::values::{
    config_error, path_reader, read_at_most, read_bool, read_enum, read_float, read_positive,
    read_unit_fraction, Section, MAX_EVAL_BATCHES,
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

/// Reads `[data]`; the keys of the other formats are checked as where they act, then reported
/// in `warnings` and dropped.
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
    let path = checked(path_reader(base));
    if format != DataFormat::Idx {
        // The keys only the image format reads.
        let idx_keys: [(&str, Check<'_>); 3] = [
            ("dir", &path),
            ("pixel_max", &checked(read_pixel_max)),
            ("normalize", &checked(read_normalize)),
        ];
        let why = format!("with data.format = \"{}\"", format.name());
        check_unused(&mut s, "data", &idx_keys, &why, warnings)?;
        let text = read_text_keys(&mut s, format, base, warnings)?;
        let batch_size = s.require("batch_size", read_positive)?;
        // A text batch is windows at random starts, drawn afresh every step: there is no
        // sample order to shuffle or keep.
        let shuffle = s.get("shuffle", read_bool)?;
        if shuffle.is_some() {
            warnings.push(format!(
                "data.shuffle has no effect with data.format = \"{}\" (each step's windows \
                 start at random positions drawn from train.seed, the epoch and the step)",
                format.name()
            ));
        }
        return Ok(DataConfig {
            format,
            dir: PathBuf::new(),
            batch_size,
            shuffle: shuffle.unwrap_or(true),
            pixel_max: None,
            normalize: Normalize::Standardize,
            text: Some(text),
            batch_cuts: Vec::new(),
        });
    }
    // The keys only the text formats read.
    let text_keys: [(&str, Check<'_>); 7] = [
        ("path", &path),
        ("tokenizer", &checked(read_tokenizer)),
        ("val_fraction", &checked(read_unit_fraction)),
        ("dtype", &checked(read_dtype)),
        ("vocab_size", &checked(read_positive)),
        ("steps_per_epoch", &checked(read_steps_per_epoch)),
        ("eval_batches", &checked(read_eval_batches)),
    ];
    check_unused(
        &mut s,
        "data",
        &text_keys,
        "with data.format = \"idx\"",
        warnings,
    )?;
    let dir = s.require("dir", path_reader(base))?;
    let batch_size = s.require("batch_size", read_positive)?;
    let shuffle = s.or("shuffle", true, read_bool)?;
    let pixel_max = s.get("pixel_max", read_pixel_max)?;
    let normalize = s.or("normalize", Normalize::Standardize, read_normalize)?;
    if pixel_max.is_some() && normalize == Normalize::Standardize {
        // (p / m − mean(p / m)) / std(p / m) = (p − mean(p)) / std(p): the scale cancels.
        warnings.push(
            "data.pixel_max has no effect with data.normalize = \"standardize\" (the inputs \
             are then divided by the standard deviation of the scaled pixels, which cancels \
             the scale; set data.normalize = \"scale\" for inputs pixel / pixel_max)"
                .to_string(),
        );
    }
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
    let tokenizer_given = s.has("tokenizer");
    let char_tokens = s.or("tokenizer", false, read_tokenizer)?;
    let val_fraction = s.or("val_fraction", 0.1, read_unit_fraction)?;
    let dtype_given = s.has("dtype");
    let dtype = s.or("dtype", TokenDtype::U16, read_dtype)?;
    let vocab_size = s.get("vocab_size", read_positive)?;
    if format == DataFormat::Text {
        let unused = [("dtype", dtype_given), ("vocab_size", vocab_size.is_some())];
        for (key, _) in unused.iter().filter(|(_, given)| *given) {
            warnings.push(format!(
                "data.{key} has no effect with data.format = \"text\" (the tokenizer sets the tokens)"
            ));
        }
    } else if tokenizer_given {
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
        steps_per_epoch: s.or("steps_per_epoch", 100, read_steps_per_epoch)?,
        eval_batches: s.or("eval_batches", 4, read_eval_batches)?,
    })
}

/// `data.pixel_max`: a finite number > 0 (within `f32`).
fn read_pixel_max(key: &str, value: Value) -> Result<f32, RuntimeError> {
    let x = read_float(key, value)?;
    if x.is_finite() && x > 0.0 && x <= f64::from(f32::MAX) {
        Ok(x as f32)
    } else {
        Err(config_error(
            key,
            format!("{x} is out of range: it must be finite and > 0"),
        ))
    }
}

/// `data.normalize`: `"standardize"` or `"scale"`.
fn read_normalize(key: &str, value: Value) -> Result<Normalize, RuntimeError> {
    read_enum(key, value, &["standardize", "scale"], Normalize::parse)
}

/// `data.tokenizer`: `"byte"` or `"char"` (whether tokens are characters).
fn read_tokenizer(key: &str, value: Value) -> Result<bool, RuntimeError> {
    read_enum(key, value, &["byte", "char"], |t| match t {
        "byte" => Some(false),
        "char" => Some(true),
        _ => None,
    })
}

/// `data.dtype`: `"u16"` or `"u32"`.
fn read_dtype(key: &str, value: Value) -> Result<TokenDtype, RuntimeError> {
    read_enum(key, value, &["u16", "u32"], TokenDtype::parse)
}

/// `data.steps_per_epoch`: a positive integer.
fn read_steps_per_epoch(key: &str, value: Value) -> Result<u64, RuntimeError> {
    read_positive(key, value).map(|n| n as u64)
}

/// `data.eval_batches`: 1 to [`MAX_EVAL_BATCHES`].
fn read_eval_batches(key: &str, value: Value) -> Result<u64, RuntimeError> {
    read_at_most(
        key,
        value,
        MAX_EVAL_BATCHES,
        "validation batches per evaluation",
    )
    .map(|n| n as u64)
}
