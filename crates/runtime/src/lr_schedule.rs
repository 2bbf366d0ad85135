//! Learning-rate schedules (`[train] lr_schedule`): MindSpore's dynamic-LR functions and
//! MindFormers' warm-up + cosine, as pure functions of the global step.
//!
//! # One learning rate per step, the same everywhere
//! [`LrSchedule::learning_rate`] maps the global step `i` (0 for the run's first step, counted
//! across epochs and resumes) to the learning rate of that step's update. It reads nothing else,
//! so every rank computes the same value, and a run resumed at step `i` continues the schedule
//! exactly where the stopped run left it. The rate applies to every optimizer rule
//! ([`crate::Optimizer::set_learning_rate`]); Adam's bias correction multiplies it as before.
//!
//! # The formulas
//! `η` is `train.learning_rate`, `e = floor(i / step_per_epoch)` the epoch of step `i`
//! (MindSpore's `current_epoch`; `step_per_epoch` defaults to 1, so epochs are steps).
//!
//! | `lr_schedule` | MindSpore / MindFormers | learning rate of step `i` |
//! |---|---|---|
//! | `constant` | a float `learning_rate` | `η` |
//! | `warmup_lr` | `nn.warmup_lr(η, total, step_per_epoch, warmup_epoch)` | `η · min(e, warmup_epoch) / warmup_epoch` |
//! | `cosine_decay_lr` | `nn.cosine_decay_lr(min_lr, η, total, step_per_epoch, decay_epoch)` | `min_lr + ½(η − min_lr)(1 + cos(π · min(e, decay_epoch) / decay_epoch))` |
//! | `polynomial_decay_lr` | `nn.polynomial_decay_lr(η, min_lr, total, step_per_epoch, decay_epoch, power, update_decay_epoch)` | `(η − min_lr)(1 − t/d)^power + min_lr`, with `t = min(e, decay_epoch)`, `d = decay_epoch`; with `update_decay_epoch`, `t = e` and `d = decay_epoch · max(ceil(e / decay_epoch), 1)` |
//! | `exponential_decay_lr` | `nn.exponential_decay_lr(η, decay_rate, total, step_per_epoch, decay_epoch, is_stair)` | `η · decay_rate^(e / decay_epoch)`, with `is_stair` `η · decay_rate^floor(e / decay_epoch)` |
//! | `piecewise_constant_lr` | `nn.piecewise_constant_lr(milestone, learning_rates)` | `learning_rates[t]` for `milestone[t−1] ≤ i < milestone[t]` (`milestone[−1] = 0`) |
//! | `cosine` | MindFormers' `CosineWithWarmUpLR(η, warmup_steps, total_steps = decay_steps, num_cycles, lr_end = min_lr, warmup_lr_init)` | `i ≥ D`: `min_lr`; `i < W`: `warmup_lr_init + (η − warmup_lr_init) · i / W`; else `min_lr + (η − min_lr) · max(0, ½(1 + cos(2π · num_cycles · (i − W) / max(1, D − W))))` |
//!
//! The MindSpore formulas are those of `mindspore/nn/dynamic_lr.py` (MindSpore 2.x), the
//! MindFormers one that of `mindformers/core/lr/lr_schedule.py`; `W` is `warmup_steps` and `D`
//! is `decay_steps` (default: the run's total steps, MindFormers' `total_steps`).
//!
//! # Warm-up before any schedule
//! `warmup_steps = W > 0` puts MindFormers' linear warm-up in front of any schedule but `cosine`
//! (which has it built in) and `warmup_lr` (which is one): steps `i < W` take
//! `warmup_lr_init + (η − warmup_lr_init) · i / W` (MindFormers' `ConstantWarmUpLR` with
//! `constant`), and step `i ≥ W` takes the schedule's rate at step `i − W` — the list a
//! MindSpore user builds as `warmup + decay`. `W = 0` is no warm-up.
//!
//! MindSpore's functions return a list of `total_step` rates; past its end MindSpore has no
//! rate. Tessera's rules are defined for every step: the decays hold their last value (each
//! clamps its epoch at `decay_epoch`, except `exponential_decay_lr`, which keeps decaying, and
//! `polynomial_decay_lr` with `update_decay_epoch`, which restarts as MindSpore's does); a run
//! longer than `piecewise_constant_lr`'s last milestone is refused
//! ([`LrSchedule::check_run_steps`]).

use crate::error::RuntimeError;

/// The decay rule of a schedule and its own parameters (see the module docs for each formula).
#[derive(Debug, Clone, PartialEq)]
pub enum LrDecay {
    /// `constant`: `train.learning_rate` at every step.
    Constant,
    /// `warmup_lr` (MindSpore's `nn.warmup_lr`).
    WarmupLr {
        /// Epochs of warm-up (≥ 1).
        warmup_epoch: u64,
    },
    /// `cosine_decay_lr` (MindSpore's `nn.cosine_decay_lr`).
    CosineDecayLr {
        /// The final rate (`train.min_lr`, ≥ 0 and < `learning_rate`).
        min_lr: f64,
        /// Epochs of decay (≥ 1).
        decay_epoch: u64,
    },
    /// `polynomial_decay_lr` (MindSpore's `nn.polynomial_decay_lr`).
    PolynomialDecayLr {
        /// The final rate (`train.min_lr`, MindSpore's `end_learning_rate`).
        end_learning_rate: f64,
        /// Epochs of decay (≥ 1).
        decay_epoch: u64,
        /// The polynomial's power (> 0).
        power: f64,
        /// Restart the decay every `decay_epoch` epochs over a longer period.
        update_decay_epoch: bool,
    },
    /// `exponential_decay_lr` (MindSpore's `nn.exponential_decay_lr`).
    ExponentialDecayLr {
        /// The factor per `decay_epoch` epochs (> 0).
        decay_rate: f64,
        /// Epochs per factor (≥ 1).
        decay_epoch: u64,
        /// Decay in whole steps of `decay_epoch` epochs.
        is_stair: bool,
    },
    /// `piecewise_constant_lr` (MindSpore's `nn.piecewise_constant_lr`).
    PiecewiseConstantLr {
        /// Strictly increasing steps, each ≥ 1: rate `t` holds below `milestone[t]`.
        milestone: Vec<u64>,
        /// One rate per milestone (finite, ≥ 0).
        learning_rates: Vec<f64>,
    },
    /// `cosine` (MindFormers' `CosineWithWarmUpLR`).
    CosineWithWarmUp {
        /// The final rate (`train.min_lr`, MindFormers' `lr_end`).
        lr_end: f64,
        /// The step the cosine reaches `lr_end` at (`None`: the run's total steps).
        decay_steps: Option<u64>,
        /// Cosine waves over the decay (0.5: one half-wave from the peak down to `lr_end`).
        num_cycles: f64,
    },
}

impl LrDecay {
    /// The `lr_schedule` spelling.
    pub fn name(&self) -> &'static str {
        match self {
            LrDecay::Constant => "constant",
            LrDecay::WarmupLr { .. } => "warmup_lr",
            LrDecay::CosineDecayLr { .. } => "cosine_decay_lr",
            LrDecay::PolynomialDecayLr { .. } => "polynomial_decay_lr",
            LrDecay::ExponentialDecayLr { .. } => "exponential_decay_lr",
            LrDecay::PiecewiseConstantLr { .. } => "piecewise_constant_lr",
            LrDecay::CosineWithWarmUp { .. } => "cosine",
        }
    }
}

/// Every `lr_schedule` spelling.
pub const LR_SCHEDULE_NAMES: &[&str] = &[
    "constant",
    "warmup_lr",
    "cosine_decay_lr",
    "polynomial_decay_lr",
    "exponential_decay_lr",
    "piecewise_constant_lr",
    "cosine",
];

/// A learning-rate schedule: the peak rate, an optional linear warm-up and a decay rule.
#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    /// `train.learning_rate`: the peak (MindSpore's `learning_rate` / `max_lr`).
    pub learning_rate: f64,
    /// `train.warmup_steps`: steps of linear warm-up (0: none).
    pub warmup_steps: u64,
    /// `train.warmup_lr_init`: the rate of step 0 of the warm-up (MindFormers' `warmup_lr_init`).
    pub warmup_lr_init: f64,
    /// `train.step_per_epoch`: steps per MindSpore epoch in the `*_lr` formulas (≥ 1).
    pub step_per_epoch: u64,
    /// The decay rule.
    pub decay: LrDecay,
}

/// A `Config` error on key `train.<key>`.
fn bad(key: &str, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Config {
        key: format!("train.{key}"),
        reason: reason.into(),
    }
}

pub(crate) fn finite_at_least_zero(key: &str, value: f64) -> Result<(), RuntimeError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(bad(key, format!("{value} is out of range: it must be ≥ 0")))
    }
}

pub(crate) fn at_least_one(key: &str, value: u64) -> Result<(), RuntimeError> {
    if value >= 1 {
        Ok(())
    } else {
        Err(bad(key, "0 is out of range: it must be ≥ 1"))
    }
}

/// `train.<key>`: a finite number > 0.
pub(crate) fn finite_above_zero(key: &str, value: f64) -> Result<(), RuntimeError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(bad(
            key,
            format!("{value} is out of range: it must be finite and > 0"),
        ))
    }
}

/// `train.warmup_lr_init` against the peak `learning_rate`: in [0, η].
pub(crate) fn check_warmup_lr_init(init: f64, learning_rate: f64) -> Result<(), RuntimeError> {
    finite_at_least_zero("warmup_lr_init", init)?;
    if init > learning_rate {
        return Err(bad(
            "warmup_lr_init",
            format!("{init} is out of range: it must be ≤ train.learning_rate = {learning_rate}"),
        ));
    }
    Ok(())
}

/// `train.milestone`: increasing, each ≥ 1.
pub(crate) fn check_milestones(milestone: &[u64]) -> Result<(), RuntimeError> {
    let mut last = 0;
    for (t, &m) in milestone.iter().enumerate() {
        if m <= last {
            return Err(bad(
                "milestone",
                format!("entry {t} ({m}) must be ≥ 1 and above the one before ({last})"),
            ));
        }
        last = m;
    }
    Ok(())
}

/// `min_lr` against the peak: `≤ η`, or `< η` when `strict` (MindSpore's `cosine_decay_lr`).
pub(crate) fn check_min_lr(
    min_lr: f64,
    learning_rate: f64,
    strict: bool,
) -> Result<(), RuntimeError> {
    finite_at_least_zero("min_lr", min_lr)?;
    let above = if strict {
        min_lr >= learning_rate
    } else {
        min_lr > learning_rate
    };
    if above {
        let rule = if strict { "<" } else { "≤" };
        return Err(bad(
            "min_lr",
            format!(
                "{min_lr} is out of range: it must be {rule} train.learning_rate = {learning_rate}"
            ),
        ));
    }
    Ok(())
}

impl LrSchedule {
    /// A constant rate `learning_rate` (no warm-up, no decay).
    pub fn constant(learning_rate: f64) -> LrSchedule {
        LrSchedule {
            learning_rate,
            warmup_steps: 0,
            warmup_lr_init: 0.0,
            step_per_epoch: 1,
            decay: LrDecay::Constant,
        }
    }

    /// Checks every parameter against MindSpore's and MindFormers' ranges; errors name the
    /// `train.*` key and the rule broken.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let lr = self.learning_rate;
        if !(lr.is_finite() && lr > 0.0) {
            return Err(bad(
                "learning_rate",
                format!("{lr} is out of range: it must be finite and > 0"),
            ));
        }
        check_warmup_lr_init(self.warmup_lr_init, lr)?;
        at_least_one("step_per_epoch", self.step_per_epoch)?;
        match &self.decay {
            LrDecay::Constant => Ok(()),
            LrDecay::WarmupLr { warmup_epoch } => {
                if self.warmup_steps > 0 {
                    return Err(bad(
                        "warmup_steps",
                        "has no meaning with lr_schedule = \"warmup_lr\", which is itself a warm-up (use its warmup_epoch)",
                    ));
                }
                at_least_one("warmup_epoch", *warmup_epoch)
            }
            LrDecay::CosineDecayLr {
                min_lr,
                decay_epoch,
            } => {
                check_min_lr(*min_lr, lr, true)?;
                at_least_one("decay_epoch", *decay_epoch)
            }
            LrDecay::PolynomialDecayLr {
                end_learning_rate,
                decay_epoch,
                power,
                ..
            } => {
                check_min_lr(*end_learning_rate, lr, false)?;
                at_least_one("decay_epoch", *decay_epoch)?;
                finite_above_zero("power", *power)
            }
            LrDecay::ExponentialDecayLr {
                decay_rate,
                decay_epoch,
                ..
            } => {
                finite_above_zero("decay_rate", *decay_rate)?;
                at_least_one("decay_epoch", *decay_epoch)
            }
            LrDecay::PiecewiseConstantLr {
                milestone,
                learning_rates,
            } => {
                if milestone.is_empty() || milestone.len() != learning_rates.len() {
                    return Err(bad(
                        "milestone",
                        format!(
                            "has {} entries and train.learning_rates has {}: they must be equally long and not empty",
                            milestone.len(),
                            learning_rates.len()
                        ),
                    ));
                }
                check_milestones(milestone)?;
                learning_rates
                    .iter()
                    .try_for_each(|&r| finite_at_least_zero("learning_rates", r))
            }
            LrDecay::CosineWithWarmUp {
                lr_end,
                decay_steps,
                num_cycles,
            } => {
                check_min_lr(*lr_end, lr, false)?;
                if let Some(d) = decay_steps {
                    at_least_one("decay_steps", *d)?;
                }
                finite_above_zero("num_cycles", *num_cycles)
            }
        }
    }

    /// Checks the schedule against a run of `run_steps` optimizer steps: `cosine`'s warm-up
    /// must end before an explicit `decay_steps` does, and `piecewise_constant_lr`'s milestones must cover the
    /// run (MindSpore has no rate past the last one).
    pub fn check_run_steps(&self, run_steps: u64) -> Result<(), RuntimeError> {
        match &self.decay {
            // An explicit `decay_steps` must leave room after the warm-up. Without one the decay
            // ends with the run, and a run shorter than the warm-up (a smoke test of a few steps)
            // is all warm-up.
            LrDecay::CosineWithWarmUp {
                decay_steps: Some(d),
                ..
            } => {
                if self.warmup_steps > 0 && self.warmup_steps >= *d {
                    return Err(bad(
                        "warmup_steps",
                        format!(
                            "{} is out of range: the warm-up must end before the decay does, at train.decay_steps = {d}",
                            self.warmup_steps
                        ),
                    ));
                }
                Ok(())
            }
            LrDecay::PiecewiseConstantLr { milestone, .. } => {
                let last = milestone.last().copied().unwrap_or(0);
                let covered = last.saturating_add(self.warmup_steps);
                if covered < run_steps {
                    return Err(bad(
                        "milestone",
                        format!(
                            "the last milestone ({last}) gives rates for {covered} steps (with the warm-up), but the run has {run_steps}"
                        ),
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The learning rate of global step `step` (0 for the run's first update) in a run of
    /// `run_steps` steps (used only as `cosine`'s default `decay_steps`).
    pub fn learning_rate(&self, step: u64, run_steps: u64) -> f64 {
        let eta = self.learning_rate;
        let w = self.warmup_steps;
        if let LrDecay::CosineWithWarmUp {
            lr_end,
            decay_steps,
            num_cycles,
        } = &self.decay
        {
            let d = decay_steps.unwrap_or(run_steps).max(1);
            if step >= d {
                return *lr_end;
            }
            if step < w {
                return self.warmup(step);
            }
            let progress = (step - w) as f64 / d.saturating_sub(w).max(1) as f64;
            let cos = (std::f64::consts::PI * num_cycles * 2.0 * progress).cos();
            let percent = (0.5 * (1.0 + cos)).max(0.0);
            return lr_end + (eta - lr_end) * percent;
        }
        if step < w {
            return self.warmup(step);
        }
        let i = step - w;
        let epoch = i / self.step_per_epoch;
        match &self.decay {
            LrDecay::Constant | LrDecay::CosineWithWarmUp { .. } => eta,
            LrDecay::WarmupLr { warmup_epoch } => {
                eta * epoch.min(*warmup_epoch) as f64 / *warmup_epoch as f64
            }
            LrDecay::CosineDecayLr {
                min_lr,
                decay_epoch,
            } => {
                let t = epoch.min(*decay_epoch) as f64;
                let delta = 0.5 * (eta - min_lr);
                min_lr + delta * (1.0 + (std::f64::consts::PI * t / *decay_epoch as f64).cos())
            }
            LrDecay::PolynomialDecayLr {
                end_learning_rate,
                decay_epoch,
                power,
                update_decay_epoch,
            } => {
                let (t, d) = match update_decay_epoch {
                    true => (epoch, decay_epoch * epoch.div_ceil(*decay_epoch).max(1)),
                    false => (epoch.min(*decay_epoch), *decay_epoch),
                };
                (eta - end_learning_rate) * (1.0 - t as f64 / d as f64).powf(*power)
                    + end_learning_rate
            }
            LrDecay::ExponentialDecayLr {
                decay_rate,
                decay_epoch,
                is_stair,
            } => {
                let p = match is_stair {
                    true => (epoch / decay_epoch) as f64,
                    false => epoch as f64 / *decay_epoch as f64,
                };
                eta * decay_rate.powf(p)
            }
            LrDecay::PiecewiseConstantLr {
                milestone,
                learning_rates,
            } => {
                let t = milestone
                    .iter()
                    .position(|&m| i < m)
                    .unwrap_or(milestone.len().saturating_sub(1));
                learning_rates.get(t).copied().unwrap_or(eta)
            }
        }
    }

    /// The linear warm-up's rate at step `step < warmup_steps`.
    fn warmup(&self, step: u64) -> f64 {
        let init = self.warmup_lr_init;
        init + (self.learning_rate - init) * step as f64 / self.warmup_steps as f64
    }
}
