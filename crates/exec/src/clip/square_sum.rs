//! The exact sum of squares behind the global gradient norm.
//!
//! Every square of an f32 (or f16, bf16, which widen to f32 exactly) is an integer below 2⁴⁸
//! times a power of two, and every square of an f64 an integer below 2¹⁰⁶ times a power of two,
//! so the sum of any number of them is an integer multiple of 2⁻²¹⁴⁸ that a fixed-width binary
//! integer holds exactly. [`SquareSum`] is that integer (plus flags for infinities and NaNs).
//! Integer addition is associative, so the sum is the same however the elements are split
//! between ranks and in whatever order the pieces are added: the norm of a gradient is
//! bitwise one device's whenever the gradient is, under every layout, with no canonical order
//! to keep. The value is rounded to f64 once, at the end ([`SquareSum::to_f64`]).

use tensor::{DType, Tensor};

use crate::error::ExecError;

/// Bit position of 2⁰ in the integer: the smallest f64 square, the subnormal 2⁻¹⁰⁷⁴ squared,
/// is 2⁻²¹⁴⁸.
const POINT: i64 = 2148;

/// 64-bit limbs: f64 squares reach 2²⁰⁴⁸ (bit 4196), plus 64 bits of headroom for the count
/// of added squares.
const LIMBS: usize = 68;

/// Elements of f32 added into 64-bit bins before the bins move into the integer: each square
/// is below 2⁴⁸, so 2¹⁶ of them fit in a bin.
const F32_CHUNK: usize = 1 << 16;

/// Bytes of [`SquareSum::to_bytes`].
pub const ENCODED_BYTES: usize = (LIMBS + 1) * 8;

/// An exact sum of squares, with whether an infinity or a NaN was among the values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquareSum {
    limbs: [u64; LIMBS],
    /// Bit 0: an infinity was added; bit 1: a NaN was.
    non_finite: u64,
}

impl Default for SquareSum {
    fn default() -> Self {
        SquareSum {
            limbs: [0; LIMBS],
            non_finite: 0,
        }
    }
}

const INFINITE: u64 = 1;
const NAN: u64 = 2;

impl SquareSum {
    /// Adds the squares of `len` elements of `t` from element `offset`.
    pub fn add_elements(&mut self, t: &Tensor, offset: usize, len: usize) -> Result<(), ExecError> {
        let range = offset..offset.saturating_add(len);
        if range.end > t.n_elements() {
            return Err(ExecError::Mismatch {
                what: "a gradient piece for the global norm".to_string(),
                expected: format!("elements {}..{}", range.start, range.end),
                got: format!("{} elements", t.n_elements()),
            });
        }
        match t.dtype() {
            DType::F32 => self.add_f32(&t.as_slice::<f32>()?[range]),
            DType::F64 => self.add_f64(&t.as_slice::<f64>()?[range]),
            DType::F16 | DType::BF16 => {
                // Widening a half to f32 is exact.
                let width = t.dtype().size_in_bytes();
                let bytes = &t.as_bytes()[range.start * width..range.end * width];
                let wide = Tensor::from_bytes(t.dtype(), &[len], bytes)?.to_dtype(DType::F32);
                self.add_f32(wide.as_slice::<f32>()?);
            }
            other => {
                return Err(ExecError::Mismatch {
                    what: "a gradient for the global norm".to_string(),
                    expected: "a floating-point type (f32, f64, f16, bf16)".to_string(),
                    got: other.to_string(),
                })
            }
        }
        Ok(())
    }

    /// Adds the squares of `xs`. An f32 is `m · 2^(e − 150)` with `m < 2²⁴` (`e` its biased
    /// exponent, 1 for subnormals), so its square is `m² · 2^(2e − 300)`: the `m²` are summed
    /// per exponent in 64-bit bins (four interleaved sets, so consecutive elements of one
    /// exponent do not wait on each other), which move into the integer every 2¹⁶ elements.
    pub fn add_f32(&mut self, xs: &[f32]) {
        for chunk in xs.chunks(F32_CHUNK) {
            let mut bins = [[0u64; 256]; 4];
            let mut quads = chunk.chunks_exact(4);
            for q in &mut quads {
                for (lane, &x) in q.iter().enumerate() {
                    let (e, m2) = f32_square(x);
                    bins[lane][e] += m2;
                }
            }
            for &x in quads.remainder() {
                let (e, m2) = f32_square(x);
                bins[0][e] += m2;
            }
            for e in 0..255 {
                // Subnormals (e = 0) have the scale of e = 1, without the implicit bit.
                let scale = 2 * (e.max(1) as i64) - 300;
                for lane in &bins {
                    if lane[e] != 0 {
                        self.add_at(lane[e] as u128, scale);
                    }
                }
            }
            if bins.iter().any(|lane| lane[255] != 0) {
                self.flag(chunk.iter().map(|&x| f64::from(x)));
            }
        }
    }

    /// Adds the squares of `xs`: an f64 is `m · 2^(e − 1075)` with `m < 2⁵³`, its square
    /// `m² · 2^(2e − 2150)`, added into the integer directly.
    pub fn add_f64(&mut self, xs: &[f64]) {
        for &x in xs {
            let bits = x.to_bits();
            let e = ((bits >> 52) & 0x7ff) as i64;
            if e == 0x7ff {
                self.flag(std::iter::once(x));
                continue;
            }
            let mut m = bits & ((1 << 52) - 1);
            if e != 0 {
                m |= 1 << 52;
            }
            if m != 0 {
                self.add_at(u128::from(m) * u128::from(m), 2 * e.max(1) - 2150);
            }
        }
    }

    /// Records the infinities and NaNs among `xs`.
    fn flag(&mut self, xs: impl Iterator<Item = f64>) {
        for x in xs {
            if x.is_nan() {
                self.non_finite |= NAN;
            } else if x.is_infinite() {
                self.non_finite |= INFINITE;
            }
        }
    }

    /// Adds `value · 2^scale` (`scale ≥ −2148`).
    fn add_at(&mut self, value: u128, scale: i64) {
        let bit = (scale + POINT) as usize;
        let (limb, shift) = (bit / 64, bit % 64);
        // The value spread over three limbs: 128 bits shifted by < 64.
        let low = (value << shift) as u64;
        let mid = ((value << shift) >> 64) as u64;
        let high = match shift {
            0 => 0,
            s => (value >> (128 - s)) as u64,
        };
        self.add_limbs(limb, &[low, mid, high]);
    }

    /// Adds `parts` at limb `from`, carrying upwards.
    fn add_limbs(&mut self, from: usize, parts: &[u64]) {
        let mut carry = 0u64;
        let mut j = from;
        for &p in parts {
            let (s1, c1) = self.limbs[j].overflowing_add(p);
            let (s2, c2) = s1.overflowing_add(carry);
            self.limbs[j] = s2;
            carry = u64::from(c1) + u64::from(c2);
            j += 1;
        }
        while carry != 0 && j < LIMBS {
            let (s, c) = self.limbs[j].overflowing_add(carry);
            self.limbs[j] = s;
            carry = u64::from(c);
            j += 1;
        }
    }

    /// Adds another sum (another rank's).
    pub fn merge(&mut self, other: &SquareSum) {
        self.add_limbs(0, &other.limbs);
        self.non_finite |= other.non_finite;
    }

    /// The sum rounded to f64: NaN if a NaN was added, else infinity if an infinity was (or
    /// the sum exceeds f64's range).
    pub fn to_f64(&self) -> f64 {
        if self.non_finite & NAN != 0 {
            return f64::NAN;
        }
        if self.non_finite & INFINITE != 0 {
            return f64::INFINITY;
        }
        let Some(top) = self.limbs.iter().rposition(|&l| l != 0) else {
            return 0.0;
        };
        let low = top.saturating_sub(1);
        let mut head = (u128::from(self.limbs[top]) << 64) | u128::from(self.limbs[low]);
        if top == 0 {
            head >>= 64;
        }
        // A sticky bit for what lies below the two limbs, so the rounding sees it.
        if self.limbs[..low].iter().any(|&l| l != 0) {
            head |= 1;
        }
        ldexp(head as f64, 64 * low as i64 - POINT)
    }

    /// The little-endian bytes of the integer and the flags ([`ENCODED_BYTES`] of them).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_BYTES);
        for l in self.limbs.iter().chain(std::iter::once(&self.non_finite)) {
            out.extend_from_slice(&l.to_le_bytes());
        }
        out
    }

    /// The sum [`SquareSum::to_bytes`] wrote, or `None` when `bytes` is not such an encoding
    /// (not [`ENCODED_BYTES`] long, or flags other than an infinity's and a NaN's): for sums
    /// that arrive over the network.
    pub fn decode(bytes: &[u8]) -> Option<SquareSum> {
        let sum = (bytes.len() == ENCODED_BYTES).then(|| SquareSum::from_bytes(bytes))?;
        (sum.non_finite & !(INFINITE | NAN) == 0).then_some(sum)
    }

    /// The sum [`SquareSum::to_bytes`] wrote (`bytes` holds exactly [`ENCODED_BYTES`]).
    pub(crate) fn from_bytes(bytes: &[u8]) -> SquareSum {
        let mut words = bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
        let mut sum = SquareSum::default();
        for l in &mut sum.limbs {
            *l = words.next().unwrap_or(0);
        }
        sum.non_finite = words.next().unwrap_or(0);
        sum
    }
}

/// The biased exponent of `x` and the square of its integer significand.
#[inline(always)]
fn f32_square(x: f32) -> (usize, u64) {
    let bits = x.to_bits();
    let e = ((bits >> 23) & 0xff) as usize;
    let implicit = u32::from(e != 0) << 23;
    let m = u64::from((bits & 0x7f_ffff) | implicit);
    (e, m * m)
}

/// `x · 2^e`, multiplying by powers of two that are exact in f64 (only the last step can
/// round, into the subnormals or to infinity).
fn ldexp(mut x: f64, mut e: i64) -> f64 {
    while e > 1000 {
        x *= 2f64.powi(1000);
        e -= 1000;
    }
    while e < -1000 {
        x *= 2f64.powi(-1000);
        e += 1000;
    }
    x * 2f64.powi(e as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum_f32(xs: &[f32]) -> f64 {
        let mut s = SquareSum::default();
        s.add_f32(xs);
        s.to_f64()
    }

    #[test]
    fn small_sums_are_exact() {
        assert_eq!(sum_f32(&[]), 0.0);
        assert_eq!(sum_f32(&[3.0, -4.0]), 25.0);
        assert_eq!(sum_f32(&[0.5, 0.25, 0.0, -0.0]), 0.3125);
        let tiny = f32::from_bits(1); // 2⁻¹⁴⁹, the smallest subnormal
        assert_eq!(sum_f32(&[tiny]), 2f64.powi(-298));
        assert_eq!(
            sum_f32(&[f32::MAX]),
            f64::from(f32::MAX) * f64::from(f32::MAX)
        );
        let mut s = SquareSum::default();
        s.add_f64(&[3.0, 4.0, f64::from_bits(1)]);
        assert_eq!(s.to_f64(), 25.0);
    }

    #[test]
    fn the_sum_is_the_same_in_every_order_and_split() {
        let xs: Vec<f32> = (0..200_003)
            .map(|i| (i as f32 * 0.618).sin() * 10f32.powi(i % 9 - 4))
            .collect();
        let whole = {
            let mut s = SquareSum::default();
            s.add_f32(&xs);
            s
        };
        let mut reversed: Vec<f32> = xs.clone();
        reversed.reverse();
        let mut parts = SquareSum::default();
        for piece in reversed.chunks(777) {
            let mut p = SquareSum::default();
            p.add_f32(piece);
            let p = SquareSum::from_bytes(&p.to_bytes());
            parts.merge(&p);
        }
        assert_eq!(parts, whole);
        let naive: f64 = xs.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        assert!((whole.to_f64() - naive).abs() <= 1e-12 * naive);
    }

    #[test]
    fn infinities_and_nans_are_reported() {
        assert_eq!(sum_f32(&[1.0, f32::INFINITY]), f64::INFINITY);
        assert!(sum_f32(&[f32::NAN, f32::INFINITY]).is_nan());
        let mut s = SquareSum::default();
        s.add_f64(&[f64::NEG_INFINITY]);
        assert_eq!(s.to_f64(), f64::INFINITY);
    }
}
