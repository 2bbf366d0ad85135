//! Elementwise loops compiled for the widest vector unit the CPU has.
//!
//! [`widest!`] defines a function that runs an `#[inline(always)]` loop compiled three times —
//! for AVX-512F (sixteen f32 lanes), for AVX2 with FMA (eight) and for the build's baseline —
//! and picks at run time the widest the CPU has. Only the width changes: every lane does the
//! IEEE operations the portable loop does (Rust never fuses a multiply and an add, nor reorders
//! a float sum, on its own; an explicit `mul_add` is one fused instruction where the variant has
//! FMA and the correctly rounded `fmaf` call otherwise), so all three give the same bits; each
//! kernel's tests hold the dispatched loop to the portable one.

/// Defines `fn $name<T: Float>(args…) [-> R]`, which calls `$body(args…)` compiled for AVX-512F when
/// the CPU has it, else for AVX2 and FMA when it has those, else as built. `$body` must be
/// `#[inline(always)]` so that it is compiled inside each variant. Exported (as
/// `tensor::widest!`) for the loops of other crates, such as the optimizers' rules.
#[macro_export]
macro_rules! widest {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident<$T:ident>($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $body:path
    ) => {
        $(#[$meta])*
        $vis fn $name<$T: $crate::kernels::Float>($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                /// `$body` for AVX-512F.
                ///
                /// # Safety
                /// The CPU must have AVX-512F.
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512<$T: $crate::kernels::Float>($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                /// `$body` for AVX2 and FMA.
                ///
                /// # Safety
                /// The CPU must have AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2<$T: $crate::kernels::Float>($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    return unsafe { avx512($($arg),*) };
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

pub(crate) use crate::widest;
