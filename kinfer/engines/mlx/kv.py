"""Paged attention KV for the MLX engine: a block pool per attention layer, shared by all rows.

Each row owns a list of block ids (BLOCK tokens each); the prefix pool holds references to blocks too,
so an adopted prefix costs no copy except its last, partly filled block. The model classes of mlx-lm
stay untouched: a `PagedKV` view stands in for their `KVCache` during one forward pass, and
`install_attention_hook` reroutes mlx-lm's `scaled_dot_product_attention` to the view's `attend` when
(and only when) the cache is such a view.

Decode attention reads, for each row, only that row's own blocks (split-K over blocks, then a
log-sum-exp merge per row), so a long reply never makes the short ones read its length.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kinfer.engines.mlx import long_context, sdpa_buckets, shape_buckets
from kinfer.engines.mlx.hooks import reroute
from kinfer.engines.mlx.kernels import fused_decode_available, launch_for, paged_decode_attention
from kinfer.engines.mlx.split_decode import split_decode_attention, splits_for

log = logging.getLogger(__name__)

BLOCK = 64  # tokens per KV block
# continued prompt chunks of several rows share one attention call while rows x gathered positions
# stay under this (a transient copy of that many keys and values per layer); longer, a call per row
GATHER_LIMIT = 1 << 16
NEG = -1e30  # a finite "minus infinity": a fully masked block must still give finite maxima


class PagedLayer:
    """The K and V pools of one attention layer.

    Stored flat, [blocks * kv_heads * BLOCK, head_dim], so that writing new tokens is one scatter per
    pool; `blocks_view` shows the same memory as [blocks, kv_heads, BLOCK, head_dim]. Allocated at the
    first write, when the layer's head count, head size and dtype are known.
    """

    def __init__(self, window: int | None = None, *, fused_decode: bool = True) -> None:
        self.window = window  # sliding-window attention: only the last `window` positions are read
        self.fused_decode = fused_decode  # decode with the fused CUDA kernel where it is available
        self.precompiled = False  # that kernel compiled once and launched precompiled (kernels.py)
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.heads = 0
        self._blocks = 0

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    def arrays(self) -> list[mx.array]:
        return [] if self.keys is None else [self.keys, self.values]

    def blocks_view(self, pool: mx.array) -> mx.array:
        return pool.reshape(self._blocks, self.heads, BLOCK, pool.shape[-1])

    def resize(self, blocks: int) -> None:
        """Grow to `blocks` blocks (existing contents kept)."""
        if self.keys is not None and blocks > self._blocks:
            extra = (blocks - self._blocks) * self.heads * BLOCK
            self.keys = _grow(self.keys, extra)
            self.values = _grow(self.values, extra)
        self._blocks = blocks

    def write(self, keys: mx.array, values: mx.array, layout: PassLayout) -> None:
        """Store new K/V [B, kv_heads, L, dim] at the layout's token slots."""
        heads = keys.shape[1]
        if self.keys is None:
            self.heads = heads
            rows = self._blocks * heads * BLOCK
            self.keys = mx.zeros((rows, keys.shape[-1]), dtype=keys.dtype)
            self.values = mx.zeros((rows, values.shape[-1]), dtype=values.dtype)
        # pool row of each (batch, head, position); in the shape the keys scatter from with the fewest
        # reshapes in the graph (write_rows)
        rows = layout.write_rows(heads)
        if rows.ndim == 1:
            keys, values = keys.reshape(rows.size, -1), values.reshape(rows.size, -1)
        # the scatters update the pools in place (their old arrays have no other reference)
        self.keys[rows] = keys.astype(self.keys.dtype)
        self.values[rows] = values.astype(self.values.dtype)


def copy_blocks(layers: list[PagedLayer], pairs: list[tuple[int, int]]) -> None:
    """Copy block `src` to block `dst`, for each (src, dst) of `pairs`, in every layer's pools.

    The engine gathers the copies a step needs and makes them here at once, before the step's passes.
    The sources are gathered out and evaluated first: a slice of a pool assigned back into the same pool
    shares the pool's buffer, so MLX could not update the pool in place and would copy all of it, every
    layer's keys and values, per copy (2 s for a 2 GiB pool on a CPU; on the H200 it made a step that
    adopted prefixes take ~100 ms and the active memory balloon). That evaluation waits for the device:
    once per step that copies, not once per adopted prompt."""
    if not pairs:
        return
    blocks = np.array(pairs, dtype=np.int32)  # [n, 2]: (src, dst)
    rows: dict[int, tuple[mx.array, mx.array]] = {}  # pool rows of the sources and targets, per block size

    def pool_rows(size: int) -> tuple[mx.array, mx.array]:
        if size not in rows:
            flat = blocks[:, :, None] * size + np.arange(size, dtype=np.int32)  # [n, 2, size]
            rows[size] = (mx.array(flat[:, 0].reshape(-1)), mx.array(flat[:, 1].reshape(-1)))
        return rows[size]

    moves = []
    for layer in layers:
        if layer.keys is None:
            continue
        src, dst = pool_rows(layer.heads * BLOCK)
        moves.append((layer, dst, [mx.take(pool, src, axis=0) for pool in (layer.keys, layer.values)]))
    mx.eval([piece for _, _, pieces in moves for piece in pieces])
    for layer, dst, (keys, values) in moves:
        layer.keys[dst] = keys
        layer.values[dst] = values


def _grow(pool: mx.array, rows: int) -> mx.array:
    return mx.concatenate([pool, mx.zeros((rows, pool.shape[-1]), dtype=pool.dtype)], axis=0)


# ---- what one forward pass needs to know ----------------------------------------------------


@dataclass
class DecodeBlocks:
    """For one window size: every (row, block) pair a decode step reads, and the valid columns."""

    ids: mx.array  # [NB] block ids
    row: mx.array | None  # [NB] batch index of each block (None: one block per row, in order)
    mask: mx.array  # [NB, BLOCK] bool: the block's columns this row may attend to


class PassLayout:
    """Positions and block tables of one forward pass over some rows.

    A decode pass feeds one token per row; a prefill pass feeds `length` tokens per row. `table` holds
    each row's block ids ([B, W], covering every position written), `starts` the position of each
    row's first new token.
    """

    def __init__(self, table: np.ndarray, starts: np.ndarray, length: int, *, decode: bool) -> None:
        self.decode = decode
        self.length = length
        self.starts = np.asarray(starts, dtype=np.int64)
        self.batch = len(self.starts)
        pos = self.starts[:, None] + np.arange(length)[None, :]  # [B, L]
        self._table = table = np.asarray(table, dtype=np.int64)
        slots = table[np.arange(self.batch)[:, None], pos // BLOCK] * BLOCK + pos % BLOCK
        self._slots = slots.reshape(-1)
        self._write_rows: dict[int, mx.array] = {}
        self._kernel_inputs: dict[int | None, tuple[mx.array, mx.array]] = {}
        self._splits: dict[int | None, int] = {}
        self.min_splits = 1  # the warm-up runs the split decode path on short rows (warm_up.py)
        if self.batch == 1:
            # a plain int keeps models that do arithmetic on `cache.offset` working for one row
            self.offset: int | mx.array = int(self.starts[0])
        else:
            self.offset = mx.array(self.starts.astype(np.int32))
        self._decode_blocks: dict[int | None, DecodeBlocks] = {}
        self._offsets: mx.array | None = None
        # a prefill pass's attention inputs (block ids, masks, their padded forms) are the same for
        # every layer of the same window: built by the first layer, reused by the rest
        self.prefill_inputs: dict[tuple, mx.array] = {}

    @property
    def offsets(self) -> mx.array:
        """Each row's first new position as an int32 array [B], whatever the batch size (a compiled
        function taking the plain int of one row would be traced again at every position)."""
        if isinstance(self.offset, mx.array):
            return self.offset
        if self._offsets is None:
            self._offsets = mx.array(self.starts.astype(np.int32))
        return self._offsets

    def row_blocks(self, i: int, end: int) -> np.ndarray:
        """Block ids holding positions [0, end) of batch row i."""
        return self._table[i, : (end + BLOCK - 1) // BLOCK].astype(np.int32)

    def write_rows(self, heads: int) -> mx.array:
        """Pool rows ([blocks * heads * BLOCK, dim] storage) of each new (batch, head, position), in
        the order of the model's [B, heads, L, dim] keys: as a [B, heads, L] array, which the keys
        scatter from as they are, or flat for one row (MLX would squeeze and broadcast a
        leading 1, two primitives more than reshaping the keys)."""
        found = self._write_rows.get(heads)
        if found is None:
            slots = self._slots.reshape(self.batch, 1, self.length)
            block, offset = slots // BLOCK, slots % BLOCK
            rows = (block * heads + np.arange(heads)[None, :, None]) * BLOCK + offset
            rows = rows.reshape(-1) if self.batch == 1 else rows
            found = self._write_rows[heads] = mx.array(rows.astype(np.int32))
        return found

    def kernel_inputs(self, window: int | None) -> tuple[mx.array, mx.array]:
        """Block tables [B, W] and attended positions [B, 2] = (lo, hi) for the fused decode kernel."""
        found = self._kernel_inputs.get(window)
        if found is None:
            ends = self.starts + 1
            lows = np.maximum(ends - window, 0) if window else np.zeros_like(ends)
            width = int((ends.max() + BLOCK - 1) // BLOCK)
            tables = mx.array(self._table[:, :width].astype(np.int32))
            bounds = mx.array(np.stack([lows, ends], axis=1).astype(np.int32))
            found = self._kernel_inputs[window] = (tables, bounds)
        return found

    def decode_splits(self, window: int | None) -> int:
        """Blocks per (row, KV head) the fused decode kernel cuts each row's positions into
        (split_decode.py): from the longest row this pass attends over, at least `min_splits`."""
        found = self._splits.get(window)
        if found is None:  # once per pass and window, not once per layer
            ends = self.starts + 1
            longest = int((np.minimum(ends, window) if window else ends).max())
            found = self._splits[window] = splits_for(longest)
        return max(self.min_splits, found)

    def decode_blocks(self, window: int | None) -> DecodeBlocks:
        found = self._decode_blocks.get(window)
        if found is None:
            found = self._decode_blocks[window] = self._build_decode_blocks(window)
        return found

    def _build_decode_blocks(self, window: int | None) -> DecodeBlocks:
        ends = self.starts + 1  # tokens in the row once this step's token is written
        lows = np.maximum(ends - window, 0) if window else np.zeros_like(ends)
        first, last = lows // BLOCK, (ends - 1) // BLOCK
        counts = last - first + 1
        total = int(counts.sum())
        row = np.repeat(np.arange(self.batch), counts)
        index = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) + first[row]
        ids = self._table[row, index]
        begin = index * BLOCK
        cols = np.arange(BLOCK)[None, :] + begin[:, None]
        mask = (cols >= lows[row][:, None]) & (cols < ends[row][:, None])
        single = total == self.batch
        return DecodeBlocks(
            ids=mx.array(ids.astype(np.int32)),
            row=None if single else mx.array(row.astype(np.int32)),
            mask=mx.array(mask),
        )


# ---- the KVCache stand-in --------------------------------------------------------------------


class PagedKV:
    """One attention layer's cache for one forward pass, as mlx-lm's model code expects to see it."""

    def __init__(self, layer: PagedLayer, layout: PassLayout) -> None:
        self.layer = layer
        self.layout = layout
        self.offset = layout.offset

    # mlx-lm's cache interface, the parts attention layers use
    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.layer.write(keys, values, self.layout)
        return keys, values

    def make_mask(self, *args, **kwargs) -> None:
        return None  # attend() builds the per-row masks itself

    def is_trimmable(self) -> bool:
        return False

    def empty(self) -> bool:
        return self.layer.keys is None

    @property
    def nbytes(self) -> int:
        return self.layer.nbytes

    def attend(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        *,
        scale: float,
        sinks: mx.array | None = None,
    ) -> mx.array:
        if self.layout.decode:
            return self._attend_decode(queries, scale, sinks)
        return self._attend_prefill(queries, keys, values, scale, sinks)

    def _attend_decode(self, queries: mx.array, scale: float, sinks: mx.array | None) -> mx.array:
        layer = self.layer
        if (
            sinks is None
            and layer.fused_decode
            and fused_decode_available(queries.shape[-1], layer.values.shape[-1], layer.keys.dtype)
        ):
            tables, bounds = self.layout.kernel_inputs(layer.window)
            queries, keys, values = queries.astype(layer.keys.dtype), layer.keys, layer.values
            splits = self.layout.decode_splits(layer.window)
            if splits > 1:  # a long row: its positions split over several blocks (split_decode.py)
                inputs = (queries, keys, values, tables, bounds)
                return split_decode_attention(launch_for(*inputs, layer.heads, BLOCK, scale), inputs, splits)
            return paged_decode_attention(
                queries,
                keys,
                values,
                layer.heads,
                BLOCK,
                tables,
                bounds,
                scale,
                precompiled=layer.precompiled,
            )
        return self._attend_decode_ops(queries, scale, sinks)

    def _attend_decode_ops(self, queries: mx.array, scale: float, sinks: mx.array | None) -> mx.array:
        """The portable path: split-K over each row's blocks in plain MLX ops, then a per-row merge."""
        layer = self.layer
        batch, q_heads, _, _ = queries.shape
        kv_heads, dim_v = layer.heads, layer.values.shape[-1]
        group = q_heads // kv_heads
        blocks = self.layout.decode_blocks(layer.window)
        q = (queries * scale).reshape(batch, kv_heads, group, -1)
        if blocks.row is not None:
            q = q[blocks.row]
        k = layer.blocks_view(layer.keys)[blocks.ids]  # [NB, kv_heads, BLOCK, dim]
        v = layer.blocks_view(layer.values)[blocks.ids]
        scores = (q @ k.swapaxes(-1, -2)).astype(mx.float32)  # [NB, kv_heads, group, BLOCK]
        scores = mx.where(blocks.mask[:, None, None, :], scores, NEG)
        peak = scores.max(axis=-1, keepdims=True)
        weights = mx.exp(scores - peak)
        total = weights.sum(axis=-1, keepdims=True)
        partial = (weights.astype(v.dtype) @ v).astype(mx.float32)  # [NB, kv_heads, group, dim_v]
        if blocks.row is None and sinks is None:
            out = partial / total
        else:
            out = _merge_blocks(partial, peak, total, blocks.row, batch, sinks, kv_heads, group)
        return out.reshape(batch, q_heads, 1, dim_v).astype(queries.dtype)

    def _attend_prefill(
        self, queries: mx.array, keys: mx.array, values: mx.array, scale: float, sinks: mx.array | None
    ) -> mx.array:
        layout, layer = self.layout, self.layer
        length = layout.length
        window = layer.window
        if not layout.starts.any() and (window is None or window >= length):
            # fresh rows: the new keys are the whole context
            return _sdpa(queries, keys, values, scale, "causal", sinks)
        if long_context.takes_long_path(layout.batch, int(layout.starts[0] + length)):
            return self._attend_prefill_long(queries, scale, sinks)
        if layout.batch > 1 and layout.batch * int(layout.starts.max() + length) <= GATHER_LIMIT:
            return self._attend_prefill_batched(queries, scale, sinks)
        outputs = []
        built = layout.prefill_inputs
        for i in range(layout.batch):
            start = int(layout.starts[i])
            end = start + length
            blocks = built.get(("blocks", i))
            if blocks is None:
                blocks = built["blocks", i] = mx.array(layout.row_blocks(i, end))
            k = _contiguous_row(layer.blocks_view(layer.keys)[blocks], end)
            v = _contiguous_row(layer.blocks_view(layer.values)[blocks], end)
            key = ("row", i, window if window is not None and end > window else None)
            mask: str | mx.array = built.get(key, "causal")
            if key[2] is not None and key not in built:
                from mlx_lm.models.base import create_causal_mask

                mask = built[key] = create_causal_mask(length, start, window_size=window)
            outputs.append(_sdpa(queries[i : i + 1], k, v, scale, mask, sinks, built, key))
        return outputs[0] if len(outputs) == 1 else mx.concatenate(outputs, axis=0)

    def _attend_prefill_long(self, queries: mx.array, scale: float, sinks: mx.array | None) -> mx.array:
        """One row's chunk past SHORT_CONTEXT keys on CUDA: K/V in cuDNN's layout (long_context.py)."""
        layout, layer = self.layout, self.layer
        start, length = int(layout.starts[0]), layout.length
        built = layout.prefill_inputs
        end = start + length
        blocks = lambda: layout.row_blocks(0, end)  # noqa: E731 (the pass's first layer reads it)
        pools = layer.keys, layer.values
        keys, values = long_context.row_context(*pools, blocks, end, layer.heads, BLOCK, built)
        key = ("long", layer.window)
        mask = built.get(key)
        if mask is None:
            mask = built[key] = long_context.long_mask(start, length, layer.window)
        return _sdpa(queries, keys, values, scale, mask, sinks, built, key)

    def _attend_prefill_batched(self, queries: mx.array, scale: float, sinks: mx.array | None) -> mx.array:
        """Continued chunks of several rows in one attention call (a call per row costs the host a
        kernel launch per row and layer): each row's blocks gathered up to the longest end, a per-row
        causal mask (and window) over them."""
        layout, layer = self.layout, self.layer
        length = layout.length
        width = int((layout.starts.max() + length + BLOCK - 1) // BLOCK)
        built = layout.prefill_inputs
        table = built.get(("table",))
        if table is None:  # [B, W]; past a row's end: masked
            table = built["table",] = mx.array(layout._table[:, :width].astype(np.int32))

        def gather(pool: mx.array) -> mx.array:
            blocks = layer.blocks_view(pool)[table]  # [B, W, heads, BLOCK, dim]
            batch, _, heads, _, dim = blocks.shape
            return blocks.transpose(0, 2, 1, 3, 4).reshape(batch, heads, width * BLOCK, dim)

        key = ("batched", layer.window)
        mask = built.get(key)
        if mask is None:
            query_pos = layout.starts[:, None] + np.arange(length)[None, :]  # [B, L]
            key_pos = np.arange(width * BLOCK)[None, None, :]
            allowed = key_pos <= query_pos[:, :, None]
            if layer.window is not None:
                allowed &= key_pos > query_pos[:, :, None] - layer.window
            mask = built[key] = mx.array(allowed[:, None, :, :])  # [B, 1, L, K]
        return _sdpa(queries, gather(layer.keys), gather(layer.values), scale, mask, sinks, built, key)


def _contiguous_row(blocks: mx.array, end: int) -> mx.array:
    """[n, heads, BLOCK, dim] blocks of one row -> [1, heads, end, dim]."""
    n, heads, _, dim = blocks.shape
    return blocks.transpose(1, 0, 2, 3).reshape(1, heads, n * BLOCK, dim)[:, :, :end]


def _merge_blocks(partial, peak, total, row, batch, sinks, kv_heads, group) -> mx.array:
    """Per-row log-sum-exp merge of per-block partial attention results."""
    shape = (batch, kv_heads, group, 1)
    if row is None:
        top, w = peak, None
    else:
        top = mx.full(shape, NEG, dtype=mx.float32).at[row].maximum(peak)
    if sinks is not None:
        sink = sinks.astype(mx.float32).reshape(1, kv_heads, group, 1)
        top = mx.maximum(top, sink)
    if row is None:
        w = mx.exp(peak - top)
        num, den = partial * w, total * w
    else:
        w = mx.exp(peak - top[row])
        num = mx.zeros((batch, kv_heads, group, partial.shape[-1]), dtype=mx.float32).at[row].add(partial * w)
        den = mx.zeros(shape, dtype=mx.float32).at[row].add(total * w)
    if sinks is not None:
        den = den + mx.exp(sink - top)
    return num / den


def _sdpa(queries, keys, values, scale, mask, sinks, built=None, key=None):
    """`built` / `key`: where the pass keeps this mask's padded form for the next layers."""
    if shape_buckets.enabled():  # CUDA: a cuDNN graph per shape, so a few shapes (sdpa_buckets.py)
        return sdpa_buckets.bucketed_sdpa(queries, keys, values, scale, mask, sinks, built=built, key=key)
    if sinks is None:
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask, sinks=sinks)


# ---- routing mlx-lm's attention call to PagedKV ----------------------------------------------

_HOOKED = "_kinfer_paged_attention"


def install_attention_hook() -> int:
    """Make every loaded mlx-lm model module call `PagedKV.attend` for paged caches.

    Model modules import `scaled_dot_product_attention` from `mlx_lm.models.base` by name, so each
    module's global (and base's own, for modules imported later) is replaced by a wrapper that defers
    to the original for any other cache: code that does not use kinfer's caches (mlx-lm's own
    generate, for instance) behaves exactly as before. Idempotent; returns the modules now hooked.
    """
    from mlx_lm.models import base

    current = base.scaled_dot_product_attention
    if getattr(current, _HOOKED, False):
        original, wrapper = current.__wrapped__, current
    else:
        original = current

        def wrapper(queries, keys, values, cache, scale, mask, sinks=None):
            if isinstance(cache, PagedKV):
                return cache.attend(queries, keys, values, scale=scale, sinks=sinks)
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(wrapper, _HOOKED, True)
        base.scaled_dot_product_attention = wrapper
    return reroute("scaled_dot_product_attention", original, wrapper)
