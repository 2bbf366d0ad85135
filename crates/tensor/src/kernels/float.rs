//! The compute element types: [`Float`] for f32 and f64, and the dtype policy of the
//! `Tensor`-level wrappers.
//!
//! Every slice-level kernel is generic over [`Float`], so it exists for f32 (the type that must be
//! fast) and f64 (used by the tests as a high-precision twin, and by anyone who asks for it). The
//! trait is sealed: the gemm backends and the tensor conversions below only know these two types.

use std::any::TypeId;
use std::borrow::Cow;
use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::TensorError;
use crate::tensor::{Storage, Tensor};

/// A floating-point compute type: `f32` or `f64`.
pub trait Float:
    sealed::Sealed
    + Copy
    + Default
    + Debug
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Negative infinity (the identity of `max`).
    const NEG_INFINITY: Self;
    /// The matching dtype.
    const DTYPE: DType;
    /// Converts from f64 (rounding for f32).
    fn from_f64(value: f64) -> Self;
    /// Converts to f64 (exact).
    fn to_f64(self) -> f64;
    /// Converts a count (rounding for very large counts).
    fn from_usize(value: usize) -> Self;
    /// `e^self`.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Hyperbolic tangent by arithmetic alone (no library call), so loops over it vectorise:
    /// within 3e-7 relative of `tanh` for f32 ([`fast_tanh_f32`]); `tanh` itself for f64.
    fn tanh_vectorizable(self) -> Self;
    /// `e^self` by arithmetic alone (no library call), so loops over it vectorise: within a few
    /// ulp of `exp` for f32 ([`fast_exp_checked_f32`]; 0 below -87); `exp` itself for f64.
    fn exp_vectorizable(self) -> Self;
    /// Natural logarithm by arithmetic alone (no library call), so loops over it vectorise:
    /// within 3e-7 relative of `ln` for f32 ([`fast_ln_f32`]); `ln` itself for f64.
    fn ln_vectorizable(self) -> Self;
    /// The complementary error function `1 - erf(x)`, accurate where it is tiny, by arithmetic
    /// alone for f32 ([`fast_erfc_f32`], so loops over it vectorise); `libm`'s for f64.
    fn erfc(self) -> Self;
    /// The larger of two values (the non-NaN one if one is NaN).
    fn max(self, other: Self) -> Self;
    /// `self · a + b` rounded once (a fused multiply-add: the same bits with or without the
    /// hardware instruction).
    fn mul_add(self, a: Self, b: Self) -> Self;
}

macro_rules! impl_float {
    ($t:ident, $dtype:ident, $erfc:path, $tanh_vec:path, $exp_vec:path, $ln_vec:path) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = $t::NEG_INFINITY;
            const DTYPE: DType = DType::$dtype;
            #[inline(always)]
            fn from_f64(value: f64) -> Self {
                value as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_usize(value: usize) -> Self {
                value as $t
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $t::exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                $t::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                $t::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $t::tanh(self)
            }
            #[inline(always)]
            fn tanh_vectorizable(self) -> Self {
                $tanh_vec(self)
            }
            #[inline(always)]
            fn exp_vectorizable(self) -> Self {
                $exp_vec(self)
            }
            #[inline(always)]
            fn ln_vectorizable(self) -> Self {
                $ln_vec(self)
            }
            #[inline(always)]
            fn erfc(self) -> Self {
                $erfc(self)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                $t::max(self, other)
            }
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                $t::mul_add(self, a, b)
            }
        }
    };
}
impl_float!(
    f32,
    F32,
    fast_erfc_f32,
    fast_tanh_f32,
    fast_exp_checked_f32,
    fast_ln_f32
);
impl_float!(f64, F64, libm::erfc, f64::tanh, f64::exp, f64::ln);

/// `e^x` for f32 by arithmetic alone: `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2` (Cody–Waite, the
/// rounding by the 1.5·2^23 trick), `e^r` by its degree-7 Taylor polynomial (relative error
/// below 1e-8 there), and `2^n` built in the exponent bits. Inputs are clamped to
/// `[-87, 88]`, where the result stays a normal f32.
#[inline(always)]
fn fast_exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5·2^23
    let x = x.clamp(-87.0, 88.0);
    // Fused multiply-adds throughout: one instruction (and one rounding) per step where the CPU
    // has FMA, and the same bits from `fmaf` where it does not.
    let t = x.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    // Horner's scheme; the coefficients are products, not quotients, so the loop has no
    // division.
    let p = r.mul_add(1.0 / 5040.0, 1.0 / 720.0);
    let p = r.mul_add(p, 1.0 / 120.0);
    let p = r.mul_add(p, 1.0 / 24.0);
    let p = r.mul_add(p, 1.0 / 6.0);
    let p = r.mul_add(p, 0.5);
    let p = r.mul_add(p, 1.0);
    let p = r.mul_add(p, 1.0);
    // `n` as an integer from `t`'s bits (`t` lies in [2^23, 2^24), where the unit in the last
    // place is 1), not by a float-to-integer conversion, which does not vectorise well.
    let k = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let scale = f32::from_bits(((k + 127) as u32) << 23);
    p * scale
}

/// `e^x` for f32 by arithmetic alone over the whole line: [`fast_exp_f32`] in `[-87, 88]`, 0
/// below (where `e^x` is below f32's normal range), infinity above, NaN for NaN. Branch-free
/// selects, so loops over it vectorise.
#[inline(always)]
pub fn fast_exp_checked_f32(x: f32) -> f32 {
    let e = fast_exp_f32(x);
    let e = if x < -87.0 { 0.0 } else { e };
    let e = if x > 88.0 { f32::INFINITY } else { e };
    if x.is_nan() {
        x
    } else {
        e
    }
}

/// The odd polynomial `tanh(a) ≈ a·Q(a²)` of [`fast_tanh_f32`] below `|a| = 0.625`: a least
/// squares fit of `tanh(a)/a` on Chebyshev nodes, relative error 1.1e-7 there in f32.
const TANH_FIT: [f32; 6] = [
    1.0,
    -0.333_332_75,
    0.133_313_66,
    -0.053_735_863,
    0.020_630_307,
    -0.005_697_522_3,
];

/// `tanh(x)` for f32 by arithmetic alone: `a·Q(a²)` ([`TANH_FIT`]) below `a = |x| = 0.625`,
/// `1 - 2/(e^{2a} + 1)` above (where it does not cancel), with the sign of `x`. Within 3e-7
/// relative of `tanh` (tested). Branch-free selects, so loops over it vectorise.
#[inline(always)]
pub fn fast_tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let big = 1.0 - 2.0 / (fast_exp_f32(2.0 * a) + 1.0);
    let t = a * a;
    let mut q = TANH_FIT[5];
    for &c in TANH_FIT[..5].iter().rev() {
        q = t.mul_add(q, c);
    }
    let t = if a < 0.625 { a * q } else { big };
    t.copysign(x)
}

/// `ln(x)` for f32 by arithmetic alone: `x = 2^k·m` with `m` in `[√½, √2)` (read from the bits,
/// subnormals scaled up first), `ln m = 2·atanh(s)` with `s = (m − 1)/(m + 1)` (`|s| ≤ 0.172`)
/// by its series to `s⁹`, and `k·ln 2` added in two parts. Within 3e-7 relative of `ln`
/// (tested); `-∞` at ±0, NaN below 0 and for NaN, `∞` at `∞`. Branch-free selects, so loops
/// over it vectorise.
#[inline(always)]
pub fn fast_ln_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // √½'s bits: adding (1.0's bits − these) carries into the exponent exactly when m ≥ √2.
    const SQRT_HALF_BITS: u32 = 0x3f35_04f3;
    let subnormal = x < f32::MIN_POSITIVE;
    let scaled = if subnormal { x * 8_388_608.0 } else { x }; // 2^23
    let bits = scaled
        .to_bits()
        .wrapping_add(1.0f32.to_bits() - SQRT_HALF_BITS);
    let k = (bits >> 23) as i32 - 127 - if subnormal { 23 } else { 0 };
    let m = f32::from_bits((bits & 0x007f_ffff) + SQRT_HALF_BITS);
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let p = z.mul_add(1.0 / 9.0, 1.0 / 7.0);
    let p = z.mul_add(p, 1.0 / 5.0);
    let p = z.mul_add(p, 1.0 / 3.0);
    let ln_m = (2.0 * s) * z.mul_add(p, 1.0);
    let k = k as f32;
    let r = k.mul_add(LN2_HI, k.mul_add(LN2_LO, ln_m));
    let r = if x == 0.0 { f32::NEG_INFINITY } else { r };
    let r = if x == f32::INFINITY { x } else { r };
    if x < 0.0 || x.is_nan() {
        f32::NAN
    } else {
        r
    }
}

/// The coefficients of `P(t)` in [`fast_erfc_f32`], constant term first.
const ERFC_FIT: [f32; 10] = [
    -1.265_512_2,
    1.000_023_7,
    0.374_091_96,
    0.096_784_18,
    -0.186_288_06,
    0.278_868_07,
    -1.135_204,
    1.488_515_9,
    -0.822_152_2,
    0.170_872_77,
];

/// `erfc(x)` for f32 by arithmetic alone. For `z = |x|`, `erfc(z) = t·e^{P(t) - z²}` with
/// `t = 1/(1 + z/2)` and `P` the degree-9 Chebyshev fit of Press et al. (*Numerical Recipes*,
/// §6.2: fractional error below 1.2e-7 for every `z ≥ 0`), so the tail keeps its relative
/// accuracy; `z²`'s rounding error is taken back by a fused multiply-add. `erfc(x) = 2 -
/// erfc(|x|)` for negative `x`. Results below f32's normal range are 0 (`z` past about 9.3).
/// Branch-free selects, so loops over it vectorise; within 5e-7 relative of the exact value
/// where that is a normal f32 (tested).
#[inline(always)]
pub fn fast_erfc_f32(x: f32) -> f32 {
    // Past 10.5 the result is far below f32's range; the cap keeps `z²` finite.
    let z = x.abs().min(10.5);
    let t = 2.0 / (2.0 + z);
    let mut p = ERFC_FIT[9];
    for &c in ERFC_FIT[..9].iter().rev() {
        p = t.mul_add(p, c);
    }
    let z2 = z * z;
    let z2_error = z.mul_add(z, -z2);
    // `e^{-z²}` apart from `e^{P(t) - error}`: their sum would round to the unit in the last
    // place of `z²`, a relative error of up to 4e-6 in the result near z = 9.
    let tail = t * fast_exp_checked_f32(-z2) * fast_exp_f32(p - z2_error);
    let r = if x < 0.0 { 2.0 - tail } else { tail };
    if x.is_nan() {
        x
    } else {
        r
    }
}

/// Which compute type a tensor of `dtype` uses: f64 for f64, f32 for f32, f16 and bf16.
pub(crate) enum ComputeType {
    F32,
    F64,
}

/// `s` as a slice of `U` when `T` is `U` (a generic kernel's way to its `f32` code).
pub(crate) fn same<T: 'static, U: 'static>(s: &[T]) -> Option<&[U]> {
    // SAFETY: T and U are the same type, so the layout is the same.
    (TypeId::of::<T>() == TypeId::of::<U>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<U>(), s.len()) })
}

/// `s` as a mutable slice of `U` when `T` is `U`.
pub(crate) fn same_mut<T: 'static, U: 'static>(s: &mut [T]) -> Option<&mut [U]> {
    // SAFETY: T and U are the same type, so the layout is the same.
    (TypeId::of::<T>() == TypeId::of::<U>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<U>(), s.len()) })
}

/// The compute type for `dtype`, or [`TensorError::UnsupportedDType`] for integers and bool.
pub(crate) fn compute_type(op: &'static str, dtype: DType) -> Result<ComputeType, TensorError> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(ComputeType::F32),
        DType::F64 => Ok(ComputeType::F64),
        got => Err(TensorError::UnsupportedDType { op, got }),
    }
}

/// Runs `$body` with the type alias `$T` bound to the compute type of `$dtype` (f32 or f64);
/// returns [`TensorError::UnsupportedDType`] (naming `$op`) from the enclosing function for any
/// other dtype.
macro_rules! with_float {
    ($op:expr, $dtype:expr, |$T:ident| $body:block) => {
        match $crate::kernels::float::compute_type($op, $dtype)? {
            $crate::kernels::float::ComputeType::F32 => {
                #[allow(unused_imports)]
                use $crate::kernels::float::sealed::Sealed as _;
                type $T = f32;
                $body
            }
            $crate::kernels::float::ComputeType::F64 => {
                #[allow(unused_imports)]
                use $crate::kernels::float::sealed::Sealed as _;
                type $T = f64;
                $body
            }
        }
    };
}
pub(crate) use with_float;

pub(crate) mod sealed {
    use super::*;

    /// Conversions and backend hooks only the crate may use.
    pub trait Sealed: Sized + Clone {
        /// The elements of `tensor` in this compute type: borrowed when the dtype matches,
        /// converted when the tensor stores f16 or bf16 (f32 only).
        fn read<'t>(op: &'static str, tensor: &'t Tensor) -> Result<Cow<'t, [Self]>, TensorError>;

        /// A tensor of `shape` holding `values`, stored as `dtype` (the dtype of the inputs, so an
        /// f16 or bf16 computation returns to its storage type).
        fn write(shape: &[usize], values: Vec<Self>, dtype: DType) -> Tensor;

        /// `matrixmultiply`'s gemm for this type: C ← α A B + β C with arbitrary strides.
        ///
        /// # Safety
        /// The pointers and strides must address valid `m×k`, `k×n` and `m×n` matrices.
        #[allow(clippy::too_many_arguments)]
        unsafe fn matrixmultiply_gemm(
            m: usize,
            k: usize,
            n: usize,
            alpha: Self,
            a: *const Self,
            a_strides: (isize, isize),
            b: *const Self,
            b_strides: (isize, isize),
            beta: Self,
            c: *mut Self,
            c_strides: (isize, isize),
        );
    }

    impl Sealed for f32 {
        fn read<'t>(op: &'static str, tensor: &'t Tensor) -> Result<Cow<'t, [f32]>, TensorError> {
            match tensor.storage() {
                Storage::F32(v) => Ok(Cow::Borrowed(v)),
                Storage::F16(v) => Ok(Cow::Owned(v.iter().map(|x| x.to_f32()).collect())),
                Storage::BF16(v) => Ok(Cow::Owned(v.iter().map(|x| x.to_f32()).collect())),
                other => Err(TensorError::DTypeMismatch {
                    op,
                    expected: DType::F32,
                    got: other.dtype(),
                }),
            }
        }

        fn write(shape: &[usize], values: Vec<f32>, dtype: DType) -> Tensor {
            let storage = match dtype {
                DType::F16 => Storage::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
                DType::BF16 => Storage::BF16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
                _ => Storage::F32(values),
            };
            Tensor::from_storage(shape, storage).expect("kernel output matches its shape")
        }

        unsafe fn matrixmultiply_gemm(
            m: usize,
            k: usize,
            n: usize,
            alpha: f32,
            a: *const f32,
            a_strides: (isize, isize),
            b: *const f32,
            b_strides: (isize, isize),
            beta: f32,
            c: *mut f32,
            c_strides: (isize, isize),
        ) {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                alpha,
                a,
                a_strides.0,
                a_strides.1,
                b,
                b_strides.0,
                b_strides.1,
                beta,
                c,
                c_strides.0,
                c_strides.1,
            )
        }
    }

    impl Sealed for f64 {
        fn read<'t>(op: &'static str, tensor: &'t Tensor) -> Result<Cow<'t, [f64]>, TensorError> {
            match tensor.storage() {
                Storage::F64(v) => Ok(Cow::Borrowed(v)),
                other => Err(TensorError::DTypeMismatch {
                    op,
                    expected: DType::F64,
                    got: other.dtype(),
                }),
            }
        }

        fn write(shape: &[usize], values: Vec<f64>, _dtype: DType) -> Tensor {
            Tensor::from_storage(shape, Storage::F64(values))
                .expect("kernel output matches its shape")
        }

        unsafe fn matrixmultiply_gemm(
            m: usize,
            k: usize,
            n: usize,
            alpha: f64,
            a: *const f64,
            a_strides: (isize, isize),
            b: *const f64,
            b_strides: (isize, isize),
            beta: f64,
            c: *mut f64,
            c_strides: (isize, isize),
        ) {
            matrixmultiply::dgemm(
                m,
                k,
                n,
                alpha,
                a,
                a_strides.0,
                a_strides.1,
                b,
                b_strides.0,
                b_strides.1,
                beta,
                c,
                c_strides.0,
                c_strides.1,
            )
        }
    }
}

#[cfg(test)]
mod fast_math_tests {
    use super::{fast_erfc_f32, fast_exp_checked_f32, fast_ln_f32, fast_tanh_f32};

    #[test]
    fn fast_exp_stays_within_4e7_relative_of_exp_and_handles_the_ends() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = f64::from(x).exp();
            let err = ((f64::from(fast_exp_checked_f32(x)) - want) / want).abs();
            worst = worst.max(err);
            x += 0.001_3;
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
        assert_eq!(fast_exp_checked_f32(0.0), 1.0);
        assert_eq!(fast_exp_checked_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp_checked_f32(-1e9), 0.0);
        assert_eq!(fast_exp_checked_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(fast_exp_checked_f32(100.0), f32::INFINITY);
        assert!(fast_exp_checked_f32(f32::NAN).is_nan());
    }

    #[test]
    fn fast_tanh_stays_within_2e7_of_tanh_everywhere() {
        let mut worst = 0.0f64;
        let mut x = -20.0f32;
        while x <= 20.0 {
            let err = (f64::from(fast_tanh_f32(x)) - f64::from(x).tanh()).abs();
            worst = worst.max(err);
            x += 0.000_37;
        }
        assert!(worst < 2e-7, "worst absolute error {worst}");
        for x in [0.0f32, -0.0, 1e-30, -1e-30, 1e-4, f32::MAX, f32::MIN] {
            let err = (f64::from(fast_tanh_f32(x)) - f64::from(x).tanh()).abs();
            assert!(
                err <= 2e-7 * (1.0 + f64::from(x).tanh().abs()),
                "{x}: {err}"
            );
        }
        assert_eq!(fast_tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert!(fast_tanh_f32(f32::NAN).is_nan());
    }

    /// `fast_erfc_f32` is within 5e-7 relative of f64's `erfc` wherever that is a normal f32,
    /// 0 below, and right at the edges: ±0, ±∞ and NaN.
    #[test]
    fn fast_erfc_keeps_its_relative_accuracy_over_the_line() {
        for i in -20_000..=20_000 {
            let x = i as f32 / 2_000.0;
            let want = libm::erfc(f64::from(x));
            let got = f64::from(fast_erfc_f32(x));
            if want >= f64::from(f32::MIN_POSITIVE) {
                let rel = ((got - want) / want).abs();
                assert!(
                    rel <= 5e-7,
                    "erfc({x}) = {got}, want {want} (relative {rel:e})"
                );
            } else {
                assert!(
                    got < 2.0 * f64::from(f32::MIN_POSITIVE),
                    "erfc({x}) = {got}"
                );
            }
        }
        assert!((fast_erfc_f32(0.0) - 1.0).abs() <= 2.0 * f32::EPSILON);
        assert_eq!(fast_erfc_f32(-0.0), fast_erfc_f32(0.0));
        assert_eq!(fast_erfc_f32(f32::INFINITY), 0.0);
        assert_eq!(fast_erfc_f32(f32::NEG_INFINITY), 2.0);
        assert!(fast_erfc_f32(f32::NAN).is_nan());
    }

    /// `fast_tanh_f32` is within 3e-7 relative of f64's `tanh` over [-10, 10] (the polynomial
    /// below 0.625, the exponential form above), odd, and right at ±0, ±∞ and NaN.
    #[test]
    fn fast_tanh_keeps_its_relative_accuracy_over_the_line() {
        for i in -100_000..=100_000 {
            let x = i as f32 / 10_000.0;
            if x == 0.0 {
                continue;
            }
            let (got, want) = (f64::from(fast_tanh_f32(x)), f64::from(x).tanh());
            let rel = ((got - want) / want).abs();
            assert!(
                rel <= 3e-7,
                "tanh({x}) = {got}, want {want} (relative {rel:e})"
            );
            assert_eq!(fast_tanh_f32(-x), -fast_tanh_f32(x));
        }
        assert_eq!(fast_tanh_f32(1e-30), 1e-30);
        assert_eq!(fast_tanh_f32(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(fast_tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(fast_tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(fast_tanh_f32(f32::NEG_INFINITY), -1.0);
        assert!(fast_tanh_f32(f32::NAN).is_nan());
    }

    /// `fast_ln_f32` is within 3e-7 relative of f64's `ln` from the smallest subnormal to
    /// `f32::MAX` (every 997th bit pattern, and around 1, where `ln` goes to 0), and right at
    /// 0, 1, ∞, negative numbers and NaN.
    #[test]
    fn fast_ln_keeps_its_relative_accuracy_over_the_positive_floats() {
        let near_one = (-20_000..=20_000).map(|i| 1.0 + i as f32 * 1e-6);
        let patterns = (1..f32::INFINITY.to_bits())
            .step_by(997)
            .map(f32::from_bits);
        for x in patterns.chain(near_one) {
            if x == 1.0 {
                continue;
            }
            let (got, want) = (f64::from(fast_ln_f32(x)), f64::from(x).ln());
            let rel = ((got - want) / want).abs();
            assert!(
                rel <= 3e-7,
                "ln({x:e}) = {got}, want {want} (relative {rel:e})"
            );
        }
        assert_eq!(fast_ln_f32(1.0), 0.0);
        assert_eq!(fast_ln_f32(0.0), f32::NEG_INFINITY);
        assert_eq!(fast_ln_f32(-0.0), f32::NEG_INFINITY);
        assert_eq!(fast_ln_f32(f32::INFINITY), f32::INFINITY);
        assert!(fast_ln_f32(-1.0).is_nan());
        assert!(fast_ln_f32(f32::NEG_INFINITY).is_nan());
        assert!(fast_ln_f32(f32::NAN).is_nan());
    }
}
