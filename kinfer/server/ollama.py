"""Ollama's native API (/api/*): routes for chat, generate and model management, NDJSON streaming."""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any

from quart import Blueprint, Response, jsonify

from kinfer.engines.memory_account import byte_kinds
from kinfer.errors import KinferError, PromptTooLong
from kinfer.protocol import (
    Delta,
    Done,
    ErrorEvent,
    TokenLogprob,
    ToolCall,
    ToolCallEvent,
)
from kinfer.scheduler import RequestStream
from kinfer.server.context import runtime
from kinfer.server.dialect import Dialect
from kinfer.server.logprobs_wire import token_entries
from kinfer.server.ollama_wire import (
    ChatBody,
    CopyBody,
    GenerateBody,
    KeepAlive,
    NameBody,
    keep_alive_seconds,
    require_model,
    to_chat_request,
    to_generate_request,
)
from kinfer.server.streaming import ndjson, streaming_response
from kinfer.server.wire import read_body

log = logging.getLogger(__name__)

blueprint = Blueprint("ollama", __name__)

OLLAMA_VERSION = "0.13.0"  # the API level we speak; clients gate features on it
NDJSON = "application/x-ndjson"
DONE_REASON = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "stop",
    "deadline": "length",
    "cancelled": "stop",
    "error": "stop",
}


# ---- rendering --------------------------------------------------------------------------------


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def final_fields(done: Done) -> dict[str, Any]:
    t = done.timings
    return {
        "done_reason": DONE_REASON[done.reason],
        "total_duration": int(t.total * 1e9),
        "load_duration": int(t.load * 1e9),
        "prompt_eval_count": done.usage.prompt_tokens,
        "prompt_eval_duration": int(t.prompt * 1e9),
        "eval_count": done.usage.completion_tokens,
        "eval_duration": int(t.decode * 1e9),
    }


def tool_call_json(call: ToolCall, index: int) -> dict[str, Any]:
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": call.arguments}}


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}


def error_message(error: KinferError) -> str:
    if isinstance(error, PromptTooLong):
        why = f" ({error.why})" if error.why else ""
        size = f"{error.prompt_tokens} tokens > {error.limit}"
        return f"the input length exceeds the context length: {size}{why}"
    return error.message


def error_response(error: KinferError) -> Response:
    response = jsonify({"error": error_message(error)})
    response.status_code = error.status
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(error.retry_after)))
    return response


def logprobs_field(stream: RequestStream, records: Sequence[TokenLogprob]) -> dict[str, Any]:
    """Ollama's `logprobs` on a chunk or a whole reply, when the request asked for them."""
    if stream.request.sampling.logprobs is None or not records:
        return {}
    return {"logprobs": token_entries(records)}


def error_line(error: Exception) -> str:
    return ndjson({"error": error_message(error) if isinstance(error, KinferError) else str(error)})


async def chat_stream(stream: RequestStream, model: str) -> AsyncIterator[str]:
    async for event in stream.events():
        if isinstance(event, Delta):
            message = {"role": "assistant", "content": ""}
            message["thinking" if event.kind == "thinking" else "content"] = event.text
            lp = logprobs_field(stream, event.logprobs) if event.kind == "text" else {}
            yield ndjson(
                {"model": model, "created_at": now_rfc3339(), "message": message, "done": False, **lp}
            )
        elif isinstance(event, ToolCallEvent):
            message = {
                "role": "assistant",
                "content": "",
                "tool_calls": [tool_call_json(event.call, event.index)],
            }
            yield ndjson({"model": model, "created_at": now_rfc3339(), "message": message, "done": False})
        elif isinstance(event, Done):
            yield ndjson(
                {
                    "model": model,
                    "created_at": now_rfc3339(),
                    "message": {"role": "assistant", "content": ""},
                    "done": True,
                    **final_fields(event),
                }
            )
        elif isinstance(event, ErrorEvent):
            yield error_line(event.error)


def context_field(stream: RequestStream) -> dict[str, Any]:
    """Ollama's `context` (prompt + reply as token ids) on a generate reply; raw prompts have none."""
    return {"context": list(stream.context)} if stream.context is not None else {}


async def generate_stream(stream: RequestStream, model: str) -> AsyncIterator[str]:
    async for event in stream.events():
        if isinstance(event, Delta):
            field = "thinking" if event.kind == "thinking" else "response"
            chunk = {"model": model, "created_at": now_rfc3339(), "response": "", "done": False}
            chunk[field] = event.text
            yield ndjson(
                {**chunk, **(logprobs_field(stream, event.logprobs) if event.kind == "text" else {})}
            )
        elif isinstance(event, Done):
            yield ndjson(
                {
                    "model": model,
                    "created_at": now_rfc3339(),
                    "response": "",
                    "done": True,
                    **context_field(stream),
                    **final_fields(event),
                }
            )
        elif isinstance(event, ErrorEvent):
            yield error_line(event.error)


# ---- generation routes ------------------------------------------------------------------------


@blueprint.post("/api/chat")
async def chat() -> Response:
    body = await read_body(ChatBody)
    require_model(body)
    if not body.messages:
        return await load_or_unload(body.model, body.keep_alive, chat=True)
    stream = await runtime().scheduler.submit(to_chat_request(body, f"ollama-{uuid.uuid4().hex}"))
    if body.stream:
        await stream.wait_for_row()  # a queue timeout is still a 503, not an in-stream error
        return streaming_response(stream, chat_stream(stream, stream.model), NDJSON)
    try:
        text, thinking, calls, done = await stream.collect()
    finally:
        stream.cancel()
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = [tool_call_json(c, i) for i, c in enumerate(calls)]
    return jsonify(
        {
            "model": stream.model,
            "created_at": now_rfc3339(),
            "message": message,
            "done": True,
            **final_fields(done),
            **logprobs_field(stream, stream.logprobs),
        }
    )


@blueprint.post("/api/generate")
async def generate() -> Response:
    body = await read_body(GenerateBody)
    require_model(body)
    if not body.prompt and not body.raw:
        return await load_or_unload(body.model, body.keep_alive, chat=False)
    stream = await runtime().scheduler.submit(to_generate_request(body, f"ollama-{uuid.uuid4().hex}"))
    if body.stream:
        await stream.wait_for_row()  # a queue timeout is still a 503, not an in-stream error
        return streaming_response(stream, generate_stream(stream, stream.model), NDJSON)
    try:
        text, thinking, _calls, done = await stream.collect()
    finally:
        stream.cancel()
    reply: dict[str, Any] = {
        "model": stream.model,
        "created_at": now_rfc3339(),
        "response": text,
        "done": True,
        **context_field(stream),
        **final_fields(done),
        **logprobs_field(stream, stream.logprobs),
    }
    if thinking:
        reply["thinking"] = thinking
    return jsonify(reply)


async def load_or_unload(name: str, keep_alive: KeepAlive, *, chat: bool) -> Response:
    """Ollama's way to load a model (empty prompt) or unload it (empty prompt + keep_alive 0).

    As in Ollama, an unload waits for the replies in flight: it never cuts another client's reply."""
    scheduler = runtime().scheduler
    seconds = keep_alive_seconds(keep_alive)
    model = scheduler.resolve(name or None)
    if seconds == 0:
        await scheduler.unload_when_idle(model.name)
        reason = "unload"
    else:
        await scheduler.load(model.name, keep_alive=seconds)
        reason = "load"
    body: dict[str, Any] = {
        "model": model.name,
        "created_at": now_rfc3339(),
        "done": True,
        "done_reason": reason,
    }
    body.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return jsonify(body)


# ---- model management -------------------------------------------------------------------------


def details_json(model: Any) -> dict[str, Any]:
    from kinfer.store.inspect import describe

    try:
        d = describe(model)
    except Exception as exc:  # a model we cannot read is still listed
        log.warning("cannot describe %s: %s", model.name, exc)
        return {
            "parent_model": "",
            "format": model.format,
            "family": "",
            "families": None,
            "parameter_size": "",
            "quantization_level": "",
        }
    return {
        "parent_model": "",
        "format": model.format,
        "family": d.architecture or "",
        "families": [d.architecture] if d.architecture else None,
        "parameter_size": human_parameters(d.parameters),
        "quantization_level": d.quantization or "",
    }


def human_parameters(count: int | None) -> str:
    if not count:
        return ""
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    return f"{count / 1e6:.0f}M"


def digest_of(model: Any) -> str:
    manifest = getattr(model, "manifest", None)
    if manifest and manifest.files and manifest.files[0].sha256:
        return manifest.files[0].sha256
    return uuid.uuid5(uuid.NAMESPACE_URL, str(model.path)).hex


LAST_TIMESTAMP = 253402300799.0  # 9999-12-31T23:59:59Z, the last instant `datetime` can show


def iso(timestamp: float) -> str:
    # a keep_alive of 1e300 seconds is legal; its expiry shows as the end of time, not as a 500
    if not math.isfinite(timestamp) or timestamp > LAST_TIMESTAMP:
        timestamp = LAST_TIMESTAMP
    return datetime.fromtimestamp(max(0.0, timestamp), UTC).isoformat().replace("+00:00", "Z")


def tag_json(model: Any) -> dict[str, Any]:
    return {
        "name": model.name,
        "model": model.name,
        "modified_at": iso(model.modified),
        "size": model.size,
        "digest": digest_of(model),
        "details": details_json(model),
    }


@blueprint.get("/api/tags")
async def tags() -> Response:
    await runtime().scheduler.forget_removed()  # a model `kinfer rm` deleted elsewhere is not "loaded"
    return jsonify({"models": [tag_json(m) for m in runtime().store.list()]})


@blueprint.post("/api/show")
async def show() -> Response:
    from kinfer.store.inspect import describe

    body = await read_body(NameBody)
    model = runtime().store.resolve(body.target())
    d = describe(model)
    arch = d.architecture or "unknown"
    return jsonify(
        {
            "license": "",
            "modelfile": f"# kinfer model\nFROM {model.path}\n",
            "parameters": "",
            "template": d.chat_template or "",
            "details": details_json(model),
            "model_info": {
                "general.architecture": arch,
                "general.parameter_count": d.parameters or 0,
                f"{arch}.context_length": d.context_length or 0,
                # hermes | qwen3_5_xml | default (kinfer's own tool prompt) | none
                "kinfer.tool_format": d.tool_format,
            },
            "capabilities": list(d.capabilities),
            "modified_at": iso(model.modified),
        }
    )


@blueprint.get("/api/ps")
async def ps() -> Response:
    await runtime().scheduler.forget_removed()  # a model `kinfer rm` deleted elsewhere unloads when idle
    models = []
    for loaded in runtime().scheduler.loaded_models():
        expires = (
            "0001-01-01T00:00:00Z"
            if loaded.expires_at is None
            else iso(time.time() + max(0.0, loaded.expires_at - time.monotonic()))
        )
        model = loaded.model
        models.append(
            {
                "name": model.name,
                "model": model.name,
                "size": model.size,
                "digest": digest_of(model),
                "details": details_json(model),
                "expires_at": expires,
                "size_vram": 0,
                "context_length": loaded.info.context_length,
                # kinfer's memory account of the loaded engine (engines/memory_account.py), in bytes
                "memory": byte_kinds(loaded.worker.stats.memory),
            }
        )
    return jsonify({"models": models})


@blueprint.get("/api/version")
async def version() -> Response:
    return jsonify({"version": OLLAMA_VERSION})


@blueprint.delete("/api/delete")
async def delete() -> Response:
    body = await read_body(NameBody)
    rt = runtime()
    model = rt.store.resolve_exact(body.target())  # never a prefix: `o/b` is not `hf.co/o/Beta:q4`
    if not model.is_alias:  # an alias is only a name: the model behind it stays, loaded or not
        await rt.scheduler.unload_matching(lambda loaded: loaded.path == model.path)
    rt.store.remove(model.name)
    if model.alias_of is not None:
        rt.scheduler.forget_alias(model.name, model.alias_of)
    return Response("", status=200)


@blueprint.post("/api/copy")
async def copy() -> Response:
    body = await read_body(CopyBody)
    runtime().store.copy(body.source, body.destination)
    return Response("", status=200)


@blueprint.post("/api/pull")
async def pull() -> Response:
    from kinfer.store.background_pull import BackgroundPull
    from kinfer.store.refs import parse_ref

    body = await read_body(NameBody)
    ref = body.target()
    parse_ref(ref)  # a malformed reference is a 400 here, not a 200 whose stream holds the error
    pulling = BackgroundPull(runtime().store, ref)

    async def lines() -> AsyncIterator[dict[str, Any]]:
        try:
            async with aclosing(pulling.events()) as events:  # a client that leaves cancels the pull
                async for progress in events:
                    yield progress.ollama_status()
            yield {"status": "success"}
        except KinferError as exc:
            yield {"error": exc.message, "_status": exc.status}
        except Exception as exc:
            log.exception("pull %s failed", ref)
            yield {"error": str(exc), "_status": 500}

    if not body.stream:
        last: dict[str, Any] = {}
        async for line in lines():
            last = line
        if "error" in last:
            response = jsonify({"error": last["error"]})
            response.status_code = last.get("_status", 500)
            return response
        return jsonify({"status": "success"})

    async def stream_lines() -> AsyncIterator[str]:
        async with aclosing(lines()) as source:
            async for line in source:
                line.pop("_status", None)
                yield ndjson(line)

    response = Response(stream_lines(), mimetype=NDJSON)
    response.timeout = None
    return response


@blueprint.route("/", methods=["GET", "HEAD"])
async def root() -> Response:
    return Response("Ollama is running", mimetype="text/plain")


DIALECT = Dialect(
    name="ollama",
    prefixes=("/api/",),
    blueprint=blueprint,
    error_response=error_response,
    error_schema=ERROR_SCHEMA,
)
