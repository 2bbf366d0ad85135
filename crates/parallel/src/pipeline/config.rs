//! `[parallel.pipeline]`: the pipeline configuration and its validation.

use std::fmt;
use std::str::FromStr;

use super::error::PipelineError;

/// Upper bound on `stages`, checked before anything is allocated.
pub const MAX_STAGES: usize = 4096;
/// Upper bound on `micro_batches`, checked before anything is allocated.
pub const MAX_MICRO_BATCHES: usize = 65536;
/// Upper bound on `virtual_stages` (model chunks per stage).
pub const MAX_VIRTUAL_STAGES: usize = 64;
/// Upper bound on stages × chunks × micro-batches, the number of forward passes a schedule
/// lists (each also has a backward, so a schedule holds up to three times as many actions).
/// Keeps a schedule and its simulation within a few hundred MiB even when every single bound
/// above is at its maximum.
pub const MAX_TOTAL_PASSES: usize = 1 << 24;
/// `virtual_stages` when `interleave = true` and none is given.
pub const DEFAULT_VIRTUAL_STAGES: usize = 2;

/// The pipeline schedule family (`parallel.pipeline.scheduler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheduler {
    /// `"gpipe"`: every forward, then every backward (GPipe; MindSpore's `gpipe`).
    GPipe,
    /// `"1f1b"`: warm-up forwards, then one forward and one backward in turn (PipeDream-flush).
    OneFOneB,
    /// `"interleaved_1f1b"`: 1F1B over several model chunks per stage (Megatron's virtual
    /// pipeline); needs `interleave = true`.
    Interleaved1F1B,
    /// `"zero_bubble"`: ZB-H1 (Qi et al. 2023): 1F1B with each backward split into its
    /// input-gradient and weight-gradient halves, the weight gradients deferred into the bubble.
    ZeroBubble,
}

impl Scheduler {
    /// Every scheduler, in config-name order.
    pub const ALL: [Scheduler; 4] = [
        Scheduler::GPipe,
        Scheduler::OneFOneB,
        Scheduler::Interleaved1F1B,
        Scheduler::ZeroBubble,
    ];

    /// Parses exactly `"gpipe"`, `"1f1b"`, `"interleaved_1f1b"` or `"zero_bubble"`.
    pub fn parse(text: &str) -> Result<Scheduler, PipelineError> {
        match text {
            "gpipe" => Ok(Scheduler::GPipe),
            "1f1b" => Ok(Scheduler::OneFOneB),
            "interleaved_1f1b" => Ok(Scheduler::Interleaved1F1B),
            "zero_bubble" => Ok(Scheduler::ZeroBubble),
            _ => Err(PipelineError::UnknownScheduler {
                given: text.to_string(),
            }),
        }
    }

    /// The config spelling.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::GPipe => "gpipe",
            Scheduler::OneFOneB => "1f1b",
            Scheduler::Interleaved1F1B => "interleaved_1f1b",
            Scheduler::ZeroBubble => "zero_bubble",
        }
    }
}

impl FromStr for Scheduler {
    type Err = PipelineError;
    fn from_str(text: &str) -> Result<Scheduler, PipelineError> {
        Scheduler::parse(text)
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `[parallel.pipeline]` (MindSpore's `AutoParallel.pipeline(stages, output_broadcast,
/// interleave, scheduler)` plus `Pipeline(network, micro_size, stage_config)`).
///
/// Build it with [`PipelineConfig::new`] and the `with_*` methods, then call
/// [`PipelineConfig::validate`] with the device count; the schedule generators and the stage
/// assignment re-check the rules that do not need the device count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineConfig {
    /// P, the number of pipeline stages (`stages`).
    pub stages: usize,
    /// M, the micro-batches per step (`micro_batches`, MindSpore's `micro_size`).
    pub micro_batches: usize,
    /// The schedule family (`scheduler`).
    pub scheduler: Scheduler,
    /// Several model chunks per stage (`interleave`).
    pub interleave: bool,
    /// Model chunks per stage when `interleave` is true (`virtual_stages`); ignored otherwise.
    pub virtual_stages: usize,
    /// Broadcast the last stage's output to every stage, for inference (`output_broadcast`).
    pub output_broadcast: bool,
    /// `[parallel.pipeline.stage_config]`: cell-name prefix → stage. With `interleave`, the
    /// value is the model-chunk index `chunk · stages + stage` (0 ..  stages × virtual_stages).
    /// Empty: split evenly by parameter count.
    pub stage_config: Vec<(String, usize)>,
}

impl PipelineConfig {
    /// A configuration with the given stages, micro-batches and scheduler; `interleave` is on
    /// (with [`DEFAULT_VIRTUAL_STAGES`] chunks) exactly when the scheduler is
    /// `interleaved_1f1b`; no output broadcast; no `stage_config`.
    pub fn new(stages: usize, micro_batches: usize, scheduler: Scheduler) -> PipelineConfig {
        PipelineConfig {
            stages,
            micro_batches,
            scheduler,
            interleave: scheduler == Scheduler::Interleaved1F1B,
            virtual_stages: DEFAULT_VIRTUAL_STAGES,
            output_broadcast: false,
            stage_config: Vec::new(),
        }
    }

    /// Turns interleave on with `virtual_stages` model chunks per stage.
    pub fn with_virtual_stages(mut self, virtual_stages: usize) -> PipelineConfig {
        self.interleave = true;
        self.virtual_stages = virtual_stages;
        self
    }

    /// Sets `output_broadcast`.
    pub fn with_output_broadcast(mut self, output_broadcast: bool) -> PipelineConfig {
        self.output_broadcast = output_broadcast;
        self
    }

    /// Adds a `stage_config` entry: cells whose name starts with `prefix` (on a `.` boundary)
    /// go to `stage`.
    pub fn with_stage(mut self, prefix: impl Into<String>, stage: usize) -> PipelineConfig {
        self.stage_config.push((prefix.into(), stage));
        self
    }

    /// Model chunks per stage: `virtual_stages` with `interleave`, otherwise 1.
    pub fn chunks(&self) -> usize {
        if self.interleave {
            self.virtual_stages
        } else {
            1
        }
    }

    /// Checks every rule, the device count included:
    /// - `1 ≤ stages ≤ MAX_STAGES`, and `stages` divides `device_count` (which is not 0);
    /// - `1 ≤ micro_batches ≤ MAX_MICRO_BATCHES` (fewer micro-batches than stages is allowed
    ///   for every scheduler: the schedules handle M < P, with a larger bubble);
    /// - with `interleave`, `2 ≤ virtual_stages ≤ MAX_VIRTUAL_STAGES`, and the scheduler is
    ///   `interleaved_1f1b` or `gpipe` (1F1B and zero-bubble run one chunk per stage);
    ///   `interleaved_1f1b` needs `interleave`;
    /// - `interleaved_1f1b` needs `micro_batches` to be a multiple of `stages` (Megatron's
    ///   rule; see [`Schedule::interleaved_1f1b`](super::Schedule::interleaved_1f1b));
    /// - stages × chunks × micro-batches ≤ [`MAX_TOTAL_PASSES`];
    /// - every `stage_config` prefix is non-empty, given once, and names an existing stage.
    ///
    /// The first broken rule is returned.
    pub fn validate(&self, device_count: usize) -> Result<(), PipelineError> {
        self.validate_shape()?;
        if device_count == 0 || !device_count.is_multiple_of(self.stages) {
            return Err(PipelineError::StagesDoNotDivideDevices {
                stages: self.stages,
                devices: device_count,
            });
        }
        Ok(())
    }

    /// Every rule of [`PipelineConfig::validate`] but the device count's.
    pub fn validate_shape(&self) -> Result<(), PipelineError> {
        if self.stages == 0 {
            return Err(PipelineError::NoStages {
                stages: self.stages,
            });
        }
        if self.stages > MAX_STAGES {
            return Err(PipelineError::TooManyStages {
                stages: self.stages,
                max: MAX_STAGES,
            });
        }
        if self.micro_batches == 0 {
            return Err(PipelineError::NoMicroBatches {
                micro_batches: self.micro_batches,
            });
        }
        if self.micro_batches > MAX_MICRO_BATCHES {
            return Err(PipelineError::TooManyMicroBatches {
                micro_batches: self.micro_batches,
                max: MAX_MICRO_BATCHES,
            });
        }
        if self.interleave {
            if !(2..=MAX_VIRTUAL_STAGES).contains(&self.virtual_stages) {
                return Err(PipelineError::VirtualStagesOutOfRange {
                    virtual_stages: self.virtual_stages,
                    max: MAX_VIRTUAL_STAGES,
                });
            }
            if matches!(self.scheduler, Scheduler::OneFOneB | Scheduler::ZeroBubble) {
                return Err(PipelineError::InterleaveUnsupported {
                    scheduler: self.scheduler.name(),
                });
            }
        } else if self.scheduler == Scheduler::Interleaved1F1B {
            return Err(PipelineError::InterleavedNeedsInterleave);
        }
        if self.scheduler == Scheduler::Interleaved1F1B
            && !self.micro_batches.is_multiple_of(self.stages)
        {
            return Err(PipelineError::MicroBatchesNotMultipleOfStages {
                micro_batches: self.micro_batches,
                stages: self.stages,
            });
        }
        check_total_passes(self.stages, self.chunks(), self.micro_batches)?;
        let limit = self.stages * self.chunks();
        for (index, (prefix, stage)) in self.stage_config.iter().enumerate() {
            if prefix.is_empty() {
                return Err(PipelineError::StageConfigPrefix {
                    prefix: prefix.clone(),
                    reason: "the cell-name prefix is empty",
                });
            }
            if self.stage_config[..index].iter().any(|(p, _)| p == prefix) {
                return Err(PipelineError::StageConfigPrefix {
                    prefix: prefix.clone(),
                    reason: "the prefix is given twice",
                });
            }
            if *stage >= limit {
                return Err(PipelineError::StageConfigOutOfRange {
                    prefix: prefix.clone(),
                    stage: *stage,
                    limit,
                });
            }
        }
        Ok(())
    }
}

/// Checks stages × chunks × micro-batches against [`MAX_TOTAL_PASSES`] (and that none is 0).
pub(crate) fn check_total_passes(
    stages: usize,
    chunks: usize,
    micro_batches: usize,
) -> Result<(), PipelineError> {
    let total = stages.saturating_mul(chunks).saturating_mul(micro_batches);
    if total > MAX_TOTAL_PASSES {
        return Err(PipelineError::TooManyPasses {
            stages,
            chunks,
            micro_batches,
            total,
            max: MAX_TOTAL_PASSES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_names_round_trip_and_nothing_else_parses() {
        for scheduler in Scheduler::ALL {
            assert_eq!(Scheduler::parse(scheduler.name()), Ok(scheduler));
        }
        for bad in ["GPipe", "1F1B", "interleaved", "zb", "", "zero-bubble"] {
            let error = Scheduler::parse(bad).unwrap_err();
            assert!(
                error.to_string().contains("parallel.pipeline.scheduler"),
                "{error}"
            );
        }
    }

    #[test]
    fn new_turns_interleave_on_only_for_interleaved() {
        for scheduler in Scheduler::ALL {
            let config = PipelineConfig::new(2, 4, scheduler);
            assert_eq!(config.interleave, scheduler == Scheduler::Interleaved1F1B);
            assert_eq!(
                config.chunks(),
                if config.interleave {
                    DEFAULT_VIRTUAL_STAGES
                } else {
                    1
                }
            );
            assert_eq!(config.validate(4), Ok(()));
        }
    }
}
