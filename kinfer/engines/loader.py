"""Build the right engine for a stored model. Engine modules are imported here lazily.

This is where `Settings` turn into the engines' constructor arguments: engines get plain values and
never read the environment themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from kinfer.config import Settings
from kinfer.engines.base import Engine


class LoadableModel(Protocol):
    name: str
    format: str  # "gguf" | "mlx"
    path: Path


def served_context(configured: int, requested: int | None) -> tuple[int, int]:
    """(ctx, min_ctx) for an engine: a request's context (Ollama's num_ctx, given by the request that
    loads the model) may raise the server's --ctx, never lower it, since every later request shares the
    rows. With --ctx automatic (0) it raises the automatic size only (min_ctx)."""
    if configured > 0:
        return max(configured, requested or 0), 0
    return 0, requested or 0


def load_engine(model: LoadableModel, settings: Settings, *, ctx: int | None = None) -> Engine:
    """Load `model` on the calling thread (engines are thread-bound); `ctx`: the loading request's
    num_ctx, if any (see `served_context`)."""
    row_ctx, min_ctx = served_context(settings.ctx, ctx)
    if model.format == "gguf":
        from kinfer.engines.llama.embed import LlamaEmbeddingEngine, gguf_pooling
        from kinfer.engines.llama.engine import LlamaEngine

        pooling = gguf_pooling(model.path)
        if pooling is not None:  # an embedding model (as Ollama decides): no chat context
            return LlamaEmbeddingEngine(
                model.path,
                name=model.name,
                pooling=pooling,
                ctx=row_ctx,
                threads=settings.threads,
                gpu_layers=settings.gpu_layers,
                contexts=settings.embed_contexts,
            )

        return LlamaEngine(
            model.path,
            name=model.name,
            rows=settings.parallel,
            ctx=row_ctx,
            min_ctx=min_ctx,
            threads=settings.threads,
            prefix_cache=settings.prefix_cache_enabled,
            gpu_layers=settings.gpu_layers,
            step_tokens=settings.step_tokens,
            step_budget_ms=settings.step_budget_ms,
            memory_budget_gb=settings.memory_budget_gb,
            # off: the engine decides (exact reuse for recurrent and hybrid models only)
            exact_prefix=True if settings.exact_prefix else None,
            flash_attn=settings.flash_attn,
        )
    if model.format == "mlx":
        from kinfer.engines.mlx.cuda_graphs import keep_graphs
        from kinfer.engines.mlx.embed import MlxEmbeddingEngine, is_embedding_directory
        from kinfer.engines.mlx.engine import MlxEngine
        from kinfer.engines.mlx.ptx_cache import keep_kernels_on_cuda

        keep_graphs()  # room for every graph the warm-up builds (cuda_graphs.py)
        keep_kernels_on_cuda(settings.home)  # the kernels MLX compiles outlive a reboot

        if is_embedding_directory(model.path):
            return MlxEmbeddingEngine(model.path, name=model.name, ctx=row_ctx)

        return MlxEngine(model.path, name=model.name, **mlx_engine_kwargs(settings, ctx))
    raise ValueError(f"no engine serves models of format {model.format!r}")


def mlx_engine_kwargs(settings: Settings, ctx: int | None) -> dict:
    """`MlxEngine`'s arguments from the settings (a distributed rank 0 sends them to the other ranks)."""
    row_ctx, min_ctx = served_context(settings.ctx, ctx)
    return {
        "rows": settings.parallel,
        "ctx": row_ctx,
        "min_ctx": min_ctx,
        "prefix_cache": settings.prefix_cache_enabled,
        "cache_limit_gb": settings.mlx_cache_limit_gb,
        "prefill_chunk": settings.prefill_chunk,
        "step_budget_ms": settings.step_budget_ms,
        "memory_budget_gb": settings.memory_budget_gb,
        "self_check": settings.mlx_self_check,
        "fused_decode": settings.mlx_fused_decode,
        "gated_delta": settings.mlx_gated_delta,
        "precompiled_kernels": settings.mlx_precompiled_kernels,
        "compiled_step": settings.mlx_compiled_step,
        "layer_split": settings.mlx_layer_split,
        "fuse_projections": settings.mlx_fuse_projections,
        "warm_up": settings.mlx_warm_up,
    }
