//! Helpers for the unit tests.

use layout::{DimSpec, Layout, TensorLayout};

/// A layout of `shape` over a mesh `dev` named `names`, with per-dim map entries written as on
/// the command line (`dp`, `None`, `dp+mp`).
pub fn tl(dev: &[usize], names: &[&str], map: &[&str], shape: &[usize]) -> TensorLayout {
    let entries: Vec<DimSpec> = map.iter().map(|m| DimSpec::parse(m)).collect();
    Layout::new(dev, names, None)
        .unwrap()
        .apply(&entries)
        .unwrap()
        .bind(shape)
        .unwrap()
}
