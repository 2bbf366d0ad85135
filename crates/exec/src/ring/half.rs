//! Half-precision (`bf16`, `f16`) ring attention, computed in `f32` as one device's
//! `FlashAttention` is (the graph's half-precision evaluation): the half operands widened, the
//! `f32` ring run (its blocks travel in `f32`), the `f32` results rounded to nearest into the
//! half outputs. The widened operands and the `f32` results are counted in the call's working
//! memory, as `parallel::ring::ring_workspace_bytes` predicts them.

use std::borrow::Cow;

use tensor::{DType, Tensor};

use super::link::Link;
use crate::error::ExecError;

/// Runs `run` on `f32` copies of the half tensors among `inputs` and `outputs` (the others as
/// they are), then rounds the `f32` results into the half outputs.
pub(super) fn in_f32<const I: usize, const O: usize>(
    link: &Link<'_>,
    inputs: [&Tensor; I],
    outputs: [&mut Tensor; O],
    run: impl FnOnce([&Tensor; I], [&mut Tensor; O]) -> Result<(), ExecError>,
) -> Result<(), ExecError> {
    let widened = inputs.map(|t| {
        if t.dtype().is_half() {
            link.count::<f32>(t.n_elements());
            Cow::Owned(t.to_dtype(DType::F32))
        } else {
            Cow::Borrowed(t)
        }
    });
    let dtypes = outputs.each_ref().map(|t| t.dtype());
    let mut results = outputs.each_ref().map(|t| {
        if t.dtype().is_half() {
            link.count::<f32>(t.n_elements());
            Tensor::zeros(DType::F32, t.shape())
        } else {
            Tensor::zeros(t.dtype(), &[0])
        }
    });
    // The outputs that are not half are written in place: moved into `results` and back.
    let mut outputs = outputs;
    for (out, result) in outputs.iter_mut().zip(results.iter_mut()) {
        if !out.dtype().is_half() {
            std::mem::swap(*out, result);
        }
    }
    let ran = run(widened.each_ref().map(|t| t.as_ref()), results.each_mut());
    for ((out, result), dtype) in outputs.into_iter().zip(results).zip(dtypes) {
        *out = if dtype.is_half() {
            result.to_dtype(dtype)
        } else {
            result
        };
    }
    ran
}
