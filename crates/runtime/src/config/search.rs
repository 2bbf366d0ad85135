//! `[parallel]`'s automatic-parallel keys: the device profile, the memory budget, the search's
//! time budget and the operator strategy files.

use std::path::{Path, PathBuf};

use toml::Value;

use super::values::{
    config_error, path_reader, read_bool, read_float, read_string, wrong_type, Section,
};
use crate::error::RuntimeError;

/// The keys of `[parallel]` the searches read.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchKeys {
    /// `parallel.device_profile`: a built-in profile's name or a profile TOML file (resolved
    /// against the working directory). Default `h100-nvlink-ib`.
    pub device_profile: ProfileChoice,
    /// `parallel.max_device_memory`: bytes of memory per device (the profile's when unset).
    pub max_device_memory: Option<u64>,
    /// `parallel.search_time_budget`: seconds dynamic programming may search before it fixes
    /// the remaining ops greedily and reports its gap. Default 60.
    pub search_time_budget: f64,
    /// `parallel.save_operator_strategy_file`: where the found strategies are written
    /// (MindSpore's operator strategy JSON).
    pub save_operator_strategy_file: Option<PathBuf>,
    /// `parallel.load_operator_strategy_file`: strategies to use instead of searching.
    pub load_operator_strategy_file: Option<PathBuf>,
    /// `parallel.auto_pipeline`: the search also chooses the pipeline stage count, the layers
    /// of each stage and the strategies within each stage's devices. Default false.
    pub auto_pipeline: bool,
}

/// A device profile by name or file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileChoice {
    /// A built-in profile (`h100-nvlink-ib`, `ascend910b-hccs-roce`).
    BuiltIn(String),
    /// A profile TOML file (what `tessera bench profile` writes).
    File(PathBuf),
}

impl ProfileChoice {
    /// A built-in name as itself, anything else as a path against `base` (the empty string as
    /// the empty path, which [`crate::load_profile`] refuses, not as `base`).
    pub fn parse(text: &str, base: &Path) -> ProfileChoice {
        if text.is_empty() {
            ProfileChoice::File(PathBuf::new())
        } else if ::search::profiles::BUILT_IN.contains(&text) {
            ProfileChoice::BuiltIn(text.to_string())
        } else {
            ProfileChoice::File(base.join(text))
        }
    }
}

/// Why an empty device profile is refused.
pub(crate) fn empty_profile() -> String {
    format!(
        "\"\" is an empty path: name a built-in profile ({}) or a profile TOML file",
        ::search::profiles::BUILT_IN.join(", ")
    )
}

impl Default for SearchKeys {
    fn default() -> SearchKeys {
        SearchKeys {
            device_profile: ProfileChoice::BuiltIn("h100-nvlink-ib".to_string()),
            max_device_memory: None,
            search_time_budget: 60.0,
            save_operator_strategy_file: None,
            load_operator_strategy_file: None,
            auto_pipeline: false,
        }
    }
}

/// The most device memory a config may state: 1 PiB.
const MAX_DEVICE_MEMORY: u64 = 1 << 50;

/// Bytes from an integer or a string with a unit (`"80GB"`, `"64GiB"`, `"512MB"`).
fn read_memory(key: &str, value: Value) -> Result<u64, RuntimeError> {
    let bytes = match &value {
        Value::Integer(n) if *n > 0 => *n as u64,
        Value::String(text) => {
            let t = text.trim();
            let split = t
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(t.len());
            let (number, unit) = t.split_at(split);
            let number: f64 = number.parse().map_err(|_| {
                config_error(
                    key,
                    format!("{text:?} is not a size such as \"80GB\" or \"64GiB\""),
                )
            })?;
            let scale = match unit.trim() {
                "" | "B" => 1.0,
                "KB" => 1e3,
                "MB" => 1e6,
                "GB" => 1e9,
                "TB" => 1e12,
                "KiB" => 1024.0,
                "MiB" => (1u64 << 20) as f64,
                "GiB" => (1u64 << 30) as f64,
                "TiB" => (1u64 << 40) as f64,
                other => {
                    return Err(config_error(
                        key,
                        format!(
                            "unknown unit {other:?} (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
                        ),
                    ))
                }
            };
            let bytes = number * scale;
            if !(1.0..=MAX_DEVICE_MEMORY as f64).contains(&bytes) {
                return Err(config_error(
                    key,
                    format!("{text:?} is out of range: it must be between 1 byte and 1 PiB"),
                ));
            }
            bytes as u64
        }
        other => {
            return Err(wrong_type(
                key,
                "a positive integer of bytes or a size string",
                other,
            ))
        }
    };
    if bytes > MAX_DEVICE_MEMORY {
        return Err(config_error(
            key,
            format!("{bytes} bytes is over the 1 PiB limit"),
        ));
    }
    Ok(bytes)
}

/// Reads the search keys of `[parallel]`.
pub(super) fn read_search_keys(s: &mut Section, base: &Path) -> Result<SearchKeys, RuntimeError> {
    let defaults = SearchKeys::default();
    let device_profile = s.or("device_profile", defaults.device_profile, |key, v| {
        let text = read_string(key, v)?;
        if text.is_empty() {
            return Err(config_error(key, empty_profile()));
        }
        Ok(ProfileChoice::parse(&text, base))
    })?;
    let max_device_memory = s.get("max_device_memory", read_memory)?;
    let search_time_budget = s.or(
        "search_time_budget",
        defaults.search_time_budget,
        |key, v| {
            let t = read_float(key, v)?;
            if !(t > 0.0 && t <= 86_400.0) {
                return Err(config_error(
                    key,
                    format!("{t} is out of range: it must be between 0 and 86400 seconds"),
                ));
            }
            Ok(t)
        },
    )?;
    let save_operator_strategy_file = s.get("save_operator_strategy_file", path_reader(base))?;
    let load_operator_strategy_file = s.get("load_operator_strategy_file", path_reader(base))?;
    let auto_pipeline = s.or("auto_pipeline", defaults.auto_pipeline, read_bool)?;
    Ok(SearchKeys {
        device_profile,
        max_device_memory,
        search_time_budget,
        save_operator_strategy_file,
        load_operator_strategy_file,
        auto_pipeline,
    })
}
