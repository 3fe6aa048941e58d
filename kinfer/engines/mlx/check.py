"""A load-time check that a model gives the same logits on kinfer's batched caches as on mlx-lm's own.

Six tokens go through mlx-lm's plain forward pass, and through the engine's caches as two prefill
chunks plus a decode step batched with a second, fresh row. The logits must agree to rounding: a model
whose attention bypasses mlx-lm's `scaled_dot_product_attention`, or that does offset arithmetic that
per-row positions break, fails here at load rather than producing wrong text later.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import numpy as np

from kinfer.engines.mlx.kv import PassLayout
from kinfer.engines.mlx.state import StateSlots, reset_row
from kinfer.errors import EngineFailure

log = logging.getLogger(__name__)

CHECK_TOKENS = 6
TOLERANCE = {mx.float32: 1e-3}
DEFAULT_TOLERANCE = 0.1  # half-precision models: relative to the largest logit


def check_engine_layers(engine) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    model = engine._model
    vocab = engine._batch.vocab
    tokens = [(7 * i + 3) % vocab for i in range(CHECK_TOKENS)]
    reference = model(mx.array([tokens]), cache=make_prompt_cache(model))[0].astype(mx.float32)
    mx.eval(reference)  # on its own: a sharded model's ranks must run their collectives in one order

    slots = [0, 1] if engine.plan.rows > 1 else [0]
    blocks = {slot: engine._take_blocks(1) for slot in slots}
    recurrent = [layer for layer in engine._layers if isinstance(layer, StateSlots)]
    try:
        for slot in slots:
            engine._batch.set_table(slot, blocks[slot])
        table = engine._batch.table(np.array(slots))
        one = np.array([0])
        for start, end in ((0, 3), (3, CHECK_TOKENS - 1)):
            layout = PassLayout(table[:1], np.array([start]), end - start, decode=False)
            engine.forward(mx.array([tokens[start:end]]), engine._views(layout, one))
        starts = np.array([CHECK_TOKENS - 1, 0][: len(slots)])
        layout = PassLayout(table, starts, 1, decode=True)
        inputs = mx.array([tokens[-1], tokens[0]][: len(slots)])
        rows = np.array(slots)
        logits = engine.forward(inputs[:, None], engine._views(layout, rows))[:, -1, :].astype(mx.float32)
        expected = mx.stack([reference[-1], reference[0]][: len(slots)])
        diff = mx.abs(logits - expected).max().item()
        scale = mx.abs(expected).max().item()
    finally:
        for slot in slots:
            engine._alloc.release(blocks[slot])
            engine._batch.clear_table(slot)
            reset_row(recurrent, slot)
    tolerance = TOLERANCE.get(_weight_dtype(model), DEFAULT_TOLERANCE)
    if not diff <= tolerance * (1.0 + scale):
        raise EngineFailure(
            f"{engine.info.architecture}: logits on kinfer's batched caches differ from mlx-lm's "
            f"(max difference {diff:.4g} for logits up to {scale:.4g}); this architecture is not supported"
        )


def _weight_dtype(model) -> mx.Dtype:
    from mlx.utils import tree_flatten

    for _, value in tree_flatten(model.parameters()):
        if mx.issubdtype(value.dtype, mx.floating):
            return value.dtype
    return mx.float32


def self_check_engine(engine) -> None:
    """Run a few tokens through kinfer's caches and through mlx-lm's own, and compare the logits.

    An architecture whose attention does not go through mlx-lm's `scaled_dot_product_attention`,
    or that does arithmetic on cache offsets that batching breaks, fails here, at load, instead of
    producing wrong text later. Compiled prompt chunks (CUDA) that fail it go back to the module code
    first, keeping the compiled decode step; a compiled decode step (compiled_step.py,
    compiled_layers.py) that fails it gives way to mlx-lm's module code, which must then pass alone."""
    from kinfer.engines.mlx import compiled_layers

    try:
        _self_check(engine)
        return
    except EngineFailure as exc:
        failure = exc
    if _chunks_off(engine):
        log.warning("compiled prompt chunks off for %s: %s", engine.info.architecture, failure)
        try:
            _self_check(engine)
            return
        except EngineFailure as exc:
            failure = exc
    if engine._decoder is None and not compiled_layers.uninstall(engine._model):
        raise failure
    log.warning("compiled decode step off for %s: %s", engine.info.architecture, failure)
    engine._decoder = None
    _self_check(engine)


def _chunks_off(engine) -> bool:
    """Prompt chunks back to the module code; whether any were compiled (CUDA's buckets)."""
    from kinfer.engines.mlx import shape_buckets

    return shape_buckets.enabled() and set_compiled_chunks(engine, False)  # without buckets none ran


def set_compiled_chunks(engine, on: bool) -> bool:
    """One row's prompt chunks through the compiled pass or layers (`on`) or the module code, the
    compiled decode step untouched (compiled_step.py, compiled_layers.py); whether any were on."""
    from kinfer.engines.mlx import compiled_layers

    decoder = engine._decoder
    were = decoder is not None and decoder.chunks
    if decoder is not None:
        decoder.chunks = on
    return compiled_layers.set_chunks(engine._model, on) or were


def _self_check(engine) -> None:
    try:
        check_engine_layers(engine)
    except EngineFailure:
        raise
    except Exception as exc:
        arch = engine.info.architecture
        raise EngineFailure(
            f"{arch}: this architecture does not run on kinfer's batched MLX caches ({exc})"
        ) from exc
