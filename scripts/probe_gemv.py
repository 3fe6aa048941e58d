"""Host microseconds per matrix product of one decode row, by how the product is written (MLX on CUDA).

    python scripts/probe_gemv.py

MLX's CUDA backend has a GEMV kernel for M = 1 with a transposed B (`gemm_and_bias` -> `cu::gemv`, a
plain kernel node) and sends everything else to cuBLASLt (host setup and a stream capture per call);
an AddMM with a bias always goes to cuBLASLt. Each case builds 200 independent products of a [1, 1, K]
row and evaluates them together, best of five; a case much cheaper than the rest took the GEMV.
"""

from __future__ import annotations

import time

import mlx.core as mx


def per_call_us(build, calls: int = 200, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        outs = [build() for _ in range(calls)]
        start = time.perf_counter()
        mx.eval(outs)
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def _cases(x: mx.array, c: mx.array, w_t: mx.array, w_c: mx.array) -> dict:
    return {
        "x @ W.T (view)": lambda: x @ w_t,
        "x @ contiguous(W.T)": lambda: x @ w_c,
        "addmm(c, x, W.T)": lambda: mx.addmm(c, x, w_t),
        "c + x @ W.T": lambda: c + x @ w_t,
    }


def main() -> None:
    for rows, k, n in ((1, 1024, 4096), (1, 1024, 6144), (1, 3072, 1024), (4, 1024, 4096)):
        w = (mx.random.normal((n, k)) * 0.02).astype(mx.bfloat16)  # nn.Linear's [out, in]
        w_t = w.T  # a view: B transposed
        w_c = mx.contiguous(w.T)  # a copy laid out [in, out]: B not transposed
        x = mx.random.normal((rows, 1, k)).astype(mx.bfloat16)
        c = mx.random.normal((rows, 1, n)).astype(mx.bfloat16)
        mx.eval(w, w_t, w_c, x, c)
        cases = _cases(x, c, w_t, w_c)
        for build in cases.values():
            per_call_us(build, calls=20, repeats=1)  # first sightings out of the way
        line = "  ".join(f"{name} {per_call_us(build):6.1f}" for name, build in cases.items())
        print(f"rows {rows} K {k} N {n}: us per call: {line}", flush=True)


if __name__ == "__main__":
    main()
