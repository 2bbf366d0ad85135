//! Schedules as data: one ordered list of actions per stage, the generators, the data
//! dependencies between actions, and the sends and receives those dependencies imply.

use std::cmp::Ordering;
use std::fmt;

use super::config::{check_total_passes, PipelineConfig, Scheduler};
use super::error::PipelineError;
use super::simulate::{run_dependency_order, Durations};

/// What an action computes for one micro-batch on one model chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ActionKind {
    /// The forward pass.
    Forward,
    /// The full backward pass: input gradient and weight gradient together.
    Backward,
    /// The input-gradient half of the backward (zero-bubble's B); sends the gradient upstream.
    BackwardInput,
    /// The weight-gradient half of the backward (zero-bubble's W); sends nothing.
    BackwardWeight,
}

impl ActionKind {
    /// The short name used in listings: `F`, `B`, `Bi`, `W`.
    pub fn short_name(self) -> &'static str {
        match self {
            ActionKind::Forward => "F",
            ActionKind::Backward => "B",
            ActionKind::BackwardInput => "Bi",
            ActionKind::BackwardWeight => "W",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            ActionKind::Forward => 0,
            ActionKind::Backward => 1,
            ActionKind::BackwardInput => 2,
            ActionKind::BackwardWeight => 3,
        }
    }

    /// True for the kinds that produce the gradient sent upstream (full or input backward).
    pub fn produces_input_gradient(self) -> bool {
        matches!(self, ActionKind::Backward | ActionKind::BackwardInput)
    }
}

/// One entry of a stage's list: `kind` of micro-batch `micro_batch` on the stage's model chunk
/// `chunk` (0 without interleave).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Action {
    /// What is computed.
    pub kind: ActionKind,
    /// The micro-batch, `0 .. micro_batches`.
    pub micro_batch: usize,
    /// The stage's model chunk, `0 .. chunks`.
    pub chunk: usize,
}

impl Action {
    /// An action.
    pub fn new(kind: ActionKind, micro_batch: usize, chunk: usize) -> Action {
        Action {
            kind,
            micro_batch,
            chunk,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(mb {}, chunk {})",
            self.kind.short_name(),
            self.micro_batch,
            self.chunk
        )
    }
}

/// What crosses between stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Payload {
    /// A forward activation, sent downstream.
    Activation,
    /// An input gradient, sent upstream.
    Gradient,
}

impl Payload {
    fn name(self) -> &'static str {
        match self {
            Payload::Activation => "activation",
            Payload::Gradient => "gradient",
        }
    }
}

/// An input an action needs: the action producing it, and what crosses stages if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dependency {
    /// The stage running the producing action.
    pub stage: usize,
    /// The producing action.
    pub action: Action,
    /// `Some` when the producer runs on another stage: what is sent. `None` for a local input
    /// (the action's own forward, or the neighbouring chunk on the same stage when P = 1).
    pub payload: Option<Payload>,
}

/// Send or receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// This stage sends to `peer`.
    Send,
    /// This stage receives from `peer`.
    Recv,
}

/// One point-to-point transfer as one side sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommEvent {
    /// Send or receive.
    pub direction: Direction,
    /// Activation (downstream) or gradient (upstream).
    pub payload: Payload,
    /// The other stage.
    pub peer: usize,
    /// The micro-batch.
    pub micro_batch: usize,
    /// The model chunk on this stage that produces (send) or consumes (receive) it.
    pub chunk: usize,
    /// The model chunk on the peer stage.
    pub peer_chunk: usize,
}

impl CommEvent {
    /// True when `other`, on stage `other_stage`, is the other side of this event on
    /// `this_stage`.
    pub fn matches(&self, this_stage: usize, other: &CommEvent, other_stage: usize) -> bool {
        self.peer == other_stage
            && other.peer == this_stage
            && self.direction != other.direction
            && self.payload == other.payload
            && self.micro_batch == other.micro_batch
            && self.chunk == other.peer_chunk
            && self.peer_chunk == other.chunk
    }
}

impl fmt::Display for CommEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (verb, preposition) = match self.direction {
            Direction::Send => ("send", "to"),
            Direction::Recv => ("recv", "from"),
        };
        write!(
            f,
            "{verb} {} of mb {} (chunk {}) {preposition} stage {} (chunk {})",
            self.payload.name(),
            self.micro_batch,
            self.chunk,
            self.peer,
            self.peer_chunk
        )
    }
}

/// One step of a stage's program: compute an action, or one blocking send or receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProgramStep {
    /// Run an action.
    Compute(Action),
    /// A blocking point-to-point send or receive.
    Comm(CommEvent),
}

impl fmt::Display for ProgramStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramStep::Compute(action) => action.fmt(f),
            ProgramStep::Comm(event) => event.fmt(f),
        }
    }
}

/// Where [`Schedule::program`] places the sends and receives among the actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommOrder {
    /// Every stage's steps are its projection of one global order, taken from a
    /// dependency-driven simulation (unit durations, or those given to
    /// [`Schedule::program_with_durations`]); each transfer sits at a moment between its
    /// producer's end and its consumer's start, where possible one at which neither stage is
    /// mid-action. A rendezvous send or receive then never waits for a peer that waits on
    /// something later: deadlock-free under blocking point-to-point. What the runtime should
    /// use. Rendezvous still costs time where both neighbours are busy throughout (interleaved
    /// 1F1B at P = 2); the blocking simulation measures it.
    Linearized,
    /// Each send right after the action producing it, each receive right before the action
    /// consuming it. Correct only with buffered (non-blocking) sends: under rendezvous
    /// semantics 1F1B deadlocks (both neighbours send before they receive), which the blocking
    /// simulator reports.
    AtUse,
}

/// A pipeline schedule: for every stage the ordered list of actions it runs in one step.
///
/// The model is cut into `stages × chunks` pieces; piece `g = chunk · stages + stage`
/// (Megatron's interleaved assignment). Forward of piece g needs forward of piece g − 1; the
/// input-gradient producing backward (full or input half) of piece g needs that of piece g + 1 and
/// its own forward; the weight half needs the input half of the same piece. Every
/// (micro-batch, chunk) of a stage has one forward and either one full backward or one
/// input-gradient and one weight-gradient backward; [`Schedule::from_lists`] checks this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    stages: usize,
    micro_batches: usize,
    chunks: usize,
    per_stage: Vec<Vec<Action>>,
    /// For each (stage, chunk, micro-batch) at `index()`: true when its backward is split.
    split_backward: Vec<bool>,
}

impl Schedule {
    /// The schedule `config` asks for ([`PipelineConfig::validate_shape`] first).
    pub fn generate(config: &PipelineConfig) -> Result<Schedule, PipelineError> {
        config.validate_shape()?;
        let (stages, micro_batches) = (config.stages, config.micro_batches);
        match config.scheduler {
            Scheduler::GPipe => Schedule::gpipe(stages, micro_batches, config.chunks()),
            Scheduler::OneFOneB => Schedule::one_f_one_b(stages, micro_batches),
            Scheduler::Interleaved1F1B => {
                Schedule::interleaved_1f1b(stages, micro_batches, config.chunks())
            }
            Scheduler::ZeroBubble => Schedule::zero_bubble_h1(stages, micro_batches),
        }
    }

    /// A schedule from explicit lists, checked: `per_stage.len() == stages`, every micro-batch
    /// and chunk in range, and every required action exactly once per stage.
    pub fn from_lists(
        stages: usize,
        micro_batches: usize,
        chunks: usize,
        per_stage: Vec<Vec<Action>>,
    ) -> Result<Schedule, PipelineError> {
        check_shape(stages, micro_batches, chunks)?;
        if per_stage.len() != stages {
            return Err(PipelineError::WrongStageCount {
                what: "schedule",
                given: per_stage.len(),
                stages,
            });
        }
        let per_piece = chunks * micro_batches;
        let mut counts = vec![[0usize; 4]; stages * per_piece];
        for (stage, actions) in per_stage.iter().enumerate() {
            for action in actions {
                if action.micro_batch >= micro_batches || action.chunk >= chunks {
                    return Err(PipelineError::ActionOutOfRange {
                        stage,
                        action: action.to_string(),
                        reason: format!(
                            "the schedule has {micro_batches} micro-batches and {chunks} chunks"
                        ),
                    });
                }
                let slot = stage * per_piece + action.chunk * micro_batches + action.micro_batch;
                counts[slot][action.kind.index()] += 1;
            }
        }
        let mut split_backward = vec![false; stages * per_piece];
        for (slot, count) in counts.iter().enumerate() {
            let stage = slot / per_piece;
            let chunk = (slot % per_piece) / micro_batches;
            let micro_batch = slot % micro_batches;
            let describe = |kind| Action::new(kind, micro_batch, chunk).to_string();
            let bad = |kind: ActionKind, expected| PipelineError::ActionCount {
                stage,
                action: describe(kind),
                count: count[kind.index()],
                expected,
            };
            if count[0] != 1 {
                return Err(bad(ActionKind::Forward, 1));
            }
            let full = count[ActionKind::Backward.index()];
            let input = count[ActionKind::BackwardInput.index()];
            let weight = count[ActionKind::BackwardWeight.index()];
            match (full, input, weight) {
                (1, 0, 0) => {}
                (0, 1, 1) => split_backward[slot] = true,
                (0, 0, 0) => return Err(bad(ActionKind::Backward, 1)),
                (0, _, _) if input != 1 => return Err(bad(ActionKind::BackwardInput, 1)),
                (0, _, _) => return Err(bad(ActionKind::BackwardWeight, 1)),
                (1, _, _) => {
                    let kind = if input != 0 {
                        ActionKind::BackwardInput
                    } else {
                        ActionKind::BackwardWeight
                    };
                    return Err(bad(kind, 0));
                }
                _ => return Err(bad(ActionKind::Backward, 1)),
            }
        }
        Ok(Schedule {
            stages,
            micro_batches,
            chunks,
            per_stage,
            split_backward,
        })
    }

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
    /// [`PipelineConfig::validate`]). With a partial last group this warm-up can deadlock: at
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

    /// P.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// M.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Model chunks per stage.
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Every stage's list, in execution order.
    pub fn per_stage(&self) -> &[Vec<Action>] {
        &self.per_stage
    }

    /// True when the backward of (`micro_batch`, `chunk`) on `stage` is split into input and
    /// weight halves. Out-of-range arguments give false.
    pub fn is_backward_split(&self, stage: usize, micro_batch: usize, chunk: usize) -> bool {
        if stage >= self.stages || micro_batch >= self.micro_batches || chunk >= self.chunks {
            return false;
        }
        self.split_backward[self.slot(stage, chunk, micro_batch)]
    }

    pub(crate) fn slot(&self, stage: usize, chunk: usize, micro_batch: usize) -> usize {
        (stage * self.chunks + chunk) * self.micro_batches + micro_batch
    }

    /// The (stage, chunk) of model piece `piece = chunk · P + stage`.
    fn piece_place(&self, piece: usize) -> (usize, usize) {
        (piece % self.stages, piece / self.stages)
    }

    /// The action that produces the gradient of (`micro_batch`, `chunk`) on `stage`.
    fn gradient_producer(&self, stage: usize, micro_batch: usize, chunk: usize) -> Action {
        let kind = if self.split_backward[self.slot(stage, chunk, micro_batch)] {
            ActionKind::BackwardInput
        } else {
            ActionKind::Backward
        };
        Action::new(kind, micro_batch, chunk)
    }

    /// The inputs `action` on `stage` needs (at most two; none for the first stage's forward of
    /// chunk 0), or `None` if the stage, micro-batch or chunk is outside the schedule.
    pub fn dependencies(&self, stage: usize, action: Action) -> Option<Vec<Dependency>> {
        if stage >= self.stages
            || action.micro_batch >= self.micro_batches
            || action.chunk >= self.chunks
        {
            return None;
        }
        Some(
            self.dependency_array(stage, action)
                .into_iter()
                .flatten()
                .collect(),
        )
    }

    pub(crate) fn dependency_array(&self, stage: usize, action: Action) -> [Option<Dependency>; 2] {
        let piece = action.chunk * self.stages + stage;
        let pieces = self.stages * self.chunks;
        let mb = action.micro_batch;
        let local = |action: Action| Dependency {
            stage,
            action,
            payload: None,
        };
        let remote = |piece: usize, action_of: &dyn Fn(usize, usize) -> Action, payload| {
            let (other_stage, other_chunk) = self.piece_place(piece);
            Dependency {
                stage: other_stage,
                action: action_of(other_stage, other_chunk),
                payload: (other_stage != stage).then_some(payload),
            }
        };
        match action.kind {
            ActionKind::Forward => {
                let previous = (piece > 0).then(|| {
                    remote(
                        piece - 1,
                        &|_, chunk| Action::new(ActionKind::Forward, mb, chunk),
                        Payload::Activation,
                    )
                });
                [previous, None]
            }
            ActionKind::Backward | ActionKind::BackwardInput => {
                let own_forward = local(Action::new(ActionKind::Forward, mb, action.chunk));
                let next = (piece + 1 < pieces).then(|| {
                    remote(
                        piece + 1,
                        &|other_stage, chunk| self.gradient_producer(other_stage, mb, chunk),
                        Payload::Gradient,
                    )
                });
                [Some(own_forward), next]
            }
            ActionKind::BackwardWeight => [
                Some(local(Action::new(
                    ActionKind::BackwardInput,
                    mb,
                    action.chunk,
                ))),
                None,
            ],
        }
    }

    /// The action on `stage` whose output the send `event` carries.
    pub(crate) fn gradient_or_forward(&self, stage: usize, event: &CommEvent) -> Action {
        match event.payload {
            Payload::Activation => Action::new(ActionKind::Forward, event.micro_batch, event.chunk),
            Payload::Gradient => self.gradient_producer(stage, event.micro_batch, event.chunk),
        }
    }

    /// The consumer on another stage of what `action` on `stage` produces, if any.
    pub(crate) fn remote_consumer(&self, stage: usize, action: Action) -> Option<Dependency> {
        let piece = action.chunk * self.stages + stage;
        let pieces = self.stages * self.chunks;
        let mb = action.micro_batch;
        let (other_piece, payload) = match action.kind {
            ActionKind::Forward if piece + 1 < pieces => (piece + 1, Payload::Activation),
            ActionKind::Backward | ActionKind::BackwardInput if piece > 0 => {
                (piece - 1, Payload::Gradient)
            }
            _ => return None,
        };
        let (other_stage, other_chunk) = self.piece_place(other_piece);
        if other_stage == stage {
            return None;
        }
        let consumer = match payload {
            Payload::Activation => Action::new(ActionKind::Forward, mb, other_chunk),
            Payload::Gradient => self.gradient_producer(other_stage, mb, other_chunk),
        };
        Some(Dependency {
            stage: other_stage,
            action: consumer,
            payload: Some(payload),
        })
    }

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

    fn program_at_use(&self) -> Vec<Vec<ProgramStep>> {
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

    fn program_linearized(
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

    /// A text listing: one line per stage, its actions in order.
    pub fn listing(&self) -> String {
        let mut text = String::new();
        for (stage, actions) in self.per_stage.iter().enumerate() {
            let line: Vec<String> = actions.iter().map(ToString::to_string).collect();
            text.push_str(&format!("stage {stage}: {}\n", line.join(" ")));
        }
        text
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

fn check_shape(stages: usize, micro_batches: usize, chunks: usize) -> Result<(), PipelineError> {
    if stages == 0 {
        return Err(PipelineError::NoStages { stages });
    }
    if micro_batches == 0 {
        return Err(PipelineError::NoMicroBatches { micro_batches });
    }
    if chunks == 0 {
        return Err(PipelineError::VirtualStagesOutOfRange {
            virtual_stages: chunks,
            max: super::config::MAX_VIRTUAL_STAGES,
        });
    }
    check_total_passes(stages, chunks, micro_batches)
}
