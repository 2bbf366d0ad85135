//! Op-name patterns in strategy tables: `[parallel.shard]` keys may be globs
//! (`"blocks.*.mlp.fc1.matmul"`) or cell names (`"blocks.*.mlp.fc1"`).
//!
//! - `*` matches any run of characters within one dot-separated component, `**` any run across
//!   components, `?` one character other than `.`.
//! - A key that names a cell stands for the cell's `matmul` op (a Dense cell's `shard` shards
//!   its MatMul in MindSpore): `blocks.0.mlp.fc1` sets `blocks.0.mlp.fc1.matmul`.
//! - An exact op name wins over a cell name, which wins over a pattern; two patterns that give
//!   one op different strategies are an error naming both.

use std::collections::BTreeMap;

use graph::{Graph, NodeRole, Op};

use crate::config::OpStrategy;
use crate::error::ParallelError;

/// Whether `pattern` (with `*`, `**`, `?`) matches all of `name`.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    // Iterative matcher with backtracking over the last star; a `*` cannot cross a `.`, so
    // its backtracking is bounded by the component.
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some(b'*') if p.get(1) == Some(&b'*') => {
                let rest = &p[2..];
                (0..=n.len()).any(|i| go(rest, &n[i..]))
            }
            Some(b'*') => {
                let rest = &p[1..];
                let limit = n.iter().position(|&c| c == b'.').unwrap_or(n.len());
                (0..=limit).any(|i| go(rest, &n[i..]))
            }
            Some(b'?') => n.first().is_some_and(|&c| c != b'.') && go(&p[1..], &n[1..]),
            Some(&c) => n.first() == Some(&c) && go(&p[1..], &n[1..]),
        }
    }
    go(p, n)
}

fn is_pattern(key: &str) -> bool {
    key.contains(['*', '?'])
}

/// How specifically a key names an op: exact op name, cell name, pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Match {
    Exact,
    Cell,
    Pattern,
}

fn match_kind(key: &str, op: &str) -> Option<Match> {
    let cell_op = op.strip_suffix(".matmul");
    if is_pattern(key) {
        let hit = glob_matches(key, op) || cell_op.is_some_and(|cell| glob_matches(key, cell));
        return hit.then_some(Match::Pattern);
    }
    if key == op {
        Some(Match::Exact)
    } else if cell_op == Some(key) {
        Some(Match::Cell)
    } else {
        None
    }
}

/// The strategies of `strategies` keyed by the forward ops of `graph` they apply to. A key that
/// matches no forward op is an [`ParallelError::UnknownOp`].
pub fn resolve_op_patterns(
    graph: &Graph,
    strategies: &BTreeMap<String, OpStrategy>,
) -> Result<BTreeMap<String, OpStrategy>, ParallelError> {
    let forward: Vec<&str> = graph
        .nodes()
        .iter()
        .filter(|n| n.role == NodeRole::Forward)
        .map(|n| n.name.as_str())
        .collect();
    let mut chosen: BTreeMap<&str, (Match, &str, &OpStrategy)> = BTreeMap::new();
    for (key, strategy) in strategies {
        let mut matched = false;
        for &op in &forward {
            let Some(kind) = match_kind(key, op) else {
                continue;
            };
            matched = true;
            match chosen.get(op) {
                Some((held, _, _)) if *held < kind => {}
                Some((held, other, s))
                    if *held == kind && kind == Match::Pattern && *s != strategy =>
                {
                    return Err(ParallelError::Setting {
                        setting: "shard",
                        reason: format!(
                            "patterns {other:?} and {key:?} both match op {op:?} with different strategies"
                        ),
                    });
                }
                _ => {
                    chosen.insert(op, (kind, key, strategy));
                }
            }
        }
        if !matched {
            return Err(ParallelError::UnknownOp {
                op: key.clone(),
                known: forward.join(", "),
            });
        }
    }
    Ok(chosen
        .into_iter()
        .map(|(op, (_, _, s))| (op.to_string(), s.clone()))
        .collect())
}

/// The `[parallel.manual_split]` entries keyed by the Embedding ops of `graph` they apply to.
/// A key is an Embedding op's name, its cell's name (`embedding` for `embedding.gather`) or a
/// glob over either; a key that matches no Embedding op, or two keys that give one op different
/// rows, are errors naming them.
pub fn resolve_manual_split(
    graph: &Graph,
    manual_split: &BTreeMap<String, Vec<usize>>,
) -> Result<BTreeMap<String, Vec<usize>>, ParallelError> {
    let embeddings: Vec<&str> = graph
        .nodes()
        .iter()
        .filter(|n| n.role == NodeRole::Forward && matches!(n.op, Op::Embedding))
        .map(|n| n.name.as_str())
        .collect();
    let mut chosen: BTreeMap<&str, (&str, &Vec<usize>)> = BTreeMap::new();
    for (key, rows) in manual_split {
        let mut matched = false;
        for &op in &embeddings {
            let cell = op.rsplit_once('.').map(|(cell, _)| cell);
            let hit = if is_pattern(key) {
                glob_matches(key, op) || cell.is_some_and(|c| glob_matches(key, c))
            } else {
                key == op || cell == Some(key.as_str())
            };
            if !hit {
                continue;
            }
            matched = true;
            if let Some((other, held)) = chosen.insert(op, (key, rows)) {
                if held != rows {
                    return Err(ParallelError::Setting {
                        setting: "manual_split",
                        reason: format!(
                            "keys {other:?} and {key:?} both split the table of {op:?}, with different rows"
                        ),
                    });
                }
            }
        }
        if !matched {
            return Err(ParallelError::Setting {
                setting: "manual_split",
                reason: format!(
                    "key {key:?} names no Embedding (Gather) op or cell; the Embedding ops are: {}",
                    if embeddings.is_empty() {
                        "none".to_string()
                    } else {
                        embeddings.join(", ")
                    }
                ),
            });
        }
    }
    Ok(chosen
        .into_iter()
        .map(|(op, (_, rows))| (op.to_string(), rows.clone()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn stars_stay_within_a_component_and_double_stars_cross() {
        assert!(glob_matches("blocks.*.mlp.fc1", "blocks.3.mlp.fc1"));
        assert!(glob_matches("blocks.*.mlp.fc?", "blocks.12.mlp.fc2"));
        assert!(!glob_matches("blocks.*.fc1", "blocks.3.mlp.fc1"));
        assert!(glob_matches("blocks.**.fc1", "blocks.3.mlp.fc1"));
        assert!(glob_matches("**", "a.b.c"));
        assert!(!glob_matches("blocks.?", "blocks.12"));
        assert!(glob_matches("*.matmul", "fc.matmul"));
        assert!(!glob_matches("*", "a.b"));
    }
}
