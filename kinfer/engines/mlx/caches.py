"""The model's per-layer caches as one pass sees them: the arrays it writes (evaluated with the pass)
and the views it reads and writes them through (kv.PagedKV for attention, state.StateView for
recurrent layers)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kinfer.engines.mlx.kv import PagedKV, PagedLayer, PassLayout
from kinfer.engines.mlx.state import StateSlots, StateView, padding_mask


def cache_arrays(layers: list[PagedLayer | StateSlots]) -> list[mx.array]:
    """The KV pools and recurrent state every pass writes."""
    return [
        a for layer in layers for a in (layer.arrays() if isinstance(layer, PagedLayer) else layer.live())
    ]


def pass_views(
    layers: list[PagedLayer | StateSlots],
    layout: PassLayout,
    rows: np.ndarray,
    lengths: mx.array | None,
    *,
    read_apart: bool = False,
) -> list:
    """One view per layer for a pass over `layout`; `rows`: the slot of each of the pass's entries;
    `lengths`: each row's real positions of a right-padded pass.

    `read_apart` (CUDA): where the pass's rows do not read the last pass's state as it is (a batch
    that changed: gathers from one or more outputs, zeros for fresh rows), those reads are launched
    now, apart, so the pass itself is the same graph as the steady step's. MLX's CUDA backend builds
    a CUDA graph for each new topology (~2 ms each, several a pass): read inside the pass, every new
    way a batch changed (a row joining from its own prompt's output: a gather over two) made a
    decode pass no warm-up had run; on the H200 a 50,000-token prompt's row joining 16 decoding rows
    took a 34 ms step against ~6 ms (docs/benchmarks.md, "H200, third session of 2026-12-05")."""
    recurrent = [layer for layer in layers if isinstance(layer, StateSlots)]
    if not recurrent:
        return [PagedKV(layer, layout) for layer in layers]
    read, sources = recurrent[0].ledger.begin(rows)  # once a pass: every recurrent layer reads alike
    mask = None if lengths is None else padding_mask(lengths, layout.length)
    views, ordinal = [], 0
    for layer in layers:
        if isinstance(layer, PagedLayer):
            views.append(PagedKV(layer, layout))
            continue
        views.append(StateView(layer, read, sources[ordinal], lengths, mask))
        ordinal += 1
    if read_apart and (read.index is not None or read.fresh):
        state = [view.cache for view in views if isinstance(view, StateView)]
        mx.async_eval([a for arrays in state for a in arrays if a is not None])
    return views
