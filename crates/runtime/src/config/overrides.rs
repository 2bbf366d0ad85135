//! `--set section.key=value` overrides: the key is a TOML dotted key (bare, `"basic"` and
//! `'literal'` quoted parts, so a pattern key such as `parallel.shard."blocks.*.mlp.fc1"` names
//! one entry), the value a TOML value or else a plain string.

use toml::{Table, Value};

use super::sections::SECTIONS;
use super::values::{config_error, describe, one_of};
use crate::error::RuntimeError;

/// Applies one `section.key=value` override to `root`; returns the key's parts.
pub(super) fn apply_override(root: &mut Table, text: &str) -> Result<Vec<String>, RuntimeError> {
    let bad = |reason: String| config_error(&format!("--set {text}"), reason);
    let Some((key, raw)) = split_at_assignment(text) else {
        return Err(bad("expected section.key=value".to_string()));
    };
    let path = key_parts(key).map_err(bad)?;
    if path.len() < 2 || path.iter().any(String::is_empty) {
        return Err(bad(format!(
            "`{}` does not name a key inside a section: expected section.key=value",
            key.trim()
        )));
    }
    if !SECTIONS.contains(&path[0].as_str()) {
        return Err(bad(format!(
            "unknown section `{}` (valid sections: {})",
            path[0],
            one_of(SECTIONS)
        )));
    }
    let value = parse_value(raw.trim()).map_err(bad)?;
    let (leaf, parents) = path.split_last().unwrap_or((&path[0], &[]));
    let mut table = root;
    for (depth, part) in parents.iter().enumerate() {
        let entry = table
            .entry(part.clone())
            .or_insert_with(|| Value::Table(Table::new()));
        table = match entry {
            Value::Table(inner) => inner,
            other => {
                return Err(bad(format!(
                    "{} is {}, not a table",
                    display_key(&path[..=depth]),
                    describe(other)
                )))
            }
        };
    }
    table.insert(leaf.clone(), value);
    Ok(path)
}

/// Whether an error about config key `error_key` concerns the override of `path`: the key
/// itself, a key inside it (`parallel.pipeline.stages` under `parallel.pipeline`), one of its
/// elements (`parallel.shard.x[0]`), or a table holding it (`ps` for `ps.workers`: a section the
/// override created or changed).
fn concerns(error_key: &str, path: &[String]) -> bool {
    spellings(path)
        .iter()
        .any(|key| within(key, error_key) || within(error_key, key))
}

/// Where the value an error about `key` names comes from, among the `overridden` keys (each
/// with its origin, `--set …`): the override of `key` itself (the last, if given twice), else
/// every override inside it, listed (an error about a whole table, `parallel.pipeline`, may
/// concern any of its keys: none is singled out), else one that holds it
/// ([`concerns`]). `None`: the file.
pub(super) fn origins(overridden: &[(Vec<String>, String)], key: &str) -> Option<String> {
    let exact = |(path, _): &&(Vec<String>, String)| spellings(path).iter().any(|k| k == key);
    if let Some((_, origin)) = overridden.iter().rev().find(exact) {
        return Some(format!("the value comes from {origin}"));
    }
    let mut inside: Vec<&str> = Vec::new();
    for (path, origin) in overridden {
        let nested = spellings(path).iter().any(|k| within(key, k));
        if nested && !inside.contains(&origin.as_str()) {
            inside.push(origin);
        }
    }
    if inside.is_empty() {
        return overridden
            .iter()
            .rev()
            .find(|(path, _)| concerns(key, path))
            .map(|(_, origin)| format!("the value comes from {origin}"));
    }
    // Which of them (or of the file's keys) broke the rule, the reason says.
    Some(format!("{key} keys set by {}", inside.join(", ")))
}

/// `path` as a dotted key, both ways it is written: joined, and with its parts quoted where
/// they are not bare keys.
fn spellings(path: &[String]) -> [String; 2] {
    [path.join("."), display_key(path)]
}

/// Whether key `inner` is `outer` or lies inside it (a key of the table, or an element).
fn within(outer: &str, inner: &str) -> bool {
    inner == outer
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// `path` written back as a dotted key, parts that are not bare keys quoted.
pub(super) fn display_key(path: &[String]) -> String {
    path.iter()
        .map(|part| {
            let bare = !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if bare {
                part.clone()
            } else {
                Value::String(part.clone()).to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The value text as TOML (`7`, `false`, `[[2, 4]]`, `"x"`), or else the text as a string. Text
/// that starts as a TOML string, array or table does (`"…`, `'…`, `[…`, `{…`) must be one: taken
/// as a plain string, its quotes and brackets would become part of the value (a quoted path
/// with a bad escape would name a directory whose name holds the quotes).
fn parse_value(raw: &str) -> Result<Value, String> {
    match format!("v = {raw}").parse::<Table>() {
        Ok(mut parsed) if parsed.len() == 1 => {
            Ok(parsed.remove("v").unwrap_or_else(|| Value::String(raw.to_string())))
        }
        Err(e) if raw.starts_with(['"', '\'', '[', '{']) => Err(format!(
            "`{raw}` starts as a TOML value but is not one ({}); write a valid TOML value, or a plain string without quotes",
            e.message().trim()
        )),
        _ => Ok(Value::String(raw.to_string())),
    }
}

/// `text` split at its first `=` outside a quoted key part.
fn split_at_assignment(text: &str) -> Option<(&str, &str)> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match quote {
            Some('"') if escaped => escaped = false,
            Some('"') if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '=' => return Some((&text[..i], &text[i + 1..])),
            None => {}
        }
    }
    None
}

/// The parts of TOML dotted key `key`, read by the TOML parser itself.
fn key_parts(key: &str) -> Result<Vec<String>, String> {
    let key = key.trim();
    if key.is_empty() {
        return Err("the key is empty: expected section.key=value".to_string());
    }
    let document: Table = format!("{key} = 0").parse().map_err(|e: toml::de::Error| {
        format!(
            "`{key}` does not name a key: it is not a TOML dotted key ({}); quote a part holding dots or spaces, as in parallel.shard.\"blocks.*.mlp.fc1\"",
            e.message().trim()
        )
    })?;
    let mut parts = Vec::new();
    let mut table = &document;
    loop {
        let mut entries = table.iter();
        let (Some((part, value)), None) = (entries.next(), entries.next()) else {
            return Err(format!("`{key}` is not one dotted key"));
        };
        parts.push(part.clone());
        match value {
            Value::Table(inner) => table = inner,
            _ => return Ok(parts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::values::read_strategy;
    use super::*;

    #[test]
    fn override_values_parse_as_toml_or_fall_back_to_strings() {
        let mut root = Table::new();
        apply_override(&mut root, "train.epochs=7").unwrap();
        apply_override(&mut root, "data.dir=some/dir").unwrap();
        apply_override(&mut root, "data.shuffle = false").unwrap();
        apply_override(&mut root, "parallel.shard.matmul1=[[2,4],[4,1]]").unwrap();
        apply_override(&mut root, "output.dir=\"quoted dir\"").unwrap();
        assert_eq!(root["train"]["epochs"], Value::Integer(7));
        assert_eq!(root["data"]["dir"], Value::String("some/dir".into()));
        assert_eq!(root["data"]["shuffle"], Value::Boolean(false));
        assert_eq!(root["output"]["dir"], Value::String("quoted dir".into()));
        let strategy = read_strategy("k", root["parallel"]["shard"]["matmul1"].clone()).unwrap();
        assert_eq!(strategy, vec![vec![2, 4], vec![4, 1]]);
    }

    /// A value that starts as a TOML string, array or table but is not one is refused, naming
    /// the override: it used to be taken with its quotes as a plain string (a quoted path with a
    /// bad escape became a relative directory named with the quotes).
    #[test]
    fn a_broken_toml_value_is_refused_not_taken_as_text() {
        for text in [
            r#"output.dir="/tmp/a\q""#,
            r#"output.dir="unclosed"#,
            "output.dir='x",
            "parallel.shard.matmul1=[[2,4],[4,1]",
            "parallel.shard={ a = 1",
        ] {
            let err = apply_override(&mut Table::new(), text)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(text) && err.contains("starts as a TOML value but is not one"),
                "{text}: {err}"
            );
        }
        let mut root = Table::new();
        apply_override(&mut root, r#"output.dir=/tmp/a\q"#).unwrap();
        assert_eq!(root["output"]["dir"], Value::String(r"/tmp/a\q".into()));
    }

    fn parts(key: &str) -> Vec<String> {
        key_parts(key).unwrap()
    }

    #[test]
    fn quoted_parts_keep_their_dots() {
        assert_eq!(
            parts(r#"parallel.shard."blocks.*.mlp.fc1""#),
            ["parallel", "shard", "blocks.*.mlp.fc1"]
        );
        assert_eq!(
            parts("parallel.shard.'blocks.0.attn'"),
            ["parallel", "shard", "blocks.0.attn"]
        );
        assert_eq!(parts(" train . epochs "), ["train", "epochs"]);
        assert_eq!(parts(r#"a."b\"c""#), ["a", "b\"c"]);
    }

    #[test]
    fn assignment_is_found_outside_quotes() {
        assert_eq!(
            split_at_assignment(r#"parallel.shard."x=y"=[[1]]"#),
            Some((r#"parallel.shard."x=y""#, "[[1]]"))
        );
        assert_eq!(
            split_at_assignment(r#"a."q\"=".b=1"#),
            Some((r#"a."q\"=".b"#, "1"))
        );
        assert_eq!(split_at_assignment(r#"a."unclosed=1"#), None);
    }

    #[test]
    fn a_quoted_pattern_key_sets_one_entry() {
        let mut root = Table::new();
        let path = apply_override(
            &mut root,
            r#"parallel.shard."blocks.*.mlp.fc1"=[[2, 1], [1, 2]]"#,
        )
        .unwrap();
        assert_eq!(path, ["parallel", "shard", "blocks.*.mlp.fc1"]);
        let shard = root["parallel"]["shard"].as_table().unwrap();
        assert_eq!(shard.len(), 1);
        assert!(shard["blocks.*.mlp.fc1"].is_array());
    }

    #[test]
    fn bad_keys_are_named() {
        let mut root = Table::new();
        for (text, expected) in [
            ("train.=1", "not a TOML dotted key"),
            ("train=1", "inside a section"),
            ("nosuch.key=1", "unknown section"),
            (r#"parallel.shard."x=1"#, "expected section.key=value"),
        ] {
            let err = apply_override(&mut root, text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
            assert!(err.contains("--set"), "{text}: {err}");
        }
    }

    #[test]
    fn errors_inside_an_override_concern_it() {
        let path: Vec<String> = ["parallel", "shard", "blocks.*.mlp.fc1"]
            .map(String::from)
            .to_vec();
        assert!(concerns("parallel.shard.blocks.*.mlp.fc1", &path));
        assert!(concerns(r#"parallel.shard."blocks.*.mlp.fc1"[0]"#, &path));
        assert!(concerns("parallel.shard.blocks.*.mlp.fc1.x", &path));
        assert!(!concerns("parallel.shard.blocks.*.mlp.fc10", &path));
        assert!(!concerns("parallel.mesh", &path));
        // The table holding the override: the section it created or changed.
        assert!(concerns("parallel.shard", &path));
        assert!(concerns("parallel", &path));
    }
}
