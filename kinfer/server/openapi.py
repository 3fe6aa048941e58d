"""An OpenAPI 3.1 description of every route, built from the app's url map and the dialects' wire models.

    spec = openapi_spec(app)        # a dict, ready for jsonify; served at GET /openapi.json

Paths come from `app.url_map` itself, so a route cannot be missing from the spec; what a route takes
comes from `ENDPOINTS` (endpoint name -> `Endpoint`), whose request bodies are the pydantic models the
dialect modules parse with (`model_json_schema`), so the documented body is the one that is enforced.
Error envelopes come from the dialect that owns the path (`dialects.dialect_for`, as the app renders
them). A route with a body but no entry in `ENDPOINTS` is still listed, and `undocumented_bodies`
names it (the tests fail on it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from quart import Quart

from kinfer import __version__
from kinfer.server.anthropic_wire import CountTokensBody, MessagesBody
from kinfer.server.dialects import dialect_for
from kinfer.server.ollama_embed import EmbedBody as OllamaEmbedBody
from kinfer.server.ollama_embed import EmbeddingsBody as OllamaEmbeddingsBody
from kinfer.server.ollama_wire import ChatBody, CopyBody, GenerateBody, NameBody
from kinfer.server.openai_embeddings import EmbeddingsBody as OpenAIEmbeddingsBody
from kinfer.server.openai_wire import ChatCompletionRequest, CompletionRequest
from kinfer.server.responses_wire import ResponsesBody

OPENAPI_VERSION = "3.1.0"
SKIPPED_METHODS = frozenset({"HEAD", "OPTIONS"})
SKIPPED_ENDPOINTS = frozenset({"static"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
REF_TEMPLATE = "#/components/schemas/{model}"
_CONVERTER = re.compile(r"<(?:[a-zA-Z_][a-zA-Z0-9_]*(?:\([^)]*\))?:)?([a-zA-Z_][a-zA-Z0-9_]*)>")

JSON = "application/json"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
TEXT = "text/plain"

# ---- small response schemas (written by hand where the model is cheap to state) --------------

OBJECT: dict[str, Any] = {"type": "object"}
MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {"$ref": "#/components/schemas/OpenAIModel"}},
    },
}
OPENAI_MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
    },
}
HEALTH = {
    "type": "object",
    "required": ["status"],  # version and loaded only with the API key, when one is set
    "properties": {
        "status": {"enum": ["ok", "shutting down", "rank lost"]},
        "version": {"type": "string"},
        "loaded": {"type": "array", "items": {"type": "string"}},
        "distributed": {"type": "object"},  # a distributed rank 0: ranks, connected, lost, error
    },
}
OLLAMA_MODELS = {
    "type": "object",
    "required": ["models"],
    "properties": {"models": {"type": "array", "items": OBJECT}},
}
INPUT_TOKENS = {
    "type": "object",
    "required": ["input_tokens"],
    "properties": {"input_tokens": {"type": "integer", "minimum": 0}},
}
VECTOR = {"type": "array", "items": {"type": "number"}}
OPENAI_EMBEDDINGS = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["object", "index", "embedding"],
                "properties": {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer"},
                    "embedding": {"oneOf": [VECTOR, {"type": "string", "contentEncoding": "base64"}]},
                },
            },
        },
        "model": {"type": "string"},
        "usage": {
            "type": "object",
            "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
        },
    },
}
OLLAMA_EMBED = {
    "type": "object",
    "required": ["model", "embeddings"],
    "properties": {
        "model": {"type": "string"},
        "embeddings": {"type": "array", "items": VECTOR},
        "total_duration": {"type": "integer"},
        "load_duration": {"type": "integer"},
        "prompt_eval_count": {"type": "integer"},
    },
}
OLLAMA_EMBEDDING = {"type": "object", "required": ["embedding"], "properties": {"embedding": VECTOR}}
STATIC_SCHEMAS = {"OpenAIModel": OPENAI_MODEL}


@dataclass(frozen=True)
class Endpoint:
    """What one endpoint takes and gives. `body` is the pydantic wire model its handler parses."""

    summary: str
    tag: str
    body: type[BaseModel] | None = None
    reply: dict[str, Any] | None = None  # JSON schema of the 200 answer (None: any JSON object)
    reply_type: str = JSON
    streams: str | None = None  # the mimetype when the request asks to stream
    open: bool = False  # no API key needed


ENDPOINTS: dict[str, Endpoint] = {
    "health": Endpoint("Liveness, version and loaded models", "server", reply=HEALTH, open=True),
    "metrics": Endpoint("Prometheus metrics", "server", reply_type=TEXT),
    "openapi_json": Endpoint("This OpenAPI description", "server"),
    "openai.chat_completions": Endpoint(
        "OpenAI Chat Completions", "openai", body=ChatCompletionRequest, streams=SSE
    ),
    "openai.completions": Endpoint(
        "OpenAI legacy Completions", "openai", body=CompletionRequest, streams=SSE
    ),
    "openai.embeddings": Endpoint(
        "OpenAI Embeddings", "openai", body=OpenAIEmbeddingsBody, reply=OPENAI_EMBEDDINGS
    ),
    "openai.list_models": Endpoint("OpenAI model list", "openai", reply=MODEL_LIST),
    "openai.get_model": Endpoint("One OpenAI model", "openai", reply=OPENAI_MODEL),
    "anthropic.create_message": Endpoint("Anthropic Messages", "anthropic", body=MessagesBody, streams=SSE),
    "anthropic.count_tokens": Endpoint(
        "Anthropic token count", "anthropic", body=CountTokensBody, reply=INPUT_TOKENS
    ),
    "responses.create_response": Endpoint("OpenAI Responses", "responses", body=ResponsesBody, streams=SSE),
    "responses.get_response": Endpoint("A stored response", "responses"),
    "responses.delete_response": Endpoint("Delete a stored response", "responses"),
    "responses.list_input_items": Endpoint("The input items of a stored response", "responses"),
    "ollama.chat": Endpoint("Ollama chat", "ollama", body=ChatBody, streams=NDJSON),
    "ollama.generate": Endpoint("Ollama generate", "ollama", body=GenerateBody, streams=NDJSON),
    "ollama.embed": Endpoint("Ollama embed", "ollama", body=OllamaEmbedBody, reply=OLLAMA_EMBED),
    "ollama.embeddings": Endpoint(
        "Ollama embeddings (legacy)", "ollama", body=OllamaEmbeddingsBody, reply=OLLAMA_EMBEDDING
    ),
    "ollama.tags": Endpoint("Ollama model list", "ollama", reply=OLLAMA_MODELS),
    "ollama.show": Endpoint("Ollama model details", "ollama", body=NameBody),
    "ollama.ps": Endpoint("Ollama loaded models", "ollama", reply=OLLAMA_MODELS),
    "ollama.version": Endpoint("Ollama API version", "ollama"),
    "ollama.delete": Endpoint("Remove a model from the store", "ollama", body=NameBody, reply_type=TEXT),
    "ollama.copy": Endpoint("Give a model a second name", "ollama", body=CopyBody, reply_type=TEXT),
    "ollama.pull": Endpoint("Pull a model from the Hub", "ollama", body=NameBody, streams=NDJSON),
    "ollama.root": Endpoint("Ollama liveness", "ollama", reply_type=TEXT, open=True),
}


def error_schema(path: str) -> Mapping[str, Any]:
    """The error envelope of the dialect a path belongs to (the one the app renders its errors in)."""
    return dialect_for(path).error_schema


def openapi_path(rule: str) -> str:
    """`/v1/models/<path:name>` -> `/v1/models/{name}`."""
    return _CONVERTER.sub(r"{\1}", rule)


def routes(app: Quart) -> list[tuple[str, str, str]]:
    """(method, rule, endpoint) for every documented route: static files, HEAD and OPTIONS left out."""
    found = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint in SKIPPED_ENDPOINTS:
            continue
        for method in sorted((rule.methods or set()) - SKIPPED_METHODS):
            found.append((method, rule.rule, rule.endpoint))
    return found


def undocumented_bodies(app: Quart) -> list[str]:
    """Routes that take a body but have no wire model in `ENDPOINTS`: the spec would be guessing."""
    missing = []
    for method, rule, endpoint in routes(app):
        doc = ENDPOINTS.get(endpoint)
        # Ollama's DELETE /api/delete reads a JSON body too; no other DELETE does
        takes_body = method in BODY_METHODS or (method == "DELETE" and endpoint.startswith("ollama."))
        if takes_body and (doc is None or doc.body is None):
            missing.append(f"{method} {rule}")
    return missing


def _request_schemas(
    models: set[type[BaseModel]],
) -> tuple[dict[type[BaseModel], dict[str, Any]], dict[str, Any]]:
    """{model: {"$ref": ...}} and the shared component schemas for the wire models given."""
    if not models:
        return {}, {}
    ordered = sorted(models, key=lambda model: f"{model.__module__}:{model.__qualname__}")
    keys, top = models_json_schema([(model, "validation") for model in ordered], ref_template=REF_TEMPLATE)
    refs = {model: keys[(model, "validation")] for model in ordered}
    return refs, top.get("$defs", {})


def _responses(path: str, doc: Endpoint | None) -> dict[str, Any]:
    ok: dict[str, Any]
    if doc is None:
        ok = {"description": "OK", "content": {JSON: {"schema": OBJECT}}}
    elif doc.reply_type == JSON:
        content: dict[str, Any] = {JSON: {"schema": doc.reply or OBJECT}}
        if doc.streams:
            content[doc.streams] = {"schema": {"type": "string"}}
        ok = {"description": doc.summary, "content": content}
    else:
        ok = {"description": doc.summary, "content": {doc.reply_type: {"schema": {"type": "string"}}}}
    error = {
        "description": "An error in the dialect's envelope",
        "content": {JSON: {"schema": error_schema(path)}},
    }
    return {"200": ok, "4XX": error, "5XX": error}


def _operation(
    method: str, rule: str, endpoint: str, refs: dict[type[BaseModel], dict[str, Any]]
) -> dict[str, Any]:
    path = openapi_path(rule)
    doc = ENDPOINTS.get(endpoint)
    operation: dict[str, Any] = {
        "operationId": f"{method.lower()}_{re.sub(r'[^a-zA-Z0-9]+', '_', rule).strip('_') or 'root'}",
        "summary": doc.summary if doc else endpoint,
        "tags": [doc.tag if doc else "server"],
        "responses": _responses(path, doc),
    }
    names = _CONVERTER.findall(rule)
    if names:
        operation["parameters"] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
            for name in names
        ]
    if doc is not None and doc.body is not None and doc.body in refs:
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": refs[doc.body]}}}
    if doc is not None and doc.open:
        operation["security"] = []
    return operation


def openapi_spec(app: Quart) -> dict[str, Any]:
    """The OpenAPI 3.1 document for `app`: every route in its url map, bodies from the wire models."""
    found = routes(app)
    wanted = {doc.body for _, _, e in found if (doc := ENDPOINTS.get(e)) is not None and doc.body}
    refs, schemas = _request_schemas(wanted)
    paths: dict[str, dict[str, Any]] = {}
    for method, rule, endpoint in found:
        paths.setdefault(openapi_path(rule), {})[method.lower()] = _operation(method, rule, endpoint, refs)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "kinfer",
            "version": __version__,
            "description": "A local LLM server: OpenAI, Anthropic, Ollama and OpenAI Responses dialects.",
        },
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": {**STATIC_SCHEMAS, **schemas},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        # the key is optional: a server started without --api-key takes none (the empty alternative)
        "security": [{"bearer": []}, {"apiKey": []}, {}],
    }
