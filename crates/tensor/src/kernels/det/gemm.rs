//! The canonical-order product `C ← op(A)·op(B)`, blocked for the caches.
//!
//! Every output element is the canonical tree over the reduction dim's blocks, each block a run
//! of sequential fused multiply-adds from zero. The work is cut three ways without changing
//! that order:
//! - **passes** over the reduction dim: a pass covers an aligned power-of-two run of blocks,
//!   about [`Blocking::pass_k`] elements, so its packed panels stay in cache; a pass computes
//!   the subtree of its blocks and the passes' results are joined in the same tree
//!   ([`super::TreeStack`]);
//! - **chunks** of rows of `op(A)` (a chunk stays in L2): a row-major `A` is read in place, a
//!   transposed one packed as row tiles of [`TILE_M`];
//! - **column panels** of `op(B)` of [`TILE_N`], packed into per-thread space.
//!
//! A register tile is summed by [`super::gemm_avx512`] (four, or two, neighbouring whole tiles at
//! once)
//! or [`super::gemm_avx2`] for `f32` on x86-64 CPUs that have them, and by the portable
//! [`tile_sum`] otherwise; all give the same bits (one rounding per multiply-add, the same
//! joins).

use std::array::from_fn;
use std::cell::RefCell;

use super::{local_blocks, TreeStack};
use crate::error::TensorError;
use crate::kernels::float::{same, same_mut, Float};
use crate::kernels::matmul::GemmShape;

/// Rows of a register tile.
pub(super) const TILE_M: usize = 6;
/// Columns of a register tile.
pub(super) const TILE_N: usize = 16;
/// Tree levels of a pass's blocks at most (a pass holds at most [`Blocking::WIDE`]'s
/// `pass_k` blocks).
pub(super) const PASS_LEVELS: usize = Blocking::WIDE.pass_k.trailing_zeros() as usize + 1;

/// How a product is cut for the caches of the CPU it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Blocking {
    /// Reduction elements a pass aims at.
    pass_k: usize,
    /// Bytes of `A` a chunk of rows may cover.
    chunk_bytes: usize,
    /// Rows of a chunk at most.
    chunk_rows: usize,
}

impl Blocking {
    /// With the AVX-512 tiles, whose CPUs have L2 caches of 1 MiB or more: four panels of
    /// `1024 × TILE_N` f32 are 256 KiB, and longer passes mean fewer partial products written
    /// out and joined; chunks of half the L2, so the weight gradients' few rows re-read `B`
    /// fewer times.
    const WIDE: Blocking = Blocking {
        pass_k: 1024,
        chunk_bytes: 512 << 10,
        chunk_rows: 192,
    };
    /// Otherwise: a panel of `256 × TILE_N` f32 is 16 KiB; chunks of half a 512 KiB L2.
    const NARROW: Blocking = Blocking {
        pass_k: 256,
        chunk_bytes: 256 << 10,
        chunk_rows: 96,
    };

    /// The blocking for this CPU.
    fn here() -> Blocking {
        #[cfg(target_arch = "x86_64")]
        {
            if super::gemm_avx512::available() {
                return Blocking::WIDE;
            }
        }
        Blocking::NARROW
    }

    /// Rows of `A` a chunk covers: a multiple of [`TILE_M`] whose `kc` columns fit
    /// `chunk_bytes`, at most `chunk_rows`.
    fn chunk_m<T>(self, kc: usize) -> usize {
        let fit = self.chunk_bytes / (kc * std::mem::size_of::<T>()).max(1);
        (fit.min(self.chunk_rows) / TILE_M).max(1) * TILE_M
    }

    /// The blocks a pass covers: the largest power of two dividing `nb` whose elements stay
    /// within `pass_k` (at least one block).
    fn blocks_per_pass(self, nb: usize, block_len: usize) -> usize {
        let mut q = 1;
        while q * 2 <= nb && q * 2 * block_len <= self.pass_k {
            q *= 2;
        }
        q
    }
}

/// `C ← op(A)·op(B)` with the reduction dim in canonical blocks of `block_len`
/// (`shape.k` must be whole blocks, a power-of-two count of them).
pub fn det_gemm<T: Float>(
    shape: GemmShape,
    a: &[T],
    b: &[T],
    c: &mut [T],
    block_len: usize,
) -> Result<(), TensorError> {
    det_gemm_bias(shape, a, b, None, c, block_len)
}

/// [`det_gemm`] followed by `bias[j]` (`n` elements) added to every row's column `j`: the bits
/// of the canonical product and then a separate bias add (`fl(c + b)`). In one pass over the
/// reduction (the GPT's products) each register tile takes its bias as it is stored, while it is
/// in L1; a product of several passes adds it to the joined sums.
pub fn det_gemm_bias<T: Float>(
    shape: GemmShape,
    a: &[T],
    b: &[T],
    bias: Option<&[T]>,
    c: &mut [T],
    block_len: usize,
) -> Result<(), TensorError> {
    const OP: &str = "det_gemm";
    let GemmShape { m, n, k, .. } = shape;
    crate::kernels::check::buffer_len(OP, "a", m * k, a.len())?;
    crate::kernels::check::buffer_len(OP, "b", k * n, b.len())?;
    crate::kernels::check::buffer_len(OP, "c", m * n, c.len())?;
    if let Some(bias) = bias {
        crate::kernels::check::buffer_len(OP, "bias", n, bias.len())?;
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let add_bias_to_rows = |c: &mut [T]| {
        if let Some(bias) = bias {
            c.chunks_exact_mut(n).for_each(|row| add_bias(row, bias));
        }
    };
    if k == 0 {
        c.fill(T::ZERO);
        add_bias_to_rows(c);
        return Ok(());
    }
    let nb = local_blocks(OP, k, block_len)?;
    let blocking = Blocking::here();
    let per_pass = blocking.blocks_per_pass(nb, block_len);
    let n_passes = nb / per_pass;
    let passes = Passes {
        shape,
        a,
        b,
        block_len,
        per_pass,
        blocking,
        // Several passes' sums are joined after the last one stores: the bias comes after.
        bias: bias.filter(|_| n_passes == 1),
        chain: false,
        rows: 0..m,
    };
    if n_passes == 1 {
        passes.run(0, c);
        return Ok(());
    }
    // The first pass lands in `c`, the tree's leftmost leaf (`None`), into which every join
    // along the left edge adds; the later passes go to spare buffers, reused once joined.
    passes.run(0, c);
    let mut tree: TreeStack<Option<Vec<T>>> = TreeStack::new();
    tree.push(None, |_, _| unreachable!("the first leaf joins nothing"));
    let mut spare: Vec<Vec<T>> = Vec::new();
    for p in 1..n_passes {
        let mut part = spare.pop().unwrap_or_else(|| vec![T::ZERO; m * n]);
        passes.run(p, &mut part);
        tree.push(Some(part), |mut left, right| {
            let right = right.expect("only the first leaf is `c`");
            let sum: &mut [T] = match &mut left {
                Some(left) => left,
                None => &mut *c,
            };
            for (l, r) in sum.iter_mut().zip(&right) {
                *l += *r;
            }
            spare.push(right);
            left
        });
    }
    debug_assert!(matches!(tree.finish(), Some(None)), "the root is `c`");
    add_bias_to_rows(c);
    Ok(())
}

/// Rows `rows` of `C ← op(A)·op(B) (+ bias)` into `c` (those rows only), every output one
/// fused multiply-add chain over the whole reduction in order: the canonical product's tiles,
/// in passes of at most [`Blocking::pass_k`] steps whose tiles continue the chains the pass
/// before stored (so the passes' lengths never show in the bits), with `bias[j]` (`n`
/// elements) added to every row's column `j` as the last pass stores each register tile, while
/// the tile is in L1: the bits of the product followed by a separate bias add.
pub(crate) fn chain_gemm<T: Float>(
    shape: GemmShape,
    a: &[T],
    b: &[T],
    bias: Option<&[T]>,
    (rows, c): (std::ops::Range<usize>, &mut [T]),
) -> Result<(), TensorError> {
    const OP: &str = "chain_gemm";
    let GemmShape { m, n, k, .. } = shape;
    if let Some(bias) = bias {
        crate::kernels::check::buffer_len(OP, "bias", n, bias.len())?;
    }
    crate::kernels::check::buffer_len(OP, "a", m * k, a.len())?;
    crate::kernels::check::buffer_len(OP, "b", k * n, b.len())?;
    if rows.end > m || rows.start > rows.end {
        return Err(TensorError::InvalidArgument {
            op: OP,
            reason: format!("rows {rows:?} of a product of {m} rows"),
        });
    }
    crate::kernels::check::buffer_len(OP, "c", rows.len() * n, c.len())?;
    if k == 0 || rows.is_empty() || n == 0 {
        c.fill(T::ZERO);
        if let Some(bias) = bias {
            c.chunks_exact_mut(n.max(1))
                .for_each(|row| add_bias(row, bias));
        }
        return Ok(());
    }
    let blocking = Blocking::here();
    let pass_len = k.min(blocking.pass_k);
    let passes = Passes {
        shape,
        a,
        b,
        block_len: pass_len,
        per_pass: 1,
        blocking,
        bias,
        chain: true,
        rows,
    };
    for p in 0..k.div_ceil(pass_len) {
        passes.run(p, c);
    }
    Ok(())
}

/// `row[j] += bias[j]`.
#[inline(always)]
fn add_bias<T: Float>(row: &mut [T], bias: &[T]) {
    for (v, &b) in row.iter_mut().zip(bias) {
        *v += b;
    }
}

/// One product cut into passes over the reduction dim.
struct Passes<'a, T> {
    shape: GemmShape,
    a: &'a [T],
    b: &'a [T],
    block_len: usize,
    /// Blocks per pass (a power of two).
    per_pass: usize,
    /// The cut for this CPU's caches.
    blocking: Blocking,
    /// Added to every row of the output as the last pass stores its tiles.
    bias: Option<&'a [T]>,
    /// Passes of `block_len` steps (the last one shorter) that continue each output's chain
    /// from the sums the pass before stored, instead of canonical subtrees joined afterwards.
    chain: bool,
    /// The rows of `C` computed; the output buffer holds these rows only.
    rows: std::ops::Range<usize>,
}

impl<T: Float> Passes<'_, T> {
    /// The shape of pass `p`'s work: its reduction range, the row chunks and the packed
    /// space.
    fn cut(&self, p: usize) -> PassCut {
        let full = self.per_pass * self.block_len;
        let kc = full.min(self.shape.k - p * full);
        let chunk_m = self.blocking.chunk_m::<T>(kc);
        let panel_len = packed_stride(kc * TILE_N);
        let n_panels = self.shape.n.div_ceil(TILE_N);
        // A transposed `A` is packed: in place a tile's step would read a fresh cache line.
        let a_stride = packed_stride(kc * TILE_M);
        let a_len = if self.shape.trans_a {
            chunk_m.div_ceil(TILE_M) * a_stride
        } else {
            0
        };
        PassCut {
            kc,
            k0: p * full,
            chunk_m,
            panel_len,
            n_panels,
            a_stride,
            space: n_panels * panel_len + a_len,
        }
    }

    /// Pass `p`: `out` (`[m, n]`) ← the subtree of blocks `p·per_pass ..` for every element.
    fn run(&self, p: usize, out: &mut [T]) {
        let cut = self.cut(p);
        with_scratch::<T, _>(cut.space, |space| {
            // The tile loop is compiled for the vector unit here, not in this closure: a
            // closure does not take its function's target features, and the loop's legacy
            // SSE code between the AVX-512 tiles measured a fifth of the product's time.
            #[cfg(target_arch = "x86_64")]
            {
                if super::gemm_avx2::available() {
                    // SAFETY: the CPU supports the features the function is compiled for.
                    unsafe { self.fill_fma(&cut, out, space) };
                    return;
                }
            }
            self.fill(&cut, out, space)
        })
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fill_fma(&self, cut: &PassCut, out: &mut [T], space: &mut [T]) {
        self.fill(cut, out, space)
    }

    /// The bias, if any, added to rows `first .. first + rows` of `out` in columns
    /// `col .. col + cols` when `cut` is the last pass: a tile just stored, still in L1.
    #[inline(always)]
    fn add_bias(
        &self,
        cut: &PassCut,
        out: &mut [T],
        (first, rows): (usize, usize),
        (col, cols): (usize, usize),
    ) {
        let Some(bias) = self.bias else { return };
        if cut.k0 + cut.kc < self.shape.k {
            return;
        }
        let n = self.shape.n;
        for r in first..first + rows {
            add_bias(
                &mut out[r * n + col..r * n + col + cols],
                &bias[col..col + cols],
            );
        }
    }

    /// Pass `cut` into `out`, its operands packed into `space`.
    #[inline(always)]
    fn fill(&self, cut: &PassCut, out: &mut [T], space: &mut [T]) {
        let GemmShape { m, n, k, .. } = self.shape;
        let PassCut {
            kc,
            k0,
            chunk_m,
            panel_len,
            n_panels,
            a_stride,
            ..
        } = *cut;
        let steps = Steps {
            q: self.per_pass,
            block_len: kc / self.per_pass,
            resume: self.chain && k0 > 0,
        };
        let (panels, packed_a) = space.split_at_mut(n_panels * panel_len);
        pack_b(self.b, (k, n), self.shape.trans_b, (k0, kc), panels);
        let panels = &*panels;
        let panel = |p: usize| &panels[p * panel_len..p * panel_len + kc * TILE_N];
        // `i0`, `first`: rows of the output buffer; `row0 + …`: rows of `C` and `op(A)`.
        let (row0, band) = (self.rows.start, self.rows.len());
        let mut i0 = 0;
        while i0 < band {
            let rows = chunk_m.min(band - i0);
            if self.shape.trans_a {
                pack_a_columns(self.a, m, (row0 + i0, rows), (k0, kc), packed_a);
            }
            let mut pi = 0;
            while pi < n_panels {
                let width = if (pi + WIDE) * TILE_N <= n {
                    WIDE
                } else if pi + 1 < n_panels {
                    PAIR
                } else {
                    1
                };
                for t in 0..rows.div_ceil(TILE_M) {
                    let first = i0 + t * TILE_M;
                    let here = TILE_M.min(rows - t * TILE_M);
                    let cols = (width * TILE_N).min(n - pi * TILE_N);
                    prefetch_rows(out, (first * n + pi * TILE_N, n), (here, cols));
                    let tile_a = if self.shape.trans_a {
                        RowTile::packed(&packed_a[t * a_stride..t * a_stride + kc * TILE_M])
                    } else {
                        RowTile::in_place(self.a, k, (row0 + first, here), k0)
                    };
                    // Whole neighbouring panels: summed straight into `out` where the CPU
                    // has the wide kernel (a short last row tile too: its missing rows are
                    // computed and not stored); edge panels one by one.
                    if width > 1 && (pi + width) * TILE_N <= n {
                        let at = first * n + pi * TILE_N;
                        let end = at + (here - 1) * n + width * TILE_N;
                        let dst = (&mut out[at..end], n, here);
                        let from = |p| panel(pi + p);
                        let done = match width {
                            WIDE => tiles_wide::<T, WIDE>(&tile_a, from_fn(from), steps, dst),
                            _ => tiles_wide::<T, PAIR>(&tile_a, from_fn(from), steps, dst),
                        };
                        if done {
                            self.add_bias(cut, out, (first, here), (pi * TILE_N, width * TILE_N));
                            continue;
                        }
                    }
                    for p in pi..pi + width {
                        let cols = TILE_N.min(n - p * TILE_N);
                        let mut start = [T::ZERO; TILE_M * TILE_N];
                        if steps.resume {
                            for r in 0..here {
                                let at = (first + r) * n + p * TILE_N;
                                start[r * TILE_N..r * TILE_N + cols]
                                    .copy_from_slice(&out[at..at + cols]);
                            }
                        }
                        let tile = tile(&tile_a, panel(p), steps, start);
                        for r in 0..here {
                            let at = (first + r) * n + p * TILE_N;
                            out[at..at + cols]
                                .copy_from_slice(&tile[r * TILE_N..r * TILE_N + cols]);
                        }
                        self.add_bias(cut, out, (first, here), (p * TILE_N, cols));
                    }
                }
                pi += width;
            }
            i0 += rows;
        }
    }
}

/// Asks for the cache lines of `rows` rows of `cols` elements of `out`, the first from `at`
/// and each `ldc` after the last, ahead of a tile's stores into them. A tile stores its sums
/// only at its end, into an output no one has touched since long ago: without the prefetch
/// each store waited for its line. On an Intel Xeon (AVX-512) fetching them while the tile is
/// summed took the products with canonical blocks of 16 from 0.69–0.86× to 0.86–0.99× of
/// `gemm` (`docs/PERFORMANCE.md`).
#[inline(always)]
fn prefetch_rows<T>(out: &[T], (at, ldc): (usize, usize), (rows, cols): (usize, usize)) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let per_line = (64 / std::mem::size_of::<T>()).max(1);
        for r in 0..rows {
            let row = &out[at + r * ldc..at + r * ldc + cols];
            for line in row.chunks(per_line) {
                // SAFETY: SSE is part of x86-64; a prefetch reads nothing and cannot fault.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (out, at, ldc, rows, cols);
}

/// How one pass is cut: see [`Passes::cut`].
#[derive(Debug, Clone, Copy)]
struct PassCut {
    /// Reduction elements of the pass, and the first of them.
    kc: usize,
    k0: usize,
    /// Rows of `A` per chunk.
    chunk_m: usize,
    /// Elements of a packed panel of `B`, and how many panels.
    panel_len: usize,
    n_panels: usize,
    /// Elements of a packed row tile of `A`.
    a_stride: usize,
    /// Elements of packing space the pass needs.
    space: usize,
}

/// The `TILE_M` rows of `op(A)` a register tile reads, in place or packed: element `(r, s)`
/// (row `r`, reduction step `s` of the pass) is `data[offsets[r] + s·step]`. In place, rows
/// past the matrix's end repeat its last row; their sums are never stored.
pub(super) struct RowTile<'a, T> {
    /// The operand.
    pub(super) data: &'a [T],
    /// Where each row's first step is.
    pub(super) offsets: [usize; TILE_M],
    /// The distance between a row's consecutive steps.
    pub(super) step: usize,
}

impl<'a, T> RowTile<'a, T> {
    /// Rows `first .. first + here` of `A` (row-major with `k` columns), from reduction
    /// element `k0` on.
    fn in_place(a: &'a [T], k: usize, (first, here): (usize, usize), k0: usize) -> Self {
        RowTile {
            data: a,
            offsets: from_fn(|r| (first + r.min(here - 1)) * k + k0),
            step: 1,
        }
    }

    /// A tile packed as `[steps][TILE_M]`.
    fn packed(data: &'a [T]) -> Self {
        RowTile {
            data,
            offsets: from_fn(|r| r),
            step: TILE_M,
        }
    }

    /// The same rows and steps over `data` (the operand seen as another type).
    fn over<'b, U>(&self, data: &'b [U]) -> RowTile<'b, U> {
        RowTile {
            data,
            offsets: self.offsets,
            step: self.step,
        }
    }

    /// Panics unless every element of `steps` steps lies inside `data`.
    pub(super) fn check(&self, steps: usize) {
        let last = self.offsets.iter().max().copied().unwrap_or(0) + (steps - 1) * self.step;
        assert!(
            steps > 0 && last < self.data.len(),
            "a row tile reads past its operand"
        );
    }
}

/// Column panels a step of the widest tile covers where [`tiles_wide`] runs: 24 accumulators,
/// 4 loads of `B` and 6 broadcasts of `A` per 24 multiply-adds. On an Intel Xeon (AVX-512)
/// it took deterministic mode's GPT step from 0.74× to 0.81–0.82× of the ordinary one against
/// two panels (12 accumulators, 8 loads per 12); see `docs/PERFORMANCE.md`.
const WIDE: usize = 4;
/// Column panels of the narrower wide tile, for the last panels short of [`WIDE`].
const PAIR: usize = 2;

/// The tiles of `P` neighbouring panels in one pass of the AVX-512 kernel, for `f32` on a CPU
/// that has it, written to `out` (the first `rows` of the tile's `TILE_M` rows, each
/// `P · TILE_N` wide, `ldc` apart); `false` otherwise (the caller sums the tiles one by one).
#[inline(always)]
fn tiles_wide<T: Float, const P: usize>(
    tile_a: &RowTile<'_, T>,
    panels: [&[T]; P],
    steps: Steps,
    (out, ldc, rows): (&mut [T], usize, usize),
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(a) = same::<T, f32>(tile_a.data) {
            if super::gemm_avx512::available() {
                let panels = panels.map(|panel| same::<T, f32>(panel).expect("T is f32"));
                let out = same_mut::<T, f32>(out).expect("T is f32");
                // SAFETY: the CPU supports the features the function is compiled for.
                unsafe {
                    super::gemm_avx512::tiles_f32(&tile_a.over(a), panels, steps, (out, ldc, rows))
                };
                return true;
            }
        }
    }
    let _ = (tile_a, panels, steps, out, ldc, rows);
    false
}

/// What a register tile sums: `q` canonical blocks of `block_len` steps, each from zero, joined
/// in the canonical tree; or, with `resume` (one block), `block_len` more steps of the chains
/// the tile's outputs already hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Steps {
    /// Blocks (a power of two).
    pub(super) q: usize,
    /// Steps per block.
    pub(super) block_len: usize,
    /// Continue from the sums in the output instead of starting from zero.
    pub(super) resume: bool,
}

impl Steps {
    /// `q` canonical blocks of `block_len` steps from zero.
    #[cfg(test)]
    fn blocks(q: usize, block_len: usize) -> Steps {
        Steps {
            q,
            block_len,
            resume: false,
        }
    }
}

/// A register tile's sums, row-major `[TILE_M][TILE_N]`.
type Tile<T> = [T; TILE_M * TILE_N];

/// One register tile over `steps`: `panel` is `[q·block_len][TILE_N]`; `start` holds the sums
/// a resumed chain continues (read only when `steps.resume`).
#[inline(always)]
fn tile<T: Float>(tile_a: &RowTile<'_, T>, panel: &[T], steps: Steps, start: Tile<T>) -> Tile<T> {
    #[cfg(target_arch = "x86_64")]
    {
        if let (Some(a), Some(b)) = (same::<T, f32>(tile_a.data), same::<T, f32>(panel)) {
            if super::gemm_avx2::available() {
                let mut out = [0f32; TILE_M * TILE_N];
                out.copy_from_slice(same::<T, f32>(&start).expect("T is f32"));
                let a = tile_a.over(a);
                // SAFETY: the CPU supports the features the function is compiled for.
                unsafe { super::gemm_avx2::tile_f32(&a, b, steps, &mut out) };
                let mut tile = [T::ZERO; TILE_M * TILE_N];
                same_mut::<T, f32>(&mut tile)
                    .expect("T is f32")
                    .copy_from_slice(&out);
                return tile;
            }
        }
    }
    tile_sum(tile_a, panel, steps, start)
}

/// The portable register tile: per block the sums in `k` order, the blocks joined in the
/// canonical tree as they finish (a binary counter: a finished block joins the equal-sized
/// subtrees before it); a resumed chain starts from `start`.
#[inline(always)]
fn tile_sum<T: Float>(
    tile_a: &RowTile<'_, T>,
    panel: &[T],
    steps: Steps,
    start: Tile<T>,
) -> Tile<T> {
    let Steps { q, block_len, .. } = steps;
    assert!(q.is_power_of_two() && q < 1 << PASS_LEVELS);
    assert!(!steps.resume || q == 1, "a resumed chain is one block");
    tile_a.check(q * block_len);
    let mut stack = [[T::ZERO; TILE_M * TILE_N]; PASS_LEVELS];
    for blk in 0..q {
        let mut acc = match steps.resume {
            true => start,
            false => [T::ZERO; TILE_M * TILE_N],
        };
        for kk in blk * block_len..(blk + 1) * block_len {
            let brow = &panel[kk * TILE_N..(kk + 1) * TILE_N];
            for (acc_r, &off) in acc.chunks_exact_mut(TILE_N).zip(&tile_a.offsets) {
                let av = tile_a.data[off + kk * tile_a.step];
                for (x, &bv) in acc_r.iter_mut().zip(brow) {
                    *x = av.mul_add(bv, *x);
                }
            }
        }
        let mut level = 0;
        let mut done = blk + 1;
        while done % 2 == 0 {
            for (l, r) in stack[level].iter().zip(acc.iter_mut()) {
                *r = *l + *r;
            }
            done /= 2;
            level += 1;
        }
        stack[level] = acc;
    }
    stack[q.trailing_zeros() as usize]
}

/// Elements from one packed block of `len` elements (a row tile of `A`, a column panel of `B`)
/// to the next: at least a cache line more than the block, so that the blocks do not start a
/// multiple of 4 KiB apart. Packing writes to every tile of a chunk in turn, a pair's two panels
/// are read in step, and lines 4 KiB apart share an L1 set.
fn packed_stride(len: usize) -> usize {
    len + 16
}

/// Rows `i0..i0 + rows` and columns `k0..k0 + kc` of `op(A) = Aᵀ` (`A` is `[k, m]`) as row
/// tiles of [`TILE_M`]: tile `t` holds `[kc][TILE_M]` (zero-padded) from element
/// `t · packed_stride(kc * TILE_M)` on. Each row of `A` is read
/// once, in order, and dealt out to the tiles in fixed-size pieces (a copy of a run whose
/// length the compiler does not know is a `memcpy` call per [`TILE_M`] elements).
fn pack_a_columns<T: Float>(
    a: &[T],
    m: usize,
    (i0, rows): (usize, usize),
    (k0, kc): (usize, usize),
    out: &mut [T],
) {
    let tile_len = packed_stride(kc * TILE_M);
    let out = &mut out[..rows.div_ceil(TILE_M) * tile_len];
    for kk in 0..kc {
        let at = (k0 + kk) * m + i0;
        let row = &a[at..at + rows];
        let mut whole = row.chunks_exact(TILE_M);
        for (src, tile) in whole.by_ref().zip(out.chunks_exact_mut(tile_len)) {
            let dst: &mut [T; TILE_M] = (&mut tile[kk * TILE_M..(kk + 1) * TILE_M])
                .try_into()
                .expect("TILE_M elements");
            *dst = src.try_into().expect("TILE_M elements");
        }
        let rest = whole.remainder();
        if !rest.is_empty() {
            let t = rows / TILE_M;
            let dst = &mut out[t * tile_len + kk * TILE_M..t * tile_len + (kk + 1) * TILE_M];
            dst[..rest.len()].copy_from_slice(rest);
            dst[rest.len()..].fill(T::ZERO);
        }
    }
}

/// Rows `k0..k0 + kc` of `op(B)` (`[k, n]`) as column panels of [`TILE_N`] into `out`: panel
/// `p` holds `[kc][TILE_N]` (zero-padded) from element `p · packed_stride(kc * TILE_N)` on. Every
/// element of the panels is written.
fn pack_b<T: Float>(
    b: &[T],
    (k, n): (usize, usize),
    trans: bool,
    (k0, kc): (usize, usize),
    out: &mut [T],
) {
    let stride = packed_stride(kc * TILE_N);
    let n_panels = n.div_ceil(TILE_N);
    let whole = n / TILE_N;
    if !trans {
        // Row by row, each row of `B` read once in order and dealt out to the panels in
        // fixed-size pieces (a run of unknown length would be a `memcpy` call each).
        for kk in 0..kc {
            let row = &b[(k0 + kk) * n..(k0 + kk + 1) * n];
            for (p, src) in row.chunks_exact(TILE_N).enumerate() {
                let at = p * stride + kk * TILE_N;
                let dst: &mut [T; TILE_N] = (&mut out[at..at + TILE_N])
                    .try_into()
                    .expect("TILE_N elements");
                *dst = src.try_into().expect("TILE_N elements");
            }
            if whole < n_panels {
                let at = whole * stride + kk * TILE_N;
                let rest = &row[whole * TILE_N..];
                out[at..at + rest.len()].copy_from_slice(rest);
                out[at + rest.len()..at + TILE_N].fill(T::ZERO);
            }
        }
        return;
    }
    for p in 0..n_panels {
        let panel = &mut out[p * stride..p * stride + kc * TILE_N];
        let cols = TILE_N.min(n - p * TILE_N);
        if cols < TILE_N {
            panel.fill(T::ZERO);
        } else {
            // Squares of TILE_N × TILE_N: fixed-size reads of the panel's rows of `B`, then
            // fixed-size writes of the panel's steps, all in registers or L1.
            let whole_k = kc / TILE_N * TILE_N;
            for s0 in (0..whole_k).step_by(TILE_N) {
                let square: [[T; TILE_N]; TILE_N] = from_fn(|cc| {
                    let at = (p * TILE_N + cc) * k + k0 + s0;
                    b[at..at + TILE_N].try_into().expect("TILE_N elements")
                });
                for (kk, dst) in panel[s0 * TILE_N..(s0 + TILE_N) * TILE_N]
                    .chunks_exact_mut(TILE_N)
                    .enumerate()
                {
                    let dst: &mut [T; TILE_N] = dst.try_into().expect("TILE_N elements");
                    *dst = from_fn(|cc| square[cc][kk]);
                }
            }
            for cc in 0..TILE_N {
                let row = (p * TILE_N + cc) * k + k0;
                for kk in whole_k..kc {
                    panel[kk * TILE_N + cc] = b[row + kk];
                }
            }
            continue;
        }
        // Column `cc` of the panel is a run of row `p·TILE_N + cc` of `B`: read it in order.
        for cc in 0..cols {
            let src = &b[(p * TILE_N + cc) * k + k0..(p * TILE_N + cc) * k + k0 + kc];
            for (kk, &x) in src.iter().enumerate() {
                panel[kk * TILE_N + cc] = x;
            }
        }
    }
}

/// A cache line of packing space: the space starts on a line, so every packed panel (a whole
/// number of lines long, [`packed_stride`]) does too, and a tile step's 16-float load of `B`
/// reads one line, not two. On an Intel Xeon (AVX-512) the loads of a space from the
/// allocator (16 bytes past a line) split every one of them across two lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

impl Line {
    /// A line of zero bits.
    const ZERO: Line = Line([0; 8]);
}

thread_local! {
    /// Packing space the thread's products reuse, so a product does not fault in fresh pages.
    static SCRATCH: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// `len` elements of `T` over the start of `space` (which must cover them).
fn line_view<T: Float>(space: &mut [Line], len: usize) -> &mut [T] {
    assert!(len * std::mem::size_of::<T>() <= std::mem::size_of_val(space));
    // SAFETY: `T` is f32 or f64 (`Float` is sealed): plain data for which every bit pattern
    // is a value, aligned at most to 8 as the lines are (to 64); the assert keeps `len`
    // elements inside `space`, which the returned slice borrows.
    unsafe { std::slice::from_raw_parts_mut(space.as_mut_ptr().cast::<T>(), len) }
}

/// Runs `f` on `len` elements of this thread's packing space, starting on a cache line. The
/// contents are stale: `f` must write every element before it reads it.
fn with_scratch<T: Float, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    let lines = (len * std::mem::size_of::<T>()).div_ceil(std::mem::size_of::<Line>());
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut space) => {
            if space.len() < lines {
                space.resize(lines, Line::ZERO);
            }
            f(line_view(&mut space, len))
        }
        // A product inside a product on this thread: a space of its own.
        Err(_) => f(line_view(&mut vec![Line::ZERO; lines], len)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * 10f32.powi((i % 5) as i32 - 2)
            })
            .collect()
    }

    /// The packing space starts on a cache line, the thread's reused one and a nested
    /// product's own alike, so the packed panels' 16-float loads each read one line.
    #[test]
    fn packing_space_starts_on_a_cache_line() {
        let line = |p: *const f32| p as usize % 64;
        for len in [1, 1000, 123_457] {
            with_scratch::<f32, _>(len, |outer| {
                assert_eq!(outer.len(), len);
                assert_eq!(
                    line(outer.as_ptr()),
                    0,
                    "the thread's space, {len} elements"
                );
                with_scratch::<f64, _>(len, |inner| {
                    assert_eq!(inner.len(), len);
                    assert_eq!(line(inner.as_ptr().cast()), 0, "a nested product's space");
                });
            });
        }
    }

    /// The intrinsics tile and the portable tile give the same bits, for every block shape.
    #[test]
    fn simd_and_portable_tiles_agree_bit_for_bit() {
        for (q, block_len) in [
            (1, 1),
            (1, 7),
            (2, 3),
            (4, 4),
            (8, 32),
            (16, 16),
            (1, 16),
            (2, 16),
            (1, 300),
            (64, 4),
            (32, 1),
            (1, 4),
            (1, 8),
            (16, 8),
        ] {
            let steps = q * block_len;
            let data = values(steps * TILE_M, 5 + q as u64);
            // The packed layout `[steps][TILE_M]`.
            let a = RowTile::packed(&data);
            let b = values(steps * TILE_N, 11 + block_len as u64);
            let zero = [0f32; TILE_M * TILE_N];
            let blocks = Steps::blocks(q, block_len);
            let portable = tile_sum(&a, &b, blocks, zero);
            let routed = tile(&a, &b, blocks, zero);
            assert_eq!(
                portable.map(f32::to_bits),
                routed.map(f32::to_bits),
                "{q} blocks of {block_len}"
            );
            // Other panels, each its own B, so swapped panels would show.
            let others: Vec<Vec<f32>> = (1..WIDE as u64)
                .map(|p| values(steps * TILE_N, 17 * p + block_len as u64))
                .collect();
            let mut wants = vec![portable];
            wants.extend(others.iter().map(|b| tile_sum(&a, b, blocks, zero)));
            let pair = [&b[..], &others[0][..]];
            let wide: [&[f32]; WIDE] = from_fn(|p| match p {
                0 => &b[..],
                _ => &others[p - 1][..],
            });
            check_wide(&a, pair, &wants, blocks);
            check_wide(&a, wide, &wants, blocks);
        }
    }

    /// A chain resumed from the sums a first run of steps stored is the one chain over all
    /// the steps, bit for bit, on the portable tile, the routed one and the wide ones.
    #[test]
    fn a_resumed_chain_is_the_whole_chain() {
        for (first, rest) in [(1, 1), (16, 5), (300, 724), (7, 16)] {
            let steps = first + rest;
            let data = values(steps * TILE_M, 3 + first as u64);
            let b = values(steps * TILE_N, 13 + rest as u64);
            let zero = [0f32; TILE_M * TILE_N];
            let whole = tile_sum(&RowTile::packed(&data), &b, Steps::blocks(1, steps), zero);
            let a0 = RowTile::packed(&data[..first * TILE_M]);
            let a1 = RowTile::packed(&data[first * TILE_M..]);
            let (b0, b1) = (&b[..first * TILE_N], &b[first * TILE_N..]);
            let resume = Steps {
                q: 1,
                block_len: rest,
                resume: true,
            };
            let head = tile_sum(&a0, b0, Steps::blocks(1, first), zero);
            for got in [tile_sum(&a1, b1, resume, head), tile(&a1, b1, resume, head)] {
                assert_eq!(
                    got.map(f32::to_bits),
                    whole.map(f32::to_bits),
                    "{first} + {rest}"
                );
            }
            // The wide tiles resume from the output rows themselves.
            let ldc = PAIR * TILE_N;
            let mut out = vec![0f32; TILE_M * ldc];
            for r in 0..TILE_M {
                for p in 0..PAIR {
                    let at = r * ldc + p * TILE_N;
                    out[at..at + TILE_N].copy_from_slice(&head[r * TILE_N..(r + 1) * TILE_N]);
                }
            }
            if tiles_wide(&a1, [b1, b1], resume, (&mut out, ldc, TILE_M)) {
                for r in 0..TILE_M {
                    for p in 0..PAIR {
                        let at = r * ldc + p * TILE_N;
                        let want = &whole[r * TILE_N..(r + 1) * TILE_N];
                        let same = out[at..at + TILE_N].iter().zip(want);
                        assert!(same.clone().all(|(g, w)| g.to_bits() == w.to_bits()));
                    }
                }
            }
        }
    }

    /// [`tiles_wide`] over `panels` against the portable tiles `wants` of each, with a wider
    /// row stride than the tiles (the gap must stay untouched) and a full and a short row tile
    /// (which stores only its rows: nothing after them is written).
    fn check_wide<const P: usize>(
        a: &RowTile<'_, f32>,
        panels: [&[f32]; P],
        wants: &[Tile<f32>],
        steps: Steps,
    ) {
        let Steps { q, block_len, .. } = steps;
        let ldc = P * TILE_N + 3;
        for rows in [TILE_M, 2] {
            let mut out = vec![f32::NAN; TILE_M * ldc];
            let stored = (rows - 1) * ldc + P * TILE_N;
            if !tiles_wide(a, panels, steps, (&mut out[..stored], ldc, rows)) {
                return;
            }
            for r in 0..rows {
                for (p, want) in wants.iter().take(P).enumerate() {
                    let got = &out[r * ldc + p * TILE_N..r * ldc + (p + 1) * TILE_N];
                    assert_eq!(
                        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        want[r * TILE_N..(r + 1) * TILE_N]
                            .iter()
                            .map(|x| x.to_bits())
                            .collect::<Vec<_>>(),
                        "{P} panels, {rows} rows, {q} blocks of {block_len}: panel {p}, row {r}"
                    );
                }
                assert!(out[r * ldc + P * TILE_N..(r + 1) * ldc]
                    .iter()
                    .all(|x| x.is_nan()));
            }
            assert!(out[rows * ldc..].iter().all(|x| x.is_nan()), "{rows} rows");
        }
    }

    #[test]
    fn a_pass_is_a_power_of_two_run_of_blocks_near_pass_k() {
        let (narrow, wide) = (Blocking::NARROW, Blocking::WIDE);
        assert_eq!(narrow.blocks_per_pass(16, 16), 16);
        assert_eq!(narrow.blocks_per_pass(16, 128), 2);
        assert_eq!(wide.blocks_per_pass(16, 128), 8);
        assert_eq!(narrow.blocks_per_pass(8, 512), 1);
        assert_eq!(wide.blocks_per_pass(1, 4), 1);
        assert_eq!(narrow.chunk_m::<f32>(256), 96);
        assert_eq!(wide.chunk_m::<f32>(1024), 126);
        assert_eq!(wide.chunk_m::<f32>(1 << 20), TILE_M);
    }

    /// `det_gemm` against a plain per-element reference in the canonical order, for every
    /// transposition, with partial row tiles and panel counts that run every width of tile.
    fn check_against_reference<T: Float + From<f32>>(m: usize, n: usize, k: usize, nb: usize) {
        let bl = k / nb;
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let a: Vec<T> = values(m * k, 3).into_iter().map(T::from).collect();
            let b: Vec<T> = values(k * n, 4).into_iter().map(T::from).collect();
            let at = |i: usize, kk: usize| {
                if trans_a {
                    a[kk * m + i]
                } else {
                    a[i * k + kk]
                }
            };
            let bt = |kk: usize, j: usize| {
                if trans_b {
                    b[j * k + kk]
                } else {
                    b[kk * n + j]
                }
            };
            let shape = GemmShape {
                trans_a,
                trans_b,
                ..GemmShape::new(m, n, k)
            };
            // Every element must be written: stale values would show.
            let mut c = vec![T::from(f32::NAN); m * n];
            det_gemm(shape, &a, &b, &mut c, bl).unwrap();
            for i in 0..m {
                for j in 0..n {
                    let want = crate::kernels::tree::tree_reduce(
                        nb,
                        &mut |blk| {
                            (blk * bl..(blk + 1) * bl)
                                .fold(T::ZERO, |acc, kk| at(i, kk).mul_add(bt(kk, j), acc))
                        },
                        &mut |x, y| x + y,
                    );
                    assert!(
                        c[i * n + j] == want,
                        "({i}, {j}) of {m}×{n}×{k}, transposed {trans_a}/{trans_b}"
                    );
                }
            }
        }
    }

    /// `f32` runs the SIMD tiles where the CPU has them: their bits against the reference.
    #[test]
    fn f32_products_follow_the_canonical_order() {
        check_against_reference::<f32>(13, 40, 64, 16);
        check_against_reference::<f32>(7, 19, 2048, 16);
        // Four passes (the first one's result joined in `c`), paired panels, short row tiles.
        check_against_reference::<f32>(13, 40, 4096, 32);
        // A pass that is not whole squares of TILE_N steps (transposed `B`'s packing).
        check_against_reference::<f32>(9, 33, 24, 8);
        // Four panels at once, then a pair, then a short edge panel (103 = 4·16 + 2·16 + 7);
        // two sets of four.
        check_against_reference::<f32>(13, 103, 64, 16);
        check_against_reference::<f32>(7, 135, 256, 16);
    }

    /// `f64` (the portable tile) against the reference over several passes.
    #[test]
    fn f64_products_follow_the_canonical_order() {
        check_against_reference::<f64>(7, 19, 1024, 8);
    }
}
