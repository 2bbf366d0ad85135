//! The memory this machine can still give a process: `MemAvailable` of `/proc/meminfo`,
//! lowered to what the process's cgroup may still take (cgroup v2 `memory.max` −
//! `memory.current`, or v1 `memory.limit_in_bytes` − `memory.usage_in_bytes`) when a limit
//! is set, and to the room left under the process's address-space limit (`ulimit -v`,
//! `RLIMIT_AS`: its soft limit − the process's `VmSize`) when one is set. A run checks its
//! predicted peak against it before any rank starts.

use std::path::Path;

/// Memory a new allocation can get, and where the figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    /// Bytes available.
    pub available: u64,
    /// What bounds it: `"MemAvailable"`, `"the cgroup limit"` or `"the address-space limit
    /// (ulimit -v)"`.
    pub source: &'static str,
}

/// This machine's available memory, or `None` where it cannot be read (not Linux).
pub fn host_memory() -> Option<HostMemory> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mem_available = parse_meminfo(&meminfo)?;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup_room(&text, Path::new("/sys/fs/cgroup")));
    let address_space = address_space_room(
        &std::fs::read_to_string("/proc/self/limits").unwrap_or_default(),
        &std::fs::read_to_string("/proc/self/status").unwrap_or_default(),
    );
    let memory = lower_of(mem_available, cgroup);
    Some(match address_space {
        Some(room) if room < memory.available => HostMemory {
            available: room,
            source: "the address-space limit (ulimit -v)",
        },
        _ => memory,
    })
}

/// The bytes a process may still map under its soft address-space limit (`Max address space`
/// of a `/proc/self/limits` text) given its `VmSize` (of a `/proc/self/status` text); `None`
/// when the limit is unlimited or unreadable. Every allocation counts against the limit, so a
/// run whose buffers pass `MemAvailable` but not this would abort on allocation instead.
fn address_space_room(limits: &str, status: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft: u64 = line
        .trim_start_matches("Max address space")
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let used_kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmSize:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Some(soft.saturating_sub(used_kib.saturating_mul(1024)))
}

/// The smaller of `MemAvailable` and the cgroup's room.
fn lower_of(mem_available: u64, cgroup: Option<u64>) -> HostMemory {
    match cgroup {
        Some(room) if room < mem_available => HostMemory {
            available: room,
            source: "the cgroup limit",
        },
        _ => HostMemory {
            available: mem_available,
            source: "MemAvailable",
        },
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What the cgroup of `/proc/self/cgroup` text `membership` may still allocate, read under
/// the cgroup mount `root`; `None` without a limit.
fn cgroup_room(membership: &str, root: &Path) -> Option<u64> {
    for line in membership.lines() {
        // `hierarchy-id:controllers:path`; v2 has id 0 and no controllers.
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let relative = path.trim_start_matches('/');
        if controllers.is_empty() {
            let dir = root.join(relative);
            let limit = read_number(&dir.join("memory.max"))?;
            let used = read_number(&dir.join("memory.current")).unwrap_or(0);
            return Some(limit.saturating_sub(used));
        }
        if controllers.split(',').any(|c| c == "memory") {
            let dir = root.join("memory").join(relative);
            let limit = read_number(&dir.join("memory.limit_in_bytes"))?;
            // v1 writes a huge number (a page-rounded i64::MAX) for "no limit".
            if limit >= 1 << 60 {
                return None;
            }
            let used = read_number(&dir.join("memory.usage_in_bytes")).unwrap_or(0);
            return Some(limit.saturating_sub(used));
        }
    }
    None
}

/// A file holding one number (`max` reads as no number).
fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(text), Some(20_000_000 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn an_address_space_limit_lowers_the_figure() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max stack size            8388608              unlimited            bytes     \n\
                      Max address space         6144000000           unlimited            bytes     \n";
        let status = "Name:\ttessera\nVmPeak:\t  300000 kB\nVmSize:\t  100000 kB\n";
        assert_eq!(
            address_space_room(limits, status),
            Some(6_144_000_000 - 100_000 * 1024)
        );
        let unlimited =
            "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(address_space_room(unlimited, status), None);
        assert_eq!(address_space_room("", status), None);
        // A process already past its limit has no room, not a wrapped-around one.
        let tiny = "Max address space         1000                 unlimited            bytes\n";
        assert_eq!(address_space_room(tiny, status), Some(0));
    }

    #[test]
    fn a_cgroup_limit_lowers_the_figure() {
        let root = tempfile::tempdir().unwrap();
        let v2 = root.path().join("job.slice");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.max"), "1073741824\n").unwrap();
        std::fs::write(v2.join("memory.current"), "73741824\n").unwrap();
        assert_eq!(
            cgroup_room("0::/job.slice\n", root.path()),
            Some(1_000_000_000)
        );
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_room("0::/job.slice\n", root.path()), None);
        let v1 = root.path().join("memory").join("box");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "2000\n").unwrap();
        std::fs::write(v1.join("memory.usage_in_bytes"), "500\n").unwrap();
        assert_eq!(
            cgroup_room("4:cpu:/x\n5:memory:/box\n", root.path()),
            Some(1500)
        );
        let m = lower_of(10_000, Some(1500));
        assert_eq!((m.available, m.source), (1500, "the cgroup limit"));
        let m = lower_of(1000, Some(1500));
        assert_eq!((m.available, m.source), (1000, "MemAvailable"));
    }
}
