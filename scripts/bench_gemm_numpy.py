"""Single-thread f32 matrix products of NumPy (its BLAS: OpenBLAS in PyPI's wheels) on the GPT
benchmark's forward product shapes, the same shapes `tessera bench gpt-step` times for its
model-FLOP-utilisation line: GFLOP/s at the median of 15 products after 3 warm-up ones.

    OPENBLAS_NUM_THREADS=1 python3 scripts/bench_gemm_numpy.py [hidden]
"""
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
import numpy as np  # noqa: E402  (the thread count is read at import)

HIDDEN = int(sys.argv[1]) if len(sys.argv) > 1 else 256
TOKENS, VOCAB = 16 * 128, 256


def main():
    shapes = [(TOKENS, HIDDEN, 3 * HIDDEN), (TOKENS, HIDDEN, HIDDEN),
              (TOKENS, HIDDEN, 4 * HIDDEN), (TOKENS, 4 * HIDDEN, HIDDEN),
              (TOKENS, HIDDEN, VOCAB)]
    rates = []
    for m, k, n in shapes:
        a = np.random.rand(m, k).astype(np.float32)
        b = np.random.rand(k, n).astype(np.float32)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(15):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        rates.append(f"{m}x{k}x{n} {2 * m * k * n / statistics.median(times) / 1e9:.1f}")
    print(f"numpy {np.__version__}, 1 thread (m x k x n GFLOP/s): " + ", ".join(rates))


if __name__ == "__main__":
    main()
