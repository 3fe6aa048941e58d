"""`load_engine` turns `Settings` into engine constructor arguments: every engine knob and diagnostic
switch is reachable from a flag or `KINFER_*` variable, and engines read no environment of their own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from kinfer.config import Settings
from kinfer.engines.loader import load_engine


@dataclass(frozen=True)
class Model:
    name: str
    format: str
    path: Path


def test_llama_engine_settings_reach_the_engine(smollm2_gguf: Path):
    small = Settings(parallel=2, ctx=512, threads=1)
    with load_engine(Model("smollm2", "gguf", smollm2_gguf), small) as engine:
        assert engine.plan.n_batch == 2048  # the default step budget
        assert engine._pool is not None and not engine._pool.exact_only  # SmolLM2 is not recurrent
    tuned = Settings(
        parallel=2, ctx=512, threads=1, step_tokens=64, exact_prefix=True, gpu_layers=0, flash_attn=True
    )
    with load_engine(Model("smollm2", "gguf", smollm2_gguf), tuned) as engine:
        assert engine.plan.n_batch == 64
        assert engine._pool is not None and engine._pool.exact_only
        assert engine.flash_attention


def test_mlx_engine_settings_reach_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from kinfer.engines.mlx.fuse import FusedPart
    from tests.fixtures.tiny_mlx import build_tiny_model

    path = build_tiny_model(tmp_path / "qwen3", "qwen3")
    model = Model("tiny", "mlx", path)

    def fused_parts(engine) -> int:
        return sum(isinstance(m, FusedPart) for _, m in engine._model.named_modules())

    # engines read no environment: KINFER_* variables count only through load_settings
    monkeypatch.setenv("KINFER_MLX_FUSED_DECODE", "0")
    monkeypatch.setenv("KINFER_MLX_FUSE_PROJECTIONS", "1")
    engine = load_engine(model, Settings(parallel=2, ctx=256))
    try:
        assert engine.plan.prefill_chunk == 128  # automatic, on this CPU
        assert fused_parts(engine) == 0  # auto: projections are fused on a GPU only
        assert all(layer.fused_decode for layer in engine._paged)
        assert not any(layer.precompiled for layer in engine._paged)  # the JIT kernel call by default
        assert engine._decoder is not None  # the compiled decode pass (compiled_step.py) by default
    finally:
        engine.close()

    forced = Settings(
        parallel=2,
        ctx=256,
        prefill_chunk=16,
        mlx_self_check=False,
        mlx_fused_decode=False,
        mlx_gated_delta=False,
        mlx_fuse_projections=True,
        mlx_precompiled_kernels=True,
        mlx_compiled_step=False,
    )
    engine = load_engine(model, forced)
    try:
        assert engine.plan.prefill_chunk == 16
        assert fused_parts(engine) > 0
        assert not any(layer.fused_decode for layer in engine._paged)
        assert engine._gated_delta is False
        assert all(layer.precompiled for layer in engine._paged) and engine._precompiled is True
        assert engine._decoder is None
    finally:
        engine.close()


def test_a_requests_num_ctx_may_raise_the_served_context_but_never_shrink_it(smollm2_gguf: Path):
    model = Model("smollm2", "gguf", smollm2_gguf)

    def served(settings: Settings, num_ctx: int | None) -> int:
        with load_engine(model, settings, ctx=num_ctx) as engine:
            return engine.info.context_length

    explicit = Settings(parallel=1, ctx=1024, threads=1, prefix_cache="off")
    assert [served(explicit, n) for n in (None, 1, 2048)] == [1024, 1024, 2048]
    automatic = Settings(parallel=1, threads=1, prefix_cache="off")
    size = served(automatic, None)
    assert [served(automatic, n) for n in (1, size + 1024)] == [size, size + 1024]


def test_on_mlx_too_a_requests_num_ctx_never_shrinks_the_served_context(tmp_path: Path):
    from tests.fixtures.tiny_mlx import build_tiny_model

    model = Model("tiny", "mlx", build_tiny_model(tmp_path / "qwen3", "qwen3"))

    def served(settings: Settings, num_ctx: int | None) -> int:
        engine = load_engine(model, settings, ctx=num_ctx)
        try:
            return engine.info.context_length
        finally:
            engine.close()

    explicit = Settings(parallel=1, ctx=256, mlx_self_check=False)
    assert [served(explicit, n) for n in (1, 512)] == [256, 512]
    automatic = Settings(parallel=1, mlx_self_check=False)
    size = served(automatic, None)
    assert served(automatic, 1) == size
