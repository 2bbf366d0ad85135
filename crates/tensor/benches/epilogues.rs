//! Passes after a product, one after another over the whole output or band by band (each
//! band's passes run while the band is in cache), f32, one thread. The output is written just
//! before every repetition (after a cache flush), as a product leaves it in a training step.
//!
//! 1. **Bias + GeLU** on the MLP's up product (2,048 × 1,024): the bias add in place, then the
//!    tanh GeLU into a second buffer.
//! 2. **GeLU's gradient + the bias gradient**: `dpre = gelu'(pre)·dy`, then `dpre` summed over
//!    the rows into the bias gradient.
//! 3. **Residual add + LayerNorm** (2,048 × 256): `x += h`, then LayerNorm of `x`.
//!
//! Every form gives the same bits (elementwise passes; the bias gradient sums its rows in order
//! either way); the forms run in rotated order within each round. Prints the whole-output form's
//! milliseconds and each band size's median speed against it (above 1: the bands win), p10–p90.
//!
//! Run: `cargo bench -p tessera-tensor --bench epilogues [-- ROUNDS]` (default 30 rounds).

mod common;

use common::{spread, values};
use tensor::kernels::{
    bias_add_in_place, binary_in_place, layer_norm_into, unary_grad_into, unary_into, BinaryOp,
    GeluForm, LayerNormParams, UnaryOp,
};

/// Rows per band; the first is the whole output at once.
const BANDS: [usize; 4] = [usize::MAX, 64, 32, 16];

/// Seconds of each of [`BANDS`]' forms (see [`common::rotated_rounds`]).
fn timed(rounds: usize, flush: &mut [u8], run: impl FnMut(Option<usize>)) -> Vec<Vec<f64>> {
    common::rotated_rounds(rounds, &BANDS, flush, run)
}

fn row(name: &str, times: &[Vec<f64>]) {
    let ms = spread(times[0].clone()).1 * 1e3;
    println!("| {name} | {ms:.3} |{}", common::speed_cells(times));
}

/// `f(first row, rows)` over bands of `band` rows covering `rows`.
fn banded(rows: usize, band: usize, mut f: impl FnMut(usize, usize)) {
    for first in (0..rows).step_by(band.min(rows)) {
        f(first, band.min(rows - first));
    }
}

fn main() {
    let rounds = common::rounds_arg(30);
    let mut flush = vec![0u8; 64 << 20];
    println!("| passes, f32, 1 thread | whole output, ms | 64 rows | 32 rows | 16 rows |");
    println!("|---|---:|---:|---:|---:|");

    let (rows, cols) = (2048, 1024);
    let gelu = UnaryOp::Gelu(GeluForm::Tanh);
    let product = values(rows * cols, 1);
    let bias = values(cols, 2);
    let (mut z, mut y) = (vec![0f32; rows * cols], vec![0f32; rows * cols]);
    let times = timed(rounds, &mut flush, |band| {
        let Some(band) = band else {
            return z.copy_from_slice(&product);
        };
        banded(rows, band, |first, n| {
            let part = first * cols..(first + n) * cols;
            bias_add_in_place(&mut z[part.clone()], &bias).expect("bias matches");
            unary_into(gelu, &z[part.clone()], &mut y[part]).expect("same lengths");
        })
    });
    row("bias + GeLU, 2048×1024", &times);

    let dy = values(rows * cols, 3);
    let mut dpre = vec![0f32; rows * cols];
    let mut db = vec![0f32; cols];
    let times = timed(rounds, &mut flush, |band| {
        let Some(band) = band else {
            return z.copy_from_slice(&product);
        };
        db.fill(0.0);
        banded(rows, band, |first, n| {
            let part = first * cols..(first + n) * cols;
            unary_grad_into(
                gelu,
                &z[part.clone()],
                &dy[part.clone()],
                &mut dpre[part.clone()],
            )
            .expect("same lengths");
            for r in dpre[part].chunks_exact(cols) {
                db.iter_mut().zip(r).for_each(|(acc, &v)| *acc += v);
            }
        })
    });
    row("GeLU gradient + bias gradient, 2048×1024", &times);

    let cols = 256;
    let residual = values(rows * cols, 4);
    let h = values(rows * cols, 5);
    let (gamma, beta) = (values(cols, 6), values(cols, 7));
    let params = LayerNormParams {
        gamma: &gamma,
        beta: &beta,
        epsilon: 1e-5,
    };
    let mut x = vec![0f32; rows * cols];
    let mut out = vec![0f32; rows * cols];
    let (mut mean, mut rstd) = (vec![0f32; rows], vec![0f32; rows]);
    let times = timed(rounds, &mut flush, |band| {
        let Some(band) = band else {
            return x.copy_from_slice(&residual);
        };
        banded(rows, band, |first, n| {
            let part = first * cols..(first + n) * cols;
            binary_in_place(BinaryOp::Add, &mut x[part.clone()], &h[part.clone()], true)
                .expect("same lengths");
            layer_norm_into(
                &x[part.clone()],
                params,
                &mut out[part],
                &mut mean[first..first + n],
                &mut rstd[first..first + n],
            )
            .expect("lengths match");
        })
    });
    row("residual add + LayerNorm, 2048×256", &times);
}
