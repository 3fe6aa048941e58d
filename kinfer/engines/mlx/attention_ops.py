"""Scaled dot-product attention as plain MLX ops: MLX's own composition (its `fast.cpp` fallback, op for
op), for prompt attention on CUDA over short contexts.

On a CUDA GPU `mx.fast.scaled_dot_product_attention` runs cuDNN, which plans a graph for every exact
shape and stride of q, k and v: ~66 ms of host time for each new one on the H200, while a server's
prefill passes change shape step after step. MLX's composition (two matrix products around a masked
softmax) has no such cost (20-35 ms a new shape for a whole qwen3-0.6b-shaped pass, 6-14 ms again:
`scripts/probe_mlx_graphs.py`); at 64 streams the first tokens came after 0.85-1.34 s (p50) with it
against 2.73 s with cuDNN (docs/benchmarks.md, "H200, fourth session"). It writes the [L, K] score
matrix, though, where cuDNN's flash attention never does: so only up to SHORT_CONTEXT keys
(`sdpa_buckets._sdpa`); a longer context keeps cuDNN, whose plan is then a small part of the pass.
"""

from __future__ import annotations

import functools

import mlx.core as mx

SHORT_CONTEXT = 4096  # keys; 16 heads x a 2,048-token chunk x 4,096 keys of bf16 scores: 256 MiB


def attention_ops(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    mask: str | mx.array | None,
    sinks: mx.array | None = None,
) -> mx.array:
    """The same result as `mx.fast.scaled_dot_product_attention` (queries [B, Hq, L, D], keys / values
    [B, Hk, K, D], mask "causal" (bottom-right), a boolean or additive array, or None; sinks [Hq])."""
    dtype = mx.result_type(queries, keys, values)
    batch, heads, length, _ = queries.shape
    kv_heads, context = keys.shape[1], keys.shape[2]
    repeats = heads // kv_heads
    q = mx.array(scale, dtype=dtype) * queries.astype(dtype)
    k, v = keys.astype(dtype), values.astype(dtype)
    if repeats > 1:
        q = q.reshape(batch, kv_heads, repeats, length, -1)
        k, v = mx.expand_dims(k, 2), mx.expand_dims(v, 2)
    scores = q @ mx.swapaxes(k, -1, -2)
    if mask is not None:
        if isinstance(mask, str):
            allowed = _causal(length, context)
        else:
            allowed = mx.broadcast_to(mask, (batch, heads, length, context))
            if allowed.dtype != mx.bool_:
                allowed = allowed.astype(dtype)
            if repeats > 1:
                allowed = allowed.reshape(batch, kv_heads, repeats, length, context)
        if allowed.dtype == mx.bool_:
            scores = mx.where(allowed, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
        else:
            scores = scores + allowed
    if sinks is not None:
        sink = sinks.astype(dtype).reshape(1, heads, 1, 1)
        if repeats > 1:
            sink = sink.reshape(1, kv_heads, repeats, 1, 1)
        scores = mx.concatenate([mx.broadcast_to(sink, (*scores.shape[:-1], 1)), scores], axis=-1)
    scores = mx.softmax(scores, axis=-1, precise=True)
    if sinks is not None:
        scores = scores[..., 1:]
    out = scores @ v
    return out.reshape(batch, heads, length, -1) if repeats > 1 else out


@functools.lru_cache(maxsize=64)
def _causal(length: int, context: int) -> mx.array:
    """[length, context] True where a query may see a key (bottom-right causal): built once per shape,
    not once per layer and pass (the pass shapes repeat: shape_buckets)."""
    return mx.arange(context - length, context)[:, None] >= mx.arange(context)[None]
