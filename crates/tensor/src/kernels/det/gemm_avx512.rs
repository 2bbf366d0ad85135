//! `P` neighbouring `f32` register tiles of the canonical-order product at once, in AVX-512.
//!
//! `6 · P` 16-lane accumulators hold the `6 × 16` tiles of `P` column panels (one register per
//! row and panel), so a step loads one row of each panel, broadcasts six elements of `A` and
//! issues `6 · P` `vfmadd`s (one rounding each, as `f32::mul_add`). Blocks are summed in pairs
//! (see [`tree`]). Lanes are columns, so the bits are those of [`super::gemm`]'s portable tile.
//!
//! The loops over rows and panels are plain index loops on purpose: the compiler unrolls them
//! and keeps every accumulator in a register. Iterator chains over the nested arrays (a
//! flattening one measured) kept the accumulators in memory, stored at every step, and ran
//! the kernel at half speed.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::{
    __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
    _mm512_storeu_ps,
};
use std::mem::MaybeUninit;

use super::gemm::{RowTile, Steps, PASS_LEVELS, TILE_M, TILE_N};

/// The accumulators of `P` neighbouring tiles: one register per row and panel.
type Acc<const P: usize> = [[__m512; P]; TILE_M];

/// Whether this CPU runs [`tiles_f32`].
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx512f")
}

/// One block's sums from `acc` on (zeros, or the sums a resumed chain continues):
/// `block_len` steps of the rows at `ap + offsets[r]` (a step apart) and of the `P` panels.
///
/// # Safety
/// AVX-512F; the rows and every panel hold `block_len` more steps.
#[inline(always)]
unsafe fn block<const P: usize>(
    ap: &mut *const f32,
    (offsets, step): (&[usize; TILE_M], usize),
    bp: &mut [*const f32; P],
    block_len: usize,
    mut acc: Acc<P>,
) -> Acc<P> {
    for _ in 0..block_len {
        // SAFETY: the caller keeps every read inside the operands.
        unsafe {
            let mut b = [_mm512_setzero_ps(); P];
            for p in 0..P {
                b[p] = _mm512_loadu_ps(bp[p]);
            }
            for r in 0..TILE_M {
                let av = _mm512_set1_ps(*ap.add(offsets[r]));
                for p in 0..P {
                    acc[r][p] = _mm512_fmadd_ps(av, b[p], acc[r][p]);
                }
            }
            *ap = ap.add(step);
            for p in 0..P {
                bp[p] = bp[p].add(TILE_N);
            }
        }
    }
    acc
}

/// `left + right`, register by register (`left` holds the earlier blocks).
#[inline(always)]
fn join<const P: usize>(left: &Acc<P>, right: &mut Acc<P>) {
    for r in 0..TILE_M {
        for p in 0..P {
            // SAFETY: callers run with AVX-512F (every caller is `tiles_f32`).
            right[r][p] = unsafe { _mm512_add_ps(left[r][p], right[r][p]) };
        }
    }
}

/// `out` (the first `stored` of the `TILE_M` rows, each `P · TILE_N` wide, rows `ldc` apart) ←
/// the canonical tree over `steps.q` blocks of `steps.block_len` of `tile_a`'s rows times the
/// `P` panels (left to right), each `[q·block_len][TILE_N]`; with `steps.resume` (one block)
/// the chains continue from the sums `out` holds.
///
/// # Safety
/// The CPU must support AVX-512F ([`available`]).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tiles_f32<const P: usize>(
    tile_a: &RowTile<'_, f32>,
    panels: [&[f32]; P],
    steps: Steps,
    (out, ldc, stored): (&mut [f32], usize, usize),
) {
    let Steps { q, block_len, .. } = steps;
    tile_a.check(q * block_len);
    assert!(panels
        .iter()
        .all(|panel| panel.len() >= q * block_len * TILE_N));
    assert!(q.is_power_of_two() && q < 1 << PASS_LEVELS);
    assert!((1..=TILE_M).contains(&stored));
    assert!(ldc >= P * TILE_N && out.len() >= (stored - 1) * ldc + P * TILE_N);
    assert!(!steps.resume || q == 1, "a resumed chain is one block");
    let mut ap = tile_a.data.as_ptr();
    let rows = (&tile_a.offsets, tile_a.step);
    let mut bp = panels.map(<[f32]>::as_ptr);
    let mut start = [[_mm512_setzero_ps(); P]; TILE_M];
    if steps.resume {
        for r in 0..stored {
            for p in 0..P {
                // SAFETY: the assert above keeps every 16-float run inside `out`.
                start[r][p] = unsafe { _mm512_loadu_ps(out.as_ptr().add(r * ldc + p * TILE_N)) };
            }
        }
    }
    let from = (&mut ap, rows, &mut bp);
    // Short blocks with their length known to the compiler, so their steps are unrolled. On a
    // Zen 5 EPYC the block of 16 (the GPT's k = 256 products) went from 0.68–0.76× to
    // 0.91–0.94× of `gemm` with it; 64 and 128 measured no gain.
    let root = match block_len {
        // SAFETY: the asserts above keep every read inside the operands.
        4 => unsafe { tree::<4, P>(q, 4, from, start) },
        8 => unsafe { tree::<8, P>(q, 8, from, start) },
        16 => unsafe { tree::<16, P>(q, 16, from, start) },
        _ => unsafe { tree::<0, P>(q, block_len, from, start) },
    };
    for r in 0..stored {
        for p in 0..P {
            // SAFETY: the assert above keeps every 16-float run inside `out`.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(r * ldc + p * TILE_N), root[r][p]) };
        }
    }
}

/// The canonical tree over `q` blocks of `block_len` steps (`BL` when it is not 0), from `ap`
/// and `bp` on; one block starts from `start` (zeros, or a resumed chain's sums), more from
/// zeros. Blocks are summed in pairs: the even block's sums are kept (in registers for two
/// panels; the compiler spills what does not fit) while the odd block runs, and the pair joins
/// there, so only level-one subtrees go to the stack.
///
/// # Safety
/// AVX-512F; the rows and every panel hold `q · block_len` more steps.
#[inline(always)]
unsafe fn tree<const BL: usize, const P: usize>(
    q: usize,
    block_len: usize,
    (ap, rows, bp): (
        &mut *const f32,
        (&[usize; TILE_M], usize),
        &mut [*const f32; P],
    ),
    start: Acc<P>,
) -> Acc<P> {
    let block_len = if BL > 0 { BL } else { block_len };
    if q == 1 {
        // SAFETY: the caller keeps every read inside the operands.
        return unsafe { block(ap, rows, bp, block_len, start) };
    }

    // Level `l` (≥ 1) is written before it is read: the counter joins only levels it filled.
    let mut stack = [MaybeUninit::<Acc<P>>::uninit(); PASS_LEVELS];
    // SAFETY: callers run with AVX-512F (every caller is `tiles_f32`).
    let zero = unsafe { [[_mm512_setzero_ps(); P]; TILE_M] };
    for pair in 0..q / 2 {
        // SAFETY: as above.
        let left = unsafe { block(ap, rows, bp, block_len, zero) };
        let mut sum = unsafe { block(ap, rows, bp, block_len, zero) };
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
