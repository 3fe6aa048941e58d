"""Prefill attention in a few shapes: MLX's CUDA backend builds a cuDNN graph per attention shape.

On a CUDA GPU `mx.fast.scaled_dot_product_attention` runs cuDNN's fused attention, and MLX builds (and
caches, 256 at most) one cuDNN graph per exact shape of q / k / v. Building one costs the host ~66 ms
(H200, measured op by op: a first call at a new length 66 ms, the same shape again 0.3 ms; matmuls, norms,
RoPE and gathers at a new shape cost well under 1 ms). A prefill pass has whatever shape its prompts give
it (rows x chunk length, and the context a continued chunk attends to), so nearly every pass of a burst
of different prompts was a new graph: steps of 200-300 ms instead of ~12 ms, first tokens many seconds
late, and a long prompt stalling the streaming rows whenever its chunk met a new context length.

So on CUDA (`shape_buckets.enabled()`) every prefill attention call is padded to a bucket: rows to a
power of two, query and key lengths to `shape_buckets.bucket` (a quarter octave: <= 25 % padding, four
sizes per doubling). Padded keys are masked out and padded queries / rows are sliced off, so the real
rows' results are the same attention over the same keys. Up to `attention_ops.SHORT_CONTEXT` keys the
padded call runs as MLX's own ops instead of cuDNN (no plan per shape at all); past it, with queries
padded to at least `LONG_CONTEXT_QUERIES`, MLX's ops again while the scores fit
(`long_context.ops_fit`: they beat cuDNN's flash attention at a long prompt's short chunks), else
cuDNN, with its plan per (bucketed) shape: a long prompt's chunks beside decoding rows are that long,
its last one shorter, so past `SHORT_CONTEXT` a chunk meets one shape per key bucket, which the
warm-up runs at load (warm_up.py).
Left to serving, qwen3-0.6b's 30,000-token prompt beside 16 streaming rows (H200) met cuDNN's first
plan at 4,096 keys in a 780 ms step and each later key bucket in a 75-100 ms one (median step 5.8 ms).
Masks become explicit boolean arrays whenever padding would move a causal mask's diagonal; past
`SHORT_CONTEXT` they reach cuDNN as an additive mask in the queries' dtype, made once per pass
(`_long_additive_mask`): given a boolean mask, MLX converts it for cuDNN on every call, into a bias array
broadcast over every query head (H200, one 256-token chunk over 30,000 keys: 1.25 ms with the boolean
mask, 0.27 ms with a [1, 1, L, K] bias, as with the plain causal mask; `scripts/probe_long_attention.py`),
so a qwen3-0.6b chunk step at 30,000 keys waited ~28 ms for its 28 layers' conversions. Decode
attention does not come here (kinfer's paged decode kernel has no per-shape cost; the engine pads the
decode pass's rows: `shape_buckets.decode_rows`).
"""

from __future__ import annotations

import mlx.core as mx

from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT, attention_bias_in_product, attention_ops
from kinfer.engines.mlx.long_context import ops_fit
from kinfer.engines.mlx.shape_buckets import bucket, row_bucket
from kinfer.engines.prefill_budget import UNTIMED_BESIDE_DECODE

LONG_CONTEXT_QUERIES = UNTIMED_BESIDE_DECODE  # past SHORT_CONTEXT keys, the least padded query length


def bucketed_sdpa(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    mask: str | mx.array | None,
    sinks: mx.array | None,
    *,
    built: dict | None = None,
    key: tuple | None = None,
) -> mx.array:
    """`mx.fast.scaled_dot_product_attention` on padded inputs; the real part of its output.

    queries [B, Hq, L, D]; keys / values [B, Hk, K, D]; mask: "causal" (bottom-right aligned, as MLX
    reads it when L < K), a boolean array broadcastable to [B, 1 or Hq, L, K], or None. `built` / `key`:
    where the padded mask is kept for the pass's other layers (the same mask, the same shapes)."""
    if isinstance(mask, mx.array) and mask.dtype != mx.bool_:
        # an additive mask may carry biases padding cannot extend safely: left as it is (kinfer's own
        # prefill masks are "causal" or boolean)
        return _sdpa(queries, keys, values, scale, mask, sinks)
    batch, _, length, _ = queries.shape
    context = keys.shape[2]
    rows, q_len = row_bucket(batch), bucket(length)
    square_causal = isinstance(mask, str) and length == context
    k_len = q_len if square_causal else bucket(context)
    if k_len > SHORT_CONTEXT and not square_causal:
        q_len = max(q_len, LONG_CONTEXT_QUERIES)  # one query length past it: the warm-up's
        if q_len == length:  # and one layout: cuDNN keys its plan on strides too; a padded chunk's
            queries = mx.contiguous(queries)  # queries are a copy already, a full one's a transposed view
    if (rows, q_len, k_len) == (batch, length, context):
        additive = _long_additive_mask(mask, queries.dtype, k_len, built, key)
        return _sdpa(queries, keys, values, scale, additive, sinks)
    q = _pad(queries, rows, q_len)
    k, v = _pad(keys, rows, k_len), _pad(values, rows, k_len)
    if square_causal:
        # both lengths padded alike: the real queries still see exactly the real keys up to their own
        padded_mask: str | mx.array | None = "causal"
    else:
        padded_key = None if built is None or key is None else ("padded", key, rows, q_len, k_len)
        padded_mask = None if padded_key is None else built.get(padded_key)
        if padded_mask is None:
            padded_mask = _padded_mask(mask, batch, length, context, rows, q_len, k_len)
            if padded_key is not None:
                built[padded_key] = padded_mask
        padded_mask = _long_additive_mask(padded_mask, queries.dtype, k_len, built, padded_key)
    out = _sdpa(q, k, v, scale, padded_mask, sinks)
    return out[:batch, :, :length, :]


def _long_additive_mask(
    mask: str | mx.array | None, dtype: mx.Dtype, context: int, built: dict | None, key: tuple | None
) -> str | mx.array | None:
    """Past SHORT_CONTEXT, a boolean mask as one additive mask made once for the pass's layers (kept in
    `built` under `key`): cuDNN takes it as is (given the boolean one, MLX converts it on every call),
    the composition adds it in its first product; otherwise `mask`."""
    if context <= SHORT_CONTEXT or not isinstance(mask, mx.array) or mask.dtype != mx.bool_:
        return mask
    additive_key = None if built is None or key is None else ("additive", key, dtype)
    additive = None if additive_key is None else built.get(additive_key)
    if additive is None:
        while mask.ndim < 4:  # [.., L, K] -> [1, 1, L, K]: one bias broadcast over the heads
            mask = mask[None]
        additive = mx.where(mask, mx.array(0, dtype), mx.array(-float("inf"), dtype))
        if additive_key is not None:
            built[additive_key] = additive
    return additive


def _pad(x: mx.array, rows: int, length: int) -> mx.array:
    extra_rows, extra_len = rows - x.shape[0], length - x.shape[2]
    if extra_rows == 0 and extra_len == 0:
        return x
    return mx.pad(x, [(0, extra_rows), (0, 0), (0, extra_len), (0, 0)])


def _padded_mask(
    mask: str | mx.array | None, batch: int, length: int, context: int, rows: int, q_len: int, k_len: int
) -> mx.array:
    """[1 or rows, 1 or heads, q_len, k_len] booleans: the real block as `mask` says (bottom-right causal
    for "causal"), padded keys hidden from real queries; a padded query (or padded row) sees key 0 only (a
    softmax over nothing is NaN, and NaN is best kept out of even a discarded row)."""
    real = _real_mask(mask, length, context)
    per_row = real.shape[0] > 1
    if per_row and real.shape[0] != batch:
        raise ValueError(f"attention mask rows {real.shape[0]} do not match the batch {batch}")
    extra_rows = rows - batch if per_row else 0
    widths = [(0, extra_rows), (0, 0), (0, q_len - length), (0, k_len - context)]
    real = mx.pad(real, widths, constant_values=False)
    empty = mx.arange(q_len)[:, None] >= length  # [q_len, 1]: padded queries
    if per_row:
        empty = (mx.arange(rows) >= batch)[:, None, None, None] | empty[None, None]
    first_key = mx.arange(k_len) == 0
    return mx.where(empty, first_key, real)


def _real_mask(mask: str | mx.array | None, length: int, context: int) -> mx.array:
    """`mask` as a [1 or B, 1 or heads, length, context] boolean array."""
    if mask is None:
        return mx.ones((1, 1, length, context), dtype=mx.bool_)
    if isinstance(mask, str):
        query_pos = mx.arange(length)[:, None] + (context - length)
        return (mx.arange(context)[None, :] <= query_pos)[None, None]
    real = mask
    while real.ndim < 4:
        real = real[None]
    return real


def _sdpa(queries, keys, values, scale, mask, sinks):
    batch, heads, length, _ = queries.shape
    context = keys.shape[2]
    long_ops = context > SHORT_CONTEXT and ops_fit(batch, heads, length, context)
    if long_ops and sinks is None and _one_bias_for_every_head(mask):
        return attention_bias_in_product(queries, keys, values, scale, mask)  # the mask in the product
    if context <= SHORT_CONTEXT or long_ops:
        return attention_ops(queries, keys, values, scale, mask, sinks)  # no cuDNN plan per shape
    if sinks is None:
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask, sinks=sinks)


def _one_bias_for_every_head(mask) -> bool:
    """An additive mask shared by the heads ([.., 1, L, K]), as `_long_additive_mask` makes them."""
    return isinstance(mask, mx.array) and mask.dtype != mx.bool_ and (mask.ndim < 3 or mask.shape[-3] == 1)
