//! Whether a bias + GeLU epilogue pays on the `gemm` crate, which has no epilogue hook: the
//! GPT's MLP-up product `X·Wᵀ` (2,048 × 256 by 1,024 × 256, f32, one thread) followed by the bias
//! add and the tanh GeLU, either as the engine runs it (one product, then the two passes over
//! the 8 MiB output) or cut into bands of rows, each band's product followed at once by its
//! bias add and GeLU while the band is still in cache (the `gemm` crate packs `Wᵀ` again for
//! every band). The caches are flushed before every repetition, as in a training step.
//!
//! The forms run in rotated order within each round so that all see the same machine load; each
//! is timed by the thread's CPU clock. Prints each form's median milliseconds and its median
//! per-round speed against the whole product (above 1: the bands win), with p10–p90.
//!
//! Run: `cargo bench -p tessera-tensor --bench epilogue [-- ROUNDS]` (default 40 rounds).

mod common;

use common::{thread_cpu_seconds, values};
use tensor::kernels::{bias_add_in_place, gemm, unary_into, GeluForm, GemmShape, UnaryOp};

/// Rows of `X` (tokens), output features, input features.
const M: usize = 2048;
const N: usize = 1024;
const K: usize = 256;

/// Rows per band; 0 is the whole product then the two passes.
const BANDS: [usize; 6] = [0, 64, 128, 256, 512, 1024];

/// `(sorted[p10], sorted[median], sorted[p90])` of `samples`.
fn spread(samples: &mut [f64]) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: usize| samples[(samples.len() - 1) * q / 10];
    (at(1), at(5), at(9))
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(40)
        .max(1);
    let (x, w, bias) = (values(M * K, 1), values(N * K, 2), values(N, 3));
    let (mut z, mut y) = (vec![0f32; M * N], vec![0f32; M * N]);
    let gelu = UnaryOp::Gelu(GeluForm::Tanh);
    let shape = |rows| GemmShape {
        m: rows,
        n: N,
        k: K,
        trans_a: false,
        trans_b: true,
    };
    // Product, bias add and GeLU of rows `r0 .. r0 + rows`.
    let mut band = |r0: usize, rows: usize| {
        let (z, y) = (
            &mut z[r0 * N..(r0 + rows) * N],
            &mut y[r0 * N..(r0 + rows) * N],
        );
        gemm(shape(rows), 1.0, &x[r0 * K..(r0 + rows) * K], &w, 0.0, z).expect("valid shape");
        bias_add_in_place(z, &bias).expect("bias matches");
        unary_into(gelu, z, y).expect("same lengths");
    };
    let mut flush = vec![0u8; 64 << 20];
    let mut times = vec![Vec::with_capacity(rounds); BANDS.len()];
    for round in 0..rounds {
        for i in (0..BANDS.len()).map(|i| (i + round) % BANDS.len()) {
            flush
                .iter_mut()
                .for_each(|b| *b = b.wrapping_add(round as u8 | 1));
            std::hint::black_box(&flush);
            let rows = if BANDS[i] == 0 { M } else { BANDS[i] };
            let start = thread_cpu_seconds();
            for r0 in (0..M).step_by(rows) {
                band(r0, rows);
            }
            times[i].push(thread_cpu_seconds() - start);
        }
    }
    println!(
        "| MLP up {M}×{N}×{K} Bᵀ + bias + GeLU, f32, 1 thread | ms | speed vs whole (p10–p90) |"
    );
    println!("|---|---:|---:|");
    for (i, &rows) in BANDS.iter().enumerate() {
        let mut speed: Vec<f64> = times[0].iter().zip(&times[i]).map(|(w, t)| w / t).collect();
        let (lo, mid, hi) = spread(&mut speed);
        let ms = spread(&mut times[i].clone()).1 * 1e3;
        let form = if rows == 0 {
            "whole product, then the passes".to_string()
        } else {
            format!("bands of {rows} rows")
        };
        println!("| {form} | {ms:.2} | {mid:.3} ({lo:.3}–{hi:.3}) |");
    }
}
