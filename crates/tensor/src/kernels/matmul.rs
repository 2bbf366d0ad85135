//! Matrix products: the slice-level [`gemm`](fn@gemm) (C ← α·op(A)·op(B) + β·C), the 2-D
//! [`matmul`](fn@matmul) and the broadcasting [`batch_matmul`].
//!
//! Two libraries and the engine's own register tiles do the arithmetic, single-threaded by
//! default (a rank owns one core; parallelism comes from ranks, unless `train.threads_per_rank`
//! lets a large product use more threads: [`super::threads`]): the `gemm` crate, built with its
//! AVX-512 (`x86-v4`) kernels, `matrixmultiply`, and [`GemmBackend::Tiles`] (deterministic
//! mode's tile kernel, one chain per output, with a bias epilogue: [`gemm_bias`]); the `gemm`
//! crate is also used through a column-major output buffer for skinny transposed-B products.
//! [`GemmBackend::for_shape`] routes each shape class, on each kind of CPU ([`TileCpu`]), to the
//! fastest, with the measurements behind the rule beside it. All read row-major operands with
//! either one transposed by strides: no transposed copy is made.

use std::borrow::Cow;

use crate::error::TensorError;
use crate::kernels::broadcast::{broadcast_shape, broadcast_strides};
use crate::kernels::check;
use crate::kernels::det;
use crate::kernels::float::{with_float, Float};
use crate::kernels::permute::transpose_into;
use crate::tensor::Tensor;

/// The shape of one product `C[m, n] = op(A)·op(B)` of row-major contiguous matrices.
///
/// `A` is stored `[m, k]`, or `[k, m]` when `trans_a`; `B` is stored `[k, n]`, or `[n, k]` when
/// `trans_b`; `C` is stored `[m, n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Rows of `C`.
    pub m: usize,
    /// Columns of `C`.
    pub n: usize,
    /// The contracted dim.
    pub k: usize,
    /// `A` is stored `[k, m]` and used transposed.
    pub trans_a: bool,
    /// `B` is stored `[n, k]` and used transposed.
    pub trans_b: bool,
}

impl GemmShape {
    /// A product with neither operand transposed.
    pub fn new(m: usize, n: usize, k: usize) -> GemmShape {
        GemmShape {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
        }
    }

    /// Floating-point operations of the product (`2·m·n·k`).
    pub fn flops(&self) -> u64 {
        2 * self.m as u64 * self.n as u64 * self.k as u64
    }

    /// (row stride, column stride) of `A` as an `m×k` matrix.
    pub fn a_strides(&self) -> (isize, isize) {
        if self.trans_a {
            (1, self.m as isize)
        } else {
            (self.k as isize, 1)
        }
    }

    /// (row stride, column stride) of `B` as a `k×n` matrix.
    pub fn b_strides(&self) -> (isize, isize) {
        if self.trans_b {
            (1, self.k as isize)
        } else {
            (self.n as isize, 1)
        }
    }
}

/// Which library multiplies, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmBackend {
    /// The `gemm` crate (AVX-512 microkernels when the CPU has avx512f, AVX2/FMA otherwise),
    /// writing `C` in place.
    Gemm,
    /// The `gemm` crate writing `C` in column-major order (i.e. `Cᵀ` row-major) to a scratch
    /// buffer, then a blocked transpose into `C`. For a short, wide `C` with a transposed `B`
    /// this lets the crate pack the small `A` instead of transposing the large `B` while packing.
    GemmColumnMajor,
    /// The `matrixmultiply` crate (AVX2/FMA microkernels).
    MatrixMultiply,
    /// The engine's own register tiles: [`super::det`]'s canonical product with the whole
    /// reduction as one block. Every output is one fused multiply-add chain over the reduction
    /// in order, whatever the product's size or the rows a thread takes; `A` is read in place
    /// (a transposed one packed), `B` packed into 16-column panels, tiles of 6 rows × 64
    /// columns summed in registers ([`super::det`]'s AVX-512, AVX2 or portable tile).
    Tiles,
}

impl GemmBackend {
    /// Every backend, for benchmarks and tests.
    pub const ALL: [GemmBackend; 4] = [
        GemmBackend::Gemm,
        GemmBackend::GemmColumnMajor,
        GemmBackend::MatrixMultiply,
        GemmBackend::Tiles,
    ];

    /// The backend [`gemm`](fn@gemm) uses for `shape`:
    /// - [`GemmColumnMajor`](GemmBackend::GemmColumnMajor) for a transposed `B` with few rows
    ///   (m ≤ 128), a long contraction (k ≥ 128) and a wide output (n ≥ 32);
    /// - [`MatrixMultiply`](GemmBackend::MatrixMultiply) for a transposed `A` with a narrow
    ///   output (2 ≤ n ≤ 24);
    /// - [`Gemm`](GemmBackend::Gemm) for everything else.
    //
    // Evidence: f32, one thread, Xeon @ 2.5 GHz with AVX-512, backends timed interleaved over
    // 40–100 rounds, "median/best" GFLOP/s; `benches/matmul.rs` has the MLP shapes. The machine
    // was shared (load 7–11 on 2 cores): absolute figures are low, the comparison is fair.
    // - transposed B, m ≤ 128, k ≥ 128 — column-major output wins (gemm vs column-major):
    //   32×784×512 (the MLP's fc1 dX) 23/26 vs 49/52, 32×512×512 27/32 vs 50/81,
    //   32×512×784 35/45 vs 53/90, 128×784×512 44/50 vs 57/81, 8×512×512 8.5/9.8 vs 18/28,
    //   32×512×128 35/40 vs 39/48; also with A transposed, 32×784×512 23/25 vs 52/58.
    //   It loses for short contractions (32×512×10, fc3 dX: 29/46 vs 7/13; 32×512×64 38/46 vs
    //   29/39), tall C (512×512×512 57/106 vs 47/80), narrow C (512×10×512 22/26 vs 10/11) and
    //   whenever B is not transposed (32×512×784 fwd 39/43 vs 36/39; 784×512×32 dW 80/93 vs
    //   29/31).
    // - transposed A, 2 ≤ n ≤ 24 — matrixmultiply wins (gemm vs matrixmultiply, best):
    //   512×10×32 (fc3 dW) 24 vs 29, 512×8×64 25 vs 33, 512×16×32 50 vs 73, 512×10×512 14 vs
    //   25, 512×24×32 49.5 vs 52, with B also transposed 24 vs 31. Not at n = 1 (gemm's
    //   matrix-vector path: 21 vs 4) nor from n = 32 (87.6 vs 87.8) nor for wide products
    //   (784×512×32 fc1 dW 107 vs 100).
    // - everything else — gemm wins or ties against matrixmultiply: 32×512×784 fc1 fwd 66 vs 55,
    //   32×10×512 fc3 fwd 22 vs 9, 32×512×10 fc3 dX 47.5 vs 25, 512×10×32 no transpose 26 vs 9.
    //   (An earlier measurement elsewhere favoured matrixmultiply for skinny transposed-B shapes;
    //   on this machine gemm beats it there, and the column-major route beats both.)
    pub fn for_shape(shape: &GemmShape) -> GemmBackend {
        GemmBackend::for_shape_on(shape, TileCpu::here())
    }

    /// [`for_shape`](GemmBackend::for_shape) on a CPU of kind `cpu`: first
    /// [`Tiles`](GemmBackend::Tiles) where [`TileCpu::tiles_win`] says they were measured
    /// faster, then the rules above.
    pub fn for_shape_on(shape: &GemmShape, cpu: TileCpu) -> GemmBackend {
        let GemmShape { m, n, k, .. } = *shape;
        if cpu.tiles_win(shape) {
            GemmBackend::Tiles
        } else if shape.trans_b && m <= 128 && k >= 128 && n >= 32 {
            GemmBackend::GemmColumnMajor
        } else if shape.trans_a && (2..=24).contains(&n) {
            GemmBackend::MatrixMultiply
        } else {
            GemmBackend::Gemm
        }
    }

    /// The backend's short name (`gemm`, `gemm_colmajor`, `matrixmultiply`, `tiles`).
    pub fn name(self) -> &'static str {
        match self {
            GemmBackend::Gemm => "gemm",
            GemmBackend::GemmColumnMajor => "gemm_colmajor",
            GemmBackend::MatrixMultiply => "matrixmultiply",
            GemmBackend::Tiles => "tiles",
        }
    }
}

/// The kind of CPU, as far as the choice between the `gemm` crate and the engine's own tiles
/// ([`GemmBackend::Tiles`]) goes: they were measured against each other per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TileCpu {
    /// An AMD CPU with AVX-512 (Zen 4 and later).
    AmdAvx512,
    /// Any other: an Intel CPU, or one without AVX-512.
    Other,
}

impl TileCpu {
    /// This machine's kind (read once).
    pub fn here() -> TileCpu {
        static KIND: std::sync::OnceLock<TileCpu> = std::sync::OnceLock::new();
        *KIND.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                // CPUID leaf 0 (the vendor string) exists on every x86-64 CPU.
                let id = std::arch::x86_64::__cpuid(0);
                let amd = (id.ebx, id.edx, id.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
                if amd && std::is_x86_feature_detected!("avx512f") {
                    return TileCpu::AmdAvx512;
                }
            }
            TileCpu::Other
        })
    }

    /// Whether [`GemmBackend::Tiles`] runs `shape` faster than the `gemm` crate on this kind
    /// of CPU: on an AMD CPU with AVX-512, a product with at least 64 columns and 64 reduction
    /// steps, and at least 256 rows when `A` is read in place, 1,024 when it is transposed (and
    /// packed: a weight gradient with as many output features).
    //
    // Evidence: `cargo bench -p tessera-tensor --bench gpt_backends` (one thread, caches
    // flushed before every product); see `docs/PERFORMANCE.md`, "The engine's own tiles for
    // the ordinary products".
    pub fn tiles_win(self, shape: &GemmShape) -> bool {
        let GemmShape { m, n, k, .. } = *shape;
        let rows = if shape.trans_a { 1024 } else { 256 };
        self == TileCpu::AmdAvx512 && m >= rows && n >= 64 && k >= 64
    }
}

/// `C ← α·op(A)·op(B) + β·C` on row-major slices, routed to the faster backend for the shape.
///
/// With `beta == 0` the previous contents of `c` are not read (NaNs there do not propagate);
/// `beta == 1` accumulates, e.g. a weight gradient over micro-batches.
pub fn gemm<T: Float>(
    shape: GemmShape,
    alpha: T,
    a: &[T],
    b: &[T],
    beta: T,
    c: &mut [T],
) -> Result<(), TensorError> {
    gemm_with(GemmBackend::for_shape(&shape), shape, alpha, a, b, beta, c)
}

/// `C ← op(A)·op(B) + bias`, `bias` (`n` elements) added to every row of `C`: the bits of
/// [`gemm`](fn@gemm) followed by [`super::bias_add_in_place`]. On the
/// [`Tiles`](GemmBackend::Tiles) route the bias is added to each register tile as it is
/// stored, while it is in L1 (a fused epilogue: no second pass over `C`); on the others after
/// the product.
pub fn gemm_bias<T: Float>(
    shape: GemmShape,
    a: &[T],
    b: &[T],
    bias: &[T],
    c: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "gemm_bias";
    let GemmShape { m, n, k, .. } = shape;
    check::buffer_len(OP, "a", m * k, a.len())?;
    check::buffer_len(OP, "b", k * n, b.len())?;
    check::buffer_len(OP, "bias", n, bias.len())?;
    check::buffer_len(OP, "c", m * n, c.len())?;
    match GemmBackend::for_shape(&shape) {
        GemmBackend::Tiles => tiles_in_bands(shape, a, b, Some(bias), c),
        backend => {
            gemm_with(backend, shape, T::ONE, a, b, T::ZERO, c)?;
            super::bias_add_in_place(c, bias)
        }
    }
}

/// [`gemm`](fn@gemm) on a chosen backend.
pub fn gemm_with<T: Float>(
    backend: GemmBackend,
    shape: GemmShape,
    alpha: T,
    a: &[T],
    b: &[T],
    beta: T,
    c: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "gemm";
    let GemmShape { m, n, k, .. } = shape;
    check::buffer_len(OP, "a", m * k, a.len())?;
    check::buffer_len(OP, "b", k * n, b.len())?;
    check::buffer_len(OP, "c", m * n, c.len())?;
    let (lda, ldb) = shape.contiguous_leading_dims();
    product(backend, shape, alpha, (a, lda), (b, ldb), beta, (c, n))
}

impl GemmShape {
    /// The row strides of `A` and `B` stored contiguously: their stored rows' lengths.
    fn contiguous_leading_dims(&self) -> (usize, usize) {
        let (a, b) = self.stored_dims();
        (a.1, b.1)
    }

    /// `A`'s and `B`'s stored `(rows, row length)`: `[m, k]` (`[k, m]` when `trans_a`) and
    /// `[k, n]` (`[n, k]` when `trans_b`).
    fn stored_dims(&self) -> ((usize, usize), (usize, usize)) {
        let (m, n, k) = (self.m, self.n, self.k);
        (
            if self.trans_a { (k, m) } else { (m, k) },
            if self.trans_b { (n, k) } else { (k, n) },
        )
    }
}

/// [`gemm`](fn@gemm) on row-major operands whose rows lie `lda`, `ldb`, `ldc` elements apart
/// (each at least its stored rows' length; a slice may run past its last row): `A` stored as
/// `[m, k]` rows (`[k, m]` when `trans_a`) at row stride `lda`, `B` as `[k, n]` (`[n, k]`) at
/// `ldb`, `C` as `[m, n]` at `ldc`; only the matrices' elements are read or written.
///
/// The bits are those of [`gemm`](fn@gemm) on the same matrices stored contiguously: the same
/// backend ([`GemmBackend::for_shape`]) runs, and both libraries choose their code paths only by
/// whether a stride is 1 and by comparing a matrix's row stride with its unit column stride,
/// which a row stride at least the contiguous one (when that is at least 2) leaves unchanged;
/// otherwise the operands are copied to contiguous buffers first. The one departure: a product
/// small enough for one of the `gemm` crate's special paths runs padded with zeros onto its
/// tiled kernels ([`tiled_kernel_shape`]), so that each output gets the bits it gets inside any
/// larger call. A stride shorter than a row, or a slice too short for its matrix, is an error.
pub(crate) fn gemm_strided<T: Float>(
    shape: GemmShape,
    alpha: T,
    (a, lda): (&[T], usize),
    (b, ldb): (&[T], usize),
    beta: T,
    (c, ldc): (&mut [T], usize),
) -> Result<(), TensorError> {
    let GemmShape { m, n, .. } = shape;
    let ((a_rows, a_cols), (b_rows, b_cols)) = shape.stored_dims();
    check_strided(
        "gemm_strided",
        &shape,
        (a.len(), lda),
        (b.len(), ldb),
        (c.len(), ldc),
    )?;
    if let Some(padded) = tiled_kernel_shape(&shape) {
        return padded_product(shape, padded, alpha, (a, lda), (b, ldb), beta, (c, ldc));
    }
    let backend = GemmBackend::for_shape(&shape);
    // The libraries' path choices see the same strides' relations as the contiguous call's.
    let same_paths = |ld: usize, cols: usize| ld == cols || cols >= 2;
    if same_paths(lda, a_cols) && same_paths(ldb, b_cols) && same_paths(ldc, n) {
        return product(backend, shape, alpha, (a, lda), (b, ldb), beta, (c, ldc));
    }
    // Degenerate rows (one element): the contiguous call on copies.
    let a = contiguous_rows(a, (a_rows, a_cols, lda));
    let b = contiguous_rows(b, (b_rows, b_cols, ldb));
    let mut c_rows = contiguous_rows(c, (m, n, ldc));
    product(
        backend,
        shape,
        alpha,
        (&a, a_cols),
        (&b, b_cols),
        beta,
        (&mut c_rows, n),
    )?;
    scatter_rows(&c_rows, n, (c, ldc), (m, n));
    Ok(())
}

/// The backend [`gemm_strided`] runs `shape` on (after padding a small product onto the `gemm`
/// crate's tiled kernels).
pub(crate) fn strided_backend(shape: &GemmShape) -> GemmBackend {
    GemmBackend::for_shape(&tiled_kernel_shape(shape).unwrap_or(*shape))
}

/// The most outputs (`m·n`) of a product the `gemm` crate runs on its dot-product
/// ("horizontal") kernels when both operands lie contiguous along the reduction (`A·Bᵀ`).
const DOT_KERNEL_MAX_OUTPUTS: usize = 16 * 16;

/// The shape a small product is padded to (with zero rows, columns and reduction terms) so that
/// the `gemm` crate runs it on its tiled kernels, whose every output is one fused multiply-add
/// chain over the reduction in order, the same whatever the product's size; `None` when it does
/// already. The crate's other paths sum in other orders: its dot-product kernels (`A·Bᵀ` with
/// at most [`DOT_KERNEL_MAX_OUTPUTS`] outputs), matrix-vector kernels (one row or one column)
/// and its kernels for reductions of 1 or 2 terms. An attention row would otherwise change bits
/// with the number of rows or keys that share its tile: a sequence's short last tile, or a
/// context-parallel rank's block cut elsewhere than one device's tiles.
fn tiled_kernel_shape(shape: &GemmShape) -> Option<GemmShape> {
    let GemmShape { m, n, k, .. } = *shape;
    if m == 0 || n == 0 || k == 0 {
        return None; // nothing summed
    }
    let (n_pad, k_pad) = (n.max(2), k.max(3));
    let mut m_pad = m.max(2);
    if shape.trans_b && !shape.trans_a && m_pad * n_pad <= DOT_KERNEL_MAX_OUTPUTS {
        m_pad = DOT_KERNEL_MAX_OUTPUTS / n_pad + 1;
    }
    let padded = GemmShape {
        m: m_pad,
        n: n_pad,
        k: k_pad,
        ..*shape
    };
    (padded != *shape).then_some(padded)
}

/// `rows × cols` elements of `src` (rows `ld` apart) at the top left of a zeroed
/// `rows_pad × cols_pad` buffer.
fn zero_padded<T: Float>(
    src: &[T],
    (rows, cols, ld): (usize, usize, usize),
    (rows_pad, cols_pad): (usize, usize),
) -> Vec<T> {
    let mut out = vec![T::ZERO; rows_pad * cols_pad];
    for i in 0..rows {
        out[i * cols_pad..i * cols_pad + cols].copy_from_slice(&src[i * ld..i * ld + cols]);
    }
    out
}

/// The first `cols` elements of each of the first `rows` rows of `src` (rows `src_ld` apart)
/// into the rows of `dst` (rows `ldc` apart): [`zero_padded`]'s way back.
fn scatter_rows<T: Float>(
    src: &[T],
    src_ld: usize,
    (dst, ldc): (&mut [T], usize),
    (rows, cols): (usize, usize),
) {
    for i in 0..rows {
        dst[i * ldc..i * ldc + cols].copy_from_slice(&src[i * src_ld..i * src_ld + cols]);
    }
}

/// [`gemm_strided`] on the `padded` shape ([`tiled_kernel_shape`]): the operands copied into
/// zero-padded contiguous buffers (`C` read only when `beta ≠ 0`), the `m × n` results copied
/// back. The padding adds zero terms at the end of each reduction and outputs no one reads.
fn padded_product<T: Float>(
    shape: GemmShape,
    padded: GemmShape,
    alpha: T,
    (a, lda): (&[T], usize),
    (b, ldb): (&[T], usize),
    beta: T,
    (c, ldc): (&mut [T], usize),
) -> Result<(), TensorError> {
    let GemmShape { m, n, .. } = shape;
    let ((a_rows, a_cols), (b_rows, b_cols)) = shape.stored_dims();
    let (a_pad, b_pad) = padded.stored_dims();
    let a = zero_padded(a, (a_rows, a_cols, lda), a_pad);
    let b = zero_padded(b, (b_rows, b_cols, ldb), b_pad);
    let np = padded.n;
    let mut c_pad = match beta == T::ZERO {
        true => vec![T::ZERO; padded.m * np],
        false => zero_padded(c, (m, n, ldc), (padded.m, np)),
    };
    let (lda, ldb) = padded.contiguous_leading_dims();
    let backend = GemmBackend::for_shape(&padded);
    product(
        backend,
        padded,
        alpha,
        (&a, lda),
        (&b, ldb),
        beta,
        (&mut c_pad, np),
    )?;
    scatter_rows(&c_pad, np, (c, ldc), (m, n));
    Ok(())
}

/// `Ok` when `A`, `B` and `C` of `shape`, stored as [`gemm_strided`] takes them, fit slices
/// of the given lengths at the given row strides; else an error naming `op` and the operand.
pub(crate) fn check_strided(
    op: &'static str,
    shape: &GemmShape,
    (a_len, lda): (usize, usize),
    (b_len, ldb): (usize, usize),
    (c_len, ldc): (usize, usize),
) -> Result<(), TensorError> {
    let ((a_rows, a_cols), (b_rows, b_cols)) = shape.stored_dims();
    strided_len(op, "a", (a_rows, a_cols, lda), a_len)?;
    strided_len(op, "b", (b_rows, b_cols, ldb), b_len)?;
    strided_len(op, "c", (shape.m, shape.n, ldc), c_len)
}

/// `Ok` when a matrix of `rows` rows of `cols` elements, `ld` apart, fits a buffer of `len`
/// elements, its rows do not overlap (`ld ≥ cols`) and `ld` is a valid pointer offset; the
/// error names `op` and `buffer`.
fn strided_len(
    op: &'static str,
    buffer: &'static str,
    (rows, cols, ld): (usize, usize, usize),
    len: usize,
) -> Result<(), TensorError> {
    let need = match rows.checked_sub(1) {
        Some(last) if cols > 0 => last.checked_mul(ld).and_then(|x| x.checked_add(cols)),
        _ => Some(0),
    };
    match need {
        Some(need) if ld >= cols && ld <= isize::MAX as usize && need <= len => Ok(()),
        _ => Err(TensorError::InvalidArgument {
            op,
            reason: format!(
                "`{buffer}`: {rows} rows of {cols} elements {ld} apart do not fit {len} elements"
            ),
        }),
    }
}

/// The `rows` rows of `cols` elements lying `ld` apart in `src`, copied one after another.
fn contiguous_rows<T: Float>(src: &[T], (rows, cols, ld): (usize, usize, usize)) -> Vec<T> {
    if cols == 0 {
        return Vec::new(); // nothing to copy, and the rows' starts may lie past `src`
    }
    zero_padded(src, (rows, cols, ld), (rows, cols))
}

/// `C ← α·op(A)·op(B) + β·C` on `backend`, the operands' rows `lda`, `ldb`, `ldc` apart and
/// the buffers checked to hold them.
fn product<T: Float>(
    backend: GemmBackend,
    shape: GemmShape,
    alpha: T,
    (a, lda): (&[T], usize),
    (b, ldb): (&[T], usize),
    beta: T,
    (c, ldc): (&mut [T], usize),
) -> Result<(), TensorError> {
    let GemmShape { m, n, k, .. } = shape;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        // op(A)·op(B) is all zeros: only the β·C term remains.
        for row in (0..m).map(|i| i * ldc) {
            let row = &mut c[row..row + n];
            if beta == T::ZERO {
                row.fill(T::ZERO);
            } else {
                row.iter_mut().for_each(|v| *v *= beta);
            }
        }
        return Ok(());
    }
    let strides = |ld: usize, trans: bool| {
        if trans {
            (1, ld as isize)
        } else {
            (ld as isize, 1)
        }
    };
    let a_strides = strides(lda, shape.trans_a);
    let b_strides = strides(ldb, shape.trans_b);
    match backend {
        GemmBackend::Gemm => gemm_crate(
            shape,
            alpha,
            (a, a_strides),
            (b, b_strides),
            beta,
            c,
            (ldc as isize, 1),
        ),
        GemmBackend::GemmColumnMajor if ldc != n => {
            // The transposes below read and write `C` contiguous: run on a copy of its rows.
            let mut c_rows = contiguous_rows(c, (m, n, ldc));
            product(
                backend,
                shape,
                alpha,
                (a, lda),
                (b, ldb),
                beta,
                (&mut c_rows, n),
            )?;
            scatter_rows(&c_rows, n, (c, ldc), (m, n));
        }
        GemmBackend::GemmColumnMajor => {
            // Cᵀ is C in column-major order: compute it, then transpose it back.
            let c = &mut c[..m * n];
            let mut c_t = vec![T::ZERO; m * n];
            if beta != T::ZERO {
                transpose_into(c, m, n, &mut c_t)?;
            }
            gemm_crate(
                shape,
                alpha,
                (a, a_strides),
                (b, b_strides),
                beta,
                &mut c_t,
                (1, m as isize),
            );
            transpose_into(&c_t, n, m, c)?;
        }
        GemmBackend::Tiles => tiles_product(shape, alpha, (a, lda), (b, ldb), beta, (c, ldc))?,
        GemmBackend::MatrixMultiply => {
            // SAFETY: the caller checked that every (row, col) of the three matrices at these
            // strides lies inside its slice; `c` is borrowed mutably and cannot alias `a` or
            // `b`.
            unsafe {
                T::matrixmultiply_gemm(
                    m,
                    k,
                    n,
                    alpha,
                    a.as_ptr(),
                    a_strides,
                    b.as_ptr(),
                    b_strides,
                    beta,
                    c.as_mut_ptr(),
                    (ldc as isize, 1),
                )
            }
        }
    }
    Ok(())
}

/// [`GemmBackend::Tiles`] on checked buffers: strided operands copied contiguous first, and
/// `C ← β·C + α·P` applied after the product `P` unless `α = 1`, `β = 0` and `C` is contiguous.
fn tiles_product<T: Float>(
    shape: GemmShape,
    alpha: T,
    (a, lda): (&[T], usize),
    (b, ldb): (&[T], usize),
    beta: T,
    (c, ldc): (&mut [T], usize),
) -> Result<(), TensorError> {
    let GemmShape { m, n, .. } = shape;
    let ((a_rows, a_cols), (b_rows, b_cols)) = shape.stored_dims();
    let a = contiguous_cow(a, (a_rows, a_cols, lda));
    let b = contiguous_cow(b, (b_rows, b_cols, ldb));
    if alpha == T::ONE && beta == T::ZERO && ldc == n {
        return tiles_in_bands(shape, &a, &b, None, &mut c[..m * n]);
    }
    let mut p = vec![T::ZERO; m * n];
    tiles_in_bands(shape, &a, &b, None, &mut p)?;
    for (i, p) in p.chunks_exact(n).enumerate() {
        for (c, &p) in c[i * ldc..i * ldc + n].iter_mut().zip(p) {
            *c = match beta == T::ZERO {
                true => alpha * p,
                false => beta * *c + alpha * p,
            };
        }
    }
    Ok(())
}

/// `rows × cols` elements of `src` (rows `ld` apart) as one contiguous run: borrowed when they
/// already are.
fn contiguous_cow<T: Float>(src: &[T], (rows, cols, ld): (usize, usize, usize)) -> Cow<'_, [T]> {
    match ld == cols {
        true => Cow::Borrowed(&src[..rows * cols]),
        false => Cow::Owned(contiguous_rows(src, (rows, cols, ld))),
    }
}

/// `c ← op(A)·op(B) (+ bias)` by the tiles, contiguous operands, on the threads
/// [`super::threads`] allows for the product's size: one band of rows per thread (each
/// output's chain is the same whichever band holds its row, so the bits are one thread's).
fn tiles_in_bands<T: Float>(
    shape: GemmShape,
    a: &[T],
    b: &[T],
    bias: Option<&[T]>,
    c: &mut [T],
) -> Result<(), TensorError> {
    let GemmShape { m, n, .. } = shape;
    let threads = super::threads::threads_for(shape.flops());
    if threads < 2 || n == 0 {
        return det::chain_gemm(shape, a, b, bias, (0..m, c));
    }
    let per = m.div_ceil(threads);
    let bands: Vec<_> = c.chunks_mut(per * n).enumerate().collect();
    super::threads::for_each_part(bands, |_, (i, c)| {
        let rows = i * per..i * per + c.len() / n;
        det::chain_gemm(shape, a, b, bias, (rows, c))
    })
    .into_iter()
    .collect()
}

/// The `gemm` crate on checked buffers: `c` (m×n, at `c_strides` = (row stride, column
/// stride)) ← α·op(A)·op(B) + β·c, reading `c` only when β ≠ 0; on the threads
/// [`super::threads`] allows for the product's size.
///
/// On more than one thread the output is cut into one band of rows (or, for a short and wide
/// output, of columns) per thread, and each band is one single-threaded product of its rows of
/// `A` (columns of `B`): every element still sums the whole contraction in the crate's order, so
/// the bits are the single thread's, and no band waits on another (the crate's own parallel
/// mode packs `B` on one thread between barriers, which measured 1.35–1.45× on two threads).
/// A band (the whole output on one thread) taller than [`solo_band_rows`] rows is cut further
/// into calls of that many rows, with the same bits for the same reason.
fn gemm_crate<T: Float>(
    shape: GemmShape,
    alpha: T,
    (a, (a_rs, a_cs)): (&[T], (isize, isize)),
    (b, (b_rs, b_cs)): (&[T], (isize, isize)),
    beta: T,
    c: &mut [T],
    c_strides: (isize, isize),
) {
    let threads = super::threads::threads_for(shape.flops());
    let (c_rs, c_cs) = c_strides;
    let (a_ptr, b_ptr, c_ptr) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    let chunk = reduction_chunk(&shape);
    // One band of the output: rows `rows` and columns `cols` of C, over the reduction's chunks
    // in order (the first writes `β·C + α·part`, each later one adds its `α·part`).
    let band = |rows: std::ops::Range<usize>, cols: std::ops::Range<usize>| {
        for k0 in (0..shape.k).step_by(chunk) {
            let (first, kc) = (k0 == 0, chunk.min(shape.k - k0));
            let beta = if first { beta } else { T::ONE };
            // SAFETY: the caller checked that `a`, `b` and `c` hold the m×k, k×n and m×n
            // matrices at these strides, which every (row, col, reduction step) addresses; a band's and
            // a chunk's offsets start inside them and address a sub-matrix; bands of one call
            // are disjoint in `c`, which is borrowed mutably and cannot alias `a` or `b`.
            unsafe {
                // The crate computes dst ← α'·dst + β'·lhs·rhs: its α is our β and vice versa.
                gemm::gemm(
                    rows.len(),
                    cols.len(),
                    kc,
                    c_ptr.offset(rows.start as isize * c_rs + cols.start as isize * c_cs),
                    c_cs,
                    c_rs,
                    beta != T::ZERO,
                    a_ptr.offset(rows.start as isize * a_rs + k0 as isize * a_cs),
                    a_cs,
                    a_rs,
                    b_ptr.offset(cols.start as isize * b_cs + k0 as isize * b_rs),
                    b_cs,
                    b_rs,
                    beta,
                    alpha,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            }
        }
    };
    let (m, n) = (shape.m, shape.n);
    // A band taller than `solo_band_rows()` rows as calls of at most that many, one after
    // another.
    let solo = solo_band_rows();
    let band = |rows: std::ops::Range<usize>, cols: std::ops::Range<usize>| {
        for start in rows.clone().step_by(solo) {
            band(start..(start + solo).min(rows.end), cols.clone());
        }
    };
    if threads < 2 {
        band(0..m, 0..n);
        return;
    }
    // Bands of whole register tiles (multiples of 64 rows or 64 columns).
    let by_rows = m >= n;
    let len = if by_rows { m } else { n };
    let per = len.div_ceil(threads).next_multiple_of(64);
    let bands: Vec<std::ops::Range<usize>> = (0..len)
        .step_by(per.max(1))
        .map(|start| start..(start + per).min(len))
        .collect();
    let band = SendBand(&band);
    super::threads::for_each_part(bands, |_, part| {
        let band = &band;
        if by_rows {
            (band.0)(part, 0..n)
        } else {
            (band.0)(0..m, part)
        }
    });
}

/// Rows of `C` one `gemm` crate call computes at most, from the L2 cache the crate itself
/// reads off the CPU (and blocks its products by): below 1 MiB of L2 one row per KiB, from
/// 1 MiB two rows per KiB; in whole 64-row register tiles, at least 256. A taller band is cut
/// into calls of this many rows, one after another (the same bits: every element still sums
/// the whole contraction in the crate's order).
///
/// Measured with `cargo bench -p tessera-tensor --bench bands` (one thread, cold caches, the
/// GPT's 2,048-row products; see `docs/PERFORMANCE.md`, "Products in bands of 512 rows", "Bands
/// from the L2 cache" and "Products in bands: one call from 1 MiB of L2"):
/// - a Zen 3 EPYC with 512 KiB of L2 per core: calls of 512 rows ran the products with a wide
///   output (`n` = 768 or 1,024) 1.13–1.15× faster than one call, the others about the same;
///   bands of 64–128 rows were 8–15 % slower (`B` is packed again for every call);
/// - a Zen 4 EPYC with 1 MiB of L2 per core: one call was the fastest, calls of 1,024 rows
///   0.93–0.98× on the forward products and of 512 rows 0.83–0.95×;
/// - an Intel Xeon with 2 MiB of L2 per core: one call was the fastest, calls of 512 rows
///   0.90–0.93× on the forward products and of 1,024 rows 0.97×.
pub fn solo_band_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| band_rows_for_l2(l2_cache_bytes()))
}

/// Bytes of L2 cache per core as the `gemm` crate reads them off the CPU (and blocks its
/// products by): what [`solo_band_rows`] follows, printed beside benchmark figures.
pub fn l2_cache_bytes() -> usize {
    gemm_common::cache::CACHE_INFO[1].cache_bytes
}

/// [`solo_band_rows`]' rule for an L2 cache of `l2_bytes`.
fn band_rows_for_l2(l2_bytes: usize) -> usize {
    let per_kib = if l2_bytes < 1024 * 1024 { 1 } else { 2 };
    (l2_bytes / 1024 * per_kib).next_multiple_of(64).max(256)
}

/// Reduction steps one `gemm` crate call covers: a weight gradient's product (`op(A) = Aᵀ`, a
/// long reduction over the batch's rows, `B` plain) in calls of [`GRADIENT_CHUNK`] steps, each
/// adding into `C`; every other product in one call.
///
/// Measured with `cargo bench -p tessera-tensor --bench bands` (one thread, cold caches): on an
/// Intel Xeon (AVX-512, 2 MiB of L2) the GPT's weight gradients (`dYᵀ·X` over 2,048 rows) ran
/// 1.03–1.05× faster in chunks of 128 steps than in one call, and chunks of 512 no faster; the
/// forward and `dX` products, whose reductions are 256–1,024 long, lost 7–14 % in chunks of 128.
/// See `docs/PERFORMANCE.md`.
fn reduction_chunk(shape: &GemmShape) -> usize {
    if shape.trans_a && !shape.trans_b && shape.k >= 8 * GRADIENT_CHUNK {
        GRADIENT_CHUNK
    } else {
        shape.k.max(1)
    }
}

/// The chunk of a weight gradient's reduction ([`reduction_chunk`]).
const GRADIENT_CHUNK: usize = 128;

/// A band closure shared by the threads: it only reads its captured pointers, and the bands
/// write disjoint parts of the output.
struct SendBand<'f, F>(&'f F);

// SAFETY: the closure captures raw pointers into buffers that outlive the parallel loop; the
// threads write disjoint bands of the output and only read the operands.
unsafe impl<F> Sync for SendBand<'_, F> {}

/// The (m, k) of an operand's last two dims as used, given its transpose flag.
fn matrix_dims(shape: &[usize], transposed: bool) -> (usize, usize) {
    let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    }
}

/// The 2-D product `op(a)·op(b)`: `a` is `[m, k]` (`[k, m]` if `trans_a`), `b` is `[k, n]`
/// (`[n, k]` if `trans_b`), the result is `[m, n]` of the inputs' dtype.
pub fn matmul(a: &Tensor, b: &Tensor, trans_a: bool, trans_b: bool) -> Result<Tensor, TensorError> {
    const OP: &str = "matmul";
    for t in [a, b] {
        if t.ndim() != 2 {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: format!("needs 2-D operands, got shape {:?}", t.shape()),
            });
        }
    }
    batch_matmul_checked(OP, a, b, trans_a, trans_b)
}

/// The batched product `op(a)·op(b)` over the last two dims, with NumPy broadcasting over the
/// leading (batch) dims: `[..., m, k] · [..., k, n] → [broadcast(...), m, n]`. Both operands need
/// at least 2 dims; a 2-D operand is shared by every batch.
pub fn batch_matmul(
    a: &Tensor,
    b: &Tensor,
    trans_a: bool,
    trans_b: bool,
) -> Result<Tensor, TensorError> {
    batch_matmul_checked("batch_matmul", a, b, trans_a, trans_b)
}

fn batch_matmul_checked(
    op: &'static str,
    a: &Tensor,
    b: &Tensor,
    trans_a: bool,
    trans_b: bool,
) -> Result<Tensor, TensorError> {
    check::min_rank(op, a, 2)?;
    check::min_rank(op, b, 2)?;
    check::same_dtype(op, a, b)?;
    let out_shape = batch_matmul_shape(op, (a.shape(), b.shape()), (trans_a, trans_b))?;
    with_float!(op, a.dtype(), |T| {
        let xa = T::read(op, a)?;
        let xb = T::read(op, b)?;
        let mut out = vec![T::ZERO; out_shape.iter().product()];
        batched_product::<T>(
            (&xa, a.shape()),
            (&xb, b.shape()),
            (trans_a, trans_b),
            None,
            (&mut out, &out_shape),
        )?;
        Ok(T::write(&out_shape, out, a.dtype()))
    })
}

/// The shape of `op(a)·op(b)` for [`batch_matmul`]: the broadcast batch dims, then `[m, n]`.
pub fn batch_matmul_shape(
    op: &'static str,
    (a, b): (&[usize], &[usize]),
    (trans_a, trans_b): (bool, bool),
) -> Result<Vec<usize>, TensorError> {
    for shape in [a, b] {
        if shape.len() < 2 {
            return Err(TensorError::InvalidArgument {
                op,
                reason: format!("needs at least 2 dims, got shape {shape:?}"),
            });
        }
    }
    let (m, k) = matrix_dims(a, trans_a);
    let (k_b, n) = matrix_dims(b, trans_b);
    if k != k_b {
        return Err(TensorError::ShapeMismatch {
            op,
            lhs: a.to_vec(),
            rhs: b.to_vec(),
        });
    }
    let mut out = broadcast_shape(op, &a[..a.len() - 2], &b[..b.len() - 2])?;
    out.extend([m, n]);
    Ok(out)
}

/// [`batch_matmul`] on slices: `out` (of `out_shape`, which must be
/// [`batch_matmul_shape`]'s) ← `op(a)·op(b)`, every element written.
pub fn batch_matmul_into<T: Float>(
    a: (&[T], &[usize]),
    b: (&[T], &[usize]),
    trans: (bool, bool),
    out: (&mut [T], &[usize]),
) -> Result<(), TensorError> {
    batch_matmul_bias_into(a, b, trans, None, out)
}

/// [`batch_matmul_into`] with `bias` (the output's last dim) added to every row of the result:
/// the bits of the product followed by [`super::bias_add_in_place`]. Where the batch folds
/// into one tall product (a 2-D `b` shared by every batch element, `a` not transposed) this is
/// [`gemm_bias`], whose tiles may take the bias as they are stored.
pub fn batch_matmul_bias_into<T: Float>(
    (a, a_shape): (&[T], &[usize]),
    (b, b_shape): (&[T], &[usize]),
    (trans_a, trans_b): (bool, bool),
    bias: Option<&[T]>,
    (out, out_shape): (&mut [T], &[usize]),
) -> Result<(), TensorError> {
    const OP: &str = "batch_matmul";
    let want = batch_matmul_shape(OP, (a_shape, b_shape), (trans_a, trans_b))?;
    if want != out_shape {
        return Err(TensorError::InvalidArgument {
            op: OP,
            reason: format!("the output has shape {out_shape:?}, the product {want:?}"),
        });
    }
    check::buffer_len(OP, "a", a_shape.iter().product(), a.len())?;
    check::buffer_len(OP, "b", b_shape.iter().product(), b.len())?;
    check::buffer_len(OP, "out", want.iter().product(), out.len())?;
    if let Some(bias) = bias {
        check::buffer_len(OP, "bias", want[want.len() - 1], bias.len())?;
    }
    batched_product(
        (a, a_shape),
        (b, b_shape),
        (trans_a, trans_b),
        bias,
        (out, out_shape),
    )
}

/// [`batch_matmul_into`] once the shapes and lengths are known to fit.
fn batched_product<T: Float>(
    (a, a_shape): (&[T], &[usize]),
    (b, b_shape): (&[T], &[usize]),
    (trans_a, trans_b): (bool, bool),
    bias: Option<&[T]>,
    (out, out_shape): (&mut [T], &[usize]),
) -> Result<(), TensorError> {
    let (m, k) = matrix_dims(a_shape, trans_a);
    let (_, n) = matrix_dims(b_shape, trans_b);
    let shape = GemmShape {
        m,
        n,
        k,
        trans_a,
        trans_b,
    };
    let (a_batch, b_batch) = (&a_shape[..a_shape.len() - 2], &b_shape[..b_shape.len() - 2]);
    let batch = &out_shape[..out_shape.len() - 2];
    let n_out = out_shape.iter().product();
    batched_gemm::<T>(
        shape,
        a,
        a_batch,
        b,
        b_batch,
        batch,
        bias,
        &mut out[..n_out],
    )
}

/// `C ← Σ_i op(A_i)·op(B_i)` over `batch` matrices stored one after another in `a` and `b`
/// (each `shape`). With `trans_a` and not `trans_b` the sum is one product: the batch folds
/// into the reduction dim (`[batch·k, m]ᵀ·[batch·k, n]`); otherwise the products accumulate.
pub fn batch_gemm_sum<T: Float>(
    shape: GemmShape,
    batch: usize,
    a: &[T],
    b: &[T],
    c: &mut [T],
) -> Result<(), TensorError> {
    const OP: &str = "batch_gemm_sum";
    let (a_size, b_size) = (shape.m * shape.k, shape.k * shape.n);
    check::buffer_len(OP, "a", batch * a_size, a.len())?;
    check::buffer_len(OP, "b", batch * b_size, b.len())?;
    if shape.trans_a && !shape.trans_b {
        let folded = GemmShape {
            k: shape.k * batch,
            ..shape
        };
        return gemm(folded, T::ONE, a, b, T::ZERO, c);
    }
    c.fill(T::ZERO);
    for (ai, bi) in a
        .chunks_exact(a_size.max(1))
        .zip(b.chunks_exact(b_size.max(1)))
        .take(batch)
    {
        gemm(shape, T::ONE, ai, bi, T::ONE, c)?;
    }
    Ok(())
}

/// One gemm per batch element of the broadcast `batch` shape (or a single tall gemm when `b` is
/// shared by every batch element and `a` is not transposed), then `bias` added to every row.
#[allow(clippy::too_many_arguments)]
fn batched_gemm<T: Float>(
    shape: GemmShape,
    a: &[T],
    a_batch: &[usize],
    b: &[T],
    b_batch: &[usize],
    batch: &[usize],
    bias: Option<&[T]>,
    out: &mut [T],
) -> Result<(), TensorError> {
    let n_batch: usize = batch.iter().product();
    let b_batch_len: usize = b_batch.iter().product();
    if b_batch_len == 1 && !shape.trans_a {
        // [B·m, k] · [k, n]: the batch folds into the rows of one product.
        let tall = GemmShape {
            m: shape.m * n_batch,
            ..shape
        };
        return match bias {
            Some(bias) => gemm_bias(tall, a, b, bias, out),
            None => gemm(tall, T::ONE, a, b, T::ZERO, out),
        };
    }
    products_by_batch_element(shape, (a, a_batch), (b, b_batch), batch, out)?;
    match bias {
        Some(bias) => super::bias_add_in_place(out, bias),
        None => Ok(()),
    }
}

/// [`batched_gemm`]'s products one per batch element (broadcast), on the rank's threads when
/// each is too small to split itself.
fn products_by_batch_element<T: Float>(
    shape: GemmShape,
    (a, a_batch): (&[T], &[usize]),
    (b, b_batch): (&[T], &[usize]),
    batch: &[usize],
    out: &mut [T],
) -> Result<(), TensorError> {
    let n_batch: usize = batch.iter().product();
    let a_size = shape.m * shape.k;
    let b_size = shape.k * shape.n;
    let c_size = shape.m * shape.n;
    let a_strides = broadcast_strides(a_batch, batch);
    let b_strides = broadcast_strides(b_batch, batch);
    // The (a, b) matrix of every batch element, last dim fastest.
    let mut operands = Vec::with_capacity(n_batch);
    let mut index = vec![0usize; batch.len()];
    for _ in 0..n_batch {
        let a_at: usize = index.iter().zip(&a_strides).map(|(i, s)| i * s).sum();
        let b_at: usize = index.iter().zip(&b_strides).map(|(i, s)| i * s).sum();
        operands.push((a_at, b_at));
        for d in (0..batch.len()).rev() {
            index[d] += 1;
            if index[d] < batch[d] {
                break;
            }
            index[d] = 0;
        }
    }
    let product = |(a_at, b_at): (usize, usize), c: &mut [T]| {
        gemm(
            shape,
            T::ONE,
            &a[a_at * a_size..(a_at + 1) * a_size],
            &b[b_at * b_size..(b_at + 1) * b_size],
            T::ZERO,
            c,
        )
    };
    let outputs = out.chunks_exact_mut(c_size.max(1)).take(n_batch);
    // Products too small to split themselves (attention's per-head ones) are shared out whole
    // among the rank's threads instead: each is still one thread's, so the bits are the same.
    let threads = super::threads::threads_for(shape.flops() * n_batch as u64);
    if threads > 1 && super::threads::threads_for(shape.flops()) == 1 {
        let per_task = n_batch.div_ceil(threads).max(1);
        let tasks: Vec<_> = out[..n_batch * c_size]
            .chunks_mut((c_size * per_task).max(1))
            .zip(operands.chunks(per_task))
            .collect();
        return super::threads::for_each_part(tasks, |_, (cs, ops)| {
            cs.chunks_exact_mut(c_size.max(1))
                .zip(ops)
                .try_for_each(|(c, &at)| product(at, c))
        })
        .into_iter()
        .collect();
    }
    for (c, at) in outputs.zip(operands) {
        product(at, c)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_rows_follow_the_l2_cache() {
        // The measured machines: 512 KiB (Zen 3) cuts the GPT's 2,048 rows into bands of 512;
        // 1 MiB (Zen 4) and 2 MiB (an Intel Xeon) of L2 per core compute them in one call.
        assert_eq!(band_rows_for_l2(512 * 1024), 512);
        assert!(band_rows_for_l2(1024 * 1024) >= 2048);
        assert!(band_rows_for_l2(2048 * 1024) >= 2048);
        // Whole 64-row tiles, and never the short bands that measured slower.
        assert_eq!(band_rows_for_l2(1280 * 1024), 2560);
        assert_eq!(band_rows_for_l2(1000 * 1024), 1024);
        assert_eq!(band_rows_for_l2(64 * 1024), 256);
        assert_eq!(band_rows_for_l2(0), 256);
        assert_eq!(solo_band_rows() % 64, 0);
    }

    fn shape(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> GemmShape {
        GemmShape {
            m,
            n,
            k,
            trans_a,
            trans_b,
        }
    }

    #[test]
    fn routing_follows_the_measured_rule() {
        use GemmBackend::{Gemm, GemmColumnMajor, MatrixMultiply, Tiles};
        let route = |m, n, k, trans_a, trans_b| {
            GemmBackend::for_shape_on(&shape(m, n, k, trans_a, trans_b), TileCpu::Other)
        };
        let on_amd = |m, n, k, trans_a, trans_b| {
            GemmBackend::for_shape_on(&shape(m, n, k, trans_a, trans_b), TileCpu::AmdAvx512)
        };
        // An AMD CPU with AVX-512 runs the GPT's forward and `dX` products on the tiles (and
        // a wider model's, with longer reductions), its weight gradients (`A` transposed) on
        // the crate unless they have 1,024 rows; short, narrow or shallow products keep the
        // crate's rules; other CPUs never take the tiles.
        assert_eq!(on_amd(2048, 768, 256, false, true), Tiles);
        assert_eq!(on_amd(2048, 256, 1024, false, false), Tiles);
        assert_eq!(on_amd(256, 64, 64, false, false), Tiles);
        assert_eq!(on_amd(768, 256, 2048, true, false), Gemm);
        assert_eq!(on_amd(1024, 256, 2048, true, false), Tiles);
        assert_eq!(on_amd(2048, 1024, 4096, false, true), Tiles);
        assert_eq!(on_amd(2048, 256, 32, false, false), Gemm);
        assert_eq!(on_amd(2048, 32, 256, false, false), Gemm);
        assert_eq!(on_amd(128, 512, 512, false, true), GemmColumnMajor);
        assert_eq!(route(2048, 768, 256, false, true), Gemm);
        assert_eq!(
            GemmBackend::for_shape(&shape(32, 784, 512, false, true)),
            GemmColumnMajor
        );
        // The MLP's shapes (forward, dX = dY·Wᵀ, dW = Xᵀ·dY for each layer).
        assert_eq!(route(32, 512, 784, false, false), Gemm);
        assert_eq!(route(32, 10, 512, false, false), Gemm);
        assert_eq!(route(32, 784, 512, false, true), GemmColumnMajor);
        assert_eq!(route(32, 512, 512, false, true), GemmColumnMajor);
        assert_eq!(route(32, 512, 10, false, true), Gemm);
        assert_eq!(route(784, 512, 32, true, false), Gemm);
        assert_eq!(route(512, 10, 32, true, false), MatrixMultiply);
        // The edges of each rule.
        assert_eq!(route(512, 512, 512, false, true), Gemm);
        assert_eq!(route(32, 512, 64, false, true), Gemm);
        assert_eq!(route(512, 10, 32, true, true), MatrixMultiply);
        assert_eq!(route(512, 1, 32, true, false), Gemm);
        assert_eq!(route(512, 32, 32, true, false), Gemm);
    }

    /// The tiles read strided operands and write a strided `C` (with `α`, `β`) as they do
    /// contiguous ones, and leave the elements between `C`'s rows alone.
    #[test]
    fn the_tiles_on_strided_operands_give_the_contiguous_bits() {
        use GemmBackend::Tiles;
        let value = |i: usize| ((i * 37) % 101) as f32 / 13.0 - 3.5;
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
            let s = shape(13, 35, 70, trans_a, trans_b);
            let ((ar, ac), (br, bc)) = s.stored_dims();
            let (lda, ldb, ldc) = (ac + 3, bc + 5, s.n + 2);
            let a: Vec<f32> = (0..ar * lda).map(value).collect();
            let b: Vec<f32> = (0..br * ldb).map(|i| value(i + 7)).collect();
            let c0: Vec<f32> = (0..s.m * ldc).map(|i| value(i + 3)).collect();
            let mut got = c0.clone();
            let (alpha, beta) = (0.5, 2.0);
            product(Tiles, s, alpha, (&a, lda), (&b, ldb), beta, (&mut got, ldc)).unwrap();
            let packed = |x: &[f32], (rows, cols, ld)| contiguous_rows(x, (rows, cols, ld));
            let (a1, b1) = (packed(&a, (ar, ac, lda)), packed(&b, (br, bc, ldb)));
            let mut p = vec![f32::NAN; s.m * s.n];
            product(Tiles, s, 1.0, (&a1, ac), (&b1, bc), 0.0, (&mut p, s.n)).unwrap();
            for i in 0..s.m {
                for j in 0..ldc {
                    let (g, c) = (got[i * ldc + j], c0[i * ldc + j]);
                    let want = match j < s.n {
                        true => beta * c + alpha * p[i * s.n + j],
                        false => c,
                    };
                    assert_eq!(g.to_bits(), want.to_bits(), "{s:?} ({i}, {j})");
                }
            }
        }
    }

    /// Every output of a product cut out of a larger one (fewer rows, columns or trailing
    /// reduction terms, down to the sizes of the `gemm` crate's special paths) keeps its bits.
    #[test]
    fn a_strided_product_s_outputs_do_not_depend_on_the_call_s_size() {
        let value = |i: usize| ((i * 37) % 101) as f64 / 13.0 - 3.5;
        let (m, n, k) = (40usize, 40usize, 24usize);
        for (trans_a, trans_b) in [(false, true), (false, false), (true, false)] {
            let whole = shape(m, n, k, trans_a, trans_b);
            let (lda, ldb) = whole.contiguous_leading_dims();
            let a: Vec<f64> = (0..m * k).map(value).collect();
            let b: Vec<f64> = (0..k * n).map(|i| value(i + 7)).collect();
            let mut c = vec![0.0; m * n];
            gemm_strided(whole, 0.5, (&a, lda), (&b, ldb), 0.0, (&mut c, n)).unwrap();
            for (rows, cols, terms) in [(1, 40, 24), (3, 5, 24), (40, 1, 24), (2, 2, 2), (5, 40, 1)]
            {
                let part = shape(rows, cols, terms, trans_a, trans_b);
                // The top-left block of every operand, read in place at the whole's strides.
                let mut got = vec![f64::NAN; rows * n];
                gemm_strided(part, 0.5, (&a, lda), (&b, ldb), 0.0, (&mut got, n)).unwrap();
                let mut want = vec![0.0; m * n];
                // The whole product over the first `terms` reduction terms only.
                let cut = |x: &[f64], (r, c, ld): (usize, usize, usize), keep: (usize, usize)| {
                    let mut y = x.to_vec();
                    for i in 0..r {
                        for j in 0..c {
                            if i >= keep.0 || j >= keep.1 {
                                y[i * ld + j] = 0.0;
                            }
                        }
                    }
                    y
                };
                let a_cut = match trans_a {
                    false => cut(&a, (m, k, lda), (m, terms)),
                    true => cut(&a, (k, m, lda), (terms, m)),
                };
                let b_cut = match trans_b {
                    false => cut(&b, (k, n, ldb), (terms, n)),
                    true => cut(&b, (n, k, ldb), (n, terms)),
                };
                gemm_strided(
                    whole,
                    0.5,
                    (&a_cut, lda),
                    (&b_cut, ldb),
                    0.0,
                    (&mut want, n),
                )
                .unwrap();
                for i in 0..rows {
                    for j in 0..cols {
                        let (g, w) = (got[i * n + j], want[i * n + j]);
                        assert_eq!(g.to_bits(), w.to_bits(), "{part:?} ({i}, {j}): {g} vs {w}");
                    }
                }
            }
        }
    }

    /// The strided product gives `gemm`'s bits on the same matrices stored contiguously (padded
    /// as it pads the crate's special paths' sizes), on every route, leaves the elements between
    /// the rows alone, and refuses a stride shorter than a row or a buffer too short.
    #[test]
    fn gemm_strided_gives_the_contiguous_bits() {
        fn check<T: Float>() {
            let value = |i: usize| T::from_f64(((i * 37) % 101) as f64 / 13.0 - 3.5);
            // (m, n, k, trans_a, trans_b): the routes of `for_shape` and one-element rows.
            let shapes = [
                shape(37, 45, 9, false, false),
                shape(64, 64, 64, false, true),
                shape(64, 64, 128, false, true),
                shape(45, 9, 37, true, false),
                shape(45, 1, 37, true, false),
                shape(37, 45, 1, false, true),
                shape(1, 5, 3, false, false),
                shape(6, 4, 0, false, false),
            ];
            for s in shapes {
                let GemmShape { m, n, .. } = s;
                let ((a_rows, a_cols), (b_rows, b_cols)) = s.stored_dims();
                let (lda, ldb, ldc) = (a_cols + 3, b_cols + 5, n + 2);
                let a: Vec<T> = (0..a_rows * lda).map(value).collect();
                let b: Vec<T> = (0..b_rows * ldb).map(|i| value(i + 7)).collect();
                let c0: Vec<T> = (0..m * ldc).map(|i| value(i + 11)).collect();
                let alpha = T::from_f64(0.75);
                for beta in [T::ZERO, T::ONE, T::from_f64(0.5)] {
                    let mut c = c0.clone();
                    gemm_strided(s, alpha, (&a, lda), (&b, ldb), beta, (&mut c, ldc)).unwrap();
                    // The contiguous call, on the shape padded onto the tiled kernels when
                    // the strided call pads it.
                    let p = tiled_kernel_shape(&s).unwrap_or(s);
                    let (a_pad, b_pad) = p.stored_dims();
                    let a = zero_padded(&a, (a_rows, a_cols, lda), a_pad);
                    let b = zero_padded(&b, (b_rows, b_cols, ldb), b_pad);
                    let mut want = zero_padded(&c0, (m, n, ldc), (p.m, p.n));
                    gemm(p, alpha, &a, &b, beta, &mut want).unwrap();
                    let want = contiguous_rows(&want, (m, n, p.n));
                    let got = contiguous_rows(&c, (m, n, ldc));
                    let bits = |x: &[T]| x.iter().map(|v| v.to_f64().to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{s:?} beta {}", beta.to_f64());
                    for (i, (x, y)) in c.iter().zip(&c0).enumerate() {
                        if i % ldc >= n {
                            assert_eq!(x.to_f64().to_bits(), y.to_f64().to_bits(), "{s:?} {i}");
                        }
                    }
                }
            }
            let s = shape(4, 3, 2, false, false);
            let (a, b, mut c) = (vec![T::ONE; 8], vec![T::ONE; 6], vec![T::ZERO; 12]);
            // A stride shorter than a row, and buffers too short for their matrices.
            assert!(gemm_strided(s, T::ONE, (&a, 1), (&b, 3), T::ZERO, (&mut c, 3)).is_err());
            assert!(gemm_strided(s, T::ONE, (&a, 3), (&b, 3), T::ZERO, (&mut c, 3)).is_err());
            assert!(gemm_strided(s, T::ONE, (&a, 2), (&b, 3), T::ZERO, (&mut c, 4)).is_err());
            assert!(gemm_strided(s, T::ONE, (&a, 2), (&b, 3), T::ZERO, (&mut c, 3)).is_ok());
            // Empty rows a stride apart need no elements.
            let flat = shape(6, 4, 0, false, false);
            let mut c6 = vec![T::ONE; 24];
            gemm_strided(flat, T::ONE, (&[], 3), (&[], 4), T::ZERO, (&mut c6, 4)).unwrap();
            assert!(c6.iter().all(|&x| x == T::ZERO));
            let huge = usize::MAX / 2;
            assert!(gemm_strided(s, T::ONE, (&a, huge), (&b, 3), T::ZERO, (&mut c, 3)).is_err());
            // One row: its stride addresses nothing, but must still be a pointer offset.
            let row = shape(1, 3, 2, false, false);
            let c = &mut c[..3];
            assert!(gemm_strided(row, T::ONE, (&a, 5), (&b, 3), T::ZERO, (&mut *c, 3)).is_ok());
            let too_far = (&a[..], usize::MAX);
            assert!(gemm_strided(row, T::ONE, too_far, (&b, 3), T::ZERO, (c, 3)).is_err());
        }
        check::<f32>();
        check::<f64>();
    }

    /// The slice-level batched product writes every element (a stale output would show) and
    /// equals the per-batch product; a wrong output shape or buffer is refused.
    #[test]
    fn batch_matmul_into_broadcasts_and_checks_its_output() {
        let (a_shape, b_shape) = ([2usize, 3, 4, 5], [3usize, 6, 5]);
        let a: Vec<f32> = (0..120).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..90).map(|i| (i % 5) as f32 * 0.5).collect();
        let out_shape = batch_matmul_shape("t", (&a_shape, &b_shape), (false, true)).unwrap();
        assert_eq!(out_shape, [2, 3, 4, 6]);
        let mut out = vec![f32::NAN; 144];
        batch_matmul_into(
            (&a, &a_shape),
            (&b, &b_shape),
            (false, true),
            (&mut out, &out_shape),
        )
        .unwrap();
        for (p, q) in (0..2).flat_map(|p| (0..3).map(move |q| (p, q))) {
            for (i, j) in (0..4).flat_map(|i| (0..6).map(move |j| (i, j))) {
                let want: f32 = (0..5)
                    .map(|k| a[((p * 3 + q) * 4 + i) * 5 + k] * b[(q * 6 + j) * 5 + k])
                    .sum();
                let got = out[((p * 3 + q) * 4 + i) * 6 + j];
                assert!(
                    (got - want).abs() < 1e-4,
                    "[{p},{q},{i},{j}] {got} vs {want}"
                );
            }
        }
        let wrong = batch_matmul_into(
            (&a, &a_shape),
            (&b, &b_shape),
            (false, true),
            (&mut out, &[2, 3, 6, 4]),
        );
        assert!(wrong.unwrap_err().to_string().contains("[2, 3, 4, 6]"));
        let short = batch_matmul_into(
            (&a, &a_shape),
            (&b, &b_shape),
            (false, true),
            (&mut out[..10], &out_shape),
        );
        assert!(short.is_err());
    }
}
