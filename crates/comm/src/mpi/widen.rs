//! 16-bit float buffers, which MPI has no type for, reduced as f32 copies.

use tensor::DType;

use crate::buf::{Buf, BufMut};
use crate::op::ReduceOp;

/// An f32 copy of a 16-bit float buffer, or `None` for other dtypes.
pub(super) fn widen(buf: &BufMut<'_>) -> Option<Vec<f32>> {
    widen_read(&buf.as_buf())
}

/// An f32 copy of a 16-bit float buffer being sent, or `None` for other dtypes.
pub(super) fn widen_read(buf: &Buf<'_>) -> Option<Vec<f32>> {
    let bytes = buf.bytes();
    match buf.dtype() {
        DType::F16 => Some(
            bytemuck::cast_slice::<u8, half::f16>(bytes)
                .iter()
                .map(|x| x.to_f32())
                .collect(),
        ),
        DType::BF16 => Some(
            bytemuck::cast_slice::<u8, half::bf16>(bytes)
                .iter()
                .map(|x| x.to_f32())
                .collect(),
        ),
        _ => None,
    }
}

/// Writes a reduced f32 copy back into a 16-bit float buffer (dividing first for `Mean`).
pub(super) fn narrow(wide: &[f32], buf: &mut BufMut<'_>, op: ReduceOp, n: usize) {
    let scale = if op == ReduceOp::Mean { n as f32 } else { 1.0 };
    let dtype = buf.dtype();
    let bytes = buf.bytes_mut();
    match dtype {
        DType::F16 => {
            for (d, &w) in bytemuck::cast_slice_mut::<u8, half::f16>(bytes)
                .iter_mut()
                .zip(wide)
            {
                *d = half::f16::from_f32(w / scale);
            }
        }
        _ => {
            for (d, &w) in bytemuck::cast_slice_mut::<u8, half::bf16>(bytes)
                .iter_mut()
                .zip(wide)
            {
                *d = half::bf16::from_f32(w / scale);
            }
        }
    }
}
