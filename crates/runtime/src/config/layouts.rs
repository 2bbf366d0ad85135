//! Layout-valued strategies: `[parallel.mesh]` (MindSpore's `Layout(device_matrix,
//! alias_name)`) and strategy entries written as per-dim aliases instead of split factors.
//!
//! An entry of `[parallel.shard]`, `[parallel.out_shard]` or `parallel.dataset_strategy` is,
//! per operand, either a tuple of split factors (`[2, 4]`) or a list of per-dim entries, each an
//! alias (`"dp"`), `"None"` (not split) or a list of aliases (`["dp", "sp"]`: the dim split by
//! both, the first outermost) — MindSpore's `layout("dp", ("sp", "mp"))`. One entry is all
//! tuples or all layouts; a table may mix entries of both kinds.

use layout::{DimSpec, Layout, LayoutError, INTERLEAVED_ALIAS};
use parallel::{DatasetStrategy, OpStrategy};
use toml::Value;

use super::values::{config_error, describe, read_positive, read_strategy, read_string, Section};
use crate::error::RuntimeError;

/// The keys of `[parallel.mesh]`.
pub(super) const MESH_KEYS: &[&str] = &["device_matrix", "alias_name"];

/// One strategy entry: split tuples or layouts, one per operand.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum StrategyEntry {
    /// Split factors per operand: `[[2, 4], [4, 1]]`.
    Tuples(Vec<Vec<usize>>),
    /// A layout per operand on the `[parallel.mesh]` device matrix.
    Layouts(Vec<Layout>),
}

impl StrategyEntry {
    /// The op strategy of this in_strategy entry and the op's out_strategy entry, if any.
    pub(super) fn into_op_strategy(self, out: Option<StrategyEntry>) -> OpStrategy {
        let strategy = match self {
            StrategyEntry::Tuples(inputs) => OpStrategy::from_tuples(inputs, None),
            StrategyEntry::Layouts(inputs) => OpStrategy::from_layouts(inputs, None),
        };
        match out {
            None => strategy,
            Some(StrategyEntry::Tuples(outputs)) => strategy.with_out_tuples(outputs),
            Some(StrategyEntry::Layouts(outputs)) => strategy.with_out_layouts(outputs),
        }
    }

    /// The dataset strategy this entry gives.
    pub(super) fn into_dataset_strategy(self) -> DatasetStrategy {
        match self {
            StrategyEntry::Tuples(tuples) => DatasetStrategy::PerInput(tuples),
            StrategyEntry::Layouts(layouts) => DatasetStrategy::Layouts(layouts),
        }
    }
}

/// `[parallel.mesh]`: the device matrix every layout-valued entry is applied to. The
/// aliases must be as many as the axes, distinct, non-empty and not `"None"` (MindSpore's
/// rules); the product of the matrix must equal the device count (checked by the parallel pass,
/// as `--devices` may change the count).
pub(super) fn read_mesh(key: &str, value: Value) -> Result<Layout, RuntimeError> {
    let mut s = Section::new(key, value, MESH_KEYS)?;
    let device_matrix = s.require("device_matrix", |k, v| {
        read_list(
            k,
            v,
            "a list of positive integers, e.g. [2, 2, 2]",
            read_positive,
        )
    })?;
    let alias_name = s.require("alias_name", |k, v| {
        read_list(
            k,
            v,
            "a list of strings, e.g. [\"dp\", \"sp\", \"mp\"]",
            read_string,
        )
    })?;
    if alias_name.iter().any(|a| a == INTERLEAVED_ALIAS) {
        return Err(config_error(
            &format!("{key}.alias_name"),
            format!("\"{INTERLEAVED_ALIAS}\" is not supported in training strategies"),
        ));
    }
    Layout::new(&device_matrix, &alias_name, None).map_err(|e| {
        let culprit = match e {
            LayoutError::AliasCountMismatch { .. }
            | LayoutError::EmptyAlias
            | LayoutError::AliasIsNone
            | LayoutError::DuplicateAlias { .. }
            | LayoutError::InterleavedNotLast { .. } => "alias_name",
            _ => "device_matrix",
        };
        config_error(&format!("{key}.{culprit}"), e.to_string())
    })
}

/// A non-empty TOML list, each item read by `read` (named `key[i]`).
fn read_list<T>(
    key: &str,
    value: Value,
    expected: &str,
    read: impl Fn(&str, Value) -> Result<T, RuntimeError>,
) -> Result<Vec<T>, RuntimeError> {
    match value {
        Value::Array(items) if !items.is_empty() => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| read(&format!("{key}[{i}]"), item))
            .collect(),
        other => Err(config_error(
            key,
            format!("expected {expected}, got {}", describe(&other)),
        )),
    }
}

/// Whether a per-operand item is written as a layout: a list holding a string or a list.
fn is_layout_item(item: &Value) -> bool {
    matches!(item, Value::Array(dims) if dims.iter().any(|d| matches!(d, Value::String(_) | Value::Array(_))))
}

/// A strategy entry: split tuples, or layouts on `mesh` (`[parallel.mesh]`, which a layout
/// entry needs).
pub(super) fn read_strategy_entry(
    key: &str,
    value: Value,
    mesh: Option<&Layout>,
) -> Result<StrategyEntry, RuntimeError> {
    let Value::Array(items) = &value else {
        return read_strategy(key, value).map(StrategyEntry::Tuples);
    };
    let n_layouts = items.iter().filter(|item| is_layout_item(item)).count();
    if n_layouts == 0 {
        return read_strategy(key, value).map(StrategyEntry::Tuples);
    }
    if n_layouts != items.len() {
        return Err(config_error(
            key,
            "mixes split tuples and layouts: give every operand as a tuple of integers, or every \
             operand as a layout (a list of per-dim aliases, \"None\" or lists of aliases)",
        ));
    }
    let Some(mesh) = mesh else {
        return Err(config_error(
            key,
            "a layout entry needs [parallel.mesh] (device_matrix and alias_name) to name its axes",
        ));
    };
    let Value::Array(items) = value else {
        unreachable!("checked above to be a list");
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| read_layout(key, i, item, mesh))
        .collect::<Result<_, _>>()
        .map(StrategyEntry::Layouts)
}

/// Operand `i` of entry `key` as a layout on `mesh`.
fn read_layout(key: &str, i: usize, item: Value, mesh: &Layout) -> Result<Layout, RuntimeError> {
    let rule = "a layout dim is an alias, \"None\" or a non-empty list of aliases";
    let Value::Array(dims) = item else {
        return Err(config_error(
            key,
            format!(
                "[{i}] is {}: expected a layout (a list of per-dim entries)",
                describe(&item)
            ),
        ));
    };
    let specs = dims
        .into_iter()
        .enumerate()
        .map(|(d, dim)| match dim {
            Value::String(alias) => Ok(DimSpec::from(alias.as_str())),
            Value::Array(aliases) if !aliases.is_empty() => aliases
                .into_iter()
                .map(|alias| match alias {
                    Value::String(alias) if alias != "None" => Ok(alias),
                    other => Err(config_error(
                        key,
                        format!("[{i}][{d}] holds {}: {rule}", describe(&other)),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(DimSpec::Axes),
            other => Err(config_error(
                key,
                format!("[{i}][{d}] is {}: {rule}", describe(&other)),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    mesh.apply(&specs).map_err(|e| {
        config_error(
            key,
            format!("[{i}]: {e} (the aliases of [parallel.mesh]; each may split one dim of an operand once)"),
        )
    })
}
