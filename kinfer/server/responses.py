"""OpenAI Responses (`/v1/responses`): routes, stored responses and errors in OpenAI's shape.

Wire schemas and input translation live in `responses_wire`, tools (namespaces, hosted tools) in
`responses_tools`, input items (`item_reference`, `input_items`) in `responses_items`, rendering in
`responses_render`, the bounded store behind `previous_response_id` in `responses_store`. Each app
gets its own store when it registers this blueprint (in `app.extensions`, read with
`response_store()`), so stored responses go away with the server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from quart import Blueprint, Response, current_app, jsonify
from quart import request as http_request
from quart.blueprints import BlueprintSetupState

from kinfer.errors import EngineFailure, InvalidRequest, KinferError, PromptTooLong
from kinfer.protocol import ChatRequest, Done, ErrorEvent, Message
from kinfer.scheduler import RequestStream
from kinfer.server.context import runtime
from kinfer.server.dialect import Dialect
from kinfer.server.responses_items import input_item_records, list_page, resolve_references
from kinfer.server.responses_render import (
    OutputAssembler,
    ResponseContext,
    finish_status,
    new_id,
    response_json,
    usage_json,
)
from kinfer.server.responses_store import ResponseStore, StoredResponse
from kinfer.server.responses_tools import ToolSet, to_tools, warn_dropped
from kinfer.server.responses_wire import (
    InputItem,
    ResponsesBody,
    response_format,
    text_json,
    think_from,
    to_messages,
    tool_choice_name,
)
from kinfer.server.streaming import sse, streaming_response
from kinfer.server.wire import OPENAI_ERROR_SCHEMA, context_length_message, openai_type, read_body

log = logging.getLogger(__name__)

blueprint = Blueprint("responses", __name__)
STORE_KEY = "kinfer.responses.store"
DROPPED_TOOLS_KEY = "kinfer.responses.dropped_tool_types"  # tool types already warned of


@blueprint.record_once
def _make_store(state: BlueprintSetupState) -> None:
    state.app.extensions[STORE_KEY] = ResponseStore()
    state.app.extensions[DROPPED_TOOLS_KEY] = set()


def response_store() -> ResponseStore:
    """The running app's stored responses (needs the app context)."""
    return current_app.extensions[STORE_KEY]


class ResponseNotFound(KinferError):
    """An unknown response id (never stored, stored with `store: false`, deleted, or evicted)."""

    status = 404
    kind = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


# ---- request ----------------------------------------------------------------------------------


def previous_conversation(response_id: str | None) -> tuple[Message, ...]:
    if response_id is None:
        return ()
    stored = response_store().get(response_id)
    if stored is None:
        raise ResponseNotFound(
            f"Previous response with id '{response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return stored.conversation


def to_request(
    wire: ResponsesBody, response_id: str, items: str | list[InputItem], tools: ToolSet
) -> tuple[ChatRequest, tuple[Message, ...]]:
    """The internal request, and the conversation without instructions (what a follow-up continues).

    `items`: the input with its `item_reference`s resolved; `tools`: what `wire.tools` became."""
    history = previous_conversation(wire.previous_response_id)
    names = {call.id: call.name for m in history for call in m.tool_calls}
    conversation = history + tuple(to_messages(items, names))
    system = (Message("system", wire.instructions),) if wire.instructions else ()
    think, level = think_from(wire.reasoning)
    choice = tool_choice_name(wire.tool_choice)
    request = ChatRequest(
        model=wire.model,
        messages=system + conversation,
        tools=() if choice == "none" else tools.specs,
        tool_choice=choice,
        parallel_tool_calls=wire.parallel_tool_calls,
        response_format=response_format(wire.text),
        sampling=wire.sampling(),
        max_tokens=wire.max_output_tokens,
        think=think,
        think_level=level,
        truncation="drop_oldest" if wire.truncation == "auto" else "error",
        dialect="responses",
        request_id=response_id,
    )
    return request, conversation


def context_of(wire: ResponsesBody, response_id: str, model: str, tools: ToolSet) -> ResponseContext:
    reasoning = {
        "effort": wire.reasoning.effort if wire.reasoning else None,
        "summary": wire.reasoning.summary if wire.reasoning else None,
    }
    return ResponseContext(
        id=response_id,
        model=wire.model or model,
        created_at=int(time.time()),
        instructions=wire.instructions,
        tools=tools.echo,
        tool_choice=wire.tool_choice if wire.tool_choice is not None else "auto",
        parallel_tool_calls=wire.parallel_tool_calls,
        text=text_json(wire.text),
        temperature=wire.temperature,
        top_p=wire.top_p,
        max_output_tokens=wire.max_output_tokens,
        previous_response_id=wire.previous_response_id,
        reasoning=reasoning,
        store=wire.store,
        metadata=wire.metadata or {},
        user=wire.user,
        truncation=wire.truncation or "disabled",
    )


# ---- rendering --------------------------------------------------------------------------------


def error_json(error: Exception) -> tuple[dict[str, Any], int]:
    if not isinstance(error, KinferError):
        error = EngineFailure(f"internal error: {type(error).__name__}: {error}")
    message, param = error.message, getattr(error, "param", None)
    if isinstance(error, PromptTooLong):
        # Codex stops at once on this code (it retries a 413); the wording is OpenAI's
        message, param = context_length_message(error, "input"), "input"
    body = {"message": message, "type": openai_type(error), "param": param, "code": error.code}
    return {"error": body}, error.status


def error_response(error: KinferError) -> Response:
    body, status = error_json(error)
    response = jsonify(body)
    response.status_code = status
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(error.retry_after)))
    return response


def finished_body(ctx: ResponseContext, assembler: OutputAssembler, done: Done) -> dict[str, Any]:
    status, reason = finish_status(done)
    usage = usage_json(done.usage, assembler.reasoning_pieces)
    return response_json(ctx, status, assembler.output, usage=usage, incomplete_reason=reason)


def failed_body(ctx: ResponseContext, assembler: OutputAssembler, error: Exception) -> dict[str, Any]:
    detail = error_json(error)[0]["error"]
    failure = {"code": "server_error", "message": detail["message"]}
    return response_json(ctx, "failed", assembler.output, error=failure)


@dataclass(frozen=True)
class Turn:
    """One response being made: what it echoes, the conversation it continues, where it is kept."""

    ctx: ResponseContext
    conversation: tuple[Message, ...]
    store: ResponseStore  # taken in the handler: a streaming body runs outside the app context
    tools: ToolSet
    input_items: tuple[dict[str, Any], ...]

    def assembler(self) -> OutputAssembler:
        return OutputAssembler(self.tools.split)

    def remember(self, body: dict[str, Any], a: OutputAssembler) -> None:
        if not self.ctx.store:
            return
        thinking = "".join(a.thinking) or None
        reply = Message("assistant", "".join(a.texts), thinking=thinking, tool_calls=tuple(a.calls))
        self.store.put(self.ctx.id, StoredResponse(body, (*self.conversation, reply), self.input_items))


async def response_stream(stream: RequestStream, turn: Turn) -> AsyncIterator[str]:
    ctx = turn.ctx
    assembler = turn.assembler()

    def out(data: dict[str, Any]) -> str:
        return sse(data, event=data["type"])

    yield out(assembler.event("response.created", response=response_json(ctx, "in_progress", [])))
    yield out(assembler.event("response.in_progress", response=response_json(ctx, "in_progress", [])))
    async for event in stream.events():
        if isinstance(event, ErrorEvent):
            for data in assembler.finish("incomplete"):
                yield out(data)
            yield out(assembler.event("response.failed", response=failed_body(ctx, assembler, event.error)))
            return
        if isinstance(event, Done):
            status, _ = finish_status(event)
            for data in assembler.finish(status):
                yield out(data)
            body = finished_body(ctx, assembler, event)
            turn.remember(body, assembler)
            yield out(assembler.event(f"response.{body['status']}", response=body))
            return
        for data in assembler.feed(event):
            yield out(data)


async def response_body(stream: RequestStream, turn: Turn) -> dict[str, Any]:
    ctx = turn.ctx
    assembler = turn.assembler()
    async for event in stream.events():
        if isinstance(event, ErrorEvent):
            raise event.error
        if isinstance(event, Done):
            assembler.finish(finish_status(event)[0])
            body = finished_body(ctx, assembler, event)
            turn.remember(body, assembler)
            return body
        assembler.feed(event)
    raise EngineFailure("the reply ended without finishing")  # pragma: no cover


# ---- routes -----------------------------------------------------------------------------------


@blueprint.post("/v1/responses")
@blueprint.post("/responses")
async def create_response() -> Response:
    wire = await read_body(ResponsesBody)
    response_id = new_id("resp")
    store = response_store()
    tools = to_tools(wire.tools)
    warn_dropped(current_app.extensions[DROPPED_TOOLS_KEY], tools.dropped)
    items = resolve_references(wire.input, store.find_item)
    request, conversation = to_request(wire, response_id, items, tools)
    stream = await runtime().scheduler.submit(request)
    records = tuple(input_item_records(items, new_id))
    turn = Turn(context_of(wire, response_id, stream.model, tools), conversation, store, tools, records)
    if wire.stream:
        await stream.wait_for_row()  # a queue timeout is still a 503, not an in-stream error
        return streaming_response(stream, response_stream(stream, turn), "text/event-stream")
    try:
        return jsonify(await response_body(stream, turn))
    finally:
        stream.cancel()


@blueprint.get("/v1/responses/<response_id>")
@blueprint.get("/responses/<response_id>")
async def get_response(response_id: str) -> Response:
    stored = response_store().get(response_id)
    if stored is None:
        raise ResponseNotFound(f"Response with id '{response_id}' not found.")
    return jsonify(stored.body)


@blueprint.get("/v1/responses/<response_id>/input_items")
@blueprint.get("/responses/<response_id>/input_items")
async def list_input_items(response_id: str) -> Response:
    stored = response_store().get(response_id)
    if stored is None:
        raise ResponseNotFound(f"Response with id '{response_id}' not found.")
    args = http_request.args
    try:
        limit = int(args["limit"]) if "limit" in args else None
    except ValueError:
        raise InvalidRequest("limit must be a whole number") from None
    page = list_page(list(stored.input_items), after=args.get("after"), limit=limit, order=args.get("order"))
    return jsonify(page)


@blueprint.delete("/v1/responses/<response_id>")
@blueprint.delete("/responses/<response_id>")
async def delete_response(response_id: str) -> Response:
    if not response_store().delete(response_id):
        raise ResponseNotFound(f"Response with id '{response_id}' not found.")
    return jsonify({"id": response_id, "object": "response", "deleted": True})


DIALECT = Dialect(
    name="responses",
    prefixes=("/v1/responses", "/responses"),
    blueprint=blueprint,
    error_response=error_response,
    error_schema=OPENAI_ERROR_SCHEMA,
)
