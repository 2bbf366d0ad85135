//! The data dependencies between actions: what each action needs, and which action on
//! another stage consumes what it produces.

use super::{Action, ActionKind, CommEvent, Dependency, Payload, Schedule};

impl Schedule {
    /// The (stage, chunk) of model piece `piece = chunk · P + stage`.
    pub(super) fn piece_place(&self, piece: usize) -> (usize, usize) {
        (piece % self.stages, piece / self.stages)
    }

    /// The action that produces the gradient of (`micro_batch`, `chunk`) on `stage`.
    pub(super) fn gradient_producer(
        &self,
        stage: usize,
        micro_batch: usize,
        chunk: usize,
    ) -> Action {
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
}
