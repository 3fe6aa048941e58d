"""Anthropic Messages (`/v1/messages`, `/v1/messages/count_tokens`): rendering and routes.

Wire schemas and their translation live in `anthropic_wire`. Streaming and non-streaming replies are
built by the same `MessageAssembler`, so both always agree on the blocks.

`stop_sequences` become the request's stop strings like every dialect's: the engine matches them and
`Done.stop_string` says which one ended the reply, reported as `stop_reason: "stop_sequence"` with
`stop_sequence` set to it.

Usage follows Anthropic's meaning: `input_tokens` are the prompt tokens computed afresh,
`cache_read_input_tokens` those adopted from the prefix pool; their sum is the whole prompt.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint, Response, g, has_app_context, jsonify

from kinfer.errors import Busy, EngineFailure, KinferError, PromptTooLong
from kinfer.protocol import Delta, Done, ErrorEvent, Event, ToolCallEvent
from kinfer.scheduler import RequestStream
from kinfer.server.anthropic_wire import CountTokensBody, MessagesBody, to_request, tool_use_id
from kinfer.server.context import runtime
from kinfer.server.dialect import Dialect
from kinfer.server.streaming import sse, streaming_response
from kinfer.server.wire import read_body

log = logging.getLogger(__name__)

blueprint = Blueprint("anthropic", __name__)

PING_INTERVAL_S = 10.0  # a ping after this much silence keeps proxies and clients from timing out
# Anthropic's own status for overloaded_error. The SDK retries any 5xx (honouring Retry-After), but only
# 529 becomes its OverloadedError, which is what Anthropic clients (Claude Code among them) look for.
OVERLOADED_STATUS = 529
STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "deadline": "max_tokens",
    "tool_calls": "tool_use",
    "cancelled": "end_turn",
    "error": "end_turn",
}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


# ---- events -> content blocks -----------------------------------------------------------------


def usage_json(prompt_tokens: int, cached: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": max(0, prompt_tokens - cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output_tokens,
    }


def signature_of(thinking: str) -> str:
    # Anthropic signs thinking so it can be sent back unchanged; ours only has to be stable
    return "kinfer-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


class MessageAssembler:
    """Events in order -> Anthropic stream events, and the final content blocks.

    Consecutive deltas of one kind share a block; each tool call is a block of its own.
    """

    def __init__(self) -> None:
        self.content: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """Stream events (each a dict with its `type`) for one engine event."""
        if isinstance(event, Delta):
            return self._append("thinking" if event.kind == "thinking" else "text", event.text)
        if isinstance(event, ToolCallEvent):
            out = self._close()
            block = {
                "type": "tool_use",
                "id": tool_use_id(event.call.id),
                "name": event.call.name,
                "input": event.call.arguments,
            }
            index = len(self.content)
            self.content.append(block)
            out.append(
                {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            )
            partial = json.dumps(event.call.arguments, ensure_ascii=False)
            out.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": partial},
                }
            )
            out.append({"type": "content_block_stop", "index": index})
            return out
        return []

    def finish(self) -> list[dict[str, Any]]:
        """Close the open block."""
        return self._close()

    def _append(self, kind: str, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        out: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != kind:
            out = self._close()
            self._open = {"type": kind, kind: ""}
            if kind == "thinking":
                self._open["signature"] = ""
            self.content.append(self._open)
            out.append(
                {
                    "type": "content_block_start",
                    "index": len(self.content) - 1,
                    "content_block": dict(self._open),
                }
            )
        self._open[kind] += text
        delta_type = "thinking_delta" if kind == "thinking" else "text_delta"
        out.append(
            {
                "type": "content_block_delta",
                "index": len(self.content) - 1,
                "delta": {"type": delta_type, kind: text},
            }
        )
        return out

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index = len(self.content) - 1
        out = []
        if self._open["type"] == "thinking":
            self._open["signature"] = signature_of(self._open["thinking"])
            out.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": self._open["signature"]},
                }
            )
        out.append({"type": "content_block_stop", "index": index})
        self._open = None
        return out


async def with_pings(events: AsyncIterator[Event], interval: float) -> AsyncIterator[Event | None]:
    """`events`, with a None after every `interval` seconds of silence.

    The pending read is a task that survives the timeout: cancelling it would close the event stream.
    """
    iterator = aiter(events)
    pending: asyncio.Future[Event] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                yield task.result()
            except StopAsyncIteration:
                return
    finally:
        if pending is not None:
            pending.cancel()


# ---- rendering --------------------------------------------------------------------------------

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error", "request_id"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
        "request_id": {"type": "string"},
    },
}


def new_ids() -> tuple[str, str]:
    """A message id and the request id that goes with it (`msg_...`, `req_...`)."""
    token = uuid.uuid4().hex[:24]
    return f"msg_{token}", f"req_{token}"


def request_id() -> str:
    """This request's `req_...` id, made on first use; every error body and header carries it."""
    if not has_app_context():
        return new_ids()[1]
    if "anthropic_request_id" not in g:
        g.anthropic_request_id = new_ids()[1]
    return g.anthropic_request_id


def error_message(error: KinferError) -> str:
    if isinstance(error, PromptTooLong):
        # Anthropic's own wording: Claude Code and the SDKs read the two numbers from it
        maximum = max(0, error.limit - 1)  # a prompt must leave a token of the row for the reply
        why = f" ({error.why})" if error.why else ""
        return f"prompt is too long: {error.prompt_tokens} tokens > {maximum} maximum{why}"
    return error.message


def error_body(error: Exception, req_id: str) -> tuple[dict[str, Any], int]:
    """Anthropic's envelope, `{"type": "error", "error": {"type", "message"}, "request_id"}`, and its
    status."""
    if not isinstance(error, KinferError):
        error = EngineFailure(f"internal error: {type(error).__name__}: {error}")
    status = OVERLOADED_STATUS if isinstance(error, Busy) else error.status
    if isinstance(error, Busy):
        kind = "overloaded_error"
    elif status >= 500:
        kind = "api_error"
    else:
        kind = ERROR_TYPES.get(status, "invalid_request_error")
    body = {"type": "error", "error": {"type": kind, "message": error_message(error)}, "request_id": req_id}
    return body, status


def error_response(error: KinferError) -> Response:
    req_id = request_id()
    body, status = error_body(error, req_id)
    response = jsonify(body)
    response.status_code = status
    response.headers["request-id"] = req_id
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(error.retry_after)))
    return response


def stop_reason(done: Done) -> str:
    return "stop_sequence" if done.stop_string is not None else STOP_REASON[done.reason]


def message_json(message_id: str, model: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
    }


def event_sse(data: dict[str, Any]) -> str:
    return sse(data, event=data["type"])


async def message_stream(stream: RequestStream, ids: tuple[str, str], model: str) -> AsyncIterator[str]:
    message_id, req_id = ids
    assembler = MessageAssembler()
    start = message_json(message_id, model, [])
    # the row was taken (wait_for_row) and the prefix pool consulted: the cached/fresh split is known
    start["usage"] = usage_json(stream.prompt_tokens, stream.reused, 0)
    yield event_sse({"type": "message_start", "message": start})
    yield event_sse({"type": "ping"})  # Anthropic sends one straight away too
    async for event in with_pings(stream.events(), PING_INTERVAL_S):
        if event is None:
            yield event_sse({"type": "ping"})
        elif isinstance(event, ErrorEvent):
            yield event_sse(error_body(event.error, req_id)[0])
            return
        elif isinstance(event, Done):
            for data in assembler.finish():
                yield event_sse(data)
            usage = usage_json(
                event.usage.prompt_tokens, event.usage.cached_tokens, event.usage.completion_tokens
            )
            yield event_sse(
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": stop_reason(event),
                        "stop_sequence": event.stop_string,
                    },
                    "usage": usage,
                }
            )
            yield event_sse({"type": "message_stop"})
        else:
            for data in assembler.feed(event):
                yield event_sse(data)


async def message_body(stream: RequestStream, message_id: str, model: str) -> dict[str, Any]:
    assembler = MessageAssembler()
    async for event in stream.events():
        if isinstance(event, ErrorEvent):
            raise event.error
        if isinstance(event, Done):
            assembler.finish()
            body = message_json(message_id, model, assembler.content)
            body["stop_reason"] = stop_reason(event)
            body["stop_sequence"] = event.stop_string
            usage = event.usage
            body["usage"] = usage_json(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
            return body
        assembler.feed(event)
    raise EngineFailure("the reply ended without finishing")  # pragma: no cover


# ---- routes -----------------------------------------------------------------------------------


def with_request_id(response: Response, req_id: str) -> Response:
    response.headers["request-id"] = req_id
    return response


@blueprint.post("/v1/messages")
async def create_message() -> Response:
    message_id, req_id = new_ids()
    g.anthropic_request_id = req_id  # errors from here on carry the id this message would have had
    wire = await read_body(MessagesBody)
    request = to_request(wire, message_id)
    stream = await runtime().scheduler.submit(request)
    model = wire.model or stream.model
    if wire.stream:
        body = message_stream(stream, (message_id, req_id), model)
        await stream.wait_for_row()  # a queue timeout is still a 529, not an in-stream error
        return with_request_id(streaming_response(stream, body, "text/event-stream"), req_id)
    try:
        reply = await message_body(stream, message_id, model)
    finally:
        stream.cancel()
    return with_request_id(jsonify(reply), req_id)


@blueprint.post("/v1/messages/count_tokens")
async def count_tokens() -> Response:
    wire = await read_body(CountTokensBody)
    request = to_request(wire, f"count_{uuid.uuid4().hex[:24]}")
    tokens = await runtime().scheduler.count_tokens(request)
    return jsonify({"input_tokens": tokens})


DIALECT = Dialect(
    name="anthropic",
    prefixes=("/v1/messages",),
    blueprint=blueprint,
    error_response=error_response,
    error_schema=ERROR_SCHEMA,
)
