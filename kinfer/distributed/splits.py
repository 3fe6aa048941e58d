"""Which architectures mlx-lm can split across ranks (tensor parallel: a `shard(group)` method on the
model class). Read from the installed mlx-lm, so a newer one that shards more architectures is used as
it is; docs/distributed.md lists those of the version kinfer was tested with."""

from __future__ import annotations

import importlib


def tensor_parallel(model_type: str | None) -> bool | None:
    """True / False: whether mlx-lm's model for `model_type` has `shard`; None: cannot tell (no mlx-lm,
    or no such model module)."""
    if not model_type:
        return None
    try:
        module = importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError:
        return None
    model = getattr(module, "Model", None)
    return None if model is None else hasattr(model, "shard")
