//! `tessera bench gpt-step --paced`: the 1-rank GPT step, one step per line read, for a driver
//! that alternates it step by step with another engine's step (`scripts/bench-gpt-lockstep.py`
//! against PyTorch's single thread).
//!
//! On a shared machine whose speed drifts by half within a minute, two engines timed a few
//! seconds apart (`scripts/bench-gpt-pairs.sh`) see different machines; two steps timed back to
//! back see the same one. The protocol, one line each way:
//! - after the header (`GPT …`, `machine: …`) and the 5 warm-up steps this side prints `ready`;
//! - each line the driver writes runs one timed step, answered by `step <milliseconds>`;
//! - end of input (or `--steps` steps) ends the run.

use std::io::{BufRead, Write};
use std::sync::Arc;

use comm::{Communicator, LocalCluster};

use crate::gpt_step::{adamw, batches, gpt_config, one_rank_program, GptStepRequest};
use crate::train_step::{RankStepper, StepBench};
use crate::BenchError;

/// Warm-up steps before `ready`, as in every `gpt-step` timing.
const WARMUP: usize = 5;

/// Runs the paced protocol over `input` and `output` for the GPT `request` describes (its
/// `layers`, `hidden` and `steps`, the most timed steps); the timed steps' wall times in
/// milliseconds.
pub fn gpt_step_paced(
    request: &GptStepRequest,
    input: &mut dyn BufRead,
    output: &mut dyn Write,
) -> Result<Vec<f64>, BenchError> {
    let gpt = gpt_config(request);
    // The widths and depths come from flags: bounded before any product or model is allocated.
    gpt.validate()?;
    writeln!(
        output,
        "GPT {} layers, 4 heads, width {}, 128 tokens, batch 16, f32, AdamW; paced steps\nmachine: {}",
        request.layers,
        request.hidden,
        crate::machine::describe()
    )?;
    let data = batches(&gpt)?;
    let program = one_rank_program(&gpt)?;
    let world: Arc<dyn Communicator> = Arc::new(LocalCluster::new(1)?.comms().remove(0));
    let bench = StepBench {
        optimizer: adamw(),
        warmup: WARMUP,
        steps: request.steps,
        profile: false,
        deterministic: None,
        clip: None,
    };
    let mut stepper = RankStepper::new(program, world, &data, &bench)?;
    for step in 0..WARMUP {
        stepper.step(step)?;
    }
    writeln!(output, "ready")?;
    output.flush()?;
    let mut times = Vec::with_capacity(request.steps);
    let mut line = String::new();
    while times.len() < request.steps {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            break;
        }
        let took = stepper.step(WARMUP + times.len())?.as_secs_f64() * 1e3;
        writeln!(output, "step {took:.3}")?;
        output.flush()?;
        times.push(took);
    }
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1-layer GPT of width 32 paced for at most `steps` steps.
    fn tiny(steps: usize) -> GptStepRequest {
        GptStepRequest {
            steps,
            ..crate::gpt_step::tests::one_step_on_one_rank(1, 32)
        }
    }

    /// The lines after `ready` (which must come after the header and before any step).
    fn steps_answered(out: &[u8]) -> Vec<f64> {
        let text = std::str::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("GPT 1 layers"), "{text}");
        assert!(lines[1].starts_with("machine: "), "{text}");
        assert_eq!(lines[2], "ready", "{text}");
        lines[3..]
            .iter()
            .map(|l| l.strip_prefix("step ").unwrap().parse().unwrap())
            .collect()
    }

    #[test]
    fn each_line_read_runs_one_timed_step_until_the_input_ends() {
        let mut out = Vec::new();
        let times = gpt_step_paced(&tiny(10), &mut &b"go\ngo\ngo\n"[..], &mut out).unwrap();
        assert_eq!(times.len(), 3);
        let answered = steps_answered(&out);
        assert_eq!(answered.len(), 3);
        assert!(answered.iter().all(|&ms| ms > 0.0));
    }

    #[test]
    fn the_steps_flag_caps_the_timed_steps() {
        let mut out = Vec::new();
        let times = gpt_step_paced(&tiny(2), &mut &b"a\nb\nc\nd\n"[..], &mut out).unwrap();
        assert_eq!(times.len(), 2);
        assert_eq!(steps_answered(&out).len(), 2);
    }

    #[test]
    fn an_oversized_gpt_is_refused_before_anything_is_printed() {
        let request = GptStepRequest {
            hidden: 1 << 40,
            ..tiny(1)
        };
        let mut out = Vec::new();
        assert!(gpt_step_paced(&request, &mut &b"go\n"[..], &mut out).is_err());
        assert!(out.is_empty());
    }
}
