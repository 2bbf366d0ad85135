//! The schedule checker: simulations of a schedule, with buffered sends (each action starts when
//! its inputs have arrived) and with blocking rendezvous sends and receives in program order.

use std::collections::{HashMap, VecDeque};

use super::error::{PipelineError, StuckStage};
use super::schedule::{Action, ActionKind, CommEvent, Direction, Payload, ProgramStep, Schedule};

/// How long each action takes, per stage or for all stages, and the point-to-point latency.
///
/// Each vector has one entry (every stage) or one per stage. A full backward
/// ([`ActionKind::Backward`]) takes `backward_input + backward_weight`. Units are arbitrary but
/// shared (seconds, or multiples of a forward).
#[derive(Debug, Clone, PartialEq)]
pub struct Durations {
    /// Forward time.
    pub forward: Vec<f64>,
    /// Input-gradient backward time (zero-bubble's B).
    pub backward_input: Vec<f64>,
    /// Weight-gradient backward time (zero-bubble's W).
    pub backward_weight: Vec<f64>,
    /// Time from the end of a send's producer to the data being usable on the peer (buffered
    /// mode), or the time a rendezvous takes (blocking mode).
    pub p2p_latency: f64,
}

impl Durations {
    /// The same times on every stage, no latency.
    pub fn uniform(forward: f64, backward_input: f64, backward_weight: f64) -> Durations {
        Durations {
            forward: vec![forward],
            backward_input: vec![backward_input],
            backward_weight: vec![backward_weight],
            p2p_latency: 0.0,
        }
    }

    /// Per-stage times (each vector one entry per stage), no latency.
    pub fn per_stage(
        forward: Vec<f64>,
        backward_input: Vec<f64>,
        backward_weight: Vec<f64>,
    ) -> Durations {
        Durations {
            forward,
            backward_input,
            backward_weight,
            p2p_latency: 0.0,
        }
    }

    /// The same with a point-to-point latency.
    pub fn with_latency(mut self, p2p_latency: f64) -> Durations {
        self.p2p_latency = p2p_latency;
        self
    }

    /// The time of `kind` on `stage` (call [`Durations::check`] first; a missing entry reads as
    /// the first).
    pub fn of(&self, stage: usize, kind: ActionKind) -> f64 {
        let pick = |values: &[f64]| {
            values
                .get(stage)
                .or_else(|| values.first())
                .copied()
                .unwrap_or(0.0)
        };
        match kind {
            ActionKind::Forward => pick(&self.forward),
            ActionKind::BackwardInput => pick(&self.backward_input),
            ActionKind::BackwardWeight => pick(&self.backward_weight),
            ActionKind::Backward => pick(&self.backward_input) + pick(&self.backward_weight),
        }
    }

    /// Checks every time is finite and non-negative and every vector has 1 or `stages` entries.
    pub fn check(&self, stages: usize) -> Result<(), PipelineError> {
        let lists: [(&'static str, &Vec<f64>); 3] = [
            ("forward", &self.forward),
            ("backward_input", &self.backward_input),
            ("backward_weight", &self.backward_weight),
        ];
        for (what, values) in lists {
            if values.len() != 1 && values.len() != stages {
                return Err(PipelineError::InvalidDuration {
                    what,
                    value: values.len() as f64,
                    reason: "needs one entry, or one per stage",
                });
            }
            for value in values.iter() {
                check_time(what, *value)?;
            }
        }
        check_time("p2p_latency", self.p2p_latency)
    }
}

fn check_time(what: &'static str, value: f64) -> Result<(), PipelineError> {
    if !value.is_finite() || value < 0.0 {
        return Err(PipelineError::InvalidDuration {
            what,
            value,
            reason: "must be finite and not negative",
        });
    }
    Ok(())
}

/// One step of a simulated timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedStep {
    /// The step (an action, or in blocking mode a send or receive).
    pub step: ProgramStep,
    /// When it started.
    pub start: f64,
    /// When it ended.
    pub end: f64,
}

/// What a simulation found.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulationReport {
    /// When the last stage finished (the step starts at 0).
    pub makespan: f64,
    /// Per stage, the time spent computing actions (communication is not busy time).
    pub busy: Vec<f64>,
    /// `1 − Σ busy / (P × makespan)`: the share of stage-time spent idle or communicating
    /// (0 when the makespan is 0).
    pub bubble_fraction: f64,
    /// Per stage, the most (micro-batch, chunk) pairs holding activations at once: counted from
    /// the start of a forward to the end of the backward that produces its input gradient (the
    /// full backward, or the input half). It depends only on the order, not on the durations.
    pub peak_activations: Vec<usize>,
    /// Per stage, the most (micro-batch, chunk) pairs at once whose input half has run but whose
    /// weight half has not (zero-bubble only; they hold the layer inputs and output gradients the
    /// weight gradient needs, less than a full set of activations). 0 without split backwards.
    pub peak_pending_weight_gradients: Vec<usize>,
    /// Per stage, the most (micro-batch, chunk) pairs at once between the start of their forward
    /// and the end of their last backward action (the full backward, or the weight half): every
    /// pair whose layer inputs are still kept for some gradient. Equals `peak_activations` without
    /// split backwards.
    pub peak_retained: Vec<usize>,
    /// Per stage, every step with its start and end.
    pub timeline: Vec<Vec<TimedStep>>,
}

/// Everything [`check_schedule`] proved, with the data it used.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckReport {
    /// The program checked ([`CommOrder::Linearized`](super::CommOrder::Linearized)).
    pub program: Vec<Vec<ProgramStep>>,
    /// The buffered, dependency-driven run.
    pub dependency: SimulationReport,
    /// The blocking, rendezvous run of `program`.
    pub blocking: SimulationReport,
}

/// Checks a schedule completely: builds its [`CommOrder::Linearized`](super::CommOrder::Linearized) program (ordered with
/// `durations`, [`Schedule::program_with_durations`]), checks that every
/// send has exactly one matching receive and every cross-stage input exactly one transfer
/// ([`check_communication`]), then runs it with buffered sends ([`simulate`]) and with blocking
/// rendezvous in program order ([`simulate_blocking`]). Each action occurring exactly once is
/// checked when the schedule is built ([`Schedule::from_lists`]).
pub fn check_schedule(
    schedule: &Schedule,
    durations: &Durations,
) -> Result<CheckReport, PipelineError> {
    durations.check(schedule.stages())?;
    let program = schedule.program_with_durations(durations)?;
    check_communication(schedule, &program)?;
    let dependency = simulate(schedule, durations)?;
    let blocking = simulate_blocking(schedule, &program, durations)?;
    Ok(CheckReport {
        program,
        dependency,
        blocking,
    })
}

/// Runs `schedule` with buffered sends: each stage runs its list in order, an action starting when
/// the stage is free and each input has been produced (plus `p2p_latency` when it comes from
/// another stage). Reports [`PipelineError::Deadlock`], naming each unfinished stage's next
/// action and the input it waits for, when no stage can go on.
pub fn simulate(
    schedule: &Schedule,
    durations: &Durations,
) -> Result<SimulationReport, PipelineError> {
    durations.check(schedule.stages())?;
    let timing = run_dependency_order(schedule, durations)?;
    let timeline = schedule
        .per_stage()
        .iter()
        .zip(&timing)
        .map(|(actions, times)| {
            actions
                .iter()
                .zip(times)
                .map(|(action, (start, end))| TimedStep {
                    step: ProgramStep::Compute(*action),
                    start: *start,
                    end: *end,
                })
                .collect()
        })
        .collect();
    Ok(report(schedule, durations, timeline))
}

/// The (start, end) of every action of every stage, dependency-driven.
pub(crate) fn run_dependency_order(
    schedule: &Schedule,
    durations: &Durations,
) -> Result<Vec<Vec<(f64, f64)>>, PipelineError> {
    let stages = schedule.stages();
    let per_stage = schedule.per_stage();
    let mut ends: Vec<[Option<f64>; 4]> =
        vec![[None; 4]; stages * schedule.chunks() * schedule.micro_batches()];
    let mut next = vec![0usize; stages];
    let mut free_at = vec![0.0f64; stages];
    let mut timing: Vec<Vec<(f64, f64)>> = per_stage
        .iter()
        .map(|actions| Vec::with_capacity(actions.len()))
        .collect();
    // Worklist: a stage is retried only when an input it may wait for has been produced, so
    // the run is linear in the number of actions.
    let mut queue: VecDeque<usize> = (0..stages).collect();
    let mut queued = vec![true; stages];
    while let Some(stage) = queue.pop_front() {
        queued[stage] = false;
        'actions: while let Some(action) = per_stage[stage].get(next[stage]) {
            let mut start = free_at[stage];
            for dependency in schedule
                .dependency_array(stage, *action)
                .into_iter()
                .flatten()
            {
                let slot = schedule.slot(
                    dependency.stage,
                    dependency.action.chunk,
                    dependency.action.micro_batch,
                );
                match ends[slot][dependency.action.kind.index()] {
                    Some(end) => {
                        let latency = if dependency.payload.is_some() {
                            durations.p2p_latency
                        } else {
                            0.0
                        };
                        start = start.max(end + latency);
                    }
                    None => break 'actions,
                }
            }
            let end = start + durations.of(stage, action.kind);
            let slot = schedule.slot(stage, action.chunk, action.micro_batch);
            ends[slot][action.kind.index()] = Some(end);
            timing[stage].push((start, end));
            free_at[stage] = end;
            next[stage] += 1;
            if let Some(consumer) = schedule.remote_consumer(stage, *action) {
                if !queued[consumer.stage] {
                    queued[consumer.stage] = true;
                    queue.push_back(consumer.stage);
                }
            }
        }
    }
    if (0..stages).all(|stage| next[stage] == per_stage[stage].len()) {
        return Ok(timing);
    }
    let stuck = (0..stages)
        .filter_map(|stage| {
            let action = per_stage[stage].get(next[stage])?;
            let waiting_for = schedule
                .dependency_array(stage, *action)
                .into_iter()
                .flatten()
                .find(|d| {
                    let slot = schedule.slot(d.stage, d.action.chunk, d.action.micro_batch);
                    ends[slot][d.action.kind.index()].is_none()
                })
                .map(|d| format!("{} on stage {}", d.action, d.stage))
                .unwrap_or_default();
            Some(StuckStage {
                stage,
                step: action.to_string(),
                waiting_for,
            })
        })
        .collect();
    Err(PipelineError::Deadlock {
        mode: "dependency",
        stuck,
    })
}

/// Checks a program against its schedule: one program per stage, each stage's computations are
/// its schedule list in order, every peer exists and differs from the stage, every send has
/// exactly one matching receive (and the other way round), and the transfers are exactly the
/// cross-stage inputs of the schedule.
pub fn check_communication(
    schedule: &Schedule,
    program: &[Vec<ProgramStep>],
) -> Result<(), PipelineError> {
    let stages = schedule.stages();
    if program.len() != stages {
        return Err(PipelineError::WrongStageCount {
            what: "program",
            given: program.len(),
            stages,
        });
    }
    // (from, to, payload, micro-batch, from chunk, to chunk) → (sends, receives, expected)
    type Key = (usize, usize, Payload, usize, usize, usize);
    let mut transfers: HashMap<Key, (usize, usize, usize)> = HashMap::new();
    for (stage, actions) in schedule.per_stage().iter().enumerate() {
        for action in actions {
            if let Some(consumer) = schedule.remote_consumer(stage, *action) {
                let payload = consumer.payload.unwrap_or(Payload::Activation);
                let key = (
                    stage,
                    consumer.stage,
                    payload,
                    action.micro_batch,
                    action.chunk,
                    consumer.action.chunk,
                );
                transfers.entry(key).or_default().2 += 1;
            }
        }
    }
    for (stage, steps) in program.iter().enumerate() {
        let computed = steps.iter().filter_map(|step| match step {
            ProgramStep::Compute(action) => Some(action),
            ProgramStep::Comm(_) => None,
        });
        if !computed.eq(schedule.per_stage()[stage].iter()) {
            return Err(PipelineError::ProgramDiffersFromSchedule { stage });
        }
        for step in steps {
            let ProgramStep::Comm(event) = step else {
                continue;
            };
            if event.peer >= stages || event.peer == stage {
                return Err(PipelineError::UnmatchedCommunication {
                    event: format!("stage {stage}: {event}"),
                    reason: "the peer is not another stage".to_string(),
                });
            }
            let key = match event.direction {
                Direction::Send => (
                    stage,
                    event.peer,
                    event.payload,
                    event.micro_batch,
                    event.chunk,
                    event.peer_chunk,
                ),
                Direction::Recv => (
                    event.peer,
                    stage,
                    event.payload,
                    event.micro_batch,
                    event.peer_chunk,
                    event.chunk,
                ),
            };
            let entry = transfers.entry(key).or_default();
            match event.direction {
                Direction::Send => entry.0 += 1,
                Direction::Recv => entry.1 += 1,
            }
        }
    }
    let mut problems: Vec<(Key, (usize, usize, usize))> = transfers
        .into_iter()
        .filter(|(_, (sends, recvs, expected))| (*sends, *recvs, *expected) != (1, 1, 1))
        .collect();
    problems.sort_by_key(|(key, _)| *key);
    if let Some(((from, to, payload, mb, from_chunk, to_chunk), (sends, recvs, expected))) =
        problems.first()
    {
        let event = CommEvent {
            direction: Direction::Send,
            payload: *payload,
            peer: *to,
            micro_batch: *mb,
            chunk: *from_chunk,
            peer_chunk: *to_chunk,
        };
        return Err(PipelineError::UnmatchedCommunication {
            event: format!("stage {from}: {event}"),
            reason: format!(
                "{sends} sends and {recvs} receives where the schedule's dependencies need {expected}"
            ),
        });
    }
    Ok(())
}

/// Runs a program with blocking point-to-point in program order, as the runtime does: a send and
/// its receive are a rendezvous (each blocks until the other side reaches it; both then take
/// `p2p_latency`), and a computation starts when its stage reaches it. Reports
/// [`PipelineError::Deadlock`] (every unfinished stage's blocked step and the peer it waits for)
/// or [`PipelineError::InputNotReady`] (a computation placed before one of its inputs).
pub fn simulate_blocking(
    schedule: &Schedule,
    program: &[Vec<ProgramStep>],
    durations: &Durations,
) -> Result<SimulationReport, PipelineError> {
    let stages = schedule.stages();
    durations.check(stages)?;
    check_communication(schedule, program)?;
    let mut computed = vec![[false; 4]; stages * schedule.chunks() * schedule.micro_batches()];
    let mut received = vec![[false; 2]; computed.len()];
    let mut next = vec![0usize; stages];
    let mut clock = vec![0.0f64; stages];
    let mut timeline: Vec<Vec<TimedStep>> = program
        .iter()
        .map(|steps| Vec::with_capacity(steps.len()))
        .collect();
    let payload_index = |payload: Payload| match payload {
        Payload::Activation => 0,
        Payload::Gradient => 1,
    };
    // Worklist: a stage is retried only when its peer has reached a rendezvous with it.
    let mut queue: VecDeque<usize> = (0..stages).collect();
    let mut queued = vec![true; stages];
    while let Some(stage) = queue.pop_front() {
        queued[stage] = false;
        while let Some(step) = program[stage].get(next[stage]) {
            match step {
                ProgramStep::Compute(action) => {
                    for dependency in schedule
                        .dependency_array(stage, *action)
                        .into_iter()
                        .flatten()
                    {
                        let ready = match dependency.payload {
                            None => {
                                let slot = schedule.slot(
                                    stage,
                                    dependency.action.chunk,
                                    dependency.action.micro_batch,
                                );
                                computed[slot][dependency.action.kind.index()]
                            }
                            Some(payload) => {
                                let slot = schedule.slot(stage, action.chunk, action.micro_batch);
                                received[slot][payload_index(payload)]
                            }
                        };
                        if !ready {
                            return Err(PipelineError::InputNotReady {
                                stage,
                                step: action.to_string(),
                                input: format!(
                                    "{} on stage {}",
                                    dependency.action, dependency.stage
                                ),
                            });
                        }
                    }
                    let start = clock[stage];
                    let end = start + durations.of(stage, action.kind);
                    let slot = schedule.slot(stage, action.chunk, action.micro_batch);
                    computed[slot][action.kind.index()] = true;
                    timeline[stage].push(TimedStep {
                        step: *step,
                        start,
                        end,
                    });
                    clock[stage] = end;
                }
                ProgramStep::Comm(event) => {
                    if event.direction == Direction::Send {
                        let producer = schedule.gradient_or_forward(stage, event);
                        let slot = schedule.slot(stage, producer.chunk, producer.micro_batch);
                        if !computed[slot][producer.kind.index()] {
                            return Err(PipelineError::InputNotReady {
                                stage,
                                step: event.to_string(),
                                input: format!("{producer} on stage {stage}"),
                            });
                        }
                    }
                    let peer = event.peer;
                    let peer_step = program[peer].get(next[peer]);
                    let Some(ProgramStep::Comm(peer_event)) = peer_step else {
                        break;
                    };
                    if !event.matches(stage, peer_event, peer) {
                        break;
                    }
                    let start = clock[stage].max(clock[peer]);
                    let end = start + durations.p2p_latency;
                    let (receiver, recv_event) = match event.direction {
                        Direction::Recv => (stage, event),
                        Direction::Send => (peer, peer_event),
                    };
                    let slot = schedule.slot(receiver, recv_event.chunk, recv_event.micro_batch);
                    received[slot][payload_index(recv_event.payload)] = true;
                    for (side, side_step) in
                        [(stage, *step), (peer, ProgramStep::Comm(*peer_event))]
                    {
                        timeline[side].push(TimedStep {
                            step: side_step,
                            start: clock[side],
                            end,
                        });
                        clock[side] = end;
                    }
                    next[peer] += 1;
                    if !queued[peer] {
                        queued[peer] = true;
                        queue.push_back(peer);
                    }
                }
            }
            next[stage] += 1;
        }
    }
    if (0..stages).any(|stage| next[stage] < program[stage].len()) {
        let stuck = (0..stages)
            .filter_map(|stage| {
                let step = program[stage].get(next[stage])?;
                let waiting_for = match step {
                    ProgramStep::Comm(event) => match program[event.peer].get(next[event.peer]) {
                        Some(peer_step) => format!(
                            "stage {} to reach the matching step (it is at {peer_step})",
                            event.peer
                        ),
                        None => format!("stage {}, which has finished", event.peer),
                    },
                    ProgramStep::Compute(_) => "nothing (internal error)".to_string(),
                };
                Some(StuckStage {
                    stage,
                    step: step.to_string(),
                    waiting_for,
                })
            })
            .collect();
        return Err(PipelineError::Deadlock {
            mode: "blocking",
            stuck,
        });
    }
    Ok(report(schedule, durations, timeline))
}

fn report(
    schedule: &Schedule,
    durations: &Durations,
    timeline: Vec<Vec<TimedStep>>,
) -> SimulationReport {
    let stages = schedule.stages();
    let makespan = timeline
        .iter()
        .flatten()
        .map(|step| step.end)
        .fold(0.0f64, f64::max);
    let busy: Vec<f64> = schedule
        .per_stage()
        .iter()
        .enumerate()
        .map(|(stage, actions)| actions.iter().map(|a| durations.of(stage, a.kind)).sum())
        .collect();
    let total_busy: f64 = busy.iter().sum();
    let bubble_fraction = if makespan > 0.0 {
        1.0 - total_busy / (stages as f64 * makespan)
    } else {
        0.0
    };
    let mut peak_activations = Vec::with_capacity(stages);
    let mut peak_pending_weight_gradients = Vec::with_capacity(stages);
    let mut peak_retained = Vec::with_capacity(stages);
    for actions in schedule.per_stage() {
        let peaks = peak_memory(actions);
        peak_activations.push(peaks.activations);
        peak_pending_weight_gradients.push(peaks.pending_weight_gradients);
        peak_retained.push(peaks.retained);
    }
    SimulationReport {
        makespan,
        busy,
        bubble_fraction,
        peak_activations,
        peak_pending_weight_gradients,
        peak_retained,
        timeline,
    }
}

struct Peaks {
    activations: usize,
    pending_weight_gradients: usize,
    retained: usize,
}

/// The memory peaks of one stage's list (see [`SimulationReport`]).
fn peak_memory(actions: &[Action]) -> Peaks {
    let mut peaks = Peaks {
        activations: 0,
        pending_weight_gradients: 0,
        retained: 0,
    };
    let (mut activations, mut pending) = (0usize, 0usize);
    for action in actions {
        match action.kind {
            ActionKind::Forward => activations += 1,
            ActionKind::Backward => activations = activations.saturating_sub(1),
            ActionKind::BackwardInput => {
                activations = activations.saturating_sub(1);
                pending += 1;
            }
            ActionKind::BackwardWeight => pending = pending.saturating_sub(1),
        }
        peaks.activations = peaks.activations.max(activations);
        peaks.pending_weight_gradients = peaks.pending_weight_gradients.max(pending);
        peaks.retained = peaks.retained.max(activations + pending);
    }
    peaks
}
