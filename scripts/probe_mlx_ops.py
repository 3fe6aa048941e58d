"""Host cost of a first-seen shape on MLX, op by op: each op at a few shapes, first call then again.

    PYTHONPATH=/tmp/site:$PWD python3 scripts/probe_mlx_ops.py
    MLX_USE_CUDA_GRAPHS=0 PYTHONPATH=/tmp/site:$PWD python3 scripts/probe_mlx_ops.py

On the H200 (2026-12-02, docs/benchmarks/h200-2026-12-02c/ops-probe.txt) only attention paid per shape:
`mx.fast.scaled_dot_product_attention` ~66 ms for each new length (MLX builds a cuDNN graph per exact
shape), while matmuls, norms, RoPE, gathers and compiled functions cost under a millisecond at a new
shape once their kernels were loaded.
"""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn

mx.random.seed(0)
WEIGHT = mx.random.normal((3072, 1024)).astype(mx.bfloat16)
EMBEDDINGS = mx.random.normal((32000, 1024)).astype(mx.bfloat16)
GAIN = mx.ones((1024,), dtype=mx.bfloat16)


def ones(*shape: int) -> mx.array:
    return mx.ones(shape, dtype=mx.bfloat16)


def timed(label: str, build, *sizes: int) -> None:
    for size in sizes:
        for attempt in ("first", "again"):
            out = build(size)
            start = time.perf_counter()
            mx.eval(out)
            print(
                f"{label:14s} {size!s:16s} {attempt:5s} {1000 * (time.perf_counter() - start):8.2f} ms",
                flush=True,
            )


def layers(rows: int) -> mx.array:
    x = ones(rows, 1024)
    for _ in range(8):
        x = nn.silu(mx.fast.rms_norm(x, GAIN, 1e-6) @ WEIGHT.T)[:, :1024]
    return x


def main() -> None:
    timed("matmul", lambda m: mx.random.normal((m, 1024)).astype(mx.bfloat16) @ WEIGHT.T, 300, 301, 17, 33)
    timed("rms_norm", lambda m: mx.fast.rms_norm(ones(m, 1024), GAIN, 1e-6), 300, 301)
    timed("embed", lambda m: EMBEDDINGS[mx.arange(m) % 1000], 300, 301)
    timed("argmax", lambda m: mx.argmax(ones(m, 32000), axis=-1), 17, 33)
    timed(
        "rope",
        lambda m: mx.fast.rope(ones(1, 16, m, 128), 128, traditional=False, base=1e6, scale=1.0, offset=0),
        300,
        301,
    )
    timed(
        "sdpa causal",
        lambda m: mx.fast.scaled_dot_product_attention(
            ones(1, 16, m, 128), ones(1, 16, m, 128), ones(1, 16, m, 128), scale=0.1, mask="causal"
        ),
        300,
        301,
        302,
    )
    timed(
        "sdpa q<kv",
        lambda m: mx.fast.scaled_dot_product_attention(
            ones(1, 16, 256, 128), ones(1, 8, m, 128), ones(1, 8, m, 128), scale=0.1, mask="causal"
        ),
        1024,
        1280,
        1536,
    )
    timed("8 layers", layers, 300, 301, 17, 33)
    fused = mx.compile(lambda x: nn.silu(x * 2 + 1) * x)
    timed("compiled", lambda m: fused(ones(m, 1024)), 300, 301)


if __name__ == "__main__":
    main()
