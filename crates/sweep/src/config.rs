//! A drawn configuration as dotted keys and TOML values, and its TOML text.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A configuration as dotted keys (`parallel.hsdp.threshold`) and their TOML values.
#[derive(Clone, Default)]
pub struct Config(pub BTreeMap<String, String>);

impl Config {
    /// Sets `key` to the TOML value `value`.
    pub fn set(&mut self, key: &str, value: impl ToString) {
        self.0.insert(key.to_string(), value.to_string());
    }

    /// Sets `key` to the string `value`.
    pub fn set_str(&mut self, key: &str, value: &str) {
        self.set(key, format!("\"{value}\""));
    }

    /// `key`'s value as a count, when set.
    pub fn usize(&self, key: &str) -> Option<usize> {
        self.0.get(key).map(|v| v.parse().expect("a count"))
    }

    /// This config with every key of `other` added (or replaced).
    pub fn with(&self, other: &Config) -> Config {
        let mut all = self.clone();
        all.0
            .extend(other.0.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }

    /// The TOML text: one table per key prefix.
    pub fn toml(&self) -> String {
        let mut tables: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
        for (key, value) in &self.0 {
            let (table, name) = key.rsplit_once('.').expect("a dotted key");
            tables.entry(table).or_default().push((name, value));
        }
        let mut text = String::new();
        for (table, keys) in tables {
            writeln!(text, "[{table}]").unwrap();
            for (name, value) in keys {
                writeln!(text, "{name} = {value}").unwrap();
            }
        }
        text
    }
}
