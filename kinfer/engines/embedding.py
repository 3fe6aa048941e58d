"""What both engines share about embeddings: reading a model's pooling, truncating an input, and
knowing which models were trained for Matryoshka truncation.

Pure Python (no llama.cpp, no MLX): the store reads the same facts to report the `embedding` capability.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from kinfer.engines.base import Pooling
from kinfer.errors import InvalidRequest

log = logging.getLogger(__name__)

# llama.cpp's enum llama_pooling_type, as GGUF `<arch>.pooling_type` holds it (0 = none, 4 = rank)
GGUF_POOLING: dict[int, Pooling] = {1: "mean", 2: "cls", 3: "last"}
EMBED_BATCH_TOKENS = 2048  # tokens per embedding pass when the longest input is shorter
MAX_EMBED_TOKENS = 8192  # the longest input an automatic embedding context takes

# Families trained with Matryoshka representation learning: a prefix of the vector is an embedding
# too. No GGUF key or sentence-transformers file says so, so the model cards are the source; a
# name holding "matryoshka" counts as well (fine-tunes name themselves so).
MATRYOSHKA_NAMES = (
    "matryoshka",
    "qwen3-embedding",
    "qwen3_embedding",
    "embeddinggemma",
    "embedding-gemma",
    "nomic-embed-text-v1.5",
    "nomic-embed-text-v2",
    "nomic-embed-text",  # Ollama's nomic-embed-text is v1.5
    "mxbai-embed-large",
    "arctic-embed-m-v1.5",
    "arctic-embed-m-v2",
    "arctic-embed-l-v2",
    "jina-embeddings-v3",
)


def is_matryoshka(*names: str | None) -> bool:
    """True when any of the model's names (store name, general.name, directory) is a Matryoshka family."""
    lowered = [n.lower() for n in names if n]
    return any(family in name for name in lowered for family in MATRYOSHKA_NAMES)


@dataclass(frozen=True)
class SentenceTransformers:
    """A sentence-transformers directory's pipeline: modules.json and the Pooling module's config."""

    pooling: Pooling
    normalize: bool
    other_modules: tuple[str, ...]  # modules kinfer does not apply itself (Dense, ...)


_ST_POOLING: tuple[tuple[str, Pooling], ...] = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_lasttoken", "last"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
)


def read_sentence_transformers(path: Path) -> SentenceTransformers | None:
    """The directory's sentence-transformers modules, or None when it has no modules.json."""
    try:
        modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(modules, list):
        return None
    pooling: Pooling = "mean"  # sentence-transformers' own default
    normalize = False
    others = []
    for module in modules:
        if not isinstance(module, dict):
            continue
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Pooling":
            pooling = _pooling_of(path / str(module.get("path", "1_Pooling")))
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            others.append(kind)
    return SentenceTransformers(pooling, normalize, tuple(others))


ENCODER_TYPES = frozenset({"bert", "xlm-roberta", "xlm_roberta", "roberta", "modernbert", "nomic_bert"})


def embedding_pooling(folder: Path, config: dict) -> Pooling | None:
    """A Hugging Face directory's pooling when it is an embedding model (sentence-transformers files,
    or an encoder-only architecture), None for a generative model."""
    pipeline = read_sentence_transformers(folder)
    if pipeline is not None:
        return pipeline.pooling
    return "mean" if config.get("model_type") in ENCODER_TYPES else None


def _pooling_of(folder: Path) -> Pooling:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "mean"
    for key, pooling in _ST_POOLING:
        if isinstance(config, dict) and config.get(key) is True:
            return pooling
    mode = config.get("pooling_mode") if isinstance(config, dict) else None
    if mode in ("cls", "max", "mean"):
        return mode
    if mode == "lasttoken":
        return "last"
    log.warning("%s: pooling %s is not supported; using mean pooling", folder, config)
    return "mean"


def fit_input(tokens: list[int], limit: int, *, truncate: bool, appends_eos: bool, index: int) -> list[int]:
    """The input's tokens cut to `limit` (keeping a closing special token), or a 400 when not allowed."""
    if not tokens:
        raise InvalidRequest(f"input {index} is empty once tokenized; send some text")
    if len(tokens) <= limit:
        return tokens
    if not truncate:
        raise InvalidRequest(
            f"input {index} is {len(tokens)} tokens, more than the model's context of {limit}; "
            "shorten it (or let the server truncate it)"
        )
    if appends_eos and limit >= 2:
        return [*tokens[: limit - 1], tokens[-1]]
    return tokens[:limit]
