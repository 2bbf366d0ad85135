//! The schedule generators: GPipe, 1F1B, interleaved 1F1B and zero-bubble ZB-H1.

use super::{check_shape, Action, ActionKind, Schedule};
use crate::pipeline::error::PipelineError;

impl Schedule {
    /// GPipe: on every stage, the forwards of chunk 0 for every micro-batch, then chunk 1, …;
    /// then the full backwards, last chunk first, micro-batches ascending. Peak in-flight
    /// activations: M · chunks on every stage.
    pub fn gpipe(
        stages: usize,
        micro_batches: usize,
        chunks: usize,
    ) -> Result<Schedule, PipelineError> {
        check_shape(stages, micro_batches, chunks)?;
        let per_stage = (0..stages)
            .map(|_| {
                let forwards = (0..chunks).flat_map(|chunk| {
                    (0..micro_batches).map(move |mb| Action::new(ActionKind::Forward, mb, chunk))
                });
                let backwards = (0..chunks).rev().flat_map(|chunk| {
                    (0..micro_batches).map(move |mb| Action::new(ActionKind::Backward, mb, chunk))
                });
                forwards.chain(backwards).collect()
            })
            .collect();
        Schedule::from_lists(stages, micro_batches, chunks, per_stage)
    }

    /// 1F1B (PipeDream-flush, MindSpore's and Megatron's non-interleaved schedule): stage s runs
    /// `w = min(P − s − 1, M)` warm-up forwards, then forward w + i and backward i in turn, then
    /// the remaining backwards. Peak in-flight activations on stage s: min(P − s, M).
    pub fn one_f_one_b(stages: usize, micro_batches: usize) -> Result<Schedule, PipelineError> {
        check_shape(stages, micro_batches, 1)?;
        let per_stage = (0..stages)
            .map(|stage| {
                let warmup = (stages - stage - 1).min(micro_batches);
                let mut list = Vec::with_capacity(2 * micro_batches);
                list.extend((0..warmup).map(|mb| Action::new(ActionKind::Forward, mb, 0)));
                for i in 0..micro_batches - warmup {
                    list.push(Action::new(ActionKind::Forward, warmup + i, 0));
                    list.push(Action::new(ActionKind::Backward, i, 0));
                }
                list.extend(
                    (micro_batches - warmup..micro_batches)
                        .map(|mb| Action::new(ActionKind::Backward, mb, 0)),
                );
                list
            })
            .collect();
        Schedule::from_lists(stages, micro_batches, 1, per_stage)
    }

    /// Interleaved 1F1B (Megatron's virtual pipeline, Narayanan et al. 2021) with `chunks`
    /// model chunks per stage.
    ///
    /// Micro-batches run in groups of P: the forward order of every stage is, group by group,
    /// chunk 0 of the group's micro-batches, then chunk 1, …; the backward order is the same
    /// with the chunks reversed. Stage s runs `min(2·(P − s − 1) + (chunks − 1)·P, M·chunks)`
    /// warm-up forwards, then one forward and one backward in turn, then the rest of the
    /// backwards.
    ///
    /// M must be a multiple of P (Megatron's rule, also checked by
    /// [`PipelineConfig::validate`](crate::pipeline::PipelineConfig::validate)). With a partial last group this warm-up can deadlock: at
    /// P = 4, M = 5 and 3 chunks the simulator found the last stage waiting at B(mb 0, chunk 1)
    /// for stage 0's B(mb 0, chunk 2), while stage 0 waits at F(mb 4, chunk 2) for the last
    /// stage's F(mb 4, chunk 1), which that stage lists after the backward. So the generator
    /// refuses it with [`PipelineError::MicroBatchesNotMultipleOfStages`]. With M a multiple of
    /// P and no latency, the makespan is M·chunks·(f + b) + (P − 1)·(f + b), with f and b one
    /// chunk's forward and backward times: Megatron's bubble (P − 1)·(F + B)/chunks in
    /// whole-stage times. The tests check it exactly.
    pub fn interleaved_1f1b(
        stages: usize,
        micro_batches: usize,
        chunks: usize,
    ) -> Result<Schedule, PipelineError> {
        check_shape(stages, micro_batches, chunks)?;
        if !micro_batches.is_multiple_of(stages) {
            return Err(PipelineError::MicroBatchesNotMultipleOfStages {
                micro_batches,
                stages,
            });
        }
        let order = |backward: bool| -> Vec<(usize, usize)> {
            let mut order = Vec::with_capacity(micro_batches * chunks);
            for group_start in (0..micro_batches).step_by(stages) {
                let group_end = (group_start + stages).min(micro_batches);
                for chunk_step in 0..chunks {
                    let chunk = if backward {
                        chunks - 1 - chunk_step
                    } else {
                        chunk_step
                    };
                    order.extend((group_start..group_end).map(|mb| (mb, chunk)));
                }
            }
            order
        };
        let forward_order = order(false);
        let backward_order = order(true);
        let total = micro_batches * chunks;
        let per_stage = (0..stages)
            .map(|stage| {
                let warmup = (2 * (stages - stage - 1) + (chunks - 1) * stages).min(total);
                let forward = |k: usize| {
                    let (mb, chunk) = forward_order[k];
                    Action::new(ActionKind::Forward, mb, chunk)
                };
                let backward = |k: usize| {
                    let (mb, chunk) = backward_order[k];
                    Action::new(ActionKind::Backward, mb, chunk)
                };
                let mut list = Vec::with_capacity(2 * total);
                list.extend((0..warmup).map(forward));
                for i in 0..total - warmup {
                    list.push(forward(warmup + i));
                    list.push(backward(i));
                }
                list.extend((total - warmup..total).map(backward));
                list
            })
            .collect();
        Schedule::from_lists(stages, micro_batches, chunks, per_stage)
    }

    /// Zero-bubble ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the order of
    /// forwards and input-gradient backwards is 1F1B's, each backward split into its input half
    /// (`Bi`, which sends the gradient upstream at once) and its weight half (`W`). Stage s keeps
    /// at most s weight halves pending: after each `Bi` it runs the oldest pending `W`s until at
    /// most s remain, and runs the rest at the end, where they fill the cool-down bubble.
    ///
    /// Peak in-flight activations (forward started, input gradient not yet) equal 1F1B's,
    /// min(P − s, M). Between actions at most s micro-batches wait for their weight half (s + 1
    /// right after a `Bi`), and no stage retains more than min(P, M) micro-batches' inputs at
    /// once (`peak_retained`), 1F1B's peak on stage 0. With F = Bi = W and M ≥ P the makespan
    /// is M·(F + Bi + W) + (P − 1)·(F + Bi − W), against 1F1B's
    /// (M + P − 1)·(F + Bi + W); the tests check both exactly.
    pub fn zero_bubble_h1(stages: usize, micro_batches: usize) -> Result<Schedule, PipelineError> {
        check_shape(stages, micro_batches, 1)?;
        let per_stage = (0..stages)
            .map(|stage| {
                let warmup = (stages - stage - 1).min(micro_batches);
                let mut list = Vec::with_capacity(3 * micro_batches);
                let mut oldest_pending_weight = 0;
                let mut input_done = 0;
                let mut backward_input = |list: &mut Vec<Action>, mb: usize| {
                    list.push(Action::new(ActionKind::BackwardInput, mb, 0));
                    input_done += 1;
                    while input_done - oldest_pending_weight > stage {
                        list.push(Action::new(
                            ActionKind::BackwardWeight,
                            oldest_pending_weight,
                            0,
                        ));
                        oldest_pending_weight += 1;
                    }
                };
                list.extend((0..warmup).map(|mb| Action::new(ActionKind::Forward, mb, 0)));
                for i in 0..micro_batches - warmup {
                    list.push(Action::new(ActionKind::Forward, warmup + i, 0));
                    backward_input(&mut list, i);
                }
                for mb in micro_batches - warmup..micro_batches {
                    backward_input(&mut list, mb);
                }
                let first_left = micro_batches.min(
                    list.iter()
                        .filter(|a| a.kind == ActionKind::BackwardWeight)
                        .count(),
                );
                list.extend(
                    (first_left..micro_batches)
                        .map(|mb| Action::new(ActionKind::BackwardWeight, mb, 0)),
                );
                list
            })
            .collect();
        Schedule::from_lists(stages, micro_batches, 1, per_stage)
    }
}
