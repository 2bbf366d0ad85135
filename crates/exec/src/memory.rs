//! Memory accounting of a training run: every rank's peaks by category, gathered to every
//! rank at the end, as the run summary and the metrics log report them; and the prediction
//! `tessera train --explain` prints.

use comm::Communicator;
use parallel::memory::{MemoryBytes, MemoryReport};
use serde_json::json;

use crate::error::ExecError;

/// The six figures of a report, in wire order.
fn figures(r: &MemoryReport) -> [usize; 6] {
    let p = &r.peaks;
    [
        p.parameters,
        p.gradients,
        p.optimizer,
        p.activations,
        p.communication,
        r.peak,
    ]
}

/// Every rank's report, by rank (an all-gather of six numbers each).
pub fn gather_reports(
    world: &dyn Communicator,
    mine: &MemoryReport,
) -> Result<Vec<MemoryReport>, ExecError> {
    let send: Vec<u8> = figures(mine)
        .iter()
        .flat_map(|&x| (x as u64).to_le_bytes())
        .collect();
    let mut recv = vec![0u8; send.len() * world.size()];
    world.all_gather_bytes(&send, &mut recv)?;
    Ok(recv
        .chunks_exact(send.len())
        .map(|rank| {
            let x: Vec<usize> = rank
                .chunks_exact(8)
                .map(|b| {
                    let bytes: [u8; 8] = b.try_into().expect("chunks of 8");
                    usize::try_from(u64::from_le_bytes(bytes)).unwrap_or(usize::MAX)
                })
                .collect();
            MemoryReport {
                peaks: MemoryBytes {
                    parameters: x[0],
                    gradients: x[1],
                    optimizer: x[2],
                    activations: x[3],
                    communication: x[4],
                },
                peak: x[5],
            }
        })
        .collect())
}

/// `{"rank": r, "parameters": B, "gradients": B, "optimizer": B, "activations": B,
/// "communication": B, "peak": B}`: each category's peak and the peak of the total, in bytes.
pub fn memory_json(rank: usize, report: &MemoryReport) -> serde_json::Value {
    let p = &report.peaks;
    json!({
        "rank": rank,
        "parameters": p.parameters,
        "gradients": p.gradients,
        "optimizer": p.optimizer,
        "activations": p.activations,
        "communication": p.communication,
        "peak": report.peak,
    })
}

/// One line per rank: `rank 0: parameters 1.20 MiB, gradients …, peak 9.80 MiB`.
pub fn memory_lines(reports: &[MemoryReport]) -> String {
    let mib = |b: usize| format!("{:.2} MiB", b as f64 / f64::from(1 << 20));
    reports
        .iter()
        .enumerate()
        .map(|(rank, r)| {
            let p = &r.peaks;
            format!(
                "  rank {rank}: parameters {}, gradients {}, optimizer {}, activations {}, communication {}; peak {}\n",
                mib(p.parameters),
                mib(p.gradients),
                mib(p.optimizer),
                mib(p.activations),
                mib(p.communication),
                mib(r.peak)
            )
        })
        .collect()
}
