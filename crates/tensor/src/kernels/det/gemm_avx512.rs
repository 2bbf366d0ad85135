//! Two neighbouring `f32` register tiles of the canonical-order product at once, in AVX-512.
//!
//! Twelve 16-lane accumulators hold the `6 × 16` tiles of two column panels (one register per
//! row and panel), so a step loads one row of each panel, broadcasts six elements of `A` and
//! issues twelve `vfmadd`s (one rounding each, as `f32::mul_add`). Blocks are summed in pairs:
//! the even block's accumulators stay in registers while the odd block runs (32 registers
//! hold both), and the pair joins there, so only level-one subtrees go to the stack. Lanes are
//! columns, so the bits are those of [`super::gemm`]'s portable tile.

use std::arch::x86_64::{
    __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
    _mm512_storeu_ps,
};
use std::mem::MaybeUninit;

use super::gemm::{RowTile, PASS_LEVELS, TILE_M, TILE_N};

/// Accumulator registers of the two tiles.
const REGS: usize = 2 * TILE_M;

/// Whether this CPU runs [`tiles_f32`].
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx512f")
}

/// One block's sums from zero: `block_len` steps of the rows at `ap + offsets[r]` (a step
/// apart) and of the two panels.
///
/// # Safety
/// AVX-512F; the rows and both panels hold `block_len` more steps.
#[inline(always)]
unsafe fn block(
    ap: &mut *const f32,
    (offsets, step): (&[usize; TILE_M], usize),
    bp: &mut (*const f32, *const f32),
    block_len: usize,
) -> [__m512; REGS] {
    let mut acc = [_mm512_setzero_ps(); REGS];
    for _ in 0..block_len {
        // SAFETY: the caller keeps every read inside the operands.
        unsafe {
            let b0 = _mm512_loadu_ps(bp.0);
            let b1 = _mm512_loadu_ps(bp.1);
            for r in 0..TILE_M {
                let av = _mm512_set1_ps(*ap.add(offsets[r]));
                acc[2 * r] = _mm512_fmadd_ps(av, b0, acc[2 * r]);
                acc[2 * r + 1] = _mm512_fmadd_ps(av, b1, acc[2 * r + 1]);
            }
            *ap = ap.add(step);
            *bp = (bp.0.add(TILE_N), bp.1.add(TILE_N));
        }
    }
    acc
}

/// `left + right`, register by register (`left` holds the earlier blocks).
#[inline(always)]
fn join(left: &[__m512; REGS], right: &mut [__m512; REGS]) {
    for (l, r) in left.iter().zip(right.iter_mut()) {
        // SAFETY: callers run with AVX-512F (every caller is `tiles_f32`).
        *r = unsafe { _mm512_add_ps(*l, *r) };
    }
}

/// `out` (the first `stored` of the `TILE_M` rows, each `2 · TILE_N` wide, rows `ldc` apart) ←
/// the canonical tree over `q` blocks of `block_len` of `tile_a`'s rows times `panel0` (the
/// left `TILE_N` columns) and `panel1` (the right ones), each `[q·block_len][TILE_N]`.
///
/// # Safety
/// The CPU must support AVX-512F ([`available`]).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tiles_f32(
    tile_a: &RowTile<'_, f32>,
    (panel0, panel1): (&[f32], &[f32]),
    (q, block_len): (usize, usize),
    (out, ldc, stored): (&mut [f32], usize, usize),
) {
    let steps = q * block_len;
    tile_a.check(steps);
    assert!(panel0.len() >= steps * TILE_N && panel1.len() >= steps * TILE_N);
    assert!(q.is_power_of_two() && q < 1 << PASS_LEVELS);
    let mut ap = tile_a.data.as_ptr();
    let rows = (&tile_a.offsets, tile_a.step);
    let mut bp = (panel0.as_ptr(), panel1.as_ptr());
    // Short blocks with their length known to the compiler, so their steps are unrolled. On a
    // Zen 5 EPYC the block of 16 (the GPT's k = 256 products) went from 0.68–0.76× to
    // 0.91–0.94× of `gemm` with it; 64 and 128 measured no gain.
    let root = match block_len {
        // SAFETY: the asserts above keep every read inside the operands.
        4 => unsafe { tree::<4>(q, 4, (&mut ap, rows, &mut bp)) },
        8 => unsafe { tree::<8>(q, 8, (&mut ap, rows, &mut bp)) },
        16 => unsafe { tree::<16>(q, 16, (&mut ap, rows, &mut bp)) },
        _ => unsafe { tree::<0>(q, block_len, (&mut ap, rows, &mut bp)) },
    };
    assert!((1..=TILE_M).contains(&stored));
    assert!(ldc >= 2 * TILE_N && out.len() >= (stored - 1) * ldc + 2 * TILE_N);
    for r in 0..stored {
        // SAFETY: the assert above keeps both 16-float rows inside `out`.
        unsafe {
            _mm512_storeu_ps(out.as_mut_ptr().add(r * ldc), root[2 * r]);
            _mm512_storeu_ps(out.as_mut_ptr().add(r * ldc + TILE_N), root[2 * r + 1]);
        }
    }
}

/// The canonical tree over `q` blocks of `block_len` steps (`BL` when it is not 0), from `ap`
/// and `bp` on, in registers.
///
/// # Safety
/// AVX-512F; the rows and both panels hold `q · block_len` more steps.
#[inline(always)]
unsafe fn tree<const BL: usize>(
    q: usize,
    block_len: usize,
    (ap, rows, bp): (
        &mut *const f32,
        (&[usize; TILE_M], usize),
        &mut (*const f32, *const f32),
    ),
) -> [__m512; REGS] {
    let block_len = if BL > 0 { BL } else { block_len };
    if q == 1 {
        // SAFETY: the caller keeps every read inside the operands.
        return unsafe { block(ap, rows, bp, block_len) };
    }

    // Level `l` (≥ 1) is written before it is read: the counter joins only levels it filled.
    let mut stack = [MaybeUninit::<[__m512; REGS]>::uninit(); PASS_LEVELS];
    for pair in 0..q / 2 {
        // SAFETY: as above.
        let left = unsafe { block(ap, rows, bp, block_len) };
        let mut sum = unsafe { block(ap, rows, bp, block_len) };
        join(&left, &mut sum);
        // Pairs 0..=pair done: join while the counter carries.
        let mut level = 1;
        let mut done = pair + 1;
        while done % 2 == 0 {
            // SAFETY: a carry at `level` means pairs filled it (see above).
            join(unsafe { stack[level].assume_init_ref() }, &mut sum);
            done /= 2;
            level += 1;
        }
        stack[level].write(sum);
    }
    // SAFETY: after `q / 2` (a power of two) pairs the counter holds one subtree, at the top.
    unsafe { stack[q.trailing_zeros() as usize].assume_init_read() }
}
