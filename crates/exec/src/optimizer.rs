//! Optimizers whose state is sharded like its parameter: SGD, Momentum, Adam (with MindSpore's
//! `use_nesterov` and `use_amsgrad`), AdamW (MindSpore's `AdamWeightDecay`), mint AdamW
//! (PyTorch's rule) and Lamb.
//!
//! # Sharding
//! An [`Optimizer`] works on one rank's shard of each parameter and the gradient shard of the
//! same shape. Every rule but Lamb is elementwise, so a rank holding any box of a parameter, with
//! the state of that box, computes exactly what one device computes there: every sharding gives
//! the same global result. The state tensors have the shard's shape and dtype, so they are sharded
//! like their parameter and a checkpoint stores them with the parameter's layout.
//!
//! Lamb is not elementwise: its trust ratio divides two norms over the **whole** parameter. Its
//! step has three parts ([`Optimizer::needs_norms`]): [`Optimizer::prepare_piece`] advances the
//! moments of the rank's piece and returns the exact square sums ([`SquareSum`]) of the piece's
//! weights and of its update; the caller adds each parameter's square sums over the ranks holding
//! its distinct pieces (each replica once: `crate::update` does it with the machinery of global-norm
//! clipping) and hands the two norms to [`Optimizer::set_norms`]; then [`Optimizer::update_piece`]
//! applies the update. The sums are exact integers, so the norms, and the update, are one
//! device's bit for bit whatever the split, whenever the weights and gradients are.
//!
//! # Update rules
//! The rules are MindSpore's, with `p` the parameter, `g` its gradient, `lr` the learning rate,
//! `wd` the weight decay and `t` the step count (1 on the first step, see
//! [`Optimizer::begin_step`]). `lr` is the step's rate: `train.learning_rate`, or the
//! schedule's rate for the step ([`Optimizer::set_learning_rate`], `runtime::LrSchedule`).
//! Weight decay follows MindSpore's default filter: it applies to parameters whose name contains
//! neither `beta` nor `gamma` ([`applies_weight_decay`]); a [`WeightDecayFilter`] can exclude
//! more (biases, embeddings: MindFormers' recipe). For the excluded parameters `wd` is 0.
//!
//! | kind | MindSpore | rule |
//! |---|---|---|
//! | [`OptimizerKind::Sgd`] | `nn.SGD` (momentum 0) | `g' = g + wd·p`; `p -= lr·g'` |
//! | [`OptimizerKind::Momentum`] | `nn.Momentum` | `g' = g + wd·p`; `v = μ·v + g'`; `p -= lr·v`, or with Nesterov `p -= lr·(g' + μ·v)` |
//! | [`OptimizerKind::Adam`] | `nn.Adam` (`ops.Adam`) | `g' = g + wd·p`; `m = β1·m + (1-β1)·g'`; `v = β2·v + (1-β2)·g'²`; `lr_t = lr·√(1-β2ᵗ)/(1-β1ᵗ)`; `p -= lr_t · m/(√v + ε)` |
//! | Adam, `use_nesterov` | `nn.Adam(use_nesterov=True)` (`ops.Adam`) | as Adam, but `p -= lr_t · (β1·m + (1-β1)·g')/(√v + ε)` |
//! | Adam, `use_amsgrad` | `nn.Adam(use_amsgrad=True)` (`ops.ApplyAdamWithAmsgradV2`) | as Adam, with `v̂ = max(v̂, v)`; `p -= lr_t · m/(√v̂ + ε)` |
//! | [`OptimizerKind::AdamW`] | `nn.AdamWeightDecay` | `m = β1·m + (1-β1)·g`; `v = β2·v + (1-β2)·g²`; `p -= lr·(m/(√v + ε) + wd·p)` |
//! | [`OptimizerKind::MintAdamW`] | `mint.optim.AdamW` (PyTorch's `torch.optim.AdamW`) | `p = p·(1 - lr·wd)`; `m = β1·m + (1-β1)·g`; `v = β2·v + (1-β2)·g²`; `p -= (lr/(1-β1ᵗ)) · m/(√v/√(1-β2ᵗ) + ε)` |
//! | [`OptimizerKind::Lamb`] | `nn.Lamb` (`Lamb` kernel) | `m = β1·m + (1-β1)·g`; `v = β2·v + (1-β2)·g²`; `m̂ = m/(1-β1ᵗ)`; `v̂ = v/(1-β2ᵗ)`; `u = m̂/(√v̂ + ε) + wd·p`; `r = ‖p‖/‖ĝ‖` with `ĝ = m̂/√(v̂ + ε) + wd·p`, 1 when either norm is 0, clamped to [0, 10] (a NaN to 0); `p -= lr·r·u` |
//!
//! Two details are MindSpore's and differ from PyTorch: Adam's ε is added to `√v` *outside* the
//! bias correction (the correction scales the learning rate, as `ops.Adam` does), and AdamW is
//! MindSpore's `AdamWeightDecay`, which has **no** bias correction (PyTorch's `AdamW` has one).
//! `mint_adamw` is MindSpore's `mint.optim.AdamW`, whose documented algorithm is PyTorch's:
//! bias-corrected moments with ε added to `√v̂` (`v̂ = v/(1-β2ᵗ)`), and weight decay decoupled
//! and scaled by the learning rate, applied before the moments' step; the arithmetic above
//! is the one `mindspore.experimental.optim.adamw` and PyTorch's `_single_tensor_adamw` run
//! (`step_size = lr/bias_correction1`, `denom = √v/√bias_correction2 + ε`).
//! Momentum accumulates the raw gradient (`v = μ·v + g`, no dampening), as `ops.ApplyMomentum`
//! does.
//!
//! Adam's `use_amsgrad` is `ops.ApplyAdamWithAmsgradV2`, which has no Nesterov step (MindSpore's
//! `nn.Adam` ignores `use_nesterov` beside it): the pair is refused here rather than one
//! switch doing nothing. Lamb is the kernel MindSpore's `nn.Lamb` runs (the GPU `Lamb` op; the CPU
//! has none): the norms of the trust ratio are over the whole parameter, the norm of the update
//! uses `ĝ` (ε *inside* the square root) while the step uses `u` (ε outside), the ratio's
//! guard looks at `‖p‖` and `‖ĝ‖`, and the ratio is clamped to [0, 10]. Weight decay (L2, inside
//! the trust ratio's update) follows the same filter as the other rules. The norms here are
//! exact (rounded once to f64), the ratio is computed in f64, and `lr·r` is rounded once to the
//! parameter's type.
//!
//! Arithmetic runs in the parameter's dtype (f32 or f64); hyperparameters are rounded to it.
//!
//! # State names
//! State tensors are named as MindSpore's optimizers name theirs, so checkpoints look familiar:
//! `moments` (Momentum), `moment1`/`moment2` (Adam; `vhat` too with `use_amsgrad`),
//! `adam_m`/`adam_v` (AdamWeightDecay), `exp_avg`/`exp_avg_sq` (mint AdamW, PyTorch's names),
//! `lamb_m`/`lamb_v` (Lamb). In a
//! checkpoint the state of parameter `fc1_weight` is `moments.fc1_weight`
//! ([`state_checkpoint_name`]), MindSpore's `Parameter.clone(prefix=…)` naming.

use tensor::kernels::Float;
use tensor::{DType, Tensor};

use crate::clip::SquareSum;
use crate::error::ExecError;

/// The update rule and its own hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerKind {
    /// Plain stochastic gradient descent (MindSpore's `nn.SGD` with momentum 0). No state.
    Sgd,
    /// Momentum (MindSpore's `nn.Momentum`). State: `moments`.
    Momentum {
        /// μ, the decay of the accumulated gradient (≥ 0).
        momentum: f64,
        /// Nesterov's accelerated gradient.
        use_nesterov: bool,
    },
    /// Adam with bias correction (MindSpore's `nn.Adam`). State: `moment1`, `moment2`, and
    /// `vhat` with `use_amsgrad`.
    Adam {
        /// Decay of the first moment, in (0, 1).
        beta1: f64,
        /// Decay of the second moment, in (0, 1).
        beta2: f64,
        /// Added to `√v` (> 0).
        eps: f64,
        /// AMSGrad (`ops.ApplyAdamWithAmsgradV2`): the step divides by the running maximum
        /// `v̂` of the second moment.
        use_amsgrad: bool,
        /// Nesterov's step (`ops.Adam(use_nesterov=True)`); not with `use_amsgrad`.
        use_nesterov: bool,
    },
    /// Adam with decoupled weight decay and no bias correction (MindSpore's
    /// `nn.AdamWeightDecay`). State: `adam_m`, `adam_v`.
    AdamW {
        /// Decay of the first moment, in (0, 1).
        beta1: f64,
        /// Decay of the second moment, in (0, 1).
        beta2: f64,
        /// Added to `√v` (> 0).
        eps: f64,
    },
    /// Adam with bias correction and decoupled weight decay scaled by the learning rate
    /// (MindSpore's `mint.optim.AdamW`, PyTorch's `AdamW`). State: `exp_avg`, `exp_avg_sq`.
    MintAdamW {
        /// Decay of the first moment, in (0, 1).
        beta1: f64,
        /// Decay of the second moment, in (0, 1).
        beta2: f64,
        /// Added to the bias-corrected `√v̂` (> 0).
        eps: f64,
    },
    /// Layer-wise adaptive moments (MindSpore's `nn.Lamb`): Adam's bias-corrected step with L2
    /// weight decay, scaled per parameter by the trust ratio `‖p‖/‖update‖` over the whole
    /// parameter (see the module docs). State: `lamb_m`, `lamb_v`.
    Lamb {
        /// Decay of the first moment, in (0, 1).
        beta1: f64,
        /// Decay of the second moment, in (0, 1).
        beta2: f64,
        /// Added to `√v̂` (> 0).
        eps: f64,
    },
}

impl OptimizerKind {
    /// The config spelling: `sgd`, `momentum`, `adam`, `adamw`, `mint_adamw` or `lamb`.
    pub fn name(&self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Momentum { .. } => "momentum",
            OptimizerKind::Adam { .. } => "adam",
            OptimizerKind::AdamW { .. } => "adamw",
            OptimizerKind::MintAdamW { .. } => "mint_adamw",
            OptimizerKind::Lamb { .. } => "lamb",
        }
    }

    /// The names of the state tensors kept per parameter, in [`Optimizer::state`] order.
    pub fn state_names(&self) -> &'static [&'static str] {
        match self {
            OptimizerKind::Sgd => &[],
            OptimizerKind::Momentum { .. } => &["moments"],
            OptimizerKind::Adam {
                use_amsgrad: true, ..
            } => &["moment1", "moment2", "vhat"],
            OptimizerKind::Adam { .. } => &["moment1", "moment2"],
            OptimizerKind::AdamW { .. } => &["adam_m", "adam_v"],
            OptimizerKind::MintAdamW { .. } => &["exp_avg", "exp_avg_sq"],
            OptimizerKind::Lamb { .. } => &["lamb_m", "lamb_v"],
        }
    }

    /// Whether the rule's update of a parameter depends on norms over the whole parameter
    /// (Lamb's trust ratio): see [`Optimizer::needs_norms`].
    pub fn needs_norms(&self) -> bool {
        matches!(self, OptimizerKind::Lamb { .. })
    }
}

/// The state names of every rule ([`OptimizerKind::state_names`]): what a checkpoint may hold
/// beside the parameters, whichever rule saved it.
pub const STATE_NAMES_OF_EVERY_RULE: &[&str] = &[
    "moments",
    "moment1",
    "moment2",
    "adam_m",
    "adam_v",
    "exp_avg",
    "exp_avg_sq",
    "vhat",
    "lamb_m",
    "lamb_v",
];

/// An optimizer's rule and the hyperparameters shared by all rules.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerConfig {
    /// The rule.
    pub kind: OptimizerKind,
    /// The learning rate (finite, > 0).
    pub learning_rate: f64,
    /// The weight decay (finite, ≥ 0); see the module docs for how each rule applies it.
    pub weight_decay: f64,
}

/// A `Config` error on key `train.<key>`: the optimizer's hyperparameters live in the config's
/// `[train]` section, so errors name them as a user writes them.
fn bad_hyperparameter(key: &str, value: f64, rule: &str) -> ExecError {
    ExecError::Config {
        key: format!("train.{key}"),
        reason: format!("{value} is out of range: {rule}"),
    }
}

fn check(key: &str, value: f64, ok: bool, rule: &str) -> Result<(), ExecError> {
    if value.is_finite() && ok {
        Ok(())
    } else {
        Err(bad_hyperparameter(key, value, rule))
    }
}

impl OptimizerConfig {
    /// Checks every hyperparameter against MindSpore's ranges (learning rate > 0, weight decay
    /// ≥ 0, momentum ≥ 0, β in (0, 1), ε > 0, all finite). Errors name the `train.*` key.
    pub fn validate(&self) -> Result<(), ExecError> {
        OptimizerConfig::check_hyperparameter("learning_rate", self.learning_rate)?;
        OptimizerConfig::check_hyperparameter("weight_decay", self.weight_decay)?;
        match self.kind {
            OptimizerKind::Sgd => Ok(()),
            OptimizerKind::Momentum { momentum, .. } => {
                OptimizerConfig::check_hyperparameter("momentum", momentum)
            }
            OptimizerKind::Adam {
                use_amsgrad: true,
                use_nesterov: true,
                ..
            } => Err(ExecError::Config {
                key: "train.use_nesterov".to_string(),
                reason: "true with train.use_amsgrad = true: MindSpore's AMSGrad Adam \
                         (ops.ApplyAdamWithAmsgradV2) has no Nesterov step (nn.Adam ignores \
                         use_nesterov beside use_amsgrad); set one of the two"
                    .to_string(),
            }),
            OptimizerKind::Adam {
                beta1, beta2, eps, ..
            }
            | OptimizerKind::AdamW { beta1, beta2, eps }
            | OptimizerKind::MintAdamW { beta1, beta2, eps }
            | OptimizerKind::Lamb { beta1, beta2, eps } => {
                OptimizerConfig::check_hyperparameter("beta1", beta1)?;
                OptimizerConfig::check_hyperparameter("beta2", beta2)?;
                OptimizerConfig::check_hyperparameter("eps", eps)
            }
        }
    }

    /// Checks hyperparameter `train.<key>` (`learning_rate`, `weight_decay`, `momentum`,
    /// `beta1`, `beta2`, `eps`) against its range, as [`OptimizerConfig::validate`] does, also
    /// for a rule that does not read it (a config checks such a key before reporting it as
    /// without effect). Another key is not a hyperparameter: it passes.
    pub fn check_hyperparameter(key: &str, value: f64) -> Result<(), ExecError> {
        let in_unit = value > 0.0 && value < 1.0;
        match key {
            "learning_rate" | "eps" => check(key, value, value > 0.0, "it must be > 0"),
            "weight_decay" | "momentum" => check(key, value, value >= 0.0, "it must be ≥ 0"),
            "beta1" | "beta2" => check(key, value, in_unit, "it must lie in (0, 1)"),
            _ => Ok(()),
        }
    }
}

/// MindSpore's default weight-decay filter: decay applies to parameters whose name contains
/// neither `beta` nor `gamma` (the shifts and scales of normalisation layers).
pub fn applies_weight_decay(param_name: &str) -> bool {
    !param_name.contains("beta") && !param_name.contains("gamma")
}

/// Which parameters weight decay applies to: MindSpore's default filter (no `beta`, no
/// `gamma` in the name) and, in addition, no name containing any of `excluded`
/// (`train.no_weight_decay`, e.g. `["bias", "embedding"]` for MindFormers' recipe of no decay on
/// biases, LayerNorm and embeddings). Names are matched as substrings, so the filter is the
/// same on every rank and under every layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightDecayFilter {
    /// Name substrings whose parameters get no weight decay, beside `beta` and `gamma`.
    pub excluded: Vec<String>,
}

impl WeightDecayFilter {
    /// Whether weight decay applies to parameter `param_name`.
    pub fn applies(&self, param_name: &str) -> bool {
        applies_weight_decay(param_name)
            && !self
                .excluded
                .iter()
                .any(|word| param_name.contains(word.as_str()))
    }
}

/// The checkpoint name of state `state` of parameter `param` (`moments.fc1_weight`), as
/// MindSpore's `Parameter.clone(prefix=state)` names it.
pub fn state_checkpoint_name(state: &str, param: &str) -> String {
    format!("{state}.{param}")
}

/// The error for parameter index `index` of an optimizer of `n_params` parameters.
fn no_param(n_params: usize, index: usize) -> ExecError {
    ExecError::Mismatch {
        what: "optimizer parameter index".to_string(),
        expected: format!("an index below {n_params}"),
        got: index.to_string(),
    }
}

/// One parameter shard the optimizer updates: its name and this rank's shard shape and dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// The parameter's name (`fc1_weight`), used in errors, the weight-decay filter and state
    /// names.
    pub name: String,
    /// This rank's shard shape.
    pub shape: Vec<usize>,
    /// The parameter's dtype (f32 or f64).
    pub dtype: DType,
}

/// The state of one parameter shard.
#[derive(Debug, Clone, PartialEq)]
struct Slot {
    spec: ParamSpec,
    decay: bool,
    /// One tensor per name of [`OptimizerKind::state_names`].
    state: Vec<Tensor>,
    /// Where a rule needing norms (Lamb) is in the step of this parameter.
    phase: NormPhase,
}

/// The parts of a Lamb step a parameter went through ([`Optimizer::prepare_piece`],
/// [`Optimizer::set_norms`], [`Optimizer::update_piece`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum NormPhase {
    /// No step in progress.
    Idle,
    /// The moments of step `.0` were advanced; the norms are awaited.
    Prepared(u64),
    /// The trust ratio `.1` of step `.0` is known; the update is awaited.
    Ready(u64, f64),
    /// Step `.0` was applied with the trust ratio `.1`.
    Applied(u64, f64),
}

/// The exact square sums of one piece of a parameter, for Lamb's whole-parameter norms
/// ([`Optimizer::prepare_piece`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PieceSquares {
    /// `Σ p²` over the piece's weights.
    pub param: SquareSum,
    /// `Σ ĝ²` over the piece's update `ĝ` (the one whose norm divides the trust ratio).
    pub update: SquareSum,
}

/// One rank's optimizer: the rule, the step count and the state of each parameter shard.
#[derive(Debug, Clone, PartialEq)]
pub struct Optimizer {
    config: OptimizerConfig,
    slots: Vec<Slot>,
    step: u64,
    /// The rate of the coming updates (`config.learning_rate` until set).
    learning_rate: f64,
}

/// The hyperparameters of one update, rounded to the compute type.
#[derive(Debug, Clone, Copy)]
struct Step<T> {
    lr: T,
    wd: T,
    a: T,
    b: T,
    c: T,
}

impl Optimizer {
    /// An optimizer for `params` (this rank's shards, in the order [`Optimizer::update`] indexes
    /// them), with zeroed state and step count 0.
    pub fn new(config: OptimizerConfig, params: &[ParamSpec]) -> Result<Optimizer, ExecError> {
        config.validate()?;
        let n_states = config.kind.state_names().len();
        let mut slots = Vec::with_capacity(params.len());
        for spec in params {
            if !matches!(spec.dtype, DType::F32 | DType::F64) {
                return Err(ExecError::Mismatch {
                    what: format!("optimizer parameter {}", spec.name),
                    expected: "dtype f32 or f64".to_string(),
                    got: format!("dtype {}", spec.dtype),
                });
            }
            slots.push(Slot {
                decay: applies_weight_decay(&spec.name),
                state: (0..n_states)
                    .map(|_| Tensor::zeros(spec.dtype, &spec.shape))
                    .collect(),
                spec: spec.clone(),
                phase: NormPhase::Idle,
            });
        }
        Ok(Optimizer {
            learning_rate: config.learning_rate,
            config,
            slots,
            step: 0,
        })
    }

    /// Applies weight decay only to the parameters `filter` accepts (the default filter is
    /// MindSpore's, which [`Optimizer::new`] uses).
    pub fn set_weight_decay_filter(&mut self, filter: &WeightDecayFilter) {
        for slot in &mut self.slots {
            slot.decay = filter.applies(&slot.spec.name);
        }
    }

    /// Whether weight decay applies to parameter `index`.
    pub fn decays(&self, index: usize) -> Result<bool, ExecError> {
        Ok(self.slot(index)?.decay)
    }

    /// Sets the learning rate of the coming updates: the schedule's rate for this step
    /// (`runtime::LrSchedule::learning_rate`). It must be finite and ≥ 0 (a warm-up starts
    /// at 0).
    pub fn set_learning_rate(&mut self, learning_rate: f64) -> Result<(), ExecError> {
        if !(learning_rate.is_finite() && learning_rate >= 0.0) {
            return Err(ExecError::Mismatch {
                what: "the step's learning rate".to_string(),
                expected: "a finite number ≥ 0".to_string(),
                got: learning_rate.to_string(),
            });
        }
        self.learning_rate = learning_rate;
        Ok(())
    }

    /// The learning rate of the coming updates.
    pub fn learning_rate(&self) -> f64 {
        self.learning_rate
    }

    /// The configuration.
    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// The number of parameter shards.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the optimizer has no parameter.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The spec of parameter `index`.
    pub fn param(&self, index: usize) -> Result<&ParamSpec, ExecError> {
        Ok(&self.slot(index)?.spec)
    }

    /// Starts a step: increments the step count `t` (Adam's bias correction uses it). Call once
    /// per training step, before the step's [`Optimizer::update`]s.
    pub fn begin_step(&mut self) {
        self.step += 1;
    }

    /// The number of steps begun.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Sets the step count (resuming from a checkpoint taken after `steps` steps).
    pub fn set_step_count(&mut self, steps: u64) {
        self.step = steps;
    }

    fn slot(&self, index: usize) -> Result<&Slot, ExecError> {
        self.slots
            .get(index)
            .ok_or_else(|| no_param(self.slots.len(), index))
    }

    /// The named state tensors of parameter `index`, in [`OptimizerKind::state_names`] order
    /// (empty for SGD).
    pub fn state(&self, index: usize) -> Result<Vec<(&'static str, &Tensor)>, ExecError> {
        let names = self.config.kind.state_names();
        Ok(names
            .iter()
            .copied()
            .zip(&self.slot(index)?.state)
            .collect())
    }

    /// The named state tensors of parameter `index`, writable (for loading in place).
    pub fn state_mut(
        &mut self,
        index: usize,
    ) -> Result<Vec<(&'static str, &mut Tensor)>, ExecError> {
        let names = self.config.kind.state_names();
        let n_params = self.slots.len();
        let slot = self
            .slots
            .get_mut(index)
            .ok_or_else(|| no_param(n_params, index))?;
        Ok(names.iter().copied().zip(slot.state.iter_mut()).collect())
    }

    /// Replaces state `name` of parameter `index` with `value` (resuming from a checkpoint).
    /// `value` must have the shard's shape; a float dtype other than the parameter's is
    /// converted.
    pub fn load_state(
        &mut self,
        index: usize,
        name: &str,
        value: &Tensor,
    ) -> Result<(), ExecError> {
        let names = self.config.kind.state_names();
        let kind = self.config.kind.name();
        let n_params = self.slots.len();
        let slot = self
            .slots
            .get_mut(index)
            .ok_or_else(|| no_param(n_params, index))?;
        let what = format!(
            "optimizer state {}",
            state_checkpoint_name(name, &slot.spec.name)
        );
        let Some(position) = names.iter().position(|n| *n == name) else {
            return Err(ExecError::Mismatch {
                what,
                expected: format!("a state of {kind}: {names:?}"),
                got: name.to_string(),
            });
        };
        if value.shape() != slot.spec.shape.as_slice() || !value.dtype().is_float() {
            return Err(ExecError::Mismatch {
                what,
                expected: format!("a float tensor of shape {:?}", slot.spec.shape),
                got: format!("{} {:?}", value.dtype(), value.shape()),
            });
        }
        slot.state[position] = value.to_dtype(slot.spec.dtype);
        Ok(())
    }

    /// Whether the rule needs norms over whole parameters (Lamb): each step, every parameter
    /// piece goes through [`Optimizer::prepare_piece`], then [`Optimizer::set_norms`] with the
    /// norms summed over the whole parameter, then [`Optimizer::update_piece`].
    /// [`Optimizer::update_whole`] does the three for a parameter this rank holds whole.
    pub fn needs_norms(&self) -> bool {
        self.config.kind.needs_norms()
    }

    /// Lamb's first part of the step for the piece of parameter `index` (elements
    /// `param_offset..` of `param`, `grad_offset..` of `grad`, as in
    /// [`Optimizer::update_piece`]): advances its moments and returns the exact square sums of
    /// its weights and of its update `ĝ`. Call [`Optimizer::begin_step`] first; an error for a
    /// rule that does not need norms.
    pub fn prepare_piece(
        &mut self,
        index: usize,
        param: &Tensor,
        param_offset: usize,
        grad: &Tensor,
        grad_offset: usize,
    ) -> Result<PieceSquares, ExecError> {
        let step = self.checked_step()?;
        let (kind, weight_decay) = (self.config.kind, self.config.weight_decay);
        let OptimizerKind::Lamb { beta1, beta2, eps } = kind else {
            return Err(not_a_norm_rule(kind));
        };
        let n_params = self.slots.len();
        let slot = self
            .slots
            .get_mut(index)
            .ok_or_else(|| no_param(n_params, index))?;
        // A part left from an earlier step (an error between the parts) is dropped; a second
        // preparation of this step would advance the moments twice.
        let this_step = |phase| match phase {
            NormPhase::Prepared(s) | NormPhase::Ready(s, _) | NormPhase::Applied(s, _) => s == step,
            NormPhase::Idle => false,
        };
        if this_step(slot.phase) {
            return Err(ExecError::Mismatch {
                what: format!("Lamb step {step} of {}", slot.spec.name),
                expected: "one prepare_piece per step".to_string(),
                got: "a second one".to_string(),
            });
        }
        let n = check_piece(slot, param, param_offset, grad, grad_offset)?;
        let wd = if slot.decay { weight_decay } else { 0.0 };
        let t = i32::try_from(step).unwrap_or(i32::MAX);
        let (bc1, bc2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
        let squares = match slot.spec.dtype {
            DType::F32 => lamb_prepare::<f32>(
                [beta1, beta2, eps, wd, bc1, bc2],
                &param.as_slice::<f32>()?[param_offset..param_offset + n],
                &grad.as_slice::<f32>()?[grad_offset..grad_offset + n],
                &mut slot.state,
            )?,
            _ => lamb_prepare::<f64>(
                [beta1, beta2, eps, wd, bc1, bc2],
                &param.as_slice::<f64>()?[param_offset..param_offset + n],
                &grad.as_slice::<f64>()?[grad_offset..grad_offset + n],
                &mut slot.state,
            )?,
        };
        slot.phase = NormPhase::Prepared(step);
        Ok(squares)
    }

    /// Lamb's second part of the step for parameter `index`: the norms of the **whole**
    /// parameter's weights and update `ĝ` (the square roots of the square sums
    /// [`Optimizer::prepare_piece`] returned, added over all its distinct pieces). Gives the
    /// trust ratio MindSpore's rule gives: `‖p‖/‖ĝ‖`, 1 when either is 0, clamped to [0, 10],
    /// 0 when not a number.
    pub fn set_norms(
        &mut self,
        index: usize,
        param_norm: f64,
        update_norm: f64,
    ) -> Result<(), ExecError> {
        let step = self.checked_step()?;
        let n_params = self.slots.len();
        let slot = self
            .slots
            .get_mut(index)
            .ok_or_else(|| no_param(n_params, index))?;
        if slot.phase != NormPhase::Prepared(step) {
            return Err(ExecError::Mismatch {
                what: format!("Lamb step {step} of {}", slot.spec.name),
                expected: "prepare_piece before set_norms".to_string(),
                got: "set_norms without it".to_string(),
            });
        }
        slot.phase = NormPhase::Ready(step, trust_ratio(param_norm, update_norm));
        Ok(())
    }

    /// The trust ratio [`Optimizer::set_norms`] gave parameter `index` at this step (`None`
    /// before it, or for a rule without one).
    pub fn trust_ratio(&self, index: usize) -> Result<Option<f64>, ExecError> {
        Ok(match self.slot(index)?.phase {
            NormPhase::Ready(step, ratio) | NormPhase::Applied(step, ratio)
                if step == self.step =>
            {
                Some(ratio)
            }
            _ => None,
        })
    }

    /// Updates parameter `index`, held **whole** by this rank (one device, or a replicated
    /// parameter), with its gradient: for Lamb the three parts of its step with the norms of
    /// this shard alone, for the other rules [`Optimizer::update`]. Call
    /// [`Optimizer::begin_step`] first.
    pub fn update_whole(
        &mut self,
        index: usize,
        param: &mut Tensor,
        grad: &Tensor,
    ) -> Result<(), ExecError> {
        if self.needs_norms() {
            // Checked before the moments advance: a wrong shape changes nothing.
            self.check_whole(index, param, grad)?;
            let squares = self.prepare_piece(index, param, 0, grad, 0)?;
            self.set_norms(
                index,
                squares.param.to_f64().sqrt(),
                squares.update.to_f64().sqrt(),
            )?;
        }
        self.update(index, param, grad)
    }

    /// The step count, which must be ≥ 1 during an update.
    fn checked_step(&self) -> Result<u64, ExecError> {
        if self.step == 0 {
            return Err(ExecError::Mismatch {
                what: "optimizer step count".to_string(),
                expected: "≥ 1 (call begin_step before update)".to_string(),
                got: "0".to_string(),
            });
        }
        Ok(self.step)
    }

    /// Updates parameter shard `index` in place with its gradient shard (same shape and dtype
    /// as the spec), advancing its state. Call [`Optimizer::begin_step`] first.
    pub fn update(
        &mut self,
        index: usize,
        param: &mut Tensor,
        grad: &Tensor,
    ) -> Result<(), ExecError> {
        self.check_whole(index, param, grad)?;
        self.update_piece(index, param, 0, grad, 0)
    }

    /// Checks that `param` and `grad` have parameter `index`'s shard shape.
    fn check_whole(&self, index: usize, param: &Tensor, grad: &Tensor) -> Result<(), ExecError> {
        let slot = self.slot(index)?;
        for (role, tensor) in [("parameter", param), ("gradient", grad)] {
            if tensor.shape() != slot.spec.shape.as_slice() {
                return Err(ExecError::Mismatch {
                    what: format!("optimizer update of {}: the {role}", slot.spec.name),
                    expected: format!("{} {:?}", slot.spec.dtype, slot.spec.shape),
                    got: format!("{} {:?}", tensor.dtype(), tensor.shape()),
                });
            }
        }
        Ok(())
    }

    /// Updates the elements `param_offset..` of `param` (row-major) with the elements
    /// `grad_offset..` of `grad`, as many as parameter `index`'s spec has, advancing its state:
    /// the update of an optimizer shard (`hsdp`), a run of rows of a larger buffer. Call
    /// [`Optimizer::begin_step`] first.
    pub fn update_piece(
        &mut self,
        index: usize,
        param: &mut Tensor,
        param_offset: usize,
        grad: &Tensor,
        grad_offset: usize,
    ) -> Result<(), ExecError> {
        let step = self.checked_step()?;
        let config = OptimizerConfig {
            learning_rate: self.learning_rate,
            ..self.config
        };
        let n_params = self.slots.len();
        let slot = self
            .slots
            .get_mut(index)
            .ok_or_else(|| no_param(n_params, index))?;
        let n = check_piece(slot, &*param, param_offset, grad, grad_offset)?;
        if config.kind.needs_norms() {
            let NormPhase::Ready(s, ratio) = slot.phase else {
                return Err(lamb_out_of_order(step, &slot.spec.name));
            };
            if s != step {
                return Err(lamb_out_of_order(step, &slot.spec.name));
            }
            slot.phase = NormPhase::Applied(step, ratio);
            let OptimizerKind::Lamb { beta1, beta2, eps } = config.kind else {
                return Err(not_a_norm_rule(config.kind));
            };
            let wd = if slot.decay { config.weight_decay } else { 0.0 };
            let t = i32::try_from(step).unwrap_or(i32::MAX);
            let (bc1, bc2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
            let hyper = [config.learning_rate * ratio, eps, wd, bc1, bc2];
            let range = |offset: usize| offset..offset + n;
            return match slot.spec.dtype {
                DType::F32 => lamb_apply::<f32>(
                    hyper,
                    &mut param.as_slice_mut::<f32>()?[range(param_offset)],
                    &mut slot.state,
                ),
                _ => lamb_apply::<f64>(
                    hyper,
                    &mut param.as_slice_mut::<f64>()?[range(param_offset)],
                    &mut slot.state,
                ),
            };
        }
        let weight_decay = if slot.decay { config.weight_decay } else { 0.0 };
        let range = |offset: usize| offset..offset + n;
        match slot.spec.dtype {
            DType::F32 => apply::<f32>(
                &config,
                weight_decay,
                step,
                &mut param.as_slice_mut::<f32>()?[range(param_offset)],
                &grad.as_slice::<f32>()?[range(grad_offset)],
                &mut slot.state,
            ),
            _ => apply::<f64>(
                &config,
                weight_decay,
                step,
                &mut param.as_slice_mut::<f64>()?[range(param_offset)],
                &grad.as_slice::<f64>()?[range(grad_offset)],
                &mut slot.state,
            ),
        }
    }
}

/// Checks that elements `param_offset..` of `param` and `grad_offset..` of `grad` hold the
/// piece of `slot` (as many elements as its spec, in its dtype); returns the element count.
fn check_piece(
    slot: &Slot,
    param: &Tensor,
    param_offset: usize,
    grad: &Tensor,
    grad_offset: usize,
) -> Result<usize, ExecError> {
    let n: usize = slot.spec.shape.iter().product();
    for (role, tensor, offset) in [
        ("parameter", param, param_offset),
        ("gradient", grad, grad_offset),
    ] {
        let fits = offset
            .checked_add(n)
            .is_some_and(|end| end <= tensor.shape().iter().product());
        if !fits || tensor.dtype() != slot.spec.dtype {
            return Err(ExecError::Mismatch {
                what: format!("optimizer update of {}: the {role}", slot.spec.name),
                expected: format!(
                    "{} with elements {offset}..{} ({:?})",
                    slot.spec.dtype,
                    offset.saturating_add(n),
                    slot.spec.shape
                ),
                got: format!("{} {:?}", tensor.dtype(), tensor.shape()),
            });
        }
    }
    Ok(n)
}

/// The error for a norm step asked of a rule without one.
fn not_a_norm_rule(kind: OptimizerKind) -> ExecError {
    ExecError::Mismatch {
        what: format!("the {} optimizer's step", kind.name()),
        expected: "prepare_piece and set_norms only for a rule needing norms (lamb)".to_string(),
        got: "a call for an elementwise rule (use update_piece)".to_string(),
    }
}

/// The error for a Lamb update before its norms.
fn lamb_out_of_order(step: u64, name: &str) -> ExecError {
    ExecError::Mismatch {
        what: format!("Lamb step {step} of {name}"),
        expected: "prepare_piece, then set_norms with the whole parameter's norms, then \
                   update_piece (or update_whole for a parameter held whole)"
            .to_string(),
        got: "update_piece before set_norms".to_string(),
    }
}

/// MindSpore's trust ratio (the `Lamb` kernel's): `‖p‖/‖ĝ‖`, 1 when either norm is 0 (or
/// below), clamped to [0, 10], 0 when not a number.
pub fn trust_ratio(param_norm: f64, update_norm: f64) -> f64 {
    let ratio = if param_norm > 0.0 {
        if update_norm > 0.0 {
            param_norm / update_norm
        } else {
            1.0
        }
    } else {
        1.0
    };
    if ratio.is_nan() || ratio < 0.0 {
        0.0
    } else {
        ratio.min(10.0)
    }
}

/// Adds the squares of a slice of f32 or f64 into an exact sum.
trait Squares: Float + tensor::Element {
    /// Adds `Σ x²` of `xs` into `sum`.
    fn add_squares(sum: &mut SquareSum, xs: &[Self]);
}

impl Squares for f32 {
    fn add_squares(sum: &mut SquareSum, xs: &[f32]) {
        sum.add_f32(xs);
    }
}

impl Squares for f64 {
    fn add_squares(sum: &mut SquareSum, xs: &[f64]) {
        sum.add_f64(xs);
    }
}

/// Elements of `ĝ` computed at once before their squares are added.
const SQUARES_CHUNK: usize = 4096;

/// Lamb's first part on typed slices: advances the moments `state` (`lamb_m`, `lamb_v`) with
/// `g` and returns the square sums of `p` and of `ĝ = m̂/√(v̂ + ε) + wd·p`. `hyper` is
/// `[β1, β2, ε, wd, 1-β1ᵗ, 1-β2ᵗ]`.
fn lamb_prepare<T: Squares>(
    hyper: [f64; 6],
    p: &[T],
    g: &[T],
    state: &mut [Tensor],
) -> Result<PieceSquares, ExecError> {
    let [m, v] = state else {
        return Err(state_count_bug("lamb", state.len()));
    };
    let (m, v) = (m.as_slice_mut::<T>()?, v.as_slice_mut::<T>()?);
    let [beta1, beta2, eps, wd, bc1, bc2] = hyper.map(T::from_f64);
    on_threads(m, g, [v], |m, g, [v]| lamb_moments(beta1, beta2, m, g, v));
    let mut squares = PieceSquares::default();
    T::add_squares(&mut squares.param, p);
    let mut buffer = vec![T::ZERO; SQUARES_CHUNK.min(p.len())];
    for ((p, m), v) in p
        .chunks(SQUARES_CHUNK)
        .zip(m.chunks(SQUARES_CHUNK))
        .zip(v.chunks(SQUARES_CHUNK))
    {
        let out = &mut buffer[..p.len()];
        for (((o, &p), &m), &v) in out.iter_mut().zip(p).zip(m).zip(v) {
            *o = (m / bc1) / (v / bc2 + eps).sqrt() + wd * p;
        }
        T::add_squares(&mut squares.update, out);
    }
    Ok(squares)
}

/// Lamb's moments: `m = β1·m + (1-β1)·g`, `v = β2·v + (1-β2)·g²` (`m` in the place of the
/// parameter of [`on_threads`]).
fn lamb_moments<T: Float>(beta1: T, beta2: T, m: &mut [T], g: &[T], v: &mut [T]) {
    for ((m, &g), v) in m.iter_mut().zip(g).zip(v.iter_mut()) {
        *m = beta1 * *m + (T::ONE - beta1) * g;
        *v = beta2 * *v + (T::ONE - beta2) * g * g;
    }
}

/// Lamb's last part on typed slices: `p -= (lr·r) · (m̂/(√v̂ + ε) + wd·p)` with the moments
/// the first part advanced. `hyper` is `[lr·r, ε, wd, 1-β1ᵗ, 1-β2ᵗ]`.
fn lamb_apply<T: Squares>(
    hyper: [f64; 5],
    p: &mut [T],
    state: &mut [Tensor],
) -> Result<(), ExecError> {
    let [m, v] = state else {
        return Err(state_count_bug("lamb", state.len()));
    };
    let [lr, eps, wd, bc1, bc2] = hyper.map(T::from_f64);
    let (m, v) = (m.as_slice::<T>()?, v.as_slice::<T>()?);
    let rule = |p: &mut [T], m: &[T], v: &[T]| {
        for ((p, &m), &v) in p.iter_mut().zip(m).zip(v) {
            let update = (m / bc1) / ((v / bc2).sqrt() + eps) + wd * *p;
            *p -= lr * update;
        }
    };
    // As `on_threads` cuts an elementwise rule, with the moments read only.
    let per = tensor::kernels::threads::rows_per_part(p.len(), 1);
    if per >= p.len() {
        rule(p, m, v);
        return Ok(());
    }
    let per = per.next_multiple_of(16);
    let parts: Vec<_> = p
        .chunks_mut(per)
        .zip(m.chunks(per))
        .zip(v.chunks(per))
        .collect();
    tensor::kernels::threads::for_each_part(parts, |_, ((p, m), v)| rule(p, m, v));
    Ok(())
}

/// The error for a rule whose state has the wrong number of tensors: a bug, not bad input.
fn state_count_bug(rule: &str, got: usize) -> ExecError {
    ExecError::Mismatch {
        what: format!("{rule} optimizer state"),
        expected: "the rule's state tensors".to_string(),
        got: format!("{got} tensors"),
    }
}

/// Runs one rule on typed slices. Shapes and dtypes were checked by the caller.
/// `weight_decay` is the config's, or 0 for a parameter the decay filter skips.
fn apply<T: Float + tensor::Element>(
    config: &OptimizerConfig,
    weight_decay: f64,
    step: u64,
    p: &mut [T],
    g: &[T],
    state: &mut [Tensor],
) -> Result<(), ExecError> {
    let learning_rate = config.learning_rate;
    let hyper = |a: f64, b: f64, c: f64| Step {
        lr: T::from_f64(learning_rate),
        wd: T::from_f64(weight_decay),
        a: T::from_f64(a),
        b: T::from_f64(b),
        c: T::from_f64(c),
    };
    match (config.kind, state) {
        (OptimizerKind::Sgd, _) => {
            let h = hyper(0.0, 0.0, 0.0);
            on_threads(p, g, [], |p, g, []| sgd(h, p, g))
        }
        (
            OptimizerKind::Momentum {
                momentum,
                use_nesterov,
            },
            [v],
        ) => {
            let h = hyper(momentum, 0.0, 0.0);
            on_threads(p, g, [v.as_slice_mut::<T>()?], |p, g, [v]| {
                momentum_rule(h, use_nesterov, p, g, v)
            })
        }
        (
            OptimizerKind::Adam {
                beta1,
                beta2,
                eps,
                use_amsgrad,
                use_nesterov,
            },
            state,
        ) => {
            // MindSpore's ops.Adam (and ApplyAdamWithAmsgradV2): the bias correction scales
            // the learning rate.
            let t = i32::try_from(step).unwrap_or(i32::MAX);
            let lr_t = learning_rate * (1.0 - beta2.powi(t)).sqrt() / (1.0 - beta1.powi(t));
            let mut h = hyper(beta1, beta2, eps);
            h.lr = T::from_f64(lr_t);
            match (use_amsgrad, state) {
                (false, [m, v]) => {
                    let state = [m.as_slice_mut::<T>()?, v.as_slice_mut::<T>()?];
                    on_threads(p, g, state, |p, g, [m, v]| {
                        adam(h, use_nesterov, p, g, m, v)
                    })
                }
                (true, [m, v, vhat]) => {
                    let state = [
                        m.as_slice_mut::<T>()?,
                        v.as_slice_mut::<T>()?,
                        vhat.as_slice_mut::<T>()?,
                    ];
                    on_threads(p, g, state, |p, g, [m, v, vhat]| {
                        adam_amsgrad(h, p, g, m, v, vhat)
                    })
                }
                (_, state) => return Err(state_count_bug("adam", state.len())),
            }
        }
        (OptimizerKind::AdamW { beta1, beta2, eps }, [m, v]) => {
            let h = hyper(beta1, beta2, eps);
            let state = [m.as_slice_mut::<T>()?, v.as_slice_mut::<T>()?];
            on_threads(p, g, state, |p, g, [m, v]| adam_weight_decay(h, p, g, m, v))
        }
        (OptimizerKind::MintAdamW { beta1, beta2, eps }, [m, v]) => {
            let t = i32::try_from(step).unwrap_or(i32::MAX);
            let bias_correction1 = 1.0 - beta1.powi(t);
            let bias_correction2 = 1.0 - beta2.powi(t);
            let mut h = hyper(beta1, beta2, eps);
            // PyTorch's factors: decay `1 - lr·wd`, step size `lr / (1-β1ᵗ)`, `√(1-β2ᵗ)`.
            h.wd = T::from_f64(1.0 - learning_rate * weight_decay);
            h.lr = T::from_f64(learning_rate / bias_correction1);
            let sqrt_bc2 = T::from_f64(bias_correction2.sqrt());
            let state = [m.as_slice_mut::<T>()?, v.as_slice_mut::<T>()?];
            on_threads(p, g, state, |p, g, [m, v]| {
                mint_adamw(h, sqrt_bc2, p, g, m, v)
            })
        }
        (kind, state) => {
            // The slots are built from `state_names`, so this is a bug, not bad input.
            return Err(ExecError::Mismatch {
                what: format!("{} optimizer state", kind.name()),
                expected: format!("{} tensors", kind.state_names().len()),
                got: format!("{} tensors", state.len()),
            });
        }
    }
    Ok(())
}

/// Runs an elementwise `rule` over `p`, `g` and the state slices (each as long as `p`), cut into
/// one part per thread of the rank when they are large (`train.threads_per_rank`); each element
/// is updated as on one thread, so the bits do not depend on the thread count.
fn on_threads<T: Float, const N: usize>(
    p: &mut [T],
    g: &[T],
    mut state: [&mut [T]; N],
    rule: impl Fn(&mut [T], &[T], &mut [&mut [T]; N]) + Sync,
) {
    let per = tensor::kernels::threads::rows_per_part(p.len(), 1);
    if per >= p.len() {
        return rule(p, g, &mut state);
    }
    // Whole cache lines per part.
    let per = per.next_multiple_of(16);
    let mut states = state.map(|s| s.chunks_mut(per));
    let parts: Vec<_> = p
        .chunks_mut(per)
        .zip(g.chunks(per))
        .map(|(p, g)| {
            let state: [&mut [T]; N] =
                std::array::from_fn(|j| states[j].next().unwrap_or_default());
            (p, g, state)
        })
        .collect();
    tensor::kernels::threads::for_each_part(parts, |_, (p, g, mut state)| rule(p, g, &mut state));
}

tensor::widest! {
    /// `p -= lr·(g + wd·p)`.
    /// One pass over the elements, on the widest vector unit the CPU has.
    fn sgd<T>(h: Step<T>, p: &mut [T], g: &[T]) => sgd_loop
}

/// [`sgd`]'s loop.
#[inline(always)]
fn sgd_loop<T: Float>(h: Step<T>, p: &mut [T], g: &[T]) {
    for (p, &g) in p.iter_mut().zip(g) {
        *p -= h.lr * (g + h.wd * *p);
    }
}

tensor::widest! {
    /// `v = μ·v + (g + wd·p)`; `p -= lr·v` (Nesterov: `p -= lr·(g' + μ·v)`), μ in `h.a`.
    /// One pass over the elements, on the widest vector unit the CPU has.
    fn momentum_rule<T>(h: Step<T>, use_nesterov: bool, p: &mut [T], g: &[T], v: &mut [T]) => momentum_rule_loop
}

/// [`momentum_rule`]'s loop.
#[inline(always)]
fn momentum_rule_loop<T: Float>(h: Step<T>, use_nesterov: bool, p: &mut [T], g: &[T], v: &mut [T]) {
    for ((p, &g), v) in p.iter_mut().zip(g).zip(v.iter_mut()) {
        let g = g + h.wd * *p;
        *v = h.a * *v + g;
        let step = if use_nesterov { g + h.a * *v } else { *v };
        *p -= h.lr * step;
    }
}

tensor::widest! {
    /// MindSpore's Adam with `h.lr` already bias-corrected; β1, β2, ε in `h.a`, `h.b`, `h.c`;
    /// with `use_nesterov` the step's numerator is `β1·m + (1-β1)·g'` (`ops.Adam`'s).
    /// One pass over the elements, on the widest vector unit the CPU has.
    fn adam<T>(h: Step<T>, use_nesterov: bool, p: &mut [T], g: &[T], m: &mut [T], v: &mut [T]) => adam_loop
}

/// [`adam`]'s loop.
#[inline(always)]
fn adam_loop<T: Float>(
    h: Step<T>,
    use_nesterov: bool,
    p: &mut [T],
    g: &[T],
    m: &mut [T],
    v: &mut [T],
) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        let g = g + h.wd * *p;
        *m = h.a * *m + (T::ONE - h.a) * g;
        *v = h.b * *v + (T::ONE - h.b) * g * g;
        let numerator = if use_nesterov {
            h.a * *m + (T::ONE - h.a) * g
        } else {
            *m
        };
        *p -= h.lr * numerator / (v.sqrt() + h.c);
    }
}

tensor::widest! {
    /// MindSpore's AMSGrad Adam (`ops.ApplyAdamWithAmsgradV2`) with `h.lr` already
    /// bias-corrected; β1, β2, ε in `h.a`, `h.b`, `h.c`; `vhat` the running maximum of `v`.
    /// One pass over the elements, on the widest vector unit the CPU has.
    fn adam_amsgrad<T>(h: Step<T>, p: &mut [T], g: &[T], m: &mut [T], v: &mut [T], vhat: &mut [T]) => adam_amsgrad_loop
}

/// [`adam_amsgrad`]'s loop.
#[inline(always)]
fn adam_amsgrad_loop<T: Float>(
    h: Step<T>,
    p: &mut [T],
    g: &[T],
    m: &mut [T],
    v: &mut [T],
    vhat: &mut [T],
) {
    for ((((p, &g), m), v), vhat) in p
        .iter_mut()
        .zip(g)
        .zip(m.iter_mut())
        .zip(v.iter_mut())
        .zip(vhat.iter_mut())
    {
        let g = g + h.wd * *p;
        *m = h.a * *m + (T::ONE - h.a) * g;
        *v = h.b * *v + (T::ONE - h.b) * g * g;
        if *v > *vhat {
            *vhat = *v;
        }
        *p -= h.lr * *m / (vhat.sqrt() + h.c);
    }
}

tensor::widest! {
    /// MindSpore's AdamWeightDecay; β1, β2, ε in `h.a`, `h.b`, `h.c`.
    /// One pass over the elements, on the widest vector unit the CPU has.
    fn adam_weight_decay<T>(h: Step<T>, p: &mut [T], g: &[T], m: &mut [T], v: &mut [T]) => adam_weight_decay_loop
}

/// [`adam_weight_decay`]'s loop.
#[inline(always)]
fn adam_weight_decay_loop<T: Float>(h: Step<T>, p: &mut [T], g: &[T], m: &mut [T], v: &mut [T]) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        *m = h.a * *m + (T::ONE - h.a) * g;
        *v = h.b * *v + (T::ONE - h.b) * g * g;
        let update = *m / (v.sqrt() + h.c) + h.wd * *p;
        *p -= h.lr * update;
    }
}

tensor::widest! {
    /// mint AdamW (PyTorch's AdamW): `h.wd` holds `1 - lr·wd`, `h.lr` the step size
    /// `lr/(1-β1ᵗ)`; β1, β2, ε in `h.a`, `h.b`, `h.c`; `sqrt_bc2` is `√(1-β2ᵗ)`.
    /// One pass over the elements, on the widest vector unit the CPU has.
    fn mint_adamw<T>(h: Step<T>, sqrt_bc2: T, p: &mut [T], g: &[T], m: &mut [T], v: &mut [T]) => mint_adamw_loop
}

/// [`mint_adamw`]'s loop.
#[inline(always)]
fn mint_adamw_loop<T: Float>(
    h: Step<T>,
    sqrt_bc2: T,
    p: &mut [T],
    g: &[T],
    m: &mut [T],
    v: &mut [T],
) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        *p *= h.wd;
        *m = h.a * *m + (T::ONE - h.a) * g;
        *v = h.b * *v + (T::ONE - h.b) * g * g;
        let denom = v.sqrt() / sqrt_bc2 + h.c;
        *p -= h.lr * *m / denom;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rule's dispatched pass (AVX-512 or AVX2 where the CPU has it) gives its portable
    /// loop's bits, in f32 and f64.
    #[test]
    fn the_wide_rules_give_the_portable_bits() {
        fn check<T: Float + std::fmt::Debug>(bits: impl Fn(&[T]) -> Vec<u64>) {
            let n = 103;
            let value = |m: usize, shift: f64| -> Vec<T> {
                (0..n)
                    .map(|i| T::from_f64(((i * m) % 37) as f64 / 9.0 - shift))
                    .collect()
            };
            let h = Step {
                lr: T::from_f64(0.01),
                wd: T::from_f64(0.1),
                a: T::from_f64(0.9),
                b: T::from_f64(0.95),
                c: T::from_f64(1e-8),
            };
            let g = value(7, 2.0);
            type Rule<T> = fn(Step<T>, &mut [T], &[T], &mut [T], &mut [T]);
            let rules: [(&str, Rule<T>, Rule<T>); 7] = [
                (
                    "sgd",
                    |h, p, g, _, _| sgd(h, p, g),
                    |h, p, g, _, _| sgd_loop(h, p, g),
                ),
                (
                    "momentum",
                    |h, p, g, m, _| momentum_rule(h, true, p, g, m),
                    |h, p, g, m, _| momentum_rule_loop(h, true, p, g, m),
                ),
                (
                    "adam",
                    |h, p, g, m, v| adam(h, false, p, g, m, v),
                    |h, p, g, m, v| adam_loop(h, false, p, g, m, v),
                ),
                (
                    "adam nesterov",
                    |h, p, g, m, v| adam(h, true, p, g, m, v),
                    |h, p, g, m, v| adam_loop(h, true, p, g, m, v),
                ),
                (
                    "adam amsgrad (v as v̂, g as v)",
                    |h, p, g, m, v| adam_amsgrad(h, p, g, m, &mut g.to_vec(), v),
                    |h, p, g, m, v| adam_amsgrad_loop(h, p, g, m, &mut g.to_vec(), v),
                ),
                ("adamw", adam_weight_decay, adam_weight_decay_loop),
                (
                    "mint_adamw",
                    |h, p, g, m, v| mint_adamw(h, T::from_f64(0.3), p, g, m, v),
                    |h, p, g, m, v| mint_adamw_loop(h, T::from_f64(0.3), p, g, m, v),
                ),
            ];
            for (name, wide, portable) in rules {
                let run = |rule: Rule<T>| {
                    let (mut p, mut m, mut v) = (value(3, 1.0), value(5, 0.5), value(11, -0.1));
                    for _ in 0..3 {
                        rule(h, &mut p, &g, &mut m, &mut v);
                    }
                    [bits(&p), bits(&m), bits(&v)]
                };
                assert_eq!(run(wide), run(portable), "{name}");
            }
        }
        check::<f32>(|x| x.iter().map(|v| u64::from(v.to_bits())).collect());
        check::<f64>(|x| x.iter().map(|v| v.to_bits()).collect());
    }

    /// A resume recognises the state of whichever rule saved the checkpoint.
    #[test]
    fn every_rule_s_states_are_listed() {
        let kinds = [
            OptimizerKind::Sgd,
            OptimizerKind::Momentum {
                momentum: 0.9,
                use_nesterov: false,
            },
            OptimizerKind::Adam {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                use_amsgrad: true,
                use_nesterov: false,
            },
            OptimizerKind::Lamb {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-6,
            },
            OptimizerKind::AdamW {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            OptimizerKind::MintAdamW {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        ];
        for kind in kinds {
            for name in kind.state_names() {
                assert!(STATE_NAMES_OF_EVERY_RULE.contains(name), "{name}");
            }
        }
    }
}
