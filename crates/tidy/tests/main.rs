//! The repository's tidy checks on the real tree, and the checks themselves on made-up input
//! (so that a check that could never fail would show here).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use tidy::{
    edge_violations, has_header, internal_dependencies, parse_edge_table, rust_files,
    workspace_crates, workspace_dependency_keys,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn every_crate_edge_is_one_architecture_md_allows() {
    let root = root();
    let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let allowed = parse_edge_table(&architecture).unwrap();
    let keys = workspace_dependency_keys(&root).unwrap();
    let edges: BTreeMap<String, BTreeSet<String>> = workspace_crates(&root)
        .unwrap()
        .into_iter()
        .map(|(name, dir)| {
            let deps = internal_dependencies(&dir, &keys).unwrap();
            (name, deps)
        })
        .collect();
    let violations = edge_violations(&edges, &allowed);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn every_source_file_opens_with_its_header() {
    let root = root();
    let mut dirs = vec![root.join("python/src"), root.join("examples")];
    for dir in workspace_crates(&root).unwrap().values() {
        for sub in ["src", "tests", "benches", "examples"] {
            dirs.push(dir.join(sub));
        }
    }
    let missing: Vec<String> = dirs
        .iter()
        .flat_map(|d| rust_files(d))
        .filter(|f| !has_header(&std::fs::read_to_string(f).unwrap()))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "files without a //! header:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_library_crate_denies_missing_docs() {
    let root = root();
    let mut libs: Vec<PathBuf> = workspace_crates(&root)
        .unwrap()
        .values()
        .map(|d| d.join("src/lib.rs"))
        .filter(|l| l.exists())
        .collect();
    libs.sort();
    let undocumented: Vec<String> = libs
        .iter()
        .filter(|l| {
            !std::fs::read_to_string(l)
                .unwrap()
                .contains("#![deny(missing_docs)]")
        })
        .map(|l| l.display().to_string())
        .collect();
    assert!(
        undocumented.is_empty(),
        "library crates without #![deny(missing_docs)]:\n{}",
        undocumented.join("\n")
    );
}

const TABLE: &str = "# Architecture\n\n## Crate edges\n\n| crate | may depend on |\n|---|---|\n| `layout` | — |\n| `tensor` | `layout` |\n| `ckpt` | `layout`, `tensor` |\n\n## Next\n| `ignored` | `x` |\n";

#[test]
fn the_edge_table_is_read_from_its_section_only() {
    let table = parse_edge_table(TABLE).unwrap();
    assert_eq!(table.len(), 3);
    assert!(table["layout"].is_empty());
    assert_eq!(
        table["ckpt"],
        ["layout", "tensor"].map(String::from).into_iter().collect()
    );
    assert!(parse_edge_table("# no section").is_err());
    let twice = TABLE.replace(
        "| `tensor` | `layout` |",
        "| `tensor` | `layout` |\n| `tensor` | — |",
    );
    assert!(parse_edge_table(&twice).unwrap_err().contains("tensor"));
}

#[test]
fn an_edge_the_table_does_not_allow_is_named() {
    let allowed = parse_edge_table(TABLE).unwrap();
    let set = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let mut edges = BTreeMap::new();
    edges.insert("layout".to_string(), set(&[]));
    edges.insert("tensor".to_string(), set(&["layout"]));
    edges.insert("ckpt".to_string(), set(&["layout", "tensor"]));
    assert!(edge_violations(&edges, &allowed).is_empty());
    edges.insert("ckpt".to_string(), set(&["layout", "comm"]));
    edges.insert("comm".to_string(), set(&["tensor"]));
    let v = edge_violations(&edges, &allowed);
    assert!(v.iter().any(|l| l.contains("ckpt → comm")), "{v:?}");
    assert!(
        v.iter().any(|l| l.contains("crate comm has no row")),
        "{v:?}"
    );
    edges.remove("tensor");
    let v = edge_violations(&edges, &allowed);
    assert!(v.iter().any(|l| l.contains("lists crate tensor")), "{v:?}");
}

#[test]
fn a_dependency_is_read_from_every_normal_table_and_only_those() {
    let dir = tempfile_dir();
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"x\"\n[dependencies]\nlayout.workspace = true\nreshard_exec.workspace = true\nserde = \"1\"\n[target.'cfg(unix)'.dependencies]\ncomm.workspace = true\n[dev-dependencies]\nckpt.workspace = true\n[build-dependencies]\ntensor.workspace = true\n",
    )
    .unwrap();
    let keys: BTreeMap<String, String> = [
        ("layout", "layout"),
        ("comm", "comm"),
        ("ckpt", "ckpt"),
        ("tensor", "tensor"),
        ("reshard_exec", "reshard-exec"),
    ]
    .map(|(k, d)| (k.to_string(), d.to_string()))
    .into();
    let deps = internal_dependencies(&dir, &keys).unwrap();
    assert_eq!(
        deps,
        ["comm", "layout", "reshard-exec"].map(String::from).into()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_header_is_the_first_non_blank_line() {
    assert!(has_header("//! What this is.\nuse x;"));
    assert!(has_header("\n\n//! What this is."));
    assert!(!has_header("use x;\n//! Too late."));
    assert!(!has_header(
        "/// An item doc, not a file header.\nfn f() {}"
    ));
    assert!(!has_header(""));
}

/// A fresh directory under the target dir (no dev-dependency for one test).
fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-tidy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
