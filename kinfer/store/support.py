"""Which architectures each engine serves, decided without importing either engine.

MLX: mlx-lm serves a `model_type` when `mlx_lm/models/<type>.py` exists (after its MODEL_REMAPPING).
Importing `mlx_lm` would import MLX itself (its `__init__` loads the generate stack), and the store
must import on any machine, so the package is located with `importlib.util.find_spec` on the top-level
name (which runs no code) and the remapping table is read from `mlx_lm/utils.py` with `ast`.

llama.cpp: a GGUF's `general.architecture` is one llama.cpp knows when gguf-py (which ships with
llama.cpp's converters) names it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# weight dtypes mlx-lm loads as they are
MLX_DTYPES = ("bfloat16", "float16", "float32")
# mlx-lm's own quantization ("quantization": {"bits": 4, "group_size": 64} in config.json)
MLX_QUANT_BITS = (2, 3, 4, 5, 6, 8)


@dataclass(frozen=True)
class MlxSupport:
    """Whether mlx-lm can serve a safetensors repo, and why not when it cannot."""

    supported: bool
    model_type: str | None  # as config.json names it
    module: str | None  # the mlx_lm.models module that would serve it
    reason: str = ""


@functools.cache
def _mlx_lm_dir() -> Path | None:
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def mlx_model_remapping() -> dict[str, str]:
    """mlx-lm's MODEL_REMAPPING (e.g. mistral -> llama), read from its source without importing it."""
    root = _mlx_lm_dir()
    if root is None:
        return {}
    try:
        tree = ast.parse((root / "utils.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as exc:
        logger.warning("cannot read mlx_lm's model remapping: %s", exc)
        return {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "MODEL_REMAPPING" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            try:
                return {str(k): str(v) for k, v in ast.literal_eval(node.value).items()}
            except ValueError:
                break
    return {}


def mlx_has_module(module: str) -> bool:
    """True when `mlx_lm/models/<module>.py` exists in the installed mlx-lm."""
    root = _mlx_lm_dir()
    return root is not None and module.isidentifier() and (root / "models" / f"{module}.py").is_file()


@functools.cache
def _mlx_embeddings_dir() -> Path | None:
    spec = importlib.util.find_spec("mlx_embeddings")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def mlx_embedding_support(model_type: str) -> MlxSupport:
    """Can mlx-embeddings serve an embedding repo of this `model_type` (its models/<type>.py)?"""
    root = _mlx_embeddings_dir()
    if root is None:
        return MlxSupport(False, model_type, None, "mlx-embeddings is not installed (kinfer[embeddings])")
    module = model_type.replace("-", "_")
    if not module.isidentifier() or not (root / "models" / f"{module}.py").is_file():
        return MlxSupport(
            False, model_type, None, f"mlx-embeddings has no model for model_type {model_type!r}"
        )
    return MlxSupport(True, model_type, f"mlx_embeddings.models.{module}")


def mlx_support(config: dict[str, Any], *, embedding: bool = False) -> MlxSupport:
    """Can MLX serve the repo this `config.json` describes (architecture and weight format)? mlx-lm
    serves generative repos, mlx-embeddings the embedding ones (`embedding`)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return MlxSupport(False, None, None, "config.json names no model_type")
    if embedding:
        support = mlx_embedding_support(model_type)
        if not support.supported:
            return support
        return _weights_support(config, support)
    if _mlx_lm_dir() is None:
        return MlxSupport(False, model_type, None, "mlx-lm is not installed")
    module = mlx_model_remapping().get(model_type, model_type)
    if not mlx_has_module(module):
        return MlxSupport(False, model_type, None, f"mlx-lm has no model for model_type {model_type!r}")
    return _weights_support(config, MlxSupport(True, model_type, module))


def _weights_support(config: dict[str, Any], support: MlxSupport) -> MlxSupport:
    """The weight format's verdict on a repo whose architecture is served (`support`)."""
    model_type, module = support.model_type, support.module
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method"):
        # GPTQ, AWQ, FP8, bitsandbytes...: mlx-lm reads its own quantization only
        return MlxSupport(
            False, model_type, module, f"weights are {quant['quant_method']}-quantized, which MLX cannot load"
        )
    mlx_quant = config.get("quantization")
    if isinstance(mlx_quant, dict) and mlx_quant.get("bits") not in MLX_QUANT_BITS:
        return MlxSupport(False, model_type, module, f"MLX quantization of {mlx_quant.get('bits')} bits")
    dtype = config.get("torch_dtype") or config.get("dtype") or _text(config).get("torch_dtype")
    if isinstance(dtype, str) and dtype not in MLX_DTYPES:
        return MlxSupport(False, model_type, module, f"weights in {dtype}, which MLX does not load")
    return support


def _text(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else {}


@functools.cache
def _gguf_architectures() -> frozenset[str]:
    try:
        import gguf
    except ImportError:  # gguf is a dependency; without it, say "unknown" rather than fail
        return frozenset()
    return frozenset(gguf.MODEL_ARCH_NAMES.values())


def llama_cpp_supports(architecture: str | None) -> bool | None:
    """True when llama.cpp knows this GGUF architecture; None when it cannot be told."""
    if not architecture:
        return None
    known = _gguf_architectures()
    return (architecture in known) if known else None
