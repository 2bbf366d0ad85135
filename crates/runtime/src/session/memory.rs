//! The memory a session's ranks will hold training ([`parallel::memory`]): one rank's
//! ([`TrainSession::predict_memory`]) or each pipeline stage's fullest rank
//! ([`TrainSession::predict_memory_per_stage`], what `tessera plan` reports), both through one
//! [`MemoryModel`]; and a searched plan's predicted peak checked against
//! `parallel.max_device_memory` ([`TrainSession::over_memory_budget`]).

use std::collections::HashMap;

use parallel::memory::{MemoryReport, Predictor, RankClass, TrainingState};
use parallel::pipeline::{MicroBatchBuffers, Schedule};

use super::{RankFootprint, TrainSession};
use crate::error::RuntimeError;

/// What predicting a rank's memory reads of a session, worked out once for all its ranks: the
/// training program's rank-independent analysis ([`Predictor`]), the training state beside the
/// program, and for pipelined steps the micro-batches each stage's schedule holds at once.
struct MemoryModel<'a> {
    predictor: Predictor<'a>,
    state: TrainingState,
    /// Pipelined steps: the buffers a micro-batch holds, the ranks per stage, and per stage
    /// the micro-batches its schedule holds at once.
    pipelined: Option<(MicroBatchBuffers, usize, Vec<usize>)>,
}

impl MemoryModel<'_> {
    /// The memory `rank` will hold.
    fn predict(&self, rank: usize) -> MemoryReport {
        match self.held(rank) {
            None => self.predictor.predict(rank, self.state),
            Some((buffers, held)) => self
                .predictor
                .predict_pipelined(rank, self.state, buffers, held),
        }
    }

    /// Pipelined steps: the buffers a micro-batch holds and the micro-batches `rank`'s stage
    /// holds at once.
    fn held(&self, rank: usize) -> Option<(&MicroBatchBuffers, usize)> {
        let (buffers, per_stage, held) = self.pipelined.as_ref()?;
        let stage = rank / (*per_stage).max(1);
        Some((buffers, held.get(stage).copied().unwrap_or(0)))
    }
}

impl TrainSession {
    /// The [`MemoryModel`] of this session; an error only when the pipeline's schedule cannot
    /// be built (naming `parallel.pipeline`; the run would fail first).
    fn memory_model(&self) -> Result<MemoryModel<'_>, RuntimeError> {
        let state = TrainingState {
            optimizer_tensors: self.config.optimizer_config().kind.state_names().len(),
            accumulation_sharded: (self.micro_steps() > 1).then_some(self.accumulation_sharded()),
            master_weights: self.config.train().precision.has_master_weights(),
        };
        let pipelined =
            self.pipeline_schedule()?
                .map(|(schedule, per_stage): (Schedule, usize)| {
                    let held = schedule
                        .per_stage()
                        .iter()
                        .map(|actions| parallel::pipeline::micro_batches_held(actions))
                        .collect();
                    let buffers = parallel::pipeline::micro_batch_buffers(&self.train, per_stage);
                    (buffers, per_stage, held)
                });
        Ok(MemoryModel {
            predictor: Predictor::new(&self.train),
            state,
            pipelined,
        })
    }

    /// The memory `rank` will hold training this session (see [`parallel::memory`]); for
    /// pipelined steps, with as many micro-batches in flight as its stage's schedule holds.
    /// `None` only when the pipeline's schedule cannot be built (the run would fail first).
    pub fn predict_memory(&self, rank: usize) -> Option<MemoryReport> {
        Some(self.memory_model().ok()?.predict(rank))
    }

    /// [`TrainSession::predict_footprint`] of each of `ranks`, in their order, each worked out
    /// once per distinct footprint: ranks of one [`RankClass`] of the training program and of
    /// the evaluation program, holding as many micro-batches (pipelined), have the same
    /// footprint, so thousands of ranks over a few classes cost a few predictions.
    pub fn predict_footprints(
        &self,
        ranks: &[usize],
        local_backend: bool,
    ) -> Vec<Option<RankFootprint>> {
        let Ok(model) = self.memory_model() else {
            return vec![None; ranks.len()];
        };
        // The evaluation program is the training program's when the session has no other.
        let eval =
            (!std::sync::Arc::ptr_eq(&self.train, &self.eval)).then(|| Predictor::new(&self.eval));
        type Key = (Option<usize>, RankClass, Option<RankClass>);
        let mut known: HashMap<Key, Option<RankFootprint>> = HashMap::new();
        ranks
            .iter()
            .map(|&rank| {
                let key = (
                    model.held(rank).map(|(_, held)| held),
                    model.predictor.class(rank),
                    eval.as_ref().map(|eval| eval.class(rank)),
                );
                *known
                    .entry(key)
                    .or_insert_with(|| self.predict_footprint(rank, local_backend))
            })
            .collect()
    }

    /// Per pipeline stage of the training program (one when it has none), the rank whose
    /// predicted peak is the highest (the lowest such rank) and its figures, each exactly
    /// [`TrainSession::predict_memory`]'s. The analysis common to the ranks is done once, and
    /// ranks of one [`RankClass`] are walked once. An error only when the
    /// pipeline's schedule cannot be built (naming `parallel.pipeline`).
    pub fn predict_memory_per_stage(&self) -> Result<Vec<(usize, MemoryReport)>, RuntimeError> {
        if let Some(known) = self.per_stage_memory.get() {
            return Ok(known.clone());
        }
        let per_stage = self.walk_memory_per_stage()?;
        Ok(self.per_stage_memory.get_or_init(|| per_stage).clone())
    }

    /// [`TrainSession::predict_memory_per_stage`], worked out.
    fn walk_memory_per_stage(&self) -> Result<Vec<(usize, MemoryReport)>, RuntimeError> {
        let model = self.memory_model()?;
        let devices = self.devices();
        let stages = self
            .train
            .placed
            .config
            .pipeline
            .as_ref()
            .map_or(1, |p| p.stages.max(1));
        let per_stage = (devices / stages).max(1);
        let mut out: Vec<Option<(usize, MemoryReport)>> = vec![None; stages];
        // Ranks of one class (and, pipelined, as many micro-batches held) hold the same
        // memory: each is walked once.
        let mut known: HashMap<(Option<usize>, RankClass), MemoryReport> = HashMap::new();
        for rank in 0..devices {
            let key = (
                model.held(rank).map(|(_, held)| held),
                model.predictor.class(rank),
            );
            let m = *known.entry(key).or_insert_with(|| model.predict(rank));
            // A rank past the last stage (devices not a multiple of the stages, refused
            // before the program is built) counts with the last.
            let slot = &mut out[(rank / per_stage).min(stages - 1)];
            if slot
                .as_ref()
                .is_none_or(|(_, fullest)| m.peak > fullest.peak)
            {
                *slot = Some((rank, m));
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// The refusal of a searched plan whose predicted peak, `peak` bytes on `rank`, exceeds
    /// the `budget` bytes of memory per device (`parallel.max_device_memory`, or the device
    /// profile's) although the search's own estimate (`estimate` bytes) fit: the words
    /// `tessera plan` and `tessera train` both refuse it with, naming the key, the rank and
    /// the bytes.
    pub fn over_memory_budget(
        peak: usize,
        rank: usize,
        budget: u64,
        estimate: f64,
    ) -> RuntimeError {
        RuntimeError::Config {
            key: "parallel.max_device_memory".to_string(),
            reason: format!(
                "the plan the search found needs {peak} bytes ({}) on rank {rank}, the peak `tessera train --explain` predicts for it, more than the {budget} bytes ({}) of memory per device; the search's own estimate ({}) fit, but it does not count what the compiled step adds (micro-batches in flight, the backward's values, redistributions): raise parallel.max_device_memory to at least {peak} bytes, or use more devices or pipeline stages",
                human_bytes(peak as f64),
                human_bytes(budget as f64),
                human_bytes(estimate),
            ),
        }
    }

    /// A searched plan (not loaded from `parallel.load_operator_strategy_file`) whose
    /// predicted peak exceeds the `parallel.max_device_memory` the user set is refused before
    /// any rank starts ([`TrainSession::over_memory_budget`]); strategies loaded, or a run
    /// not in a search mode or without the key, are not checked.
    pub(crate) fn check_searched_budget(&self) -> Result<(), RuntimeError> {
        match self.over_searched_budget()? {
            Some((rank, peak, budget, estimate)) => Err(TrainSession::over_memory_budget(
                peak, rank, budget, estimate,
            )),
            None => Ok(()),
        }
    }

    /// In a search mode whose searched plan's predicted peak exceeds the
    /// `parallel.max_device_memory` the user set: the budget of the search's own estimate a
    /// search for a plan that fits should keep to (this plan's estimate scaled down as far as
    /// its predicted peak is over the budget, so that this plan is excluded and the estimates
    /// left are those that, off by as much, would fit); `None` when the plan fits, was not
    /// searched, or no key is set.
    pub(crate) fn tighter_search_budget(&self) -> Result<Option<u64>, RuntimeError> {
        let Some((_, peak, budget, estimate)) = self.over_searched_budget()? else {
            return Ok(None);
        };
        let tighter = (estimate * budget as f64 / peak as f64).floor();
        Ok((tighter >= 1.0 && tighter < estimate).then_some(tighter as u64))
    }

    /// The fullest rank, its predicted peak, the budget and the search's estimate, when a
    /// searched plan's predicted peak exceeds the `parallel.max_device_memory` the user set.
    fn over_searched_budget(&self) -> Result<Option<(usize, usize, u64, f64)>, RuntimeError> {
        let Some(plan) = self.searched.as_ref().filter(|p| p.searched) else {
            return Ok(None);
        };
        let Some(budget) = self.config.search().max_device_memory else {
            return Ok(None);
        };
        let fullest = self
            .predict_memory_per_stage()?
            .into_iter()
            .max_by_key(|(rank, m)| (m.peak, std::cmp::Reverse(*rank)));
        Ok(match fullest {
            Some((rank, m)) if m.peak as u64 > budget => {
                Some((rank, m.peak, budget, plan.estimate))
            }
            _ => None,
        })
    }
}

/// `bytes` with a binary unit, two decimals (`1.50 MiB`): how `tessera plan` and a plan's
/// memory refusal print memory.
pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}
