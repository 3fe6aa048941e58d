"""The model's per-layer caches as one pass sees them: the arrays it writes (evaluated with the pass)
and the views it reads and writes them through (kv.PagedKV for attention, state.StateView for
recurrent layers)."""

from __future__ import annotations

import mlx.core as mx

from kinfer.engines.mlx.kv import PagedKV, PagedLayer, PassLayout
from kinfer.engines.mlx.state import StateSlots, StateView, padding_mask


def cache_arrays(layers: list[PagedLayer | StateSlots]) -> list[mx.array]:
    """The KV pools and recurrent state every pass writes."""
    return [
        a for layer in layers for a in (layer.arrays() if isinstance(layer, PagedLayer) else layer.live())
    ]


def pass_views(
    layers: list[PagedLayer | StateSlots], layout: PassLayout, rows: mx.array | None, lengths: mx.array | None
) -> list:
    """One view per layer for a pass over `layout`; `rows`: the recurrent slots of the pass's rows (None:
    every slot in order); `lengths`: each row's real positions of a right-padded pass."""
    mask = None if lengths is None else padding_mask(lengths, layout.length)  # once a pass, not a layer
    return [
        PagedKV(layer, layout) if isinstance(layer, PagedLayer) else StateView(layer, rows, lengths, mask)
        for layer in layers
    ]
