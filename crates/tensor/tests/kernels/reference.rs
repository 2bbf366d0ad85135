//! Naive f64 references, random inputs, comparisons and finite differences shared by the kernel
//! tests. Every reference is the textbook formula with plain index arithmetic, written without the
//! kernels' tricks (no coalescing, no tiling, no multi-accumulators).

use tensor::Tensor;

/// A small deterministic generator (xorshift64*), so failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }

    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

pub fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

pub fn f32_tensor(shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_vec(shape, to_f32(v)).unwrap()
}

pub fn f64_tensor(shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

/// Asserts `|got - want| <= atol + rtol·|want|` elementwise.
#[track_caller]
pub fn assert_close(got: &[f64], want: &[f64], rtol: f64, atol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= atol + rtol * w.abs() || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

/// Asserts an f32 result against an f64 reference with f32-appropriate tolerances.
#[track_caller]
pub fn assert_close_f32(got: &[f32], want: &[f64], what: &str) {
    let got: Vec<f64> = got.iter().map(|&x| f64::from(x)).collect();
    assert_close(&got, want, 1e-4, 1e-5, what);
}

/// Central finite differences of `loss` at `x`, step `h` (f64 throughout).
pub fn numeric_grad(x: &[f64], h: f64, loss: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut probe = x.to_vec();
    (0..x.len())
        .map(|i| {
            probe[i] = x[i] + h;
            let up = loss(&probe);
            probe[i] = x[i] - h;
            let down = loss(&probe);
            probe[i] = x[i];
            (up - down) / (2.0 * h)
        })
        .collect()
}

/// Σ w·v: turns a vector function into a scalar loss for finite differences.
pub fn weighted_sum(w: &[f64], v: &[f64]) -> f64 {
    w.iter().zip(v).map(|(a, b)| a * b).sum()
}

pub fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// The multi-index of flat position `flat` in `shape`.
pub fn unravel(flat: usize, shape: &[usize]) -> Vec<usize> {
    let strides = row_major_strides(shape);
    shape
        .iter()
        .zip(&strides)
        .map(|(&s, &st)| (flat / st) % s.max(1))
        .collect()
}

/// The flat position in `shape` of the element that `index` (in a broadcast shape with the same
/// trailing alignment) reads.
pub fn broadcast_source(index: &[usize], shape: &[usize]) -> usize {
    let skip = index.len() - shape.len();
    let strides = row_major_strides(shape);
    shape
        .iter()
        .enumerate()
        .map(|(d, &s)| {
            if s == 1 {
                0
            } else {
                index[skip + d] * strides[d]
            }
        })
        .sum()
}

pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|d| {
            let x = if d + a.len() >= n {
                a[d + a.len() - n]
            } else {
                1
            };
            let y = if d + b.len() >= n {
                b[d + b.len() - n]
            } else {
                1
            };
            if x == 1 {
                y
            } else {
                x
            }
        })
        .collect()
}

/// `op(A)·op(B)` with A, B stored as the flags say.
pub fn matmul(
    a: &[f64],
    b: &[f64],
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0;
            for p in 0..k {
                let x = if trans_a { a[p * m + i] } else { a[i * k + p] };
                let y = if trans_b { b[j * k + p] } else { b[p * n + j] };
                acc += x * y;
            }
            c[i * n + j] = acc;
        }
    }
    c
}

/// Elementwise `f(a, b)` with NumPy broadcasting.
pub fn broadcast_binary(
    a: &[f64],
    a_shape: &[usize],
    b: &[f64],
    b_shape: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> (Vec<f64>, Vec<usize>) {
    let shape = broadcast_shape(a_shape, b_shape);
    let n: usize = shape.iter().product();
    let out = (0..n)
        .map(|flat| {
            let index = unravel(flat, &shape);
            f(
                a[broadcast_source(&index, a_shape)],
                b[broadcast_source(&index, b_shape)],
            )
        })
        .collect();
    (out, shape)
}

/// Sums `g` (of `g_shape`) into a tensor of `shape` that broadcasts to `g_shape`.
pub fn sum_to_shape(g: &[f64], g_shape: &[usize], shape: &[usize]) -> Vec<f64> {
    let mut out = vec![0.0; shape.iter().product()];
    for (flat, &v) in g.iter().enumerate() {
        out[broadcast_source(&unravel(flat, g_shape), shape)] += v;
    }
    out
}

pub fn softmax_rows(x: &[f64], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = row.iter().map(|v| (v - max).exp()).sum();
            row.iter()
                .map(move |v| (v - max).exp() / total)
                .collect::<Vec<_>>()
        })
        .collect()
}

pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * erfc(-x / std::f64::consts::SQRT_2)
}

pub fn gelu_tanh(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
}

/// erfc to ~1e-15 relative, written independently of the kernels' libm: the Maclaurin series
/// of erf below 1.5 (no cancellation there) and the continued fraction of erfc above.
pub fn erfc(x: f64) -> f64 {
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    if x < 1.5 {
        // erf x = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1))
        let mut term = x;
        let mut total = x;
        let mut n = 0.0;
        while term.abs() > 1e-18 * total.abs() {
            n += 1.0;
            term *= -x * x / n;
            total += term / (2.0 * n + 1.0);
        }
        1.0 - total * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc x = e^{-x²}/√π · 1/(x + 1/2/(x + 1/(x + 3/2/(x + …))))
        let mut fraction = x;
        for k in (1..200).rev() {
            fraction = x + (k as f64 / 2.0) / fraction;
        }
        (-x * x).exp() / std::f64::consts::PI.sqrt() / fraction
    }
}
