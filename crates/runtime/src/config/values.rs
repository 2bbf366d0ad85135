//! Typed reading of TOML values: every reader names the key and the expected type in its error.

use std::path::{Path, PathBuf};

use toml::{Table, Value};

use crate::error::RuntimeError;

pub(super) fn config_error(key: &str, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Config {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// `value` for messages: its TOML type and text.
pub(super) fn describe(value: &Value) -> String {
    format!("{} {value}", value.type_str())
}

pub(super) fn one_of(names: &[&str]) -> String {
    names.join(", ")
}

/// A table being read: keys are removed as they are taken.
pub(super) struct Section {
    name: String,
    table: Table,
}

impl Section {
    /// Section `name` from `value`, which must be a table holding only `valid` keys.
    pub(super) fn new(name: &str, value: Value, valid: &[&str]) -> Result<Section, RuntimeError> {
        let table = match value {
            Value::Table(table) => table,
            other => {
                return Err(config_error(
                    name,
                    format!("expected a table ([{name}]), got {}", describe(&other)),
                ))
            }
        };
        if let Some(unknown) = table.keys().find(|k| !valid.contains(&k.as_str())) {
            return Err(config_error(
                &format!("{name}.{unknown}"),
                format!("unknown key (valid keys of [{name}]: {})", one_of(valid)),
            ));
        }
        Ok(Section {
            name: name.to_string(),
            table,
        })
    }

    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.name)
    }

    /// Key `key` read by `read`, if present.
    pub(super) fn get<T>(
        &mut self,
        key: &str,
        read: impl Fn(&str, Value) -> Result<T, RuntimeError>,
    ) -> Result<Option<T>, RuntimeError> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(value) => read(&self.key(key), value).map(Some),
        }
    }

    /// Key `key`, which must be present.
    pub(super) fn require<T>(
        &mut self,
        key: &str,
        read: impl Fn(&str, Value) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let full = self.key(key);
        self.get(key, read)?
            .ok_or_else(|| config_error(&full, "missing required key"))
    }

    /// Key `key`, or `default` when absent.
    pub(super) fn or<T>(
        &mut self,
        key: &str,
        default: T,
        read: impl Fn(&str, Value) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        Ok(self.get(key, read)?.unwrap_or(default))
    }

    /// Removes key `key` unread; whether it was present.
    pub(super) fn discard(&mut self, key: &str) -> bool {
        self.table.remove(key).is_some()
    }

    /// Whether key `key` is present.
    pub(super) fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    /// Whether key `key` is a table holding key `inner` (read before the table is taken, to
    /// tell a value given from its default).
    pub(super) fn has_in(&self, key: &str, inner: &str) -> bool {
        matches!(self.table.get(key), Some(Value::Table(t)) if t.contains_key(inner))
    }
}

pub(super) fn wrong_type(key: &str, expected: &str, value: &Value) -> RuntimeError {
    // `--set` keeps a value TOML cannot read as a string: an integer past 64 bits among them.
    if let Value::String(text) = value {
        let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
        let integer = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
        if integer && text.parse::<i64>().is_err() {
            return config_error(
                key,
                format!(
                    "expected {expected}, got {text}, an integer outside the range TOML integers have ({} to {})",
                    i64::MIN,
                    i64::MAX
                ),
            );
        }
    }
    config_error(key, format!("expected {expected}, got {}", describe(value)))
}

pub(super) fn read_positive(key: &str, value: Value) -> Result<usize, RuntimeError> {
    match value {
        Value::Integer(n) if n >= 1 => {
            usize::try_from(n).map_err(|_| config_error(key, format!("{n} is too large")))
        }
        Value::Integer(n) => Err(config_error(
            key,
            format!("{n} is out of range: it must be ≥ 1"),
        )),
        other => Err(wrong_type(key, "a positive integer", &other)),
    }
}

/// A positive integer at most `max` (`what` says what it counts), checked before it drives
/// any work.
pub(super) fn read_at_most(
    key: &str,
    value: Value,
    max: usize,
    what: &str,
) -> Result<usize, RuntimeError> {
    let n = read_positive(key, value)?;
    if n > max {
        return Err(config_error(
            key,
            format!("{n} is out of range: it must be between 1 and {max} ({what})"),
        ));
    }
    Ok(n)
}

/// The most validation batches one evaluation runs (`data.eval_batches`): every epoch's end
/// runs them all before the checkpoint is written.
pub(super) const MAX_EVAL_BATCHES: usize = 65536;

/// A device count: positive and within the process-wide rank ceiling
/// ([`layout::limits::max_ranks`]), checked before anything per device is allocated.
pub(super) fn read_device_count(key: &str, value: Value) -> Result<usize, RuntimeError> {
    let devices = read_positive(key, value)?;
    check_device_count(key, devices)?;
    Ok(devices)
}

/// Checks a device count named by `key` (a config key or a flag) against the rank ceiling.
pub(super) fn check_device_count(key: &str, devices: usize) -> Result<(), RuntimeError> {
    let max = layout::limits::max_ranks();
    if devices > max {
        return Err(config_error(
            key,
            format!("{devices} devices is above the limit of {max} ranks (set TESSERA_MAX_RANKS to change the limit)"),
        ));
    }
    Ok(())
}

/// The most micro-steps one optimizer step may accumulate
/// (`train.grad_accumulation_steps`): a bound on the loop, not on memory (the accumulated
/// gradients take one gradient's memory whatever the count).
pub(super) const MAX_GRAD_ACCUMULATION_STEPS: usize = 65536;

/// Checks `train.grad_accumulation_steps` (named by `key`): 1 to
/// [`MAX_GRAD_ACCUMULATION_STEPS`].
pub(super) fn check_grad_accumulation_steps(key: &str, steps: usize) -> Result<(), RuntimeError> {
    if steps == 0 || steps > MAX_GRAD_ACCUMULATION_STEPS {
        return Err(config_error(
            key,
            format!(
                "{steps} is out of range: it must be between 1 and {MAX_GRAD_ACCUMULATION_STEPS} (micro-steps per optimizer step)"
            ),
        ));
    }
    Ok(())
}

pub(super) fn read_count(key: &str, value: Value) -> Result<u64, RuntimeError> {
    match value {
        Value::Integer(n) => u64::try_from(n)
            .map_err(|_| config_error(key, format!("{n} is out of range: it must be ≥ 0"))),
        other => Err(wrong_type(key, "a non-negative integer", &other)),
    }
}

pub(super) fn read_float(key: &str, value: Value) -> Result<f64, RuntimeError> {
    match value {
        Value::Float(x) => Ok(x),
        Value::Integer(n) => Ok(n as f64),
        other => Err(wrong_type(key, "a number", &other)),
    }
}

/// A number in [0, 1) (a probability that must leave something: `model.dropout`,
/// `data.val_fraction`).
pub(super) fn read_unit_fraction(key: &str, value: Value) -> Result<f64, RuntimeError> {
    let fraction = read_float(key, value)?;
    if !(0.0..1.0).contains(&fraction) {
        return Err(config_error(
            key,
            format!("{fraction} is out of range: it must be at least 0 and below 1"),
        ));
    }
    Ok(fraction)
}

pub(super) fn read_bool(key: &str, value: Value) -> Result<bool, RuntimeError> {
    match value {
        Value::Boolean(b) => Ok(b),
        other => Err(wrong_type(key, "a boolean (true or false)", &other)),
    }
}

pub(super) fn read_string(key: &str, value: Value) -> Result<String, RuntimeError> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(wrong_type(key, "a string", &other)),
    }
}

/// A string naming one of `names`, mapped by `parse`.
pub(super) fn read_enum<T>(
    key: &str,
    value: Value,
    names: &[&str],
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T, RuntimeError> {
    let text = read_string(key, value)?;
    parse(&text).ok_or_else(|| {
        config_error(
            key,
            format!("unknown value \"{text}\" (valid: {})", one_of(names)),
        )
    })
}

/// A list of split tuples: `[[2, 4], [4, 1]]`, every factor ≥ 1.
pub(super) fn read_strategy(key: &str, value: Value) -> Result<Vec<Vec<usize>>, RuntimeError> {
    let expected = "a list of lists of positive integers, e.g. [[2, 4], [4, 1]]";
    let Value::Array(tuples) = value else {
        return Err(wrong_type(key, expected, &value));
    };
    if tuples.is_empty() {
        return Err(config_error(
            key,
            format!("empty list: expected {expected}"),
        ));
    }
    tuples
        .into_iter()
        .enumerate()
        .map(|(i, tuple)| match tuple {
            Value::Array(factors) => factors
                .into_iter()
                .enumerate()
                .map(|(j, factor)| match factor {
                    Value::Integer(n) if n >= 1 => usize::try_from(n)
                        .map_err(|_| config_error(key, format!("[{i}][{j}] = {n} is too large"))),
                    other => Err(config_error(
                        key,
                        format!(
                            "[{i}][{j}] is {}: split factors must be integers ≥ 1",
                            describe(&other)
                        ),
                    )),
                })
                .collect(),
            other => Err(config_error(
                key,
                format!("[{i}] is {}: expected {expected}", describe(&other)),
            )),
        })
        .collect()
}

/// A path, relative ones resolved against `base`.
pub(super) fn path_reader(
    base: &Path,
) -> impl Fn(&str, Value) -> Result<PathBuf, RuntimeError> + '_ {
    move |key, value| {
        let text = read_string(key, value)?;
        if text.is_empty() {
            return Err(config_error(key, "empty path"));
        }
        Ok(base.join(text))
    }
}
