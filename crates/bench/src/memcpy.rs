//! `tessera bench memcpy`: single-thread memcpy bandwidth, the ceiling every copy and
//! collective is measured against.

use std::fmt;

use crate::timing::{gb_per_s, human_bytes, time_reps, Summary};
use crate::Progress;

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemcpyRequest {
    /// Largest buffer, in MiB (sizes go from 1 KiB up by ×4).
    pub max_mib: usize,
    /// Repetitions per size.
    pub reps: usize,
}

/// One buffer size's copy bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemcpyRow {
    /// The buffer size, bytes.
    pub size: usize,
    /// Bytes copied per timing (small sizes repeat inside one timing).
    pub bytes_per_timing: usize,
    /// The timings.
    pub times: Summary,
}

/// The report's first line.
struct Header {
    reps: usize,
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "single-thread memcpy (GB/s: median [min-max] over {} runs)",
            self.reps
        )
    }
}

impl fmt::Display for MemcpyRow {
    /// `   16 MiB   11.52 [10.98-11.80]`: GB/s median [min-max].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:>9}  {:>6.2} [{:.2}-{:.2}]",
            human_bytes(self.size),
            gb_per_s(self.bytes_per_timing, self.times.median),
            gb_per_s(self.bytes_per_timing, self.times.max),
            gb_per_s(self.bytes_per_timing, self.times.min)
        )
    }
}

/// Copy bandwidth per buffer size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemcpyReport {
    /// Repetitions per size.
    pub reps: usize,
    /// One row per size, smallest first.
    pub rows: Vec<MemcpyRow>,
}

impl fmt::Display for MemcpyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Header { reps: self.reps }.fmt(f)?;
        self.rows.iter().try_for_each(|row| row.fmt(f))
    }
}

/// Runs `tessera bench memcpy`; asked to stop ([`Progress::stop`]), the rows measured so far.
pub fn memcpy(request: &MemcpyRequest, progress: &mut dyn Progress) -> MemcpyReport {
    progress.piece(&Header { reps: request.reps });
    let mut report = MemcpyReport {
        reps: request.reps,
        rows: Vec::new(),
    };
    let mut size = 1024usize;
    while size <= request.max_mib << 20 && !progress.stop() {
        let src = vec![1u8; size];
        let mut dst = vec![0u8; size];
        // Small sizes repeat inside one timing so the clock resolution does not dominate.
        let inner = ((1 << 24) / size).max(1);
        let times = time_reps(request.reps, || {
            for _ in 0..inner {
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&mut dst);
            }
        });
        let row = MemcpyRow {
            size,
            bytes_per_timing: size * inner,
            times,
        };
        progress.piece(&row);
        report.rows.push(row);
        size *= 4;
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Record;

    #[test]
    fn the_pieces_shown_are_the_report() {
        let mut shown = Record::default();
        let report = memcpy(
            &MemcpyRequest {
                max_mib: 1,
                reps: 1,
            },
            &mut shown,
        );
        let sizes: Vec<usize> = report.rows.iter().map(|r| r.size).collect();
        assert_eq!(
            sizes,
            [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
        );
        assert_eq!(shown.0, report.to_string());
        assert!(shown
            .0
            .starts_with("single-thread memcpy (GB/s: median [min-max] over 1 runs)\n    1 KiB  "));
    }

    /// The reader gone after the header and one row (`tessera bench memcpy | head -2`): the
    /// sweep ran every size to its end; it stops before measuring the next one.
    #[test]
    fn a_reader_gone_stops_the_sweep_at_the_next_size() {
        let mut gone = crate::testing::GoneAfter::new(2);
        let request = MemcpyRequest {
            max_mib: 1,
            reps: 1,
        };
        let report = memcpy(&request, &mut gone);
        assert_eq!(report.rows.len(), 1, "{report}");
        assert_eq!(gone.shown.len(), 2);
    }
}
