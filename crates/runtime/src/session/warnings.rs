//! What the compiled training program caps or skips that the configuration alone cannot tell:
//! `parallel.hsdp.shard_size` meets each parameter's replica count, which strategy files,
//! `[parallel.shard]`, the search modes, context and expert parallelism set per parameter; and
//! `train.elastic_interval` meets the run's step count, which the data sets.

use std::collections::BTreeMap;

use super::TrainSession;
use crate::config::ShardSizeCover;

impl TrainSession {
    /// What the training program does with a setting that [`crate::TrainConfig::warnings`] cannot
    /// predict from the configuration alone, one sentence per cause for the caller to print
    /// once beside those: `parallel.hsdp.shard_size` capped to a parameter's replicas, or a
    /// parameter left whole because the value does not divide its replicas (as MindSpore caps
    /// and skips), grouped by replica count, with how many parameters and an example (a cause
    /// the configuration's warnings already state is not repeated); and a
    /// `train.elastic_interval` beyond the run's last step.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = self.shard_size_warnings();
        warnings.extend(self.elastic_interval_warning());
        warnings
    }

    /// `train.elastic` whose `train.elastic_interval` is beyond the run's last step: no snapshot
    /// is ever taken, so a lost rank sends the job back to its start (or its newest periodic
    /// checkpoint) — the switch would do nothing.
    fn elastic_interval_warning(&self) -> Option<String> {
        let interval = self.config.train().elastic?;
        let run_steps = self.planned_steps();
        (interval > run_steps).then(|| {
            format!(
                "train.elastic_interval = {interval} is beyond the run's {run_steps} step(s):                  train.elastic takes no snapshot, so a lost rank restarts the job from its                  start (or its newest periodic checkpoint); set train.elastic_interval to at                  most {run_steps}"
            )
        })
    }

    /// `parallel.hsdp.shard_size`'s caps and skips (see [`TrainSession::warnings`]).
    fn shard_size_warnings(&self) -> Vec<String> {
        let Some(size) = self
            .train
            .placed
            .config
            .hsdp
            .as_ref()
            .and_then(|h| h.shard_size)
        else {
            return Vec::new();
        };
        // Cause at a replica count → (parameters, the first one's name), in program order.
        let mut groups: BTreeMap<ShardSizeCover, (usize, &str)> = BTreeMap::new();
        for p in &self.train.params {
            let Some(decision) = &p.hsdp else {
                continue;
            };
            let found = match decision.shard() {
                Some(shard) if shard.size < size => Some(ShardSizeCover::Capped(
                    shard.strategy_layout.replica_count(),
                )),
                Some(_) => None,
                None => decision.skipped_replicas().map(ShardSizeCover::Skipped),
            };
            if let Some(cause) = found {
                groups.entry(cause).or_insert((0, &p.name)).0 += 1;
            }
        }
        let said = self.config.shard_size_warning().map(|w| w.covers);
        let key = format!("parallel.hsdp.shard_size = {size}");
        groups
            .into_iter()
            .filter(|(cause, _)| said != Some(ShardSizeCover::Every) && said != Some(*cause))
            .filter_map(|(cause, (count, example))| {
                let params = match count {
                    1 => format!("1 parameter ({example})"),
                    n => format!("{n} parameters (e.g. {example})"),
                };
                Some(match cause {
                    ShardSizeCover::Every => return None,
                    ShardSizeCover::Capped(replicas) => format!(
                        "{key} is capped to {replicas} for {params}: the compiled layout holds \
                         each on {replicas} replicas, and a parameter is sharded over at most \
                         its replicas (as MindSpore caps optimizer_weight_shard_size)"
                    ),
                    ShardSizeCover::Skipped(replicas) => format!(
                        "{key} does not divide the {replicas} replicas the compiled layout gives \
                         {params}: left whole, not sharded (as MindSpore skips a parameter whose \
                         replicas are not a multiple of the shard size)"
                    ),
                })
            })
            .collect()
    }
}
