//! Whether the GPT's products run slower in a training step because their operands come from
//! main memory: each product on the routed backend ([`GemmBackend::for_shape`]) from five
//! starting points, after a 96 MiB flush — everything cold (main memory); the output `C` just
//! written (so in L3, or L2 as far as it fits); the operands `A` and `B` just read; all three
//! just touched; the same product just run (as the utilisation line's peak runs it, back to
//! back). f32, one thread, timed by the thread's CPU clock, the forms rotated within each
//! round. Prints each form's GFLOP/s at its median and the warm forms' per-round speed against
//! the cold one's (above 1: warmth helps; p10–p90).
//!
//! Run: `cargo bench -p tessera-tensor --bench operand_warmth [-- ROUNDS]` (default 20 rounds).

mod common;

use common::{speed_cells, spread, values};
use tensor::kernels::gemm;

/// The products timed: of [`common::GPT_PRODUCTS`], the `qkv` and `fc1` forwards, the `fc2` and
/// `qkv` `dX`, the `qkv` and `fc2` weight gradients.
const PICKED: [usize; 6] = [0, 1, 6, 4, 8, 10];

/// What each form touches after the flush: (`C`, `A` and `B`, the product itself).
const FORMS: [(&str, bool, bool, bool); 5] = [
    ("all cold", false, false, false),
    ("C warm", true, false, false),
    ("A, B warm", false, true, false),
    ("all warm", true, true, false),
    ("run just before", false, false, true),
];

fn main() {
    let rounds = common::rounds_arg(20);
    let mut flush = vec![0u8; 96 << 20];
    let names: Vec<&str> = FORMS.iter().map(|f| f.0).collect();
    println!(
        "| product, f32, 1 thread | m×n×k | {} GFLOP/s | {} ÷ cold |",
        names.join(" GFLOP/s | "),
        names[1..].join(" ÷ cold | ")
    );
    println!("|---|---|{}", "---:|".repeat(2 * FORMS.len() - 1));
    for (name, s) in PICKED.map(|i| common::GPT_PRODUCTS[i]) {
        let (a, b) = (values(s.m * s.k, 1), values(s.k * s.n, 2));
        let mut c = vec![0f32; s.m * s.n];
        let forms: Vec<usize> = (0..FORMS.len()).collect();
        // Timed calls so far: `rotated_rounds` runs round `r`'s forms from form `r` on.
        let mut done = 0;
        let times = common::rotated_rounds(rounds, &forms, &mut flush, |form| match form {
            // The set-up call: warm what the form about to be timed starts from.
            None => {
                let n = FORMS.len();
                let (_, warm_c, warm_ab, again) = FORMS[(done % n + done / n) % n];
                if warm_c {
                    c.iter_mut().for_each(|x| *x += 1.0);
                    std::hint::black_box(&mut c);
                }
                if warm_ab {
                    std::hint::black_box(a.iter().sum::<f32>() + b.iter().sum::<f32>());
                }
                if again {
                    gemm(s, 1.0, &a, &b, 0.0, &mut c).expect("valid shape");
                }
            }
            Some(_) => {
                gemm(s, 1.0, &a, &b, 0.0, &mut c).expect("valid shape");
                done += 1;
            }
        });
        let flops = s.flops() as f64;
        let rates: Vec<String> = times
            .iter()
            .map(|t| format!("{:.1}", flops / spread(t.clone()).1 / 1e9))
            .collect();
        println!(
            "| {name} | {}×{}×{} | {} |{}",
            s.m,
            s.n,
            s.k,
            rates.join(" | "),
            speed_cells(&times)
        );
    }
}
