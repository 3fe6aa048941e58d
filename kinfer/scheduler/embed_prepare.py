"""Tokenize and fit an embedding request's inputs, in the request's own task (on the scheduler's
preparation pool), never on the engine thread: that thread then only decodes, as llama-server
tokenizes in its HTTP threads. The tokenizers read their vocabulary only (the chat prompts'
preparation calls them from the same pool)."""

from __future__ import annotations

from typing import cast

from kinfer.embedding import EmbedRequest
from kinfer.engines.base import Embedder, Engine
from kinfer.engines.embedding import fit_input
from kinfer.errors import InvalidRequest

# no tokenizer averages more characters per token: a text far beyond the context is cut before
# tokenizing, so a huge input never holds a preparation thread
MAX_CHARS_PER_TOKEN = 64

EmbedInputs = tuple[tuple[int, ...], ...]


def tokenize_inputs(engine: Engine, request: EmbedRequest) -> EmbedInputs:
    """Each input's token ids, with the model's special tokens, fitted to its longest input
    (truncated, or a 400 when the request asks not to truncate)."""
    spec = engine.info.embedding
    if spec is None or not hasattr(engine, "embed"):
        raise InvalidRequest(f"{engine.info.name} cannot embed: its engine has no embedding path")
    embedder = cast(Embedder, engine)
    limit = spec.max_tokens * MAX_CHARS_PER_TOKEN
    inputs = []
    for index, item in enumerate(request.inputs):
        if isinstance(item, str):
            if len(item) > limit and not request.truncate:
                raise InvalidRequest(f"input {index} is far longer than the model's {spec.max_tokens} tokens")
            tokens = embedder.embed_tokenize(item[:limit])
        else:
            tokens = list(item)
            if any(t < 0 or t >= spec.vocab_size for t in tokens):
                raise InvalidRequest(
                    f"input {index} holds token ids outside the vocabulary (0..{spec.vocab_size - 1})"
                )
        fitted = fit_input(
            tokens, spec.max_tokens, truncate=request.truncate, appends_eos=spec.appends_eos, index=index
        )
        inputs.append(tuple(fitted))
    return tuple(inputs)
