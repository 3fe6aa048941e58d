"""OpenAI Embeddings: POST /v1/embeddings, on the OpenAI blueprint.

`input` is a string, a list of strings, a list of token ids or a list of token-id lists (up to
2,048 inputs, as OpenAI allows); `encoding_format` "float" or "base64" (little-endian float32, what
the openai SDK asks for by default); `dimensions` only for a Matryoshka model. The vectors are
normalized to unit length, as OpenAI's and llama-server's are. This dialect needs an embedding model
(a chat model is a 400 here; Ollama's /api/embed embeds with chat models too), and an input longer
than the model's context is a 400, as OpenAI answers it.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any, Literal

import numpy as np
from pydantic import Field
from quart import Response, jsonify

from kinfer.embedding import MAX_EMBED_INPUTS, EmbedInput, EmbedRequest, EmbedResult
from kinfer.errors import InvalidRequest
from kinfer.server.context import runtime
from kinfer.server.openai_chat import blueprint
from kinfer.server.wire import WireModel, read_body


class EmbeddingsBody(WireModel):
    model: str
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def openai_inputs(value: Any) -> tuple[EmbedInput, ...]:
    """OpenAI's four input shapes as a tuple of texts or token-id tuples; anything else is a 400."""
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("input must not be an empty string")
        return (value,)
    if not isinstance(value, list):
        raise InvalidRequest(
            "input must be a string, a list of strings or of token ids, or a list of token lists"
        )
    if not value:
        raise InvalidRequest("input must not be an empty list")
    if len(value) > MAX_EMBED_INPUTS:
        raise InvalidRequest(f"input holds {len(value)} items; at most {MAX_EMBED_INPUTS} per request")
    if all(_is_int(v) for v in value):
        return (tuple(value),)
    texts = isinstance(value[0], str)  # all strings, or all token lists: OpenAI mixes no shapes
    items: list[EmbedInput] = []
    for index, item in enumerate(value):
        if texts and isinstance(item, str) and item:
            items.append(item)
        elif not texts and isinstance(item, list) and item and all(_is_int(t) for t in item):
            items.append(tuple(item))
        else:
            shape = "a non-empty string" if texts else "a non-empty list of token ids (integers)"
            raise InvalidRequest(f"input[{index}] must be {shape}, like input[0]")
    return tuple(items)


def to_embed_request(body: EmbeddingsBody, request_id: str) -> EmbedRequest:
    return EmbedRequest(
        model=body.model,
        inputs=openai_inputs(body.input),
        truncate=False,
        normalize=True,
        dimensions=body.dimensions,
        strict=True,
        dialect="openai",
        request_id=request_id,
    )


def embedding_json(vector: np.ndarray, index: int, encoding: str) -> dict[str, Any]:
    value: Any = (
        base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        if encoding == "base64"
        else vector.tolist()
    )
    return {"object": "embedding", "index": index, "embedding": value}


def embeddings_json(result: EmbedResult, encoding: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [embedding_json(v, i, encoding) for i, v in enumerate(result.embeddings)],
        "model": result.model,
        "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
    }


@blueprint.post("/v1/embeddings")
@blueprint.post("/embeddings")
async def embeddings() -> Response:
    body = await read_body(EmbeddingsBody)
    request = to_embed_request(body, f"embd-{uuid.uuid4().hex}")
    result = await runtime().scheduler.embed(request)
    return jsonify(embeddings_json(result, body.encoding_format))
