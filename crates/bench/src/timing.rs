//! Timing and the units reports are written in.

use std::time::{Duration, Instant};

/// Median, minimum and maximum of a set of durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// The median.
    pub median: Duration,
    /// The fastest run.
    pub min: Duration,
    /// The slowest run.
    pub max: Duration,
}

impl Summary {
    /// The summary of `times` (at least one): the median is the upper one of an even count.
    pub fn of(times: &[Duration]) -> Summary {
        let mut sorted = times.to_vec();
        sorted.sort_unstable();
        Summary {
            median: sorted[sorted.len() / 2],
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        }
    }
}

/// Times `f` `reps` times (after one warm-up call) and summarises.
pub fn time_reps(reps: usize, mut f: impl FnMut()) -> Summary {
    f();
    let times: Vec<Duration> = (0..reps.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    Summary::of(&times)
}

/// Bytes per second as GB/s (10^9).
pub fn gb_per_s(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-12) / 1e9
}

/// Human size: `64 KiB`, `16 MiB`.
pub fn human_bytes(bytes: usize) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// Milliseconds of `d`.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_whole_units_or_bytes() {
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(16 << 20), "16 MiB");
        assert_eq!(human_bytes(64 << 10), "64 KiB");
        assert_eq!(human_bytes(1500), "1500 B");
    }

    #[test]
    fn the_median_of_an_even_count_is_the_upper_one() {
        let times: Vec<Duration> = [4, 1, 3, 2].map(Duration::from_millis).to_vec();
        let s = Summary::of(&times);
        assert_eq!(
            (s.median, s.min, s.max),
            (
                Duration::from_millis(3),
                Duration::from_millis(1),
                Duration::from_millis(4)
            )
        );
    }
}
