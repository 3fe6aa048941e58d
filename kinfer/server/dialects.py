"""The one list of dialects: the app registers their blueprints, renders errors and documents them from it.

dialect_for("/api/chat").error_response(error)    # the envelope the caller's client expects
"""

from __future__ import annotations

from kinfer.server import anthropic, ollama, ollama_embed, openai_chat, openai_embeddings, responses
from kinfer.server.dialect import Dialect

# the embedding routes live in modules of their own and join their dialect's blueprint on import
EMBEDDING_MODULES = (openai_embeddings, ollama_embed)

# in the order their blueprints are registered; error routing does not depend on it (longest prefix wins)
DIALECTS: tuple[Dialect, ...] = (openai_chat.DIALECT, ollama.DIALECT, anthropic.DIALECT, responses.DIALECT)

_BY_PREFIX: tuple[tuple[str, Dialect], ...] = tuple(
    sorted(((p, d) for d in DIALECTS for p in d.prefixes), key=lambda item: len(item[0]), reverse=True)
)


def dialect_for(path: str) -> Dialect:
    """The dialect whose longest prefix starts `path` (OpenAI's "/" when no other claims it)."""
    for prefix, dialect in _BY_PREFIX:
        if path.startswith(prefix):
            return dialect
    return openai_chat.DIALECT  # a path without a leading "/" (never one Quart routes)
