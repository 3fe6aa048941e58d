"""Rerouting a function that mlx-lm's model modules imported by name.

mlx-lm's model modules do `from .base import scaled_dot_product_attention` (or `gated_delta_update`), so
replacing the function where it is defined is not enough: each loaded module holds its own reference.
"""

from __future__ import annotations

import sys


def reroute(attribute: str, original, wrapper) -> int:
    """Point every loaded `mlx_lm.models.*` module's `attribute` that is `original` at `wrapper`.
    Returns how many modules now use the wrapper."""
    hooked = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("mlx_lm.models.") or module is None:
            continue
        if module.__dict__.get(attribute) is original:
            setattr(module, attribute, wrapper)
        if module.__dict__.get(attribute) is wrapper:
            hooked += 1
    return hooked
