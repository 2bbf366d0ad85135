//! The fused attention's tile products, `C (β)= α·op(A)·B` on 32–64 rows × 64 columns × 32–128
//! steps, on AVX-512 register tiles that read both operands where they lie (no packing).
//!
//! Every output is one fused multiply-add chain over the reduction in order, from zero, finished
//! as the `gemm` crate finishes its tiles (`α·P` without reading `C`, `α·P + C` in one fused
//! multiply-add when `β = 1`, `β·C + α·P` otherwise): the bits of
//! [`gemm_strided`](crate::kernels::matmul::gemm_strided) wherever that runs the `gemm` crate,
//! the only shapes this path takes (its test holds it to them), whatever the call's size. So
//! the packed and the transposing attentions and a context-parallel ring's blocks agree, and a
//! CPU without AVX-512 computes the same bits through `gemm_strided`. Other element types, a
//! transposed `B`, a reduction longer than [`MAX_STEPS`] or a shape `gemm_strided` gives
//! another library (a transposed `A` of 2 to 24 columns) go to `gemm_strided`.

use crate::error::TensorError;
use crate::kernels::float::{same, same_mut, Float};
use crate::kernels::matmul::{
    check_strided, gemm_strided, strided_backend, GemmBackend, GemmShape,
};

/// The longest reduction the register tiles take: the `gemm` crate keeps such a chain in one
/// block, so one chain gives its bits.
const MAX_STEPS: usize = 128;

/// `C (β)= α·op(A)·B` on row-major operands whose rows lie `lda`, `ldb`, `ldc` apart (as
/// [`gemm_strided`], whose bits it gives; `B` not transposed).
pub(super) fn tile_product<T: Float>(
    shape: GemmShape,
    alpha: T,
    (a, lda): (&[T], usize),
    (b, ldb): (&[T], usize),
    beta: T,
    (c, ldc): (&mut [T], usize),
) -> Result<(), TensorError> {
    #[cfg(target_arch = "x86_64")]
    {
        let GemmShape { m, n, k, .. } = shape;
        // Only where `gemm_strided` runs the `gemm` crate, whose bits the tiles give: so every
        // CPU computes an attention output alike, with or without AVX-512.
        let takes = !shape.trans_b
            && m > 0
            && n > 0
            && (1..=MAX_STEPS).contains(&k)
            && strided_backend(&shape) == GemmBackend::Gemm;
        if takes && avx512::available() {
            if let (Some(a32), Some(b32), Some(c32)) = (
                same::<T, f32>(a),
                same::<T, f32>(b),
                same_mut::<T, f32>(&mut *c),
            ) {
                const OP: &str = "attention tile product";
                check_strided(OP, &shape, (a.len(), lda), (b.len(), ldb), (c32.len(), ldc))?;
                let (alpha, beta) = (alpha.to_f64() as f32, beta.to_f64() as f32);
                let (a_rs, a_cs) = if shape.trans_a { (1, lda) } else { (lda, 1) };
                let operands = avx512::Operands {
                    a: a32.as_ptr(),
                    a_strides: (a_rs, a_cs),
                    b: b32.as_ptr(),
                    ldb,
                    c: c32.as_mut_ptr(),
                    ldc,
                };
                // SAFETY: the CPU has AVX-512F; `check_strided` found every row of each
                // operand inside its slice at its stride, which is all the kernel addresses.
                unsafe { avx512::product((m, n, k), alpha, beta, &operands) };
                return Ok(());
            }
        }
    }
    gemm_strided(shape, alpha, (a, lda), (b, ldb), beta, (c, ldc))
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The register tiles: up to 6 rows × 4 panels of 16 columns, 24 accumulators; each step
    //! loads one row of `B`'s panels, broadcasts six elements of `op(A)` and issues 24
    //! `vfmadd`s. A last panel narrower than 16 columns is loaded and stored under a mask.
    //!
    //! Measured against the `gemm` crate on the packed attention of the GPT benchmark
    //! (`cargo bench -p tessera-tensor --bench attention`, AMD Zen 4): backward 5.42–5.58 ms
    //! against 5.83–6.08, forward 2.67–2.74 against 2.74–2.79; tiles of 4 rows were slower
    //! forward (2.84–2.89). The crate packs both operands for every call, which a 64 × 64 × 64
    //! product does not repay.
    #![allow(clippy::needless_range_loop)]

    use std::arch::x86_64::{
        __m512, __mmask16, _mm512_add_ps, _mm512_fmadd_ps, _mm512_mask_storeu_ps,
        _mm512_maskz_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps,
    };

    /// Rows of a register tile.
    const ROWS: usize = 6;
    /// Columns of a panel (lanes of a register).
    const LANES: usize = 16;
    /// Panels of a register tile.
    const PANELS: usize = 4;

    /// Whether this CPU runs [`product`].
    pub(super) fn available() -> bool {
        std::is_x86_feature_detected!("avx512f")
    }

    /// Where a product's operands lie: `op(A)[i][s]` at `a + i·a_strides.0 + s·a_strides.1`,
    /// `B[s][j]` at `b + s·ldb + j`, `C[i][j]` at `c + i·ldc + j`.
    pub(super) struct Operands {
        pub(super) a: *const f32,
        pub(super) a_strides: (usize, usize),
        pub(super) b: *const f32,
        pub(super) ldb: usize,
        pub(super) c: *mut f32,
        pub(super) ldc: usize,
    }

    /// How a tile's sums are finished into `C`.
    #[derive(Clone, Copy)]
    struct Finish {
        alpha: f32,
        beta: f32,
    }

    /// `C (β)= α·op(A)·B` for `(m, n, k)`, `k ≥ 1`.
    ///
    /// # Safety
    /// AVX-512F; every element of the `m × k`, `k × n` and `m × n` matrices at the strides of
    /// `operands` lies inside its allocation.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn product(
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        beta: f32,
        operands: &Operands,
    ) {
        let finish = Finish { alpha, beta };
        let mut j0 = 0;
        while j0 < n {
            let cols = (n - j0).min(PANELS * LANES);
            let tail = cols % LANES;
            let mask: __mmask16 = if tail == 0 { !0 } else { (1u16 << tail) - 1 };
            // SAFETY: the columns `j0 .. j0 + cols` lie inside `B` and `C`.
            unsafe {
                match cols.div_ceil(LANES) {
                    4 => rows::<4>((m, k), j0, mask, finish, operands),
                    3 => rows::<3>((m, k), j0, mask, finish, operands),
                    2 => rows::<2>((m, k), j0, mask, finish, operands),
                    _ => rows::<1>((m, k), j0, mask, finish, operands),
                }
            }
            j0 += cols;
        }
    }

    /// Every row of the `P` panels from column `j0` (the last one's lanes under `mask`).
    #[inline(always)]
    unsafe fn rows<const P: usize>(
        (m, k): (usize, usize),
        j0: usize,
        mask: __mmask16,
        finish: Finish,
        operands: &Operands,
    ) {
        let mut i0 = 0;
        // SAFETY: rows `i0 ..` of the tile lie inside the product (the caller's columns).
        unsafe {
            while i0 + ROWS <= m {
                tile::<ROWS, P>((i0, j0), k, mask, finish, operands);
                i0 += ROWS;
            }
            match m - i0 {
                5 => tile::<5, P>((i0, j0), k, mask, finish, operands),
                4 => tile::<4, P>((i0, j0), k, mask, finish, operands),
                3 => tile::<3, P>((i0, j0), k, mask, finish, operands),
                2 => tile::<2, P>((i0, j0), k, mask, finish, operands),
                1 => tile::<1, P>((i0, j0), k, mask, finish, operands),
                _ => {}
            }
        }
    }

    /// The `R × (P·16)` tile at `(i0, j0)`: `k` steps of fused multiply-adds from zero, then
    /// finished into `C` (the last panel's lanes under `mask`).
    ///
    /// The loops are plain index loops over constant bounds on purpose, as in the canonical
    /// product's tiles: the compiler unrolls them and keeps every accumulator in a register.
    #[inline(always)]
    unsafe fn tile<const R: usize, const P: usize>(
        (i0, j0): (usize, usize),
        k: usize,
        mask: __mmask16,
        finish: Finish,
        operands: &Operands,
    ) {
        let (a_rs, a_cs) = operands.a_strides;
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        // SAFETY: the caller keeps rows `i0 .. i0 + R`, columns `j0 .. j0 + 16·P` (the last
        // panel's masked) and `k` steps inside the operands.
        unsafe {
            let mut a_rows = [operands.a; R];
            for r in 0..R {
                a_rows[r] = operands.a.add((i0 + r) * a_rs);
            }
            let mut b_row = operands.b.add(j0);
            for _ in 0..k {
                let mut b = [_mm512_setzero_ps(); P];
                for p in 0..P {
                    let lanes = if p + 1 == P { mask } else { !0 };
                    b[p] = _mm512_maskz_loadu_ps(lanes, b_row.add(p * LANES));
                }
                for r in 0..R {
                    let a = _mm512_set1_ps(*a_rows[r]);
                    for p in 0..P {
                        acc[r][p] = _mm512_fmadd_ps(a, b[p], acc[r][p]);
                    }
                    a_rows[r] = a_rows[r].add(a_cs);
                }
                b_row = b_row.add(operands.ldb);
            }
            let (alpha, beta) = (_mm512_set1_ps(finish.alpha), _mm512_set1_ps(finish.beta));
            for r in 0..R {
                let row = operands.c.add((i0 + r) * operands.ldc + j0);
                for p in 0..P {
                    let lanes = if p + 1 == P { mask } else { !0 };
                    let out = row.add(p * LANES);
                    let sum: __m512 = acc[r][p];
                    let value = if finish.beta == 0.0 {
                        _mm512_mul_ps(alpha, sum)
                    } else if finish.beta == 1.0 {
                        _mm512_fmadd_ps(alpha, sum, _mm512_maskz_loadu_ps(lanes, out))
                    } else {
                        let old = _mm512_maskz_loadu_ps(lanes, out);
                        _mm512_add_ps(_mm512_mul_ps(beta, old), _mm512_mul_ps(alpha, sum))
                    };
                    _mm512_mask_storeu_ps(out, lanes, value);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The register tiles give `gemm_strided`'s bits wherever it runs the `gemm` crate's tiled
    /// kernels: on the attention's shapes and on odd ones (every row remainder of the 6-row
    /// tiles, column tails, strided and transposed `A`, every finish, a transposed `A` of 9
    /// columns, which both give the `matrixmultiply` crate), f32 and f64.
    #[test]
    fn the_tiles_give_gemm_strideds_bits() {
        fn check<T: Float>() {
            let value = |i: usize| T::from_f64(((i * 37) % 101) as f64 / 13.0 - 3.5);
            let shapes = [
                (64, 64, 64, false),
                (32, 64, 64, false),
                (32, 32, 64, false),
                (64, 64, 32, true),
                (32, 64, 64, true),
                (37, 45, 9, false),
                (45, 9, 37, false),
                (45, 9, 37, true),
                (45, 25, 37, true),
                (3, 70, 128, false),
                (5, 1, 1, false),
                (1, 17, 2, false),
                (11, 64, 64, false),
                (9, 64, 129, false),
            ];
            for (m, n, k, trans_a) in shapes {
                let shape = GemmShape {
                    m,
                    n,
                    k,
                    trans_a,
                    trans_b: false,
                };
                let (a_rows, a_cols) = if trans_a { (k, m) } else { (m, k) };
                let (lda, ldb, ldc) = (a_cols + 3, n + 5, n + 2);
                let a: Vec<T> = (0..a_rows * lda).map(value).collect();
                let b: Vec<T> = (0..k * ldb).map(|i| value(i + 7)).collect();
                let c0: Vec<T> = (0..m * ldc).map(|i| value(i + 11)).collect();
                let alpha = T::from_f64(0.3);
                for beta in [T::ZERO, T::ONE, T::from_f64(0.5)] {
                    let (mut ours, mut theirs) = (c0.clone(), c0.clone());
                    tile_product(shape, alpha, (&a, lda), (&b, ldb), beta, (&mut ours, ldc))
                        .unwrap();
                    gemm_strided(shape, alpha, (&a, lda), (&b, ldb), beta, (&mut theirs, ldc))
                        .unwrap();
                    let bits = |v: &[T]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&ours),
                        bits(&theirs),
                        "{shape:?}, beta {}",
                        beta.to_f64()
                    );
                }
            }
        }
        check::<f32>();
        check::<f64>();
    }

    /// An output's bits do not depend on the call it is computed in: every block of rows and
    /// columns computed alone (the operands' slices offset to it) gives the bits it has inside
    /// the whole product, for narrow and wide, plain and transposed `A` and every finish (a
    /// single row or column included). This
    /// is what the attention needs: a band, a shorter last tile or a context-parallel rank's
    /// block computes each of its outputs as one call over the whole tile does.
    #[test]
    fn an_outputs_bits_do_not_depend_on_the_call() {
        let value = |i: usize| ((i * 37) % 101) as f32 / 13.0 - 3.5;
        for (m, n, k, trans_a) in [(37, 45, 29, false), (37, 45, 29, true), (40, 9, 64, false)] {
            let shape = GemmShape {
                m,
                n,
                k,
                trans_a,
                trans_b: false,
            };
            let (a_rows, a_cols) = if trans_a { (k, m) } else { (m, k) };
            let (lda, ldb, ldc) = (a_cols + 1, n + 3, n + 2);
            let a: Vec<f32> = (0..a_rows * lda).map(value).collect();
            let b: Vec<f32> = (0..k * ldb).map(|i| value(i + 7)).collect();
            let c0: Vec<f32> = (0..m * ldc).map(|i| value(i + 11)).collect();
            for beta in [0.0, 1.0, 0.5] {
                let mut whole = c0.clone();
                tile_product(shape, 0.3, (&a, lda), (&b, ldb), beta, (&mut whole, ldc)).unwrap();
                // Blocks of more than 24 columns when `A` is transposed: `gemm_strided` gives
                // narrower ones to the `matrixmultiply` crate, which sums in its own way.
                let blocks = [
                    (0..m, 0..n),
                    (5..12, 3..n),
                    (m - 1..m, 0..n.min(30)),
                    (1..7, n.min(8)..n),
                ];
                for (rows, cols) in blocks {
                    let mut part = c0.clone();
                    let a_at = if trans_a {
                        rows.start
                    } else {
                        rows.start * lda
                    };
                    let sub = GemmShape {
                        m: rows.len(),
                        n: cols.len(),
                        ..shape
                    };
                    tile_product(
                        sub,
                        0.3,
                        (&a[a_at..], lda),
                        (&b[cols.start..], ldb),
                        beta,
                        (&mut part[rows.start * ldc + cols.start..], ldc),
                    )
                    .unwrap();
                    for i in rows.clone() {
                        for j in cols.clone() {
                            let (got, want) = (part[i * ldc + j], whole[i * ldc + j]);
                            assert_eq!(got.to_bits(), want.to_bits(), "({i}, {j}) of {sub:?}");
                        }
                    }
                }
            }
        }
    }

    /// A slice too short for its rows is refused, as by `gemm_strided`.
    #[test]
    fn operands_too_short_are_refused() {
        let shape = GemmShape::new(4, 16, 8);
        let (a, b, mut c) = (
            vec![0f32; 4 * 8 - 1],
            vec![0f32; 8 * 16],
            vec![0f32; 4 * 16],
        );
        let err = tile_product(shape, 1.0, (&a, 8), (&b, 16), 0.0, (&mut c, 16)).unwrap_err();
        assert!(err.to_string().contains("`a`"), "{err}");
    }
}
