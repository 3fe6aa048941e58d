"""Prompt attention as MLX's own ops (attention_ops.py), what the engine runs on CUDA over short contexts
instead of cuDNN: the same numbers as `mx.fast.scaled_dot_product_attention` (on a CPU MLX computes
that by the same composition, so here they must agree to the bit)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kinfer.engines.mlx.attention_ops import attention_ops

DIM = 16


def inputs(batch, heads, kv_heads, length, context, dtype, seed=0):
    key = mx.random.key(seed)
    q, k, v = (
        mx.random.normal((batch, h, n, DIM), key=mx.random.split(key, 3)[i]).astype(dtype)
        for i, (h, n) in enumerate([(heads, length), (kv_heads, context), (kv_heads, context)])
    )
    return q, k, v


def fast(q, k, v, mask, sinks=None):
    extra = {} if sinks is None else {"sinks": sinks}
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=DIM**-0.5, mask=mask, **extra)


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("heads", [4, 8])  # 4 query heads on 4 or 8 on 4 KV heads (grouped)
@pytest.mark.parametrize(("length", "context"), [(12, 12), (5, 20)])  # square; a chunk after a prefix
@pytest.mark.parametrize("mask", [None, "causal"])
def test_the_composition_is_mlxs_own(dtype, heads, length, context, mask):
    q, k, v = inputs(2, heads, 4, length, context, dtype)
    assert mx.array_equal(attention_ops(q, k, v, DIM**-0.5, mask), fast(q, k, v, mask)).item()


def test_boolean_and_additive_masks_per_row_and_sinks():
    q, k, v = inputs(3, 8, 4, 6, 10, mx.float32, seed=1)
    per_row = mx.random.uniform(shape=(3, 1, 6, 10), key=mx.random.key(2)) > 0.3
    per_row = per_row | (mx.arange(10) == 0)  # every query sees a key
    additive = mx.where(per_row, 0.0, -1e9).astype(mx.float32)
    sinks = mx.random.normal((8,), key=mx.random.key(3))
    for mask in (per_row, additive):
        assert mx.array_equal(attention_ops(q, k, v, DIM**-0.5, mask), fast(q, k, v, mask)).item()
        got, want = attention_ops(q, k, v, DIM**-0.5, mask, sinks), fast(q, k, v, mask, sinks)
        assert mx.array_equal(got, want).item()
