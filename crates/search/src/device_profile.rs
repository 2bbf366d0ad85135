//! Device profile TOML files: what `tessera bench profile` writes and `parallel.device_profile`
//! (or `tessera plan --profile FILE`) reads.
//!
//! ```toml
//! name = "cpu-local"
//! memory_bandwidth = 1.2e10      # bytes/s, memory-bound ops
//! memory_bytes = 25769803776     # device memory, the plan's limit
//! devices_per_node = 8
//! compute_slots = 2              # optional: cores the rank threads share
//! [[matmul]]                     # FLOP/s by shape class, ascending min_flops
//! min_flops = 0.0
//! flops_per_s = 2.0e10
//! [intra_node]                   # α (s) and bandwidth (bytes/s) of collectives
//! alpha = 1.0e-5
//! bandwidth = 5.0e9
//! [inter_node]
//! alpha = 1.0e-5
//! bandwidth = 5.0e9
//! [[local_link]]                 # optional: α–β on the local backend, ascending ranks
//! ranks = 8
//! alpha = 3.0e-4
//! bandwidth = 2.0e8
//! ```
//!
//! Every figure lies in a plausible range (`DeviceProfile::validate`: rates 1000 to 10²¹
//! FLOP/s, bandwidths 1000 to 10¹⁸ bytes/s, α 0 to 1 s, `memory_bytes` 1 to 10¹⁸), so the
//! costs the searches compute stay finite; an error names the key and the bound.
//!
//! Every table holds only its own keys: an unknown key, or a top-level key written after a
//! `[table]` header (where TOML puts it inside that table), is an error naming it.
//!
//! With `compute_slots`, the profile is one machine running every rank as a thread: a plan for
//! more ranks than cores slows compute by the ranks per core, and its collectives use the
//! `[[local_link]]` measured with the nearest rank count at or above the run's
//! (`DeviceProfile::for_ranks`).

use std::path::Path;

use toml::{Table, Value};

use crate::cost::{
    DeviceProfile, Link, LocalLink, MatmulRate, MAX_COMPUTE_SLOTS, MAX_DEVICES_PER_NODE,
    MAX_LOCAL_LINKS, MAX_MEMORY_BYTES,
};
use crate::error::SearchError;

/// The largest profile file read.
const MAX_PROFILE_BYTES: u64 = 1 << 20;

/// The most shape classes a profile may list.
const MAX_MATMUL_CLASSES: usize = 64;

fn bad(path: &Path, key: &str, reason: impl Into<String>) -> SearchError {
    SearchError::ProfileFile {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// The keys of the file's top level.
const TOP_LEVEL_KEYS: &[&str] = &[
    "name",
    "memory_bandwidth",
    "memory_bytes",
    "devices_per_node",
    "compute_slots",
    "matmul",
    "intra_node",
    "inter_node",
    "local_link",
];

/// Refuses a key of `table` (named by `prefix`, empty at the top level) outside `valid`; a
/// top-level key found inside a table is named as misplaced.
fn only_keys(path: &Path, table: &Table, prefix: &str, valid: &[&str]) -> Result<(), SearchError> {
    let Some(unknown) = table.keys().find(|k| !valid.contains(&k.as_str())) else {
        return Ok(());
    };
    let hint = if !prefix.is_empty() && TOP_LEVEL_KEYS.contains(&unknown.as_str()) {
        format!(
            "{unknown} belongs at the top of the file, before the first [table] header (TOML puts a key written after [{}] inside that table)",
            prefix.trim_end_matches('.')
        )
    } else {
        format!("unknown key (valid keys here: {})", valid.join(", "))
    };
    Err(bad(path, &format!("{prefix}{unknown}"), hint))
}

fn number(path: &Path, table: &Table, key: &str, prefix: &str) -> Result<f64, SearchError> {
    match table.get(key) {
        Some(Value::Float(f)) => Ok(*f),
        Some(Value::Integer(i)) => Ok(*i as f64),
        Some(other) => Err(bad(
            path,
            &format!("{prefix}{key}"),
            format!("expected a number, got {} {other}", other.type_str()),
        )),
        None => Err(bad(path, &format!("{prefix}{key}"), "missing")),
    }
}

/// A whole number at `key` (`prefix` names its table), within `range`.
fn whole(
    path: &Path,
    table: &Table,
    key: &str,
    prefix: &str,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize, SearchError> {
    let v = number(path, table, key, prefix)?;
    if v.fract() != 0.0 || v < *range.start() as f64 || v > *range.end() as f64 {
        return Err(bad(
            path,
            &format!("{prefix}{key}"),
            format!(
                "{v} is not a whole number between {} and {}",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(v as usize)
}

/// The optional `[[local_link]]` measurements.
fn local_links(path: &Path, root: &Table) -> Result<Vec<LocalLink>, SearchError> {
    let Some(value) = root.get("local_link") else {
        return Ok(Vec::new());
    };
    let items = value.as_array().ok_or_else(|| {
        bad(
            path,
            "local_link",
            "expected an array of [[local_link]] tables",
        )
    })?;
    if items.len() > MAX_LOCAL_LINKS {
        return Err(bad(
            path,
            "local_link",
            format!(
                "{} measurements is over the limit of {MAX_LOCAL_LINKS}",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let prefix = format!("local_link[{i}].");
            let table = item
                .as_table()
                .ok_or_else(|| bad(path, &format!("local_link[{i}]"), "expected a table"))?;
            only_keys(path, table, &prefix, &["ranks", "alpha", "bandwidth"])?;
            Ok(LocalLink {
                ranks: whole(path, table, "ranks", &prefix, 2..=MAX_COMPUTE_SLOTS)?,
                link: Link {
                    alpha: number(path, table, "alpha", &prefix)?,
                    bandwidth: number(path, table, "bandwidth", &prefix)?,
                },
            })
        })
        .collect()
}

fn link(path: &Path, root: &Table, key: &str) -> Result<Link, SearchError> {
    let table = root
        .get(key)
        .and_then(Value::as_table)
        .ok_or_else(|| bad(path, key, "missing table (alpha, bandwidth)"))?;
    let prefix = format!("{key}.");
    only_keys(path, table, &prefix, &["alpha", "bandwidth"])?;
    Ok(Link {
        alpha: number(path, table, "alpha", &prefix)?,
        bandwidth: number(path, table, "bandwidth", &prefix)?,
    })
}

/// Reads and checks a profile file.
pub fn read(path: &Path) -> Result<DeviceProfile, SearchError> {
    let io = |source| SearchError::Io {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_PROFILE_BYTES {
        return Err(bad(
            path,
            "(file)",
            format!("{size} bytes is over the {MAX_PROFILE_BYTES}-byte limit of a profile"),
        ));
    }
    let text = layout::limits::read_text_bounded(path, MAX_PROFILE_BYTES).map_err(io)?;
    let root: Table = text.parse().map_err(|e: toml::de::Error| {
        // The line of the fault: the message alone does not name the key (a number too large
        // for a 64-bit integer, say).
        let key = match e.span() {
            Some(span) => format!(
                "(syntax, line {})",
                text.as_bytes()[..span.start.min(text.len())]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1
            ),
            None => "(syntax)".to_string(),
        };
        bad(path, &key, e.message().trim().to_string())
    })?;
    only_keys(path, &root, "", TOP_LEVEL_KEYS)?;
    let name = match root.get("name") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(bad(
                path,
                "name",
                format!("expected a string, got {} {other}", other.type_str()),
            ))
        }
        None => path
            .file_stem()
            .map_or("profile".to_string(), |s| s.to_string_lossy().into_owned()),
    };
    let classes = root
        .get("matmul")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(path, "matmul", "missing array of [[matmul]] tables"))?;
    if classes.len() > MAX_MATMUL_CLASSES {
        return Err(bad(
            path,
            "matmul",
            format!(
                "{} classes is over the limit of {MAX_MATMUL_CLASSES}",
                classes.len()
            ),
        ));
    }
    let mut matmul = Vec::with_capacity(classes.len());
    for (i, c) in classes.iter().enumerate() {
        let prefix = format!("matmul[{i}].");
        let table = c
            .as_table()
            .ok_or_else(|| bad(path, &format!("matmul[{i}]"), "expected a table"))?;
        only_keys(path, table, &prefix, &["min_flops", "flops_per_s"])?;
        matmul.push(MatmulRate {
            min_flops: number(path, table, "min_flops", &prefix)?,
            flops_per_s: number(path, table, "flops_per_s", &prefix)?,
        });
    }
    let memory_bytes = whole(
        path,
        &root,
        "memory_bytes",
        "",
        1..=MAX_MEMORY_BYTES as usize,
    )?;
    let devices_per_node = whole(
        path,
        &root,
        "devices_per_node",
        "",
        1..=MAX_DEVICES_PER_NODE,
    )?;
    let profile = DeviceProfile {
        name,
        matmul,
        memory_bandwidth: number(path, &root, "memory_bandwidth", "")?,
        memory_bytes: memory_bytes as u64,
        devices_per_node,
        intra_node: link(path, &root, "intra_node")?,
        inter_node: link(path, &root, "inter_node")?,
        compute_slots: match root.get("compute_slots") {
            None => None,
            Some(_) => Some(whole(
                path,
                &root,
                "compute_slots",
                "",
                1..=MAX_COMPUTE_SLOTS,
            )?),
        },
        local_links: local_links(path, &root)?,
    };
    profile
        .validate()
        .map_err(|e| bad(path, &e.field, e.reason))?;
    Ok(profile)
}

/// The TOML text of `profile`.
pub fn to_toml(profile: &DeviceProfile) -> String {
    let mut out = format!(
        "name = {:?}\nmemory_bandwidth = {:e}\nmemory_bytes = {}\ndevices_per_node = {}\n",
        profile.name, profile.memory_bandwidth, profile.memory_bytes, profile.devices_per_node
    );
    if let Some(slots) = profile.compute_slots {
        out.push_str(&format!("compute_slots = {slots}\n"));
    }
    for m in &profile.matmul {
        out.push_str(&format!(
            "\n[[matmul]]\nmin_flops = {:e}\nflops_per_s = {:e}\n",
            m.min_flops, m.flops_per_s
        ));
    }
    for (name, l) in [
        ("intra_node", profile.intra_node),
        ("inter_node", profile.inter_node),
    ] {
        out.push_str(&format!(
            "\n[{name}]\nalpha = {:e}\nbandwidth = {:e}\n",
            l.alpha, l.bandwidth
        ));
    }
    for l in &profile.local_links {
        out.push_str(&format!(
            "\n[[local_link]]\nranks = {}\nalpha = {:e}\nbandwidth = {:e}\n",
            l.ranks, l.link.alpha, l.link.bandwidth
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "memory_bandwidth = 1e10\nmemory_bytes = 1073741824\ndevices_per_node = 2\n";
    const TABLES: &str = "[[matmul]]\nmin_flops = 0.0\nflops_per_s = 1e10\n\
        [intra_node]\nalpha = 1e-5\nbandwidth = 1e9\n[inter_node]\nalpha = 1e-5\nbandwidth = 1e9\n";

    fn read_text(text: &str) -> Result<DeviceProfile, SearchError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpu.toml");
        std::fs::write(&path, text).unwrap();
        read(&path)
    }

    #[test]
    fn cores_and_local_links_round_trip() {
        let text = format!(
            "{BASE}compute_slots = 2\n{TABLES}[[local_link]]\nranks = 2\nalpha = 2e-5\nbandwidth = 2e9\n\
             [[local_link]]\nranks = 8\nalpha = 3e-4\nbandwidth = 2e8\n"
        );
        let p = read_text(&text).unwrap();
        assert_eq!(p.compute_slots, Some(2));
        assert_eq!(p.local_links.len(), 2);
        assert_eq!(p.local_links[1].ranks, 8);
        assert_eq!(read_text(&to_toml(&p)).unwrap(), p);
        let plain = read_text(&format!("{BASE}{TABLES}")).unwrap();
        assert_eq!((plain.compute_slots, plain.local_links.len()), (None, 0));
    }

    #[test]
    fn bad_cores_and_local_links_name_the_key() {
        let cases = [
            (
                format!("{BASE}compute_slots = 0\n{TABLES}"),
                "(compute_slots)",
                "between 1 and",
            ),
            (
                format!("{BASE}compute_slots = 1.5\n{TABLES}"),
                "(compute_slots)",
                "whole number",
            ),
            (
                format!("{BASE}compute_slots = \"two\"\n{TABLES}"),
                "(compute_slots)",
                "expected a number",
            ),
            (
                format!("{BASE}{TABLES}[[local_link]]\nranks = 1\nalpha = 0\nbandwidth = 1e9\n"),
                "(local_link[0].ranks)",
                "between 2 and",
            ),
            (
                format!(
                    "{BASE}{TABLES}[[local_link]]\nranks = 8\nalpha = 0\nbandwidth = 1e9\n\
                         [[local_link]]\nranks = 2\nalpha = 0\nbandwidth = 1e9\n"
                ),
                "(local_link[1].ranks)",
                "ascend",
            ),
            (
                format!("{BASE}{TABLES}[[local_link]]\nranks = 2\nalpha = -1\nbandwidth = 1e9\n"),
                "(local_link[0].alpha)",
                "≥ 0",
            ),
            (
                format!("{BASE}{TABLES}[[local_link]]\nranks = 2\nalpha = 0\n"),
                "(local_link[0].bandwidth)",
                "missing",
            ),
            (
                format!("{BASE}local_link = 3\n{TABLES}"),
                "(local_link)",
                "expected an array",
            ),
        ];
        for (text, key, rule) in cases {
            let err = read_text(&text).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains(rule), "{text}: {err}");
        }
    }

    #[test]
    fn unknown_and_misplaced_keys_are_named() {
        let cases = [
            (
                format!("{BASE}compute_slot = 2\n{TABLES}"),
                "(compute_slot)",
                "unknown key",
            ),
            (
                format!("{BASE}{TABLES}compute_slots = 2\n"),
                "(inter_node.compute_slots)",
                "belongs at the top of the file",
            ),
            (
                format!("{BASE}{TABLES}[[local_link]]\nranks = 2\nalpha = 0\nbandwidth = 1e9\nlatency = 1\n"),
                "(local_link[0].latency)",
                "unknown key",
            ),
            (
                BASE.to_string() + &TABLES.replace("flops_per_s = 1e10\n", "flops_per_s = 1e10\nflops = 1\n"),
                "(matmul[0].flops)",
                "unknown key",
            ),
            (format!("name = 3\n{BASE}{TABLES}"), "(name)", "expected a string"),
        ];
        for (text, key, rule) in cases {
            let err = read_text(&text).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains(rule), "{text}: {err}");
        }
    }

    /// A rate, latency or size outside its plausible range is refused naming the file, the
    /// key and the bound: before, `flops_per_s = 1e-300` was accepted and every op cost
    /// infinity (`predicted step: NaN ms`), `alpha = 1e300` gave a step of 10²⁹⁹ ms.
    #[test]
    fn figures_outside_their_plausible_range_name_the_key_and_the_bound() {
        let tables = |from: &str, to: &str| {
            assert!(TABLES.contains(from), "{from}");
            format!("{BASE}{}", TABLES.replacen(from, to, 1))
        };
        let base = |from: &str, to: &str| {
            assert!(BASE.contains(from), "{from}");
            format!("{}{TABLES}", BASE.replacen(from, to, 1))
        };
        let cases = [
            (
                tables("flops_per_s = 1e10", "flops_per_s = 1e-300"),
                "(matmul[0].flops_per_s)",
                "1e-300 is outside the plausible range 1000 to 1e21 FLOP/s",
            ),
            (
                tables("flops_per_s = 1e10", "flops_per_s = 1e300"),
                "(matmul[0].flops_per_s)",
                "1e21 FLOP/s",
            ),
            (
                tables("min_flops = 0.0", "min_flops = 1e300"),
                "(matmul[0].min_flops)",
                "0 to 1e30 FLOPs",
            ),
            (
                tables(
                    "alpha = 1e-5\nbandwidth = 1e9\n[inter",
                    "alpha = 1e300\nbandwidth = 1e9\n[inter",
                ),
                "(intra_node.alpha)",
                "0 to 1 seconds",
            ),
            (
                tables("bandwidth = 1e9\n[inter", "bandwidth = 1e-300\n[inter"),
                "(intra_node.bandwidth)",
                "1000 to 1e18 bytes/s",
            ),
            (
                format!(
                    "{}{}",
                    BASE,
                    TABLES.replace("bandwidth = 1e9\n", "bandwidth = 1e300\n")
                ),
                "(intra_node.bandwidth)",
                "1000 to 1e18 bytes/s",
            ),
            (
                base("memory_bandwidth = 1e10", "memory_bandwidth = 1e-300"),
                "(memory_bandwidth)",
                "1000 to 1e18 bytes/s",
            ),
            (
                base("memory_bytes = 1073741824", "memory_bytes = 0"),
                "(memory_bytes)",
                "not a whole number between 1 and 1000000000000000000",
            ),
            (
                base("memory_bytes = 1073741824", "memory_bytes = 1073741824.5"),
                "(memory_bytes)",
                "not a whole number",
            ),
            (
                base(
                    "memory_bytes = 1073741824",
                    "memory_bytes = 1.8446744073709552e19",
                ),
                "(memory_bytes)",
                "not a whole number",
            ),
            (
                base(
                    "memory_bytes = 1073741824",
                    "memory_bytes = 18446744073709551616",
                ),
                "(syntax, line 2)",
                "too large",
            ),
            (
                base("devices_per_node = 2", "devices_per_node = 0"),
                "(devices_per_node)",
                "between 1 and 1000000",
            ),
            (
                format!("{BASE}{TABLES}[[local_link]]\nranks = 2\nalpha = 5\nbandwidth = 1e9\n"),
                "(local_link[0].alpha)",
                "0 to 1 seconds",
            ),
        ];
        for (text, key, rule) in cases {
            let err = read_text(&text).unwrap_err().to_string();
            assert!(
                err.contains("cpu.toml") && err.contains(key) && err.contains(rule),
                "{text}: {err}"
            );
        }
        // The bounds themselves are accepted.
        let edges = format!(
            "{}{}",
            BASE.replace("memory_bandwidth = 1e10", "memory_bandwidth = 1e3"),
            TABLES
                .replacen("flops_per_s = 1e10", "flops_per_s = 1e21", 1)
                .replacen("alpha = 1e-5", "alpha = 1.0", 1)
                .replacen("bandwidth = 1e9", "bandwidth = 1e18", 1)
        );
        read_text(&edges).unwrap();
        for name in crate::profiles::BUILT_IN {
            crate::profiles::built_in(name).unwrap().validate().unwrap();
        }
    }
}
