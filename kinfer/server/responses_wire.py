"""OpenAI Responses: wire schemas and the translation of `input` items into internal messages.

Output items sent back as input fold into one assistant message each, the way the chat template
expects them: `reasoning` items give its `thinking`, `message` items its text, `function_call` items
its `tool_calls` (a namespaced call under its flat name, see responses_tools). A
`function_call_output` item becomes a `tool` message named after its call. `item_reference` items
are resolved against stored items first (responses_items).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from kinfer.errors import InvalidRequest
from kinfer.protocol import Message, ResponseFormat, Sampling, ThinkLevel, ToolCall
from kinfer.server.logprobs_wire import top_count
from kinfer.server.responses_tools import flat_name
from kinfer.server.wire import WireModel, loads_arguments, tool_choice_mode

log = logging.getLogger(__name__)

TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text", "refusal"})
MEDIA_PARTS = frozenset({"input_image", "input_file", "input_audio", "image_url", "image"})
EFFORT_LEVELS: dict[str, ThinkLevel] = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
}


# ---- wire schemas ---------------------------------------------------------------------------


class Part(WireModel):
    type: str
    text: str | None = None
    refusal: str | None = None


class InputItem(WireModel):
    """One `input` item of any type (a message without `type` is a message)."""

    type: str | None = None
    id: str | None = None
    status: str | None = None
    # message
    role: str | None = None
    content: str | list[Part] | None = None
    # function_call / function_call_output
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None  # a function that came in a `namespace` tool (Codex's MCP tools)
    arguments: str | dict[str, Any] | None = None
    output: str | list[Part] | None = None
    # reasoning
    summary: list[Part] | None = None


class WireTool(WireModel):
    """A function tool, a `namespace` of function tools (`tools`), or a hosted tool (dropped)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    tools: list[WireTool] | None = None


class TextFormat(WireModel):
    """`text.format`: {"type": "text"}, {"type": "json_object"}, or {"type": "json_schema", name, schema,
    strict}."""

    type: str = "text"
    name: str = ""
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(WireModel):
    format: TextFormat | None = None
    verbosity: str | None = None


class Reasoning(WireModel):
    effort: str | None = None
    summary: str | None = None


LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the `include` entry that asks for logprobs


class ResponsesBody(WireModel):
    model: str = ""
    input: str | list[InputItem] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[WireTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    reasoning: Reasoning | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    text: TextConfig | None = None
    # "auto": drop the oldest input items (never the instructions) until the input fits
    truncation: Literal["auto", "disabled"] | None = "disabled"
    include: list[str] | None = None
    top_logprobs: int | None = None

    def sampling(self) -> Sampling:
        wanted = LOGPROBS_INCLUDE in (self.include or ())
        top = top_count(wanted, self.top_logprobs)
        return Sampling(logprobs=top).given(temperature=self.temperature, top_p=self.top_p)


# ---- translation ------------------------------------------------------------------------------


def parts_text(content: str | list[Part] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for i, part in enumerate(content):
        if part.type in MEDIA_PARTS:
            raise InvalidRequest(f"{where}.{i}: part of type {part.type!r}: kinfer serves text-only models")
        if part.type not in TEXT_PARTS:
            raise InvalidRequest(f"{where}.{i}: unknown content part type {part.type!r}")
        texts.append(part.text if part.text is not None else part.refusal or "")
    return "".join(texts)


def parse_arguments(arguments: str | dict[str, Any] | None, where: str) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = loads_arguments(arguments, f"{where}.arguments")
    except json.JSONDecodeError:
        raise InvalidRequest(f"{where}.arguments: not valid JSON") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where}.arguments: must be a JSON object")
    return value


@dataclass
class _Turn:
    """An assistant turn being gathered from consecutive output items."""

    texts: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)

    def message(self) -> Message | None:
        if not (self.texts or self.thinking or self.calls):
            return None
        thinking = "\n\n".join(self.thinking) if self.thinking else None
        return Message("assistant", "".join(self.texts), thinking=thinking, tool_calls=tuple(self.calls))


def to_messages(items: str | list[InputItem], names: dict[str, str]) -> list[Message]:
    """`input` as internal messages. `names` maps call ids to tool names (earlier turns' calls too)."""
    if isinstance(items, str):
        return [Message("user", items)]
    messages: list[Message] = []
    turn = _Turn()

    def flush() -> None:
        nonlocal turn
        if (message := turn.message()) is not None:
            messages.append(message)
        turn = _Turn()

    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.type or "message"
        if kind == "message":
            role = {"developer": "system"}.get(item.role or "", item.role)
            if role not in ("system", "user", "assistant"):
                raise InvalidRequest(f"{where}.role: must be user, assistant, system or developer")
            text = parts_text(item.content, f"{where}.content")
            if role == "assistant":
                turn.texts.append(text)
                continue
            flush()
            messages.append(Message(role, text))  # type: ignore[arg-type]
        elif kind == "reasoning":
            if turn.texts or turn.calls:
                flush()  # reasoning opens a new turn
            summary = parts_text(list(item.summary or []), f"{where}.summary")
            body = parts_text(item.content, f"{where}.content") if isinstance(item.content, list) else ""
            if body or summary:
                turn.thinking.append(body or summary)
        elif kind == "function_call":
            if not item.call_id or not item.name:
                raise InvalidRequest(f"{where}: a function_call needs call_id and name")
            name = flat_name(item.namespace, item.name) if item.namespace else item.name
            names[item.call_id] = name
            turn.calls.append(ToolCall(item.call_id, name, parse_arguments(item.arguments, where)))
        elif kind == "function_call_output":
            if not item.call_id:
                raise InvalidRequest(f"{where}.call_id: Field required")
            flush()
            output = parts_text(item.output, f"{where}.output")
            messages.append(Message("tool", output, tool_call_id=item.call_id, name=names.get(item.call_id)))
        elif kind == "item_reference":  # resolved before translation (responses_items)
            raise InvalidRequest(f"{where}: an item_reference that was not resolved")
        else:
            log.info("dropping input item of type %r: kinfer serves function tools only", kind)
    flush()
    return messages


def tool_choice_name(choice: str | dict[str, Any] | None) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return tool_choice_mode(choice)
    if choice.get("type") == "function" and choice.get("name"):
        return str(choice["name"])
    if choice.get("type") == "allowed_tools":
        return str(choice.get("mode") or "auto")
    raise InvalidRequest("tool_choice: give {'type': 'function', 'name': ...}")


def response_format(text: TextConfig | None) -> ResponseFormat | None:
    """`text.format` as the internal response format (None: free text)."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat("json_object")
    if fmt.type != "json_schema":
        raise InvalidRequest("text.format.type must be 'text', 'json_object' or 'json_schema'")
    if fmt.schema_ is None:
        raise InvalidRequest("text.format.schema: required for type 'json_schema'")
    return ResponseFormat("json_schema", fmt.schema_, name=fmt.name, strict=bool(fmt.strict))


def text_json(text: TextConfig | None) -> dict[str, Any]:
    """`text` as the response object echoes it."""
    fmt = text.format if text is not None and text.format is not None else TextFormat()
    echoed: dict[str, Any] = {"type": fmt.type}
    if fmt.type == "json_schema":
        echoed.update(name=fmt.name, schema=fmt.schema_, strict=bool(fmt.strict))
        if fmt.description is not None:
            echoed["description"] = fmt.description
    return {"format": echoed}


def think_from(reasoning: Reasoning | None) -> tuple[bool | None, ThinkLevel | None]:
    if reasoning is None or reasoning.effort is None:
        return None, None
    if reasoning.effort == "none":
        return False, None
    if reasoning.effort not in EFFORT_LEVELS:
        raise InvalidRequest("reasoning.effort must be one of none, minimal, low, medium, high, xhigh")
    return True, EFFORT_LEVELS[reasoning.effort]
