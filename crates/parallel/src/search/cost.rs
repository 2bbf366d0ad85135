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

impl DeviceProfile {
    /// Checks every rate and size is positive and finite and the matmul classes ascend.
    pub fn validate(&self) -> Result<(), ProfileError> {
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
            positive(&format!("{name}.bandwidth"), link.bandwidth)?;
            if !(link.alpha.is_finite() && link.alpha >= 0.0) {
                return Err(ProfileError {
                    field: format!("{name}.alpha"),
                    reason: format!("{} is not a finite number ≥ 0", link.alpha),
                });
            }
        }
        Ok(())
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

/// `⌈log₂ g⌉` as a float.
fn log2_ceil(group: usize) -> f64 {
    (usize::BITS - (group.max(1) - 1).leading_zeros()) as f64
}
