"""One row's prompt chunk over a long context, on CUDA: whose attention, its keys and values in one copy
each.

Past `attention_ops.SHORT_CONTEXT` keys a chunk attends to the row's whole context as [1, kv heads, K,
dim] arrays padded to the key bucket (sdpa_buckets.py). Its attention is MLX's composition
(attention_ops.py) while the [rows, heads, L, K] scores fit OPS_SCORES_MAX, else cuDNN's flash
attention. On the H200 one cuDNN call walks every key once per (head, 64-query tile), so a long
prompt's 256-query chunk beside decoding rows leaves most SMs idle: qwen3-0.6b's shape at 28,672 keys,
0.68 ms a call for 256 queries against the composition's 0.41 with its mask added by the first
product (0.65 against 1.16 ms at 49,152; `scripts/probe_long_attention.py --kernels`). Through HTTP,
16 rows streaming beside a 30,000-token prompt (the composition with its mask's own pass, 0.59 ms):
their largest gap 42-43 ms against 59-61, the prompt's first token unchanged (docs/benchmarks.md, "H200,
third session of 2026-12-04"). The composition's time grows with the chunk
where cuDNN's does not (128 queries: 0.32 ms, 512: 1.12 at 28,672 keys), so prompts alone, in
2,048-token chunks, keep cuDNN: their scores would not fit.

Gathered by blocks out of
the paged pool (kv.py) that took three copies of the context per layer, for keys and for values: the
blocks, their [heads, positions] transpose, and the padding to the bucket; on the H200 a 30,000-token
context cost 0.44 ms per copy set (`scripts/probe_long_attention.py`), 24 ms a step for qwen3-0.6b's
28 layers, most of its chunk step's device time. Here the pool rows are taken in the order cuDNN
reads them, straight to the bucket's width, in one `take` per pool: a bucket's padding points at the
row's first position (any finite values do: the mask hides them).

On CUDA one kernel copies them instead (long_kv_copy.py: whole blocks, keys and values in one launch;
`take`'s gather works element by element). The row's inputs (its block ids or pool rows) and the mask
are the same for every layer of a pass (one block table, one window): built by the first layer, kept
in the pass's `prefill_inputs`.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np

from kinfer.engines.mlx import kernels, long_kv_copy, shape_buckets
from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT
from kinfer.engines.mlx.shape_buckets import bucket

copy_kernel: bool | None = None  # long_kv_copy's kernel: None = on a CUDA GPU (tests flip it)

OPS_SCORES_MAX = 512 << 20  # bytes of one pass's bf16 scores the composition may write (2 live at once)


def scores_bytes(rows: int, heads: int, queries: int, keys: int) -> int:
    """The composition's [rows, heads, queries, keys] score matrix, in bf16."""
    return 2 * rows * heads * queries * keys


def ops_fit(rows: int, heads: int, queries: int, keys: int) -> bool:
    """Whether a long chunk's attention (keys padded: a bucket) runs as MLX's composition."""
    return scores_bytes(rows, heads, queries, keys) <= OPS_SCORES_MAX


def takes_long_path(batch: int, end: int) -> bool:
    """Whether a chunk of `batch` rows ending at `end` takes this path: one row, past SHORT_CONTEXT, with
    the shape buckets on (CUDA: cuDNN's attention; elsewhere the padding is not made at all)."""
    return batch == 1 and shape_buckets.enabled() and bucket(end) > SHORT_CONTEXT


def pool_rows(blocks: np.ndarray, heads: int, block: int, end: int) -> mx.array:
    """Pool rows ([blocks * heads * block, dim] storage) of positions [0, bucket(end)) of a row whose
    blocks are `blocks`, head by head ([heads * width] int32): a `take` of them reshapes for free into
    [1, heads, width, dim]. Positions past `end` read position 0 (hidden by `long_mask`). Device ops:
    built in numpy, the rows of a 30,000-token context cost the host ~10 ms a pass."""
    width = bucket(end)
    pos = mx.arange(width, dtype=mx.int32)
    pos = mx.where(pos < end, pos, 0)
    slots = mx.array(blocks.astype(np.int32))[pos // block]
    head = mx.arange(heads, dtype=mx.int32)[:, None]
    rows = (slots[None, :] * heads + head) * block + (pos % block)[None, :]
    return rows.reshape(-1)


def long_mask(start: int, length: int, window: int | None) -> mx.array:
    """[1, 1, length, bucket(start + length)] booleans: query i (position start + i) sees the positions
    up to its own (within `window`), never the bucket's padding (device ops, as `pool_rows`)."""
    query_pos = start + mx.arange(length)[:, None]
    key_pos = mx.arange(bucket(start + length))[None, :]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed = allowed & (key_pos > query_pos - window)
    return allowed[None, None]


def gathered(pool: mx.array, rows: mx.array, heads: int) -> mx.array:
    """The rows of `pool` as [1, heads, width, dim]."""
    return mx.take(pool, rows, axis=0).reshape(1, heads, -1, pool.shape[-1])


def row_context(
    keys: mx.array,
    values: mx.array,
    row_blocks: Callable[[], np.ndarray],
    end: int,
    heads: int,
    block: int,
    built: dict,
) -> tuple[mx.array, mx.array]:
    """The row's keys and values, positions [0, bucket(end)), as [1, heads, width, dim] each: copied by
    long_kv_copy's kernel on CUDA, else taken (`pool_rows`). `row_blocks`: its block ids covering `end`
    (called by the pass's first layer only); `built`: the pass's `prefill_inputs`, where the first layer
    leaves its choice and inputs for the others."""
    inputs = built.get(("long copy", end))
    rows = built.get(("long rows", heads))
    if inputs is None and rows is None:  # the pass's first layer: choose, and build for every layer
        use_kernel = kernels.on_cuda_gpu() if copy_kernel is None else copy_kernel
        dim = keys.shape[-1]
        if use_kernel and values.shape[-1] == dim and long_kv_copy.copyable(dim, keys.dtype):
            ids = mx.array(row_blocks().astype(np.int32))
            inputs = built["long copy", end] = (ids, mx.array([end], dtype=mx.int32))
        else:
            rows = built["long rows", heads] = pool_rows(row_blocks(), heads, block, end)
    if inputs is not None:
        return long_kv_copy.copy_row(keys, values, *inputs, heads, block, bucket(end))
    return gathered(keys, rows, heads), gathered(values, rows, heads)
