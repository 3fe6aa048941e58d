"""OpenAI Chat Completions, legacy Completions and Models: routes and rendering of events."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from quart import Blueprint, Response, jsonify

from kinfer.errors import EngineFailure, KinferError, PromptTooLong
from kinfer.protocol import (
    Delta,
    Done,
    ErrorEvent,
    FinishReason,
    TokenLogprob,
    ToolCall,
    ToolCallEvent,
    Usage,
)
from kinfer.scheduler import RequestStream
from kinfer.server.context import runtime
from kinfer.server.dialect import Dialect
from kinfer.server.logprobs_wire import completion_columns, token_entries
from kinfer.server.openai_wire import ChatCompletionRequest, CompletionRequest, completion_request, to_request
from kinfer.server.streaming import sse, streaming_response
from kinfer.server.wire import OPENAI_ERROR_SCHEMA, context_length_message, openai_type, read_body

log = logging.getLogger(__name__)

blueprint = Blueprint("openai", __name__)

FINISH: dict[FinishReason, str] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "deadline": "length",
    "cancelled": "stop",
    "error": "stop",
}


# ---- events -> wire ---------------------------------------------------------------------------


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
    }
    if index is not None:
        data = {"index": index, **data}
    return data


def chat_logprobs(stream: RequestStream, records: Sequence[TokenLogprob]) -> dict[str, Any] | None:
    """A choice's `logprobs`: null unless the request asked for them."""
    if stream.request.sampling.logprobs is None:
        return None
    return {"content": token_entries(records), "refusal": None}


def completion_logprobs(stream: RequestStream, records: Sequence[TokenLogprob], offset: int) -> dict | None:
    """A legacy completion choice's `logprobs` columns: null unless the request asked for them."""
    return None if stream.request.sampling.logprobs is None else completion_columns(records, offset)


def error_json(error: Exception) -> tuple[dict[str, Any], int]:
    """OpenAI's envelope: `{"error": {"message", "type", "param", "code"}}`, `code` a string or null."""
    if not isinstance(error, KinferError):
        error = EngineFailure(f"internal error: {type(error).__name__}: {error}")
    message, param = error.message, None
    if isinstance(error, PromptTooLong):
        param = "prompt" if error.raw_prompt else "messages"
        message = context_length_message(error, param)
    body = {"message": message, "type": openai_type(error), "param": param, "code": error.code}
    return {"error": body}, error.status


async def chat_completion_stream(
    stream: RequestStream, completion_id: str, model: str, include_usage: bool
) -> AsyncIterator[str]:
    created = int(time.time())
    # with include_usage, OpenAI gives every chunk a usage field: null until the last one
    no_usage = {"usage": None} if include_usage else {}

    def chunk(
        delta: dict[str, Any], finish: str | None = None, index: int = 0, logprobs: dict | None = None
    ) -> str:
        return sse(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "kinfer",
                "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                **no_usage,
            }
        )

    for index in range(stream.choices):
        yield chunk({"role": "assistant", "content": "", "refusal": None}, index=index)
    ended = 0
    async for event in stream.events():
        if isinstance(event, Delta):
            if event.kind == "thinking":
                yield chunk({"reasoning_content": event.text, "reasoning": event.text}, index=event.choice)
            else:
                logprobs = chat_logprobs(stream, event.logprobs)
                yield chunk({"content": event.text}, index=event.choice, logprobs=logprobs)
        elif isinstance(event, ToolCallEvent):
            yield chunk({"tool_calls": [tool_call_json(event.call, event.index)]}, index=event.choice)
        elif isinstance(event, Done):
            yield chunk({}, FINISH[event.reason], event.choice)
            ended += 1
            if include_usage and ended == stream.choices:  # the last choice's Done has the whole usage
                yield sse(
                    {
                        "id": completion_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage_json(event.usage),
                    }
                )
        elif isinstance(event, ErrorEvent):
            yield sse(error_json(event.error)[0])
    yield sse("[DONE]")


def chat_choice_json(
    index: int, text: str, thinking: str, calls: list[ToolCall], done: Done, logprobs: dict | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if thinking:
        message["reasoning_content"] = thinking
        message["reasoning"] = thinking
    if calls:
        message["tool_calls"] = [tool_call_json(c) for c in calls]
        if not text:
            message["content"] = None
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": FINISH[done.reason]}


async def chat_completion_body(stream: RequestStream, completion_id: str, model: str) -> dict[str, Any]:
    choices = await stream.collect_choices()
    done = max((c[3] for c in choices), key=lambda d: d.timings.total)  # the last to end
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "kinfer",
        "choices": [
            chat_choice_json(index, *choice, chat_logprobs(stream, stream.choice_logprobs[index]))
            for index, choice in enumerate(choices)
        ],
        "usage": usage_json(stream.usage()),
        "timings": {
            "prompt_s": done.timings.prompt,
            "decode_s": done.timings.decode,
            "total_s": done.timings.total,
        },
    }


# ---- routes -----------------------------------------------------------------------------------


def error_response(error: KinferError) -> Response:
    body, status = error_json(error)
    response = jsonify(body)
    response.status_code = status
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(error.retry_after)))
    return response


@blueprint.post("/v1/chat/completions")
@blueprint.post("/chat/completions")
async def chat_completions() -> Response:
    wire = await read_body(ChatCompletionRequest)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    request = to_request(wire, completion_id)
    stream = await runtime().scheduler.submit(request)
    model = stream.model
    if wire.stream:
        include_usage = bool(wire.stream_options and wire.stream_options.include_usage)
        body = chat_completion_stream(stream, completion_id, model, include_usage)
        await stream.wait_for_row()  # a queue timeout is still a 503, not an in-stream error
        return streaming_response(stream, body, "text/event-stream")
    try:
        return jsonify(await chat_completion_body(stream, completion_id, model))
    finally:
        stream.cancel()


async def completion_stream(
    stream: RequestStream, completion_id: str, model: str, echo: str, include_usage: bool
) -> AsyncIterator[str]:
    created = int(time.time())
    no_usage = {"usage": None} if include_usage else {}

    offsets = [len(echo)] * stream.choices  # where each choice's next piece starts, for text_offset

    def chunk(text: str, finish: str | None = None, index: int = 0, logprobs: dict | None = None) -> str:
        return sse(
            {
                "id": completion_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
                **no_usage,
            }
        )

    if echo:
        for index in range(stream.choices):
            yield chunk(echo, index=index)
    ended = 0
    async for event in stream.events():
        if isinstance(event, Delta):
            logprobs = completion_logprobs(stream, event.logprobs, offsets[event.choice])
            offsets[event.choice] += len(event.text)
            yield chunk(event.text, index=event.choice, logprobs=logprobs)
        elif isinstance(event, Done):
            yield chunk("", FINISH[event.reason], event.choice)
            ended += 1
            if include_usage and ended == stream.choices:  # the last choice's Done has the whole usage
                yield sse(
                    {
                        "id": completion_id,
                        "object": "text_completion",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage_json(event.usage),
                    }
                )
        elif isinstance(event, ErrorEvent):
            yield sse(error_json(event.error)[0])
    yield sse("[DONE]")


@blueprint.post("/v1/completions")
@blueprint.post("/completions")
async def completions() -> Response:
    wire = await read_body(CompletionRequest)
    completion_id = f"cmpl-{uuid.uuid4().hex}"
    request = completion_request(wire, completion_id)
    stream = await runtime().scheduler.submit(request)
    echo = request.raw_prompt if wire.echo else ""
    if wire.stream:
        include_usage = bool(wire.stream_options and wire.stream_options.include_usage)
        body = completion_stream(stream, completion_id, stream.model, echo or "", include_usage)
        await stream.wait_for_row()  # a queue timeout is still a 503, not an in-stream error
        return streaming_response(stream, body, "text/event-stream")
    try:
        choices = await stream.collect_choices()
    finally:
        stream.cancel()
    return jsonify(
        {
            "id": completion_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": stream.model,
            "choices": [
                {
                    "index": index,
                    "text": (echo or "") + text,
                    "logprobs": completion_logprobs(stream, stream.choice_logprobs[index], len(echo or "")),
                    "finish_reason": FINISH[done.reason],
                }
                for index, (text, _thinking, _calls, done) in enumerate(choices)
            ],
            "usage": usage_json(stream.usage()),
        }
    )


def model_json(model: Any) -> dict[str, Any]:
    return {"id": model.name, "object": "model", "created": int(model.modified), "owned_by": model.kind_label}


@blueprint.get("/v1/models")
@blueprint.get("/models")
async def list_models() -> Response:
    models = runtime().store.list()
    return jsonify({"object": "list", "data": [model_json(m) for m in models]})


@blueprint.get("/v1/models/<path:name>")
async def get_model(name: str) -> Response:
    return jsonify(model_json(runtime().store.resolve(name)))


DIALECT = Dialect(
    name="openai",
    prefixes=("/",),  # OpenAI's envelope is the default: every path no other dialect claims
    blueprint=blueprint,
    error_response=error_response,
    error_schema=OPENAI_ERROR_SCHEMA,
)
