"""Reading a Hugging Face model directory for the MLX engine: config, chat template, stop ids, weights.

The weights are loaded by mlx-lm (`mlx_lm.utils.load_model`), which picks the model class for the
config's `model_type` and handles bf16 / f16 / f32 and MLX-quantized checkpoints.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinfer.errors import EngineFailure

log = logging.getLogger(__name__)

DEFAULT_TRAIN_CONTEXT = 4096
_CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions", "n_ctx")


@dataclass(frozen=True)
class ModelDirectory:
    """What the directory's JSON files say (no weights)."""

    path: Path
    config: dict[str, Any]
    model_type: str
    chat_template: str | None
    eos_ids: frozenset[int]
    train_context: int


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EngineFailure(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> set[int]:
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int)}
    return set()


def read_chat_template(path: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """chat_template.jinja wins (newer checkpoints), then tokenizer_config.json's `chat_template`
    (a string, or a list of named templates of which "default" is used)."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None


def read_model_directory(path: Path, tokenizer_config: dict[str, Any], eos_id: int | None) -> ModelDirectory:
    config = _read_json(path / "config.json")
    if not config:
        raise EngineFailure(f"{path} has no config.json")
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise EngineFailure(f"{path}/config.json names no model_type")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    generation = _read_json(path / "generation_config.json")
    eos = (
        _ids(config.get("eos_token_id"))
        | _ids(text.get("eos_token_id"))
        | _ids(generation.get("eos_token_id"))
    )
    if eos_id is not None:
        eos.add(eos_id)
    train = next(
        (
            int(src[k])
            for src in (config, text)
            for k in _CONTEXT_KEYS
            if isinstance(src.get(k), int) and src[k] > 0
        ),
        0,
    )
    return ModelDirectory(
        path=path,
        config=config,
        model_type=model_type,
        chat_template=read_chat_template(path, tokenizer_config),
        eos_ids=frozenset(eos),
        train_context=train or DEFAULT_TRAIN_CONTEXT,
    )


def load_weights(path: Path, group=None):
    """The mlx-lm model for the directory, weights evaluated (so load errors surface here).

    `group` (an `mx.distributed.Group`): keep only this rank's tensor-parallel shard, split by mlx-lm's
    own `model.shard(group)`; loaded lazily first, so the whole model is never resident on one rank."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    try:
        model, config = load_model(path, lazy=group is not None)
    except FileNotFoundError as exc:
        raise EngineFailure(f"{path}: {exc}") from exc
    except ValueError as exc:  # unsupported model_type, bad quantization config, mismatched weights
        raise EngineFailure(f"{path}: mlx-lm cannot load this model: {exc}") from exc
    if group is not None:
        if not hasattr(model, "shard"):
            raise EngineFailure(
                f"{path}: mlx-lm has no tensor-parallel split for model_type "
                f"{config.get('model_type')!r} (docs/distributed.md lists the ones it has)"
            )
        try:
            model.shard(group)
        except (AssertionError, ValueError) as exc:  # e.g. heads or vocabulary not divisible by ranks
            raise EngineFailure(f"{path}: cannot split this model {group.size()} ways: {exc}") from exc
        mx.eval(model.parameters())
    return model


def model_vocab(model, fallback: int) -> int:
    """Rows of the model's token embedding (may exceed the tokenizer's vocabulary: padding); `fallback`
    if none."""
    from mlx.utils import tree_flatten

    for key, value in tree_flatten(model.parameters()):
        if key.endswith("embed_tokens.weight"):
            return int(value.shape[0])
    return fallback
