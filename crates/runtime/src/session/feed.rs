//! Feeding a session: the batches of an epoch, one per optimizer step, and each micro-batch of
//! a step fed into an executor's inputs (this rank's rows only).

use exec::RankExecutor;

use super::{Session, TrainData};
use crate::data::{BatchPlan, IdxDataset};
use crate::error::RuntimeError;

/// The batches of one epoch, one per optimizer step (each of `train.grad_accumulation_steps`
/// micro-batches).
pub(super) enum EpochPlan {
    /// A shuffled pass over the images, in batches of every micro-batch of a step.
    Images(BatchPlan),
    /// `steps` batches of random windows.
    Text {
        /// Steps in the epoch.
        steps: u64,
    },
}

impl EpochPlan {
    pub(super) fn len(&self) -> u64 {
        match self {
            EpochPlan::Images(plan) => plan.len() as u64,
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

impl Session {
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
            TrainData::Images { train, .. } => (train.len() / self.step_batch_size()).max(1) as u64,
            TrainData::Text(text) => text.steps_per_epoch,
        }
    }

    /// The batches of `epoch`, one per optimizer step: the images in batches of
    /// `micro_steps · batch_size`, the order a run with that batch size would have, so
    /// micro-batch `j` of a step is rows `j · batch_size ..` of that run's batch.
    pub(super) fn epoch_plan(&self, epoch: usize) -> Result<EpochPlan, RuntimeError> {
        Ok(match &self.data {
            TrainData::Images { train, .. } => EpochPlan::Images(BatchPlan::train(
                train.len(),
                self.step_batch_size(),
                self.config.data().shuffle,
                self.config.train().seed,
                epoch as u64,
            )?),
            TrainData::Text(text) => EpochPlan::Text {
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
            (TrainData::Images { train, .. }, EpochPlan::Images(plan)) => {
                let batch = plan
                    .batch(index as usize)
                    .ok_or_else(|| RuntimeError::Mismatch {
                        what: format!("batch {index} of epoch {epoch}"),
                        expected: format!("below {}", plan.len()),
                        got: index.to_string(),
                    })?;
                let batch_size = self.config.data().batch_size;
                let rows = batch.rows(micro * batch_size, batch_size)?;
                let micro_batch = crate::data::Batch {
                    index: batch.index,
                    indices: rows,
                    n_real: rows.len(),
                };
                self.feed(exec, train, &micro_batch)
            }
            (TrainData::Text(text), _) => {
                let seed = self.config.train().seed;
                let starts = text.train_starts(seed, epoch as u64, index, micro)?;
                text.feed(exec, &self.model, &text.corpus.train, &starts)
            }
            (TrainData::Images { .. }, EpochPlan::Text { .. }) => Err(RuntimeError::Mismatch {
                what: "the epoch's batches".to_string(),
                expected: "image batches".to_string(),
                got: "text steps".to_string(),
            }),
        }
    }

    /// Feeds this rank's block of `batch` of `data` into `exec`'s inputs.
    pub(super) fn feed(
        &self,
        exec: &mut RankExecutor,
        data: &IdxDataset,
        batch: &crate::data::Batch<'_>,
    ) -> Result<(), RuntimeError> {
        let program = exec.program().clone();
        for (i, input) in program.inputs.iter().enumerate() {
            if !exec.holds(&input.layout) {
                continue;
            }
            let region = exec.box_of(&input.layout)?;
            let (start, len) = match (region.offset.first(), region.shape.first()) {
                (Some(&s), Some(&l)) => (s, l),
                _ => (0, batch.indices.len()),
            };
            let rows = batch.rows(start, len)?;
            let block = if input.value == self.model.labels {
                data.read_labels(rows)?
            } else {
                data.read_images(rows)?
            };
            exec.set_input_rows(i, block)?;
        }
        Ok(())
    }
}
