//! Device profile TOML files: what `tessera bench profile` writes and `parallel.device_profile`
//! (or `tessera plan --profile FILE`) reads.
//!
//! ```toml
//! name = "cpu-local"
//! memory_bandwidth = 1.2e10      # bytes/s, memory-bound ops
//! memory_bytes = 25769803776     # device memory, the plan's limit
//! devices_per_node = 8
//! [[matmul]]                     # FLOP/s by shape class, ascending min_flops
//! min_flops = 0.0
//! flops_per_s = 2.0e10
//! [intra_node]                   # α (s) and bandwidth (bytes/s) of collectives
//! alpha = 1.0e-5
//! bandwidth = 5.0e9
//! [inter_node]
//! alpha = 1.0e-5
//! bandwidth = 5.0e9
//! ```

use std::path::Path;

use parallel::search::{DeviceProfile, Link, MatmulRate};
use toml::{Table, Value};

use crate::error::RuntimeError;

/// The largest profile file read.
const MAX_PROFILE_BYTES: u64 = 1 << 20;

/// The most shape classes a profile may list.
const MAX_MATMUL_CLASSES: usize = 64;

fn bad(path: &Path, key: &str, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Config {
        key: format!("{} ({key})", path.display()),
        reason: reason.into(),
    }
}

fn number(path: &Path, table: &Table, key: &str, prefix: &str) -> Result<f64, RuntimeError> {
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

fn link(path: &Path, root: &Table, key: &str) -> Result<Link, RuntimeError> {
    let table = root
        .get(key)
        .and_then(Value::as_table)
        .ok_or_else(|| bad(path, key, "missing table (alpha, bandwidth)"))?;
    let prefix = format!("{key}.");
    Ok(Link {
        alpha: number(path, table, "alpha", &prefix)?,
        bandwidth: number(path, table, "bandwidth", &prefix)?,
    })
}

/// Reads and checks a profile file.
pub fn read(path: &Path) -> Result<DeviceProfile, RuntimeError> {
    let io = |source| RuntimeError::Io {
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
    let text = std::fs::read_to_string(path).map_err(io)?;
    let root: Table = text
        .parse()
        .map_err(|e: toml::de::Error| bad(path, "(syntax)", e.message().trim().to_string()))?;
    let name = match root.get("name") {
        Some(Value::String(s)) => s.clone(),
        _ => path
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
        matmul.push(MatmulRate {
            min_flops: number(path, table, "min_flops", &prefix)?,
            flops_per_s: number(path, table, "flops_per_s", &prefix)?,
        });
    }
    let memory_bytes = number(path, &root, "memory_bytes", "")?;
    let devices_per_node = number(path, &root, "devices_per_node", "")?;
    if !(1.0..1e18).contains(&memory_bytes) {
        return Err(bad(
            path,
            "memory_bytes",
            format!("{memory_bytes} is out of range"),
        ));
    }
    if !(1.0..=1e6).contains(&devices_per_node) || devices_per_node.fract() != 0.0 {
        return Err(bad(
            path,
            "devices_per_node",
            format!("{devices_per_node} is not a whole number between 1 and 1000000"),
        ));
    }
    let profile = DeviceProfile {
        name,
        matmul,
        memory_bandwidth: number(path, &root, "memory_bandwidth", "")?,
        memory_bytes: memory_bytes as u64,
        devices_per_node: devices_per_node as usize,
        intra_node: link(path, &root, "intra_node")?,
        inter_node: link(path, &root, "inter_node")?,
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
    out
}
