"""How big the MLX engine makes itself: rows, context per row, KV blocks; and which cache each layer gets."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from kinfer.engines.mlx import long_context, shape_buckets
from kinfer.engines.mlx.attention_ops import SHORT_CONTEXT
from kinfer.engines.mlx.kv import BLOCK, PagedLayer
from kinfer.engines.mlx.memory import gpu_memory
from kinfer.engines.mlx.prefix import STATE_BYTES
from kinfer.engines.mlx.sdpa_buckets import LONG_CONTEXT_QUERIES
from kinfer.engines.mlx.state import StateLedger, StateSlots
from kinfer.errors import EngineFailure, InvalidRequest
from kinfer.store.model_shape import shape_from_config

log = logging.getLogger(__name__)

AUTO_ROWS = {"gpu": 16, "cpu": 4}
AUTO_CTX = {"gpu": 32768, "cpu": 4096}
PREFILL_CHUNK = {"gpu": 2048, "cpu": 128}
KV_MEMORY_SHARE = 0.4  # of the memory available at load, at most, for the rows' KV at full length
MIN_AUTO_CTX = 512
CACHE_SHARE = 0.1  # of the memory budget, at most, for MLX's cache of freed buffers
# a row's recurrent state lies in its last pass's output while the pass running and the one being built
# write their new ones (state.py: no update in place): up to three copies of it at once
STATE_COPIES = 3
POOL_STATE_SHARE = 0.2  # of what the budget leaves for rows, at most, for the pool's state snapshots
SCRATCH_FLOATS_PER_TOKEN = 16  # activations kept per prompt token in a step, in hidden-size floats
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class SizePlan:
    rows: int
    ctx: int
    prefill_chunk: int
    pool_entries: int
    initial_blocks: int
    max_blocks: int
    cache_limit: int = 4 << 30  # bytes of MLX's buffer cache (mx.set_cache_limit)
    pool_state_bytes: int = STATE_BYTES  # recurrent-state snapshots the prefix pool keeps at most
    scratch_bytes: int = 0  # what the budget keeps for one step's activations and logits


def plan_layers(model, model_type: str) -> list[PagedLayer | StateSlots]:
    """kinfer's cache for each layer, from the caches mlx-lm would make for the model."""
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    caches = model.make_cache() if hasattr(model, "make_cache") else [KVCache() for _ in model.layers]
    layers: list[PagedLayer | StateSlots] = []
    ledger = StateLedger()  # where each row's recurrent state lies, one record for all the layers
    for cache in caches:
        kind = type(cache)
        if kind is KVCache:
            layers.append(PagedLayer())
        elif kind is RotatingKVCache and cache.keep == 0:
            layers.append(PagedLayer(window=cache.max_size))
        elif kind is ArraysCache:
            layers.append(StateSlots(ledger, size=len(cache.cache)))
        else:
            raise EngineFailure(
                f"{model_type}: its {kind.__name__} layers are not supported by kinfer's MLX engine"
            )
    return layers


def _text(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's section of a config (a multimodal one's `text_config`), else the config."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def query_heads(config: dict[str, Any]) -> int:
    """The attention layers' query heads (a multimodal config's text model's)."""
    return int(_text(config).get("num_attention_heads") or 1)


def _kv_bytes_per_token(config: dict[str, Any], attention_layers: int) -> int:
    text = _text(config)
    heads = query_heads(config)
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (text.get("hidden_size", 0) // heads)
    dtype = config.get("torch_dtype") or text.get("torch_dtype") or "bfloat16"
    return attention_layers * 2 * kv_heads * head_dim * _DTYPE_BYTES.get(str(dtype), 2)


def _available_memory(gpu: bool) -> int:
    total, free = gpu_memory() if gpu else (0, None)
    if free is not None:  # CUDA: what the device has left, whoever holds the rest
        return free
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
    budget: int = 0,
    weights: int = 0,
    cache_limit: int = 4 << 30,
    available: int | None = None,
) -> SizePlan:
    """Rows and context per row (0: automatic). min_ctx: a request's larger context (Ollama's num_ctx)
    raises an automatic one, taken then as given; it never shrinks it.

    budget (bytes, 0: none): weights, a step's scratch, MLX's cache, the rows' KV and recurrent state
    and the pool's state snapshots must fit in it together. The cache limit and the pool's state cap
    take their shares first; then rows (even explicit ones, with a warning) and an automatic context
    shrink until the rows fit. An explicit context that cannot fit one row is refused."""
    kind = "gpu" if gpu else "cpu"
    auto_rows, auto_ctx = rows <= 0, ctx <= 0
    rows = rows if rows > 0 else AUTO_ROWS[kind]
    if ctx > 0 and train_context and ctx > train_context:
        log.warning("context %d is beyond what the model was trained for; using %d", ctx, train_context)
        ctx = train_context
    ctx = ctx if ctx > 0 else min(train_context, AUTO_CTX[kind])
    if min_ctx > ctx:
        ctx, auto_ctx = min(min_ctx, train_context or min_ctx), False
    chunk = prefill_chunk if prefill_chunk > 0 else PREFILL_CHUNK[kind]
    per_token = _kv_bytes_per_token(config, attention_layers)
    shape = shape_from_config(config)
    per_row_state = shape.state_bytes_per_row if shape else 0
    if available is None:
        available = _available_memory(gpu)
    share = int(available * KV_MEMORY_SHARE)
    if per_token and rows * ctx * per_token > available:
        # KV blocks are allocated as rows grow: refuse now rather than run out of memory mid-reply
        raise InvalidRequest(
            f"a KV cache of {rows} rows x {ctx} tokens needs {rows * ctx * per_token / 2**30:.1f} GiB but "
            f"{available / 2**30:.1f} GiB is free; ask for a smaller context "
            "(num_ctx / --ctx) or fewer rows"
        )
    pool_state = STATE_BYTES
    scratch = _scratch_bytes(config, chunk, rows) + _long_scores_bytes(config, ctx, chunk, rows)
    room = None  # bytes the budget leaves for the rows' KV and state (None: no budget)
    if budget > 0:
        cache_limit = min(cache_limit, int(budget * CACHE_SHARE))
        left = budget - weights - cache_limit - scratch
        if prefix_cache and per_row_state:
            pool_state = max(0, min(pool_state, int(left * POOL_STATE_SHARE)))
            left -= pool_state
        if left <= 0:
            raise InvalidRequest(
                f"the memory budget ({budget / 2**30:.2f} GiB) does not hold the model's weights "
                f"({weights / 2**30:.2f} GiB) and a step's scratch; raise --memory-budget"
            )
        room = left

    def rows_bytes(r: int, c: int) -> int:
        return _blocks(r, c, prefix_cache) * BLOCK * per_token + r * per_row_state * STATE_COPIES

    if per_token and (auto_ctx or auto_rows):
        while rows * ctx * per_token > share:
            if auto_ctx and ctx > MIN_AUTO_CTX:
                ctx = max(MIN_AUTO_CTX, ctx // 2)
            elif auto_rows and rows > 1:
                rows //= 2
            else:
                break
    if room is not None:
        planned = rows
        while rows_bytes(rows, ctx) > room:
            if auto_ctx and ctx > MIN_AUTO_CTX:
                ctx = max(MIN_AUTO_CTX, ctx // 2)
            elif rows > 1:
                rows -= 1
            else:
                raise InvalidRequest(
                    f"one row of {ctx} tokens needs {rows_bytes(1, ctx) / 2**30:.2f} GiB but the memory "
                    f"budget leaves {room / 2**30:.2f} GiB beside the weights; ask for a smaller context "
                    "(num_ctx / --ctx) or raise --memory-budget"
                )
        if rows < planned and not auto_rows:
            log.warning("the memory budget holds %d rows of %d tokens, not %d", rows, ctx, planned)
    row_blocks = (ctx + BLOCK - 1) // BLOCK
    max_blocks = _blocks(rows, ctx, prefix_cache)
    initial = min(max_blocks, rows * min(row_blocks, 8))
    log.debug("MLX sizing: %d rows x %d ctx, %d B KV/token, budget %d B", rows, ctx, per_token, budget)
    return SizePlan(
        rows=rows,
        ctx=ctx,
        prefill_chunk=chunk,
        pool_entries=max(8, 2 * rows),
        initial_blocks=initial,
        max_blocks=max_blocks,
        cache_limit=cache_limit,
        pool_state_bytes=pool_state,
        scratch_bytes=scratch,
    )


def _blocks(rows: int, ctx: int, prefix_cache: bool) -> int:
    """KV blocks the rows may hold at full length, plus room for saved prompts beyond them."""
    row_blocks = (ctx + BLOCK - 1) // BLOCK
    blocks = rows * row_blocks
    return blocks + max(row_blocks, blocks // 4) if prefix_cache else blocks


def _long_scores_bytes(config: dict[str, Any], ctx: int, chunk: int, rows: int) -> int:
    """On CUDA, a pass past SHORT_CONTEXT keys written as MLX's composition (long_context.py): its scores
    and their softmax, at most OPS_SCORES_MAX each (a larger pass is cuDNN's, which writes none)."""
    keys = shape_buckets.bucket(ctx)
    if not shape_buckets.enabled() or keys <= SHORT_CONTEXT:
        return 0
    largest = long_context.scores_bytes(rows, query_heads(config), max(chunk, LONG_CONTEXT_QUERIES), keys)
    return 2 * min(largest, long_context.OPS_SCORES_MAX)


def _scratch_bytes(config: dict[str, Any], chunk: int, rows: int) -> int:
    """A rough bound on one step's activations: a prompt chunk's hidden states through a layer's
    temporaries, and every row's float32 logits."""
    text = _text(config)
    hidden = int(text.get("hidden_size") or 0)
    vocab = int(text.get("vocab_size") or config.get("vocab_size") or 0)
    return 4 * ((chunk + rows) * SCRATCH_FLOATS_PER_TOKEN * hidden + rows * vocab)
