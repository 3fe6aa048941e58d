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
    layers: list[PagedLayer | StateSlots], layout: PassLayout, rows: np.ndarray, lengths: mx.array | None
) -> list:
    """One view per layer for a pass over `layout`; `rows`: the slot of each of the pass's entries;
    `lengths`: each row's real positions of a right-padded pass."""
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
    return views
