//! Op-name patterns in strategy tables: `[parallel.shard]` keys may be globs
//! (`"blocks.*.mlp.fc1.matmul"`) or cell names (`"blocks.*.mlp.fc1"`).
//!
//! - `*` matches any run of characters within one dot-separated component, `**` any run across
//!   components, `?` one character other than `.`.
//! - A key that names a cell stands for the cell's `matmul` op (a Dense cell's `shard` shards
//!   its MatMul in MindSpore): `blocks.0.mlp.fc1` sets `blocks.0.mlp.fc1.matmul`.
//! - An exact op name wins over a cell name, which wins over a pattern; two patterns that give
//!   one op different strategies are an error naming both.

use std::collections::{BTreeMap, BTreeSet};

use graph::{Graph, NodeRole, Op};

use crate::config::OpStrategy;
use crate::error::ParallelError;

/// Whether `pattern` (with `*`, `**`, `?`) matches all of `name`.
///
/// The match keeps the set of `name` positions the pattern read so far can end at, one token
/// at a time, so it takes `O(pattern × name)` steps whatever the pattern: a config's
/// `"****…Z"` cannot make it backtrack exponentially.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let (mut p, n) = (pattern.as_bytes(), name.as_bytes());
    // `reach[j]`: the pattern read so far matches `name[..j]`.
    let mut reach = vec![false; n.len() + 1];
    reach[0] = true;
    while let Some(&c) = p.first() {
        match c {
            b'*' if p.get(1) == Some(&b'*') => {
                // `**`: any run, across components.
                for j in 1..=n.len() {
                    reach[j] = reach[j] || reach[j - 1];
                }
                p = &p[2..];
            }
            b'*' => {
                // `*`: any run within one component.
                for j in 1..=n.len() {
                    reach[j] = reach[j] || (reach[j - 1] && n[j - 1] != b'.');
                }
                p = &p[1..];
            }
            _ => {
                for j in (1..=n.len()).rev() {
                    let one = match c {
                        b'?' => n[j - 1] != b'.',
                        _ => n[j - 1] == c,
                    };
                    reach[j] = reach[j - 1] && one;
                }
                reach[0] = false;
                p = &p[1..];
            }
        }
        if !reach.contains(&true) {
            return false;
        }
    }
    reach[n.len()]
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
    // A key without wildcards names at most two ops (itself, and its cell's `matmul`): they
    // are looked up, so a table of one key per op (the GPT's, thousands of layers deep) costs
    // keys × log(ops), not keys × ops; only patterns scan every op.
    let known: BTreeSet<&str> = forward.iter().copied().collect();
    let mut chosen: BTreeMap<&str, (Match, &str, &OpStrategy)> = BTreeMap::new();
    for (key, strategy) in strategies {
        let mut matched = false;
        let cell_op = format!("{key}.matmul");
        let candidates: Vec<&str> = match is_pattern(key) {
            true => forward.clone(),
            false => [key.as_str(), cell_op.as_str()]
                .into_iter()
                .filter_map(|name| known.get(name).copied())
                .collect(),
        };
        for op in candidates {
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
    use std::collections::BTreeMap;
    use std::sync::mpsc;
    use std::time::Duration;

    use graph::{GraphBuilder, Initializer};

    use super::{glob_matches, resolve_op_patterns};
    use crate::config::OpStrategy;

    /// `f` run on its own thread, or `None` when it takes longer than `limit` (the thread is
    /// left behind: the old matcher would have taken hours).
    fn within<T: Send + 'static>(
        limit: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit).ok()
    }

    #[test]
    fn hostile_globs_match_in_polynomial_time() {
        // A pattern of many `**` (or `*`, or `*?`) before a byte no name holds backtracked over
        // every way to cut the name: `"**" × 10 + "Z"` took 15 s over a 2-layer GPT's ops,
        // `× 12` minutes; a config key is any string.
        let name = "blocks.11.attn.qkv.matmul_with_a_longer_name.bias_add";
        for pattern in [
            format!("{}Z", "**".repeat(40)),
            format!("{}Z", "*".repeat(40)),
            format!("{}Z", "**?".repeat(30)),
            format!("{}Z", "*?".repeat(30)),
            format!("{}Z", "**.".repeat(30)),
        ] {
            let matched = within(Duration::from_secs(10), move || {
                glob_matches(&pattern, name)
            });
            assert_eq!(matched, Some(false), "a hostile glob took more than 10 s");
        }
        assert!(glob_matches(&"**".repeat(40), name));
        assert!(glob_matches(&format!("{}d", "**".repeat(40)), name));
        assert!(glob_matches(&format!("blocks{}", ".*".repeat(5)), name));
        assert!(!glob_matches(&format!("blocks{}", ".*".repeat(4)), name));
    }

    /// The matcher before it kept its positions: the reference the new one must agree with.
    fn backtracking(p: &[u8], n: &[u8]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some(b'*') if p.get(1) == Some(&b'*') => {
                (0..=n.len()).any(|i| backtracking(&p[2..], &n[i..]))
            }
            Some(b'*') => {
                let limit = n.iter().position(|&c| c == b'.').unwrap_or(n.len());
                (0..=limit).any(|i| backtracking(&p[1..], &n[i..]))
            }
            Some(b'?') => n.first().is_some_and(|&c| c != b'.') && backtracking(&p[1..], &n[1..]),
            Some(&c) => n.first() == Some(&c) && backtracking(&p[1..], &n[1..]),
        }
    }

    #[test]
    fn globs_match_as_the_backtracking_matcher_did() {
        let names = [
            "",
            "a",
            "a.b",
            "ab.c",
            "blocks.3.mlp.fc1",
            "blocks.12.mlp.fc2.matmul",
            "..",
            "a..b",
        ];
        let pieces = ["*", "**", "?", ".", "a", "b", "blocks", "fc1", "3"];
        // Every pattern of up to four pieces.
        let mut patterns = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = patterns
                .iter()
                .flat_map(|p| pieces.iter().map(move |q| format!("{p}{q}")))
                .collect();
            patterns.extend(longer);
        }
        patterns.sort();
        patterns.dedup();
        for pattern in &patterns {
            for name in names {
                assert_eq!(
                    glob_matches(pattern, name),
                    backtracking(pattern.as_bytes(), name.as_bytes()),
                    "pattern {pattern:?} on {name:?}"
                );
            }
        }
    }

    #[test]
    fn a_strategy_per_op_of_a_deep_graph_resolves_in_time() {
        // One exact key per op (what the GPT's MindFormers keys give) used to be matched
        // against every op: 4096 layers of a tiny GPT took minutes before training began (its 100 000 ops here: hours).
        let layers = 100_000;
        let mut b = GraphBuilder::new();
        let mut x = b.parameter("x", &[4, 8], Initializer::normal(1.0)).unwrap();
        for i in 0..layers {
            x = b.gelu(&format!("blocks.{i}.gelu"), x, true).unwrap();
        }
        let graph = b.finish();
        let strategies: BTreeMap<String, OpStrategy> = (0..layers)
            .map(|i| {
                let s = OpStrategy::from_tuples(vec![vec![1, 1]], None);
                (format!("blocks.{i}.gelu"), s)
            })
            .chain([(
                "blocks.1*.gelu".to_string(),
                OpStrategy::from_tuples(vec![vec![1, 1]], None),
            )])
            .collect();
        let resolved = within(Duration::from_secs(20), move || {
            resolve_op_patterns(&graph, &strategies).map(|r| r.len())
        });
        assert_eq!(resolved.map(|r| r.unwrap()), Some(layers));
    }

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
