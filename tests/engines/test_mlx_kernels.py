"""The fused CUDA decode-attention kernel agrees with the portable MLX-ops path it replaces.

Runs only where MLX has a CUDA GPU (the H200 benchmark machine); elsewhere the engine never uses the
kernel, so there is nothing to check.
"""

from __future__ import annotations

import numpy as np
import pytest

from kinfer.engines import mlx_blas  # noqa: F401

import mlx.core as mx  # noqa: E402

from kinfer.engines.mlx_kernels import fused_decode_available  # noqa: E402
from kinfer.engines.mlx_kv import BLOCK, PagedKV, PagedLayer, PassLayout  # noqa: E402

cuda = pytest.mark.skipif(
    not fused_decode_available(128, 128, mx.bfloat16), reason="the fused kernel exists only for MLX on CUDA"
)


def _setup(lengths, *, heads=16, kv_heads=8, dim=128, dtype=mx.bfloat16, window=None, seed=0):
    rng = np.random.default_rng(seed)
    blocks_needed = [(n + BLOCK - 1) // BLOCK for n in lengths]
    total = sum(blocks_needed) + 3
    ids = rng.permutation(total)  # scattered, not contiguous: tables must be followed
    table = np.zeros((len(lengths), max(blocks_needed)), dtype=np.int64)
    at = 0
    for i, n in enumerate(blocks_needed):
        table[i, :n] = ids[at : at + n]
        at += n
    layer = PagedLayer(window=window)
    layer.keys = mx.array(rng.standard_normal((total, kv_heads, BLOCK, dim)).astype(np.float32)).astype(dtype)
    layer.values = mx.array(rng.standard_normal((total, kv_heads, BLOCK, dim)).astype(np.float32)).astype(dtype)
    layout = PassLayout(table, np.array(lengths) - 1, 1, decode=True)
    queries = mx.array(rng.standard_normal((len(lengths), heads, 1, dim)).astype(np.float32)).astype(dtype)
    return PagedKV(layer, layout), queries


@cuda
@pytest.mark.parametrize("lengths", [[1], [5, 64, 65, 300], [2000, 3, 129] * 8])
@pytest.mark.parametrize("shape", [(16, 8, 128), (8, 2, 256)])
def test_fused_kernel_matches_portable_path(lengths, shape):
    heads, kv_heads, dim = shape
    view, queries = _setup(lengths, heads=heads, kv_heads=kv_heads, dim=dim)
    fused = view.attend(queries, None, None, scale=dim**-0.5).astype(mx.float32)
    portable = view._attend_decode_ops(queries, dim**-0.5, None).astype(mx.float32)
    assert fused.shape == portable.shape == (len(lengths), heads, 1, dim)
    assert mx.abs(fused - portable).max().item() < 2e-2


@cuda
def test_fused_kernel_honours_a_sliding_window():
    view, queries = _setup([40, 500, 130], window=100, dtype=mx.float32)
    fused = view.attend(queries, None, None, scale=0.1)
    portable = view._attend_decode_ops(queries, 0.1, None)
    assert mx.abs(fused - portable).max().item() < 1e-4
