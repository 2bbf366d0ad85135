//! Half-precision products on this CPU: which way is fastest for the GPT's matmuls (issue 16's
//! "bf16/f16 matmuls use the gemm crate's half-precision kernels, or whatever is fastest here,
//! measured"). Per shape, single-threaded:
//! - `f32`: the f32 product, the baseline;
//! - `widen_f32`: what Tessera runs for bf16 and f16 — widen both operands to f32, the f32
//!   product, round the result;
//! - `gemm_f16`: the gemm crate's own f16 kernel (there is none for bf16).
//!
//! Throughput is in "elements" of one flop (`2·m·n·k` per product): criterion's `Gelem/s`
//! reads as GFLOP/s.
//!
//! Run: `cargo bench -p tessera-tensor --features half-gemm --bench half_matmul`.

use std::time::Duration;

mod common;

use common::values;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensor::{DType, Tensor};

/// `(name, m, n, k)`: the GPT benchmark's (width 256, 2048 tokens) QKV, MLP and LM head.
const SHAPES: [(&str, usize, usize, usize); 3] = [
    ("qkv", 2048, 768, 256),
    ("fc1", 2048, 1024, 256),
    ("lm_head", 2048, 256, 256),
];

/// `dst = a·b` (`mnk` = m, n, k) with gemm's generic entry point, row-major, one thread;
/// `unit` is (0, 1) in `T`.
fn gemm_rowmajor<T: 'static + Copy>(
    mnk: (usize, usize, usize),
    a: &[T],
    b: &[T],
    dst: &mut [T],
    unit: (T, T),
) {
    let (m, n, k) = mnk;
    assert!(a.len() >= m * k && b.len() >= k * n && dst.len() >= m * n);
    // SAFETY: the slices hold m·k, k·n and m·n elements (checked) with the strides given.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            unit.0,
            unit.1,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("half_matmul");
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    for (name, m, n, k) in SHAPES {
        group.throughput(Throughput::Elements((2 * m * n * k) as u64));
        let a = values(m * k, 1);
        let b = values(k * n, 2);
        let mut out = vec![0.0f32; m * n];
        group.bench_function(BenchmarkId::new("f32", name), |bench| {
            bench.iter(|| gemm_rowmajor((m, n, k), &a, &b, &mut out, (0.0, 1.0)))
        });
        let a_bf16 = Tensor::from_vec(&[m, k], a.clone())
            .unwrap()
            .to_dtype(DType::BF16);
        let b_bf16 = Tensor::from_vec(&[k, n], b.clone())
            .unwrap()
            .to_dtype(DType::BF16);
        group.bench_function(BenchmarkId::new("widen_f32", name), |bench| {
            bench.iter(|| {
                let a = a_bf16.to_dtype(DType::F32);
                let b = b_bf16.to_dtype(DType::F32);
                let (a, b) = (a.as_slice::<f32>().unwrap(), b.as_slice::<f32>().unwrap());
                gemm_rowmajor((m, n, k), a, b, &mut out, (0.0, 1.0));
                Tensor::from_vec(&[m, n], out.clone())
                    .unwrap()
                    .to_dtype(DType::BF16)
            })
        });
        let a16: Vec<gemm::f16> = a.iter().map(|&x| gemm::f16::from_f32(x)).collect();
        let b16: Vec<gemm::f16> = b.iter().map(|&x| gemm::f16::from_f32(x)).collect();
        let mut out16 = vec![gemm::f16::from_f32(0.0); m * n];
        let (zero, one) = (gemm::f16::from_f32(0.0), gemm::f16::from_f32(1.0));
        group.bench_function(BenchmarkId::new("gemm_f16", name), |bench| {
            bench.iter(|| gemm_rowmajor((m, n, k), &a16, &b16, &mut out16, (zero, one)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
