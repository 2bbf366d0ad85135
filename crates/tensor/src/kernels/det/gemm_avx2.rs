//! The `f32` register tile of the canonical-order product in AVX2 and FMA intrinsics.
//!
//! Twelve 8-lane accumulators hold a `6 × 16` tile; a block's sums run from zero in `k` order,
//! one `vfmadd` (a single rounding, as `f32::mul_add`) per element and step, and finished
//! blocks join the canonical tree through a binary-counter stack. Lanes are columns, so the
//! SIMD width never touches an element's order: the bits are those of
//! [`super::gemm`]'s portable tile.

use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_loadu_ps,
    _mm256_setzero_ps, _mm256_storeu_ps,
};

use std::mem::MaybeUninit;

use super::gemm::{RowTile, Steps, PASS_LEVELS, TILE_M, TILE_N};

/// Accumulator registers of a tile.
const REGS: usize = TILE_M * TILE_N / 8;

/// Whether this CPU runs [`tile_f32`].
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// `out` (`[TILE_M][TILE_N]`) ← the canonical tree over `steps.q` blocks of `steps.block_len`
/// of `tile_a`'s rows times `panel` (`[q·block_len][TILE_N]`); with `steps.resume` (one block)
/// the chains continue from the sums `out` holds.
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`available`]).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_f32(
    tile_a: &RowTile<'_, f32>,
    panel: &[f32],
    steps: Steps,
    out: &mut [f32; TILE_M * TILE_N],
) {
    let Steps { q, block_len, .. } = steps;
    tile_a.check(q * block_len);
    assert!(panel.len() >= q * block_len * TILE_N);
    assert!(q.is_power_of_two() && q < 1 << PASS_LEVELS);
    assert!(!steps.resume || q == 1, "a resumed chain is one block");
    // Level `l` is written before it is read: the binary counter joins only levels it filled.
    let mut stack = [MaybeUninit::<[__m256; REGS]>::uninit(); PASS_LEVELS];
    let (mut ap, mut bp) = (tile_a.data.as_ptr(), panel.as_ptr());
    let (offsets, step) = (tile_a.offsets, tile_a.step);
    for blk in 0..q {
        let mut acc: [__m256; REGS] = [_mm256_setzero_ps(); REGS];
        if steps.resume {
            for (i, v) in acc.iter_mut().enumerate() {
                // SAFETY: `out` holds REGS × 8 floats.
                *v = unsafe { _mm256_loadu_ps(out.as_ptr().add(8 * i)) };
            }
        }
        for _ in 0..block_len {
            // SAFETY: the assert above keeps every read inside the operands.
            unsafe {
                let b0 = _mm256_loadu_ps(bp);
                let b1 = _mm256_loadu_ps(bp.add(8));
                for r in 0..TILE_M {
                    let av = _mm256_broadcast_ss(&*ap.add(offsets[r]));
                    acc[2 * r] = _mm256_fmadd_ps(av, b0, acc[2 * r]);
                    acc[2 * r + 1] = _mm256_fmadd_ps(av, b1, acc[2 * r + 1]);
                }
                ap = ap.add(step);
                bp = bp.add(TILE_N);
            }
        }
        // Blocks 0..=blk done: join while the counter carries (left operand = earlier blocks).
        let mut level = 0;
        let mut done = blk + 1;
        while done % 2 == 0 {
            // SAFETY: a carry at `level` means blocks filled it (see above).
            let left = unsafe { stack[level].assume_init_ref() };
            for (l, r) in left.iter().zip(acc.iter_mut()) {
                *r = _mm256_add_ps(*l, *r);
            }
            done /= 2;
            level += 1;
        }
        stack[level].write(acc);
    }
    // SAFETY: after `q` (a power of two) blocks the counter holds one subtree, at the top.
    let root = unsafe { stack[q.trailing_zeros() as usize].assume_init_ref() };
    for (i, v) in root.iter().enumerate() {
        // SAFETY: `out` holds REGS × 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * i), *v) };
    }
}
