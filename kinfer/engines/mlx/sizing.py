"""How big the MLX engine makes itself: rows, context per row, KV blocks; and which cache each layer gets."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from kinfer.engines.mlx.kv import BLOCK, PagedLayer
from kinfer.engines.mlx.state import StateSlots
from kinfer.errors import EngineFailure, InvalidRequest

log = logging.getLogger(__name__)

AUTO_ROWS = {"gpu": 16, "cpu": 4}
AUTO_CTX = {"gpu": 32768, "cpu": 4096}
PREFILL_CHUNK = {"gpu": 2048, "cpu": 128}
KV_MEMORY_SHARE = 0.4  # of the memory available at load, at most, for the rows' KV at full length
MIN_AUTO_CTX = 512
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class SizePlan:
    rows: int
    ctx: int
    prefill_chunk: int
    pool_entries: int
    initial_blocks: int
    max_blocks: int


def plan_layers(model, model_type: str) -> list[PagedLayer | StateSlots]:
    """kinfer's cache for each layer, from the caches mlx-lm would make for the model."""
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    caches = model.make_cache() if hasattr(model, "make_cache") else [KVCache() for _ in model.layers]
    layers: list[PagedLayer | StateSlots] = []
    for cache in caches:
        kind = type(cache)
        if kind is KVCache:
            layers.append(PagedLayer())
        elif kind is RotatingKVCache and cache.keep == 0:
            layers.append(PagedLayer(window=cache.max_size))
        elif kind is ArraysCache:
            layers.append(StateSlots(rows=1, size=len(cache.cache)))
        else:
            raise EngineFailure(
                f"{model_type}: its {kind.__name__} layers are not supported by kinfer's MLX engine"
            )
    return layers


def _kv_bytes_per_token(config: dict[str, Any], attention_layers: int) -> int:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    heads = text.get("num_attention_heads") or 1
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (text.get("hidden_size", 0) // heads)
    dtype = config.get("torch_dtype") or text.get("torch_dtype") or "bfloat16"
    return attention_layers * 2 * kv_heads * head_dim * _DTYPE_BYTES.get(str(dtype), 2)


def _available_memory(gpu: bool) -> int:
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    total = int(info.get("memory_size", 0) or 0) if gpu else 0
    if total:
        return max(total - mx.get_active_memory(), 0)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil is a dependency
        return 8 << 30


def plan_size(
    *,
    rows: int,
    ctx: int,
    gpu: bool,
    train_context: int,
    config: dict[str, Any],
    attention_layers: int,
    prefix_cache: bool,
    prefill_chunk: int,
    min_ctx: int = 0,
) -> SizePlan:
    """Rows and context per row (0: automatic). min_ctx: a request's larger context (Ollama's num_ctx)
    raises an automatic one, taken then as given; it never shrinks it."""
    kind = "gpu" if gpu else "cpu"
    auto_rows, auto_ctx = rows <= 0, ctx <= 0
    rows = rows if rows > 0 else AUTO_ROWS[kind]
    if ctx > 0 and train_context and ctx > train_context:
        log.warning("context %d is beyond what the model was trained for; using %d", ctx, train_context)
        ctx = train_context
    ctx = ctx if ctx > 0 else min(train_context, AUTO_CTX[kind])
    if min_ctx > ctx:
        ctx, auto_ctx = min(min_ctx, train_context or min_ctx), False
    per_token = _kv_bytes_per_token(config, attention_layers)
    available = _available_memory(gpu)
    budget = int(available * KV_MEMORY_SHARE)
    if per_token and rows * ctx * per_token > available:
        # KV blocks are allocated as rows grow: refuse now rather than run out of memory mid-reply
        raise InvalidRequest(
            f"a KV cache of {rows} rows x {ctx} tokens needs {rows * ctx * per_token / 2**30:.1f} GiB but "
            f"{available / 2**30:.1f} GiB is free; ask for a smaller context "
            "(num_ctx / --ctx) or fewer rows"
        )
    if per_token and (auto_ctx or auto_rows):
        while rows * ctx * per_token > budget:
            if auto_ctx and ctx > MIN_AUTO_CTX:
                ctx = max(MIN_AUTO_CTX, ctx // 2)
            elif auto_rows and rows > 1:
                rows //= 2
            else:
                break
    row_blocks = (ctx + BLOCK - 1) // BLOCK
    max_blocks = rows * row_blocks
    if prefix_cache:
        max_blocks += max(row_blocks, max_blocks // 4)  # room for saved prompts beyond the rows
    initial = min(max_blocks, rows * min(row_blocks, 8))
    chunk = prefill_chunk if prefill_chunk > 0 else PREFILL_CHUNK[kind]
    log.debug("MLX sizing: %d rows x %d ctx, %d B KV/token, budget %d B", rows, ctx, per_token, budget)
    return SizePlan(
        rows=rows,
        ctx=ctx,
        prefill_chunk=chunk,
        pool_entries=max(8, 2 * rows),
        initial_blocks=initial,
        max_blocks=max_blocks,
    )
