"""One streaming chat driver per dialect (OpenAI, Ollama, Anthropic), all on an `httpx.AsyncClient`.

Each driver sends one request and returns a `RequestResult`: when the first and last generated text
arrived, and the token counts from the server's usage (OpenAI `stream_options.include_usage`, Ollama's
final `eval_count`, Anthropic's `message_start` / `message_delta`). A server that reports no usage in
its stream (llama-cpp-python's) gets its completion tokens counted from chunks and its prompt tokens
estimated; the result says which (`usage_source`).

Generation must run to `max_tokens` so runs compare equal work: `Target.extra_body` carries how a server
is told so (`{"ignore_eos": true}` for kinfer and llama.cpp's server, a `logit_bias` on the end tokens
for llama-cpp-python and mlx_lm). Ollama's dialect has no such switch.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import httpx

from kinfer.bench.stats import RequestResult

Dialect = Literal["openai", "ollama", "anthropic"]
DIALECTS: tuple[Dialect, ...] = ("openai", "ollama", "anthropic")
ChatMessages = Sequence[Mapping[str, str]]  # {"role": "system" | "user" | "assistant", "content": ...}

ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_DEFAULT_MODEL = "default"  # Anthropic's API requires a model name; kinfer maps unknown ones
ERROR_TEXT_LIMIT = 300
CONNECT_RETRIES = 2  # the openai SDK's default max_retries
RETRY_BACKOFF_S = 0.05


@dataclass(frozen=True)
class Target:
    """A server to benchmark and how to talk to it."""

    label: str  # how tables name it, e.g. "kinfer llama.cpp"
    url: str  # http://127.0.0.1:PORT, no trailing slash
    dialect: Dialect = "openai"
    model: str | None = None  # sent as the request's model; None leaves it to the server's default
    extra_body: Mapping[str, Any] = field(default_factory=dict)  # merged into every request body
    api_key: str | None = None
    pid: int | None = None  # the server's process, for its RSS

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
            headers["x-api-key"] = self.api_key
        if self.dialect == "anthropic":
            headers["anthropic-version"] = ANTHROPIC_VERSION
        return headers


# ---- request bodies ---------------------------------------------------------------------------


def chat_path(dialect: Dialect) -> str:
    return {"openai": "/v1/chat/completions", "ollama": "/api/chat", "anthropic": "/v1/messages"}[dialect]


def chat_body(
    target: Target, messages: ChatMessages, max_tokens: int, *, stream: bool, temperature: float = 0.0
) -> dict[str, Any]:
    """The request body for `target`'s dialect, with its `extra_body` merged in last."""
    msgs = [dict(m) for m in messages]
    body: dict[str, Any]
    if target.dialect == "openai":
        body = {"messages": msgs, "max_tokens": max_tokens, "temperature": temperature, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if target.model:
            body["model"] = target.model
    elif target.dialect == "ollama":
        body = {
            "model": target.model or "",
            "messages": msgs,
            "stream": stream,
            "options": {"num_predict": max_tokens, "temperature": temperature},
        }
    elif target.dialect == "anthropic":
        system = "\n\n".join(m["content"] for m in msgs if m["role"] == "system")
        body = {
            "model": target.model or ANTHROPIC_DEFAULT_MODEL,
            "max_tokens": max_tokens,
            "messages": [m for m in msgs if m["role"] != "system"],
            "temperature": temperature,
            "stream": stream,
        }
        if system:
            body["system"] = system
    else:
        raise ValueError(f"unknown dialect {target.dialect!r}")
    return {**body, **target.extra_body}


# ---- stream parsing ---------------------------------------------------------------------------


@dataclass
class StreamReader:
    """Folds a dialect's stream, line by line, into a `RequestResult`."""

    dialect: Dialect
    started: float
    first_token: float | None = None
    last_token: float | None = None
    parts: list[str] = field(default_factory=list)
    chunks_with_text: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    def feed(self, line: str, now: float) -> None:
        """Take one line of the response body (SSE for OpenAI / Anthropic, NDJSON for Ollama)."""
        line = line.strip()
        if not line or line.startswith(":") or line.startswith("event:"):
            return
        if self.dialect != "ollama":
            if not line.startswith("data:"):
                return
            line = line[5:].strip()
            if line == "[DONE]":
                return
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            self.error = self.error or f"unreadable stream line: {line[:80]!r}"
            return
        if not isinstance(data, dict):
            return
        {"openai": self._openai, "ollama": self._ollama, "anthropic": self._anthropic}[self.dialect](
            data, now
        )

    def _text(self, text: str | None, now: float) -> None:
        if not text:
            return
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.parts.append(text)
        self.chunks_with_text += 1

    def _openai(self, data: dict[str, Any], now: float) -> None:
        if "error" in data:
            self.error = error_text(data["error"])
            return
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            if not text and delta.get("tool_calls"):
                text = json.dumps(delta["tool_calls"])
            self._text(text, now)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        usage = data.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int(details.get("cached_tokens") or 0)

    def _ollama(self, data: dict[str, Any], now: float) -> None:
        if "error" in data:
            self.error = error_text(data["error"])
            return
        message = data.get("message") or {}
        self._text(message.get("content") or message.get("thinking"), now)
        if data.get("done"):
            self.finish_reason = data.get("done_reason")
            self.prompt_tokens = data.get("prompt_eval_count")
            self.completion_tokens = data.get("eval_count")

    def _anthropic(self, data: dict[str, Any], now: float) -> None:
        kind = data.get("type")
        if kind == "error" or (kind is None and "error" in data):
            self.error = error_text(data.get("error"))
        elif kind == "message_start":
            usage = (data.get("message") or {}).get("usage") or {}
            cached = int(usage.get("cache_read_input_tokens") or 0)
            # Anthropic counts cache reads apart from input_tokens; the total prompt is their sum
            self.prompt_tokens = int(usage.get("input_tokens") or 0) + cached
            self.cached_tokens = cached
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            self._text(delta.get("text") or delta.get("thinking") or delta.get("partial_json"), now)
        elif kind == "message_delta":
            usage = data.get("usage") or {}
            if "output_tokens" in usage:
                self.completion_tokens = usage["output_tokens"]
            self.finish_reason = (data.get("delta") or {}).get("stop_reason") or self.finish_reason

    def result(self, finished: float, *, prompt_estimate: int = 0) -> RequestResult:
        has_usage = self.completion_tokens is not None
        if self.error is None and self.first_token is None and not has_usage:
            self.error = "the stream ended without a reply"
        return RequestResult(
            started=self.started,
            finished=finished,
            first_token=self.first_token,
            last_token=self.last_token,
            prompt_tokens=self.prompt_tokens if self.prompt_tokens is not None else prompt_estimate,
            completion_tokens=self.completion_tokens if has_usage else self.chunks_with_text,
            cached_tokens=self.cached_tokens,
            finish_reason=self.finish_reason,
            usage_source="usage" if has_usage else "chunks",
            error=self.error,
            text="".join(self.parts),
        )


def error_text(error: Any) -> str:
    """A short line from any dialect's error envelope."""
    if isinstance(error, dict):
        error = error.get("message") or error.get("error") or json.dumps(error)
    return str(error)[:ERROR_TEXT_LIMIT]


# ---- drivers ----------------------------------------------------------------------------------


async def stream_chat(
    client: httpx.AsyncClient,
    target: Target,
    messages: ChatMessages,
    max_tokens: int,
    *,
    temperature: float = 0.0,
    prompt_estimate: int = 0,
) -> RequestResult:
    """Send one streaming chat request and time it. Never raises for server or network failures:
    they come back as `RequestResult.error`.

    A connection that fails before any response arrives is retried (up to `CONNECT_RETRIES`, as the
    openai SDK does); the time lost counts against the request's TTFT and `retries` says so.
    """
    body = chat_body(target, messages, max_tokens, stream=True, temperature=temperature)
    started = time.perf_counter()
    retries = 0
    while True:
        reader = StreamReader(target.dialect, started)
        answered = False
        try:
            async with client.stream(
                "POST", target.url + chat_path(target.dialect), json=body, headers=target.headers()
            ) as response:
                answered = True
                if response.status_code != 200:
                    await response.aread()
                    reader.error = f"HTTP {response.status_code}: {_body_error(response)}"
                else:
                    async for line in response.aiter_lines():
                        reader.feed(line, time.perf_counter())
        except httpx.TransportError as exc:
            timed_out = isinstance(exc, httpx.TimeoutException)
            if not answered and not timed_out and retries < CONNECT_RETRIES:
                retries += 1
                await asyncio.sleep(RETRY_BACKOFF_S * 2**retries)
                continue
            reader.error = f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT]
        result = reader.result(time.perf_counter(), prompt_estimate=prompt_estimate)
        return replace(result, retries=retries) if retries else result


async def count_prompt_tokens(client: httpx.AsyncClient, target: Target, messages: ChatMessages) -> int:
    """Prompt tokens the server counts for `messages`, from a non-streaming 1-token request."""
    body = chat_body(target, messages, 1, stream=False)
    response = await client.post(target.url + chat_path(target.dialect), json=body, headers=target.headers())
    if response.status_code != 200:
        raise RuntimeError(f"{target.label}: HTTP {response.status_code}: {_body_error(response)}")
    data = response.json()
    if target.dialect == "ollama":
        return int(data["prompt_eval_count"])
    usage = data.get("usage") or {}
    if target.dialect == "anthropic":
        return int(usage.get("input_tokens") or 0) + int(usage.get("cache_read_input_tokens") or 0)
    return int(usage["prompt_tokens"])


def _body_error(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:ERROR_TEXT_LIMIT]
    if isinstance(data, dict):
        return error_text(data.get("error") or data.get("detail") or data)
    return str(data)[:ERROR_TEXT_LIMIT]
