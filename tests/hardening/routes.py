"""Request bodies in every dialect, and checks that an answer is in its dialect's shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Route:
    """A generation route and how its dialect spells a small request."""

    name: str
    path: str
    build: Callable[..., dict[str, Any]]
    reply_key: str  # a key every successful (non-streaming) answer carries

    def body(self, content: Any = "Say hi.", **fields: Any) -> dict[str, Any]:
        return self.build(content, **fields)


def _openai_chat(content: Any, max_tokens: Any = 4, model: Any = "smollm2", **extra: Any) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def _openai_completion(content: Any, max_tokens: Any = 4, model: Any = "smollm2", **extra: Any) -> dict:
    return {"model": model, "prompt": content, "max_tokens": max_tokens, "temperature": 0, **extra}


def _anthropic(content: Any, max_tokens: Any = 4, model: Any = "smollm2", **extra: Any) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def _count_tokens(content: Any, max_tokens: Any = None, model: Any = "smollm2", **extra: Any) -> dict:
    extra.pop("temperature", None)
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def _ollama_options(max_tokens: Any, extra: dict[str, Any]) -> dict[str, Any]:
    options = {"num_predict": max_tokens, "temperature": 0}
    for key in ("temperature", "seed", "top_k", "top_p", "num_ctx", "stop"):
        if key in extra:
            options[key] = extra.pop(key)
    return options


def _ollama_chat(content: Any, max_tokens: Any = 4, model: Any = "smollm2", **extra: Any) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "stream": False,
        "options": _ollama_options(max_tokens, extra),
        **extra,
    }


def _ollama_generate(content: Any, max_tokens: Any = 4, model: Any = "smollm2", **extra: Any) -> dict:
    return {
        "model": model,
        "prompt": content,
        "stream": False,
        "options": _ollama_options(max_tokens, extra),
        **extra,
    }


def _responses(content: Any, max_tokens: Any = 4, model: Any = "smollm2", **extra: Any) -> dict:
    return {"model": model, "input": content, "max_output_tokens": max_tokens, "temperature": 0, **extra}


ROUTES = (
    Route("openai-chat", "/v1/chat/completions", _openai_chat, "choices"),
    Route("openai-completions", "/v1/completions", _openai_completion, "choices"),
    Route("anthropic", "/v1/messages", _anthropic, "content"),
    Route("anthropic-count", "/v1/messages/count_tokens", _count_tokens, "input_tokens"),
    Route("ollama-chat", "/api/chat", _ollama_chat, "message"),
    Route("ollama-generate", "/api/generate", _ollama_generate, "response"),
    Route("responses", "/v1/responses", _responses, "output"),
)
ROUTE_IDS = [r.name for r in ROUTES]
# every route that reads a JSON body, generation or not
JSON_ROUTES = (
    *(("POST", r.path) for r in ROUTES),
    ("POST", "/api/show"),
    ("POST", "/api/pull"),
    ("POST", "/api/copy"),
    ("DELETE", "/api/delete"),
)


def error_message(path: str, reply: httpx.Response) -> str:
    """The message of an error answer, checking it is in the envelope of the path's dialect."""
    body = reply.json()
    if path.startswith("/api/"):
        assert isinstance(body.get("error"), str), body
        return body["error"]
    if path.startswith("/v1/messages"):
        assert body.get("type") == "error", body
        assert {"type", "message"} <= body["error"].keys(), body
        # Anthropic's request id, in the body and the header alike
        assert body.get("request_id", "").startswith("req_"), body
        assert reply.headers.get("request-id") == body["request_id"], reply.headers
        return body["error"]["message"]
    assert {"message", "type"} <= body["error"].keys(), body
    # OpenAI's `code` is a string such as "context_length_exceeded", or null; never the HTTP status
    assert body["error"].get("code") is None or isinstance(body["error"]["code"], str), body
    return body["error"]["message"]


def assert_refused(path: str, reply: httpx.Response, *statuses: int) -> str:
    """A clean refusal: one of `statuses` (default any 4xx) in the dialect's envelope; returns its message."""
    if statuses:
        assert reply.status_code in statuses, (reply.status_code, reply.text[:300])
    else:
        assert 400 <= reply.status_code < 500, (reply.status_code, reply.text[:300])
    return error_message(path, reply)


def assert_handled(route: Route, reply: httpx.Response) -> None:
    """Answered (2xx in the dialect's shape) or refused cleanly (4xx in its envelope); never a 5xx."""
    assert reply.status_code < 500, (reply.status_code, reply.text[:300])
    if reply.status_code == 200:
        assert route.reply_key in reply.json(), reply.text[:300]
    else:
        assert_refused(route.path, reply)
