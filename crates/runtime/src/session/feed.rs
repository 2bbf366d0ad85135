//! Feeding a session: the batches of an epoch, one per optimizer step, and each micro-batch of
//! a step fed into an executor's inputs (this rank's rows only), read through
//! [`crate::data::Dataset`].

use exec::RankExecutor;

use super::{SessionData, TrainSession};
use crate::data::{feed_rows, BatchPlan};
use crate::error::RuntimeError;

/// The batches of one epoch, one per optimizer step (each of `train.grad_accumulation_steps`
/// micro-batches).
pub(super) enum EpochPlan {
    /// A shuffled pass over the samples, in batches of every micro-batch of a step.
    Samples(BatchPlan),
    /// `steps` batches of random windows.
    Text {
        /// Steps in the epoch.
        steps: u64,
    },
}

impl EpochPlan {
    pub(super) fn len(&self) -> u64 {
        match self {
            EpochPlan::Samples(plan) => plan.len() as u64,
            EpochPlan::Text { steps } => *steps,
        }
    }
}

/// Where an optimizer step's batch is: its epoch's plan, the epoch (from 1) and the step's index
/// in the epoch.
#[derive(Clone, Copy)]
pub(super) struct StepAt<'p> {
    /// The epoch's batches.
    pub(super) plan: &'p EpochPlan,
    /// The epoch, from 1.
    pub(super) epoch: usize,
    /// The step's batch in `plan`.
    pub(super) index: u64,
}

impl TrainSession {
    /// Micro-batches per optimizer step (`train.grad_accumulation_steps`).
    pub(super) fn micro_steps(&self) -> usize {
        self.config.train().grad_accumulation_steps.max(1)
    }

    /// Samples an optimizer step trains on: every micro-batch of `data.batch_size`.
    fn step_batch_size(&self) -> usize {
        self.config
            .data()
            .batch_size
            .saturating_mul(self.micro_steps())
    }

    /// The global step this run ends at: `train.epochs` epochs, or `train.max_steps` if fewer.
    pub(crate) fn planned_steps(&self) -> u64 {
        let train = self.config.train();
        let epochs = self.batches_per_epoch().saturating_mul(train.epochs as u64);
        train.max_steps.map_or(epochs, |m| m.min(epochs))
    }

    /// Optimizer steps per epoch.
    pub(crate) fn steps_per_epoch(&self) -> u64 {
        self.batches_per_epoch()
    }

    pub(super) fn batches_per_epoch(&self) -> u64 {
        match &self.data {
            SessionData::Samples { train, .. } => {
                (train.len() / self.step_batch_size()).max(1) as u64
            }
            SessionData::Text(text) => text.steps_per_epoch,
        }
    }

    /// The batches of `epoch`, one per optimizer step: the samples in batches of
    /// `micro_steps · batch_size`, the order a run with that batch size would have, so
    /// micro-batch `j` of a step is rows `j · batch_size ..` of that run's batch.
    pub(super) fn epoch_plan(&self, epoch: usize) -> Result<EpochPlan, RuntimeError> {
        Ok(match &self.data {
            SessionData::Samples { train, .. } => EpochPlan::Samples(BatchPlan::train(
                train.len(),
                self.step_batch_size(),
                self.config.data().shuffle,
                self.config.train().seed,
                epoch as u64,
            )?),
            SessionData::Text(text) => EpochPlan::Text {
                steps: text.steps_per_epoch,
            },
        })
    }

    /// Feeds micro-batch `micro` of the step's batch `at` into `exec`: rows
    /// `micro · batch_size .. (micro + 1) · batch_size` of the step's batch.
    pub(super) fn feed_step(
        &self,
        exec: &mut RankExecutor,
        at: StepAt<'_>,
        micro: usize,
    ) -> Result<(), RuntimeError> {
        let StepAt { plan, epoch, index } = at;
        match (&self.data, plan) {
            (SessionData::Samples { train, columns, .. }, EpochPlan::Samples(plan)) => {
                let batch = plan
                    .batch(index as usize)
                    .ok_or_else(|| RuntimeError::Mismatch {
                        what: format!("batch {index} of epoch {epoch}"),
                        expected: format!("below {}", plan.len()),
                        got: index.to_string(),
                    })?;
                let batch_size = self.config.data().batch_size;
                let rows = batch.rows(micro * batch_size, batch_size)?;
                feed_rows(exec, columns, train.as_ref(), rows)
            }
            (SessionData::Text(text), _) => {
                let seed = self.config.train().seed;
                let starts = text.train_starts(seed, epoch as u64, index, micro)?;
                text.feed(exec, &self.model, &text.corpus.train, &starts)
            }
            (SessionData::Samples { .. }, EpochPlan::Text { .. }) => Err(RuntimeError::Mismatch {
                what: "the epoch's batches".to_string(),
                expected: "batches of samples".to_string(),
                got: "text steps".to_string(),
            }),
        }
    }
}
