//! The cost model: device profiles, α–β times of collectives, compute time of an op.
//!
//! Every time is in seconds and every size in bytes. A collective over `g` devices whose
//! group fits in one node (`g ≤ devices_per_node`) uses the intra-node link, otherwise the
//! inter-node one (the slowest link bounds the collective). Each collective takes the faster
//! of two textbook algorithms (as NCCL and HCCL pick by size):
//! - all-reduce of `n` bytes: ring `2(g−1)·α + 2(g−1)/g·n·β`, or recursive halving and
//!   doubling `2⌈log₂g⌉·α + 2(g−1)/g·n·β`;
//! - all-gather (of an `n`-byte result) or reduce-scatter (of `n` bytes): ring
//!   `(g−1)·α + (g−1)/g·n·β`, or recursive doubling `⌈log₂g⌉·α + (g−1)/g·n·β`;
//! - all-to-all receiving `m` bytes per device: pairwise `(g−1)·α + m·β`, or Bruck
//!   `⌈log₂g⌉·α + m·⌈log₂g⌉/2·β`.
//!
//! A profile of one machine whose ranks are threads on shared cores (`compute_slots`, what
//! `tessera bench profile` measures) is first specialised to the run's rank count with
//! [`DeviceProfile::for_ranks`]: ranks beyond the cores take turns, so compute and memory
//! rates shrink by the oversubscription, and collectives use the α–β measured on the local
//! backend with about that many ranks.

use std::ops::RangeInclusive;

/// One link class: latency and bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Latency of one message, seconds (α).
    pub alpha: f64,
    /// Bandwidth, bytes per second (β is its inverse).
    pub bandwidth: f64,
}

/// Matmul throughput for local products of at least `min_flops` floating-point operations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatmulRate {
    /// Smallest product (in FLOPs) this rate applies to.
    pub min_flops: f64,
    /// Sustained FLOP/s.
    pub flops_per_s: f64,
}

/// Collective α–β measured on the local backend with `ranks` rank threads on one machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalLink {
    /// Rank threads of the measurement.
    pub ranks: usize,
    /// Its latency and bandwidth.
    pub link: Link,
}

/// The most cores a profile may name.
pub const MAX_COMPUTE_SLOTS: usize = 1 << 16;

/// The most local-backend measurements a profile may hold.
pub const MAX_LOCAL_LINKS: usize = 16;

/// What the cost model knows about one kind of device and its network.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceProfile {
    /// The profile's name (`h100-nvlink-ib`, `cpu-local`, a file's name).
    pub name: String,
    /// Matmul throughput by shape class, ascending by `min_flops` (the first applies to every
    /// product smaller than the second's `min_flops`).
    pub matmul: Vec<MatmulRate>,
    /// Memory bandwidth for memory-bound ops, bytes per second.
    pub memory_bandwidth: f64,
    /// Device memory, bytes: the hard limit of a plan.
    pub memory_bytes: u64,
    /// Devices per node (sharing the intra-node link).
    pub devices_per_node: usize,
    /// The link between devices of one node.
    pub intra_node: Link,
    /// The link between nodes.
    pub inter_node: Link,
    /// Cores the ranks of one machine share for compute, when ranks are threads of one
    /// machine (`None`: every device computes on its own, as GPUs and NPUs do).
    pub compute_slots: Option<usize>,
    /// Collective links measured on the local backend, ascending by rank count (empty: use
    /// `intra_node` / `inter_node`).
    pub local_links: Vec<LocalLink>,
}

/// Why a profile is not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileError {
    /// The field at fault.
    pub field: String,
    /// The rule broken.
    pub reason: String,
}

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for ProfileError {}

/// The matmul rates a profile may give, FLOP/s: from a thousandth of a 1990s workstation's to
/// a thousand times a 2020s accelerator's.
pub const FLOPS_PER_S_RANGE: RangeInclusive<f64> = 1e3..=1e21;

/// The memory and link bandwidths a profile may give, bytes per second.
pub const BANDWIDTH_RANGE: RangeInclusive<f64> = 1e3..=1e18;

/// The latencies (α) a profile may give, seconds: none up to one second per message.
pub const ALPHA_RANGE: RangeInclusive<f64> = 0.0..=1.0;

/// The largest `min_flops` of a matmul shape class.
pub const MAX_MIN_FLOPS: f64 = 1e30;

/// The most device memory a profile may give, bytes (10¹⁸, about 888 PiB).
pub const MAX_MEMORY_BYTES: u64 = 1_000_000_000_000_000_000;

/// The most devices per node a profile may give.
pub const MAX_DEVICES_PER_NODE: usize = 1_000_000;

/// `v` in few characters: `0`, `1`, `1000`, `1e21`, `1e-300`.
fn short(v: f64) -> String {
    if v == 0.0 || (1e-3..1e4).contains(&v.abs()) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// `field`'s `value` within `range` (`unit` names what it counts), or the error naming both.
fn within(
    field: &str,
    value: f64,
    range: &RangeInclusive<f64>,
    unit: &str,
) -> Result<(), ProfileError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(ProfileError {
            field: field.to_string(),
            reason: format!(
                "{} is outside the plausible range {} to {} {unit}",
                short(value),
                short(*range.start()),
                short(*range.end())
            ),
        })
    }
}

impl DeviceProfile {
    /// Checks the profile as a file or a built-in must give it: every rate, latency and size
    /// within its plausible range ([`FLOPS_PER_S_RANGE`], [`BANDWIDTH_RANGE`], [`ALPHA_RANGE`],
    /// [`MAX_MIN_FLOPS`], [`MAX_MEMORY_BYTES`], [`MAX_DEVICES_PER_NODE`]), the error naming the
    /// field and the bound, and everything [`DeviceProfile::validate_usable`] checks. Within
    /// these ranges every cost the model computes for a graph of bounded size is finite.
    pub fn validate(&self) -> Result<(), ProfileError> {
        self.validate_usable()?;
        for (i, rate) in self.matmul.iter().enumerate() {
            within(
                &format!("matmul[{i}].flops_per_s"),
                rate.flops_per_s,
                &FLOPS_PER_S_RANGE,
                "FLOP/s",
            )?;
            within(
                &format!("matmul[{i}].min_flops"),
                rate.min_flops,
                &(0.0..=MAX_MIN_FLOPS),
                "FLOPs",
            )?;
        }
        within(
            "memory_bandwidth",
            self.memory_bandwidth,
            &BANDWIDTH_RANGE,
            "bytes/s",
        )?;
        if self.memory_bytes > MAX_MEMORY_BYTES {
            return Err(ProfileError {
                field: "memory_bytes".to_string(),
                reason: format!(
                    "{} is not a whole number of bytes between 1 and {MAX_MEMORY_BYTES}",
                    self.memory_bytes
                ),
            });
        }
        if self.devices_per_node > MAX_DEVICES_PER_NODE {
            return Err(ProfileError {
                field: "devices_per_node".to_string(),
                reason: format!(
                    "{} is not a whole number between 1 and {MAX_DEVICES_PER_NODE}",
                    self.devices_per_node
                ),
            });
        }
        let links = [
            ("intra_node".to_string(), self.intra_node),
            ("inter_node".to_string(), self.inter_node),
        ];
        let local = self
            .local_links
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("local_link[{i}]"), l.link));
        for (name, link) in links.into_iter().chain(local) {
            within(
                &format!("{name}.alpha"),
                link.alpha,
                &ALPHA_RANGE,
                "seconds",
            )?;
            within(
                &format!("{name}.bandwidth"),
                link.bandwidth,
                &BANDWIDTH_RANGE,
                "bytes/s",
            )?;
        }
        Ok(())
    }

    /// Checks what the cost model needs of any profile, also one specialised to a rank count
    /// ([`DeviceProfile::for_ranks`], whose rates fall below [`DeviceProfile::validate`]'s
    /// ranges when many ranks share a core): every rate and size positive and finite, every α
    /// finite and ≥ 0, the matmul classes and local links ascending. The searches check this
    /// first and then refuse any cost they compute that is not finite
    /// ([`crate::SearchError::NonFiniteCost`]).
    pub fn validate_usable(&self) -> Result<(), ProfileError> {
        let positive = |field: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ProfileError {
                    field: field.to_string(),
                    reason: format!("{v} is not a positive finite number"),
                })
            }
        };
        if self.matmul.is_empty() {
            return Err(ProfileError {
                field: "matmul".to_string(),
                reason: "at least one rate is needed".to_string(),
            });
        }
        for (i, rate) in self.matmul.iter().enumerate() {
            positive(&format!("matmul[{i}].flops_per_s"), rate.flops_per_s)?;
            if !(rate.min_flops.is_finite() && rate.min_flops >= 0.0) {
                return Err(ProfileError {
                    field: format!("matmul[{i}].min_flops"),
                    reason: format!("{} is not a finite number ≥ 0", rate.min_flops),
                });
            }
            if i > 0 && rate.min_flops <= self.matmul[i - 1].min_flops {
                return Err(ProfileError {
                    field: format!("matmul[{i}].min_flops"),
                    reason: "the shape classes must ascend by min_flops".to_string(),
                });
            }
        }
        positive("memory_bandwidth", self.memory_bandwidth)?;
        positive("memory_bytes", self.memory_bytes as f64)?;
        positive("devices_per_node", self.devices_per_node as f64)?;
        for (name, link) in [
            ("intra_node", self.intra_node),
            ("inter_node", self.inter_node),
        ] {
            check_link(name, link)?;
        }
        if let Some(slots) = self.compute_slots {
            if !(1..=MAX_COMPUTE_SLOTS).contains(&slots) {
                return Err(ProfileError {
                    field: "compute_slots".to_string(),
                    reason: format!(
                        "{slots} is not a whole number between 1 and {MAX_COMPUTE_SLOTS}"
                    ),
                });
            }
        }
        if self.local_links.len() > MAX_LOCAL_LINKS {
            return Err(ProfileError {
                field: "local_link".to_string(),
                reason: format!(
                    "{} measurements is over the limit of {MAX_LOCAL_LINKS}",
                    self.local_links.len()
                ),
            });
        }
        for (i, l) in self.local_links.iter().enumerate() {
            if !(2..=MAX_COMPUTE_SLOTS).contains(&l.ranks) {
                return Err(ProfileError {
                    field: format!("local_link[{i}].ranks"),
                    reason: format!(
                        "{} is not a whole number between 2 and {MAX_COMPUTE_SLOTS}",
                        l.ranks
                    ),
                });
            }
            if i > 0 && l.ranks <= self.local_links[i - 1].ranks {
                return Err(ProfileError {
                    field: format!("local_link[{i}].ranks"),
                    reason: "the measurements must ascend by ranks".to_string(),
                });
            }
            check_link(&format!("local_link[{i}]"), l.link)?;
        }
        Ok(())
    }

    /// The rate by which `ranks` rank threads on this machine slow each other's compute: the
    /// ranks per core when there are more ranks than `compute_slots`, else 1.
    pub fn oversubscription(&self, ranks: usize) -> f64 {
        match self.compute_slots {
            Some(slots) if ranks > slots => ranks as f64 / slots as f64,
            _ => 1.0,
        }
    }

    /// The profile as a run of `ranks` ranks sees it. With `compute_slots`, every rank is a
    /// thread of this machine: matmul and memory rates are divided by the
    /// [oversubscription](Self::oversubscription) (ranks sharing a core compute one after the
    /// other), and every collective uses the local-backend link measured with the fewest ranks
    /// at or above `ranks` (the most measured when none is). A profile without `compute_slots`
    /// and local links (the built-in GPU and NPU profiles) is returned unchanged. The result
    /// has neither, so specialising it again changes nothing.
    pub fn for_ranks(&self, ranks: usize) -> DeviceProfile {
        let mut p = self.clone();
        let slow = self.oversubscription(ranks);
        for m in &mut p.matmul {
            m.flops_per_s /= slow;
        }
        p.memory_bandwidth /= slow;
        let link = self
            .local_links
            .iter()
            .find(|l| l.ranks >= ranks)
            .or(self.local_links.last());
        if let Some(l) = link {
            p.intra_node = l.link;
            p.inter_node = l.link;
            p.devices_per_node = p.devices_per_node.max(ranks);
        }
        p.compute_slots = None;
        p.local_links = Vec::new();
        p
    }

    /// The link a collective over `group` devices uses.
    pub fn link(&self, group: usize) -> Link {
        if group <= self.devices_per_node {
            self.intra_node
        } else {
            self.inter_node
        }
    }

    /// Seconds of a local matmul of `flops` floating-point operations.
    pub fn matmul_time(&self, flops: f64) -> f64 {
        let rate = self
            .matmul
            .iter()
            .rev()
            .find(|r| flops >= r.min_flops)
            .or(self.matmul.first())
            .map_or(1.0, |r| r.flops_per_s);
        flops / rate
    }

    /// Seconds to stream `bytes` through memory (a memory-bound op).
    pub fn memory_time(&self, bytes: f64) -> f64 {
        bytes / self.memory_bandwidth
    }

    /// Seconds of an all-reduce of `bytes` over `group` devices.
    pub fn all_reduce(&self, bytes: f64, group: usize) -> f64 {
        if group <= 1 {
            return 0.0;
        }
        let link = self.link(group);
        let g = group as f64;
        let steps = (g - 1.0).min(log2_ceil(group));
        2.0 * steps * link.alpha + 2.0 * (g - 1.0) / g * bytes / link.bandwidth
    }

    /// Seconds of an all-gather producing `bytes` per device (or a reduce-scatter of `bytes`)
    /// over `group` devices.
    pub fn all_gather(&self, bytes: f64, group: usize) -> f64 {
        if group <= 1 {
            return 0.0;
        }
        let link = self.link(group);
        let g = group as f64;
        let steps = (g - 1.0).min(log2_ceil(group));
        steps * link.alpha + (g - 1.0) / g * bytes / link.bandwidth
    }

    /// Seconds of an all-to-all in which each device receives `bytes` from `group − 1` peers.
    pub fn all_to_all(&self, bytes: f64, group: usize) -> f64 {
        if group <= 1 {
            return 0.0;
        }
        let link = self.link(group);
        let pairwise = (group as f64 - 1.0) * link.alpha + bytes / link.bandwidth;
        let rounds = log2_ceil(group);
        let bruck = rounds * link.alpha + bytes * (rounds / 2.0).max(1.0) / link.bandwidth;
        pairwise.min(bruck)
    }
}

/// Checks a link's bandwidth is positive and its α a finite number ≥ 0.
fn check_link(name: &str, link: Link) -> Result<(), ProfileError> {
    if !(link.bandwidth.is_finite() && link.bandwidth > 0.0) {
        return Err(ProfileError {
            field: format!("{name}.bandwidth"),
            reason: format!("{} is not a positive finite number", link.bandwidth),
        });
    }
    if !(link.alpha.is_finite() && link.alpha >= 0.0) {
        return Err(ProfileError {
            field: format!("{name}.alpha"),
            reason: format!("{} is not a finite number ≥ 0", link.alpha),
        });
    }
    Ok(())
}

/// `⌈log₂ g⌉` as a float.
fn log2_ceil(group: usize) -> f64 {
    (usize::BITS - (group.max(1) - 1).leading_zeros()) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2-core machine: 10 GFLOP/s, 10 GB/s, all-reduce links measured on 2 and 8 ranks.
    fn two_cores() -> DeviceProfile {
        let link = |alpha, bandwidth| Link { alpha, bandwidth };
        DeviceProfile {
            name: "cpu".to_string(),
            matmul: vec![MatmulRate {
                min_flops: 0.0,
                flops_per_s: 1e10,
            }],
            memory_bandwidth: 1e10,
            memory_bytes: 1 << 30,
            devices_per_node: 2,
            intra_node: link(1e-6, 1e9),
            inter_node: link(1e-6, 1e9),
            compute_slots: Some(2),
            local_links: vec![
                LocalLink {
                    ranks: 2,
                    link: link(2e-5, 2e9),
                },
                LocalLink {
                    ranks: 8,
                    link: link(3e-4, 2e8),
                },
            ],
        }
    }

    #[test]
    fn ranks_beyond_the_cores_take_turns() {
        let p = two_cores();
        let flops = 1e9;
        let alone = p.for_ranks(1).matmul_time(flops);
        assert_eq!(alone, 0.1);
        assert_eq!(p.for_ranks(2).matmul_time(flops), alone);
        assert_eq!(p.for_ranks(8).matmul_time(flops), 4.0 * alone);
        assert!((p.for_ranks(3).memory_time(1e9) - 0.15).abs() < 1e-12);
    }

    #[test]
    fn collectives_use_the_local_link_of_the_rank_count() {
        let p = two_cores();
        assert_eq!(p.for_ranks(2).link(2), p.local_links[0].link);
        // 4 ranks: the next measurement up; 16: the largest there is.
        for ranks in [4, 8, 16] {
            let q = p.for_ranks(ranks);
            assert_eq!(q.link(2), p.local_links[1].link);
            assert_eq!(q.link(ranks), p.local_links[1].link, "every group is local");
        }
        let eight = p.for_ranks(8);
        assert_eq!(
            eight.for_ranks(8),
            eight,
            "specialising twice changes nothing"
        );
    }

    #[test]
    fn built_in_profiles_are_unaffected() {
        for name in crate::profiles::BUILT_IN {
            let p = crate::profiles::built_in(name).unwrap();
            assert_eq!(p.for_ranks(8192), p);
        }
    }

    #[test]
    fn bad_cores_and_local_links_name_the_key() {
        let mut p = two_cores();
        p.compute_slots = Some(0);
        assert_eq!(p.validate().unwrap_err().field, "compute_slots");
        let mut p = two_cores();
        p.local_links.swap(0, 1);
        assert_eq!(p.validate().unwrap_err().field, "local_link[1].ranks");
        let mut p = two_cores();
        p.local_links[0].ranks = 1;
        assert_eq!(p.validate().unwrap_err().field, "local_link[0].ranks");
        let mut p = two_cores();
        p.local_links[1].link.bandwidth = f64::NAN;
        assert_eq!(p.validate().unwrap_err().field, "local_link[1].bandwidth");
        assert!(two_cores().validate().is_ok());
    }
}
