//! The elementwise functions networks spend their time in, f32, one thread: nanoseconds per
//! element of the tanh and erf GeLU, tanh, sigmoid, exp and log, forward and gradient, over the
//! GPT's MLP up product (2,048 × 1,024), the input cold (caches flushed before each repetition,
//! as in a training step) and warm (the same pass again right after); and the cross-entropy
//! loss (its rows' log-sum-exp) over 64 rows of a 32,768-token vocabulary, per logit.
//!
//! Run: `cargo bench -p tessera-tensor --bench unary [-- ROUNDS]` (default 20 rounds). Prints
//! the median (p10–p90) over the rounds.

mod common;

use common::{spread, thread_cpu_seconds, values};
use tensor::kernels::{
    sparse_softmax_cross_entropy_slice, unary_grad_into, unary_into, GeluForm, UnaryOp,
};

/// Elements of the MLP's up product in the GPT benchmark (2,048 tokens × 1,024).
const LEN: usize = 2048 * 1024;

fn main() {
    let rounds = common::rounds_arg(20);
    let mut flush = vec![0u8; 64 << 20];
    // Pre-activations as a product leaves them: most within a few units of 0.
    let x: Vec<f32> = values(LEN, 1).iter().map(|v| v * 4.0).collect();
    let dy = values(LEN, 2);
    let (mut y, mut dx) = (vec![0.0f32; LEN], vec![0.0f32; LEN]);
    println!("| pass, f32, 1 thread, {LEN} elements | cold ns/element | warm ns/element |");
    println!("|---|---:|---:|");
    // The logarithm's inputs: positive, over the same few orders of magnitude.
    let positive: Vec<f32> = x.iter().map(|v| v.abs() + 1e-3).collect();
    let ops = [
        ("GeLU (tanh)", UnaryOp::Gelu(GeluForm::Tanh), &x),
        ("GeLU (erf)", UnaryOp::Gelu(GeluForm::Erf), &x),
        ("tanh", UnaryOp::Tanh, &x),
        ("sigmoid", UnaryOp::Sigmoid, &x),
        ("exp", UnaryOp::Exp, &x),
        ("log", UnaryOp::Log, &positive),
    ];
    for (name, op, input) in ops {
        let mut forward = || unary_into(op, input, &mut y).expect("same lengths");
        row(name, rounds, &mut flush, &mut forward);
        // The gradient's saved tensor is x or y by op; either is fine for timing.
        let mut backward = || unary_grad_into(op, input, &dy, &mut dx).expect("same lengths");
        row(
            &format!("{name} gradient"),
            rounds,
            &mut flush,
            &mut backward,
        );
    }
    let labels: Vec<i64> = (0..LEN as i64 / VOCAB as i64).map(|r| r * 7).collect();
    let mut loss = || {
        let loss = sparse_softmax_cross_entropy_slice(&x, VOCAB, &labels).expect("valid rows");
        std::hint::black_box(loss);
    };
    row("cross-entropy loss", rounds, &mut flush, &mut loss);
    std::hint::black_box((&y, &dx));
}

/// The loss's classes: a subword vocabulary's size (its rows cover [`LEN`] logits).
const VOCAB: usize = 32_768;

/// Times `pass` cold (after a flush) and warm (run again at once), `rounds` times each.
fn row(name: &str, rounds: usize, flush: &mut [u8], pass: &mut dyn FnMut()) {
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        flush
            .iter_mut()
            .for_each(|b| *b = b.wrapping_add(round as u8 | 1));
        std::hint::black_box(&*flush);
        for times in [&mut cold, &mut warm] {
            let start = thread_cpu_seconds();
            pass();
            times.push((thread_cpu_seconds() - start) * 1e9 / LEN as f64);
        }
    }
    let cell = |t: Vec<f64>| {
        let (lo, mid, hi) = spread(t);
        format!("{mid:.3} ({lo:.3}–{hi:.3})")
    };
    println!("| {name} | {} | {} |", cell(cold), cell(warm));
}
