//! The engine's routed products ([`gemm`]) against Intel oneMKL's `cblas_sgemm` (sequential) on
//! the GPT benchmark model's twelve products over a step's 2,048 tokens, to decide whether MKL
//! would serve where the engine's own routes lose. MKL is loaded at run time from the library
//! `MKL_LIB` names (`libmkl_rt.so`; e.g. from the `mkl` wheel: `pip download mkl --no-deps`,
//! unzip, `…/data/lib/libmkl_rt.so.3`); without it the bench says so and exits. f32, one
//! thread, caches flushed before every product, the two rotated within each round and timed by
//! the thread's CPU clock. Prints each one's GFLOP/s at its median, MKL's per-round speed
//! against the engine's (above 1: MKL wins; p10–p90), and the two sums of median times.
//!
//! Run: `MKL_LIB=/path/to/libmkl_rt.so.3 cargo bench -p tessera-tensor --bench gemm_vs_mkl
//! [-- ROUNDS]` (default 15 rounds).

mod common;

use std::ffi::CString;

use common::{spread, values};
use tensor::kernels::gemm;

/// `cblas_sgemm(layout, trans_a, trans_b, m, n, k, α, a, lda, b, ldb, β, c, ldc)`.
type Sgemm = unsafe extern "C" fn(
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    f32,
    *const f32,
    i32,
    *const f32,
    i32,
    f32,
    *mut f32,
    i32,
);

/// CBLAS's row-major layout.
const ROW_MAJOR: i32 = 101;
/// CBLAS's codes for an operand used as stored and transposed.
const NO_TRANS: i32 = 111;
/// CBLAS's code for an operand used transposed.
const TRANS: i32 = 112;
/// `MKL_Set_Threading_Layer`'s sequential layer.
const MKL_THREADING_SEQUENTIAL: i32 = 1;

/// MKL's `cblas_sgemm` from the library at `path`, its threading layer set to sequential.
fn load_mkl(path: &str) -> Result<Sgemm, String> {
    let c_path = CString::new(path).map_err(|_| format!("MKL_LIB {path:?} holds a NUL"))?;
    // SAFETY: dlopen/dlsym with NUL-terminated names; each symbol is checked before its use and
    // has the C signature written here (MKL's documented `MKL_Set_Threading_Layer(int)` and
    // `cblas_sgemm`). The library stays loaded for the process's life.
    unsafe {
        let lib = libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW);
        if lib.is_null() {
            return Err(format!("dlopen({path}) failed"));
        }
        let symbol = |name: &std::ffi::CStr| {
            let f = libc::dlsym(lib, name.as_ptr());
            match f.is_null() {
                true => Err(format!("{path} has no {name:?}")),
                false => Ok(f),
            }
        };
        let set_layer: unsafe extern "C" fn(i32) -> i32 =
            std::mem::transmute(symbol(c"MKL_Set_Threading_Layer")?);
        set_layer(MKL_THREADING_SEQUENTIAL);
        Ok(std::mem::transmute::<*mut libc::c_void, Sgemm>(symbol(
            c"cblas_sgemm",
        )?))
    }
}

fn main() {
    let Ok(path) = std::env::var("MKL_LIB") else {
        println!("gemm_vs_mkl: set MKL_LIB to a libmkl_rt.so to compare with Intel oneMKL");
        return;
    };
    let sgemm = load_mkl(&path).unwrap_or_else(|e| panic!("gemm_vs_mkl: {e}"));
    let rounds = common::rounds_arg(15);
    let mut flush = vec![0u8; 96 << 20];
    println!("| product, f32, 1 thread | m×n×k | engine GFLOP/s | MKL GFLOP/s | MKL ÷ engine |");
    println!("|---|---|---:|---:|---:|");
    let mut sums = [0f64; 2];
    for (name, s) in common::GPT_PRODUCTS {
        let (a, b) = (values(s.m * s.k, 1), values(s.k * s.n, 2));
        let mut c = vec![0f32; s.m * s.n];
        let (trans_a, lda) = if s.trans_a {
            (TRANS, s.m)
        } else {
            (NO_TRANS, s.k)
        };
        let (trans_b, ldb) = if s.trans_b {
            (TRANS, s.k)
        } else {
            (NO_TRANS, s.n)
        };
        let dim = |d: usize| i32::try_from(d).expect("the products' dims fit an int");
        let times = common::rotated_rounds(rounds, &[0, 1], &mut flush, |form| match form {
            None => {}
            Some(0) => gemm(s, 1.0, &a, &b, 0.0, &mut c).expect("valid shape"),
            // SAFETY: `a`, `b`, `c` hold the m×k, k×n and m×n matrices at these leading dims.
            Some(_) => unsafe {
                sgemm(
                    ROW_MAJOR,
                    trans_a,
                    trans_b,
                    dim(s.m),
                    dim(s.n),
                    dim(s.k),
                    1.0,
                    a.as_ptr(),
                    dim(lda),
                    b.as_ptr(),
                    dim(ldb),
                    0.0,
                    c.as_mut_ptr(),
                    dim(s.n),
                )
            },
        });
        let medians = [spread(times[0].clone()).1, spread(times[1].clone()).1];
        sums[0] += medians[0];
        sums[1] += medians[1];
        let rate = |t: f64| s.flops() as f64 / t / 1e9;
        println!(
            "| {name} | {}×{}×{} | {:.1} | {:.1} |{}",
            s.m,
            s.n,
            s.k,
            rate(medians[0]),
            rate(medians[1]),
            common::speed_cells(&times)
        );
    }
    println!(
        "sum of the median times: engine {:.2} ms, MKL {:.2} ms",
        sums[0] * 1e3,
        sums[1] * 1e3
    );
}
