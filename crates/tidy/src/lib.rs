//! Repository checks that keep the tree a place others can live in, run as this crate's tests
//! (`cargo test -p tessera-tidy`):
//!
//! - every edge between workspace crates is one that ARCHITECTURE.md's "Crate edges" table
//!   allows, and the table names every crate;
//! - every Rust source file opens with its `//!` header;
//! - every library crate denies missing docs.
//!
//! The library holds the parsing, so that the checks themselves can be tested on made-up trees.

#![deny(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Crate (by directory name) → the workspace crates it may depend on.
pub type EdgeTable = BTreeMap<String, BTreeSet<String>>;

/// The title of ARCHITECTURE.md's section holding the allowed edges.
pub const EDGES_SECTION: &str = "## Crate edges";

/// The allowed edges of ARCHITECTURE.md's [`EDGES_SECTION`]: its table rows
/// `` | `crate` | `dep`, `dep` | `` (`—` for none). `Err` names what is malformed.
pub fn parse_edge_table(architecture: &str) -> Result<EdgeTable, String> {
    let start = architecture
        .find(EDGES_SECTION)
        .ok_or_else(|| format!("ARCHITECTURE.md has no section \"{EDGES_SECTION}\""))?;
    let section = &architecture[start + EDGES_SECTION.len()..];
    let section = section.find("\n## ").map_or(section, |end| &section[..end]);
    let mut table = EdgeTable::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(name), Some(deps)) = (cells.get(1), cells.get(2)) else {
            return Err(format!("malformed edge row: {line}"));
        };
        let name = name.trim_matches('`').to_string();
        let deps: BTreeSet<String> = deps
            .split(',')
            .map(|d| d.trim().trim_matches('`').to_string())
            .filter(|d| !d.is_empty() && d != "—")
            .collect();
        if table.insert(name.clone(), deps).is_some() {
            return Err(format!("crate {name} has two edge rows"));
        }
    }
    if table.is_empty() {
        return Err(format!("\"{EDGES_SECTION}\" has no rows"));
    }
    Ok(table)
}

/// The workspace's crates, by the name of their directory (`crates/reshard-exec` →
/// `reshard-exec`), from the root manifest's `[workspace] members`.
pub fn workspace_crates(root: &Path) -> Result<BTreeMap<String, PathBuf>, String> {
    let manifest = read_toml(&root.join("Cargo.toml"))?;
    let members = manifest
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(toml::Value::as_array)
        .ok_or("the root Cargo.toml has no [workspace] members")?;
    members
        .iter()
        .map(|m| {
            let path = m
                .as_str()
                .ok_or("a workspace member that is not a string")?;
            Ok((dir_name(Path::new(path))?, root.join(path)))
        })
        .collect()
}

/// The dependency keys of `[workspace.dependencies]` that are workspace crates, mapped to
/// their crates' directory names (`reshard_exec` → `reshard-exec`).
pub fn workspace_dependency_keys(root: &Path) -> Result<BTreeMap<String, String>, String> {
    let manifest = read_toml(&root.join("Cargo.toml"))?;
    let deps = manifest
        .get("workspace")
        .and_then(|w| w.get("dependencies"))
        .and_then(toml::Value::as_table)
        .ok_or("the root Cargo.toml has no [workspace.dependencies]")?;
    deps.iter()
        .filter_map(|(key, spec)| Some((key, spec.get("path")?.as_str()?)))
        .map(|(key, path)| Ok((key.clone(), dir_name(Path::new(path))?)))
        .collect()
}

/// The workspace crates among the normal dependencies (`[dependencies]` and every
/// `[target.*.dependencies]`) of the crate in `dir`, by directory name (`keys` maps a
/// dependency key to it); dev- and build-dependencies are not edges of the layering.
pub fn internal_dependencies(
    dir: &Path,
    keys: &BTreeMap<String, String>,
) -> Result<BTreeSet<String>, String> {
    let manifest = read_toml(&dir.join("Cargo.toml"))?;
    let mut tables = Vec::new();
    if let Some(deps) = manifest.get("dependencies").and_then(toml::Value::as_table) {
        tables.push(deps);
    }
    if let Some(targets) = manifest.get("target").and_then(toml::Value::as_table) {
        tables.extend(
            targets
                .values()
                .filter_map(|t| t.get("dependencies").and_then(toml::Value::as_table)),
        );
    }
    Ok(tables
        .into_iter()
        .flat_map(|t| t.keys())
        .filter_map(|k| keys.get(k))
        .cloned()
        .collect())
}

fn dir_name(path: &Path) -> Result<String, String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| format!("workspace member {} has no directory name", path.display()))
}

/// Every edge of the workspace that `allowed` does not list, and every crate it does not
/// name, as readable lines (empty: the graph is the allowed one).
pub fn edge_violations(
    edges: &BTreeMap<String, BTreeSet<String>>,
    allowed: &EdgeTable,
) -> Vec<String> {
    let mut out = Vec::new();
    for (name, deps) in edges {
        let Some(ok) = allowed.get(name) else {
            out.push(format!(
                "crate {name} has no row in ARCHITECTURE.md's \"{EDGES_SECTION}\""
            ));
            continue;
        };
        for dep in deps.difference(ok) {
            out.push(format!(
                "{name} → {dep} is not an edge ARCHITECTURE.md allows"
            ));
        }
    }
    for name in allowed.keys().filter(|n| !edges.contains_key(*n)) {
        out.push(format!(
            "ARCHITECTURE.md lists crate {name}, which the workspace does not have"
        ));
    }
    out
}

/// Whether a Rust source opens with a `//!` header (after any leading blank lines).
pub fn has_header(source: &str) -> bool {
    source
        .lines()
        .find(|l| !l.trim().is_empty())
        .is_some_and(|l| l.trim_start().starts_with("//!"))
}

/// The `.rs` files under `dir`, recursively, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn read_toml(path: &Path) -> Result<toml::Table, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.parse::<toml::Table>()
        .map_err(|e| format!("{}: {e}", path.display()))
}
