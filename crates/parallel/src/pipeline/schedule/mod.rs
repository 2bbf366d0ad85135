//! Schedules as data: one ordered list of actions per stage, the generators, the data
//! dependencies between actions, and the sends and receives those dependencies imply.
//!
//! The types and the checked constructor are here; `generators` holds GPipe, 1F1B,
//! interleaved 1F1B and zero-bubble, `dependencies` what each action needs and who consumes
//! what it produces, and `program` the sends and receives those dependencies imply, placed in
//! each stage's program.

mod dependencies;
mod generators;
mod program;

use std::fmt;

use super::config::{check_total_passes, PipelineConfig, Scheduler};
use super::error::PipelineError;

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
