//! The measured pipeline bubble, defined as the schedule simulator defines the predicted one
//! (`parallel::pipeline::SimulationReport::bubble_fraction`): over one step's span on every
//! rank, from the first rank's first span to the last rank's last one, the share of rank-time
//! not spent working. A rank works in its passes and in the runtime's bookkeeping around them
//! (a micro-batch's buffers and inputs, summing its gradients); it is idle while it waits for
//! another stage's activation or gradient, and before its first span and after its last one
//! (the last stage waiting for the first one's forward, the first stage's last backwards). The
//! optimizer, the gradients' reductions and logging fall outside every rank's spans.

use parallel::pipeline::{simulate, Durations, PipelineError, Schedule};

use crate::pipeline::StepTrace;

/// The bubble of one step, given each rank's trace of it: `Σ idle / (ranks × span)`, with
/// `span` from the earliest rank's first span to the latest rank's last span and a rank's idle
/// time `span − (own span − waiting)`. `None` when no trace has a span. The traces must share a
/// clock: the ranks of one process do (under MPI, each process sees its own rank only, and
/// this is its waiting share of its own span).
pub fn step_bubble(traces: &[&StepTrace]) -> Option<f64> {
    let ranks: Vec<(f64, f64, f64)> = traces
        .iter()
        .filter_map(|t| t.extent().map(|(start, end)| (start, end, t.waiting_us())))
        .collect();
    let start = ranks.iter().map(|r| r.0).reduce(f64::min)?;
    let end = ranks.iter().map(|r| r.1).reduce(f64::max)?;
    let span = end - start;
    if span <= 0.0 {
        return Some(0.0);
    }
    let idle: f64 = ranks
        .iter()
        .map(|&(own_start, own_end, waiting)| span - (own_end - own_start - waiting))
        .sum();
    Some((idle / (ranks.len() as f64 * span)).clamp(0.0, 1.0))
}

/// The run's measured bubble: [`step_bubble`] of every step (the traces of step `i` are each
/// rank's `i`-th), averaged over the steps, the first one (which warms up) left out when there
/// are more. `None` without pipelined steps.
pub fn measured_bubble(per_rank: &[&[StepTrace]]) -> Option<f64> {
    let steps = per_rank
        .iter()
        .filter(|t| !t.is_empty())
        .map(|t| t.len())
        .min()?;
    let first = usize::from(steps > 1);
    let bubbles: Vec<f64> = (first..steps)
        .filter_map(|i| {
            let traces: Vec<&StepTrace> = per_rank.iter().filter_map(|t| t.get(i)).collect();
            step_bubble(&traces)
        })
        .collect();
    (!bubbles.is_empty()).then(|| bubbles.iter().sum::<f64>() / bubbles.len() as f64)
}

/// The bubble the schedule simulator predicts for `schedule` when every pass of a stage takes
/// the mean time this run measured for that kind of pass on the stage's ranks (steps after the
/// first, [`StepTrace::pass_us`]): the prediction for the stages as they are, imbalance and
/// per-micro-batch costs included, against which the measured bubble is judged. Ranks
/// `s · per_stage ..` of `per_rank` hold stage s. `None` when a stage has no traced step (under
/// MPI a process sees only its own rank).
pub fn calibrated_prediction(
    schedule: &Schedule,
    per_stage: usize,
    per_rank: &[&[StepTrace]],
) -> Result<Option<f64>, PipelineError> {
    let stages = schedule.stages();
    let passes = (schedule.micro_batches() * schedule.chunks()) as f64;
    let mut durations =
        Durations::per_stage(vec![0.0; stages], vec![0.0; stages], vec![0.0; stages]);
    for stage in 0..stages {
        let steps: Vec<&StepTrace> = per_rank
            .iter()
            .skip(stage * per_stage)
            .take(per_stage)
            .flat_map(|t| t.get(usize::from(t.len() > 1)..).unwrap_or(&[]))
            .collect();
        if steps.is_empty() {
            return Ok(None);
        }
        let mean = |time: fn(&StepTrace) -> f64| {
            steps.iter().map(|t| time(t)).sum::<f64>() / (steps.len() as f64 * passes)
        };
        durations.forward[stage] = mean(|t| t.pass_us.forward);
        durations.backward_input[stage] = mean(|t| t.pass_us.backward_input);
        durations.backward_weight[stage] = mean(|t| t.pass_us.backward_weight);
    }
    Ok(Some(simulate(schedule, &durations)?.bubble_fraction))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{SpanKind, TraceSpan};

    fn trace(spans: &[(&str, SpanKind, f64, f64)]) -> StepTrace {
        StepTrace {
            spans: spans
                .iter()
                .map(|&(name, kind, start_us, dur_us)| TraceSpan {
                    rank: 0,
                    name: name.to_string(),
                    start_us,
                    dur_us,
                    kind,
                })
                .collect(),
            ..StepTrace::default()
        }
    }

    use SpanKind::{Compute, Runtime, Wait};

    /// P = 2, M = 2, 1F1B with a forward of 1 and a backward of 2, as the simulator lays it out
    /// (makespan 9, 12 busy of 18: bubble 1/3); the runtime's own work counts as work.
    #[test]
    fn the_bubble_counts_waits_and_the_time_outside_each_ranks_span() {
        let stage0 = trace(&[
            ("buffers 0", Runtime, 0.0, 0.5),
            ("F0", Compute, 0.5, 0.5),
            ("F1", Compute, 1.0, 1.0),
            ("wait B0", Wait, 2.0, 2.0),
            ("B0", Compute, 4.0, 2.0),
            ("wait B1", Wait, 6.0, 1.0),
            ("B1", Compute, 7.0, 2.0),
        ]);
        let stage1 = trace(&[
            ("wait F0", Wait, 0.0, 1.0),
            ("F0", Compute, 1.0, 1.0),
            ("B0", Compute, 2.0, 2.0),
            ("F1", Compute, 4.0, 1.0),
            ("B1", Compute, 5.0, 2.0),
        ]);
        let bubble = step_bubble(&[&stage0, &stage1]).unwrap();
        assert!((bubble - 6.0 / 18.0).abs() < 1e-12, "{bubble}");
        // Alone, a rank's bubble is its waiting share of its own span.
        assert!((step_bubble(&[&stage1]).unwrap() - 1.0 / 7.0).abs() < 1e-12);
        assert!((stage0.waiting_us() - 3.0).abs() < 1e-12);
    }

    fn timed(forward: f64, backward: f64) -> StepTrace {
        StepTrace {
            pass_us: crate::pipeline::PassTimes {
                forward,
                backward_input: backward,
                backward_weight: 0.0,
            },
            ..StepTrace::default()
        }
    }

    /// Equal stages give 1F1B's (P − 1)/(M + P − 1); a slower last stage gives more.
    #[test]
    fn the_calibrated_prediction_simulates_the_measured_pass_times() {
        let schedule = Schedule::one_f_one_b(2, 4).unwrap();
        // Totals over the 4 micro-batches; the first step (warm-up) is left out.
        let even = [timed(99.0, 99.0), timed(4.0, 8.0)];
        let bubble = calibrated_prediction(&schedule, 1, &[&even[..], &even[..]]).unwrap();
        assert!((bubble.unwrap() - 1.0 / 5.0).abs() < 1e-12, "{bubble:?}");
        let slow = [timed(6.0, 12.0)];
        let skewed = calibrated_prediction(&schedule, 1, &[&even[1..], &slow[..]]).unwrap();
        assert!(skewed.unwrap() > 0.2 + 0.05, "{skewed:?}");
        assert_eq!(calibrated_prediction(&schedule, 1, &[&even[..]]), Ok(None));
    }

    #[test]
    fn the_run_bubble_leaves_out_the_first_step() {
        let warm = trace(&[("wait F0", Wait, 0.0, 9.0), ("F0", Compute, 9.0, 1.0)]);
        let steady = trace(&[("wait F0", Wait, 20.0, 1.0), ("F0", Compute, 21.0, 3.0)]);
        let ranks = [warm, steady];
        let bubble = measured_bubble(&[&ranks[..]]).unwrap();
        assert!((bubble - 0.25).abs() < 1e-12, "{bubble}");
        assert_eq!(measured_bubble(&[&ranks[..1]]), Some(0.9));
        assert_eq!(measured_bubble(&[&[]]), None);
    }
}
