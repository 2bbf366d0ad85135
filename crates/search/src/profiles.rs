//! Built-in device profiles from public figures.
//!
//! Peak figures are scaled to what training sustains: large matmuls at 60 % of the datasheet's
//! dense peak, small ones (under 1 GFLOP, launch- and bandwidth-bound) at 15 %; collectives
//! at 80 % of the link's unidirectional bandwidth.
//!
//! Sources:
//! - `h100-nvlink-ib`: NVIDIA H100 Tensor Core GPU datasheet (SXM5: 494 TFLOP/s dense TF32,
//!   3.35 TB/s HBM3, 80 GB, NVLink 4 at 900 GB/s bidirectional, i.e. 450 GB/s each way);
//!   NVIDIA DGX H100 user guide (8 GPUs per node, one ConnectX-7 NDR 400 Gb/s InfiniBand port
//!   per GPU, 50 GB/s); latencies from the NCCL tests' small-message times (about 3 µs inside
//!   a node, 6 µs across nodes).
//! - `ascend910b-hccs-roce`: Huawei Atlas 800T A2 training server datasheet (8 Ascend 910B
//!   NPUs per node, 64 GB HBM2e at 1.6 TB/s, 313 TFLOP/s FP16 per NPU, HCCS full mesh of
//!   56 GB/s links, i.e. 392 GB/s per NPU, one 200 Gb/s RoCE v2 port per NPU, 25 GB/s);
//!   latencies from Huawei's HCCL performance guide (about 5 µs inside a node, 10 µs across).

use crate::cost::{DeviceProfile, Link, MatmulRate};

/// The names of the built-in profiles.
pub const BUILT_IN: &[&str] = &["h100-nvlink-ib", "ascend910b-hccs-roce"];

/// Small products (under 1 GFLOP) are launch- and bandwidth-bound.
const SMALL_MATMUL_FLOPS: f64 = 1e9;

fn two_class(peak: f64) -> Vec<MatmulRate> {
    vec![
        MatmulRate {
            min_flops: 0.0,
            flops_per_s: 0.15 * peak,
        },
        MatmulRate {
            min_flops: SMALL_MATMUL_FLOPS,
            flops_per_s: 0.6 * peak,
        },
    ]
}

/// A built-in profile by name (see [`BUILT_IN`]).
pub fn built_in(name: &str) -> Option<DeviceProfile> {
    match name {
        "h100-nvlink-ib" => Some(DeviceProfile {
            name: name.to_string(),
            matmul: two_class(494e12),
            memory_bandwidth: 0.8 * 3.35e12,
            memory_bytes: 80_000_000_000,
            devices_per_node: 8,
            intra_node: Link {
                alpha: 3e-6,
                bandwidth: 0.8 * 450e9,
            },
            inter_node: Link {
                alpha: 6e-6,
                bandwidth: 0.8 * 50e9,
            },
            compute_slots: None,
            local_links: Vec::new(),
        }),
        "ascend910b-hccs-roce" => Some(DeviceProfile {
            name: name.to_string(),
            matmul: two_class(313e12),
            memory_bandwidth: 0.8 * 1.6e12,
            memory_bytes: 64_000_000_000,
            devices_per_node: 8,
            intra_node: Link {
                alpha: 5e-6,
                bandwidth: 0.8 * 392e9,
            },
            inter_node: Link {
                alpha: 10e-6,
                bandwidth: 0.8 * 25e9,
            },
            compute_slots: None,
            local_links: Vec::new(),
        }),
        _ => None,
    }
}
