"""Scaled dot-product attention as plain MLX ops: MLX's own composition (its `fast.cpp` fallback, op for
op), for prompt attention on CUDA over short contexts, and over long ones while its scores fit
(long_context.ops_fit).

On a CUDA GPU `mx.fast.scaled_dot_product_attention` runs cuDNN, which plans a graph for every exact
shape and stride of q, k and v: ~66 ms of host time for each new one on the H200, while a server's
prefill passes change shape step after step. MLX's composition (two matrix products around a masked
softmax) has no such cost (20-35 ms a new shape for a whole qwen3-0.6b-shaped pass, 6-14 ms again:
`scripts/probe_mlx_graphs.py`); at 64 streams the first tokens came after 0.85-1.34 s (p50) with it
against 2.73 s with cuDNN (docs/benchmarks.md, "H200, fourth session"). It writes the [L, K] score
matrix, though, where cuDNN's flash attention never does: past SHORT_CONTEXT keys only while those
scores fit `long_context.OPS_SCORES_MAX` (a long prompt's short chunks, where it is also the faster);
a larger one keeps cuDNN, whose plan is then a small part of the pass.
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
            allowed = _four_axes(mask if mask.dtype == mx.bool_ else mask.astype(dtype))
            if repeats > 1 and allowed.shape[1] == 1:  # one mask for every head: broadcast, never copied
                allowed = mx.expand_dims(allowed, 2)
            elif repeats > 1:
                allowed = mx.broadcast_to(allowed, (allowed.shape[0], heads, length, context))
                allowed = allowed.reshape(allowed.shape[0], kv_heads, repeats, length, context)
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


def attention_bias_in_product(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, bias: mx.array
) -> mx.array:
    """The composition with an additive mask (`bias`, [1 or B, 1, L, K], one for every head) added by the
    first matrix product itself (`mx.addmm`: cuBLASLt's C input) and the scale as its alpha: no pass
    of their own over the [L, K] scores. A long prompt's chunk past SHORT_CONTEXT keys (sdpa_buckets):
    on the H200, 256 queries over 28,672 keys in 0.41 ms against 0.58 with the mask's own pass and
    cuDNN's 0.68 (0.65 / 0.96 / 1.16 ms at 49,152 keys; `scripts/probe_long_attention.py --kernels`).
    The same attention as `attention_ops` up to rounding (the scale meets the products, not the
    queries)."""
    dtype = mx.result_type(queries, keys, values)
    batch, heads, length, dim = queries.shape
    kv_heads = keys.shape[1]
    q = queries.astype(dtype).reshape(batch, kv_heads, heads // kv_heads, length, dim)
    k, v = mx.expand_dims(keys.astype(dtype), 2), mx.expand_dims(values.astype(dtype), 2)
    scores = mx.addmm(
        mx.expand_dims(_four_axes(bias).astype(dtype), 2), q, mx.swapaxes(k, -1, -2), alpha=scale
    )
    out = mx.softmax(scores, axis=-1, precise=True) @ v
    return out.reshape(batch, heads, length, -1)


def _four_axes(mask: mx.array) -> mx.array:
    """A mask of [L, K], [B, L, K] or [B, H, L, K] with leading axes of one added up to four (a view)."""
    return mask.reshape((1,) * (4 - mask.ndim) + mask.shape) if mask.ndim < 4 else mask


@functools.lru_cache(maxsize=64)
def _causal(length: int, context: int) -> mx.array:
    """[length, context] True where a query may see a key (bottom-right causal): built once per shape,
    not once per layer and pass (the pass shapes repeat: shape_buckets)."""
    return mx.arange(context - length, context)[:, None] >= mx.arange(context)[None]
