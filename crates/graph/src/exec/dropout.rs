//! Dropout with a counter-based mask: whether an element is kept is a pure function of the op's
//! seed, the training step and the element's *global* flat index.
//!
//! So a rank holding any block of the global tensor computes exactly its part of the mask the
//! unsharded tensor would get, given the block's offset ([`super::Placement`]); the backward node
//! (the same op applied to `dy`) reproduces the forward mask without storing it.

use tensor::kernels::Float;
use tensor::TensorError;

use crate::error::GraphError;
use crate::exec::eval::EvalCtx;
use crate::exec::operands::checked_placement;
use crate::rng::{bits_at, for_each_global_run, mix64};

/// Distinguishes dropout streams from initializer streams keyed by the same numbers.
const DROPOUT_SALT: u64 = 0x6472_6F70_6F75_7421; // "dropout!"

/// The key of the mask stream of a dropout op seeded `seed` at training step `step`.
pub fn dropout_key(seed: u64, step: u64) -> u64 {
    mix64(seed ^ mix64(step ^ DROPOUT_SALT))
}

/// Elements are kept when the top 53 bits of their random number are below this.
fn keep_threshold(keep_prob: f64) -> u64 {
    (keep_prob * (1u64 << 53) as f64) as u64
}

/// Whether dropout keeps global element `index` (row-major flat index in the global tensor) of
/// the op seeded `seed`, at `step`, keeping with probability `keep_prob`.
pub fn dropout_mask_keeps(seed: u64, step: u64, keep_prob: f64, index: u64) -> bool {
    bits_at(dropout_key(seed, step), index) >> 11 < keep_threshold(keep_prob)
}

/// `out = x · mask / keep_prob` for the block of `shape` at `ctx.placement` (the whole tensor
/// when `None`).
pub(crate) fn dropout_into<T: Float>(
    x: &[T],
    out: &mut [T],
    shape: &[usize],
    keep_prob: f64,
    seed: u64,
    ctx: &EvalCtx<'_>,
) -> Result<(), GraphError> {
    if !(keep_prob > 0.0 && keep_prob <= 1.0) {
        return Err(GraphError::Attribute {
            node: ctx.node.to_string(),
            attribute: "keep_prob",
            reason: format!("must lie in (0, 1], got {keep_prob}"),
        });
    }
    let n: usize = shape.iter().product();
    for (buffer, len) in [("x", x.len()), ("out", out.len())] {
        if len != n {
            return Err(GraphError::Kernel {
                node: ctx.node.to_string(),
                source: Box::new(TensorError::BufferLength {
                    op: "dropout",
                    buffer,
                    expected: n,
                    got: len,
                }),
            });
        }
    }
    let key = dropout_key(seed, ctx.step);
    let threshold = keep_threshold(keep_prob);
    let scale = T::from_f64(1.0 / keep_prob);
    let mut apply = |local: usize, global: usize, len: usize| {
        let run = (&x[local..local + len], &mut out[local..local + len]);
        dropout_run(run, key, global as u64, (threshold, scale));
    };
    match checked_placement(ctx, shape)? {
        None => apply(0, 0, n),
        Some(placement) => {
            for_each_global_run(placement.global_shape, placement.offset, shape, apply);
        }
    }
    Ok(())
}

tensor::widest! {
    /// `out = x · mask / keep_prob` over one contiguous run of elements whose global indices
    /// start at `first` (`keep`: the threshold and `1 / keep_prob`); on the widest vector unit
    /// the CPU has (the same mask and bits).
    fn dropout_run<T>(run: (&[T], &mut [T]), key: u64, first: u64, keep: (u64, T)) => dropout_run_loop
}

/// [`dropout_run`]'s loop.
#[inline(always)]
fn dropout_run_loop<T: Float>(
    (x, out): (&[T], &mut [T]),
    key: u64,
    first: u64,
    (threshold, scale): (u64, T),
) {
    for (k, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        let keep = bits_at(key, first + k as u64) >> 11 < threshold;
        *o = if keep { v * scale } else { T::ZERO };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatched run (AVX-512 or AVX2 where the CPU has it) gives the portable loop's bits,
    /// and keeps exactly the elements [`dropout_mask_keeps`] names, from any first index.
    #[test]
    fn the_wide_run_gives_the_portable_bits_and_the_mask() {
        let (seed, step, keep_prob) = (7, 3, 0.9);
        let (key, threshold) = (dropout_key(seed, step), keep_threshold(keep_prob));
        let scale = (1.0 / keep_prob) as f32;
        let x: Vec<f32> = (0..1003).map(|i| (i % 17) as f32 - 8.0).collect();
        for first in [0u64, 5, 1 << 40] {
            let (mut wide, mut portable) = (vec![0f32; x.len()], vec![0f32; x.len()]);
            dropout_run((&x, &mut wide), key, first, (threshold, scale));
            dropout_run_loop((&x, &mut portable), key, first, (threshold, scale));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&wide), bits(&portable), "first {first}");
            for (k, (&got, &v)) in wide.iter().zip(&x).enumerate() {
                let keeps = dropout_mask_keeps(seed, step, keep_prob, first + k as u64);
                let want = if keeps { v * scale } else { 0.0 };
                assert_eq!(got.to_bits(), want.to_bits(), "element {k} from {first}");
            }
        }
    }
}
