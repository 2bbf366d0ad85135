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
                match $crate::kernels::VectorUnit::detect() {
                    // SAFETY: `detect` found AVX-512F.
                    $crate::kernels::VectorUnit::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: `detect` found AVX2 and FMA.
                    $crate::kernels::VectorUnit::Avx2Fma => return unsafe { avx2($($arg),*) },
                    $crate::kernels::VectorUnit::Baseline => {}
                }
            }
            $body($($arg),*)
        }
    };
}

pub(crate) use crate::widest;

/// The vector unit [`widest!`] runs its loops on, on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorUnit {
    /// AVX-512F: sixteen f32 lanes.
    Avx512,
    /// AVX2 with FMA: eight.
    Avx2Fma,
    /// The build's baseline.
    Baseline,
}

impl VectorUnit {
    /// The widest unit this CPU has (AVX-512F, else AVX2 with FMA, else the baseline).
    #[inline]
    pub fn detect() -> VectorUnit {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return VectorUnit::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return VectorUnit::Avx2Fma;
            }
        }
        VectorUnit::Baseline
    }

    /// A short name for reports: `AVX-512`, `AVX2 + FMA` or `no AVX2`.
    pub fn name(self) -> &'static str {
        match self {
            VectorUnit::Avx512 => "AVX-512",
            VectorUnit::Avx2Fma => "AVX2 + FMA",
            VectorUnit::Baseline => "no AVX2",
        }
    }
}
