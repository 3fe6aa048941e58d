"""The internal embedding request every dialect translates to, its result, and the vector finishing
(normalisation, Matryoshka truncation) the dialects ask for. A sibling of protocol.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kinfer.engines.base import ModelInfo
from kinfer.errors import EngineFailure, InvalidRequest

EmbedInput = str | tuple[int, ...]  # text, or token ids sent as they are (OpenAI allows both)
MAX_EMBED_INPUTS = 2048  # inputs in one request (OpenAI's own limit)


@dataclass(frozen=True)
class EmbedRequest:
    """What /v1/embeddings, /api/embed and /api/embeddings become.

    `truncate`: cut an input longer than the model's context (else a 400). `normalize`: scale each
    vector to unit length (OpenAI and /api/embed do; Ollama's legacy /api/embeddings does not).
    `dimensions`: keep the first N values (and normalize again when `normalize`); None = all.
    `strict`: the OpenAI rules: the model must be an embedding model, and `dimensions` is accepted
    only for a Matryoshka model and at most its width (Ollama truncates any model's vectors).
    `keep_alive`/`num_ctx`: as in ChatRequest.
    """

    model: str
    inputs: tuple[EmbedInput, ...]
    truncate: bool = True
    normalize: bool = True
    dimensions: int | None = None
    strict: bool = False
    keep_alive: float | None = None
    num_ctx: int | None = None
    dialect: str = "openai"
    request_id: str = ""


@dataclass(frozen=True)
class EmbedResult:
    """One float32 vector per input, in input order."""

    model: str
    embeddings: tuple[np.ndarray, ...]
    prompt_tokens: int
    load_seconds: float
    total_seconds: float


def check_embed_request(request: EmbedRequest, info: ModelInfo) -> None:
    """What the loaded model allows of an embedding request (the dialect checked its shape)."""
    spec = info.embedding
    if spec is None:
        raise InvalidRequest(f"{info.name} cannot embed: its engine has no embedding path")
    if request.strict and info.chat:
        raise InvalidRequest(
            f"{info.name} is a chat model, not an embedding model; /v1/embeddings needs an embedding "
            "model (Ollama's /api/embed also embeds with chat models)"
        )
    if request.dimensions is not None and request.strict:
        if not spec.matryoshka:
            raise InvalidRequest(
                f"{info.name} does not support `dimensions`: it was not trained for Matryoshka truncation"
            )
        if request.dimensions > spec.dimensions:
            raise InvalidRequest(f"dimensions must be at most {spec.dimensions} for {info.name}")


def finish_vector(vector: np.ndarray, *, normalize: bool, dimensions: int | None) -> np.ndarray:
    """Ollama's order: normalize, keep the first `dimensions`, normalize again."""
    if not np.all(np.isfinite(vector)):
        raise EngineFailure("the embedding holds NaN or infinite values")
    out = vector.astype(np.float32)
    if normalize:
        out = _unit(out)
    if dimensions is not None and dimensions < out.shape[0]:
        out = out[:dimensions]
        if normalize:
            out = _unit(out)
    return out


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / max(float(np.linalg.norm(vector)), 1e-12)
