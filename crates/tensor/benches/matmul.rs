//! Single-threaded f32 gemm on the shapes of the seed MLP (784-512-512-10, batch 32), on every
//! backend (`gemm`, `gemm_colmajor`, `matrixmultiply`), plus the routed entry point `gemm`.
//!
//! Throughput is reported in "elements" per second where one element is one floating-point
//! operation (`2·m·n·k` per product), so criterion's `Gelem/s` reads as GFLOP/s.
//!
//! Run: `cargo bench -p tessera-tensor --bench matmul`.

use std::time::Duration;

mod common;

use common::{shape, values};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensor::kernels::{gemm, gemm_with, GemmBackend, GemmShape};

/// Weights are stored `[in, out]` and the forward pass is `X·W`.
/// Backward: `dX = dY·Wᵀ` (transposed B) and `dW = Xᵀ·dY` (transposed A).
const MLP_SHAPES: [(&str, GemmShape); 9] = [
    ("mlp_fc1_fwd", shape(32, 512, 784, false, false)),
    ("mlp_fc2_fwd", shape(32, 512, 512, false, false)),
    ("mlp_fc3_fwd", shape(32, 10, 512, false, false)),
    ("mlp_fc1_dx", shape(32, 784, 512, false, true)),
    ("mlp_fc2_dx", shape(32, 512, 512, false, true)),
    ("mlp_fc3_dx", shape(32, 512, 10, false, true)),
    ("mlp_fc1_dw", shape(784, 512, 32, true, false)),
    ("mlp_fc2_dw", shape(512, 512, 32, true, false)),
    ("mlp_fc3_dw", shape(512, 10, 32, true, false)),
];

fn matmul_shapes(c: &mut Criterion) {
    for (name, shape) in MLP_SHAPES {
        let a = values(shape.m * shape.k, 1);
        let b = values(shape.k * shape.n, 2);
        let mut out = vec![0f32; shape.m * shape.n];
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(shape.flops()));
        for backend in GemmBackend::ALL {
            group.bench_function(BenchmarkId::from_parameter(backend.name()), |bench| {
                bench.iter(|| {
                    gemm_with(backend, shape, 1.0, &a, &b, 0.0, &mut out).expect("valid shape")
                })
            });
        }
        group.bench_function(BenchmarkId::from_parameter("routed"), |bench| {
            bench.iter(|| gemm(shape, 1.0, &a, &b, 0.0, &mut out).expect("valid shape"))
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(40)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = matmul_shapes
}
criterion_main!(benches);
