//! Mixed precision (`train.precision`, `train.loss_scale`): the model computes in bf16 or f16
//! while the optimizer keeps f32 master weights and f32 state, as MindSpore's O2 and PyTorch's
//! AMP with master weights do.
//!
//! Each step the gradients (low precision, scaled by the loss scale under f16) are read into
//! f32, unscaled, and applied to the master piece; the updated master piece is rounded into the
//! model's weights. With a loss scale, a step whose gradients hold an infinity or a NaN on any
//! rank is skipped by every rank; a dynamic scale then halves, and doubles after
//! [`GROWTH_INTERVAL`] clean steps (PyTorch's `GradScaler` rule).

use comm::{BufMut, Communicator, ReduceOp};
use reshard::HalfSum;
use tensor::{DType, Tensor};

use crate::error::ExecError;

/// How a sum over ranks adds half-precision values under `config`: a gradient's sum
/// (`gradient`: data-parallel all-reduces and reduce-scatters, fused buckets, hsdp, shared
/// parameters) widened to f32 under `parallel.gradient_fp32_sync` (the default) and in the half
/// type, rounding after every addition in member order, without it; any sum widened under
/// `parallel.enable_fp32_communication`, which takes precedence; the other sums accumulated in
/// f32 and rounded once.
pub(crate) fn half_sum(config: &parallel::ParallelConfig, gradient: bool) -> HalfSum {
    match (config.enable_fp32_communication, gradient) {
        (true, _) => HalfSum::WidenedToF32,
        (false, true) if config.gradient_fp32_sync => HalfSum::WidenedToF32,
        (false, true) => HalfSum::InHalfType,
        (false, false) => HalfSum::AccumulateInF32,
    }
}

/// Clean steps before a dynamic loss scale doubles.
pub const GROWTH_INTERVAL: u64 = 2000;

/// The dynamic loss scale's first value (2¹⁶).
pub const INITIAL_DYNAMIC_SCALE: f64 = 65536.0;

/// What the model computes in (`train.precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// bfloat16 compute, f32 master weights.
    Bf16,
    /// float16 compute, f32 master weights, with a loss scale.
    F16,
}

impl Precision {
    /// Parses `"f32"`, `"bf16"`, `"f16"`.
    pub fn parse(text: &str) -> Option<Precision> {
        match text {
            "f32" => Some(Precision::F32),
            "bf16" => Some(Precision::Bf16),
            "f16" => Some(Precision::F16),
            _ => None,
        }
    }

    /// The model's floating-point type.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
        }
    }

    /// Whether the optimizer keeps f32 master weights beside the model's.
    pub fn has_master_weights(self) -> bool {
        self != Precision::F32
    }
}

/// `train.loss_scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScale {
    /// A fixed factor.
    Static(f64),
    /// Halved on overflow, doubled after [`GROWTH_INTERVAL`] clean steps.
    Dynamic,
}

/// A static scale is finite and ≥ 1 (checked when read), so equality is reflexive.
impl Eq for LossScale {}

/// The dynamic loss scaler's state, saved with a checkpoint set (`train_state.json`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossScaleState {
    /// The current scale.
    pub scale: f64,
    /// Clean steps since the scale last changed.
    pub clean_steps: u64,
}

/// The loss scale of a run as it goes.
#[derive(Debug, Clone)]
pub struct LossScaler {
    scale: f64,
    dynamic: bool,
    clean_steps: u64,
}

impl LossScaler {
    /// The scaler of `config` (`None`: scale 1, never skips).
    pub fn new(config: Option<LossScale>) -> Option<LossScaler> {
        config.map(|c| match c {
            LossScale::Static(scale) => LossScaler {
                scale,
                dynamic: false,
                clean_steps: 0,
            },
            LossScale::Dynamic => LossScaler {
                scale: INITIAL_DYNAMIC_SCALE,
                dynamic: true,
                clean_steps: 0,
            },
        })
    }

    /// The factor the loss's gradient seed is multiplied by.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// The scaler's state, saved with a checkpoint.
    pub fn state(&self) -> LossScaleState {
        LossScaleState {
            scale: self.scale,
            clean_steps: self.clean_steps,
        }
    }

    /// Continues a dynamic scaler from a saved state (a static scale stays the configured
    /// one).
    pub fn restore(&mut self, saved: LossScaleState) {
        if self.dynamic {
            self.scale = saved.scale;
            self.clean_steps = saved.clean_steps;
        }
    }

    /// Records a step's outcome (`overflow`: skipped) and adapts a dynamic scale.
    pub fn record(&mut self, overflow: bool) {
        if !self.dynamic {
            return;
        }
        if overflow {
            self.scale = (self.scale / 2.0).max(1.0);
            self.clean_steps = 0;
        } else {
            self.clean_steps += 1;
            if self.clean_steps == GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.clean_steps = 0;
            }
        }
    }
}

/// Fails a run whose every step was skipped for overflowing gradients: its parameters never
/// changed, so its checkpoint would be the one it started from. The error names
/// `train.loss_scale` and the scale the steps overflowed at.
pub fn check_some_update(
    steps: u64,
    skipped_steps: u64,
    scaler: Option<&LossScaler>,
) -> Result<(), ExecError> {
    match scaler {
        Some(scaler) if steps > 0 && skipped_steps == steps => {
            let how = match scaler.dynamic {
                true => format!("down to the dynamic scale {}", scaler.scale),
                false => format!("at the fixed scale {}", scaler.scale),
            };
            Err(ExecError::Config {
                key: "train.loss_scale".to_string(),
                reason: format!(
                    "every one of the run's {steps} steps was skipped: its gradients overflowed {how}, so no parameter changed and no checkpoint is written (lower train.loss_scale, or set it to \"dynamic\")"
                ),
            })
        }
        _ => Ok(()),
    }
}

/// Whether any rank of `world` saw a non-finite gradient (`mine` for this rank).
pub fn any_rank_overflowed(world: &dyn Communicator, mine: bool) -> Result<bool, ExecError> {
    let mut flag = [if mine { 1.0f32 } else { 0.0 }];
    world.all_reduce_buf(BufMut::new(&mut flag), ReduceOp::Max)?;
    Ok(flag[0] > 0.0)
}

/// The elements of `t` from element `offset`, shaped `shape`, as f32 times `factor`.
pub fn f32_piece(
    t: &Tensor,
    offset: usize,
    shape: &[usize],
    factor: f64,
) -> Result<Tensor, ExecError> {
    let width = t.dtype().size_in_bytes();
    let len: usize = shape.iter().product();
    let bytes = t
        .as_bytes()
        .get(offset * width..(offset + len) * width)
        .ok_or_else(|| ExecError::Mismatch {
            what: "a gradient piece".to_string(),
            expected: format!("{} elements", offset + len),
            got: t.n_elements().to_string(),
        })?;
    let mut piece = Tensor::from_bytes(t.dtype(), shape, bytes)?.to_dtype(DType::F32);
    if factor != 1.0 {
        let f = factor as f32;
        piece
            .as_slice_mut::<f32>()?
            .iter_mut()
            .for_each(|x| *x *= f);
    }
    Ok(piece)
}

/// Whether every element of `t` is finite.
pub fn all_finite(t: &Tensor) -> bool {
    match t.as_slice::<f32>() {
        Ok(xs) => xs.iter().all(|x| x.is_finite()),
        Err(_) => t.to_f64_vec().iter().all(|x| x.is_finite()),
    }
}

/// Writes `master` (f32) into `param` from element `offset`, rounded to `param`'s type.
pub fn write_piece(param: &mut Tensor, offset: usize, master: &Tensor) -> Result<(), ExecError> {
    let rounded = master.to_dtype(param.dtype());
    let width = param.dtype().size_in_bytes();
    let bytes = rounded.as_bytes();
    let start = offset * width;
    param.as_bytes_mut()[start..start + bytes.len()].copy_from_slice(bytes);
    Ok(())
}

/// The f32 master copy of every trainable parameter's optimizer piece (in the optimizer's
/// order), under mixed precision.
#[derive(Debug)]
pub struct MasterWeights {
    pieces: Vec<Tensor>,
}

impl MasterWeights {
    /// The pieces of `exec`'s weights for the trainable parameters `trainable`, widened.
    pub fn new(
        exec: &crate::RankExecutor,
        trainable: &[usize],
    ) -> Result<MasterWeights, ExecError> {
        let pieces = trainable
            .iter()
            .map(|&i| {
                let piece = exec.optimizer_piece(i);
                f32_piece(exec.param(i), piece.param_offset, &piece.shape, 1.0)
            })
            .collect::<Result<_, _>>()?;
        Ok(MasterWeights { pieces })
    }

    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.pieces.iter().map(|t| t.as_bytes().len()).sum()
    }

    /// Piece `k`.
    pub fn piece_mut(&mut self, k: usize) -> &mut Tensor {
        &mut self.pieces[k]
    }

    /// Piece `k`.
    pub fn piece(&self, k: usize) -> &Tensor {
        &self.pieces[k]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dynamic scaler restored from another's state continues it exactly (scale and
    /// clean-step count); a static scale stays the configured one.
    #[test]
    fn a_restored_scaler_continues_the_saved_one() {
        let mut saved = LossScaler::new(Some(LossScale::Dynamic)).unwrap();
        saved.record(true);
        for _ in 0..GROWTH_INTERVAL - 1 {
            saved.record(false);
        }
        let mut resumed = LossScaler::new(Some(LossScale::Dynamic)).unwrap();
        resumed.restore(saved.state());
        assert_eq!(resumed.state(), saved.state());
        saved.record(false);
        resumed.record(false);
        assert_eq!(resumed.scale(), INITIAL_DYNAMIC_SCALE);
        assert_eq!(resumed.state(), saved.state());
        let mut fixed = LossScaler::new(Some(LossScale::Static(8.0))).unwrap();
        fixed.restore(saved.state());
        assert_eq!(fixed.scale(), 8.0);
    }
}
