"""Ollama's embeddings: POST /api/embed and the legacy POST /api/embeddings, on the Ollama blueprint.

As Ollama does: any model embeds (a chat model with its last token's state); /api/embed normalizes
each vector, truncates an input longer than the context unless `truncate` is false (then a 400), and
cuts the vectors to `dimensions` (normalizing again); no input loads the model and answers an empty
list. The legacy /api/embeddings takes one `prompt` and returns the raw (unnormalized) `embedding`.
Unlike Ollama, an empty list is a 400 (as OpenAI answers it), not an empty answer.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import Field
from quart import Response, jsonify

from kinfer.embedding import MAX_EMBED_INPUTS, EmbedRequest
from kinfer.errors import InvalidRequest
from kinfer.server.context import runtime
from kinfer.server.ollama import blueprint
from kinfer.server.ollama_wire import KeepAlive, Options, keep_alive_seconds
from kinfer.server.wire import WireModel, read_body


class EmbedBody(WireModel):
    model: str
    input: Any = None
    truncate: bool = True
    dimensions: int | None = None
    keep_alive: KeepAlive = None
    options: Options = Field(default_factory=Options)


class EmbeddingsBody(WireModel):
    model: str
    prompt: str = ""
    keep_alive: KeepAlive = None
    options: Options = Field(default_factory=Options)


def ollama_inputs(value: Any) -> tuple[str, ...]:
    """A string or a list of strings; None or "" means no input (the model is only loaded)."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest("invalid input type: input must be a string or a list of strings")
    if not value:
        raise InvalidRequest("input must not be an empty list")
    if len(value) > MAX_EMBED_INPUTS:
        raise InvalidRequest(f"input holds {len(value)} items; at most {MAX_EMBED_INPUTS} per request")
    return tuple(value)


def nanoseconds(seconds: float) -> int:
    return int(seconds * 1e9)


@blueprint.post("/api/embed")
async def embed() -> Response:
    body = await read_body(EmbedBody)
    if body.dimensions is not None and body.dimensions < 1:
        raise InvalidRequest("dimensions must be a positive integer")
    inputs = ollama_inputs(body.input)
    scheduler = runtime().scheduler
    keep_alive = keep_alive_seconds(body.keep_alive)
    if not inputs:
        model = await scheduler.load(body.model, keep_alive=keep_alive)
        return jsonify({"model": model.name, "embeddings": []})
    request = EmbedRequest(
        model=body.model,
        inputs=inputs,
        truncate=body.truncate,
        normalize=True,
        dimensions=body.dimensions,
        keep_alive=keep_alive,
        num_ctx=body.options.num_ctx,
        dialect="ollama",
        request_id=f"ollama-embed-{uuid.uuid4().hex}",
    )
    result = await scheduler.embed(request)
    return jsonify(
        {
            "model": result.model,
            "embeddings": [v.tolist() for v in result.embeddings],
            "total_duration": nanoseconds(result.total_seconds),
            "load_duration": nanoseconds(result.load_seconds),
            "prompt_eval_count": result.prompt_tokens,
        }
    )


@blueprint.post("/api/embeddings")
async def embeddings() -> Response:
    body = await read_body(EmbeddingsBody)
    scheduler = runtime().scheduler
    keep_alive = keep_alive_seconds(body.keep_alive)
    if not body.prompt:  # an empty prompt loads the model
        await scheduler.load(body.model, keep_alive=keep_alive)
        return jsonify({"embedding": []})
    request = EmbedRequest(
        model=body.model,
        inputs=(body.prompt,),
        normalize=False,
        keep_alive=keep_alive,
        num_ctx=body.options.num_ctx,
        dialect="ollama",
        request_id=f"ollama-embed-{uuid.uuid4().hex}",
    )
    result = await scheduler.embed(request)
    return jsonify({"embedding": result.embeddings[0].tolist()})
