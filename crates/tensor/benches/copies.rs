//! The attention's layout copies against a plain copy of the same bytes: `permute` of the GPT
//! benchmark model's heads (`[B, S, heads, head_dim]` ↔ `[B, heads, S, head_dim]`, 16 × 128 × 4
//! × 64 f32, 2 MiB) and of a wider and a narrower head, one thread.
//!
//! The two run in interleaved rounds (copy, permute, copy, …), each timed by the thread's CPU
//! clock, with 64 MiB written between calls (untimed) so every call starts with its operands
//! out of the caches, as in a training step. Prints a Markdown table of GB/s (bytes written),
//! median (10th percentile – best round), and the median of the per-round ratio.
//!
//! Run: `cargo bench -p tessera-tensor --bench copies [-- ROUNDS]` (default 30 rounds).

mod common;

use common::{thread_cpu_seconds, values};
use tensor::kernels::permute_into;

/// `(name, shape, axes)`.
const CASES: [(&str, [usize; 4], [usize; 4]); 4] = [
    ("heads out, d 64", [16, 128, 4, 64], [0, 2, 1, 3]),
    ("heads back, d 64", [16, 4, 128, 64], [0, 2, 1, 3]),
    ("heads out, d 16", [16, 128, 16, 16], [0, 2, 1, 3]),
    ("heads out, d 128", [16, 128, 2, 128], [0, 2, 1, 3]),
];

/// Median, 10th percentile and best of `samples` (sorted in place; higher is better).
fn summary(samples: &mut [f64]) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(1.0))
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(30);
    let mut flush = vec![0u8; 64 << 20];
    println!("| case | shape | copy GB/s | permute GB/s | permute ÷ copy |");
    println!("|---|---|---|---|---|");
    for (name, shape, axes) in CASES {
        let n: usize = shape.iter().product();
        let x = values(n, 7);
        let mut out = vec![0f32; n];
        let bytes = (n * 4) as f64;
        let (mut copy, mut perm, mut ratio) = (vec![], vec![], vec![]);
        for round in 0..rounds {
            flush.fill(round as u8);
            let t = thread_cpu_seconds();
            out.copy_from_slice(&x);
            let c = thread_cpu_seconds() - t;
            std::hint::black_box(&out);
            flush.fill(round as u8 + 1);
            let t = thread_cpu_seconds();
            permute_into(&x, &shape, &axes, &mut out).expect("valid permutation");
            let p = thread_cpu_seconds() - t;
            std::hint::black_box(&out);
            copy.push(bytes / c / 1e9);
            perm.push(bytes / p / 1e9);
            ratio.push(c / p);
        }
        let (c, p, r) = (summary(&mut copy), summary(&mut perm), summary(&mut ratio));
        println!(
            "| {name} | {shape:?} | {:.1} ({:.1}–{:.1}) | {:.1} ({:.1}–{:.1}) | {:.2}× ({:.2}–{:.2}) |",
            c.0, c.1, c.2, p.0, p.1, p.2, r.0, r.1, r.2
        );
    }
}
