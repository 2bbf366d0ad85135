//! Every stage's program: its actions with the sends and receives their dependencies imply,
//! placed at use or linearized by a dependency-driven run.

use std::cmp::Ordering;

use super::{Action, CommEvent, CommOrder, Dependency, Direction, Payload, ProgramStep, Schedule};
use crate::pipeline::error::PipelineError;
use crate::pipeline::simulate::{run_dependency_order, Durations};

impl Schedule {
    /// Every stage's program: its actions with the sends and receives they imply, in the order
    /// `order` chooses. Fails only if the schedule deadlocks even with buffered sends
    /// ([`CommOrder::Linearized`] needs a dependency-driven run to order the steps).
    pub fn program(&self, order: CommOrder) -> Result<Vec<Vec<ProgramStep>>, PipelineError> {
        match order {
            CommOrder::AtUse => Ok(self.program_at_use()),
            CommOrder::Linearized => self.program_linearized(&Durations::uniform(1.0, 1.0, 1.0)),
        }
    }

    /// The [`CommOrder::Linearized`] program, ordered by a dependency-driven run with `durations`
    /// rather than unit ones: with the durations the runtime will see, fewer rendezvous make one
    /// side wait for the other. Deadlock-free under blocking point-to-point for any durations.
    pub fn program_with_durations(
        &self,
        durations: &Durations,
    ) -> Result<Vec<Vec<ProgramStep>>, PipelineError> {
        self.program_linearized(durations)
    }

    /// Every stage's sends and receives alone, in program order ([`CommOrder::Linearized`]).
    pub fn communication(&self) -> Result<Vec<Vec<CommEvent>>, PipelineError> {
        Ok(self
            .program(CommOrder::Linearized)?
            .into_iter()
            .map(|steps| {
                steps
                    .into_iter()
                    .filter_map(|step| match step {
                        ProgramStep::Comm(event) => Some(event),
                        ProgramStep::Compute(_) => None,
                    })
                    .collect()
            })
            .collect())
    }

    pub(super) fn program_at_use(&self) -> Vec<Vec<ProgramStep>> {
        self.per_stage
            .iter()
            .enumerate()
            .map(|(stage, actions)| {
                let mut steps = Vec::with_capacity(actions.len() * 2);
                for action in actions {
                    for dependency in self.dependency_array(stage, *action).into_iter().flatten() {
                        if let Some(payload) = dependency.payload {
                            steps.push(ProgramStep::Comm(CommEvent {
                                direction: Direction::Recv,
                                payload,
                                peer: dependency.stage,
                                micro_batch: action.micro_batch,
                                chunk: action.chunk,
                                peer_chunk: dependency.action.chunk,
                            }));
                        }
                    }
                    steps.push(ProgramStep::Compute(*action));
                    if let Some(consumer) = self.remote_consumer(stage, *action) {
                        steps.push(ProgramStep::Comm(send_event(action, &consumer)));
                    }
                }
                steps
            })
            .collect()
    }

    pub(super) fn program_linearized(
        &self,
        durations: &Durations,
    ) -> Result<Vec<Vec<ProgramStep>>, PipelineError> {
        durations.check(self.stages)?;
        // Every action must take some time, so that a stage's keys strictly increase: a zero
        // duration counts as a small positive one for ordering.
        let smallest = [
            &durations.forward,
            &durations.backward_input,
            &durations.backward_weight,
        ]
        .into_iter()
        .flatten()
        .copied()
        .filter(|d| *d > 0.0)
        .fold(f64::INFINITY, f64::min);
        let floor = if smallest.is_finite() {
            smallest * 1e-3
        } else {
            1.0
        };
        let positive = |values: &Vec<f64>| values.iter().map(|d| d.max(floor)).collect();
        let ordering_durations = Durations {
            forward: positive(&durations.forward),
            backward_input: positive(&durations.backward_input),
            backward_weight: positive(&durations.backward_weight),
            p2p_latency: durations.p2p_latency,
        };
        let timing = run_dependency_order(self, &ordering_durations)?;
        // Where each action sits in its stage's list.
        let mut position = vec![[usize::MAX; 4]; self.split_backward.len()];
        for (stage, actions) in self.per_stage.iter().enumerate() {
            for (index, action) in actions.iter().enumerate() {
                position[self.slot(stage, action.chunk, action.micro_batch)][action.kind.index()] =
                    index;
            }
        }
        // Sort key: (time, class, producer stage, producer index). Class 0 is a transfer at its
        // rendezvous time, class 1 a computation at its start time; a transfer sorts before a
        // computation starting at the same moment. All keys are unique, and every stage's list
        // is its projection of one global order, so blocking execution cannot deadlock.
        type Key = (f64, u8, usize, usize);
        let mut keyed: Vec<Vec<(Key, ProgramStep)>> = self
            .per_stage
            .iter()
            .map(|actions| Vec::with_capacity(actions.len() * 2))
            .collect();
        for (stage, actions) in self.per_stage.iter().enumerate() {
            for (index, action) in actions.iter().enumerate() {
                let (start, end) = timing[stage][index];
                keyed[stage].push(((start, 1, stage, index), ProgramStep::Compute(*action)));
                if let Some(consumer) = self.remote_consumer(stage, *action) {
                    let consumer_index = position[self.slot(
                        consumer.stage,
                        consumer.action.chunk,
                        consumer.action.micro_batch,
                    )][consumer.action.kind.index()];
                    let consumer_start = timing[consumer.stage]
                        .get(consumer_index)
                        .map_or(end, |(start, _)| *start);
                    let time = rendezvous_time(
                        &timing[stage],
                        &timing[consumer.stage],
                        end,
                        consumer_start,
                    );
                    let key = (time, 0, stage, index);
                    let send = send_event(action, &consumer);
                    let recv = CommEvent {
                        direction: Direction::Recv,
                        peer: stage,
                        chunk: send.peer_chunk,
                        peer_chunk: send.chunk,
                        ..send
                    };
                    keyed[stage].push((key, ProgramStep::Comm(send)));
                    keyed[consumer.stage].push((key, ProgramStep::Comm(recv)));
                }
            }
        }
        Ok(keyed
            .into_iter()
            .map(|mut steps| {
                steps.sort_by(|(a, _), (b, _)| compare_keys(a, b));
                steps.into_iter().map(|(_, step)| step).collect()
            })
            .collect())
    }
}

/// A moment in `[earliest, latest]` at which neither stage is in the middle of an action, so a
/// rendezvous there costs neither side a wait; `earliest` (the producer's end) if there is none
/// among the first candidates. `producer` and `consumer` are (start, end) in program order.
fn rendezvous_time(
    producer: &[(f64, f64)],
    consumer: &[(f64, f64)],
    earliest: f64,
    latest: f64,
) -> f64 {
    const MAX_CANDIDATES: usize = 64;
    let at_boundary = |timing: &[(f64, f64)], time: f64| {
        let first_ending_later = timing.partition_point(|(_, end)| *end <= time);
        timing
            .get(first_ending_later)
            .is_none_or(|(start, _)| *start >= time)
    };
    let boundaries_in_range = |timing: &[(f64, f64)]| {
        let first = timing.partition_point(|(_, end)| *end < earliest);
        timing[first..]
            .iter()
            .take(MAX_CANDIDATES)
            .flat_map(|(start, end)| [*start, *end])
            .filter(|time| (earliest..=latest).contains(time))
            .collect::<Vec<f64>>()
    };
    let mut candidates = vec![earliest];
    candidates.extend(boundaries_in_range(producer));
    candidates.extend(boundaries_in_range(consumer));
    candidates.sort_by(f64::total_cmp);
    candidates
        .into_iter()
        .find(|time| at_boundary(producer, *time) && at_boundary(consumer, *time))
        .unwrap_or(earliest)
}

fn compare_keys(a: &(f64, u8, usize, usize), b: &(f64, u8, usize, usize)) -> Ordering {
    a.0.total_cmp(&b.0)
        .then(a.1.cmp(&b.1))
        .then(a.2.cmp(&b.2))
        .then(a.3.cmp(&b.3))
}

fn send_event(action: &Action, consumer: &Dependency) -> CommEvent {
    CommEvent {
        direction: Direction::Send,
        payload: consumer.payload.unwrap_or(Payload::Activation),
        peer: consumer.stage,
        micro_batch: action.micro_batch,
        chunk: action.chunk,
        peer_chunk: consumer.action.chunk,
    }
}
