//! Reduction operators and their element kernels.

use std::fmt;

use half::{bf16, f16};
use tensor::{DType, Element};

/// How an all-reduce or reduce-scatter combines the ranks' elements.
///
/// - Floats (f64, f32, f16, bf16): f16 and bf16 accumulate in f32 and round once at the end,
///   except in the reductions in the element type
///   ([`all_reduce_in_element_type_buf`](crate::Communicator::all_reduce_in_element_type_buf)),
///   which round after every combination.
///   `Max`/`Min` ignore NaN when the other operand is a number (`f32::max`).
/// - Integers: `Sum` wraps on overflow; `Mean` is the wrapped sum divided by the rank count,
///   truncated toward zero.
/// - Bool: only `Max` (logical or) and `Min` (logical and).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise sum divided by the number of ranks.
    Mean,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];

    /// The lower-case name: `sum`, `mean`, `max`, `min`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }

    /// Whether the operator is defined for `dtype` (everything but `sum`/`mean` on bool).
    pub fn supports(self, dtype: DType) -> bool {
        dtype != DType::Bool || matches!(self, ReduceOp::Max | ReduceOp::Min)
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An element type the reduction kernels handle. `Acc` is the type sums accumulate in.
pub(crate) trait Reducible: Element {
    /// The accumulator type (f32 for the 16-bit floats, the type itself otherwise).
    type Acc: Copy + Default + Send + Sync + 'static;
    fn load(self) -> Self::Acc;
    fn store(acc: Self::Acc) -> Self;
    fn sum(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn div(a: Self::Acc, n: usize) -> Self::Acc;
}

macro_rules! reducible_float {
    ($t:ty) => {
        impl Reducible for $t {
            type Acc = $t;
            #[inline(always)]
            fn load(self) -> $t {
                self
            }
            #[inline(always)]
            fn store(acc: $t) -> $t {
                acc
            }
            #[inline(always)]
            fn sum(a: $t, b: $t) -> $t {
                a + b
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                a.max(b)
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                a.min(b)
            }
            #[inline(always)]
            fn div(a: $t, n: usize) -> $t {
                a / n as $t
            }
        }
    };
}
reducible_float!(f32);
reducible_float!(f64);

macro_rules! reducible_half {
    ($t:ty) => {
        impl Reducible for $t {
            type Acc = f32;
            #[inline(always)]
            fn load(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn store(acc: f32) -> $t {
                <$t>::from_f32(acc)
            }
            #[inline(always)]
            fn sum(a: f32, b: f32) -> f32 {
                a + b
            }
            #[inline(always)]
            fn max(a: f32, b: f32) -> f32 {
                a.max(b)
            }
            #[inline(always)]
            fn min(a: f32, b: f32) -> f32 {
                a.min(b)
            }
            #[inline(always)]
            fn div(a: f32, n: usize) -> f32 {
                a / n as f32
            }
        }
    };
}
reducible_half!(f16);
reducible_half!(bf16);

macro_rules! reducible_int {
    ($t:ty) => {
        impl Reducible for $t {
            type Acc = $t;
            #[inline(always)]
            fn load(self) -> $t {
                self
            }
            #[inline(always)]
            fn store(acc: $t) -> $t {
                acc
            }
            #[inline(always)]
            fn sum(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn div(a: $t, n: usize) -> $t {
                // `n` is a rank count; if it does not fit the type, every |sum| is smaller.
                match <$t>::try_from(n) {
                    Ok(n) => a / n,
                    Err(_) => 0,
                }
            }
        }
    };
}
reducible_int!(i64);
reducible_int!(i32);
reducible_int!(i16);
reducible_int!(i8);
reducible_int!(u64);
reducible_int!(u32);
reducible_int!(u16);
reducible_int!(u8);

/// Runs `$body` with `$t` bound to the Rust element type of `$dtype` (bool as `u8`).
macro_rules! with_reducible {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            tensor::DType::F64 => {
                type $t = f64;
                $body
            }
            tensor::DType::F32 => {
                type $t = f32;
                $body
            }
            tensor::DType::F16 => {
                type $t = half::f16;
                $body
            }
            tensor::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            tensor::DType::I64 => {
                type $t = i64;
                $body
            }
            tensor::DType::I32 => {
                type $t = i32;
                $body
            }
            tensor::DType::I16 => {
                type $t = i16;
                $body
            }
            tensor::DType::I8 => {
                type $t = i8;
                $body
            }
            tensor::DType::U64 => {
                type $t = u64;
                $body
            }
            tensor::DType::U32 => {
                type $t = u32;
                $body
            }
            tensor::DType::U16 => {
                type $t = u16;
                $body
            }
            tensor::DType::U8 | tensor::DType::Bool => {
                type $t = u8;
                $body
            }
        }
    };
}
pub(crate) use with_reducible;

/// `acc = sources[0] ⊕ sources[1] ⊕ …` in source order (then `/ n_ranks` for `Mean`).
///
/// Every source has `acc.len()` elements. The fixed order makes the result bitwise independent
/// of which rank computes it.
pub(crate) fn reduce_sources<T: Reducible>(
    sources: &[&[T]],
    acc: &mut [T::Acc],
    op: ReduceOp,
    n_ranks: usize,
) {
    let Some((first, rest)) = sources.split_first() else {
        return;
    };
    // One loop per operator so each inner loop is a plain, vectorisable map. The first two
    // sources are combined in one pass (the same first operation of the fold, without a pass
    // that only loads the first source into `acc`).
    macro_rules! fold {
        ($f:path) => {{
            let rest = match rest.split_first() {
                Some((second, rest)) => {
                    for ((a, &x), &y) in acc.iter_mut().zip(first.iter()).zip(second.iter()) {
                        *a = $f(x.load(), y.load());
                    }
                    rest
                }
                None => {
                    for (a, &x) in acc.iter_mut().zip(first.iter()) {
                        *a = x.load();
                    }
                    rest
                }
            };
            for src in rest {
                for (a, &x) in acc.iter_mut().zip(src.iter()) {
                    *a = $f(*a, x.load());
                }
            }
        }};
    }
    match op {
        ReduceOp::Sum | ReduceOp::Mean => fold!(T::sum),
        ReduceOp::Max => fold!(T::max),
        ReduceOp::Min => fold!(T::min),
    }
    if op == ReduceOp::Mean {
        for a in acc.iter_mut() {
            *a = T::div(*a, n_ranks);
        }
    }
}

/// Writes an accumulator out as elements.
pub(crate) fn store_acc<T: Reducible>(acc: &[T::Acc], dst: &mut [T]) {
    for (d, &a) in dst.iter_mut().zip(acc.iter()) {
        *d = T::store(a);
    }
}

/// `dst = dst ⊕ src` element-wise over two byte buffers of `dtype` elements (`src ⊕ dst` when
/// `src_first`: the order matters to neither the sum nor max/min of numbers, but fixing it
/// makes both partners of an exchange compute bitwise the same result, even for `-0.0` vs
/// `0.0` under max/min). `Mean` combines as `Sum`: the division comes once, at the end.
/// 16-bit floats round after each combination: what a reduction in the element type wants
/// (`Communicator::all_reduce_in_element_type_buf`); a sum that rounds once reduces f32 copies.
///
/// Both buffers hold whole, aligned elements of `dtype`, and the same number of them.
pub(crate) fn combine_bytes(
    dtype: DType,
    op: ReduceOp,
    dst: &mut [u8],
    src: &[u8],
    src_first: bool,
) {
    with_reducible!(dtype, T => {
        let dst = bytemuck::cast_slice_mut::<u8, T>(dst);
        let src = bytemuck::cast_slice::<u8, T>(src);
        // Concrete types: name the trait, or inherent methods (`f16::max`) would win.
        macro_rules! fold {
            ($f:expr) => {
                if src_first {
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = <T as Reducible>::store($f(Reducible::load(s), Reducible::load(*d)));
                    }
                } else {
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = <T as Reducible>::store($f(Reducible::load(*d), Reducible::load(s)));
                    }
                }
            };
        }
        match op {
            ReduceOp::Sum | ReduceOp::Mean => fold!(<T as Reducible>::sum),
            ReduceOp::Max => fold!(<T as Reducible>::max),
            ReduceOp::Min => fold!(<T as Reducible>::min),
        }
    })
}

/// Divides every element by `n` (integers truncate): the second half of a `Mean` computed as
/// a sum.
pub(crate) fn divide_in_place(buf: &mut crate::BufMut<'_>, n: usize) {
    let dtype = buf.dtype();
    let bytes = buf.bytes_mut();
    with_reducible!(dtype, T => {
        for x in bytemuck::cast_slice_mut::<u8, T>(bytes) {
            *x = T::store(T::div(x.load(), n));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_reduce_in_source_order() {
        let a = [1.0f32, 5.0, -1.0];
        let b = [2.0f32, 3.0, -4.0];
        let mut acc = [0.0f32; 3];
        reduce_sources::<f32>(&[&a, &b], &mut acc, ReduceOp::Sum, 2);
        assert_eq!(acc, [3.0, 8.0, -5.0]);
        reduce_sources::<f32>(&[&a, &b], &mut acc, ReduceOp::Mean, 2);
        assert_eq!(acc, [1.5, 4.0, -2.5]);
        reduce_sources::<f32>(&[&a, &b], &mut acc, ReduceOp::Max, 2);
        assert_eq!(acc, [2.0, 5.0, -1.0]);
        let x = [250u8, 1];
        let y = [10u8, 0];
        let mut acc8 = [0u8; 2];
        reduce_sources::<u8>(&[&x, &y], &mut acc8, ReduceOp::Sum, 2);
        assert_eq!(acc8, [4, 1], "integer sums wrap");
        let h = [f16::from_f32(1.5), f16::from_f32(2.0)];
        let mut acch = [0.0f32; 2];
        reduce_sources::<f16>(&[&h, &h, &h], &mut acch, ReduceOp::Sum, 3);
        let mut out = [f16::ZERO; 2];
        store_acc::<f16>(&acch, &mut out);
        assert_eq!(out, [f16::from_f32(4.5), f16::from_f32(6.0)]);
    }

    /// One source is copied; three and four are folded left to right, `((s0 ⊕ s1) ⊕ s2) ⊕ s3`,
    /// on values where another association rounds differently.
    #[test]
    fn kernels_fold_left_to_right_whatever_the_source_count() {
        let (big, one) = (1.0e8f32, 1.0f32);
        let (s0, s1, s2, s3) = ([big, -big], [-big, big], [one, 3.0], [one, -2.0]);
        let mut acc = [f32::NAN; 2];
        reduce_sources::<f32>(&[&s2], &mut acc, ReduceOp::Sum, 1);
        assert_eq!(acc, s2);
        reduce_sources::<f32>(&[&s0, &s1, &s2], &mut acc, ReduceOp::Sum, 3);
        assert_eq!(acc, [1.0, 3.0], "(big - big) + 1, not big + (-big + 1)");
        reduce_sources::<f32>(&[&s2, &s0, &s1, &s3], &mut acc, ReduceOp::Sum, 4);
        // ((1 + big) - big) + 1: 1 + 1e8 rounds to 1e8.
        assert_eq!(acc, [1.0, -2.0]);
        reduce_sources::<f32>(&[&s3, &s2, &s0], &mut acc, ReduceOp::Min, 3);
        assert_eq!(acc, [1.0, -big]);
    }

    /// `combine_bytes` over typed slices.
    fn combine<T: bytemuck::Pod>(
        dtype: DType,
        op: ReduceOp,
        dst: &mut [T],
        src: &[T],
        first: bool,
    ) {
        let (dst, src) = (bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src));
        combine_bytes(dtype, op, dst, src, first);
    }

    #[test]
    fn combine_bytes_folds_in_the_order_asked() {
        let mut dst = [1.0f32, 5.0, -1.0];
        combine(
            DType::F32,
            ReduceOp::Mean,
            &mut dst,
            &[2.0, 3.0, -4.0],
            false,
        );
        assert_eq!(dst, [3.0, 8.0, -5.0], "mean combines as a sum");
        let mut dst = [7i64, -3];
        combine(DType::I64, ReduceOp::Min, &mut dst, &[2, 9], true);
        assert_eq!(dst, [2, -3]);
        // max(-0.0, 0.0) may be either zero: the order decides, so both partners agree.
        let (mut held_by_higher, mut held_by_lower) = ([0.0f32], [-0.0f32]);
        combine(
            DType::F32,
            ReduceOp::Max,
            &mut held_by_higher,
            &[-0.0],
            true,
        );
        combine(DType::F32, ReduceOp::Max, &mut held_by_lower, &[0.0], false);
        assert_eq!(
            held_by_higher[0].to_bits(),
            held_by_lower[0].to_bits(),
            "src_first mirrors the operand order"
        );
    }

    #[test]
    fn bool_supports_only_max_and_min() {
        assert!(ReduceOp::Max.supports(DType::Bool));
        assert!(!ReduceOp::Sum.supports(DType::Bool));
        assert!(ReduceOp::ALL.iter().all(|op| op.supports(DType::BF16)));
    }
}
