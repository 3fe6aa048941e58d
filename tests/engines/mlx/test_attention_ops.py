"""Prompt attention as MLX's own ops (attention_ops.py), what the engine runs on CUDA over short contexts
instead of cuDNN: the same numbers as `mx.fast.scaled_dot_product_attention` (on a CPU MLX computes
that by the same composition, so there they must agree to the bit; on CUDA the reference is cuDNN's
flash attention, a different order of sums: to rounding)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kinfer.engines.mlx.attention_ops import attention_bias_in_product, attention_ops

DIM = 16


def inputs(batch, heads, kv_heads, length, context, dtype, seed=0):
    key = mx.random.key(seed)
    q, k, v = (
        mx.random.normal((batch, h, n, DIM), key=mx.random.split(key, 3)[i]).astype(dtype)
        for i, (h, n) in enumerate([(heads, length), (kv_heads, context), (kv_heads, context)])
    )
    return q, k, v


def same(got: mx.array, want: mx.array) -> bool:
    if mx.default_device() == mx.cpu:
        return mx.array_equal(got, want).item()
    tol = 2e-2 if got.dtype == mx.bfloat16 else 2e-3  # bf16 keeps 8 bits; float32 products run in TF32
    return mx.allclose(got.astype(mx.float32), want.astype(mx.float32), atol=tol, rtol=tol).item()


def fast(q, k, v, mask, sinks=None):
    extra = {} if sinks is None else {"sinks": sinks}
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=DIM**-0.5, mask=mask, **extra)


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("heads", [4, 8])  # 4 query heads on 4 or 8 on 4 KV heads (grouped)
@pytest.mark.parametrize(("length", "context"), [(12, 12), (5, 20)])  # square; a chunk after a prefix
@pytest.mark.parametrize("mask", [None, "causal"])
def test_the_composition_is_mlxs_own(dtype, heads, length, context, mask):
    q, k, v = inputs(2, heads, 4, length, context, dtype)
    assert same(attention_ops(q, k, v, DIM**-0.5, mask), fast(q, k, v, mask))


def test_boolean_and_additive_masks_per_row_and_sinks():
    q, k, v = inputs(3, 8, 4, 6, 10, mx.float32, seed=1)
    per_row = mx.random.uniform(shape=(3, 1, 6, 10), key=mx.random.key(2)) > 0.3
    per_row = per_row | (mx.arange(10) == 0)  # every query sees a key
    additive = mx.where(per_row, 0.0, -1e9).astype(mx.float32)
    sinks = mx.random.normal((8,), key=mx.random.key(3))
    for mask in (per_row, additive):
        assert same(attention_ops(q, k, v, DIM**-0.5, mask), fast(q, k, v, mask))
        got, want = attention_ops(q, k, v, DIM**-0.5, mask, sinks), fast(q, k, v, mask, sinks)
        assert same(got, want)


def test_one_mask_for_every_head_is_broadcast_over_grouped_heads():
    # [1, 1, L, K], as the long path's additive mask: the same numbers as MLX's, whatever its dims
    q, k, v = inputs(1, 8, 2, 6, 40, mx.bfloat16, seed=4)
    allowed = mx.arange(40)[None, :] <= mx.arange(6)[:, None] + 30
    for mask in (
        allowed,
        allowed[None, None],
        mx.where(allowed, 0.0, -float("inf")).astype(mx.bfloat16)[None, None],
    ):
        assert same(attention_ops(q, k, v, DIM**-0.5, mask), fast(q, k, v, mask))


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_the_mask_added_by_the_first_product_is_the_same_attention(dtype):
    # a long prompt's chunk: one additive mask for every head, added by mx.addmm with the scale as its
    # alpha (no pass of its own over the scores); per-row masks too. The scale meets the product, not
    # the queries: the same numbers to rounding
    q, k, v = inputs(2, 8, 2, 6, 40, dtype, seed=5)
    allowed = mx.arange(40)[None, :] <= mx.arange(6)[:, None] + mx.array([30, 20])[:, None, None, None]
    bias = mx.where(allowed, 0.0, -float("inf")).astype(dtype)  # [2, 1, 6, 40]
    tol = 1e-5 if dtype == mx.float32 else 2e-2
    for mask in (bias, bias[:1], bias[0, 0]):
        got, want = (
            attention_bias_in_product(q, k, v, DIM**-0.5, mask),
            attention_ops(q, k, v, DIM**-0.5, mask),
        )
        assert got.shape == want.shape == (2, 8, 6, DIM)
        assert mx.allclose(got.astype(mx.float32), want.astype(mx.float32), atol=tol, rtol=tol).item()
