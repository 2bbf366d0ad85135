//! Products cut into bands of rows, against one call, on the `gemm` crate directly (the
//! engine's `gemm` itself cuts at `kernels::solo_band_rows`, from the L2 cache), f32, one thread,
//! caches flushed before every repetition as in a training step:
//!
//! 1. **Products alone**: the GPT benchmark model's 2,048-row products (forward `X·Wᵀ`, `dX =
//!    dY·W`) and its weight gradients with 768 and 1,024 rows (`dW = dYᵀ·X`), as one call and
//!    as calls of 1,024, 512 and 256 rows.
//! 2. **A bias + GeLU epilogue**: the MLP-up product `X·Wᵀ` (2,048 × 1,024 × 256) followed by the
//!    bias add and the tanh GeLU, as one product then the two passes over the 8 MiB output, or
//!    band by band, each band's product followed at once by its bias add and GeLU while the band
//!    is still in cache (the crate has no epilogue hook; it packs `Wᵀ` again for every band).
//!
//! The forms run in rotated order within each round so that all see the same machine load; each
//! is timed by the thread's CPU clock. Prints the one-call form's GFLOP/s (or milliseconds) and
//! every band size's median per-round speed against it (above 1: the bands win), p10–p90.
//!
//! Run: `cargo bench -p tessera-tensor --bench bands [-- ROUNDS]` (default 30 rounds).

mod common;

use common::{speed_cells, spread, values};
use tensor::kernels::{bias_add_in_place, unary_into, GeluForm, UnaryOp};

/// Rows per call; the first is the whole product in one call.
const BANDS: [usize; 4] = [usize::MAX, 1024, 512, 256];

/// A product `C[m×n] = op(A)·op(B)` over `k`, with its transposes, and its name.
#[derive(Clone, Copy)]
struct Product {
    name: &'static str,
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
}

const fn product(
    name: &'static str,
    (m, n, k): (usize, usize, usize),
    ta: bool,
    tb: bool,
) -> Product {
    Product {
        name,
        m,
        n,
        k,
        trans_a: ta,
        trans_b: tb,
    }
}

/// The GPT's (`Dense` keeps `[out, in]`) products with at least 768 rows.
const PRODUCTS: [Product; 10] = [
    product("qkv forward X·Wᵀ", (2048, 768, 256), false, true),
    product("fc1 forward X·Wᵀ", (2048, 1024, 256), false, true),
    product("fc2 forward X·Wᵀ", (2048, 256, 1024), false, true),
    product("proj forward X·Wᵀ", (2048, 256, 256), false, true),
    product("qkv dX dY·W", (2048, 256, 768), false, false),
    product("fc1 dX dY·W", (2048, 256, 1024), false, false),
    product("fc2 dX dY·W", (2048, 1024, 256), false, false),
    product("lm head dX dY·W", (2048, 256, 256), false, false),
    product("qkv dW dYᵀ·X", (768, 256, 2048), true, false),
    product("fc1 dW dYᵀ·X", (1024, 256, 2048), true, false),
];

/// `c[first..first + rows]` ← rows `first..` of `op(A)·op(B)`, one `gemm` crate call.
fn rows_of(p: Product, (a, b, c): (&[f32], &[f32], &mut [f32]), first: usize, rows: usize) {
    let (m, n, k) = (p.m, p.n, p.k);
    assert!(first + rows <= m && a.len() == m * k && b.len() == k * n && c.len() == m * n);
    let (a_rs, a_cs) = if p.trans_a {
        (1, m as isize)
    } else {
        (k as isize, 1)
    };
    let (b_rs, b_cs) = if p.trans_b {
        (1, k as isize)
    } else {
        (n as isize, 1)
    };
    // SAFETY: the assert keeps rows `first..first + rows` of every operand, at these strides,
    // inside its slice; `c` is borrowed mutably and cannot alias `a` or `b`.
    unsafe {
        gemm::gemm(
            rows,
            n,
            k,
            c.as_mut_ptr().add(first * n),
            1,
            n as isize,
            false,
            a.as_ptr().offset(first as isize * a_rs),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// `(p10, median, p90)` of `samples`.
/// Seconds of each of [`BANDS`]' forms over `rounds` rotated rounds, the caches flushed first.
fn timed(rounds: usize, flush: &mut [u8], mut run: impl FnMut(usize)) -> Vec<Vec<f64>> {
    common::rotated_rounds(rounds, &BANDS, flush, |band| {
        if let Some(band) = band {
            run(band)
        }
    })
}

fn main() {
    let rounds = common::rounds_arg(30);
    let mut flush = vec![0u8; 64 << 20];
    println!(
        "| product, f32, 1 thread | m×n×k | one call GFLOP/s | 1,024 rows | 512 rows | 256 rows |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for p in PRODUCTS {
        let (a, b) = (values(p.m * p.k, 1), values(p.k * p.n, 2));
        let mut c = vec![0f32; p.m * p.n];
        let times = timed(rounds, &mut flush, |band| {
            for first in (0..p.m).step_by(band.min(p.m)) {
                let rows = band.min(p.m - first);
                rows_of(p, (&a, &b, &mut c), first, rows);
            }
        });
        let flops = 2.0 * (p.m * p.n * p.k) as f64;
        let rate = flops / spread(times[0].clone()).1 / 1e9;
        let (m, n, k) = (p.m, p.n, p.k);
        println!(
            "| {} | {m}×{n}×{k} | {rate:.1} |{}",
            p.name,
            speed_cells(&times)
        );
    }

    let p = PRODUCTS[1];
    let (x, w, bias) = (values(p.m * p.k, 3), values(p.n * p.k, 4), values(p.n, 5));
    let (mut z, mut y) = (vec![0f32; p.m * p.n], vec![0f32; p.m * p.n]);
    let gelu = UnaryOp::Gelu(GeluForm::Tanh);
    let times = timed(rounds, &mut flush, |band| {
        for first in (0..p.m).step_by(band.min(p.m)) {
            let rows = band.min(p.m - first);
            rows_of(p, (&x, &w, &mut z), first, rows);
            let part = first * p.n..(first + rows) * p.n;
            bias_add_in_place(&mut z[part.clone()], &bias).expect("bias matches");
            unary_into(gelu, &z[part.clone()], &mut y[part]).expect("same lengths");
        }
    });
    let ms = spread(times[0].clone()).1 * 1e3;
    println!();
    println!(
        "| {} + bias + GeLU | one call then the passes, ms | 1,024 rows | 512 rows | 256 rows |",
        p.name
    );
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| {}×{}×{} | {ms:.2} |{}",
        p.m,
        p.n,
        p.k,
        speed_cells(&times)
    );
}
